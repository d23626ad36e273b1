#include "plan/space.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "plan/bounds.h"
#include "plan/gpu_prices.h"
#include "plan/scenario.h"
#include "sim/cluster_spec.h"
#include "tests/sim/e2e_util.h"

namespace duet::plan {
namespace {

namespace fs = std::filesystem;

// SpaceOptions' default GPU type at the bundled table's price.
const Prices kPrices{{{"h100-sxm", 2.5}}};

TEST(Space, CountsWhatItEnumeratesCheapestFirstAndEveryKeyOnce) {
  for (int max_gpus : {1, 3, 8, 16}) {
    // On nodes of 4 GPUs, TP8 and TP4 x DP2 instances span two of them.
    for (int gpus_per_node : {4, 8}) {
      SpaceOptions o;
      o.max_gpus = max_gpus;
      o.gpus_per_node = gpus_per_node;
      o.tp = {1, 2, 4, 8};
      o.dp = {1, 2};
      o.decode_tp = {1, 2};
      o.decode_dp = {1, 4};
      const auto all = Enumerate(o, kPrices);
      EXPECT_EQ(all.size(), CountCandidates(o)) << max_gpus << " GPUs";
      std::set<std::string> keys;
      for (std::size_t k = 0; k < all.size(); ++k) {
        EXPECT_TRUE(keys.insert(all[k].Key()).second) << all[k].Key();
        EXPECT_LE(all[k].gpus, max_gpus);
        if (k > 0) {
          EXPECT_LE(all[k - 1].cost_per_hour, all[k].cost_per_hour);
        }
        if (all[k].ssd_tib > 0) {
          EXPECT_GT(all[k].dram_gib, 0) << "SSD only below DRAM";
        }
        const bool spans = all[k].prefill_tp * all[k].prefill_dp > gpus_per_node ||
                           all[k].decode_tp * all[k].decode_dp > gpus_per_node;
        if (spans) {
          EXPECT_EQ(all[k].dram_gib, 0) << all[k].Key() << ": no tiers across nodes";
        }
      }
    }
  }
}

TEST(Space, PricesGpusAndTheTiersOfEveryNodeAFirstFitFills) {
  SpaceOptions o;
  o.max_gpus = 12;
  o.tp = {4};
  o.decode_tp = {1};
  o.token_budgets = {8192};
  o.dram_gib = {512};
  o.ssd_tib = {4};
  o.routers = {policies::RouterKind::kKvAware};
  const Prices prices{{{"h100-sxm", 2.0}}, 0.01, 1.0};
  for (const Candidate& c : Enumerate(o, prices)) {
    if (c.pd && c.prefill == 2 && c.decode == 1) {
      // Two TP4 prefill instances fill node 0; the decode instance opens node 1.
      EXPECT_EQ(c.gpus, 9);
      EXPECT_EQ(c.nodes, 2);
      EXPECT_DOUBLE_EQ(c.cost_per_hour, 9 * 2.0 + 2 * (512 * 0.01 + 4 * 1.0));
      EXPECT_EQ(c.Key(), "pd-2xtp4-1xtp1-b8192-dram512-ssd4-kv-aware");
      EXPECT_EQ(c.Layout(), "2 TP4 prefill + 1 TP1 decode");
    }
    if (!c.pd && c.prefill == 3) {
      EXPECT_EQ(c.nodes, 2);  // 12 GPUs: one node and a half
    }
  }
}

TEST(Space, EveryCandidateIsAClusterFileTheSimulatorTakes) {
  const nlohmann::json base =
      e2e::ReadJson(e2e::SourceDir() + "/sim/clusters/h100-8p8d-llama8b-tiered.json");
  SpaceOptions o;
  o.max_gpus = 10;
  for (const Candidate& c : Enumerate(o, kPrices)) {
    auto spec = sim::ParseClusterSpec(ClusterDocument(base, c), "candidate.json", DUET_SOURCE_DIR);
    ASSERT_TRUE(spec.ok()) << c.Key() << ": " << spec.error();
    EXPECT_EQ(spec->router, c.router);
    EXPECT_EQ(spec->CountRole(policies::InstanceRole::kPrefill), c.pd ? c.prefill : 0);
    EXPECT_EQ(spec->CountRole(policies::InstanceRole::kDecode), c.pd ? c.decode : 0);
    EXPECT_EQ(static_cast<int>(spec->nodes.size()), c.nodes);
    EXPECT_EQ(spec->engine.scheduler.max_num_batched_tokens, c.token_budget);
    EXPECT_EQ(spec->tiers.dram.enabled, c.dram_gib > 0);
    EXPECT_EQ(spec->tiers.ssd.enabled, c.ssd_tib > 0);
    if (c.ssd_tib > 0) {
      EXPECT_EQ(spec->tiers.ssd.capacity_bytes, c.ssd_tib * 1024 * kGiB);
    }
  }
}

// Instances with data-parallel attention: tp x dp GPUs each, named and placed so, and
// cluster files the simulator takes (DeepSeek-V3 on H200, priced by the roofline).
TEST(Space, InstancesWithDataParallelAttention) {
  const nlohmann::json base =
      e2e::ReadJson(e2e::SourceDir() + "/sim/clusters/h200-3p1d-deepseek-v3.json");
  SpaceOptions o;
  o.gpus = {"h200"};
  o.max_gpus = 24;
  o.gpus_per_node = 8;
  o.colocated = false;
  o.tp = {4, 8};
  o.dp = {1, 2};
  o.decode_tp = {1, 8};
  o.decode_dp = {1, 8};
  o.token_budgets = {8192};
  o.dram_gib = {0};
  o.ssd_tib = {0};
  o.routers = {policies::RouterKind::kKvAware};
  const auto all = Enumerate(o, Prices{{{"h200", 3.5}}});
  std::size_t winner = all.size();
  int with_dp = 0;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Candidate& c = all[k];
    EXPECT_LE(c.decode_tp * c.decode_dp, 8) << c.Key() << ": 64 GPUs is more than allowed";
    if (c.prefill_dp > 1) {
      if (c.prefill == 1 && c.decode == 2 && c.decode_dp == 8) {
        EXPECT_EQ(c.Key(), "pd-1xtp4dp2-2xtp1dp8-b8192-dram0-ssd0-kv-aware");
        EXPECT_EQ(c.Layout(), "1 TP4xDP2 prefill + 2 TP1xDP8 decode");
      }
    }
    if (c.decode_dp == 1 || c.prefill_tp != 8 || c.prefill_dp != 1) continue;
    ++with_dp;
    EXPECT_EQ(c.gpus, c.prefill * 8 + c.decode * c.decode_tp * 8) << c.Key();
    if (c.prefill == 2 && c.decode == 1 && c.decode_tp == 1) {
      winner = k;
      EXPECT_EQ(c.Key(), "pd-2xtp8-1xtp1dp8-b8192-dram0-ssd0-kv-aware");
      EXPECT_EQ(c.Layout(), "2 TP8 prefill + 1 TP1xDP8 decode");
      EXPECT_EQ(c.nodes, 3);
    }
    auto spec = sim::ParseClusterSpec(ClusterDocument(base, c), "candidate.json", DUET_SOURCE_DIR);
    ASSERT_TRUE(spec.ok()) << c.Key() << ": " << spec.error();
    EXPECT_EQ(spec->instances.front().dp, c.prefill_dp);
    EXPECT_EQ(spec->instances.back().dp, c.decode_dp);
    EXPECT_EQ(spec->placements.back().gpus.size(), std::size_t(c.decode_tp * c.decode_dp));
  }
  EXPECT_EQ(with_dp, 3);  // 1 or 2 TP1xDP8 decode instances beside 1 or 2 TP8 prefill ones
  ASSERT_LT(winner, all.size());
  std::set<std::string> keys;
  for (std::size_t k : CheaperNeighbours(all, winner)) keys.insert(all[k].Key());
  EXPECT_EQ(keys, (std::set<std::string>{"pd-1xtp8-1xtp1dp8-b8192-dram0-ssd0-kv-aware",
                                         "pd-2xtp4-1xtp1dp8-b8192-dram0-ssd0-kv-aware",
                                         "pd-2xtp8-1xtp1-b8192-dram0-ssd0-kv-aware"}));
}

// DeepSeek-V3 on H100s needs 16 GPUs an instance: instances over two whole nodes each, without
// KV tiers, as cluster files the simulator places so.
TEST(Space, InstancesAcrossNodes) {
  const nlohmann::json base =
      e2e::ReadJson(e2e::SourceDir() + "/sim/clusters/h100-2p1d-deepseek-v3.json");
  SpaceOptions o;
  o.max_gpus = 48;
  o.tp = {8};
  o.dp = {1, 2};
  o.decode_tp = {1};
  o.decode_dp = {8, 16};
  o.token_budgets = {8192};
  o.dram_gib = {0, 512};
  o.ssd_tib = {0};
  o.routers = {policies::RouterKind::kKvAware};
  const auto all = Enumerate(o, kPrices);
  EXPECT_EQ(all.size(), CountCandidates(o));
  bool found = false;
  for (const Candidate& c : all) {
    if (c.Key() == "pd-2xtp8dp2-1xtp1dp16-b8192-dram0-ssd0-kv-aware") {
      found = true;
      EXPECT_EQ(c.nodes, 6);
      EXPECT_EQ(c.gpus, 48);
    }
    // A TP8 prefill instance and a DP8 decode one: two nodes, tiers allowed.
    if (c.prefill == 1 && c.prefill_dp == 1 && c.decode == 1 && c.decode_dp == 8) {
      EXPECT_EQ(c.nodes, 2);
    }
    auto spec = sim::ParseClusterSpec(ClusterDocument(base, c), "candidate.json", DUET_SOURCE_DIR);
    if (!spec.ok()) {
      // Only a model that does not fit: DeepSeek-V3 on 8 H100s.
      EXPECT_NE(spec.error().find("does not fit"), std::string::npos)
          << c.Key() << ": " << spec.error();
      EXPECT_TRUE(c.prefill_dp == 1 || c.decode_dp == 8) << c.Key();
      continue;
    }
    EXPECT_EQ(static_cast<int>(spec->nodes.size()), c.nodes) << c.Key();
    EXPECT_EQ(spec->placements.front().nodes, c.prefill_dp) << c.Key();
    EXPECT_EQ(spec->tiers.any(), c.dram_gib > 0) << c.Key();
  }
  EXPECT_TRUE(found);
}

TEST(Space, CheaperNeighboursAreOneStepDownAlongOneDimension) {
  SpaceOptions o;
  o.max_gpus = 8;
  o.tp = {1, 2, 4};
  o.routers = {policies::RouterKind::kKvAware};
  o.token_budgets = {8192};
  const auto all = Enumerate(o, kPrices);
  std::size_t winner = all.size();
  for (std::size_t k = 0; k < all.size(); ++k)
    if (all[k].Key() == "colo-2xtp4-b8192-dram512-ssd4-kv-aware") winner = k;
  ASSERT_LT(winner, all.size());
  std::set<std::string> keys;
  for (std::size_t k : CheaperNeighbours(all, winner)) keys.insert(all[k].Key());
  EXPECT_EQ(keys, (std::set<std::string>{"colo-1xtp4-b8192-dram512-ssd4-kv-aware",
                                         "colo-2xtp2-b8192-dram512-ssd4-kv-aware",
                                         "colo-2xtp4-b8192-dram512-ssd0-kv-aware"}))
      << "no DRAM-only neighbour: SSD needs DRAM";
}

// Two GPU types in one space: every candidate of each, priced at its type's price, in one cost
// order; keys and layouts name the GPU (a single type's do not), and a winner's cheaper
// neighbours keep its type.
TEST(Space, SeveralGpuTypesInOneCostOrder) {
  SpaceOptions o;
  o.max_gpus = 8;
  o.tp = {1, 2};
  o.token_budgets = {8192};
  o.routers = {policies::RouterKind::kKvAware};
  const auto one = Enumerate(o, kPrices);
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one[0].Key(), "colo-1xtp1-b8192-dram0-ssd0-kv-aware");
  EXPECT_EQ(one[0].Layout(), "1 TP1 colocated");
  o.gpus = {"h100-sxm", "h200"};
  const Prices prices{{{"h100-sxm", 2.5}, {"h200", 3.5}}, 0.002, 0.05};
  const auto all = Enumerate(o, prices);
  EXPECT_EQ(all.size(), CountCandidates(o));
  EXPECT_EQ(all.size(), 2 * one.size());
  std::set<std::string> keys;
  std::map<std::string, std::size_t> per_type;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Candidate& c = all[k];
    ++per_type[c.gpu];
    EXPECT_TRUE(keys.insert(c.Key()).second) << c.Key();
    EXPECT_EQ(c.Key().rfind(c.gpu + "-", 0), 0u) << c.Key();
    EXPECT_NE(c.Layout().find(" on " + c.gpu), std::string::npos) << c.Layout();
    EXPECT_DOUBLE_EQ(c.cost_per_hour, c.gpus * prices.gpu_hour.at(c.gpu) +
                                          c.nodes * (c.dram_gib * 0.002 + c.ssd_tib * 0.05));
    if (k > 0) {
      EXPECT_LE(all[k - 1].cost_per_hour, c.cost_per_hour);
    }
  }
  EXPECT_EQ(per_type,
            (std::map<std::string, std::size_t>{{"h100-sxm", one.size()}, {"h200", one.size()}}));
  auto at = [&](const std::string& key) {
    auto it =
        std::find_if(all.begin(), all.end(), [&](const Candidate& c) { return c.Key() == key; });
    EXPECT_NE(it, all.end()) << key;
    return static_cast<std::size_t>(it - all.begin());
  };
  // One H200 ($3.50/h) comes between one H100 ($2.50/h) and two ($5.00/h).
  EXPECT_LT(at("h100-sxm-colo-1xtp1-b8192-dram0-ssd0-kv-aware"),
            at("h200-colo-1xtp1-b8192-dram0-ssd0-kv-aware"));
  EXPECT_LT(at("h200-colo-1xtp1-b8192-dram0-ssd0-kv-aware"),
            at("h100-sxm-colo-2xtp1-b8192-dram0-ssd0-kv-aware"));
  // The H100 candidates one step down are cheaper too, but of another type.
  std::set<std::string> neighbours;
  for (std::size_t k : CheaperNeighbours(all, at("h200-colo-2xtp2-b8192-dram512-ssd4-kv-aware")))
    neighbours.insert(all[k].Key());
  EXPECT_EQ(neighbours, (std::set<std::string>{"h200-colo-1xtp2-b8192-dram512-ssd4-kv-aware",
                                               "h200-colo-2xtp1-b8192-dram512-ssd4-kv-aware",
                                               "h200-colo-2xtp2-b8192-dram512-ssd0-kv-aware"}));
}

