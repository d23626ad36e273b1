// End-to-end tests of the KV tiers below GPU memory in `duet simulate`: a lower-tier hit
// removes prompt tokens from prefill and adds their load time over the tier's path (both
// hand-computed), offload writes and PD transfers slow each other as the shared link's
// bandwidth predicts, every tier ends the run consistent and idle, and on the real Mooncake
// trace adding DRAM and SSD raises the hit rate and lowers TTFT.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

const char* const kColocatedDram = "tests/data/2colo-tiny-dram.json";
const char* const kPdDram = "tests/data/1p1d-tiny-dram.json";
const char* const kTieredCluster = "sim/clusters/h100-8p8d-llama8b-tiered.json";
const char* const kGpuOnlyCluster = "sim/clusters/h100-8p8d-llama8b.json";

// A copy of `cluster` without its tiers (GPU prefix caching only), written to `tmp`.
std::string WithoutTiers(const TempDir& tmp, const std::string& cluster) {
  nlohmann::json doc = ReadJson(Src(cluster));
  doc.erase("tiers");
  const std::string path = tmp.File("no-tiers.json");
  WriteJson(path, doc);
  return path;
}

// The same prompt twice, 100 ms apart.
std::string RepeatedPromptTrace(const TempDir& tmp, nlohmann::json line, int output_tokens) {
  line["output_length"] = output_tokens;
  line["timestamp"] = 0;
  std::string trace = line.dump() + "\n";
  line["timestamp"] = 100;
  trace += line.dump() + "\n";
  return tmp.Write("repeat.jsonl", trace);
}

// Two colocated instances on one node share its DRAM. Round-robin sends the repeated prompt to
// the other instance, whose GPU never saw it: the prefix comes from DRAM (written through by
// the first instance), so the second request computes one block instead of the whole prompt,
// and its blocks load over the GPU's PCIe (the bottleneck of host memory -> PCIe) in bytes /
// bandwidth plus both links' latencies. Without the tier it recomputes everything.
class LowerTierHit : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = ReadJson(Src(kColocatedDram));
    line_ = nlohmann::json::parse(ReadFile(Src("tests/data/one-request.jsonl")));
    input_ = line_.at("input_length").get<Tokens>();
    const Tokens block = cluster_.at("engine").at("block_tokens").get<Tokens>();
    hit_ = (input_ - 1) / block * block;  // one token is always computed
    models::ModelSpec model;
    const models::RooflineCostModel cost = CostModelFor(cluster_, 1, &model);
    layers_ = model.num_hidden_layers;
    load_bytes_ = static_cast<double>(hit_ * model.KvBytesPerToken());
    frontend_s_ = MessageSeconds(static_cast<double>(input_) * kBytesPerPromptToken,
                                 Network(cluster_).FrontendToGpu());
    step_s_ = cost.StepTime(PrefillShape(input_ - hit_, hit_));
    full_prefill_s_ = cost.StepTime(PrefillShape(input_, 0));
  }
  // The load of the hit blocks into c1's GPU, alone on its path.
  double LoadSeconds(const nlohmann::json& cluster) const {
    return MessageSeconds(load_bytes_,
                          {ReadLink(cluster.at("tiers").at("dram")), Network(cluster).pcie});
  }
  // Runs the repeated prompt on `cluster`; returns requests.csv.
  Csv Run(const nlohmann::json& cluster, const std::string& name) {
    const std::string path = tmp_.File(name + ".json");
    WriteJson(path, cluster);
    const std::string trace = RepeatedPromptTrace(tmp_, line_, 5);
    Simulate(tmp_.File(name), {"--cluster", path, "--trace", trace, "--router", "round-robin"});
    Csv csv = Csv::Read(tmp_.File(name) + "/requests.csv");
    EXPECT_EQ(csv.size(), 2u);
    EXPECT_EQ(csv.Get(1, "prefill_instance"), "c1");
    // The parts add up to the TTFT for every request.
    for (std::size_t i = 0; i < csv.size(); ++i) {
      const double parts = csv.Number(i, "ttft_frontend_ms") + csv.Number(i, "ttft_queue_ms") +
                           csv.Number(i, "ttft_load_ms") + csv.Number(i, "ttft_prefill_ms") +
                           csv.Number(i, "ttft_transfer_ms");
      EXPECT_NEAR(parts, csv.Number(i, "ttft_ms"), 5 * kCsvTolMs) << "request " << i;
    }
    return csv;
  }
  // The hit: counted as cached, from DRAM.
  void ExpectDramHit(const Csv& csv) const {
    EXPECT_EQ(csv.Number(1, "cached_tokens"), static_cast<double>(hit_));
    EXPECT_EQ(csv.Number(1, "dram_hit_tokens"), static_cast<double>(hit_));
    EXPECT_EQ(csv.Number(1, "gpu_hit_tokens"), 0);
    EXPECT_NEAR(csv.Number(1, "ttft_queue_ms"), frontend_s_ * 1e3, kCsvTolMs);
  }

  TempDir tmp_;
  nlohmann::json cluster_, line_;
  Tokens input_ = 0, hit_ = 0;
  int layers_ = 0;
  double load_bytes_ = 0, frontend_s_ = 0, step_s_ = 0, full_prefill_s_ = 0;
};

