// PD disaggregation in the live frontend: prefill and decode instances on engine threads, the
// prompt's KV pulled by the decode instance through a real transport (loopback; UCX over tcp
// and over shared memory). Greedy output through 1P1D and 2P2D equals the colocated server's,
// token for token; a decode instance without room waits and fails nothing; a failed pull
// follows kv_load_failure_policy; no block or lease is left behind.
#include <gtest/gtest.h>

#include <set>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/transport/kv_transport.h"
#include "tests/live/live_test_util.h"

namespace duet::backend::serve {
namespace {

using policies::FinishReason;
using policies::InstanceRole;

class PdFrontend : public Frontend {
 protected:
  // Prompts of 5 to 83 tokens (tiled prefill attention from 32), some ending on a block
  // boundary, and output lengths from 1 (the prefill instance finishes it) to 13.
  static std::vector<LiveRequest> Requests() {
    std::vector<LiveRequest> requests;
    const int lengths[] = {5, 16, 31, 32, 47, 64, 70, 83};
    for (int i = 0; i < 8; ++i)
      requests.push_back({Prompt(lengths[i], 40 + i), 1 + (i * 5) % 13, {}});
    return requests;
  }

  // Runs every request concurrently; returns each one's tokens (all must end by length).
  static std::vector<std::vector<std::int32_t>> Run(LiveFrontend& frontend,
                                                    const std::vector<LiveRequest>& requests,
                                                    std::vector<FinishInfo>* infos = nullptr) {
    std::vector<std::shared_ptr<Collector>> listeners;
    for (const LiveRequest& r : requests) {
      listeners.push_back(std::make_shared<Collector>());
      const Admission a = frontend.Submit(r, listeners.back());
      EXPECT_EQ(a.status, AdmitStatus::kAccepted) << a.message;
    }
    std::vector<std::vector<std::int32_t>> tokens;
    for (std::size_t i = 0; i < listeners.size(); ++i) {
      const auto info = listeners[i]->Wait();
      EXPECT_TRUE(info) << "request " << i << " did not finish";
      if (!info) return {};
      EXPECT_EQ(info->reason, FinishReason::kLength) << "request " << i << ": " << info->message;
      if (infos) infos->push_back(*info);
      tokens.push_back(listeners[i]->tokens());
    }
    return tokens;
  }

  static const std::vector<std::vector<std::int32_t>>& Colocated() {
    static const auto* expected = [] {
      auto frontend = Start(1, {});
      return new std::vector<std::vector<std::int32_t>>(Run(*frontend, Requests()));
    }();
    return *expected;
  }

  static std::unique_ptr<LiveFrontend> StartPd(std::vector<InstanceRole> roles,
                                               FrontendOptions options,
                                               std::vector<std::int64_t> blocks = {}) {
    std::vector<std::unique_ptr<ForwardModel>> models;
    for (std::size_t i = 0; i < roles.size(); ++i)
      models.push_back(Model(blocks.empty() ? 64 : blocks[i]));
    options.roles = std::move(roles);
    auto f = LiveFrontend::Start(std::move(models), std::move(options));
    EXPECT_TRUE(f.ok()) << f.error();
    return f.ok() ? std::move(*f) : nullptr;
  }

