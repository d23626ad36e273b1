// The shared engine loop driven with an explicit clock and in-memory ports (no SimGrid):
// request timelines in colocated and PD roles, decode-run coalescing equal to single steps,
// and no leaked blocks at the end.
#include "policies/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "policies/kv_event_index.h"
#include "policies/metrics.h"

namespace duet::policies {
namespace {

// One explicit clock shared by every engine of a test.
struct ManualClock : Clock {
  Seconds now = 0;
  Seconds Now() const override { return now; }
};

// Steps cost a fixed time per step plus per token, so expected times are easy to write down.
// A decode run stops at the first step boundary at or after `interrupt_at` (the next arrival),
// as the SimGrid executor does when work reaches the inbox.
struct TestPorts : Inbox, Outbox, BlockingStepExecutor, KvTransport {
  ManualClock* clock = nullptr;
  std::map<InstanceId, TestPorts*>* peers = nullptr;
  std::deque<EngineMessage> inbox;
  Seconds step_s = 0.010;
  Seconds per_token_s = 0.001;
  Seconds transfer_s = 0.005;
  std::map<TransferId, Seconds> transfers;  // id -> completion time
  TransferId next_id = 1;
  int execute_calls = 0;
  Seconds interrupt_at = kForever;

  bool TryReceive(EngineMessage* m) override {
    if (inbox.empty()) return false;
    *m = inbox.front();
    inbox.pop_front();
    return true;
  }
  void WaitUntil(Seconds) override {}
  void Send(InstanceId to, const EngineMessage& m) override { peers->at(to)->inbox.push_back(m); }
  std::vector<KvTransferRequest> posted;  // block lists copied (the spans end with Post)
  std::vector<std::vector<KvBlockManager::BlockId>> posted_src, posted_dst;
  TransferId Post(const KvTransferRequest& transfer) override {
    posted.push_back(transfer);
    posted_src.emplace_back(transfer.src_blocks.begin(), transfer.src_blocks.end());
    posted_dst.emplace_back(transfer.dst_blocks.begin(), transfer.dst_blocks.end());
    transfers[next_id] = clock->now + transfer_s;
    return next_id++;
  }
  TransferStatus Poll(TransferId id) override {
    if (clock->now < transfers.at(id)) return TransferStatus::kInProgress;
    transfers.erase(id);
    return TransferStatus::kDone;
  }
  bool CoalescesDecodeRuns() const override { return true; }
  void Execute(const StepPlan& plan, StepEvents&, StepResult* result) override {
    ++execute_calls;
    for (int s = 0; s < plan.max_steps; ++s) {
      clock->now += step_s + per_token_s * static_cast<double>(plan.Shape(s).TotalTokens());
      result->step_end_s.push_back(clock->now);
      if (clock->now >= interrupt_at) break;
    }
  }
};

struct Collector : MetricsCollector {
  std::vector<FinishedRequest> finished_records;
  int prefill_done = 0;
  void OnFinished(const RequestSpec& spec, const RequestRecord& record) override {
    MetricsCollector::OnFinished(spec, record);
    finished_records.push_back(FinishedRequest::Of(spec, record));
  }
  void OnPrefillDone(const RequestSpec&, const RequestRecord&) override { ++prefill_done; }
};

// One instance alone: its clock, ports (instance 0 of the peer map) and sink.
struct Solo {
  ManualClock clock;
  std::map<InstanceId, TestPorts*> peers;
  TestPorts ports;
  Collector sink;
  Solo() {
    ports.clock = &clock;
    ports.peers = &peers;
    peers[0] = &ports;
  }
};

EngineConfig Config(InstanceId id, InstanceRole role, bool coalesce = true) {
  EngineConfig c;
  c.id = id;
  c.role = role;
  c.num_blocks = 1000;
  c.block_tokens = 16;
  c.coalesce_decode_steps = coalesce;
  c.kv_bytes_per_token = 1000;
  c.scheduler = {.max_num_batched_tokens = 512, .max_num_seqs = 16, .watermark = 0};
  return c;
}

// A request lent to an engine: the test keeps it, to look at it after the run (an engine owns
// the requests a message hands it; this handle frees nothing).
std::shared_ptr<Request> Lend(Request& r) {
  return {&r, [](Request*) {}};
}

Request MakeRequest(RequestId id, Seconds arrival, Tokens input, Tokens output) {
  Request r;
  r.id = id;
  r.arrival_s = arrival;
  r.input_tokens = input;
  r.output_tokens = output;
  return r;
}

TEST(InstanceEngine, ColocatedTimelineFollowsTheSteps) {
  Solo solo;
  ManualClock& clock = solo.clock;
  TestPorts& ports = solo.ports;
  Collector& sink = solo.sink;
  InstanceEngine engine(Config(0, InstanceRole::kColocated),
                        {&clock, &ports, &ports, &ports, &ports, &sink});
  // Handed over: the engine owns the request, and its record comes back through the sink.
  auto r = std::make_shared<Request>(MakeRequest(7, 0, 100, 4));
  r->prefill_instance = r->decode_instance = 0;
  ports.inbox.push_back({EngineMessage::Kind::kNewRequest, std::move(r), kNoInstance});
  while (engine.RunOnce()) {
  }
  ASSERT_EQ(sink.finished_records.size(), 1u);
  const FinishedRequest& done = sink.finished_records[0];
  EXPECT_EQ(done.state, RequestState::kCompleted);
  // Prefill of 100 tokens: 10 ms + 100 ms. Then 3 decode steps of 11 ms (one token each).
  EXPECT_DOUBLE_EQ(done.first_scheduled_s, 0);
  EXPECT_NEAR(done.first_token_s, 0.110, 1e-12);
  EXPECT_NEAR(done.finished_s, 0.110 + 3 * 0.011, 1e-12);
  EXPECT_EQ(done.generated_tokens, 4);
  EXPECT_EQ(sink.prefill_done, 1);
  EXPECT_EQ(ports.execute_calls, 2);  // one prefill step, one coalesced 3-step decode run
  EXPECT_TRUE(engine.idle());
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
  const auto summary = sink.Summary(1, Slo{});
  EXPECT_NEAR(summary["tpot_ms"]["mean"].get<double>(), 11.0, 1e-9);
  EXPECT_NEAR(summary["itl_ms"]["p50"].get<double>(), 11.0, 1e-9);
}

// With a host clock the engine splits each iteration's host time by phase. Here the host clock
// moves only while the event sink runs (1 ms a call), so all of the host time is the stream
// phase and none of it the phases the sink's calls sit inside (scheduling, applying); the
// counts say what the step did.
TEST(InstanceEngine, HostTimeIsSplitByPhaseWhereItIsSpent) {
  struct SlowSink : Collector {
    ManualClock* host = nullptr;
    int calls = 0;
    void Tick() {
      host->now += 1e-3;
      ++calls;
    }
    void OnFinished(const RequestSpec& s, const RequestRecord& r) override {
      Tick();
      Collector::OnFinished(s, r);
    }
    void OnPrefillDone(const RequestSpec& s, const RequestRecord& r) override {
      Tick();
      Collector::OnPrefillDone(s, r);
    }
    void OnTokenGaps(Seconds gap_s, std::int64_t count) override {
      Tick();
      Collector::OnTokenGaps(gap_s, count);
    }
  };
  Solo solo;
  ManualClock host;
  SlowSink sink;
  sink.host = &host;
  EnginePorts ports{&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &sink};
  ports.host_clock = &host;
  InstanceEngine engine(Config(0, InstanceRole::kColocated, /*coalesce=*/false), ports);
  for (RequestId id : {1, 2}) {
    auto r = std::make_shared<Request>(MakeRequest(id, 0, 40, id == 1 ? 2 : 3));
    r->prefill_instance = r->decode_instance = 0;
    solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, std::move(r), kNoInstance});
  }
  struct Iteration {
    double stream_ms, rows, admitted, finished;
  };
  std::vector<Iteration> got;
  while (true) {
    const int calls = sink.calls;
    if (!engine.RunOnce()) break;
    const models::HostStep& h = engine.last_host_step();
    for (models::HostPhase p :
         {models::HostPhase::kSchedule, models::HostPhase::kAllocate, models::HostPhase::kPrepare,
          models::HostPhase::kSample, models::HostPhase::kApply}) {
      EXPECT_EQ(h.phase_s[static_cast<std::size_t>(p)], 0) << static_cast<int>(p);
    }
    EXPECT_NEAR(h.phase_s[static_cast<std::size_t>(models::HostPhase::kStream)],
                1e-3 * (sink.calls - calls), 1e-12);
    got.push_back({1e3 * h.phase_s[static_cast<std::size_t>(models::HostPhase::kStream)],
                   h.counts.rows, h.counts.admitted, h.counts.finished});
    EXPECT_EQ(h.counts.tokens, 0);  // this executor samples no tokens
  }
  // Both prefilled together (2 prefill-done calls); a decode step of both (a gap each) that
  // finishes the first; a decode step of the second that finishes it.
  ASSERT_EQ(got.size(), 3u);
  EXPECT_NEAR(got[0].stream_ms, 2, 1e-9);
  EXPECT_EQ(got[0].rows, 2);
  EXPECT_EQ(got[0].admitted, 2);
  EXPECT_EQ(got[0].finished, 0);
  EXPECT_NEAR(got[1].stream_ms, 3, 1e-9);
  EXPECT_EQ(got[1].rows, 2);
  EXPECT_EQ(got[1].admitted, 0);
  EXPECT_EQ(got[1].finished, 1);
  EXPECT_NEAR(got[2].stream_ms, 2, 1e-9);
  EXPECT_EQ(got[2].rows, 1);
  EXPECT_EQ(got[2].finished, 1);
}

