// `duet make-test-model` and `duet generate` as a user runs them: a model written, a prompt
// continued with a step-timing file; and bad model directories (missing, corrupt safetensors,
// missing tensor, broken tokenizer.json) giving one clear error line and exit status 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

namespace fs = std::filesystem;

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.File("model");
    const RunResult made = RunDuet({"make-test-model", "--out", model_});
    ASSERT_EQ(made.exit_code, 0) << made;
  }
  RunResult Generate(const std::string& model, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"generate",    "--model",      model, "--prompt",
                                     "Hello there", "--max-tokens", "5"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunDuet(args);
  }
  // A copy of the test model to break.
  std::string Copy(const std::string& name) {
    const std::string dir = tmp_.File(name);
    fs::copy(model_, dir, fs::copy_options::recursive);
    return dir;
  }
  void ExpectError(const RunResult& r, std::initializer_list<std::string> words) {
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_NE(r.err.find("duet: error:"), std::string::npos) << r;
    for (const auto& w : words) EXPECT_NE(r.err.find(w), std::string::npos) << w << "\n" << r;
  }

  TempDir tmp_;
  std::string model_;
};

TEST_F(GenerateTest, ContinuesAPromptAndRecordsStepTimings) {
  const std::string timings = tmp_.File("steps.jsonl");
  const RunResult r = Generate(model_, {"--timings", timings});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("5 generated"), std::string::npos) << r;
  std::ifstream in(timings);
  std::string line;
  std::vector<nlohmann::json> steps;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 5u);  // one prefill step, then four decode steps
  EXPECT_FALSE(steps[0]["prefill"].empty());
  for (std::size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["decode_tokens"], 1);
    EXPECT_GT(steps[i]["seconds"].get<double>(), 0);
  }
}

// --warmup runs the prompt once before the timed run: the output and the recorded steps are
// those of a run without it (nothing it wrote reaches the prefix cache or the text).
TEST_F(GenerateTest, WarmupLeavesTheOutputAndTimingsAsWithout) {
  const std::string timings = tmp_.File("warm.jsonl");
  // A prompt long enough for the tiled prefill attention.
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "generate",
        "--model",
        model_,
        "--max-tokens",
        "5",
        "--prompt",
        "One two three four five six seven eight nine ten eleven twelve thirteen."};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunDuet(args);
  };
  const RunResult cold = run({});
  const RunResult warm = run({"--warmup", "--timings", timings});
  ASSERT_EQ(warm.exit_code, 0) << warm;
  EXPECT_EQ(warm.out, cold.out);
  std::ifstream in(timings);
  std::string line;
  std::vector<nlohmann::json> steps;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 5u);
  // The whole prompt computed in the timed run, none of it taken from the prefix cache.
  const auto& prefill = steps[0]["prefill"][0];
  EXPECT_GE(prefill[0].get<std::int64_t>(), 32) << steps[0];
  EXPECT_EQ(prefill[1].get<std::int64_t>(), 0) << steps[0];
}

TEST_F(GenerateTest, GreedyIsDeterministicAndSamplingFollowsTheSeed) {
  EXPECT_EQ(Generate(model_).out, Generate(model_).out);
  const auto a = Generate(model_, {"--temperature", "1", "--seed", "7"});
  const auto b = Generate(model_, {"--temperature", "1", "--seed", "7"});
  const auto c = Generate(model_, {"--temperature", "1", "--seed", "8"});
  ASSERT_EQ(a.exit_code, 0) << a;
  EXPECT_EQ(a.out, b.out);
  // The test model's next-token distribution is nearly flat: another seed samples differently.
  EXPECT_NE(a.out, c.out);
}