// Load, then prefill (overlap off): the TTFT is the load plus the one-block prefill step.
TEST_F(LowerTierHit, RemovesPrefillTokensAndAddsTheirLoadTime) {
  nlohmann::json cluster = cluster_;
  cluster["engine"]["overlap_tier_loads"] = false;
  const double load_s = LoadSeconds(cluster);
  ASSERT_LT(step_s_ + load_s, full_prefill_s_) << "the test needs loading to beat recomputing";
  const Csv tiered = Run(cluster, "sequential");
  ExpectDramHit(tiered);
  // Its tokens are not computed, and its price is the load, in the TTFT.
  EXPECT_NEAR(tiered.Number(1, "ttft_prefill_ms"), step_s_ * 1e3, kCsvTolMs);
  EXPECT_NEAR(tiered.Number(1, "ttft_load_ms"), load_s * 1e3, kCsvTolMs);
  EXPECT_GT(tiered.Number(1, "ttft_load_ms"), 0);
  EXPECT_NEAR(tiered.Number(1, "ttft_ms"), (frontend_s_ + load_s + step_s_) * 1e3, kCsvTolMs);

  // Without the tier: no hit, the whole prompt is computed.
  nlohmann::json gpu_only = cluster;
  gpu_only.erase("tiers");
  const Csv plain = Run(gpu_only, "gpu-only");
  EXPECT_EQ(plain.Number(1, "cached_tokens"), 0);
  EXPECT_NEAR(plain.Number(1, "ttft_ms"), (frontend_s_ + full_prefill_s_) * 1e3, kCsvTolMs);
  EXPECT_LT(tiered.Number(1, "ttft_ms"), plain.Number(1, "ttft_ms"));

  const nlohmann::json s = ReadJson(tmp_.File("sequential") + "/summary.json");
  const Tokens block = cluster.at("engine").at("block_tokens").get<Tokens>();
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["dram"]["hit_tokens"].get<Tokens>(), hit_);
  EXPECT_EQ(s["tiers"]["dram"]["read_bytes"].get<double>(), load_bytes_);
  // The first request wrote every full block through to DRAM; the second added none.
  EXPECT_EQ(s["tiers"]["dram"]["write_blocks"].get<Tokens>(), input_ / block);
  EXPECT_EQ(s["tiers"]["dram"]["written_blocks"].get<Tokens>(), input_ / block);
  // links.csv: the load is all that crossed c1's PCIe towards its GPU.
  const Csv links = Csv::Read(tmp_.File("sequential") + "/links.csv");
  bool found = false;
  for (std::size_t i = 0; i < links.size(); ++i) {
    if (links.Get(i, "resource") != "node0-gpu1-pcie_DOWN") continue;
    found = true;
    EXPECT_EQ(links.Number(i, "bytes"), load_bytes_);
    EXPECT_NEAR(links.Number(i, "busy_s"), load_bytes_ / Network(cluster).pcie.bandwidth, 1e-6);
  }
  EXPECT_TRUE(found);
}

