// End-to-end tests of `duet simulate`: the binary runs as a subprocess (SimGrid allows one
// simulation per process) and the tests read the summary.json and requests.csv it writes.
//
// Golden files: GoldenTest compares a small run against tests/golden/tiny/summary.json (all of
// it but sim.wall_s, as JSON) and tests/golden/tiny/requests.csv (byte for byte). After an
// intended change of the model, regenerate them with
//   DUET_UPDATE_GOLDEN=1 build-e2e/bin/duet_sim_tests --gtest_filter='GoldenTest.*'
// then look at the diff of tests/golden/ before keeping it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/cost_model.h"
#include "models/model_spec.h"
#include "policies/step_log.h"
#include "sim/cluster_spec.h"
#include "tests/common/metrics_schema.h"
#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

const char* const kPdCluster = "sim/clusters/h100-8p8d-llama8b.json";
const char* const kColocatedCluster = "sim/clusters/h100-16colo-llama8b.json";
const char* const kTinyTrace = "traces/bundled/tiny.json";  // 40 synthetic requests
const char* const kTinyPdCluster = "tests/data/1p1d-tiny.json";
const char* const kSharingCluster = "tests/data/2p1d-tiny.json";
const char* const kOneRequest = "tests/data/one-request.jsonl";
const char* const kTwoRequests = "tests/data/two-requests.jsonl";
constexpr std::size_t kRealTraceRequests = 12031;

// ---- Comparisons of whole runs --------------------------------------------------------------

// Every row and column equal; numeric columns within `tol_ms` (0: byte-identical text).
::testing::AssertionResult SameRequests(const Csv& a, const Csv& b, double tol_ms) {
  if (a.header() != b.header()) return ::testing::AssertionFailure() << "headers differ";
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "row counts differ: " << a.size() << " vs " << b.size();
  std::size_t differences = 0;
  std::ostringstream report;
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (const std::string& col : a.header()) {
      const std::string& x = a.Get(i, col);
      const std::string& y = b.Get(i, col);
      if (x == y) continue;
      const bool numeric =
          std::find(kStringColumns.begin(), kStringColumns.end(), col) == kStringColumns.end() &&
          !x.empty() && !y.empty();
      if (numeric && std::abs(std::stod(x) - std::stod(y)) <= tol_ms) continue;
      if (differences++ < 10)
        report << "row " << i << " (request " << a.Get(i, "request_id") << ") " << col << ": " << x
               << " vs " << y << "\n";
    }
  }
  if (differences == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differences << " differences, first:\n" << report.str();
}

// Writes `cluster` with one engine setting changed to the temp dir; models are referenced by
// name, which the binary resolves against the data dir (the source root), not the file's dir.
std::string ClusterWithEngineSetting(const TempDir& tmp, const std::string& cluster,
                                     const std::string& key, const nlohmann::json& value) {
  nlohmann::json doc = ReadJson(Src(cluster));
  doc["engine"][key] = value;
  const std::string path = tmp.File(key + "-" + fs::path(cluster).filename().string());
  WriteJson(path, doc);
  return path;
}

// Checks the accounting of a run: one row per request, ids 0..n-1, each completed (with times)
// or rejected with a reason; summary counts agree with the rows.
void ExpectEveryRequestAccounted(const std::string& out_dir, std::size_t n) {
  const Csv csv = Csv::Read(out_dir + "/requests.csv");
  const nlohmann::json s = ReadJson(out_dir + "/summary.json");
  ASSERT_EQ(csv.size(), n);
  std::size_t completed = 0, rejected = 0;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    ASSERT_EQ(csv.Get(i, "request_id"), std::to_string(i)) << "rows sorted by id, none missing";
    const std::string& status = csv.Get(i, "status");
    if (status == "completed") {
      ++completed;
      EXPECT_GT(csv.Number(i, "ttft_ms"), 0) << "request " << i;
      EXPECT_GE(csv.Number(i, "e2e_ms"), csv.Number(i, "ttft_ms")) << "request " << i;
      EXPECT_TRUE(csv.Get(i, "reason").empty()) << "request " << i;
    } else {
      ASSERT_EQ(status, "rejected") << "request " << i << " is neither completed nor rejected";
      ++rejected;
      EXPECT_FALSE(csv.Get(i, "reason").empty()) << "rejected request " << i << " has no reason";
    }
  }
  EXPECT_EQ(s["requests"]["total"].get<std::size_t>(), n);
  EXPECT_EQ(s["requests"]["completed"].get<std::size_t>(), completed);
  EXPECT_EQ(s["requests"]["rejected"].get<std::size_t>(), rejected);
  EXPECT_EQ(s["requests"]["failed"].get<std::size_t>(), 0u);
  EXPECT_EQ(completed + rejected, n);
  EXPECT_GT(completed, 0u);
}

// ---- Single request, hand-computed ---------------------------------------------------------

