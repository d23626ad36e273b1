// `duet simulate` of the Mooncake hour on the bundled cluster of each model beyond the Llama
// family (dense Qwen3, Qwen3 mixtures of experts, DeepSeek-V3 with latent attention and fp8
// experts, on one node or across two): every request that fits the model's context completes, the
// others are refused for it, and the KV each prefill hands to a decode instance is sized per token
// as the model caches it (hand-computed: GQA's K and V heads, MLA's latent). Data-parallel
// attention, which divides DeepSeek's latent reads among the GPUs where TP cannot, serves decode
// faster. An expert-parallel all-to-all and a KV transfer that share a link slow each other down;
// across nodes, the all-to-all crosses the GPUs' NICs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

struct ModelCluster {
  const char* file;
  std::int64_t kv_bytes_per_token;  // by hand from the model's config.json
  std::int64_t max_positions;       // its max_position_embeddings
};

constexpr ModelCluster kModelClusters[] = {
    // layers * 2 (K, V) * kv_heads * head_dim * 2 bytes (bf16)
    {"sim/clusters/h100-4p4d-qwen3-32b.json", 64 * 2 * 8 * 128 * 2, 40960},
    {"sim/clusters/h100-4p4d-qwen3-30b-a3b.json", 48 * 2 * 4 * 128 * 2, 40960},
    {"sim/clusters/h200-2p2d-qwen3-235b-a22b.json", 94 * 2 * 4 * 128 * 2, 40960},
    // layers * (kv_lora_rank + qk_rope_head_dim) * 2 bytes
    {"sim/clusters/h200-3p1d-deepseek-v3.json", 61 * (512 + 64) * 2, 163840},
    // Its instances span two nodes each (experts over 16 GPUs, the all-to-all over the NICs).
    {"sim/clusters/h100-2p1d-deepseek-v3.json", 61 * (512 + 64) * 2, 163840},
};

std::vector<std::string> MooncakeOn(const std::string& cluster) {
  return {"--cluster", cluster, "--trace", MooncakeTracePath()};
}

TEST(ModelClusters, EachSimulatesTheMooncakeHour) {
  for (const ModelCluster& c : kModelClusters) {
    SCOPED_TRACE(c.file);
    TempDir tmp;
    const std::string out = tmp.File("out");
    Simulate(out, MooncakeOn(c.file));
    const Csv csv = Csv::Read(out + "/requests.csv");
    const nlohmann::json s = ReadJson(out + "/summary.json");
    ASSERT_EQ(csv.size(), 12031u);
    std::size_t too_long = 0, moved = 0;
    double moved_tokens = 0;
    for (std::size_t i = 0; i < csv.size(); ++i) {
      const double positions = csv.Number(i, "input_tokens") + csv.Number(i, "output_tokens");
      if (positions > double(c.max_positions)) {
        ++too_long;
        EXPECT_EQ(csv.Get(i, "status"), "rejected") << "request " << i;
        EXPECT_NE(csv.Get(i, "reason").find("exceeds the model's context"), std::string::npos);
        continue;
      }
      ASSERT_EQ(csv.Get(i, "status"), "completed")
          << "request " << i << ": " << csv.Get(i, "reason");
      if (!csv.Get(i, "kv_transfer_ms").empty()) {
        ++moved;
        moved_tokens += csv.Number(i, "input_tokens");
      }
    }
    EXPECT_EQ(s["requests"]["rejected"].get<std::size_t>(), too_long);
    EXPECT_EQ(s["kv_transfer"]["transfers"].get<std::size_t>(), moved);
    EXPECT_GT(moved, 11000u) << "nearly every request decodes after its prefill";
    EXPECT_EQ(s["kv_transfer"]["bytes"].get<double>(), moved_tokens * double(c.kv_bytes_per_token));
  }
}

TEST(ModelClusters, DataParallelAttentionDecodesDeepSeekFaster) {
  TempDir tmp;
  const std::string dp = tmp.File("dp8"), tp = tmp.File("tp8");
  const std::string bundled = "sim/clusters/h200-3p1d-deepseek-v3.json";
  nlohmann::json doc = ReadJson(SourceDir() + "/" + bundled);
  ASSERT_EQ(doc["instances"][1]["dp"], 8);
  doc["instances"][1]["tp"] = 8;
  doc["instances"][1]["dp"] = 1;
  WriteJson(tmp.File("tp8.json"), doc);
  std::vector<std::string> args = MooncakeOn(bundled);
  args.insert(args.end(), {"--limit", "2000"});
  Simulate(dp, args);
  args[1] = tmp.File("tp8.json");
  Simulate(tp, args);
  const double tpot_dp = ReadJson(dp + "/summary.json")["tpot_ms"]["mean"].get<double>();
  const double tpot_tp = ReadJson(tp + "/summary.json")["tpot_ms"]["mean"].get<double>();
  // TP8 reads every request's whole latent on each of the 8 GPUs; DP8 an eighth of them.
  std::printf("mean TPOT of DeepSeek-V3's decode: dp8 %.2f ms, tp8 %.2f ms\n", tpot_dp, tpot_tp);
  EXPECT_LT(tpot_dp, 0.9 * tpot_tp);
}