// Runs the same arrivals through a colocated engine, returning the final records.
std::vector<FinishedRequest> RunColocated(bool coalesce, int* execute_calls) {
  Solo solo;
  ManualClock& clock = solo.clock;
  TestPorts& ports = solo.ports;
  Collector& sink = solo.sink;
  EngineConfig config = Config(0, InstanceRole::kColocated, coalesce);
  config.num_blocks = 16;  // tight: forces eviction and preemption on the way
  InstanceEngine engine(config, {&clock, &ports, &ports, &ports, &ports, &sink});
  std::deque<Request> requests;
  for (RequestId i = 0; i < 12; ++i) {
    Request& r = requests.emplace_back(MakeRequest(i, 0.05 * static_cast<double>(i),
                                                   40 + 13 * static_cast<Tokens>(i % 5),
                                                   5 + 17 * static_cast<Tokens>(i % 4)));
    r.block_hashes = {100 + i % 3, 200 + i % 2};
    r.prefill_instance = r.decode_instance = 0;
  }
  std::size_t next = 0;
  while (sink.finished_records.size() < requests.size()) {
    while (next < requests.size() && requests[next].arrival_s <= clock.now) {
      ports.inbox.push_back(
          {EngineMessage::Kind::kNewRequest, Lend(requests[next++]), kNoInstance});
    }
    ports.interrupt_at = next < requests.size() ? requests[next].arrival_s : kForever;
    if (!engine.RunOnce()) {
      EXPECT_LT(next, requests.size());
      clock.now = requests[next].arrival_s;
    }
  }
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
  *execute_calls = ports.execute_calls;
  return sink.finished_records;
}

// A simulated-like executor that checks each plan's entries against the requests the engine
// schedules (found by id) and keeps a copy of every plan and of its shape as it ran.
struct PlanRecorder : TestPorts {
  const InstanceEngine* engine = nullptr;
  std::vector<StepPlan> plans;
  std::vector<models::StepShape> shapes;
  void Execute(const StepPlan& plan, StepEvents& events, StepResult* result) override {
    for (const PrefillItem& p : plan.prefills) {
      const Request* r = engine->scheduler().Find(p.request);
      ASSERT_NE(r, nullptr) << p.request;
      EXPECT_EQ(r->state, RequestState::kPrefilling);
      EXPECT_EQ(p.context, r->computed_tokens);
      EXPECT_EQ(p.ends_prefill, p.context + p.tokens == r->prefill_target);
    }
    for (const DecodeItem& d : plan.decodes) {
      const Request* r = engine->scheduler().Find(d.request);
      ASSERT_NE(r, nullptr) << d.request;
      EXPECT_EQ(r->state, RequestState::kDecoding);
      EXPECT_EQ(d.context, r->SequenceTokens() - 1);
      EXPECT_EQ(d.remaining_output, r->RemainingOutput());
    }
    plans.push_back(plan);
    shapes.push_back(plan.Shape());
    TestPorts::Execute(plan, events, result);
  }
};

// A plan names the requests the engine schedules by id and points into none of them: copied out,
// it still says what its step did once the engine has freed them and is gone itself.
TEST(InstanceEngine, PlansNameTheScheduledRequestsByIdAndOutliveThem) {
  ManualClock clock;
  std::map<InstanceId, TestPorts*> peers;
  PlanRecorder ports;
  Collector sink;
  ports.clock = &clock;
  ports.peers = &peers;
  peers[0] = &ports;
  std::vector<std::weak_ptr<Request>> handed;
  {
    InstanceEngine engine(Config(0, InstanceRole::kColocated),
                          {&clock, &ports, &ports, &ports, &ports, &sink});
    ports.engine = &engine;
    for (const RequestId id : {3, 5}) {
      auto r = std::make_shared<Request>(MakeRequest(id, 0, 40, 6));
      r->prefill_instance = r->decode_instance = 0;
      handed.push_back(r);
      ports.inbox.push_back({EngineMessage::Kind::kNewRequest, std::move(r), kNoInstance});
    }
    while (engine.RunOnce()) {
    }
    EXPECT_TRUE(engine.idle());
  }
  for (const auto& r : handed) EXPECT_TRUE(r.expired());  // the engine owned and freed them
  // Both prompts in one step, then one decode run of the five tokens each has left.
  ASSERT_EQ(ports.plans.size(), 2u);
  const StepPlan& prefill = ports.plans[0];
  EXPECT_EQ(prefill.admitted, (std::vector<RequestId>{3, 5}));
  ASSERT_EQ(prefill.prefills.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(prefill.prefills[i].request, prefill.admitted[i]);
    EXPECT_EQ(prefill.prefills[i].tokens, 40);
    EXPECT_TRUE(prefill.prefills[i].ends_prefill);
    EXPECT_EQ(prefill.prefills[i].remaining_output, 6);
  }
  const StepPlan& decode = ports.plans[1];
  EXPECT_EQ(decode.max_steps, 5);
  ASSERT_EQ(decode.decodes.size(), 2u);
  EXPECT_EQ(decode.decodes[0].request, 3);
  EXPECT_EQ(decode.decodes[1].request, 5);
  // The copies price their steps as the plans did while their requests lived.
  for (std::size_t k = 0; k < ports.plans.size(); ++k) {
    const models::StepShape shape = ports.plans[k].Shape();
    EXPECT_EQ(shape.PrefillTokens(), ports.shapes[k].PrefillTokens()) << k;
    EXPECT_EQ(shape.decode_tokens, ports.shapes[k].decode_tokens) << k;
    EXPECT_EQ(shape.decode_context_tokens, ports.shapes[k].decode_context_tokens) << k;
  }
  EXPECT_EQ(ports.shapes[1].decode_context_tokens, 2 * 40);
}