TEST(SingleRequestTiming, MatchesHandComputedTimeline) {
  const nlohmann::json cluster = ReadJson(Src(kTinyPdCluster));
  const nlohmann::json line = nlohmann::json::parse(ReadFile(Src(kOneRequest)));
  const Tokens input = line.at("input_length").get<Tokens>();
  const Tokens output = line.at("output_length").get<Tokens>();
  ASSERT_GT(output, 1) << "a KV transfer happens only when decode has work to do";
  const Network net(cluster);
  models::ModelSpec model;
  const models::RooflineCostModel cost = CostModelFor(cluster, 1, &model);
  const double kv_bytes = static_cast<double>(input * model.KvBytesPerToken());

  // Timeline: the frontend sends the prompt's token ids to the prefill instance; the prefill
  // step runs as soon as they arrive; the prefill instance announces the KV to the decode
  // instance (KvReady control message), which pulls it over GPUDirect; the first token is
  // delivered once the KV is on the decode instance.
  const double frontend_s =
      MessageSeconds(static_cast<double>(input) * kBytesPerPromptToken, net.FrontendToGpu());
  const double prefill_s = cost.StepTime(PrefillShape(input, 0));
  const double kv_ready_s = MessageSeconds(kControlMessageBytes, net.GpuToGpu());
  const double kv_s = MessageSeconds(kv_bytes, net.GpuToGpu());
  const double ttft_s = frontend_s + prefill_s + kv_ready_s + kv_s;
  // Then output-1 decode steps, each attending over one more token: the context is what is
  // already cached (prompt plus generated tokens, less the token being decoded).
  double decode_s = 0;
  for (Tokens generated = 1; generated < output; ++generated)
    decode_s += cost.StepTime(DecodeShape(input + generated - 1));
  const double e2e_s = ttft_s + decode_s;

  // Every term is far larger than the tolerance, so leaving any out would fail the test.
  for (double term : {frontend_s, prefill_s, kv_ready_s, kv_s, decode_s})
    ASSERT_GT(term * 1e3, 5 * kCsvTolMs);

  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kTinyPdCluster, "--trace", kOneRequest, "--router", "round-robin"});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 1u);
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  EXPECT_EQ(csv.Get(0, "prefill_instance"), "p0");
  EXPECT_EQ(csv.Get(0, "decode_instance"), "d0");
  EXPECT_EQ(csv.Number(0, "cached_tokens"), 0);
  EXPECT_NEAR(csv.Number(0, "queue_ms"), frontend_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "kv_transfer_ms"), (kv_ready_s + kv_s) * 1e3, kCsvTolMs);
  // Its parts: the KvReady message, no wait (the decode instance is idle), the pull.
  EXPECT_NEAR(csv.Number(0, "kv_message_ms"), kv_ready_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "kv_wait_ms"), 0, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "kv_pull_ms"), kv_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "ttft_ms"), ttft_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "e2e_ms"), e2e_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "tpot_ms"), decode_s * 1e3 / static_cast<double>(output - 1),
              kCsvTolMs);

  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["kv_transfer"]["transfers"].get<int>(), 1);
  EXPECT_EQ(s["kv_transfer"]["bytes"].get<double>(), kv_bytes);
  EXPECT_NEAR(s["kv_transfer"]["parts_ms"]["message"]["p50"].get<double>(), kv_ready_s * 1e3,
              kCsvTolMs);
  EXPECT_NEAR(s["kv_transfer"]["parts_ms"]["pull"]["p99"].get<double>(), kv_s * 1e3, kCsvTolMs);
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"].get<Tokens>(), input);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"].get<Tokens>(), 0);
  EXPECT_EQ(s["sim"]["engine_steps"].get<Tokens>(), output);  // 1 prefill + output-1 decodes
  EXPECT_NEAR(s["duration_s"].get<double>(), e2e_s, 1e-6);    // first arrival to last completion
  // The simulated clock stops after the teardown: the last instance tells the frontend that
  // everything finished (an empty message), and the frontend sends a shutdown message to each
  // instance (both share the frontend link).
  const double teardown_s = MessageSeconds(0, {net.nic, net.sw, net.frontend}) +
                            MessageSeconds(2 * kControlMessageBytes, net.FrontendToGpu());
  EXPECT_NEAR(s["sim"]["simulated_s"].get<double>(), e2e_s + teardown_s, 1e-6);
}

// The same request sent again after the first finished: its prompt is in the prefill
// instance's prefix cache except the last (partial) block, so prefill computes only the rest,
// attending over the cached context; the KV transfer still moves the whole prompt.
TEST(SingleRequestTiming, RepeatedPromptHitsPrefixCache) {
  const nlohmann::json cluster = ReadJson(Src(kTinyPdCluster));
  nlohmann::json line = nlohmann::json::parse(ReadFile(Src(kOneRequest)));
  const Tokens input = line.at("input_length").get<Tokens>();
  const Tokens block = cluster.at("engine").at("block_tokens").get<Tokens>();
  const double second_arrival_s = 0.1;  // long after the first request finished (~11 ms)
  TempDir tmp;
  std::string trace = line.dump() + "\n";
  line["timestamp"] = second_arrival_s * 1e3;
  trace += line.dump() + "\n";
  const std::string trace_path = tmp.Write("repeat.jsonl", trace);

  const Network net(cluster);
  models::ModelSpec model;
  const models::RooflineCostModel cost = CostModelFor(cluster, 1, &model);
  // At least one token is recomputed (its logits give the first output token), so the hit is
  // the whole blocks among the first input-1 tokens.
  const Tokens cached = (input - 1) / block * block;
  const double frontend_s =
      MessageSeconds(static_cast<double>(input) * kBytesPerPromptToken, net.FrontendToGpu());
  const double prefill_s = cost.StepTime(PrefillShape(input - cached, cached));
  const double kv_s =
      MessageSeconds(kControlMessageBytes, net.GpuToGpu()) +
      MessageSeconds(static_cast<double>(input * model.KvBytesPerToken()), net.GpuToGpu());
  ASSERT_LT(prefill_s, cost.StepTime(PrefillShape(input, 0)) - 10 * kCsvTolMs * 1e-3);

  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kTinyPdCluster, "--trace", trace_path});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv.Number(0, "cached_tokens"), 0);
  EXPECT_EQ(csv.Number(1, "cached_tokens"), static_cast<double>(cached));
  EXPECT_EQ(csv.Get(1, "status"), "completed");
  EXPECT_NEAR(csv.Number(1, "arrival_s"), second_arrival_s, 1e-9);
  EXPECT_NEAR(csv.Number(1, "queue_ms"), frontend_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(1, "kv_transfer_ms"), kv_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(1, "ttft_ms"), (frontend_s + prefill_s + kv_s) * 1e3, kCsvTolMs);

  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"].get<Tokens>(), 2 * input);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"].get<Tokens>(), cached);
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["gpu"]["hit_tokens"].get<Tokens>(), cached);
}

