// Where a cluster file's instances run: first fit within a node, and an instance larger than a
// node (DeepSeek-V3 on H100s) over whole free nodes of one kind, node-major, with its TP groups
// within a node. Instances that cannot be placed so are refused with the reason.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/cluster_spec.h"
#include "tests/sim/e2e_util.h"

namespace duet::sim {
namespace {

using e2e::ContainsAll;
using e2e::ReadJson;
using e2e::SourceDir;

nlohmann::json DeepSeekOnH100() {
  return ReadJson(SourceDir() + "/sim/clusters/h100-2p1d-deepseek-v3.json");
}

std::vector<std::pair<int, int>> Gpus(const InstancePlacement& at) {
  std::vector<std::pair<int, int>> out;
  for (const GpuRef& g : at.gpus) out.emplace_back(g.node, g.gpu);
  return out;
}

TEST(Placement, AnInstanceLargerThanANodeTakesWholeNodesNodeMajor) {
  nlohmann::json doc = DeepSeekOnH100();
  // A small instance first: the two-node ones skip its partly used node.
  doc["model"] = "qwen3-30b-a3b";
  doc["instances"] = {{{"role", "prefill"}, {"count", 1}, {"tp", 2}},
                      {{"role", "prefill"}, {"count", 1}, {"tp", 8}, {"dp", 2}},
                      {{"role", "decode"}, {"count", 1}, {"tp", 2}},
                      {{"role", "decode"}, {"count", 1}, {"tp", 1}, {"dp", 16}}};
  auto spec = ParseClusterSpec(doc, "c.json", SourceDir());
  ASSERT_TRUE(spec.ok()) << spec.error();
  const std::vector<InstancePlacement>& at = spec->placements;
  EXPECT_EQ(at[0].node, 0);
  EXPECT_EQ(at[0].nodes, 1);
  EXPECT_EQ(Gpus(at[0]), (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}}));
  EXPECT_EQ(at[1].node, 1);
  EXPECT_EQ(at[1].nodes, 2);
  ASSERT_EQ(at[1].gpus.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(at[1].gpus[static_cast<std::size_t>(i)].node, 1 + i / 8);
    EXPECT_EQ(at[1].gpus[static_cast<std::size_t>(i)].gpu, i % 8);
  }
  // First fit fills node 0 before any other.
  EXPECT_EQ(Gpus(at[2]), (std::vector<std::pair<int, int>>{{0, 2}, {0, 3}}));
  EXPECT_EQ(at[3].node, 3);
  EXPECT_EQ(at[3].nodes, 2);
  // The memory plan is one GPU's, capacity over all 16 ranks: the same as on one node of 16.
  EXPECT_EQ(at[3].memory.kv_tokens % 16, 0);
  models::MemoryOptions dp16 = spec->engine.memory;
  dp16.dp = 16;
  auto whole = models::PlanInstanceMemory(spec->model, spec->nodes[3].gpu, dp16);
  ASSERT_TRUE(whole.ok()) << whole.error();
  EXPECT_EQ(at[3].memory.kv_tokens, whole->kv_tokens);
}

TEST(Placement, InstancesThatCannotSpanNodesAreRefusedWithTheReason) {
  struct Case {
    const char* what;
    nlohmann::json instances;
    std::vector<std::string> error;
  };
  const std::vector<Case> cases = {
      {"not a whole number of nodes",
       {{{"role", "prefill"}, {"tp", 4}, {"dp", 3}}, {{"role", "decode"}, {"tp", 8}}},
       {"instances[0]", "not enough free GPUs", "tp=4 dp=3", "a whole number of them"}},
      {"a TP group larger than a node",
       {{{"role", "prefill"}, {"tp", 16}}, {{"role", "decode"}, {"tp", 8}}},
       {"instances[0]", "tp=16", "tp at most a node's GPUs"}},
      {"more nodes than are free",
       {{{"role", "prefill"}, {"count", 3}, {"tp", 8}, {"dp", 2}},
        {{"role", "decode"}, {"tp", 1}, {"dp", 16}}},
       {"instances[1]", "instance 0", "dp=16"}},
      {"the node asked for is not followed by a free one",
       {{{"role", "prefill"}, {"tp", 8}, {"dp", 2}, {"node", 5}},
        {{"role", "decode"}, {"tp", 1}, {"dp", 16}}},
       {"instances[0]", "on node 5"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json doc = DeepSeekOnH100();
    doc["instances"] = c.instances;
    auto spec = ParseClusterSpec(doc, "c.json", SourceDir());
    ASSERT_FALSE(spec.ok());
    for (const std::string& part : c.error)
      EXPECT_NE(spec.error().find(part), std::string::npos) << part << " in " << spec.error();
  }
}

TEST(Placement, NodesOfAnotherKindOrTiersAreRefusedToASpanningInstance) {
  nlohmann::json doc = DeepSeekOnH100();
  // Nodes 0-2 H100, 3-5 H200: the decode instance cannot straddle nodes 2 and 3.
  doc["nodes"][0]["count"] = 3;
  doc["nodes"].push_back(doc["nodes"][0]);
  doc["nodes"][1]["gpu"] = "h200";
  doc["instances"] = {{{"role", "prefill"}, {"tp", 8}, {"dp", 2}},
                      {{"role", "decode"}, {"tp", 1}, {"dp", 16}, {"node", 2}}};
  auto spec = ParseClusterSpec(doc, "c.json", SourceDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(ContainsAll(spec.error(), {"instances[1]", "on node 2", "of one kind"}));

  doc = DeepSeekOnH100();
  doc["tiers"] = {{"dram", {{"capacity_gib", 512}, {"bandwidth_GBps", 100}}}};
  spec = ParseClusterSpec(doc, "c.json", SourceDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(ContainsAll(spec.error(), {"instances[0]", "spans 2 nodes", "KV tiers"}))
      << spec.error();
}

}  // namespace
}  // namespace duet::sim
