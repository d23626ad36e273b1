// One admission rule in both worlds (issue 41): one trace through `duet simulate` and through
// the live thread frontend, on the same deployment (the test model, a prefill side smaller than
// the decode side), gets the same decisions request for request: which are admitted, the
// reason of each rejection, and the instance that serves each admitted one. Colocated and 1P2D,
// with a request too long for the prefill side only (its prompt fits there, prompt and output
// only on the decode side: the live frontend used to refuse it), one whose prompt alone is too
// long for the prefill side, one too long for every instance, and ones that fit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/cluster_spec.h"
#include "tests/live/live_test_util.h"
#include "tests/sim/e2e_util.h"

namespace duet::backend::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using policies::InstanceRole;

struct Case {
  Tokens input, output;
};

// GPUs that hold the test model and a few dozen KV blocks: the prefill node's fewer.
json Gpu(const std::string& name, double hbm_gib) {
  return {{"name", name},
          {"bf16_tflops", 1},
          {"hbm_gib", hbm_gib},
          {"hbm_bandwidth_gbps", 100},
          {"nvlink_bandwidth_gbps", 10},
          {"pcie_bandwidth_gbps", 5}};
}

class AdmissionEquivalence : public Frontend, public ::testing::WithParamInterface<bool> {};

TEST_P(AdmissionEquivalence, SimulatorAndLiveFrontendDecideAlike) {
  const bool pd = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("duet_admission_" + std::to_string(::getpid()) +
                                                    (pd ? "_pd" : "_colocated"));
  fs::create_directories(dir);
  // GPUs whose memory leaves the test model `small_blocks` and `large_blocks` KV blocks: the
  // weights' share measured on a first plan.
  auto write_cluster = [&](double small_gib, double large_gib) {
    std::ofstream(dir / "small.json") << Gpu("small", small_gib).dump();
    std::ofstream(dir / "large.json") << Gpu("large", large_gib).dump();
    const json link = {{"bandwidth_GBps", 1}, {"latency_us", 1}};
    const json cluster = {
        {"name", "admission"},
        {"model", dir_},
        {"router", "round-robin"},
        {"nodes",
         {{{"count", 1}, {"gpus", 1}, {"gpu", (dir / "small.json").string()}, {"nic", link}},
          {{"count", 1}, {"gpus", 2}, {"gpu", (dir / "large.json").string()}, {"nic", link}}}},
        {"network", {{"switch", link}}},
        {"instances",
         {{{"role", pd ? "prefill" : "colocated"}, {"count", 1}, {"node", 0}},
          {{"role", pd ? "decode" : "colocated"}, {"count", 2}, {"node", 1}}}},
        {"engine", {{"reserved_gib", 0}, {"watermark", 0}, {"max_num_seqs", 4}}}};
    std::ofstream(dir / "cluster.json") << cluster.dump();
    return sim::LoadClusterSpec((dir / "cluster.json").string(), DUET_SOURCE_DIR);
  };
  constexpr double kProbeGib = 0.01;
  auto probe = write_cluster(kProbeGib, kProbeGib);
  ASSERT_TRUE(probe.ok()) << probe.error();
  const double usable = probe->engine.memory.gpu_memory_utilization * kGiB;
  const double block_bytes =
      static_cast<double>(probe->engine.block_tokens * probe->KvBytesPerToken());
  const double weights =
      kProbeGib * usable - static_cast<double>(probe->placements[0].memory.kv_blocks) * block_bytes;
  auto gib_for = [&](int blocks) { return (weights + (blocks + 0.5) * block_bytes) / usable; };
  const std::string cluster_path = (dir / "cluster.json").string();
  auto spec = write_cluster(gib_for(6), gib_for(12));
  ASSERT_TRUE(spec.ok()) << spec.error();

  // What each instance admits, as both worlds plan it.
  const Tokens block = spec->engine.block_tokens;
  std::vector<std::int64_t> blocks;
  for (const sim::InstancePlacement& at : spec->placements) blocks.push_back(at.memory.kv_blocks);
  const Tokens small = spec->engine.scheduler.AdmissibleTokens(blocks[0], block);
  const Tokens large = spec->engine.scheduler.AdmissibleTokens(blocks[1], block);
  ASSERT_EQ(small, 6 * block);
  ASSERT_EQ(large, 12 * block);
  ASSERT_LT(large + 16, spec->model.max_position_embeddings);
  const std::vector<Case> cases = {
      {32, 8},           // fits
      {small - 8, 40},   // PD: fits; colocated: too long for the small instance
      {small + 1, 8},    // the prompt alone is too long for the small instance
      {large + 10, 4},   // too long for every instance
      {48, 4},           // fits
      {large - 20, 16},  // PD: the prompt too long for the prefill side
      {64, 8},           // fits
  };

  // The simulator: one request a second, each alone in the cluster.
  {
    std::ofstream trace(dir / "trace.jsonl");
    std::int64_t next_hash = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      json hashes = json::array();
      for (Tokens t = 0; t < cases[i].input; t += 512) hashes.push_back(next_hash++);
      trace << json{{"timestamp", 1000 * static_cast<std::int64_t>(i)},
                    {"input_length", cases[i].input},
                    {"output_length", cases[i].output},
                    {"hash_ids", hashes}}
                   .dump()
            << "\n";
    }
  }
  const e2e::RunResult run =
      e2e::Simulate((dir / "out").string(),
                    {"--cluster", cluster_path, "--trace", (dir / "trace.jsonl").string()});
  ASSERT_EQ(run.exit_code, 0) << run;
  const e2e::Csv simulated = e2e::Csv::Read((dir / "out" / "requests.csv").string());
  ASSERT_EQ(simulated.size(), cases.size());

  // The live frontend, on models with the same KV blocks, the same settings and router.
  FrontendOptions options;
  options.engine = spec->engine;
  options.router.kind = *spec->router;
  std::vector<std::unique_ptr<ForwardModel>> models;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    options.roles.push_back(spec->instances[i].role);
    models.push_back(Model(blocks[i]));
  }
  auto live = LiveFrontend::Start(std::move(models), options);
  ASSERT_TRUE(live.ok()) << live.error();
  int rejected = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + ": " + std::to_string(cases[i].input) + " + " +
                 std::to_string(cases[i].output) + " tokens");
    auto collector = std::make_shared<Collector>();
    const Admission admission = (*live)->Submit(
        {Prompt(static_cast<int>(cases[i].input), static_cast<int>(i)), cases[i].output, {}},
        collector);
    const std::string status = simulated.Get(i, "status");
    if (status == "rejected") {
      ++rejected;
      EXPECT_EQ(admission.status, AdmitStatus::kTooLong) << admission.message;
      EXPECT_EQ(admission.message, simulated.Get(i, "reason"));
      continue;
    }
    EXPECT_EQ(status, "completed");
    ASSERT_EQ(admission.status, AdmitStatus::kAccepted) << admission.message;
    const auto info = collector->Wait();
    ASSERT_TRUE(info);
    EXPECT_NE(info->reason, policies::FinishReason::kError) << info->message;
    ASSERT_GE(info->instance, 0);
    EXPECT_EQ(spec->instances[static_cast<std::size_t>(info->instance)].name,
              simulated.Get(i, "decode_instance"));
  }
  // Colocated: requests 1, 2, 3 and 5 are too long for the small instance; PD: 2, 3 and 5.
  EXPECT_EQ(rejected, pd ? 3 : 4);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AdmissionEquivalence, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Pd" : "Colocated"; });

}  // namespace
}  // namespace duet::backend::serve