// The single request on TP=2 instances: steps are priced at tp=2 (half the FLOPs and bytes per
// GPU plus the all-reduces), and the KV moves as two half-size shards, GPU i to GPU i, on
// disjoint routes that share only the (fast) switch, so the transfer takes half as long.
TEST(SingleRequestTiming, TensorParallelKvShardsMoveInParallel) {
  nlohmann::json cluster = ReadJson(Src(kTinyPdCluster));
  cluster["nodes"][0]["gpus"] = 2;
  for (auto& group : cluster["instances"]) group["tp"] = 2;
  TempDir tmp;
  const std::string cluster_path = tmp.File("1p1d-tiny-tp2.json");
  WriteJson(cluster_path, cluster);

  const nlohmann::json line = nlohmann::json::parse(ReadFile(Src(kOneRequest)));
  const Tokens input = line.at("input_length").get<Tokens>();
  const Tokens output = line.at("output_length").get<Tokens>();
  const Network net(cluster);
  ASSERT_GT(net.sw.bandwidth, 2 * net.nic.bandwidth) << "the shards must not meet a bottleneck";
  models::ModelSpec model;
  const models::RooflineCostModel cost = CostModelFor(cluster, 2, &model);
  const double shard_bytes = static_cast<double>(input * model.KvBytesPerToken()) / 2;
  const double frontend_s =
      MessageSeconds(static_cast<double>(input) * kBytesPerPromptToken, net.FrontendToGpu());
  const double prefill_s = cost.StepTime(PrefillShape(input, 0));
  ASSERT_LT(prefill_s, CostModelFor(cluster, 1).StepTime(PrefillShape(input, 0)));
  const double kv_s = MessageSeconds(kControlMessageBytes, net.GpuToGpu()) +
                      MessageSeconds(shard_bytes, net.GpuToGpu());
  double decode_s = 0;
  for (Tokens generated = 1; generated < output; ++generated)
    decode_s += cost.StepTime(DecodeShape(input + generated - 1));
  const double ttft_s = frontend_s + prefill_s + kv_s;

  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", cluster_path, "--trace", kOneRequest});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 1u);
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  EXPECT_NEAR(csv.Number(0, "queue_ms"), frontend_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "kv_transfer_ms"), kv_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "ttft_ms"), ttft_s * 1e3, kCsvTolMs);
  EXPECT_NEAR(csv.Number(0, "e2e_ms"), (ttft_s + decode_s) * 1e3, kCsvTolMs);
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["kv_transfer"]["bytes"].get<double>(), 2 * shard_bytes);
}

// A request whose KV could never fit on an instance is rejected at arrival with a reason that
// says how much it needs and how much an instance admits (its KV capacity less the admission
// watermark); the requests around it are served as usual.
TEST(Rejection, OversizedRequestIsRejectedWithReason) {
  const nlohmann::json cluster = ReadJson(Src(kTinyPdCluster));
  models::ModelSpec model;
  CostModelFor(cluster, 1, &model);
  auto hw = models::LoadHardwareSpec(Src("models/hardware/tiny-gpu.json"));
  ASSERT_TRUE(hw.ok()) << hw.error();
  models::MemoryOptions memory;
  memory.gpu_memory_utilization = cluster["engine"]["gpu_memory_utilization"].get<double>();
  memory.reserved_bytes_per_gpu =
      static_cast<Bytes>(cluster["engine"]["reserved_gib"].get<double>() * 1024 * 1024 * 1024);
  memory.block_tokens = cluster["engine"]["block_tokens"].get<Tokens>();
  auto plan = models::PlanInstanceMemory(model, *hw, memory);
  ASSERT_TRUE(plan.ok()) << plan.error();
  const Tokens capacity = plan->kv_blocks * memory.block_tokens;
  const Tokens huge = capacity + 1000;

  TempDir tmp;
  // tiny-test with a context longer than the KV capacity, so that the capacity is the limit.
  nlohmann::json long_context = ReadJson(Src("models/specs/tiny-test.json"));
  long_context["max_position_embeddings"] = std::int64_t{1} << 30;
  WriteJson(tmp.File("tiny-long.json"), long_context);
  nlohmann::json long_cluster = cluster;
  long_cluster["model"] = tmp.File("tiny-long.json");
  WriteJson(tmp.File("cluster.json"), long_cluster);
  const nlohmann::json oversized = {{"timestamp", 1},
                                    {"input_length", huge},
                                    {"output_length", 10},
                                    {"hash_ids", nlohmann::json::array()}};
  const std::string trace = tmp.Write(
      "oversized.jsonl",
      std::string(
          R"({"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})") +
          "\n" + oversized.dump() + "\n" +
          R"({"timestamp": 2, "input_length": 700, "output_length": 4, "hash_ids": [3, 4]})" +
          "\n");
  const std::string out = tmp.File("out");
  const RunResult r = Simulate(out, {"--cluster", tmp.File("cluster.json"), "--trace", trace});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  EXPECT_EQ(csv.Get(2, "status"), "completed");
  EXPECT_EQ(csv.Get(1, "status"), "rejected");
  const std::string reason = csv.Get(1, "reason");
  EXPECT_TRUE(
      ContainsAll(reason, {"needs " + std::to_string(huge + 10) + " KV tokens", "admits at most"}));
  const Tokens admitted = std::stoll(reason.substr(reason.rfind(' ') + 1));
  EXPECT_LE(admitted, capacity);
  EXPECT_GE(admitted, capacity * 98 / 100) << "a 1% watermark";
  for (const char* column : {"prefill_instance", "decode_instance", "queue_ms", "ttft_ms",
                             "tpot_ms", "e2e_ms", "kv_transfer_ms"})
    EXPECT_TRUE(csv.Get(1, column).empty()) << column << " of a rejected request";

  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["completed"].get<int>(), 2);
  EXPECT_EQ(s["requests"]["rejected"].get<int>(), 1);
  // Counted by the reason's class; requests.csv keeps the numbers.
  EXPECT_EQ(reason.rfind("exceeds KV capacity: ", 0), 0u) << reason;
  EXPECT_EQ(s["requests"]["rejected_reasons"]["exceeds KV capacity"].get<int>(), 1);
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"].get<Tokens>(), 600 + 700) << "rejected: no lookup";
  EXPECT_TRUE(ContainsAll(r.out, {"1 rejected", "rejected 1: exceeds KV capacity"}));
}

