// Routing in the simulator: the pooled reference cache (one prefix cache with the prefill
// instances' summed KV blocks, seeing every request) against a hand-computed outcome, and a
// router whose view of the GPU caches lags by --router-staleness-ms (KV events in flight).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

// Two colocated tiny-test instances, one per node, behind the links of tests/data/1p1d-tiny.
nlohmann::json TwoColocated() {
  nlohmann::json c = ReadJson(Src("tests/data/1p1d-tiny.json"));
  c["name"] = "2colo-tiny";
  c["instances"] = nlohmann::json::array({{{"role", "colocated"}, {"count", 2}, {"tp", 1}}});
  return c;
}

std::string Line(double ms, int input, int output, std::vector<int> ids) {
  return nlohmann::json({{"timestamp", ms},
                         {"input_length", input},
                         {"output_length", output},
                         {"hash_ids", ids}})
             .dump() +
         "\n";
}

TEST(PooledReference, CountsEveryLongestPreviouslySeenPrefix) {
  TempDir tmp;
  const std::string colo = tmp.File("colo.json");
  WriteJson(colo, TwoColocated());
  // Mooncake blocks are 512 tokens, the engine's 16. Far below the caches' capacity: no
  // eviction, so each request hits the longest prefix seen before it, at most its prompt less
  // one token, in whole engine blocks.
  const std::string trace =
      tmp.Write("t.jsonl", Line(0, 1024, 4, {1, 2}) +           // new: 0
                               Line(100, 1536, 4, {1, 2, 3}) +  // 1024 (blocks 1, 2)
                               Line(200, 512, 4, {1}) +         // block 1 but one token: 496
                               Line(300, 512, 4, {9}) +         // new: 0
                               Line(400, 1300, 4, {1, 2, 7}));  // 1024
  for (const char* router : {"round-robin", "kv-aware"}) {
    const std::string out = tmp.File(std::string("out-") + router);
    Simulate(out, {"--cluster", colo, "--trace", trace, "--router", router});
    const nlohmann::json pooled =
        ReadJson(out + "/summary.json")["prefix_cache"]["pooled_reference"];
    EXPECT_EQ(pooled["lookup_tokens"].get<std::int64_t>(), 1024 + 1536 + 512 + 512 + 1300);
    EXPECT_EQ(pooled["hit_tokens"].get<std::int64_t>(), 1024 + 496 + 1024) << router;
  }
  // Its capacity is the prefill side's: PD counts the prefill instance alone.
  const std::string pd = tmp.File("pd.json");
  WriteJson(pd, ReadJson(Src("tests/data/1p1d-tiny.json")));
  Simulate(tmp.File("pd"), {"--cluster", pd, "--trace", trace});
  Simulate(tmp.File("colo"), {"--cluster", colo, "--trace", trace});
  const auto capacity = [&](const std::string& dir) {
    return ReadJson(dir + "/summary.json")["prefix_cache"]["pooled_reference"]["capacity_blocks"]
        .get<std::int64_t>();
  };
  EXPECT_GT(capacity(tmp.File("pd")), 0);
  EXPECT_EQ(capacity(tmp.File("colo")), 2 * capacity(tmp.File("pd")));
}

// Z goes to c0 and A, queued behind nothing, to c1. B, arriving long after both finished,
// shares A's prefix: a router that sees c1's cache sends it there; one whose view is older
// than A's KV events sees two idle, empty instances and takes the lower id.
TEST(RouterStaleness, AFollowUpFindsItsPrefixOnlyOnceTheEventsArrive) {
  TempDir tmp;
  const std::string colo = tmp.File("colo.json");
  WriteJson(colo, TwoColocated());
  const std::string trace =
      tmp.Write("t.jsonl", Line(0, 512, 8, {50}) + Line(0, 2048, 4, {1, 2, 3, 4}) +
                               Line(5000, 2560, 4, {1, 2, 3, 4, 5}));
  struct Case {
    const char* staleness_ms;
    const char* b_instance;
    const char* b_cached;
  };
  for (const Case& c :
       {Case{"0", "c1", "2048"}, Case{"1000", "c1", "2048"}, Case{"60000", "c0", "0"}}) {
    const std::string out = tmp.File(std::string("out-") + c.staleness_ms);
    Simulate(out, {"--cluster", colo, "--trace", trace, "--router", "kv-aware",
                   "--router-staleness-ms", c.staleness_ms});
    const Csv csv = Csv::Read(out + "/requests.csv");
    ASSERT_EQ(csv.size(), 3u);
    EXPECT_EQ(csv.Get(0, "prefill_instance"), "c0");
    EXPECT_EQ(csv.Get(1, "prefill_instance"), "c1");
    EXPECT_EQ(csv.Get(2, "prefill_instance"), c.b_instance) << "staleness " << c.staleness_ms;
    EXPECT_EQ(csv.Get(2, "cached_tokens"), c.b_cached) << "staleness " << c.staleness_ms;
    EXPECT_FALSE(csv.Get(2, "router_score").empty());
    const nlohmann::json s = ReadJson(out + "/summary.json");
    EXPECT_EQ(s["run"]["router_options"]["staleness_ms"].get<double>(), std::stod(c.staleness_ms));
  }
}

}  // namespace
}  // namespace duet::e2e