  // Every block back, no lease held or ended unreleased (instances publish after each
  // iteration, a moment after the listener heard of the end).
  static void ExpectNothingLeft(const LiveFrontend& f) {
    EXPECT_TRUE(EventuallyNoBlocksUsed(f));
    for (int i = 0; i < 500 && f.Stats().load.leases_held > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(f.Stats().load.leases_held, 0);
    EXPECT_EQ(f.Stats().load.leases_expired, 0);
  }
};

struct Topology {
  std::string name;
  std::vector<InstanceRole> roles;
};
struct Transport {
  std::string name;
  KvTransportOptions options;
};

void PrintTo(const Topology& t, std::ostream* os) { *os << t.name; }
void PrintTo(const Transport& t, std::ostream* os) { *os << t.name; }

class PdEquality : public PdFrontend,
                   public ::testing::WithParamInterface<std::tuple<Topology, Transport>> {};

TEST_P(PdEquality, GreedyOutputEqualsTheColocatedServer) {
  const auto& [topology, transport] = GetParam();
  FrontendOptions options;
  options.router.kind = policies::RouterKind::kRoundRobin;
  options.kv_transport = transport.options;
  auto frontend = StartPd(topology.roles, options);
  ASSERT_TRUE(frontend);
  std::vector<FinishInfo> infos;
  const auto tokens = Run(*frontend, Requests(), &infos);
  ASSERT_EQ(tokens.size(), Colocated().size());
  std::map<policies::InstanceId, int> finished_on;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(tokens[i], Colocated()[i]) << "request " << i;
    ++finished_on[infos[i].instance];
    // One-token requests end on their prefill instance; the others on a decode instance.
    const InstanceRole role = topology.roles[static_cast<std::size_t>(infos[i].instance)];
    EXPECT_EQ(role, Requests()[i].max_tokens == 1 ? InstanceRole::kPrefill : InstanceRole::kDecode)
        << "request " << i;
  }
  const auto decodes = std::ranges::count(topology.roles, InstanceRole::kDecode);
  int decode_instances_used = 0;
  for (const auto& [instance, count] : finished_on)
    decode_instances_used +=
        topology.roles[static_cast<std::size_t>(instance)] == InstanceRole::kDecode;
  EXPECT_EQ(decode_instances_used, decodes);
  EXPECT_EQ(frontend->Stats().load.kv_load_failures, 0);
  ExpectNothingLeft(*frontend);
}

std::vector<Transport> Transports() {
  std::vector<Transport> all = {{"loopback", {}}};
#if DUET_HAVE_UCX
  all.push_back({"ucx_tcp", {"ucx", "tcp", nullptr}});
  all.push_back({"ucx_shm", {"ucx", "posix,cma", nullptr}});
#endif
  return all;
}

#if !DUET_HAVE_UCX
TEST(PdUcx, NotInThisBuild) {
  GTEST_SKIP() << "this build has no UCX (libucx-dev, which scripts/setup.sh installs): PD over "
                  "UCX is not tested";
}
#endif

INSTANTIATE_TEST_SUITE_P(
    Live, PdEquality,
    ::testing::Combine(::testing::Values(Topology{"1p1d",
                                                  {InstanceRole::kPrefill, InstanceRole::kDecode}},
                                         Topology{"2p2d",
                                                  {InstanceRole::kPrefill, InstanceRole::kDecode,
                                                   InstanceRole::kPrefill, InstanceRole::kDecode}}),
                       ::testing::ValuesIn(Transports())),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
    });

// The decode instance has room for one request's KV at a time (5 blocks: 70 tokens and a few
// more): it pulls one, the others wait with their KV held on the prefill side, and every
// request completes with the colocated output.
// Follows, as the engines report them, the requests prefilled whose first token the decode
// instance has not delivered yet (their KV waits on the prefill side) and those the decode
// instance serves (first token delivered, not finished). Exact, where sampling a gauge could
// miss the moment.
class HandoffWatch final : public policies::EventSink {
 public:
  void OnPrefillDone(const policies::RequestSpec& r, const policies::RequestRecord&) override {
    std::lock_guard lock(mu_);
    waiting_.insert(r.id);
    most_waiting_ = std::max(most_waiting_, static_cast<std::int64_t>(waiting_.size()));
  }
  void OnToken(const policies::RequestSpec& r, const policies::RequestRecord&,
               std::int32_t) override {
    std::lock_guard lock(mu_);
    if (waiting_.erase(r.id) == 0) return;
    decoding_.insert(r.id);
    most_decoding_ = std::max(most_decoding_, static_cast<std::int64_t>(decoding_.size()));
  }
  void OnFinished(const policies::RequestSpec& r, const policies::RequestRecord&) override {
    std::lock_guard lock(mu_);
    decoding_.erase(r.id);
  }
  void OnTokenGaps(Seconds, std::int64_t) override {}
  void OnPreempted(const policies::RequestSpec&, const policies::RequestRecord&,
                   policies::InstanceId) override {}
  std::int64_t most_waiting() {
    std::lock_guard lock(mu_);
    return most_waiting_;
  }
  std::int64_t most_decoding() {
    std::lock_guard lock(mu_);
    return most_decoding_;
  }