// ---- Link sharing --------------------------------------------------------------------------

// Two identical requests at the same time go round-robin to the two prefill instances on node0
// and finish prefill together; both KV transfers then cross the decode GPU's NIC (and PCIe)
// in the DOWN direction, which they share fairly. Alone, one transfer gets the route's
// bottleneck bandwidth; together each gets the smaller of its own route's bottleneck and half
// the shared links' bottleneck, so each takes about twice as long.
TEST(LinkSharing, ConcurrentKvTransfersShareTheDecodeNic) {
  const nlohmann::json cluster = ReadJson(Src(kSharingCluster));
  const std::string both = ReadFile(Src(kTwoRequests));
  const nlohmann::json line = nlohmann::json::parse(both.substr(0, both.find('\n')));
  const Tokens input = line.at("input_length").get<Tokens>();
  models::ModelSpec model;
  CostModelFor(cluster, 1, &model);
  const Network net(cluster);
  const double bytes = static_cast<double>(input * model.KvBytesPerToken());

  const double alone_bw = MinBandwidth(net.GpuToGpu());
  const double shared_bw =
      std::min(MinBandwidth({net.pcie, net.nic}), MinBandwidth({net.sw, net.nic, net.pcie}) / 2);
  ASSERT_LT(shared_bw, alone_bw) << "the cluster must make the shared links the bottleneck";

  TempDir tmp;
  const std::string single_trace = tmp.Write("single.jsonl", line.dump() + "\n");
  Simulate(tmp.File("single"),
           {"--cluster", kSharingCluster, "--trace", single_trace, "--router", "round-robin"});
  Simulate(tmp.File("pair"),
           {"--cluster", kSharingCluster, "--trace", kTwoRequests, "--router", "round-robin"});
  const Csv single = Csv::Read(tmp.File("single") + "/requests.csv");
  const Csv pair = Csv::Read(tmp.File("pair") + "/requests.csv");
  ASSERT_EQ(single.size(), 1u);
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair.Get(0, "prefill_instance"), "p0");
  EXPECT_EQ(pair.Get(1, "prefill_instance"), "p1");
  EXPECT_EQ(pair.Get(0, "decode_instance"), "d0");
  EXPECT_EQ(pair.Get(1, "decode_instance"), "d0");

  // Alone: latency + bytes / alone_bw (checked exactly by SingleRequestTiming). Shared: the
  // bandwidth phase takes bytes / shared_bw instead.
  const double single_ms = single.Number(0, "kv_transfer_ms");
  EXPECT_NEAR(single_ms,
              (MessageSeconds(kControlMessageBytes, net.GpuToGpu()) +
               MessageSeconds(bytes, net.GpuToGpu())) *
                  1e3,
              kCsvTolMs);
  const double predicted_ms = single_ms + (bytes / shared_bw - bytes / alone_bw) * 1e3;
  const double predicted_ratio = predicted_ms / single_ms;
  ASSERT_GT(predicted_ratio, 1.9);
  for (std::size_t i = 0; i < 2; ++i) {
    const double ratio = pair.Number(i, "kv_transfer_ms") / single_ms;
    EXPECT_NEAR(ratio, predicted_ratio, 0.02 * predicted_ratio)
        << "request " << i << ": " << pair.Number(i, "kv_transfer_ms") << " ms shared vs "
        << single_ms << " ms alone; predicted " << predicted_ms << " ms";
  }
}

// ---- Determinism and decode-step coalescing -------------------------------------------------

std::vector<std::string> Mooncake300(const std::string& cluster) {
  return {"--cluster", cluster, "--trace", MooncakeTracePath(), "--limit", "300"};
}

