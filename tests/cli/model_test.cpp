// `duet model`: a model's sizes and memory plan from the command line are the ones the
// simulator plans with (models::ModelSpec, models::PlanInstanceMemory), in JSON and as text;
// a plan that does not fit and a bad flag fail with one error line and the usual exit codes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "models/model_spec.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

TEST(ModelCli, PrintsTheSizesAndPlanTheSimulatorUses) {
  const RunResult r =
      RunDuet({"model", "--model", "deepseek-v3", "--gpu", "h200", "--dp", "8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  Result<models::ModelSpec> spec =
      models::LoadModelSpec(SourceDir() + "/models/specs/deepseek-v3.json");
  Result<models::HardwareSpec> gpu =
      models::LoadHardwareSpec(SourceDir() + "/models/hardware/h200.json");
  ASSERT_TRUE(spec.ok() && gpu.ok());
  EXPECT_EQ(doc["parameters"].get<std::int64_t>(), spec->ParamCount());
  EXPECT_EQ(doc["active_parameters"].get<std::int64_t>(), spec->ActiveParamCount());
  EXPECT_EQ(doc["weight_bytes"].get<std::int64_t>(), spec->WeightBytes());
  EXPECT_EQ(doc["kv_bytes_per_token"].get<std::int64_t>(), 70272);
  EXPECT_EQ(doc["attention"], "mla");
  EXPECT_EQ(doc["experts"]["routed"], 256);
  EXPECT_EQ(doc["weights"]["routed_experts"]["parameters"].get<std::int64_t>(),
            spec->Weights().routed_experts.params);
  models::MemoryOptions options;
  options.dp = 8;
  Result<models::InstanceMemory> plan = models::PlanInstanceMemory(*spec, *gpu, options);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(doc["plan"]["gpus"], 8);
  EXPECT_EQ(doc["plan"]["kv_tokens"].get<std::int64_t>(), plan->kv_tokens);
  EXPECT_EQ(doc["plan"]["weight_bytes_per_gpu"].get<std::int64_t>(), plan->weight_bytes_per_gpu);

  const RunResult text = RunDuet({"model", "--model", "qwen3-30b-a3b"});
  ASSERT_EQ(text.exit_code, 0) << text;
  EXPECT_TRUE(ContainsAll(text.out, {"qwen3-30b-a3b: 30.53 B parameters (3.35 B active per token)",
                                     "8 of 128 experts per token", "98304 bytes per token"}));
}

TEST(ModelCli, PlansThatDoNotFitAndBadFlagsFail) {
  RunResult r = RunDuet({"model", "--model", "llama-3.1-70b", "--gpu", "h100-sxm"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"duet: error: ", "does not fit on h100-sxm"}));
  EXPECT_TRUE(r.out.empty());
  r = RunDuet({"model", "--model", "llama-3.1-8b", "--kv-cache-dtype", "int3"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"--kv-cache-dtype", "int3"}));
  r = RunDuet({"model", "--model", "no-such-model"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"no-such-model.json"}));
  r = RunDuet({"model"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

}  // namespace
}  // namespace duet::e2e