// Each type's candidates become cluster files on that GPU, their steps priced by the base's
// profile where it was measured on that model and GPU, else by the bundled profile of the pair
// where there is one, else by the roofline.
TEST(Space, EachGpuTypesCandidatesAreClusterFilesOfItsGpuAndCostModel) {
  const nlohmann::json base =
      e2e::ReadJson(e2e::SourceDir() + "/sim/clusters/h100-8p8d-llama8b-tiered.json");
  struct Case {
    std::string model, gpu, profile, pricing;  // profile empty: the roofline
  };
  const std::vector<Case> cases = {
      {"", "h100-sxm", "h100-sxm-llama-3.1-8b", ""},
      {"", "h200", "",
       "no bundled one is of llama-3.1-8b on h200: pricing steps with the roofline"},
      {"qwen3-32b", "h200", "h200-qwen3-32b", "with the bundled profile h200-qwen3-32b"},
      {"qwen3-32b", "b200", "b200-qwen3-32b", "with the bundled profile b200-qwen3-32b"}};
  for (const std::string model : {"", "qwen3-32b"}) {
    SpaceOptions o;
    o.gpus.clear();
    std::map<std::string, nlohmann::json> bases;
    for (const Case& k : cases) {
      if (k.model != model) continue;
      std::string pricing;
      bases[k.gpu] = OnHardware(base, k.model, k.gpu, "/", DUET_SOURCE_DIR, &pricing);
      EXPECT_EQ(pricing.empty(), k.pricing.empty()) << pricing;
      EXPECT_NE(pricing.find(k.pricing), std::string::npos) << pricing;
      o.gpus.push_back(k.gpu);
    }
    o.max_gpus = 4;
    o.tp = {2};
    o.pd = false;
    o.token_budgets = {8192};
    o.dram_gib = {0};
    o.ssd_tib = {0};
    o.routers = {policies::RouterKind::kKvAware};
    Prices prices;
    for (const std::string& gpu : o.gpus) prices.gpu_hour[gpu] = 1;
    const auto all = Enumerate(o, prices);
    EXPECT_EQ(all.size(), 2 * o.gpus.size()) << "one and two TP2 instances of each type";
    for (const Candidate& c : all) {
      const auto k = std::find_if(cases.begin(), cases.end(), [&](const Case& k) {
        return k.model == model && k.gpu == c.gpu;
      });
      ASSERT_NE(k, cases.end()) << c.Key();
      auto spec = sim::ParseClusterSpec(ClusterDocument(bases.at(c.gpu), c), "candidate.json",
                                        DUET_SOURCE_DIR);
      ASSERT_TRUE(spec.ok()) << c.Key() << ": " << spec.error();
      EXPECT_EQ(spec->nodes[0].gpu.name, c.gpu);
      if (k->profile.empty()) {
        EXPECT_EQ(spec->cost_model.profile, nullptr) << c.Key();
      } else {
        ASSERT_NE(spec->cost_model.profile, nullptr) << c.Key();
        EXPECT_EQ(fs::path(spec->cost_model.profile_path).stem(), k->profile);
      }
    }
  }
}