// A small mixture of experts on one node of four slow-linked GPUs: a prefill instance of two
// GPUs (its 8 experts split over them) and a decode instance of one. Request A's KV leaves the
// prefill GPUs over their NVLink while the prefill instance computes request B and exchanges
// B's tokens between its two GPUs over the same links.
struct SharedLinkRun {
  double b_prefill_ms = 0;   // request B's prefill (its step, all-to-all included)
  double a_transfer_ms = 0;  // request A's KV transfer
};

// A small mixture of experts: 4 layers of 8 experts, 2 per token, hidden 1024 in bf16.
std::string WriteSmallMoe(TempDir& tmp) {
  const nlohmann::json model = {
      {"model_type", "qwen3_moe"}, {"num_hidden_layers", 4},      {"hidden_size", 1024},
      {"num_attention_heads", 8},  {"num_key_value_heads", 8},    {"head_dim", 128},
      {"intermediate_size", 2048}, {"vocab_size", 1000},          {"num_experts", 8},
      {"num_experts_per_tok", 2},  {"moe_intermediate_size", 512}};
  WriteJson(tmp.File("moe.json"), model);
  return tmp.File("moe.json");
}

SharedLinkRun RunOnSharedLinks(TempDir& tmp, const std::string& name, bool with_a, bool with_b,
                               double b_arrival_ms) {
  WriteSmallMoe(tmp);
  const nlohmann::json link = {{"bandwidth_GBps", 0.1}, {"latency_us", 1}};
  const nlohmann::json cluster = {
      {"model", tmp.File("moe.json")},
      {"nodes",
       {{{"count", 1},
         {"gpus", 4},
         {"gpu", "tiny-gpu"},
         {"nvlink", link},
         {"nic", {{"bandwidth_GBps", 1}, {"latency_us", 2}}}}}},
      {"instances", {{{"role", "prefill"}, {"tp", 2}}, {{"role", "decode"}, {"tp", 1}}}},
      {"engine", {{"reserved_gib", 0.1}, {"enable_prefix_caching", false}}},
      {"cost_model", {{"kind", "roofline"}}}};
  WriteJson(tmp.File(name + ".json"), cluster);
  std::string trace;
  if (with_a)
    trace +=
        R"({"timestamp": 0, "input_length": 4000, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8]})"
        "\n";
  if (with_b) {
    trace += R"({"timestamp": )" + std::to_string(b_arrival_ms) +
             R"(, "input_length": 1000, "output_length": 4, "hash_ids": [9, 10]})"
             "\n";
  }
  WriteFile(tmp.File(name + ".jsonl"), trace);
  const std::string out = tmp.File(name);
  Simulate(out, {"--cluster", tmp.File(name + ".json"), "--trace", tmp.File(name + ".jsonl")});
  const Csv csv = Csv::Read(out + "/requests.csv");
  SharedLinkRun run;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    EXPECT_EQ(csv.Get(i, "status"), "completed") << csv.Get(i, "reason");
    if (csv.Number(i, "input_tokens") == 4000) run.a_transfer_ms = csv.Number(i, "kv_transfer_ms");
    if (csv.Number(i, "input_tokens") == 1000) run.b_prefill_ms = csv.Number(i, "ttft_prefill_ms");
  }
  return run;
}

TEST(ModelClusters, AllToAllAndKvTransferShareALink) {
  TempDir tmp;
  // A alone: its prefill ends at its TTFT less the transfer; B arrives then.
  const SharedLinkRun a_alone = RunOnSharedLinks(tmp, "a", true, false, 0);
  const Csv a_csv = Csv::Read(tmp.File("a") + "/requests.csv");
  const double a_prefilled_ms = a_csv.Number(0, "ttft_ms") - a_csv.Number(0, "ttft_transfer_ms");
  const double b_at = std::ceil(a_prefilled_ms) + 1;
  const SharedLinkRun b_alone = RunOnSharedLinks(tmp, "b", false, true, b_at);
  const SharedLinkRun both = RunOnSharedLinks(tmp, "ab", true, true, b_at);
  std::printf(
      "A's transfer %.1f ms alone, %.1f beside B's prefill; B's prefill %.1f ms alone, "
      "%.1f beside A's transfer\n",
      a_alone.a_transfer_ms, both.a_transfer_ms, b_alone.b_prefill_ms, both.b_prefill_ms);
  // 4000 tokens of 16 KiB of KV, in two shards into the decode GPU's one link at 0.1 GB/s.
  EXPECT_NEAR(a_alone.a_transfer_ms, 4000 * 16384 / 0.1e9 * 1e3, 5);
  EXPECT_GT(both.a_transfer_ms, a_alone.a_transfer_ms + 10);
  EXPECT_GT(both.b_prefill_ms, b_alone.b_prefill_ms + 10);
}