TEST(InstanceEngine, CoalescedDecodeRunsEqualSingleSteps) {
  int calls_single = 0, calls_coalesced = 0;
  const auto single = RunColocated(false, &calls_single);
  const auto coalesced = RunColocated(true, &calls_coalesced);
  ASSERT_EQ(single.size(), coalesced.size());
  std::map<RequestId, const FinishedRequest*> by_id;
  for (const auto& r : coalesced) by_id[r.id] = &r;
  for (const auto& a : single) {
    const FinishedRequest& b = *by_id.at(a.id);
    EXPECT_NEAR(a.first_token_s, b.first_token_s, 1e-9) << a.id;
    EXPECT_NEAR(a.finished_s, b.finished_s, 1e-9) << a.id;
    EXPECT_EQ(a.cached_tokens, b.cached_tokens) << a.id;
    EXPECT_EQ(a.preemptions, b.preemptions) << a.id;
  }
  EXPECT_LT(calls_coalesced, calls_single);
  // The workload did preempt and reuse prefixes, so those paths were compared too.
  int preemptions = 0, hits = 0;
  for (const auto& r : single) {
    preemptions += r.preemptions;
    hits += r.cached_tokens > 0;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(hits, 0);
}

TEST(InstanceEngine, PdHandsTheKvFromPrefillToDecode) {
  ManualClock clock;
  std::map<InstanceId, TestPorts*> peers;
  TestPorts p_ports, d_ports;
  for (TestPorts* t : {&p_ports, &d_ports}) {
    t->clock = &clock;
    t->peers = &peers;
  }
  peers[0] = &p_ports;
  peers[1] = &d_ports;
  Collector sink;
  InstanceEngine prefill(Config(0, InstanceRole::kPrefill),
                         {&clock, &p_ports, &p_ports, &p_ports, &p_ports, &sink});
  InstanceEngine decode(Config(1, InstanceRole::kDecode),
                        {&clock, &d_ports, &d_ports, &d_ports, &d_ports, &sink});
  Request r = MakeRequest(1, 0, 64, 3);
  r.block_hashes = {1, 2, 3, 4};
  r.prefill_instance = 0;
  r.decode_instance = 1;
  p_ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(r), kNoInstance});
  EXPECT_TRUE(prefill.RunOnce());  // prefill: 10 + 64 ms
  EXPECT_EQ(r.state, RequestState::kTransferring);
  EXPECT_NEAR(r.prefill_done_s, 0.074, 1e-12);
  EXPECT_LT(r.first_token_s, 0);  // not delivered until the decode side holds the KV
  // The prefill instance still holds the KV blocks until released.
  EXPECT_EQ(prefill.blocks().kv_blocks_used(), 4);
  const std::vector<KvBlockManager::BlockId> prompt_blocks(prefill.blocks().Table(r.id).begin(),
                                                           prefill.blocks().Table(r.id).end());
  EXPECT_FALSE(decode.RunOnce());  // posts the pull; transfer takes 5 ms
  EXPECT_EQ(r.kv_transfer_bytes, 64 * 1000);
  // The pull names the prefill side's four prompt blocks and the decode side's own table,
  // which has room for the first sampled token (65 tokens: five blocks of 16).
  ASSERT_EQ(d_ports.posted.size(), 1u);
  EXPECT_EQ(d_ports.posted[0].src, 0);
  EXPECT_EQ(d_ports.posted[0].dst, 1);
  EXPECT_EQ(d_ports.posted_src[0], prompt_blocks);
  const auto decode_table = decode.blocks().Table(r.id);
  EXPECT_EQ(d_ports.posted_dst[0],
            std::vector<KvBlockManager::BlockId>(decode_table.begin(), decode_table.end()));
  EXPECT_EQ(d_ports.posted_dst[0].size(), 5u);
  clock.now += 0.005;
  while (decode.RunOnce()) {
  }
  EXPECT_NEAR(r.kv_ready_s, 0.079, 1e-12);
  EXPECT_NEAR(r.first_token_s, 0.079, 1e-12);
  EXPECT_EQ(r.state, RequestState::kCompleted);
  EXPECT_NEAR(r.finished_s, 0.079 + 2 * 0.011, 1e-12);
  // The release reaches the prefill instance: its blocks return to the (cached) pool.
  EXPECT_FALSE(prefill.RunOnce());
  EXPECT_EQ(prefill.blocks().kv_blocks_used(), 0);
  EXPECT_EQ(prefill.blocks().kv_blocks_cached(), 4);
  EXPECT_TRUE(prefill.CheckInvariants().ok()) << prefill.CheckInvariants().message();
  EXPECT_TRUE(decode.CheckInvariants().ok()) << decode.CheckInvariants().message();
}

// A prefill instance and a decode instance on one clock, with their ports and a shared sink.
struct PdPair {
  ManualClock clock;
  std::map<InstanceId, TestPorts*> peers;
  TestPorts p_ports, d_ports;
  Collector sink;
  std::unique_ptr<InstanceEngine> prefill, decode;
  PdPair(EngineConfig p_config, EngineConfig d_config) {
    for (TestPorts* t : {&p_ports, &d_ports}) {
      t->clock = &clock;
      t->peers = &peers;
    }
    peers[0] = &p_ports;
    peers[1] = &d_ports;
    prefill = std::make_unique<InstanceEngine>(
        p_config, EnginePorts{&clock, &p_ports, &p_ports, &p_ports, &p_ports, &sink});
    decode = std::make_unique<InstanceEngine>(
        d_config, EnginePorts{&clock, &d_ports, &d_ports, &d_ports, &d_ports, &sink});
  }
  void Submit(Request& r) {
    r.prefill_instance = 0;
    r.decode_instance = 1;
    p_ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(r), kNoInstance});
  }
};