TEST(Bounds, ReusableTokensAreTheLongestPrefixAnyEarlierRequestHad) {
  traces::Trace trace;
  trace.block_tokens = 32;
  auto add = [&](std::vector<std::uint64_t> ids, Tokens input) {
    traces::TraceRequest r;
    r.id = trace.requests.size();
    r.block_ids = std::move(ids);
    r.input_tokens = input;
    trace.requests.push_back(r);
  };
  add({1, 2, 3}, 96);
  add({1, 2, 4}, 90);  // shares two blocks: 64 tokens
  add({1, 2, 4}, 80);  // shares 2 full blocks and 16 tokens of the third: 16-token engine blocks
  add({5, 2, 3}, 96);  // a different first block: nothing
  const auto reuse = ReusableTokens(trace, 16);
  EXPECT_EQ(reuse, (std::vector<Tokens>{0, 64, 80, 0}));
}

// Step time: 1 s a step plus 1 ms a prefill token.
class LinearCost final : public models::StepCostModel {
 public:
  Seconds StepTime(const models::StepShape& s) const override {
    return 1.0 + 1e-3 * static_cast<double>(s.PrefillTokens());
  }
};

TEST(Bounds, APrefillFloorIsItsChunksAloneOnAnIdleInstance) {
  traces::Trace trace;
  traces::TraceRequest r;
  r.input_tokens = 2500;
  trace.requests = {r, r};
  const auto floors = PrefillFloors(trace, {0, 2000}, LinearCost{}, 1000, 1);
  // 3 chunks (1000, 1000, 500): 3 s + 2.5 s; then 500 tokens left in one chunk: 1.5 s.
  EXPECT_DOUBLE_EQ(floors[0], 5.5);
  EXPECT_DOUBLE_EQ(floors[1], 1.5);
  EXPECT_EQ(CountAbove(floors, 2.0), 1u);
}