TEST(Determinism, SameInputsGiveIdenticalOutputs) {
  TempDir tmp;
  Simulate(tmp.File("a"), Mooncake300(kPdCluster));
  Simulate(tmp.File("b"), Mooncake300(kPdCluster));
  const std::string csv_a = ReadFile(tmp.File("a") + "/requests.csv");
  EXPECT_EQ(csv_a, ReadFile(tmp.File("b") + "/requests.csv"));
  EXPECT_EQ(Csv::Parse(csv_a).size(), 300u);
  const nlohmann::json a = ReadJson(tmp.File("a") + "/summary.json");
  const nlohmann::json b = ReadJson(tmp.File("b") + "/summary.json");
  EXPECT_EQ(StableSummary(a), StableSummary(b))
      << nlohmann::json::diff(StableSummary(a), StableSummary(b)).dump(2);
  EXPECT_EQ(a["requests"]["completed"].get<int>(), 300);
}

// Coalescing runs of decode-only steps into one simulated wait must not change any result: the
// same rows (times within float noise), the same number of engine steps, far fewer events.
void ExpectCoalescingIsExact(const std::string& cluster) {
  TempDir tmp;
  const std::string uncoalesced =
      ClusterWithEngineSetting(tmp, cluster, "coalesce_decode_steps", false);
  Simulate(tmp.File("on"), Mooncake300(cluster));
  Simulate(tmp.File("off"), Mooncake300(uncoalesced));
  const Csv on = Csv::Read(tmp.File("on") + "/requests.csv");
  const Csv off = Csv::Read(tmp.File("off") + "/requests.csv");
  ASSERT_EQ(on.size(), 300u);
  EXPECT_TRUE(SameRequests(on, off, 0.002));
  const nlohmann::json s_on = ReadJson(tmp.File("on") + "/summary.json");
  const nlohmann::json s_off = ReadJson(tmp.File("off") + "/summary.json");
  EXPECT_EQ(s_on["sim"]["engine_steps"], s_off["sim"]["engine_steps"]);
  EXPECT_EQ(s_on["requests"], s_off["requests"]);
  const auto events_on = s_on["sim"]["events"].get<std::int64_t>();
  const auto events_off = s_off["sim"]["events"].get<std::int64_t>();
  EXPECT_LT(events_on, events_off);
  // Without coalescing every step is at least one event.
  EXPECT_GE(events_off, s_off["sim"]["engine_steps"].get<std::int64_t>());
  EXPECT_LT(events_on * 4, events_off) << "coalescing should save most events on decode runs";
}

TEST(Coalescing, DecodeRunsAreExactOnPdCluster) { ExpectCoalescingIsExact(kPdCluster); }

TEST(Coalescing, DecodeRunsAreExactOnColocatedCluster) {
  ExpectCoalescingIsExact(kColocatedCluster);
}

// ---- Golden files ---------------------------------------------------------------------------

TEST(GoldenTest, TinyTraceOnPdClusterMatchesCommittedOutputs) {
  const fs::path golden_dir = Src("tests/golden/tiny");
  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kPdCluster, "--trace", kTinyTrace, "--router", "round-robin"});
  const std::string csv = ReadFile(out + "/requests.csv");
  const nlohmann::json summary = StableSummary(ReadJson(out + "/summary.json"));
  if (const char* update = std::getenv("DUET_UPDATE_GOLDEN");
      update && std::string(update) == "1") {
    fs::create_directories(golden_dir);
    WriteFile((golden_dir / "requests.csv").string(), csv);
    WriteJson((golden_dir / "summary.json").string(), summary);
    GTEST_SKIP() << "rewrote " << golden_dir;
  }
  ASSERT_TRUE(fs::exists(golden_dir / "summary.json"))
      << "no golden files; generate them with DUET_UPDATE_GOLDEN=1";
  const nlohmann::json golden = ReadJson((golden_dir / "summary.json").string());
  EXPECT_EQ(summary, golden) << "summary.json differs from the golden file (JSON patch from "
                                "golden to this run):\n"
                             << nlohmann::json::diff(golden, summary).dump(2);
  const std::string golden_csv = ReadFile((golden_dir / "requests.csv").string());
  EXPECT_TRUE(csv == golden_csv)
      << "requests.csv differs from the golden file: "
      << SameRequests(Csv::Parse(golden_csv), Csv::Parse(csv), 0).message();
}

// ---- The full real trace ---------------------------------------------------------------------

TEST(FullTrace, PdClusterAccountsForEveryRequestAndPrefixRoutingHitsMore) {
  TempDir tmp;
  const std::string rr = tmp.File("round-robin"), pa = tmp.File("prefix-aware");
  Simulate(rr,
           {"--cluster", kPdCluster, "--trace", MooncakeTracePath(), "--router", "round-robin"});
  Simulate(pa,
           {"--cluster", kPdCluster, "--trace", MooncakeTracePath(), "--router", "prefix-aware"});
  ExpectEveryRequestAccounted(rr, kRealTraceRequests);
  ExpectEveryRequestAccounted(pa, kRealTraceRequests);
  const nlohmann::json s_rr = ReadJson(rr + "/summary.json");
  const nlohmann::json s_pa = ReadJson(pa + "/summary.json");
  const double hit_rr = s_rr["prefix_cache"]["hit_rate"].get<double>();
  const double hit_pa = s_pa["prefix_cache"]["hit_rate"].get<double>();
  EXPECT_GT(hit_pa, hit_rr) << "prefix-aware routing should find more cached prefixes";
  EXPECT_GT(hit_rr, 0.0);
  for (const auto* s : {&s_rr, &s_pa}) {
    EXPECT_EQ((*s)["run"]["mode"], "pd");
    EXPECT_GT((*s)["kv_transfer"]["transfers"].get<std::int64_t>(), 0);
  }
}