// Overlapped (the default): the step prefilling the rest starts with the load and ends no
// earlier than one layer's share of it after the last layer's KV arrived. A fast load hides
// entirely; a slow one (PCIe cut to 50 MB/s) shows as TTFT beyond the step.
TEST_F(LowerTierHit, OverlappedLoadShowsOnlyWhereItOutlastsThePrefillStep) {
  const double fast_load_s = LoadSeconds(cluster_);
  ASSERT_LT(fast_load_s + step_s_ / layers_, step_s_);
  const Csv fast = Run(cluster_, "fast");
  ExpectDramHit(fast);
  EXPECT_NEAR(fast.Number(1, "ttft_load_ms"), 0, kCsvTolMs);
  EXPECT_NEAR(fast.Number(1, "ttft_ms"), (frontend_s_ + step_s_) * 1e3, kCsvTolMs);

  nlohmann::json slow_cluster = cluster_;
  slow_cluster["nodes"][0]["pcie"]["bandwidth_GBps"] = 0.05;
  const double slow_load_s = LoadSeconds(slow_cluster);
  ASSERT_GT(slow_load_s + step_s_ / layers_, step_s_);
  const Csv slow = Run(slow_cluster, "slow");
  ExpectDramHit(slow);
  const double end_s = slow_load_s + step_s_ / layers_;
  EXPECT_NEAR(slow.Number(1, "ttft_ms"), (frontend_s_ + end_s) * 1e3, kCsvTolMs);
  EXPECT_NEAR(slow.Number(1, "ttft_load_ms"), (end_s - step_s_) * 1e3, kCsvTolMs);
  EXPECT_NEAR(slow.Number(1, "ttft_prefill_ms"), step_s_ * 1e3, kCsvTolMs);
}

// Two transfers on one bottleneck link of bandwidth `bw`, b starting `start_b` after a. While
// both run, SimGrid's CM02 model splits the link in inverse proportion to each transfer's
// route latency (its sharing penalty, as TCP's RTT unfairness); alone, each gets all of it.
// Returns their finish times (bandwidth phases only; a starts at 0).
std::pair<double, double> SharedFinish(double bytes_a, double bytes_b, double start_b, double bw,
                                       double latency_a, double latency_b) {
  const double share_a = bw * (1 / latency_a) / (1 / latency_a + 1 / latency_b);
  const double share_b = bw - share_a;
  const double a_left = bytes_a - std::min(bytes_a, bw * start_b);
  if (a_left == 0) return {bytes_a / bw, start_b + bytes_b / bw};
  const double a_alone_end = start_b + a_left / share_a, b_alone_end = start_b + bytes_b / share_b;
  if (a_alone_end <= b_alone_end) {  // a finishes first, then b runs alone
    const double b_left = bytes_b - share_b * (a_alone_end - start_b);
    return {a_alone_end, a_alone_end + b_left / bw};
  }
  const double a_rest = a_left - share_a * (b_alone_end - start_b);
  return {b_alone_end + a_rest / bw, b_alone_end};
}