 private:
  std::mutex mu_;
  std::set<policies::RequestId> waiting_, decoding_;
  std::int64_t most_waiting_ = 0, most_decoding_ = 0;
};

TEST_F(PdFrontend, ADecodeInstanceWithoutRoomDoesNotPullAndNoRequestFails) {
  FrontendOptions options;
  options.engine.scheduler.watermark = 0;
  HandoffWatch watch;
  options.observer = &watch;
  auto frontend = StartPd({InstanceRole::kPrefill, InstanceRole::kDecode}, options, {64, 6});
  ASSERT_TRUE(frontend);
  std::vector<LiveRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back({Prompt(70, 60 + i), 8, {}});
  std::vector<std::vector<std::int32_t>> expected;
  {
    auto colocated = Start(1, {});
    expected = Run(*colocated, requests);
  }
  std::vector<std::shared_ptr<Collector>> listeners;
  for (const LiveRequest& r : requests) {
    listeners.push_back(std::make_shared<Collector>());
    ASSERT_EQ(frontend->Submit(r, listeners.back()).status, AdmitStatus::kAccepted);
  }
  for (std::size_t i = 0; i < listeners.size(); ++i) {
    const auto info = listeners[i]->Wait();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->reason, FinishReason::kLength) << info->message;
    EXPECT_EQ(listeners[i]->tokens(), expected[i]) << "request " << i;
  }
  // Requests waited for the decode instance with their KV held on the prefill side, and it
  // served one at a time: it pulled only with room.
  EXPECT_GE(watch.most_waiting(), 2);
  EXPECT_EQ(watch.most_decoding(), 1);
  EXPECT_EQ(frontend->Stats().load.kv_load_failures, 0);
  ExpectNothingLeft(*frontend);
}

// Every other pull fails (fault-injecting wrapper of the loopback transport): with "fail" those
// requests end with an error naming the transfer, the rest complete; with "recompute" the
// decode instance prefills them itself and every output equals the colocated one.
TEST_F(PdFrontend, FailedPullsFollowTheFailurePolicy) {
  for (const auto policy :
       {policies::KvLoadFailurePolicy::kFail, policies::KvLoadFailurePolicy::kRecompute}) {
    SCOPED_TRACE(policies::ToString(policy));
    FrontendOptions options;
    options.engine.kv_load_failure_policy = policy;
    auto posted = std::make_shared<int>(0);
    options.kv_transport.wrap = [posted](policies::KvTransport& inner, policies::InstanceId) {
      return std::make_unique<FaultInjectingKvTransport>(
          inner, [posted](const policies::KvTransferRequest&) {
            return (*posted)++ % 2 == 0 ? FaultInjectingKvTransport::Fault::kFail
                                        : FaultInjectingKvTransport::Fault::kNone;
          });
    };
    auto frontend = StartPd({InstanceRole::kPrefill, InstanceRole::kDecode}, options);
    ASSERT_TRUE(frontend);
    std::vector<std::shared_ptr<Collector>> listeners;
    const auto requests = Requests();
    for (const LiveRequest& r : requests) {
      listeners.push_back(std::make_shared<Collector>());
      ASSERT_EQ(frontend->Submit(r, listeners.back()).status, AdmitStatus::kAccepted);
    }
    int failed = 0;
    for (std::size_t i = 0; i < listeners.size(); ++i) {
      const auto info = listeners[i]->Wait();
      ASSERT_TRUE(info);
      if (info->reason == FinishReason::kError) {
        ++failed;
        EXPECT_NE(info->message.find("KV transfer"), std::string::npos) << info->message;
        continue;
      }
      EXPECT_EQ(info->reason, FinishReason::kLength);
      EXPECT_EQ(listeners[i]->tokens(), Colocated()[i]) << "request " << i;
    }
    const int pulls = static_cast<int>(
        std::ranges::count_if(requests, [](const LiveRequest& r) { return r.max_tokens > 1; }));
    const int faults = (pulls + 1) / 2;
    EXPECT_EQ(frontend->Stats().load.kv_load_failures, faults);
    if (policy == policies::KvLoadFailurePolicy::kFail) {
      EXPECT_EQ(failed, faults);
    } else {
      EXPECT_EQ(failed, 0);
      EXPECT_EQ(frontend->Stats().load.kv_load_recomputes, faults);
    }
    ExpectNothingLeft(*frontend);
  }
}