TEST(FullTrace, ColocatedClusterAccountsForEveryRequest) {
  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kColocatedCluster, "--trace", MooncakeTracePath()});
  ExpectEveryRequestAccounted(out, kRealTraceRequests);
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["run"]["mode"], "colocated");
  EXPECT_EQ(s["kv_transfer"]["transfers"].get<std::int64_t>(), 0);
}

// ---- Routers ---------------------------------------------------------------------------------

std::vector<std::string> RouterRun(const std::string& router, const std::string& seed) {
  return {"--cluster", kPdCluster, "--trace", MooncakeTracePath(), "--limit", "200", "--router",
          router,      "--seed",   seed};
}

std::vector<std::string> InstanceColumn(const Csv& csv, const std::string& column) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < csv.size(); ++i) v.push_back(csv.Get(i, column));
  return v;
}

TEST(Routers, EveryRouterCompletesAllRequests) {
  TempDir tmp;
  std::map<std::string, std::vector<std::string>> assignments;
  for (const std::string router :
       {"round-robin", "least-loaded", "power-of-two", "prefix-aware", "cache-aware", "kv-aware"}) {
    const std::string out = tmp.File(router);
    Simulate(out, RouterRun(router, "1"));
    const nlohmann::json s = ReadJson(out + "/summary.json");
    EXPECT_EQ(s["run"]["router"], router);
    EXPECT_EQ(s["requests"]["completed"].get<int>(), 200) << router;
    const Csv csv = Csv::Read(out + "/requests.csv");
    ASSERT_EQ(csv.size(), 200u);
    std::set<std::string> prefill_used, decode_used;
    for (std::size_t i = 0; i < csv.size(); ++i) {
      EXPECT_EQ(csv.Get(i, "status"), "completed") << router << " request " << i;
      EXPECT_EQ(csv.Get(i, "prefill_instance").substr(0, 1), "p");
      EXPECT_EQ(csv.Get(i, "decode_instance").substr(0, 1), "d");
      // Policies that score say so; the others leave the column empty.
      const bool scores =
          router == "prefix-aware" || router == "cache-aware" || router == "kv-aware";
      EXPECT_EQ(csv.Get(i, "router_score").empty(), !scores) << router << " request " << i;
      prefill_used.insert(csv.Get(i, "prefill_instance"));
      decode_used.insert(csv.Get(i, "decode_instance"));
    }
    EXPECT_GT(prefill_used.size(), 1u) << router << " spreads prefills";
    EXPECT_GT(decode_used.size(), 1u) << router << " spreads decodes";
    assignments[router] = InstanceColumn(csv, "prefill_instance");
  }
  // Round-robin is exactly p0, p1, ..., p7, p0, ...
  for (std::size_t i = 0; i < assignments["round-robin"].size(); ++i)
    EXPECT_EQ(assignments["round-robin"][i], std::string(1, 'p').append(std::to_string(i % 8)));
}

TEST(Routers, PowerOfTwoDependsOnlyOnTheSeed) {
  TempDir tmp;
  Simulate(tmp.File("s1a"), RouterRun("power-of-two", "1"));
  Simulate(tmp.File("s1b"), RouterRun("power-of-two", "1"));
  Simulate(tmp.File("s2"), RouterRun("power-of-two", "2"));
  const std::string a = ReadFile(tmp.File("s1a") + "/requests.csv");
  EXPECT_EQ(a, ReadFile(tmp.File("s1b") + "/requests.csv"));
  const Csv s1 = Csv::Parse(a);
  const Csv s2 = Csv::Read(tmp.File("s2") + "/requests.csv");
  EXPECT_NE(InstanceColumn(s1, "prefill_instance"), InstanceColumn(s2, "prefill_instance"))
      << "seed 2 should sample other instances than seed 1";
  EXPECT_EQ(ReadJson(tmp.File("s2") + "/summary.json")["run"]["seed"].get<int>(), 2);
}

// ---- Output schema ---------------------------------------------------------------------------

// ExpectMetricsSchema (tests/common/metrics_schema.h) checks every key, simulated runs with
// their "sim" section.

TEST(OutputSchema, PdRunHasEveryMetricsKey) {
  TempDir tmp;
  Simulate(tmp.File("out"), {"--cluster", kPdCluster, "--trace", kTinyTrace});
  ExpectMetricsSchema(tmp.File("out"));
  const nlohmann::json s = ReadJson(tmp.File("out") + "/summary.json");
  EXPECT_EQ(s["kv_transfer"]["transfers"].get<int>(), s["requests"]["completed"].get<int>());
  // No SLO given: the goodput section is there, with zeros.
  EXPECT_EQ(s["goodput"]["slo"]["ttft_ms"].get<double>(), 0);
  EXPECT_EQ(s["goodput"]["attainment"].get<double>(), 0);
}

