// The shared engine loop driven with an explicit clock and in-memory ports (no SimGrid):
// request timelines in colocated and PD roles, decode-run coalescing equal to single steps,
// and no leaked blocks at the end.
#include "policies/engine.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

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
struct TestPorts : Inbox, Outbox, StepExecutor, KvTransport {
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
  TransferId Post(const KvTransferRequest&) override {
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
  std::vector<Request> finished_records;
  int prefill_done = 0;
  void OnFinished(const Request& r) override {
    MetricsCollector::OnFinished(r);
    finished_records.push_back(r);
  }
  void OnPrefillDone(const Request&) override { ++prefill_done; }
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
  Request r = MakeRequest(7, 0, 100, 4);
  r.prefill_instance = r.decode_instance = 0;
  ports.inbox.push_back({EngineMessage::Kind::kNewRequest, &r, kNoInstance});
  while (engine.RunOnce()) {
  }
  ASSERT_EQ(sink.finished_records.size(), 1u);
  const Request& done = sink.finished_records[0];
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

// Runs the same arrivals through a colocated engine, returning the final records.
std::vector<Request> RunColocated(bool coalesce, int* execute_calls) {
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
      ports.inbox.push_back({EngineMessage::Kind::kNewRequest, &requests[next++], kNoInstance});
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

TEST(InstanceEngine, CoalescedDecodeRunsEqualSingleSteps) {
  int calls_single = 0, calls_coalesced = 0;
  const auto single = RunColocated(false, &calls_single);
  const auto coalesced = RunColocated(true, &calls_coalesced);
  ASSERT_EQ(single.size(), coalesced.size());
  std::map<RequestId, const Request*> by_id;
  for (const auto& r : coalesced) by_id[r.id] = &r;
  for (const auto& a : single) {
    const Request& b = *by_id.at(a.id);
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
  p_ports.inbox.push_back({EngineMessage::Kind::kNewRequest, &r, kNoInstance});
  EXPECT_TRUE(prefill.RunOnce());  // prefill: 10 + 64 ms
  EXPECT_EQ(r.state, RequestState::kTransferring);
  EXPECT_NEAR(r.prefill_done_s, 0.074, 1e-12);
  EXPECT_LT(r.first_token_s, 0);  // not delivered until the decode side holds the KV
  // The prefill instance still holds the KV blocks until released.
  EXPECT_EQ(prefill.blocks().kv_blocks_used(), 4);
  EXPECT_FALSE(decode.RunOnce());  // posts the pull; transfer takes 5 ms
  EXPECT_EQ(r.kv_transfer_bytes, 64 * 1000);
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
  ports.inbox.push_back({EngineMessage::Kind::kNewRequest, &r, kNoInstance});
  EXPECT_TRUE(prefill.RunOnce());
  EXPECT_EQ(r.state, RequestState::kCompleted);
  EXPECT_NEAR(r.first_token_s, 0.030, 1e-12);
  EXPECT_TRUE(prefill.idle());
}

}  // namespace
}  // namespace duet::policies