// PD transfer and write-through offload both leave the prefill GPU over its PCIe link (NICs,
// switch and host memory are far faster). Each alone takes bytes / PCIe bandwidth; started
// together they share that bandwidth (as the platform model splits it) and both take longer:
// the pair moves its bytes no faster than the one link allows.
TEST(TierLinkSharing, PdTransferAndOffloadSlowEachOtherOnSharedPcie) {
  const nlohmann::json cluster = ReadJson(Src(kPdDram));
  const std::string both = ReadFile(Src("tests/data/two-requests.jsonl"));
  const nlohmann::json line = nlohmann::json::parse(both.substr(0, both.find('\n')));
  const Tokens input = line.at("input_length").get<Tokens>();
  const Tokens block = cluster.at("engine").at("block_tokens").get<Tokens>();
  const Network net(cluster);
  const Link mem = ReadLink(cluster.at("tiers").at("dram"));
  models::ModelSpec model;
  CostModelFor(cluster, 1, &model);
  ASSERT_LT(net.pcie.bandwidth * 2, std::min({net.nic.bandwidth, net.sw.bandwidth, mem.bandwidth}))
      << "the prefill GPU's PCIe must be the only bottleneck";
  const double pd_bytes = static_cast<double>(input * model.KvBytesPerToken());
  const double write_bytes = static_cast<double>(input / block * block * model.KvBytesPerToken());
  const double bw = net.pcie.bandwidth;
  const double write_latency = net.pcie.latency + mem.latency;
  const double control_s = MessageSeconds(kControlMessageBytes, net.GpuToGpu());
  double pd_latency = 0;
  for (const Link& l : net.GpuToGpu()) pd_latency += l.latency;

  TempDir tmp;
  nlohmann::json one = line;
  one["timestamp"] = 0;
  const std::string pd_trace = tmp.Write("pd.jsonl", one.dump() + "\n");
  one["output_length"] = 1;  // finishes on the prefill instance: no PD transfer
  const std::string no_pd_trace = tmp.Write("no-pd.jsonl", one.dump() + "\n");
  Simulate(tmp.File("both"), {"--cluster", kPdDram, "--trace", pd_trace});
  Simulate(tmp.File("pd-alone"), {"--cluster", WithoutTiers(tmp, kPdDram), "--trace", pd_trace});
  Simulate(tmp.File("write-alone"), {"--cluster", kPdDram, "--trace", no_pd_trace});

  // Alone: latency plus bytes over the PCIe bandwidth.
  const double pd_alone_ms =
      Csv::Read(tmp.File("pd-alone") + "/requests.csv").Number(0, "kv_transfer_ms");
  EXPECT_NEAR(pd_alone_ms, (control_s + pd_latency + pd_bytes / bw) * 1e3, kCsvTolMs);
  const nlohmann::json alone = ReadJson(tmp.File("write-alone") + "/summary.json");
  const double write_alone_ms = alone["tiers"]["dram"]["write_time_ms"]["max"].get<double>();
  EXPECT_NEAR(write_alone_ms, (write_latency + write_bytes / bw) * 1e3, 2e-3);

  // Together: the write starts when the prefill ends, the pull once the decode instance has
  // the KvReady message; from then on they split the PCIe bandwidth.
  const double write_start = write_latency;
  const double pd_start = control_s + pd_latency;
  const auto [write_end, pd_end] =
      SharedFinish(write_bytes, pd_bytes, pd_start - write_start, bw, write_latency, pd_latency);
  const double predicted_pd_ms = (write_start + pd_end) * 1e3;
  const double predicted_write_ms = (write_start + write_end) * 1e3;
  const double pd_ms = Csv::Read(tmp.File("both") + "/requests.csv").Number(0, "kv_transfer_ms");
  const nlohmann::json s = ReadJson(tmp.File("both") + "/summary.json");
  const double write_ms = s["tiers"]["dram"]["write_time_ms"]["max"].get<double>();
  EXPECT_NEAR(pd_ms, predicted_pd_ms, 0.005 * predicted_pd_ms)
      << "PD transfer alone " << pd_alone_ms << " ms";
  EXPECT_NEAR(write_ms, predicted_write_ms, 0.005 * predicted_write_ms)
      << "offload write alone " << write_alone_ms << " ms";
  EXPECT_GT(pd_ms, 1.5 * pd_alone_ms);
  EXPECT_GT(write_ms, 1.15 * write_alone_ms);
  // Together they are bound by the link: the later one ends when all bytes crossed it.
  EXPECT_NEAR(std::max(pd_ms - control_s * 1e3 - pd_latency * 1e3, write_ms - write_latency * 1e3),
              (pd_bytes + write_bytes) / bw * 1e3, 0.01 * (pd_bytes + write_bytes) / bw * 1e3);
}