// The prefill instance's lease (3 ms) ends before the 5 ms pull is seen complete: the prefill
// side frees the blocks by itself, the late release changes nothing, and the decode side treats
// the pull as failed: the request errors (fail) or the decode side prefills it (recompute).
TEST(InstanceEngine, AnEndedLeaseFreesThePrefillBlocksAndTheLatePullFollowsThePolicy) {
  for (const KvLoadFailurePolicy policy :
       {KvLoadFailurePolicy::kFail, KvLoadFailurePolicy::kRecompute}) {
    SCOPED_TRACE(ToString(policy));
    EngineConfig p_config = Config(0, InstanceRole::kPrefill);
    p_config.kv_lease_s = 0.003;
    EngineConfig d_config = Config(1, InstanceRole::kDecode);
    d_config.kv_load_failure_policy = policy;
    PdPair pd(p_config, d_config);
    Request r = MakeRequest(1, 0, 64, 3);
    r.block_hashes = {1, 2, 3, 4};
    pd.Submit(r);
    EXPECT_TRUE(pd.prefill->RunOnce());  // ends at 74 ms; the lease ends at 77 ms
    EXPECT_NEAR(pd.prefill->next_lease_expiry(), 0.077, 1e-12);
    EXPECT_FALSE(pd.decode->RunOnce());  // posts the pull, complete at 79 ms
    ASSERT_EQ(pd.d_ports.posted.size(), 1u);
    pd.clock.now = 0.078;
    EXPECT_FALSE(pd.prefill->RunOnce());
    EXPECT_EQ(pd.prefill->leases_expired(), 1);
    EXPECT_EQ(pd.prefill->blocks().kv_blocks_used(), 0);
    EXPECT_EQ(pd.prefill->next_lease_expiry(), kForever);
    pd.clock.now = 0.080;
    while (pd.decode->RunOnce()) {
    }
    EXPECT_EQ(pd.decode->kv_load_failures(), 1);
    if (policy == KvLoadFailurePolicy::kFail) {
      EXPECT_EQ(r.finish_reason, FinishReason::kError);
      EXPECT_NE(r.reason.find("lease"), std::string::npos) << r.reason;
      EXPECT_EQ(pd.decode->kv_load_recomputes(), 0);
    } else {
      EXPECT_EQ(r.state, RequestState::kCompleted);
      EXPECT_EQ(r.generated_tokens, 3);
      EXPECT_NEAR(r.first_token_s, 0.080, 1e-12);  // the prefill side's token, delivered late
      EXPECT_EQ(pd.decode->kv_load_recomputes(), 1);
    }
    // The decode side's release arrives after the lease ended: nothing left to free.
    EXPECT_FALSE(pd.prefill->RunOnce());
    EXPECT_EQ(pd.prefill->blocks().kv_blocks_used(), 0);
    EXPECT_TRUE(pd.prefill->idle());
    EXPECT_TRUE(pd.prefill->CheckInvariants().ok()) << pd.prefill->CheckInvariants().message();
    EXPECT_TRUE(pd.decode->idle());
    EXPECT_TRUE(pd.decode->CheckInvariants().ok()) << pd.decode->CheckInvariants().message();
  }
}

// The KV transfer's parts: the KvReady message reaches the decode instance's inbox 1 ms after
// the prefill (the inbox stamps it), the decode engine takes it 2 ms later (its step in flight)
// and starts the pull, which it sees complete 5 ms after that. The parts add up to the transfer.
TEST(InstanceEngine, TheKvTransferSplitsIntoTheMessageTheWaitAndThePull) {
  PdPair pd(Config(0, InstanceRole::kPrefill), Config(1, InstanceRole::kDecode));
  Request r = MakeRequest(1, 0, 64, 3);
  pd.Submit(r);
  EXPECT_TRUE(pd.prefill->RunOnce());  // ends at 74 ms
  ASSERT_EQ(pd.d_ports.inbox.size(), 1u);
  pd.d_ports.inbox.front().delivered_s = 0.075;
  pd.clock.now = 0.077;
  EXPECT_FALSE(pd.decode->RunOnce());  // posts the pull, complete at 82 ms
  pd.clock.now = 0.082;
  while (pd.decode->RunOnce()) {
  }
  ASSERT_EQ(r.state, RequestState::kCompleted);
  EXPECT_NEAR(r.kv_ready_s, 0.082, 1e-12);
  const auto parts = KvTransferBreakdown(r);
  ASSERT_TRUE(parts);
  EXPECT_NEAR(parts->message_s, 0.001, 1e-12);
  EXPECT_NEAR(parts->wait_s, 0.002, 1e-12);
  EXPECT_NEAR(parts->pull_s, 0.005, 1e-12);

  // A message no inbox stamped arrived, as far as the engine knows, when it took it.
  PdPair unstamped(Config(0, InstanceRole::kPrefill), Config(1, InstanceRole::kDecode));
  Request q = MakeRequest(1, 0, 64, 3);
  unstamped.Submit(q);
  EXPECT_TRUE(unstamped.prefill->RunOnce());
  unstamped.clock.now = 0.077;
  EXPECT_FALSE(unstamped.decode->RunOnce());
  unstamped.clock.now = 0.082;
  while (unstamped.decode->RunOnce()) {
  }
  const auto whole = KvTransferBreakdown(q);
  ASSERT_TRUE(whole);
  EXPECT_NEAR(whole->message_s, 0.003, 1e-12);
  EXPECT_NEAR(whole->wait_s, 0, 1e-12);
}