TEST(Scenario, TheBundledFileAndErrorsThatNameTheField) {
  const std::string path = e2e::SourceDir() + "/sim/scenarios/pd-offload.json";
  auto s = ParseScenario(e2e::ReadJson(path), path);
  ASSERT_TRUE(s.ok()) << s.error();
  EXPECT_EQ(s->rate_scales, (std::vector<double>{1, 2, 4}));
  ASSERT_EQ(s->setups.size(), 4u);
  EXPECT_EQ(s->setups[3].slug, "d-pd-offload");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"rate_scales": [1], "setups": [{"name": "a", "cluster": "c"}]})", "'trace' is missing"},
      {R"({"trace": "t", "rate_scales": [0], "setups": [{"name": "a", "cluster": "c"}]})",
       "'rate_scales' holds 0"},
      {R"({"trace": "t", "rate_scales": [1], "setups": []})", "'setups' must be"},
      {R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "a"}]})",
       "'setups[0].cluster' is missing"},
      {R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "A b", "cluster": "c"},
          {"name": "a-b", "cluster": "d"}]})",
       "'setups[1].name' 'a-b' names the same directory"},
      {R"({"trace": "t", "router": "best", "rate_scales": [1],
          "setups": [{"name": "a", "cluster": "c"}]})",
       "'router'"},
      {R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "a\"b", "cluster": "c"}]})",
       "may not hold quotes"},
      {R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "a", "cluster": "c",
          "patch": {"op": "remove"}}]})",
       "'setups[0].patch' must be an array"},
      {R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "a", "cluster": "c",
          "patch": [{"op": "remove"}]}]})",
       "not an operation with op and path"}};
  for (const auto& [text, message] : bad) {
    auto r = ParseScenario(nlohmann::json::parse(text), "s.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().rfind("s.json: field ", 0), 0u) << r.error();
    EXPECT_NE(r.error().find(message), std::string::npos) << r.error();
  }
}

}  // namespace
}  // namespace duet::plan