// Sampling at temperature 1 meets an end-of-sequence id now and then, which ends the request
// early; --ignore-eos always generates --max-tokens.
TEST_F(GenerateTest, IgnoreEosGeneratesMaxTokens) {
  auto generated = [](const RunResult& r) {
    const auto at = r.err.find(" generated");
    EXPECT_NE(at, std::string::npos) << r;
    const auto start = r.err.rfind(' ', at - 1) + 1;
    return std::stoi(r.err.substr(start, at - start));
  };
  auto run = [&](int seed, bool ignore_eos) {
    std::vector<std::string> args = {
        "generate", "--model",       model_, "--prompt", "Hello there",       "--max-tokens",
        "200",      "--temperature", "1",    "--seed",   std::to_string(seed)};
    if (ignore_eos) args.push_back("--ignore-eos");
    return RunDuet(args);
  };
  int stopped_seed = -1;
  for (int seed = 1; seed <= 40 && stopped_seed < 0; ++seed) {
    const RunResult r = run(seed, false);
    ASSERT_EQ(r.exit_code, 0) << r;
    if (generated(r) < 200) stopped_seed = seed;
  }
  ASSERT_GE(stopped_seed, 0) << "no seed met an end-of-sequence id in 200 tokens";
  const RunResult r = run(stopped_seed, true);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(generated(r), 200);
}

TEST_F(GenerateTest, MissingModelDirectory) { ExpectError(Generate(tmp_.File("nope")), {"nope"}); }

TEST_F(GenerateTest, TruncatedSafetensorsHeader) {
  const std::string dir = Copy("truncated");
  fs::resize_file(dir + "/model.safetensors", 5);
  ExpectError(Generate(dir), {"model.safetensors"});
}

TEST_F(GenerateTest, CorruptSafetensorsHeader) {
  const std::string dir = Copy("corrupt");
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("#garbage", 8);  // the JSON header no longer parses
  f.close();
  ExpectError(Generate(dir), {"model.safetensors"});
}

TEST_F(GenerateTest, ConfigNamingAnUnsupportedArchitecture) {
  const std::string dir = Copy("arch");
  auto config = ReadJson(dir + "/config.json");
  config["architectures"] = {"GPTNeoXForCausalLM"};
  config["model_type"] = "gpt_neox";
  WriteJson(dir + "/config.json", config);
  ExpectError(Generate(dir), {"gpt_neox"});
}

TEST_F(GenerateTest, ConfigWhoseShapesDisagreeWithTheWeights) {
  const std::string dir = Copy("shape");
  auto config = ReadJson(dir + "/config.json");
  config["intermediate_size"] = config["intermediate_size"].get<int>() + 8;
  WriteJson(dir + "/config.json", config);
  ExpectError(Generate(dir), {"mlp"});
}

TEST_F(GenerateTest, MalformedTokenizerJson) {
  const std::string dir = Copy("tokenizer");
  WriteFile(dir + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": 3}}");
  ExpectError(Generate(dir), {"tokenizer.json"});
}

TEST_F(GenerateTest, BadFlagsAreUsageErrors) {
  for (std::vector<std::string> extra : {std::vector<std::string>{"--max-tokens", "0"},
                                         {"--top-p", "0"},
                                         {"--temperature", "-1"},
                                         {"--device", "tpu"}}) {
    const RunResult r = Generate(model_, extra);
    EXPECT_EQ(r.exit_code, 2) << r;
  }
  EXPECT_EQ(RunDuet({"make-test-model", "--out", tmp_.File("x"), "--dtype", "I8"}).exit_code, 2);
}

// --device cuda runs on a GPU where there is one; elsewhere it fails with the reason and no
// partial output.
TEST_F(GenerateTest, CudaDeviceRunsOrSaysWhyNot) {
  const RunResult r = Generate(model_, {"--device", "cuda"});
  if (r.exit_code == 0) {
    EXPECT_NE(r.err.find("on cuda"), std::string::npos) << r;
    return;
  }
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(r.err.find("--device cuda: CUDA model: no CUDA device") != std::string::npos ||
              r.err.find("--device cuda: this build has no CUDA backend") != std::string::npos)
      << r;
  EXPECT_TRUE(r.out.empty()) << r;
}

}  // namespace
}  // namespace duet::e2e