// The frontend aborts a request on both its instances; the decode instance's abort overtakes
// the prefill instance's kKvReady. The decode instance remembers it: when the KV is announced,
// it ends the request as aborted, pulls nothing and releases the prefill side's blocks.
TEST(InstanceEngine, AnAbortThatOvertakesTheKvReadyEndsTheRequestOnArrival) {
  EngineConfig p_config = Config(0, InstanceRole::kPrefill);
  EngineConfig d_config = Config(1, InstanceRole::kDecode);
  d_config.kv_lease_s = 30;
  PdPair pd(p_config, d_config);
  Request r = MakeRequest(1, 0, 64, 3);
  r.block_hashes = {1, 2, 3, 4};
  pd.Submit(r);
  EngineMessage abort{EngineMessage::Kind::kAbort, nullptr, kNoInstance};
  abort.request_id = r.id;
  pd.d_ports.inbox.push_back(abort);
  EXPECT_FALSE(pd.decode->RunOnce());  // not here yet: remembered
  EXPECT_TRUE(pd.prefill->RunOnce());  // prefilled, KV announced to the decode instance
  EXPECT_EQ(r.state, RequestState::kTransferring);
  EXPECT_FALSE(pd.decode->RunOnce());
  EXPECT_EQ(r.finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(pd.d_ports.posted.empty());
  EXPECT_FALSE(pd.prefill->RunOnce());  // the release
  EXPECT_EQ(pd.prefill->blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(pd.prefill->idle());
  EXPECT_TRUE(pd.decode->idle());
  EXPECT_EQ(pd.sink.finished_records.size(), 1u);
}

// A decode instance with room for one request's KV pulls one; the other waits, announced, with
// its KV held on the prefill side, and is pulled once the first finished. None fails.
TEST(InstanceEngine, ADecodeInstanceWithoutFreeBlocksDoesNotPull) {
  EngineConfig d_config = Config(1, InstanceRole::kDecode);
  d_config.num_blocks = 5;  // 64 prompt tokens + 2 generated: five blocks of 16
  PdPair pd(Config(0, InstanceRole::kPrefill), d_config);
  Request a = MakeRequest(1, 0, 64, 3), b = MakeRequest(2, 0, 64, 3);
  a.block_hashes = {1, 2, 3, 4};
  b.block_hashes = {5, 6, 7, 8};
  pd.Submit(a);
  pd.Submit(b);
  while (pd.prefill->RunOnce()) {
  }
  EXPECT_EQ(a.state, RequestState::kTransferring);
  EXPECT_EQ(b.state, RequestState::kTransferring);
  EXPECT_FALSE(pd.decode->RunOnce());
  EXPECT_EQ(pd.d_ports.posted.size(), 1u);
  for (int i = 0; i < 100 && a.state != RequestState::kCompleted; ++i) {
    pd.clock.now += 0.005;
    pd.decode->RunOnce();
    EXPECT_EQ(b.state, RequestState::kTransferring);
  }
  EXPECT_EQ(a.state, RequestState::kCompleted);
  EXPECT_EQ(pd.prefill->blocks().kv_blocks_used(), 8);  // no release has been taken yet
  for (int i = 0; i < 100 && b.state != RequestState::kCompleted; ++i) {
    pd.clock.now += 0.005;
    pd.decode->RunOnce();
  }
  EXPECT_EQ(b.state, RequestState::kCompleted);
  EXPECT_EQ(pd.d_ports.posted.size(), 2u);
  EXPECT_EQ(pd.decode->kv_load_failures(), 0);
  EXPECT_FALSE(pd.prefill->RunOnce());
  EXPECT_EQ(pd.prefill->blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(pd.decode->CheckInvariants().ok()) << pd.decode->CheckInvariants().message();
}

TEST(InstanceEngine, OneTokenRequestsFinishOnThePrefillInstance) {
  Solo solo;
  ManualClock& clock = solo.clock;
  TestPorts& ports = solo.ports;
  Collector& sink = solo.sink;
  InstanceEngine prefill(Config(0, InstanceRole::kPrefill),
                         {&clock, &ports, &ports, &ports, &ports, &sink});
  Request r = MakeRequest(1, 0, 20, 1);
  r.prefill_instance = 0;
  r.decode_instance = 5;  // never contacted
  ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(r), kNoInstance});
  EXPECT_TRUE(prefill.RunOnce());
  EXPECT_EQ(r.state, RequestState::kCompleted);
  EXPECT_NEAR(r.first_token_s, 0.030, 1e-12);
  EXPECT_TRUE(prefill.idle());
}

// ---- The step as a value: real executors ---------------------------------------------------

// An executor like the real ones: one step per call (never coalesces), block tables in the
// plan, and a token for every request that completes its prefill or decodes. The token is a
// function of the request and its position, so a test can predict it; one of the request's
// stop token ids is reported as a stop.
struct TokenPorts : TestPorts {
  const InstanceEngine* engine = nullptr;  // to check the block-table snapshot against
  std::vector<StepPlan> plans;             // every plan executed
  std::function<void(StepEvents&)> during_step;
  // The requests handed to the engine, by id, as the test sees them: to check each row's
  // inputs against (the plan itself names requests by id only).
  std::map<RequestId, const Request*> handed;

  bool TryReceive(EngineMessage* m) override {
    if (!TestPorts::TryReceive(m)) return false;
    if (m->request) handed[m->request->id] = m->request.get();
    return true;
  }

  static std::int32_t TokenFor(RequestId id, std::size_t position) {
    return static_cast<std::int32_t>(1000 * (id + 1) + position);
  }
  static std::int32_t TokenFor(const Request& r, std::size_t position) {
    return TokenFor(r.id, position);
  }
  bool CoalescesDecodeRuns() const override { return false; }
  bool NeedsInputs() const override { return true; }
  void Execute(const StepPlan& plan, StepEvents& events, StepResult* result) override {
    EXPECT_EQ(plan.max_steps, 1);
    const models::StepShape from_rows = plan.RowsShape(), shape = plan.Shape();
    ASSERT_EQ(from_rows.prefill.size(), shape.prefill.size());
    for (std::size_t i = 0; i < shape.prefill.size(); ++i) {
      EXPECT_EQ(from_rows.prefill[i].tokens, shape.prefill[i].tokens);
      EXPECT_EQ(from_rows.prefill[i].context, shape.prefill[i].context);
    }
    EXPECT_EQ(from_rows.decode_tokens, shape.decode_tokens);
    EXPECT_EQ(from_rows.decode_context_tokens, shape.decode_context_tokens);
    std::size_t entry = 0;
    // Each row carries by value what an executor needs of its request, and its block table.
    auto sample = [&](const Request* r, Tokens position, Tokens count, bool samples) {
      const StepRow& row = plan.rows.at(entry);
      EXPECT_EQ(row.request, r->id);
      EXPECT_EQ(row.position, position);
      EXPECT_EQ(row.sample, samples);
      const auto ids = plan.TokensOf(row);
      ASSERT_EQ(static_cast<Tokens>(ids.size()), count);
      for (Tokens k = 0; k < count; ++k) EXPECT_EQ(ids[k], r->TokenAt(position + k)) << k;
      EXPECT_EQ(row.seed, r->sampling.seed.value_or(r->id));
      EXPECT_EQ(row.temperature, r->sampling.temperature);
      const auto stops = plan.StopsOf(row);
      EXPECT_TRUE(std::equal(stops.begin(), stops.end(), r->sampling.stop_token_ids.begin(),
                             r->sampling.stop_token_ids.end()));
      const auto table = plan.BlockTable(entry++);
      if (engine) {
        const auto live = engine->blocks().Table(r->id);
        EXPECT_TRUE(std::equal(table.begin(), table.end(), live.begin(), live.end()));
      }
    };
    for (const PrefillItem& p : plan.prefills) {
      const Request* r = handed.at(p.request);
      EXPECT_EQ(p.ends_prefill, p.context + p.tokens == r->prefill_target);
      EXPECT_EQ(p.remaining_output, r->RemainingOutput());
      sample(r, p.context, p.tokens, p.ends_prefill);
      if (p.ends_prefill) {
        const std::int32_t t = TokenFor(*r, static_cast<std::size_t>(r->SequenceTokens()));
        result->tokens.push_back({r->id, t, Stops(*r, t)});
      }
    }
    for (const DecodeItem& d : plan.decodes) {
      const Request* r = handed.at(d.request);
      EXPECT_EQ(d.context, r->SequenceTokens() - 1);
      EXPECT_EQ(d.remaining_output, r->RemainingOutput());
      sample(r, d.context, 1, true);
      const std::int32_t t = TokenFor(*r, static_cast<std::size_t>(r->SequenceTokens()));
      result->tokens.push_back({r->id, t, Stops(*r, t)});
    }
    plans.push_back(plan);
    if (during_step) during_step(events);
    TestPorts::Execute(plan, events, result);
  }
  static bool Stops(const Request& r, std::int32_t t) {
    const auto& ids = r.sampling.stop_token_ids;
    return std::find(ids.begin(), ids.end(), t) != ids.end();
  }
};

struct TokenSink : Collector {
  const Seconds* clock_now = nullptr;  // the token's step just ended: its time is now
  std::vector<std::pair<RequestId, std::int32_t>> tokens;
  KvEventIndex* index = nullptr;
  void OnToken(const RequestSpec& spec, const RequestRecord& r, std::int32_t token) override {
    // The engine counted the token and updated the timeline before telling.
    EXPECT_GE(r.generated_tokens, 1);
    EXPECT_GE(r.first_token_s, 0);
    EXPECT_EQ(r.last_token_s, clock_now ? *clock_now : r.last_token_s);
    tokens.emplace_back(spec.id, token);
  }
  void OnKvEvents(InstanceId instance, std::span<const KvCacheEvent> events) override {
    if (index) index->Apply(instance, events);
  }
};

struct RealSolo {
  ManualClock clock;
  std::map<InstanceId, TestPorts*> peers;
  TokenPorts ports;
  TokenSink sink;
  RealSolo() {
    sink.clock_now = &clock.now;
    ports.clock = &clock;
    ports.peers = &peers;
    peers[0] = &ports;
  }
};

Request RealRequest(RequestId id, Tokens input, Tokens output) {
  Request r = MakeRequest(id, 0, input, output);
  for (Tokens i = 0; i < input; ++i) r.prompt_ids.push_back(static_cast<std::int32_t>(7 + i));
  r.prefill_instance = r.decode_instance = 0;
  return r;
}

TEST(InstanceEngine, TokensLeaveThroughTheSinkAndAStopTokenEndsTheRequest) {
  RealSolo solo;
  InstanceEngine engine(
      Config(0, InstanceRole::kColocated),
      {&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &solo.sink});
  solo.ports.engine = &engine;
  Request stops = RealRequest(1, 20, 10);
  // Its third output token is at position 22.
  stops.sampling.stop_token_ids = {TokenPorts::TokenFor(stops, 22)};
  Request runs = RealRequest(2, 30, 4);
  for (Request* r : {&stops, &runs})
    solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(*r), kNoInstance});
  while (engine.RunOnce()) {
  }
  EXPECT_EQ(stops.state, RequestState::kCompleted);
  EXPECT_EQ(stops.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stops.generated_tokens, 3);
  EXPECT_EQ(stops.output_tokens, 10);  // the spec: what the client asked for
  EXPECT_EQ(runs.finish_reason, FinishReason::kLength);
  EXPECT_EQ(runs.generated_tokens, 4);
  for (const Request* r : {&stops, &runs}) {
    ASSERT_EQ(static_cast<Tokens>(r->output_ids.size()), r->generated_tokens);
    for (Tokens i = 0; i < r->generated_tokens; ++i)
      EXPECT_EQ(r->output_ids[static_cast<std::size_t>(i)],
                TokenPorts::TokenFor(*r, static_cast<std::size_t>(r->input_tokens + i)))
          << r->id << " at " << r->input_tokens + i;
  }
  // Each token reached the sink once, in the order of its request's positions.
  std::map<RequestId, std::vector<std::int32_t>> streamed;
  for (const auto& [id, t] : solo.sink.tokens) streamed[id].push_back(t);
  EXPECT_EQ(streamed[1], stops.output_ids);
  EXPECT_EQ(streamed[2], runs.output_ids);
  EXPECT_TRUE(engine.idle());
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
}

