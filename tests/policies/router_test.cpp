// Routers: round-robin, least outstanding work, power-of-two choices, prefix-aware, cache-aware
// (with SLO rejection); PD pairs.
#include "policies/router.h"

#include <gtest/gtest.h>

#include <map>

namespace duet::policies {
namespace {

class FixedCache : public CacheView {
 public:
  std::map<InstanceId, Tokens> cached;
  Tokens CachedPrefixTokens(InstanceId i, const Request&) const override {
    auto it = cached.find(i);
    return it == cached.end() ? 0 : it->second;
  }
};

// GPU hits as FixedCache, plus lower-tier hits with their load time per instance.
class TieredCache : public FixedCache {
 public:
  std::map<InstanceId, std::pair<Tokens, Seconds>> tiers;
  PrefixReuse Reuse(InstanceId i, const Request& r) const override {
    PrefixReuse reuse{CachedPrefixTokens(i, r), 0, 0};
    if (auto it = tiers.find(i); it != tiers.end()) {
      reuse.tier_tokens = it->second.first;
      reuse.load_s = it->second.second;
    }
    return reuse;
  }
};

RouterConfig Config(RouterKind kind, std::uint64_t seed) {
  RouterConfig config;
  config.kind = kind;
  config.seed = seed;
  return config;
}

Request MakeRequest(Tokens input) {
  Request r;
  r.input_tokens = input;
  r.output_tokens = 10;
  return r;
}

TEST(Router, ParsesNamesAndRejectsUnknown) {
  EXPECT_EQ(*ParseRouterKind("round-robin"), RouterKind::kRoundRobin);
  EXPECT_EQ(*ParseRouterKind("prefix-aware"), RouterKind::kPrefixAware);
  auto bad = ParseRouterKind("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("random"), std::string::npos);
  EXPECT_NE(bad.error().find("least-loaded"), std::string::npos);
}

TEST(Router, RoundRobinCyclesBothSides) {
  auto router = MakeRouter(Config(RouterKind::kRoundRobin, 1), {0, 1, 2}, {3, 4}, nullptr);
  std::vector<std::pair<InstanceId, InstanceId>> picks;
  for (int i = 0; i < 4; ++i) {
    auto d = router->Route(MakeRequest(100));
    picks.emplace_back(d.prefill, d.decode);
  }
  EXPECT_EQ(picks,
            (std::vector<std::pair<InstanceId, InstanceId>>{{0, 3}, {1, 4}, {2, 3}, {0, 4}}));
}

TEST(Router, ColocatedDecodesWhereItPrefills) {
  auto router = MakeRouter(Config(RouterKind::kLeastLoaded, 1), {0, 1}, {}, nullptr);
  auto d = router->Route(MakeRequest(100));
  EXPECT_EQ(d.prefill, d.decode);
}

// Every policy skips instances that are away, rejects with none left on a side, and takes an
// instance back when it returns.
TEST(Router, SkipsInstancesThatAreAwayAndRejectsWithNoneLeft) {
  FixedCache cache;
  for (RouterKind kind : {RouterKind::kRoundRobin, RouterKind::kLeastLoaded,
                          RouterKind::kPowerOfTwo, RouterKind::kPrefixAware}) {
    SCOPED_TRACE(ToString(kind));
    auto router = MakeRouter(Config(kind, 7), {0, 1}, {2, 3}, &cache);
    router->SetAvailable(0, false);
    router->SetAvailable(3, false);
    for (int i = 0; i < 6; ++i) {
      const RoutingDecision d = router->Route(MakeRequest(100));
      EXPECT_EQ(d.prefill, 1);
      EXPECT_EQ(d.decode, 2);
    }
    router->SetAvailable(2, false);
    RoutingDecision d = router->Route(MakeRequest(100));
    EXPECT_EQ(d.prefill, kNoInstance);
    EXPECT_EQ(d.reject_reason, "no decode instance is up");
    router->SetAvailable(1, false);
    d = router->Route(MakeRequest(100));
    EXPECT_EQ(d.reject_reason, "no prefill instance is up");
    router->SetAvailable(0, true);
    router->SetAvailable(3, true);
    d = router->Route(MakeRequest(100));
    EXPECT_EQ(d.prefill, 0);
    EXPECT_EQ(d.decode, 3);
  }
}

TEST(Router, LeastLoadedFollowsOutstandingWorkAndItsRelease) {
  auto router = MakeRouter(Config(RouterKind::kLeastLoaded, 1), {0, 1}, {2, 3}, nullptr);
  Request big = MakeRequest(5000), small = MakeRequest(100);
  auto d1 = router->Route(big);
  big.prefill_instance = d1.prefill;
  big.decode_instance = d1.decode;
  auto d2 = router->Route(small);
  small.prefill_instance = d2.prefill;
  small.decode_instance = d2.decode;
  EXPECT_NE(d1.prefill, d2.prefill);
  EXPECT_NE(d1.decode, d2.decode);
  EXPECT_EQ(router->load(d1.prefill).outstanding_prefill_tokens, 5000);
  // Prefill side counts prompt tokens: the next request goes where the small one went; the
  // decode side counts requests (a tie here: the lower id).
  const auto d3 = router->Route(MakeRequest(10));
  EXPECT_EQ(d3.prefill, d2.prefill);
  EXPECT_EQ(d3.decode, 2);
  EXPECT_EQ(router->load(2).outstanding_requests + router->load(3).outstanding_requests, 3);
  // Prefill done releases the prefill share; finishing releases the decode share.
  const auto decode_before = router->load(d1.decode).outstanding_requests;
  big.prefill_done_s = 1;
  router->OnPrefillDone(big);
  EXPECT_EQ(router->load(d1.prefill).outstanding_prefill_tokens, 0);
  EXPECT_EQ(router->load(d1.prefill).outstanding_requests, 0);
  EXPECT_EQ(router->load(d1.decode).outstanding_requests, decode_before);
  router->OnFinished(big);
  EXPECT_EQ(router->load(d1.decode).outstanding_requests, decode_before - 1);
}

TEST(Router, PowerOfTwoIsSeededAndNeverPicksTheWorseOfItsPair) {
  std::vector<InstanceId> side = {0, 1, 2, 3};
  auto a = MakeRouter(Config(RouterKind::kPowerOfTwo, 42), side, {}, nullptr);
  auto b = MakeRouter(Config(RouterKind::kPowerOfTwo, 42), side, {}, nullptr);
  // Load instance 0 heavily: it can only win against itself, which p2c never draws.
  for (int i = 0; i < 200; ++i) {
    auto da = a->Route(MakeRequest(10 + i));
    auto db = b->Route(MakeRequest(10 + i));
    EXPECT_EQ(da.prefill, db.prefill);
  }
  // Every instance was used, and the spread is balanced by the choice of two.
  Tokens min_load = 1 << 30, max_load = 0;
  for (InstanceId i : side) {
    min_load = std::min(min_load, a->load(i).outstanding_prefill_tokens);
    max_load = std::max(max_load, a->load(i).outstanding_prefill_tokens);
  }
  EXPECT_GT(min_load, 0);
  EXPECT_LT(max_load - min_load, 1000);
}

TEST(Router, PrefixAwareTakesTheCachedPrefixUnlessTheQueueThereCostsMore) {
  FixedCache cache;
  auto router = MakeRouter(Config(RouterKind::kPrefixAware, 1), {0, 1, 2}, {}, &cache);
  cache.cached = {{1, 3000}};
  EXPECT_EQ(router->Route(MakeRequest(4000)).prefill, 1);  // 1000 uncached vs 4000 elsewhere
  // Instance 1 now has 4000 queued tokens: 4000 + 1000 > 0 + 4000 elsewhere.
  EXPECT_EQ(router->Route(MakeRequest(4000)).prefill, 0);
}

TEST(Router, PrefixAwareBreaksCostTiesTowardTheLongerPrefix) {
  FixedCache cache;
  auto router = MakeRouter(Config(RouterKind::kPrefixAware, 1), {0, 1}, {}, &cache);
  EXPECT_EQ(router->Route(MakeRequest(500)).prefill, 0);   // equal costs: lower id
  EXPECT_EQ(router->Route(MakeRequest(1000)).prefill, 1);  // 1000 < 500 + 1000
  // Costs: instance 0: 500 + 1000; instance 1: 1000 + (1000 - 500). Equal; 1 has the prefix.
  cache.cached = {{1, 500}};
  EXPECT_EQ(router->Route(MakeRequest(1000)).prefill, 1);
}

// Estimated TTFT = (queued + uncached tokens) / rate + load time; the least wins.
TEST(Router, CacheAwareWeighsTierHitsAgainstTheirLoadTime) {
  TieredCache cache;
  RouterConfig config = Config(RouterKind::kCacheAware, 1);
  config.prefill_tokens_per_s = 10000;
  auto router = MakeRouter(config, {0, 1, 2}, {3}, &cache);
  cache.cached[0] = 1000;         // 9000 to compute: 0.9 s
  cache.tiers[1] = {6000, 0.05};  // 4000 to compute + load: 0.45 s
  cache.tiers[2] = {8000, 1.0};   // 1000 to compute, slow load: 1.1 s
  auto d = router->Route(MakeRequest(10000));
  EXPECT_EQ(d.prefill, 1);
  EXPECT_EQ(d.decode, 3);
  EXPECT_NEAR(d.estimated_ttft_s, 0.45, 1e-9);
  // Its 10000 queued tokens now cost instance 1 a second more: instance 0 (0.9 s) wins.
  d = router->Route(MakeRequest(10000));
  EXPECT_EQ(d.prefill, 0);
  EXPECT_TRUE(d.reject_reason.empty());
}

TEST(Router, CacheAwareRejectsWhatCannotMeetTheTtftSlo) {
  TieredCache cache;
  RouterConfig config = Config(RouterKind::kCacheAware, 1);
  config.prefill_tokens_per_s = 10000;
  config.reject_ttft_ms = 500;
  auto router = MakeRouter(config, {0}, {1}, &cache);
  auto ok = router->Route(MakeRequest(4000));  // 0.4 s
  EXPECT_EQ(ok.prefill, 0);
  auto rejected = router->Route(MakeRequest(4000));  // 0.8 s behind the first
  EXPECT_EQ(rejected.prefill, kNoInstance);
  EXPECT_EQ(rejected.reject_reason,
            "estimated TTFT over the SLO: 800 ms exceeds the TTFT SLO of 500 ms");
  // Nothing was charged for it.
  EXPECT_EQ(router->load(0).outstanding_prefill_tokens, 4000);
  EXPECT_EQ(router->load(1).outstanding_requests, 1);
}

}  // namespace
}  // namespace duet::policies
