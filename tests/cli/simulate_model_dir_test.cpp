// `duet simulate` on the model that `duet generate` runs: a cluster whose "model" is a Hugging
// Face model directory written by `duet make-test-model` completes, reports the directory's
// name as the model, and sizes the KV it moves by engine.kv_cache_dtype ("auto": the weights'
// dtype). A config the simulator cannot size is one clear error naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

class SimulateModelDirTest : public ::testing::Test {
 protected:
  // Writes the test model (weights in `dtype`) to <tmp>/tiny-model.
  std::string MakeModel(const std::string& dtype) {
    const std::string dir = tmp_.File("tiny-model");
    const RunResult made = RunDuet({"make-test-model", "--out", dir, "--dtype", dtype});
    EXPECT_EQ(made.exit_code, 0) << made;
    // The test model's context (256 positions) is shorter than the 2000-token request, which
    // the simulator would reject: lengthen it (the simulation does not read the weights).
    nlohmann::json config = ReadJson(dir + "/config.json");
    config["max_position_embeddings"] = 4096;
    WriteJson(dir + "/config.json", config);
    return dir;
  }
  // tests/data/1p1d-tiny.json with `model` and, unless empty, engine.kv_cache_dtype.
  std::string Cluster(const std::string& name, const std::string& model,
                      const std::string& kv_cache_dtype = "") {
    nlohmann::json doc = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
    doc["model"] = model;
    if (!kv_cache_dtype.empty()) doc["engine"]["kv_cache_dtype"] = kv_cache_dtype;
    const std::string path = tmp_.File(name);
    WriteJson(path, doc);
    return path;
  }
  nlohmann::json Run(const std::string& cluster, const std::string& out) {
    Simulate(tmp_.File(out), {"--cluster", cluster, "--trace", "tests/data/one-request.jsonl"});
    return ReadJson(tmp_.File(out) + "/summary.json");
  }

  TempDir tmp_;
};

TEST_F(SimulateModelDirTest, SimulatesTheTestModelDirectory) {
  const std::string model = MakeModel("BF16");
  const nlohmann::json summary = Run(Cluster("dir.json", model), "out");
  EXPECT_EQ(summary["run"]["model"], "tiny-model");
  EXPECT_EQ(summary["requests"]["completed"], 1);
  // 2 layers x 2 KV heads x head_dim 16, K and V, bf16: 256 bytes per token.
  const std::int64_t bf16_bytes = summary["kv_transfer"]["bytes"].get<std::int64_t>();
  EXPECT_EQ(bf16_bytes, 2000 * 256);  // the request's 2000 prompt tokens

  // Its config.json directly, and a path relative to the cluster file: the same model.
  for (const auto& [name, ref] : {std::pair{"file.json", model + "/config.json"},
                                  std::pair{"relative.json", std::string("./tiny-model")}}) {
    const nlohmann::json other = Run(Cluster(name, ref), std::string("out_") + name);
    EXPECT_EQ(other["run"]["model"], "tiny-model") << ref;
    EXPECT_EQ(other["kv_transfer"], summary["kv_transfer"]) << ref;
  }

  // An fp32 KV cache (the CPU backend's) moves twice the bytes; bfloat16 is what auto chose.
  const nlohmann::json f32 = Run(Cluster("f32.json", model, "float32"), "out_f32");
  EXPECT_EQ(f32["kv_transfer"]["bytes"].get<std::int64_t>(), 2 * bf16_bytes);
  EXPECT_EQ(Run(Cluster("bf16.json", model, "bfloat16"), "out_bf16")["kv_transfer"],
            summary["kv_transfer"]);
}

TEST_F(SimulateModelDirTest, Float32ModelsMoveFloat32KvByDefault) {
  const std::string model = MakeModel("F32");
  const nlohmann::json f32 = Run(Cluster("auto.json", model), "out");
  const nlohmann::json bf16 = Run(Cluster("bf16.json", model, "bfloat16"), "out_bf16");
  EXPECT_EQ(f32["kv_transfer"]["bytes"].get<std::int64_t>(),
            2 * bf16["kv_transfer"]["bytes"].get<std::int64_t>());
}

TEST_F(SimulateModelDirTest, BadModelsAreClearErrors) {
  const std::string model = MakeModel("BF16");
  // A directory without config.json.
  std::filesystem::create_directories(tmp_.File("empty"));
  RunResult r = RunDuet({"simulate", "--cluster", Cluster("empty.json", tmp_.File("empty")),
                         "--trace", "tests/data/one-request.jsonl", "--out", tmp_.File("o1")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"empty.json", "'model'", tmp_.File("empty") + "/config.json"}));
  // A config the simulator cannot size: the field is named.
  nlohmann::json config = ReadJson(model + "/config.json");
  config["num_key_value_heads"] = 3;
  WriteJson(model + "/config.json", config);
  r = RunDuet({"simulate", "--cluster", Cluster("bad.json", model), "--trace",
               "tests/data/one-request.jsonl", "--out", tmp_.File("o2")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"bad.json", "'model'", "config.json", "num_key_value_heads"}));
  // An unknown KV cache dtype.
  r = RunDuet({"simulate", "--cluster", Cluster("dtype.json", "tiny-test", "fp8"), "--trace",
               "tests/data/one-request.jsonl", "--out", tmp_.File("o3")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"dtype.json", "engine", "'kv_cache_dtype'", "fp8"}));
}

}  // namespace
}  // namespace duet::e2e