TEST(InstanceEngine, RealExecutorsRunSingleStepsAndNewWorkJoinsAtTheNextBoundary) {
  RealSolo solo;
  InstanceEngine engine(
      Config(0, InstanceRole::kColocated),
      {&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &solo.sink});
  Request a = RealRequest(1, 16, 8), b = RealRequest(2, 16, 2);
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(a), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());  // a's prefill
  ASSERT_TRUE(engine.RunOnce());  // a's first decode step
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(b), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());  // b joins this very step
  const StepPlan& joined = solo.ports.plans.back();
  ASSERT_EQ(joined.prefills.size(), 1u);
  EXPECT_EQ(joined.prefills[0].request, b.id);
  ASSERT_EQ(joined.decodes.size(), 1u);
  while (engine.RunOnce()) {
  }
  // One Execute call per step: a's 7 decode steps after its prefill, plus b's prefill riding
  // along in one of them.
  EXPECT_EQ(solo.ports.execute_calls, 8);
  EXPECT_EQ(engine.steps(), 8);
  EXPECT_EQ(a.generated_tokens, 8);
  EXPECT_EQ(b.generated_tokens, 2);
}

TEST(InstanceEngine, AbortEndsWaitingAndRunningRequestsAndFreesTheirBlocks) {
  RealSolo solo;
  EngineConfig config = Config(0, InstanceRole::kColocated);
  config.scheduler.max_num_seqs = 1;  // b waits behind a
  InstanceEngine engine(
      config, {&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &solo.sink});
  Request a = RealRequest(1, 40, 50), b = RealRequest(2, 40, 50);
  for (Request* r : {&a, &b})
    solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(*r), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());
  ASSERT_TRUE(engine.RunOnce());
  EXPECT_EQ(b.state, RequestState::kQueued);
  EXPECT_GT(engine.blocks().kv_blocks_used(), 0);
  EngineMessage abort_b{EngineMessage::Kind::kAbort, nullptr, kNoInstance};
  abort_b.request_id = 2;
  EngineMessage abort_a = abort_b;
  abort_a.request_id = 1;
  EngineMessage abort_unknown = abort_b;
  abort_unknown.request_id = 99;
  solo.ports.inbox.push_back(abort_b);
  solo.ports.inbox.push_back(abort_unknown);
  ASSERT_TRUE(engine.RunOnce());
  EXPECT_EQ(b.state, RequestState::kFailed);
  EXPECT_EQ(b.finish_reason, FinishReason::kAbort);
  EXPECT_LT(b.first_scheduled_s, 0);
  EXPECT_EQ(a.state, RequestState::kDecoding);
  const Tokens before = a.generated_tokens;
  solo.ports.inbox.push_back(abort_a);
  EXPECT_FALSE(engine.RunOnce());  // a is gone before planning: nothing to run
  EXPECT_EQ(a.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(a.generated_tokens, before);
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(engine.idle());
  ASSERT_EQ(solo.sink.finished_records.size(), 2u);
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
}

TEST(InstanceEngine, AnAbortTakenDuringAStepWaitsForItsEnd) {
  RealSolo solo;
  InstanceEngine engine(
      Config(0, InstanceRole::kColocated),
      {&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &solo.sink});
  Request a = RealRequest(1, 20, 30);
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(a), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());
  ASSERT_TRUE(engine.RunOnce());
  // An executor that lets the engine take events mid-step (as the simulated one does while it
  // waits for loads) while an abort of a request in its plan arrives.
  solo.ports.during_step = [&](StepEvents& events) {
    EngineMessage m{EngineMessage::Kind::kAbort, nullptr, kNoInstance};
    m.request_id = 1;
    solo.ports.inbox.push_back(m);
    events.TakeEvents();
    EXPECT_EQ(a.state, RequestState::kDecoding) << "aborted under a running step";
  };
  ASSERT_TRUE(engine.RunOnce());
  EXPECT_EQ(a.state, RequestState::kFailed);
  EXPECT_EQ(a.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(a.generated_tokens, 3);  // the step's token was applied first
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
}

// An asynchronous executor like the real one: holds two steps and runs each when it is waited
// for, from the rows alone, the token the step before sampled put into the rows that need it.
// Tokens as TokenPorts gives them. Checks the engine's invariants before it runs each step, while
// the engine holds the step after it planned.
struct AsyncTokenExecutor : StepExecutor {
  ManualClock* clock = nullptr;
  const InstanceEngine* engine = nullptr;
  Seconds step_s = 0.01;
  std::deque<const StepPlan*> held;
  std::map<RequestId, std::int32_t> previous;  // what the last step run sampled
  int most_held = 0;
  int previous_tokens_put = 0;
  // Fails the step with this ordinal (from 1); as the real executor, a step after a failed one
  // that needs its tokens fails too.
  int fail_step = 0;
  int steps_run = 0;
  bool previous_failed = false;