// `--step-log`: every simulated step as a live server logs it, read back by the same reader:
// each instance's steps one after another, each forward pass the cost model's price for the
// step's shape, and the decode tokens every request made after its first.
TEST(OutputSchema, StepLogHoldsEveryStepAsPriced) {
  TempDir tmp;
  const std::string out = tmp.File("out"), log = tmp.File("steps.jsonl");
  Simulate(out, {"--cluster", kTinyPdCluster, "--trace", kTinyTrace, "--step-log", log});
  auto cluster = sim::LoadClusterSpec(kTinyPdCluster, DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::vector<std::unique_ptr<models::StepCostModel>> costs;
  for (std::size_t i = 0; i < cluster->instances.size(); ++i)
    costs.push_back(sim::MakeStepCostModel(*cluster, i));
  std::int64_t steps = 0;
  std::map<int, Tokens> decode_tokens;
  std::map<int, Seconds> last_end;
  const Status read =
      policies::ReadStepLog(ReadFile(log), log, [&](const policies::StepLogLine& line) {
        ++steps;
        ASSERT_LT(line.instance, 2);
        EXPECT_DOUBLE_EQ(line.step.seconds, costs[line.instance]->StepTime(line.step.shape));
        // No host time priced: the iteration is the forward pass.
        EXPECT_NEAR(line.iteration_s, line.step.seconds, 1e-9);
        EXPECT_GE(line.start_s, last_end[line.instance] - 1e-9) << "steps overlap";
        last_end[line.instance] = line.start_s + line.iteration_s;
        decode_tokens[line.instance] += line.step.shape.decode_tokens;
      });
  ASSERT_TRUE(read.ok()) << read.message();
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(steps, s["sim"]["engine_steps"].get<std::int64_t>());
  const Csv csv = Csv::Read(out + "/requests.csv");
  Tokens after_first = 0;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    ASSERT_EQ(csv.Get(i, "status"), "completed");
    after_first += std::stoll(csv.Get(i, "output_tokens")) - 1;
  }
  EXPECT_EQ(decode_tokens[0], 0) << "the prefill instance decodes nothing";
  EXPECT_EQ(decode_tokens[1], after_first);
  // The simulation is the same with its step log as without.
  Simulate(tmp.File("again"), {"--cluster", kTinyPdCluster, "--trace", kTinyTrace});
  nlohmann::json again = ReadJson(tmp.File("again") + "/summary.json"), logged = s;
  again["sim"].erase("wall_s");
  logged["sim"].erase("wall_s");
  EXPECT_EQ(again, logged);
}

TEST(OutputSchema, ColocatedRunHasZeroKvTransferSection) {
  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", kColocatedCluster, "--trace", kTinyTrace});
  ExpectMetricsSchema(out);
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["run"]["mode"], "colocated");
  EXPECT_EQ(s["kv_transfer"]["transfers"].get<int>(), 0);
  EXPECT_EQ(s["kv_transfer"]["bytes"].get<int>(), 0);
  for (const char* stat : {"mean", "p50", "p99"})
    EXPECT_EQ(s["kv_transfer"]["time_ms"][stat].get<double>(), 0) << stat;
  const Csv csv = Csv::Read(out + "/requests.csv");
  for (std::size_t i = 0; i < csv.size(); ++i) {
    EXPECT_TRUE(csv.Get(i, "kv_transfer_ms").empty()) << "request " << i;
    EXPECT_EQ(csv.Get(i, "decode_instance"), csv.Get(i, "prefill_instance"));
    EXPECT_EQ(csv.Get(i, "prefill_instance").substr(0, 1), "c");
  }
}

// Goodput: the fraction of all requests that completed within every given SLO. Thresholds are
// taken from a run without SLO (so that some requests meet them and some do not) and set half a
// CSV digit above a printed value, so the 3-decimal CSV decides every comparison exactly.
TEST(OutputSchema, GoodputMatchesRequestsCsv) {
  TempDir tmp;
  const std::vector<std::string> base = {"--cluster", kPdCluster, "--trace", kTinyTrace};
  Simulate(tmp.File("plain"), base);
  const Csv plain = Csv::Read(tmp.File("plain") + "/requests.csv");
  auto quantile = [&](const std::string& column, double q) {
    std::vector<double> v;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      if (!plain.Get(i, column).empty()) v.push_back(plain.Number(i, column));
    }
    std::sort(v.begin(), v.end());
    return v.at(static_cast<std::size_t>(q * static_cast<double>(v.size() - 1)));
  };
  const double ttft = quantile("ttft_ms", 0.7) + 0.0005;
  const double tpot = quantile("tpot_ms", 0.8) + 0.0005;
  const double e2e = quantile("e2e_ms", 0.9) + 0.0005;
  char slo[128];
  std::snprintf(slo, sizeof slo, "ttft=%.4f,tpot=%.4f,e2e=%.4f", ttft, tpot, e2e);

  std::vector<std::string> args = base;
  args.insert(args.end(), {"--slo", slo});
  const RunResult r = Simulate(tmp.File("slo"), args);
  EXPECT_TRUE(ContainsAll(r.out, {"goodput"}));
  const Csv csv = Csv::Read(tmp.File("slo") + "/requests.csv");
  const nlohmann::json s = ReadJson(tmp.File("slo") + "/summary.json");
  EXPECT_TRUE(SameRequests(plain, csv, 0)) << "an SLO must not change the run";
  std::size_t met = 0;
  for (std::size_t i = 0; i < csv.size(); ++i) {
    if (csv.Get(i, "status") != "completed") continue;
    const bool tpot_ok = csv.Get(i, "tpot_ms").empty() || csv.Number(i, "tpot_ms") <= tpot;
    met += csv.Number(i, "ttft_ms") <= ttft && tpot_ok && csv.Number(i, "e2e_ms") <= e2e;
  }
  const double attainment = s["goodput"]["attainment"].get<double>();
  EXPECT_GE(attainment, 0.0);
  EXPECT_LE(attainment, 1.0);
  EXPECT_GT(met, 0u);
  EXPECT_LT(met, csv.size());
  EXPECT_NEAR(attainment, static_cast<double>(met) / static_cast<double>(csv.size()), 1e-6);
  EXPECT_NEAR(s["goodput"]["requests_per_s"].get<double>(),
              static_cast<double>(met) / s["duration_s"].get<double>(), 1e-5);
  EXPECT_NEAR(s["goodput"]["slo"]["ttft_ms"].get<double>(), ttft, 1e-9);
  EXPECT_NEAR(s["goodput"]["slo"]["tpot_ms"].get<double>(), tpot, 1e-9);
  EXPECT_NEAR(s["goodput"]["slo"]["e2e_ms"].get<double>(), e2e, 1e-9);
}