// Small tiers under real traffic: a 2 GiB DRAM tier (write-back from the GPUs, ARC), an SSD
// written back from DRAM and a remote store written through from the SSD. Every tier is
// used, evicts, never holds more than its capacity, and ends consistent with no I/O in flight
// and nothing pinned (the simulator checks that at the end and fails the run otherwise).
TEST(TierInvariants, SmallTiersUnderRealTrafficEndConsistent) {
  nlohmann::json cluster = ReadJson(Src(kTieredCluster));
  cluster["model"] = Src("models/specs/llama-3.1-8b.json");
  cluster["tiers"] = {
      {"dram", {{"capacity_gib", 2}, {"placement", "write-back"}, {"eviction", "arc"}}},
      {"ssd",
       {{"capacity_gib", 6},
        {"placement", "write-back"},
        {"eviction", "lru"},
        {"read_GBps", 28},
        {"write_GBps", 14}}},
      {"remote", {{"capacity_gib", 64}, {"placement", "write-through"}, {"bandwidth_GBps", 25}}}};
  TempDir tmp;
  const std::string path = tmp.File("small-tiers.json");
  WriteJson(path, cluster);
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", path, "--trace", MooncakeTracePath(), "--limit", "600", "--router",
                 "cache-aware"});
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["completed"].get<int>() + s["requests"]["rejected"].get<int>(), 600);
  const Tokens block_bytes = 16 * 131072;  // Llama-3.1-8B: 128 KiB of KV per token
  for (const char* tier : {"dram", "ssd", "remote"}) {
    const auto& t = s["tiers"][tier];
    SCOPED_TRACE(tier);
    EXPECT_TRUE(t["enabled"].get<bool>());
    EXPECT_GT(t["written_blocks"].get<std::int64_t>(), 0);
    EXPECT_EQ(t["written_blocks"], t["write_blocks"]) << "every write finished by the end";
    EXPECT_LE(t["peak_used_blocks"].get<std::int64_t>(),
              t["capacity_bytes"].get<std::int64_t>() / block_bytes);
    EXPECT_GT(s["prefix_cache"]["by_tier"][tier]["hit_tokens"].get<std::int64_t>(), 0);
  }
  EXPECT_GT(s["tiers"]["dram"]["evictions"].get<std::int64_t>(), 0);
  EXPECT_GT(s["tiers"]["ssd"]["evictions"].get<std::int64_t>(), 0);
  // Hits per tier add up to the total.
  std::int64_t sum = 0;
  for (const auto& [tier, v] : s["prefix_cache"]["by_tier"].items())
    sum += v["hit_tokens"].get<std::int64_t>();
  EXPECT_EQ(sum, s["prefix_cache"]["hit_tokens"].get<std::int64_t>());
  // links.csv accounts for the SSD's traffic.
  const Csv links = Csv::Read(out + "/links.csv");
  double ssd_write_bytes = 0;
  for (std::size_t i = 0; i < links.size(); ++i) {
    if (links.Get(i, "resource").find("-ssd-write") != std::string::npos)
      ssd_write_bytes += links.Number(i, "bytes");
  }
  EXPECT_NEAR(ssd_write_bytes, s["tiers"]["ssd"]["write_bytes"].get<double>(), 1.0);
}

// The cache-aware router rejects at arrival what its estimate says cannot meet the TTFT SLO,
// with the reason; the flag needs that router and a TTFT objective.
TEST(CacheAwareRouter, RejectsRequestsWhoseEstimateExceedsTheSlo) {
  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kTieredCluster, "--trace", MooncakeTracePath(), "--limit", "1500",
                 "--rate-scale", "4", "--router", "cache-aware", "--slo", "ttft=1000",
                 "--reject-over-slo"});
  const Csv csv = Csv::Read(out + "/requests.csv");
  std::size_t rejected = 0;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    if (csv.Get(i, "status") != "rejected") continue;
    ++rejected;
    EXPECT_NE(csv.Get(i, "reason").find("exceeds the TTFT SLO of 1000 ms"), std::string::npos)
        << csv.Get(i, "reason");
  }
  EXPECT_GT(rejected, 0u);
  EXPECT_LT(rejected, csv.size() / 2);

  const RunResult bad = RunDuet({"simulate", "--router", "prefix-aware", "--slo", "ttft=1000",
                                 "--reject-over-slo", "--out", tmp.File("bad")});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_TRUE(ContainsAll(bad.err, {"--reject-over-slo needs --router cache-aware"}));
}