  bool NeedsInputs() const override { return true; }
  int max_in_flight() const override { return 2; }
  void Submit(const StepPlan& plan, StepEvents&) override {
    held.push_back(&plan);
    most_held = std::max(most_held, static_cast<int>(held.size()));
    ASSERT_LE(held.size(), 2u);
  }
  void Wait(StepResult* result) override {
    ASSERT_FALSE(held.empty());
    if (engine) {
      const Status ok = engine->CheckInvariants();
      EXPECT_TRUE(ok.ok()) << "before step " << steps_run + 1 << ": " << ok.message();
    }
    const StepPlan& plan = *held.front();
    held.pop_front();
    clock->now += step_s;
    result->step_end_s.push_back(clock->now);
    ++steps_run;
    const bool needs_previous = std::any_of(plan.rows.begin(), plan.rows.end(),
                                            [](const StepRow& row) { return row.previous_token; });
    previous_failed = steps_run == fail_step || (previous_failed && needs_previous);
    if (previous_failed) {
      result->status = Status::Error("injected");
      previous.clear();
      return;
    }
    std::map<RequestId, std::int32_t> sampled;
    for (const StepRow& row : plan.rows) {
      const auto ids = plan.TokensOf(row);
      for (std::size_t k = 0; k + 1 < ids.size(); ++k) EXPECT_GE(ids[k], 0);
      if (row.previous_token) {
        EXPECT_EQ(ids.back(), -1);
        // The token the step before sampled for this request is this row's last.
        EXPECT_EQ(previous.at(row.request),
                  TokenPorts::TokenFor(
                      row.request, static_cast<std::size_t>(row.position + row.token_count - 1)));
        ++previous_tokens_put;
      } else {
        EXPECT_GE(ids.back(), 0);
      }
      if (!row.sample) continue;
      const std::int32_t t = TokenPorts::TokenFor(
          row.request, static_cast<std::size_t>(row.position + row.token_count));
      const auto stops = plan.StopsOf(row);
      result->tokens.push_back(
          {row.request, t, std::find(stops.begin(), stops.end(), t) != stops.end()});
      sampled[row.request] = t;
    }
    previous = std::move(sampled);
  }
};

// An engine on `solo`'s ports and `executor`, with asynchronous steps; the executor checks the
// engine's invariants before each step.
std::unique_ptr<InstanceEngine> AsyncEngine(
    RealSolo& solo, AsyncTokenExecutor& executor,
    EngineConfig config = Config(0, InstanceRole::kColocated)) {
  config.async_steps = true;
  executor.clock = &solo.clock;
  auto engine = std::make_unique<InstanceEngine>(
      config,
      EnginePorts{&solo.clock, &solo.ports, &solo.ports, &executor, &solo.ports, &solo.sink});
  executor.engine = engine.get();
  return engine;
}

// Requests of different lengths, two of which stop early (at different steps), and one that
// arrives while the others decode.
std::deque<Request> MixedRequests() {
  std::deque<Request> requests;
  requests.push_back(RealRequest(1, 20, 10));
  requests.back().sampling.stop_token_ids = {TokenPorts::TokenFor(1, 22)};  // its third token
  requests.push_back(RealRequest(2, 30, 4));
  requests.push_back(RealRequest(3, 40, 9));
  requests.back().sampling.stop_token_ids = {TokenPorts::TokenFor(3, 40)};  // its first token
  requests.push_back(RealRequest(4, 17, 12));
  requests.push_back(RealRequest(5, 25, 6));
  requests.back().sampling.stop_token_ids = {TokenPorts::TokenFor(5, 29)};  // its fifth token
  return requests;
}

// Serves MixedRequests (the last one arriving after `late_after` iterations) and checks the
// engine's invariants after every iteration. Returns the streamed tokens by request.
std::map<RequestId, std::vector<std::int32_t>> Serve(InstanceEngine& engine, TestPorts& ports,
                                                     TokenSink& sink, std::deque<Request>& requests,
                                                     int late_after) {
  for (std::size_t i = 0; i + 1 < requests.size(); ++i)
    ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(requests[i]), kNoInstance});
  for (int iteration = 0; iteration < 1000; ++iteration) {
    if (iteration == late_after)
      ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(requests.back()), kNoInstance});
    const bool stepped = engine.RunOnce();
    const Status ok = engine.CheckInvariants();
    EXPECT_TRUE(ok.ok()) << "after iteration " << iteration << ": " << ok.message();
    if (!stepped && iteration > late_after) break;
  }
  EXPECT_TRUE(engine.idle());
  std::map<RequestId, std::vector<std::int32_t>> streamed;
  for (const auto& [id, t] : sink.tokens) streamed[id].push_back(t);
  return streamed;
}

TEST(InstanceEngine, AsynchronousStepsGiveTheSynchronousTokensAndStreamNothingPastAStop) {
  RealSolo sync_solo;
  std::deque<Request> sync_requests = MixedRequests();
  InstanceEngine sync_engine(Config(0, InstanceRole::kColocated),
                             {&sync_solo.clock, &sync_solo.ports, &sync_solo.ports,
                              &sync_solo.ports, &sync_solo.ports, &sync_solo.sink});
  const auto sync_streamed = Serve(sync_engine, sync_solo.ports, sync_solo.sink, sync_requests, 3);

  RealSolo solo;
  AsyncTokenExecutor executor;
  std::deque<Request> requests = MixedRequests();
  const auto engine_ptr = AsyncEngine(solo, executor);
  InstanceEngine& engine = *engine_ptr;
  const auto streamed = Serve(engine, solo.ports, solo.sink, requests, 3);

  EXPECT_EQ(executor.most_held, 2) << "the engine never planned ahead";
  EXPECT_GT(executor.previous_tokens_put, 0);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& a = requests[i];
    const Request& s = sync_requests[i];
    SCOPED_TRACE("request " + std::to_string(a.id));
    EXPECT_EQ(a.state, RequestState::kCompleted);
    EXPECT_EQ(a.finish_reason, s.finish_reason);
    EXPECT_EQ(a.generated_tokens, s.generated_tokens);
    EXPECT_EQ(a.output_ids, s.output_ids);
    // Nothing sampled past a stop reached the stream: what streamed is the output, once.
    EXPECT_EQ(streamed.at(a.id), a.output_ids);
    EXPECT_EQ(sync_streamed.at(s.id), s.output_ids);
  }
  EXPECT_EQ(requests[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(requests[0].generated_tokens, 3);
  EXPECT_EQ(requests[2].generated_tokens, 1);
  EXPECT_EQ(requests[4].generated_tokens, 5);
  // The records are the synchronous ones, one step of lag at most: the step planned ahead
  // runs before the engine learns of a stop.
  ASSERT_EQ(solo.sink.finished_records.size(), requests.size());
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
  EXPECT_EQ(engine.steps_in_flight(), 0);
}

TEST(InstanceEngine, AStepInFlightKeepsTheBlocksOfARequestThatEndedBeforeIt) {
  RealSolo solo;
  AsyncTokenExecutor executor;
  EngineConfig config = Config(0, InstanceRole::kColocated);
  config.enable_prefix_caching = false;  // freed blocks go straight back to the free list
  const auto engine_ptr = AsyncEngine(solo, executor, config);
  InstanceEngine& engine = *engine_ptr;
  Request r = RealRequest(1, 40, 20);
  r.sampling.stop_token_ids = {TokenPorts::TokenFor(1, 41)};  // its second token: a decode's
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(r), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());  // submits the prefill
  EXPECT_EQ(engine.steps_in_flight(), 1);
  ASSERT_TRUE(engine.RunOnce());  // submits decode 1, applies the prefill
  ASSERT_TRUE(engine.RunOnce());  // submits decode 2, applies decode 1: the stop
  EXPECT_EQ(r.state, RequestState::kCompleted);
  EXPECT_EQ(r.generated_tokens, 2);
  EXPECT_FALSE(engine.blocks().HasTable(r.id));
  // Decode 2, planned before the stop was known, still writes the request's blocks.
  ASSERT_EQ(engine.steps_in_flight(), 1);
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 3);  // 41 tokens and the one planned ahead
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
  // A request that arrives now cannot get them while decode 2 runs.
  Request late = RealRequest(2, 16 * 998, 1);  // 998 of the 1000 blocks
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(late), kNoInstance});
  ASSERT_TRUE(engine.RunOnce());
  EXPECT_EQ(late.state, RequestState::kQueued) << "admitted into blocks a step still writes";
  while (engine.RunOnce()) {
  }
  EXPECT_EQ(late.state, RequestState::kCompleted);
  EXPECT_EQ(r.output_ids.size(), 2u);
  EXPECT_EQ(solo.sink.tokens.size(), 3u);  // r's two, late's one
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
}