// A prefill instance's lease (20 ms) ends while the pull is delayed (wrapper: in progress for
// 10 s of polls): the prefill side frees the blocks by itself, and the decode side, seeing the
// pull complete only after the lease, recomputes; nothing is left held.
TEST_F(PdFrontend, AnEndedLeaseFreesThePrefillSideAndTheRequestIsRecomputed) {
  FrontendOptions options;
  options.engine.kv_lease_s = 0.02;
  options.engine.kv_load_failure_policy = policies::KvLoadFailurePolicy::kRecompute;
  options.kv_transport.wrap = [](policies::KvTransport& inner, policies::InstanceId) {
    // The engine thread polls every 0.5 ms while a pull is in flight: 200 polls outlast the lease.
    return std::make_unique<FaultInjectingKvTransport>(
        inner,
        [](const policies::KvTransferRequest&) { return FaultInjectingKvTransport::Fault::kDelay; },
        /*delay_polls=*/200);
  };
  auto frontend = StartPd({InstanceRole::kPrefill, InstanceRole::kDecode}, options);
  ASSERT_TRUE(frontend);
  const LiveRequest request = Requests()[5];
  auto listener = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit(request, listener).status, AdmitStatus::kAccepted);
  const auto info = listener->Wait();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->reason, FinishReason::kLength) << info->message;
  EXPECT_EQ(listener->tokens(), Colocated()[5]);
  EXPECT_EQ(frontend->Stats().load.kv_load_recomputes, 1);
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
  EXPECT_EQ(frontend->Stats().load.leases_expired, 1);
  EXPECT_EQ(frontend->Stats().load.leases_held, 0);
}

TEST_F(PdFrontend, BadRoleSetsAreRefused) {
  for (const auto& roles :
       std::vector<std::vector<InstanceRole>>{{InstanceRole::kPrefill, InstanceRole::kPrefill},
                                              {InstanceRole::kDecode},
                                              {InstanceRole::kColocated, InstanceRole::kDecode}}) {
    std::vector<std::unique_ptr<ForwardModel>> models;
    for (std::size_t i = 0; i < roles.size(); ++i) models.push_back(Model(64));
    FrontendOptions options;
    options.roles = roles;
    EXPECT_FALSE(LiveFrontend::Start(std::move(models), options).ok());
  }
  std::vector<std::unique_ptr<ForwardModel>> models;
  models.push_back(Model(64));
  FrontendOptions options;
  options.roles = {InstanceRole::kPrefill, InstanceRole::kDecode};
  const auto mismatch = LiveFrontend::Start(std::move(models), options);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().find("2 instance roles for 1 instances"), std::string::npos);
}

}  // namespace
}  // namespace duet::backend::serve