// Bad tier sections are errors that name the file and the field.
TEST(TierConfig, BadTiersAreClearErrors) {
  TempDir tmp;
  struct Case {
    nlohmann::json tiers;
    std::string message;
  };
  const Case cases[] = {
      {{{"dram", {{"capacity_gib", -1}}}}, "tiers.dram: field 'capacity_gib' must be in (0"},
      {{{"dram", {{"capacity_gib", 1}, {"eviction", "fifo"}}}},
       "tiers.dram: field 'eviction': eviction policy must be 'lru' or 'arc', got 'fifo'"},
      {{{"ssd", {{"capacity_gib", 1}, {"read_GBps", 1}}}}, "tiers.ssd: field 'write_GBps'"},
      {{{"nvme", {{"capacity_gib", 1}}}}, "tiers: unknown tier 'nvme'"},
      {{{"remote", {{"capacity_gib", 1}, {"placement", "lazy"}}}},
       "placement must be 'write-through' or 'write-back'"},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = ReadJson(Src(kColocatedDram));
    doc["model"] = Src("models/specs/tiny-test.json");
    doc["tiers"] = c.tiers;
    const std::string path = tmp.File("bad.json");
    WriteJson(path, doc);
    const RunResult r = RunDuet({"simulate", "--cluster", path, "--out", tmp.File("out")});
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_TRUE(ContainsAll(r.err, {path, c.message})) << c.tiers.dump();
    EXPECT_FALSE(fs::exists(tmp.File("out") + "/summary.json"));
  }
}

// The acceptance run: the whole Mooncake conversation trace at its recorded rate on
// the same 16 GPUs, GPU-only prefix caching against DRAM + SSD tiers, same router. The tiers
// raise the prefix hit rate and lower mean and p90 TTFT.
TEST(FullTraceTiers, DramAndSsdRaiseHitRateAndLowerTtft) {
  TempDir tmp;
  Simulate(tmp.File("gpu"), {"--cluster", kGpuOnlyCluster, "--trace", MooncakeTracePath(),
                             "--router", "cache-aware"});
  Simulate(tmp.File("tiered"), {"--cluster", kTieredCluster, "--trace", MooncakeTracePath(),
                                "--router", "cache-aware"});
  const nlohmann::json gpu = ReadJson(tmp.File("gpu") + "/summary.json");
  const nlohmann::json tiered = ReadJson(tmp.File("tiered") + "/summary.json");
  for (const auto* s : {&gpu, &tiered}) EXPECT_EQ((*s)["requests"]["completed"].get<int>(), 12031);
  EXPECT_GT(tiered["prefix_cache"]["hit_rate"].get<double>(),
            gpu["prefix_cache"]["hit_rate"].get<double>() + 0.05);
  EXPECT_GT(tiered["prefix_cache"]["by_tier"]["dram"]["hit_tokens"].get<std::int64_t>(), 0);
  EXPECT_GT(tiered["prefix_cache"]["by_tier"]["ssd"]["hit_tokens"].get<std::int64_t>(), 0);
  EXPECT_LT(tiered["ttft_ms"]["mean"].get<double>(), gpu["ttft_ms"]["mean"].get<double>());
  EXPECT_LT(tiered["ttft_ms"]["p90"].get<double>(), gpu["ttft_ms"]["p90"].get<double>());
  EXPECT_GT(tiered["ttft_breakdown_ms"]["load"]["mean"].get<double>(), 0);
}

}  // namespace
}  // namespace duet::e2e