TEST(InstanceEngine, PlanningAheadPreemptsLikeSynchronousStepsAndKeepsTheTokensInFlight) {
  // Few blocks: requests growing by a token a step preempt each other.
  auto run = [](bool async) {
    RealSolo solo;
    AsyncTokenExecutor executor;
    executor.clock = &solo.clock;
    EngineConfig config = Config(0, InstanceRole::kColocated);
    config.num_blocks = 10;
    config.enable_prefix_caching = false;  // a freed block is reused at once
    config.async_steps = async;
    InstanceEngine engine(config, {&solo.clock, &solo.ports, &solo.ports,
                                   async ? static_cast<StepExecutor*>(&executor) : &solo.ports,
                                   &solo.ports, &solo.sink});
    executor.engine = &engine;
    std::deque<Request> requests;
    for (RequestId i = 0; i < 4; ++i) requests.push_back(RealRequest(i, 20 + 3 * i, 24));
    for (Request& r : requests)
      solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(r), kNoInstance});
    for (int iteration = 0; iteration < 2000 && (engine.RunOnce() || !engine.idle()); ++iteration) {
      const Status ok = engine.CheckInvariants();
      EXPECT_TRUE(ok.ok()) << "after iteration " << iteration << ": " << ok.message();
    }
    std::int64_t preemptions = 0;
    for (const Request& r : requests) {
      EXPECT_EQ(r.state, RequestState::kCompleted);
      preemptions += r.preemptions;
    }
    std::map<RequestId, std::vector<std::int32_t>> streamed;
    for (const auto& [id, t] : solo.sink.tokens) streamed[id].push_back(t);
    for (const Request& r : requests) EXPECT_EQ(streamed[r.id], r.output_ids) << r.id;
    return std::make_pair(std::move(requests), preemptions);
  };
  const auto [sync_requests, sync_preemptions] = run(false);
  const auto [requests, preemptions] = run(true);
  EXPECT_GT(sync_preemptions, 0);
  EXPECT_GT(preemptions, 0);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].output_ids, sync_requests[i].output_ids) << i;
    EXPECT_EQ(requests[i].generated_tokens, 24);
  }
}

TEST(InstanceEngine, AFailedAsynchronousStepFailsItsRequestsAndTheStepPlannedOnIt) {
  RealSolo solo;
  AsyncTokenExecutor executor;
  executor.fail_step = 3;  // a's second decode, and the step after it
  const auto engine_ptr = AsyncEngine(solo, executor);
  InstanceEngine& engine = *engine_ptr;
  Request a = RealRequest(1, 20, 10), b = RealRequest(2, 20, 10);
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(a), kNoInstance});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.RunOnce());
  // b arrives for the fourth step, which is planned on the third.
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(b), kNoInstance});
  while (engine.RunOnce()) {
    const Status ok = engine.CheckInvariants();
    EXPECT_TRUE(ok.ok()) << ok.message();
  }
  // The third step, the fourth (planned on it), and the fifth (b's first decode, planned on
  // the fourth before it failed).
  EXPECT_EQ(engine.forward_failures(), 3);
  for (const Request* r : {&a, &b}) {
    EXPECT_EQ(r->state, RequestState::kFailed) << r->id;
    EXPECT_EQ(r->finish_reason, FinishReason::kError) << r->id;
  }
  EXPECT_EQ(a.output_ids.size(), 2u);  // the prefill's token and the first decode's
  EXPECT_EQ(solo.sink.tokens.size(), 2u);
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(engine.idle());
}

TEST(InstanceEngine, AnAbortBetweenAsynchronousStepsDropsTheTokenInFlight) {
  RealSolo solo;
  AsyncTokenExecutor executor;
  const auto engine_ptr = AsyncEngine(solo, executor);
  InstanceEngine& engine = *engine_ptr;
  Request a = RealRequest(1, 20, 30);
  solo.ports.inbox.push_back({EngineMessage::Kind::kNewRequest, Lend(a), kNoInstance});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.RunOnce());
  ASSERT_EQ(engine.steps_in_flight(), 1);
  const std::size_t streamed = solo.sink.tokens.size();
  EngineMessage abort{EngineMessage::Kind::kAbort, nullptr, kNoInstance};
  abort.request_id = 1;
  solo.ports.inbox.push_back(abort);
  ASSERT_TRUE(engine.RunOnce());  // takes the abort, then waits for the step in flight
  EXPECT_EQ(a.state, RequestState::kFailed);
  EXPECT_EQ(a.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(solo.sink.tokens.size(), streamed) << "a token of an aborted request streamed";
  EXPECT_EQ(engine.steps_in_flight(), 0);
  EXPECT_FALSE(engine.RunOnce());
  EXPECT_EQ(engine.blocks().kv_blocks_used(), 0);
  EXPECT_TRUE(engine.CheckInvariants().ok()) << engine.CheckInvariants().message();
}

TEST(InstanceEngine, PublishedKvEventsRebuildTheCacheViewExactly) {
  RealSolo solo;
  EngineConfig config = Config(0, InstanceRole::kColocated);
  config.num_blocks = 12;  // tight: prompts evict each other's cached blocks
  config.publish_kv_events = true;
  KvEventIndex index(1, config.block_tokens);
  solo.sink.index = &index;
  InstanceEngine engine(
      config, {&solo.clock, &solo.ports, &solo.ports, &solo.ports, &solo.ports, &solo.sink});
  std::deque<Request> requests;
  for (RequestId i = 0; i < 16; ++i) {
    Request& r = requests.emplace_back(RealRequest(i, 32 + 16 * static_cast<Tokens>(i % 3), 3));
    // Three families of shared prefixes, of different lengths.
    for (std::size_t b = 0; b < static_cast<std::size_t>(r.input_tokens / 16); ++b)
      r.block_hashes.push_back(1000 * (i % 4) + b);
  }
  std::size_t next = 0;
  std::int64_t evictions_seen = 0;
  while (next < requests.size() || !engine.idle()) {
    if (next < requests.size())
      solo.ports.inbox.push_back(
          {EngineMessage::Kind::kNewRequest, Lend(requests[next++]), kNoInstance});
    engine.RunOnce();
    for (const Request& probe : requests) {
      EXPECT_EQ(
          index.CachedPrefixTokens(0, probe),
          engine.blocks().BlocksToTokens(engine.blocks().CachedPrefixBlocks(probe.block_hashes)))
          << "after request " << next;
    }
    EXPECT_EQ(static_cast<std::int64_t>(index.blocks(0)), engine.blocks().kv_blocks_cached());
    evictions_seen = engine.blocks().evictions();
  }
  EXPECT_GT(evictions_seen, 0) << "the workload should have evicted cached blocks";
}

}  // namespace
}  // namespace duet::policies
