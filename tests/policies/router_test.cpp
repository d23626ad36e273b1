// Routers: round-robin, least outstanding work, power-of-two choices, prefix-aware, cache-aware
// (with SLO rejection), kv-aware (weights, load guard, sampling); PD pairs; their accounting.
#include "policies/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

// Each with a fresh id: a router tracks the requests in flight by id.
Request MakeRequest(Tokens input) {
  static RequestId next_id = 1;
  Request r;
  r.id = next_id++;
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

    // Colocated instances have no sides to name.
    auto colocated = MakeRouter(Config(kind, 7), {0, 1}, {}, &cache);
    colocated->SetAvailable(0, false);
    colocated->SetAvailable(1, false);
    EXPECT_EQ(colocated->Route(MakeRequest(100)).reject_reason, "no instance is up");
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
  router->OnPrefillDone(big, big);
  EXPECT_EQ(router->load(d1.prefill).outstanding_prefill_tokens, 0);
  EXPECT_EQ(router->load(d1.prefill).outstanding_requests, 0);
  EXPECT_EQ(router->load(d1.decode).outstanding_requests, decode_before);
  router->OnFinished(big, big);
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
  ASSERT_TRUE(d.score.has_value());
  EXPECT_NEAR(*d.score, 450, 1e-6);  // ms
  // What queues on instance 1 is the 4000 tokens that request computes, not its 10000-token
  // prompt: 0.8 s + 0.05 s there still beats 0.9 s on instance 0 (prefix-aware's accounting
  // would have charged 1 s and sent it to 0).
  EXPECT_EQ(router->load(1).outstanding_prefill_work, 4000);
  EXPECT_EQ(router->load(1).outstanding_prefill_tokens, 10000);
  d = router->Route(MakeRequest(10000));
  EXPECT_EQ(d.prefill, 1);
  EXPECT_NEAR(d.estimated_ttft_s, 0.85, 1e-9);
  // Now 1.25 s there: instance 0 (0.9 s) wins.
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

namespace duet::policies {
namespace {

// The interference and footprint terms off: the tests of the other terms compute their costs
// without them.
RouterConfig KvAware(double queue, double prefill, double decode) {
  RouterConfig config = Config(RouterKind::kKvAware, 1);
  config.kv.queue_weight = queue;
  config.kv.prefill_weight = prefill;
  config.kv.decode_weight = decode;
  config.kv.interference_weight = 0;
  config.kv.footprint_weight = 0;
  return config;
}

// Routes `r` and records where it went, as a frontend does.
RoutingDecision RouteAndPlace(Router& router, Request& r) {
  const RoutingDecision d = router.Route(r);
  r.prefill_instance = d.prefill;
  r.decode_instance = d.decode;
  return d;
}

TEST(Router, KvAwareScoresQueuedWorkUncachedTokensAndDecodeLoad) {
  FixedCache cache;
  auto router = MakeRouter(KvAware(0.5, 1.0, 0.1), {0, 1}, {}, &cache);
  // Instance 1 holds 3000 of 4000 tokens: 0.5*0 + 1000 + 0.1*4000 = 1400 against 4400.
  cache.cached = {{1, 3000}};
  Request a = MakeRequest(4000);
  auto d = RouteAndPlace(*router, a);
  EXPECT_EQ(d.prefill, 1);
  ASSERT_TRUE(d.score.has_value());
  EXPECT_DOUBLE_EQ(*d.score, 1400);
  EXPECT_EQ(router->load(1).outstanding_prefill_work, 1000);
  EXPECT_EQ(router->load(1).outstanding_kv_tokens, 4000);
  // The same again: 1 costs 0.5*1000 + 1000 + 0.1*8000 = 2300; 0 costs 4000 + 400 = 4400.
  Request b = MakeRequest(4000);
  EXPECT_EQ(RouteAndPlace(*router, b).prefill, 1);
  // Counting the queue in full, instance 1 takes three (costs 1400, 2800, 4200) before the
  // fourth would cost 1*3000 + 1000 + 0.1*16000 = 5600 > 4400.
  auto full = MakeRouter(KvAware(1.0, 1.0, 0.1), {0, 1}, {}, &cache);
  for (int k = 0; k < 3; ++k) {
    Request r = MakeRequest(4000);
    EXPECT_EQ(RouteAndPlace(*full, r).prefill, 1) << k;
  }
  Request tipped = MakeRequest(4000);
  EXPECT_EQ(RouteAndPlace(*full, tipped).prefill, 0);
}

TEST(Router, KvAwareReleasesItsChargesAtPrefillAndFinish) {
  FixedCache cache;
  cache.cached = {{0, 600}};
  auto router = MakeRouter(KvAware(0.5, 1.0, 0.1), {0, 1}, {2}, &cache);
  Request r = MakeRequest(1000);
  const auto d = RouteAndPlace(*router, r);
  EXPECT_EQ(d.prefill, 0);
  EXPECT_EQ(d.decode, 2);
  EXPECT_EQ(router->load(0).outstanding_prefill_work, 400);
  EXPECT_EQ(router->load(0).outstanding_kv_tokens, 0);  // PD: the decode side holds the KV
  EXPECT_EQ(router->load(2).outstanding_kv_tokens, 1000);
  r.prefill_done_s = 1;
  router->OnPrefillDone(r, r);
  EXPECT_EQ(router->load(0).outstanding_prefill_work, 0);
  EXPECT_EQ(router->load(0).outstanding_requests, 0);
  router->OnFinished(r, r);
  EXPECT_EQ(router->load(2).outstanding_kv_tokens, 0);
  EXPECT_EQ(router->load(2).outstanding_requests, 0);
  // A request that fails before its prefill completes releases both sides at once.
  Request failed = MakeRequest(1000);
  RouteAndPlace(*router, failed);
  router->OnFinished(failed, failed);
  for (InstanceId i : {0, 1, 2}) {
    EXPECT_EQ(router->load(i).outstanding_prefill_work, 0) << i;
    EXPECT_EQ(router->load(i).outstanding_prefill_tokens, 0) << i;
    EXPECT_EQ(router->load(i).outstanding_kv_tokens, 0) << i;
    EXPECT_EQ(router->load(i).outstanding_requests, 0) << i;
  }
}

TEST(Router, KvAwareDecodesWhereTheLeastKvIsInFlight) {
  FixedCache cache;
  auto router = MakeRouter(KvAware(0.5, 1.0, 0.1), {0}, {1, 2}, &cache);
  Request big = MakeRequest(9000);
  EXPECT_EQ(RouteAndPlace(*router, big).decode, 1);
  // Two small ones both go to 2: 100 and then 200 tokens there against 9000 on 1 (a count of
  // requests would have sent the second back to 1).
  for (int k = 0; k < 2; ++k) {
    Request small = MakeRequest(100);
    EXPECT_EQ(RouteAndPlace(*router, small).decode, 2) << k;
  }
}

TEST(Router, LoadGuardKeepsAHotPrefixFromDrawingEveryRequest) {
  FixedCache cache;
  cache.cached = {{0, 7900}};  // instance 0 holds nearly every prompt
  RouterConfig config = KvAware(0.5, 1.0, 0.0);
  auto unguarded = MakeRouter(config, {0, 1, 2, 3}, {}, &cache);
  config.load_guard = 2;
  auto guarded = MakeRouter(config, {0, 1, 2, 3}, {}, &cache);
  std::map<InstanceId, int> free_count, guarded_count;
  for (int k = 0; k < 40; ++k) {
    Request a = MakeRequest(8000), b = MakeRequest(8000);
    ++free_count[RouteAndPlace(*unguarded, a).prefill];
    ++guarded_count[RouteAndPlace(*guarded, b).prefill];
  }
  // Unguarded, 100 tokens of work each: 80 requests would have to queue there before another
  // instance's 8000 uncached tokens cost less.
  EXPECT_EQ(free_count[0], 40);
  // Guarded: instance 0 takes a request only while it has fewer than 2 * (mean + 1) in flight.
  double total = 0;
  for (InstanceId i : {0, 1, 2, 3}) total += guarded->load(i).outstanding_requests;
  const double mean = total / 4;
  EXPECT_LE(guarded->load(0).outstanding_requests, 2 * (mean + 1));
  EXPECT_LT(guarded_count[0], 40);
  EXPECT_GT(guarded_count[0], guarded_count[1]);  // it still draws the most
}

TEST(Router, KvAwareSamplingIsSeededAndFavoursTheCheapest) {
  FixedCache cache;
  cache.cached = {{2, 900}};
  RouterConfig config = KvAware(0.0, 1.0, 0.001);  // all but idle: the prefix decides
  config.kv.temperature = 0.5;
  config.seed = 9;
  auto a = MakeRouter(config, {0, 1, 2}, {}, &cache);
  auto b = MakeRouter(config, {0, 1, 2}, {}, &cache);
  std::map<InstanceId, int> count;
  for (int k = 0; k < 600; ++k) {
    Request ra = MakeRequest(1000), rb = MakeRequest(1000);
    const InstanceId pa = a->Route(ra).prefill;
    EXPECT_EQ(pa, b->Route(rb).prefill);
    ++count[pa];
  }
  // Costs scaled to [0, 1]: 2 is 0, the others about 1: weights 1 : e^-2 : e^-2, so 2 draws
  // about 79% (the decode term nudges the others' costs as requests accumulate).
  EXPECT_GT(count[2], 400);
  EXPECT_GT(count[0], 30);
  EXPECT_GT(count[1], 30);
}

// Where no instance holds a prompt, equal queues leave the footprint to decide: the prompt
// goes where fewer tokens were routed lately. It fades with time, and never outweighs a
// prefix an instance holds.
TEST(Router, KvAwareSpreadsNewPromptsByFootprint) {
  FixedCache cache;
  RouterConfig config = KvAware(0.1, 1.0, 0.1);
  config.kv.footprint_weight = 0.001;
  config.kv.footprint_window_s = 10;
  auto router = MakeRouter(config, {0, 1}, {2}, &cache);
  auto serve = [&](Request& r, Seconds at) {
    r.arrival_s = at;
    const RoutingDecision d = RouteAndPlace(*router, r);
    r.prefill_done_s = at;
    router->OnPrefillDone(r, r);
    router->OnFinished(r, r);  // no queue left behind: only the footprint remains
    return d;
  };
  Request a = MakeRequest(8000);
  EXPECT_EQ(serve(a, 0).prefill, 0);  // all alike: the lower id
  // One second later 0's footprint is 8000 e^-0.1 = 7239 tokens (7.2 of cost), 1's none.
  Request b = MakeRequest(100);
  const RoutingDecision db = serve(b, 1);
  EXPECT_EQ(db.prefill, 1);
  EXPECT_DOUBLE_EQ(*db.score, 100);
  // Then 1 has 100 tokens' footprint against 0's 7239: the next new prompt goes to 1 again.
  Request c = MakeRequest(100);
  EXPECT_EQ(serve(c, 1).prefill, 1);
  // A prefix held on 0 outweighs its footprint: 1000 uncached tokens against 2000.
  cache.cached = {{0, 1000}};
  Request d = MakeRequest(2000);
  EXPECT_EQ(serve(d, 2).prefill, 0);
  // Without the term, alike instances fall back to the lower id.
  config.kv.footprint_weight = 0;
  auto plain = MakeRouter(config, {0, 1}, {2}, &cache);
  cache.cached.clear();
  Request e = MakeRequest(8000), f = MakeRequest(100);
  e.arrival_s = 0;
  f.arrival_s = 1;
  RouteAndPlace(*plain, e);
  e.prefill_done_s = 0;
  plain->OnPrefillDone(e, e);
  plain->OnFinished(e, e);
  EXPECT_EQ(RouteAndPlace(*plain, f).prefill, 0);
}

// Colocated, a prompt's prefill stalls the decodes running where it goes: with the queues
// empty and nothing cached, 3 requests in flight on instance 0 against 1 on instance 1 cost
// 0.05 x 2000 x 3 = 300 tokens there against 100, so the prompt goes to 1. A prefix held on 0
// that spares 1,500 of its 2,000 tokens outweighs that (500 + 0.05 x 500 x 3 = 575 against
// 2,000 + 100).
TEST(Router, KvAwareChargesColocatedPrefillsForTheDecodesTheyStall) {
  FixedCache cache;
  RouterConfig config = KvAware(0.25, 1.0, 0.0);
  config.kv.interference_weight = 0.05;
  auto router = MakeRouter(config, {0, 1}, {}, &cache);
  // Requests decoding (prefilled: no queued work left) 3 on instance 0, 1 on instance 1.
  for (InstanceId target : {0, 0, 0, 1}) {
    cache.cached = {{target, 99}};  // 1 uncached token: each goes where it is told
    Request r = MakeRequest(100);
    ASSERT_EQ(RouteAndPlace(*router, r).prefill, target);
    r.prefill_done_s = 0;
    router->OnPrefillDone(r, r);
  }
  ASSERT_EQ(router->load(0).outstanding_requests, 3);
  ASSERT_EQ(router->load(0).outstanding_prefill_work, 0);
  cache.cached.clear();
  Request fresh = MakeRequest(2000);
  const RoutingDecision d = RouteAndPlace(*router, fresh);
  EXPECT_EQ(d.prefill, 1);
  EXPECT_DOUBLE_EQ(*d.score, 2000 + 0.05 * 2000 * 1);
  cache.cached = {{0, 1500}};
  Request held = MakeRequest(2000);
  const RoutingDecision h = RouteAndPlace(*router, held);
  EXPECT_EQ(h.prefill, 0);
  EXPECT_DOUBLE_EQ(*h.score, 500 + 0.05 * 500 * 3);
  // PD: prefill instances run no decodes, and the term does not apply.
  auto pd = MakeRouter(config, {0, 1}, {2}, &cache);
  EXPECT_EQ(pd->Route(MakeRequest(2000)).score, std::optional<double>(500));
}

TEST(Router, ConfigChecksNameTheBadField) {
  RouterConfig config = KvAware(0.5, 1.0, 0.1);
  EXPECT_TRUE(CheckRouterConfig(config).ok());
  config.kv.decode_weight = -1;
  EXPECT_NE(CheckRouterConfig(config).message().find("decode weight"), std::string::npos);
  config = KvAware(0.5, 1.0, 0.1);
  config.kv.temperature = std::nan("");
  EXPECT_NE(CheckRouterConfig(config).message().find("temperature"), std::string::npos);
  config = KvAware(0.5, 1.0, 0.1);
  config.load_guard = 1.0;  // would exclude every instance at the mean
  EXPECT_NE(CheckRouterConfig(config).message().find("load guard"), std::string::npos);
  config = KvAware(0.0, 1.0, 0.0);
  EXPECT_NE(CheckRouterConfig(config).message().find("both 0"), std::string::npos);
  config = KvAware(0.5, 1.0, 0.1);
  config.kv.interference_weight = std::numeric_limits<double>::infinity();
  EXPECT_NE(CheckRouterConfig(config).message().find("interference weight"), std::string::npos);
  config = KvAware(0.5, 1.0, 0.1);
  config.kv.footprint_weight = -0.5;
  EXPECT_NE(CheckRouterConfig(config).message().find("footprint weight"), std::string::npos);
  config = KvAware(0.5, 1.0, 0.1);
  config.kv.footprint_window_s = 0;
  EXPECT_NE(CheckRouterConfig(config).message().find("footprint window"), std::string::npos);
  EXPECT_EQ(*ParseRouterKind("kv-aware"), RouterKind::kKvAware);
  EXPECT_STREQ(ToString(RouterKind::kKvAware), "kv-aware");
}

}  // namespace
}  // namespace duet::policies