// ---- Progress bar and selection flags ----------------------------------------------------------

TEST(Progress, NoProgressBarWhenStderrIsNotATerminal) {
  TempDir tmp;
  const RunResult automatic =
      Simulate(tmp.File("auto"), {"--cluster", kPdCluster, "--trace", kTinyTrace});
  EXPECT_EQ(automatic.all().find('\r'), std::string::npos) << automatic;
  EXPECT_TRUE(ContainsAll(automatic.out, {"40 total, 40 completed", "requests.csv"}));
  const RunResult never = Simulate(
      tmp.File("never"), {"--cluster", kPdCluster, "--trace", kTinyTrace, "--progress", "never"});
  EXPECT_EQ(never.all().find('\r'), std::string::npos) << never;
  const RunResult always = Simulate(
      tmp.File("always"), {"--cluster", kPdCluster, "--trace", kTinyTrace, "--progress", "always"});
  EXPECT_NE(always.err.find('\r'), std::string::npos) << always;
  EXPECT_TRUE(ContainsAll(always.err, {"40/40 requests", "100%"}));
  EXPECT_EQ(always.out.find('\r'), std::string::npos) << "the bar goes to stderr only";
  // The bar changes nothing else.
  EXPECT_EQ(ReadFile(tmp.File("auto") + "/requests.csv"),
            ReadFile(tmp.File("always") + "/requests.csv"));
}

TEST(SelectionFlags, LimitAndRateScale) {
  TempDir tmp;
  const std::vector<std::string> base = {"--cluster",         kPdCluster, "--trace",
                                         MooncakeTracePath(), "--limit",  "50"};
  Simulate(tmp.File("x1"), base);
  std::vector<std::string> faster = base;
  faster.insert(faster.end(), {"--rate-scale", "2"});
  Simulate(tmp.File("x2"), faster);
  const Csv x1 = Csv::Read(tmp.File("x1") + "/requests.csv");
  const Csv x2 = Csv::Read(tmp.File("x2") + "/requests.csv");
  ASSERT_EQ(x1.size(), 50u);
  ASSERT_EQ(x2.size(), 50u);
  EXPECT_EQ(ReadJson(tmp.File("x1") + "/summary.json")["requests"]["total"].get<int>(), 50);
  EXPECT_GT(x1.Number(49, "arrival_s"), 0);
  for (std::size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(x1.Get(i, "input_tokens"), x2.Get(i, "input_tokens"));
    EXPECT_NEAR(x2.Number(i, "arrival_s"), x1.Number(i, "arrival_s") / 2, 1e-6) << i;
  }
}

TEST(SelectionFlags, WindowKeepsArrivalsInRangeShiftedToZero) {
  TempDir tmp;
  Simulate(tmp.File("all"),
           {"--cluster", kPdCluster, "--trace", MooncakeTracePath(), "--limit", "400"});
  Simulate(tmp.File("win"),
           {"--cluster", kPdCluster, "--trace", MooncakeTracePath(), "--window", "60:120"});
  const Csv all = Csv::Read(tmp.File("all") + "/requests.csv");
  const Csv win = Csv::Read(tmp.File("win") + "/requests.csv");
  std::size_t expected = 0, first = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double t = all.Number(i, "arrival_s");
    if (t >= 60 && t < 120 && expected++ == 0) first = i;
  }
  ASSERT_GT(expected, 0u);
  ASSERT_GE(all.Number(all.size() - 1, "arrival_s"), 120);  // the 400 cover the window
  ASSERT_EQ(win.size(), expected);
  const double shift = all.Number(first, "arrival_s");
  for (std::size_t i = 0; i < win.size(); ++i) {
    EXPECT_EQ(win.Get(i, "request_id"), all.Get(first + i, "request_id"));  // ids kept
    EXPECT_NEAR(win.Number(i, "arrival_s"), all.Number(first + i, "arrival_s") - shift, 1e-6);
  }
}

TEST(SelectionFlags, BadWindowIsAUsageError) {
  TempDir tmp;
  for (const char* bad : {"60", "120:60", "a:b", "1:2:3"}) {
    const RunResult r = RunDuet(
        {"simulate", "--trace", MooncakeTracePath(), "--window", bad, "--out", tmp.File("o")});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r;
    EXPECT_NE(r.err.find("--window"), std::string::npos) << r;
  }
}

}  // namespace
}  // namespace duet::e2e