// Bytes each kind of link carried in a run (links.csv), summed over its GPUs: "nvlink_UP", ...
std::map<std::string, double> LinkBytes(const std::string& out) {
  const Csv csv = Csv::Read(out + "/links.csv");
  std::map<std::string, double> bytes;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    const std::string name = csv.Get(i, "resource");
    const auto dash = name.rfind('-');
    bytes[dash == std::string::npos ? name : name.substr(dash + 1)] += csv.Number(i, "bytes");
  }
  return bytes;
}

// One colocated instance of the small MoE with its experts over two GPUs, once on one node and
// once on two nodes of one GPU each: the same all-to-all bytes move, over NVLink within the
// node, over the NICs and the switch across nodes, where a slower NIC makes the steps slower.
TEST(ModelClusters, AnInstanceAcrossNodesExchangesOverTheNics) {
  TempDir tmp;
  const std::string model = WriteSmallMoe(tmp);
  WriteFile(
      tmp.File("trace.jsonl"),
      R"({"timestamp": 0, "input_length": 4000, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8]})"
      "\n");
  auto run = [&](const std::string& name, int nodes, double nic_GBps) {
    const nlohmann::json cluster = {
        {"model", model},
        {"nodes",
         {{{"count", nodes},
           {"gpus", 2 / nodes},
           {"gpu", "tiny-gpu"},
           {"nvlink", {{"bandwidth_GBps", 1}, {"latency_us", 1}}},
           {"nic", {{"bandwidth_GBps", nic_GBps}, {"latency_us", 1}}}}}},
        {"network", {{"switch", {{"bandwidth_GBps", 100}, {"latency_us", 1}}}}},
        {"instances", {{{"role", "colocated"}, {"tp", 1}, {"dp", 2}}}},
        {"engine", {{"reserved_gib", 0.1}, {"enable_prefix_caching", false}}},
        // At full link speed: the step holds none of the exchange beside what moves.
        {"cost_model", {{"kind", "roofline"}, {"comm_efficiency", 1}}}};
    WriteJson(tmp.File(name + ".json"), cluster);
    const std::string out = tmp.File(name);
    Simulate(out, {"--cluster", tmp.File(name + ".json"), "--trace", tmp.File("trace.jsonl")});
    return out;
  };
  const std::string one = run("one-node", 1, 1), two = run("two-nodes", 2, 1),
                    slow = run("slow-nics", 2, 0.25);
  std::map<std::string, double> in_node = LinkBytes(one), across = LinkBytes(two);
  // The prefill's exchange by hand: dispatch and combine, 4 layers, 2000 tokens per GPU, 2
  // experts of 1024 bf16 values each, half of them to the other GPU; then 3 decode steps of
  // one token (half a token per GPU).
  const double prefill_bytes = 2 * 4 * 2000 * 2 * 1024 * 2 * 0.5;
  const double decode_bytes = 3 * (2 * 4 * 0.5 * 2 * 1024 * 2 * 0.5);
  EXPECT_DOUBLE_EQ(in_node["nvlink_UP"], 2 * (prefill_bytes + decode_bytes));
  EXPECT_DOUBLE_EQ(across["nvlink_UP"], 0);
  // Across nodes the NICs carry the same bytes beside the frontend's messages.
  EXPECT_DOUBLE_EQ(across["nic_UP"] - in_node["nic_UP"], in_node["nvlink_UP"]);
  EXPECT_DOUBLE_EQ(across["switch"] - in_node["switch"], in_node["nvlink_UP"]);
  const auto prefill_ms = [](const std::string& out) {
    return Csv::Read(out + "/requests.csv").Number(0, "ttft_prefill_ms");
  };
  // 32.8 MB at 1 GB/s, then at 0.25 GB/s: 98 ms more.
  EXPECT_NEAR(prefill_ms(slow) - prefill_ms(two), prefill_bytes / 0.25e6 - prefill_bytes / 1e6, 1);
}

}  // namespace
}  // namespace duet::e2e
