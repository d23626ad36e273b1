// Hostile and out-of-range input (issue 12): nothing aborts, nothing exhausts memory, nothing
// wrong exits 0. Every case gets one clear "duet: error:" line naming the file and field (or
// the flag), exit status 1 (input files) or 2 (command line), and writes no output files.
// One test per defect; each failed before its fix.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

constexpr int kInputError = 1;
constexpr int kUsageError = 2;
const char* const kTinyCluster = "tests/data/1p1d-tiny.json";  // tiny-test on tiny-gpu, 1P1D
const char* const kGoodLine =
    R"({"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]})";

// One line, every byte printable (no control characters but the final newline).
::testing::AssertionResult OnePrintableLine(const std::string& err) {
  if (err.empty() || err.back() != '\n') return ::testing::AssertionFailure() << "no line";
  for (std::size_t i = 0; i + 1 < err.size(); ++i) {
    const auto c = static_cast<unsigned char>(err[i]);
    if (c < 0x20 || c == 0x7F)
      return ::testing::AssertionFailure() << "byte " << int(c) << " at " << i << " of:\n" << err;
  }
  return ::testing::AssertionSuccess();
}

class HostileInputTest : public ::testing::Test {
 protected:
  std::string GoodTrace() { return tmp_.Write("good.jsonl", std::string(kGoodLine) + "\n"); }

  // tests/data/1p1d-tiny.json edited by `edit`, written to the temp dir.
  template <typename Edit>
  std::string TinyCluster(const std::string& name, Edit edit) {
    nlohmann::json doc = ReadJson(SourceDir() + "/" + kTinyCluster);
    doc["model"] = SourceDir() + "/models/specs/tiny-test.json";
    for (auto& node : doc["nodes"]) node["gpu"] = SourceDir() + "/models/hardware/tiny-gpu.json";
    edit(doc);
    const std::string path = tmp_.File(name);
    WriteJson(path, doc);
    return path;
  }

  // `duet <args> [--out <tmp>/out]`: the exit code, one error line naming every word, nothing
  // on stdout, no output files.
  RunResult ExpectError(std::vector<std::string> args, int code,
                        std::initializer_list<std::string> words, bool add_out = true) {
    if (add_out) {
      args.push_back("--out");
      args.push_back(out_dir());
    }
    RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, code) << r;
    EXPECT_EQ(r.err.rfind("duet: error: ", 0), 0u) << r;
    EXPECT_TRUE(OnePrintableLine(r.err)) << r;
    EXPECT_TRUE(ContainsAll(r.err, words)) << r;
    EXPECT_TRUE(r.out.empty()) << r;
    EXPECT_FALSE(fs::exists(out_dir())) << "a failed run left " << out_dir();
    return r;
  }

  std::string out_dir() const { return tmp_.File("out"); }
  TempDir tmp_;
};

// ---- Memory ---------------------------------------------------------------------------------

// tiny-test on an H100 has 17 million KV blocks per instance; per-block state for all of them
// took 3.5 GB (and std::bad_alloc on smaller machines). Now memory follows the blocks in use.
TEST_F(HostileInputTest, SmallModelOnLargeGpuStaysSmall) {
  const std::string cluster = TinyCluster("tiny-h100.json", [](nlohmann::json& c) {
    for (auto& node : c["nodes"]) node["gpu"] = "h100-sxm";
  });
  // This run's own peak (wait4), not RUSAGE_CHILDREN's: that is the largest of every child the
  // test binary ran, other tests' included.
  const std::string err = tmp_.File("err");
  const pid_t pid = SpawnDuet(
      {"simulate", "--cluster", cluster, "--trace", "traces/bundled/tiny.json", "--out", out_dir()},
      err);
  ASSERT_GT(pid, 0);
  int status = 0;
  rusage usage{};
  ASSERT_EQ(wait4(pid, &status, 0, &usage), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(err);
  EXPECT_LT(usage.ru_maxrss, 512 * 1024) << "peak resident KB of the run";
}

TEST_F(HostileInputTest, SyntheticSpecTooLargeForMemoryNamesTheField) {
  const std::string many = tmp_.Write(
      "many.json",
      R"({"num_requests": 100000000, "arrival": {"process": "poisson", "rate_per_s": 1000},
                       "input": {"dist": "fixed", "value": 100},
                       "output": {"dist": "fixed", "value": 10}})");
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", many}, kInputError,
              {many, "num_requests", "GiB"});
  const std::string prefix = tmp_.Write(
      "prefix.json", R"({"num_requests": 1000, "arrival": {"process": "poisson", "rate_per_s": 1},
                         "input": {"dist": "fixed", "value": 100},
                         "output": {"dist": "fixed", "value": 10},
                         "prefix": {"groups": 1, "tokens": 1000000000}})");
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", prefix}, kInputError,
              {prefix, "prefix.tokens", "GiB"});
}

// ---- Time -----------------------------------------------------------------------------------

// 1e-310 made every arrival infinite and SimGrid aborted.
TEST_F(HostileInputTest, RateScaleThatPushesArrivalsPastTheHorizon) {
  const std::string trace =
      tmp_.Write("two.jsonl", std::string(kGoodLine) + "\n" +
                                  R"({"timestamp": 1000, "input_length": 10, "output_length": 2, )"
                                  R"("hash_ids": [2]})"
                                  "\n");
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace, "--rate-scale", "1e-310"},
              kUsageError, {"--rate-scale", "horizon"});
}

// A length scale that splits Mooncake's 512-token prefix blocks, or makes a prompt too long.
TEST_F(HostileInputTest, LengthScaleThatBreaksPrefixBlocksOrLengths) {
  const std::string trace = tmp_.Write("one.jsonl", std::string(kGoodLine) + "\n");
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace, "--length-scale", "0.3"},
              kUsageError, {"--length-scale", "153.6 tokens", "k/512"});
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace, "--length-scale", "1e300"},
              kUsageError, {"--length-scale", "request 0's output 1e+301 tokens"});
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace, "--length-scale", "nan"},
              kUsageError, {"--length-scale", "finite and > 0"});
}

TEST_F(HostileInputTest, TimestampPastTheHorizonNamesLineAndField) {
  const std::string trace = tmp_.Write(
      "late.jsonl", std::string(kGoodLine) + "\n" +
                        R"({"timestamp": 1e300, "input_length": 10, "output_length": 2, )"
                        R"("hash_ids": [2]})"
                        "\n");
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace}, kInputError,
              {trace + ":2", "timestamp", "horizon"});
}

// ---- Narrowing and float-to-int conversions of parsed values -------------------------------

TEST_F(HostileInputTest, EngineIntegersAreBoundedNotWrapped) {
  // 2^32 wrapped to 0 sequences: the run deadlocked and reported success.
  const std::string seqs = TinyCluster(
      "seqs.json", [](nlohmann::json& c) { c["engine"]["max_num_seqs"] = 4294967296LL; });
  ExpectError({"simulate", "--cluster", seqs, "--trace", GoodTrace()}, kInputError,
              {seqs, "engine", "max_num_seqs", "4294967296"});
  const std::string block = TinyCluster(
      "block.json", [](nlohmann::json& c) { c["engine"]["block_tokens"] = 4294967312LL; });
  ExpectError({"simulate", "--cluster", block, "--trace", GoodTrace()}, kInputError,
              {block, "block_tokens"});
}

TEST_F(HostileInputTest, ReservedGibThatOverflowsBytesNamesTheField) {
  const std::string cluster =
      TinyCluster("reserved.json", [](nlohmann::json& c) { c["engine"]["reserved_gib"] = 1e10; });
  ExpectError({"simulate", "--cluster", cluster, "--trace", GoodTrace()}, kInputError,
              {cluster, "reserved_gib"});
}

// 1e300 and 1e-300 gave zero or 300-digit durations with exit status 0.
TEST_F(HostileInputTest, LinksEfficienciesAndOverheadsAreBounded) {
  struct Case {
    const char* name;
    void (*edit)(nlohmann::json&);
    const char* field;
  };
  const Case cases[] = {
      {"nic-huge", [](nlohmann::json& c) { c["nodes"][0]["nic"]["bandwidth_GBps"] = 1e300; },
       "bandwidth_GBps"},
      {"nic-tiny", [](nlohmann::json& c) { c["nodes"][0]["nic"]["bandwidth_GBps"] = 1e-300; },
       "bandwidth_GBps"},
      {"switch-latency", [](nlohmann::json& c) { c["network"]["switch"]["latency_us"] = 1e300; },
       "latency_us"},
      {"efficiency", [](nlohmann::json& c) { c["cost_model"]["compute_efficiency"] = 1e-300; },
       "compute_efficiency"},
      {"overhead", [](nlohmann::json& c) { c["cost_model"]["step_overhead_ms"] = 1e300; },
       "step_overhead_ms"},
      {"dram-bw",
       [](nlohmann::json& c) {
         c["tiers"] = {{"dram", {{"capacity_gib", 1}, {"bandwidth_GBps", 1e300}}}};
       },
       "bandwidth_GBps"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string cluster = TinyCluster(std::string(k.name) + ".json", k.edit);
    ExpectError({"simulate", "--cluster", cluster, "--trace", GoodTrace()}, kInputError,
                {cluster, k.field, "between"});
  }
}

// A tier smaller than one KV block dropped every write.
TEST_F(HostileInputTest, TierSmallerThanOneBlock) {
  const std::string cluster = TinyCluster("small-tier.json", [](nlohmann::json& c) {
    c["tiers"] = {{"dram", {{"capacity_gib", 1e-6}}}};  // 1073 bytes; a block is 4096
  });
  ExpectError({"simulate", "--cluster", cluster, "--trace", GoodTrace()}, kInputError,
              {cluster, "tiers.dram", "capacity_gib", "one KV block"});
}

// ---- The model's context --------------------------------------------------------------------

TEST_F(HostileInputTest, RequestsLongerThanTheContextAreRejectedWithAReasonClass) {
  // tiny-test has max_position_embeddings 131072: 5000 tokens cannot be served.
  const std::string trace = tmp_.Write(
      "long.jsonl",
      std::string(kGoodLine) + "\n" +
          R"({"timestamp": 1, "input_length": 140000, "output_length": 10, "hash_ids": []})" +
          "\n" +
          R"({"timestamp": 2, "input_length": 131000, "output_length": 200, "hash_ids": []})" +
          "\n");
  const RunResult r = Simulate(out_dir(), {"--cluster", kTinyCluster, "--trace", trace});
  const Csv csv = Csv::Read(out_dir() + "/requests.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  for (std::size_t i : {1u, 2u}) {
    EXPECT_EQ(csv.Get(i, "status"), "rejected");
    EXPECT_TRUE(ContainsAll(csv.Get(i, "reason"),
                            {"exceeds the model's context", "max_position_embeddings 131072"}));
  }
  const nlohmann::json s = ReadJson(out_dir() + "/summary.json");
  EXPECT_EQ(s["requests"]["rejected_reasons"],
            nlohmann::json({{"exceeds the model's context", 2}}));
  EXPECT_TRUE(ContainsAll(r.out, {"rejected 2: exceeds the model's context"}));
}

// rejected_reasons was keyed by each request's full reason, numbers included.
TEST_F(HostileInputTest, RejectedReasonsAreCountedByClass) {
  const std::string cluster = TinyCluster("small.json", [](nlohmann::json& c) {
    // 0.0012 GiB less 280 KB of weights: about 3,900 tokens of KV at 256 bytes a token.
    c["engine"]["gpu_memory_utilization"] = 0.25;
    c["engine"]["reserved_gib"] = 0.2488;
  });
  std::string trace = std::string(kGoodLine) + "\n";
  for (int i = 1; i <= 3; ++i) {
    // Within the context but not within an instance's KV capacity.
    trace += nlohmann::json({{"timestamp", i},
                             {"input_length", 3000 + i},
                             {"output_length", 1000},
                             {"hash_ids", nlohmann::json::array()}})
                 .dump() +
             "\n";
  }
  const std::string trace_path = tmp_.Write("big.jsonl", trace);
  Simulate(out_dir(), {"--cluster", cluster, "--trace", trace_path});
  const nlohmann::json s = ReadJson(out_dir() + "/summary.json");
  ASSERT_EQ(s["requests"]["rejected"], 3) << s["requests"];
  EXPECT_EQ(s["requests"]["rejected_reasons"], nlohmann::json({{"exceeds KV capacity", 3}}));
  const Csv csv = Csv::Read(out_dir() + "/requests.csv");
  EXPECT_TRUE(ContainsAll(csv.Get(1, "reason"), {"exceeds KV capacity: needs 4001 KV tokens"}));
}

// ---- Reports --------------------------------------------------------------------------------

// With no completed request, the latency percentiles printed 0.0.
TEST_F(HostileInputTest, NoCompletedRequestGivesNullLatencies) {
  const std::string trace =
      tmp_.Write("long.jsonl",
                 R"({"timestamp": 0, "input_length": 140000, "output_length": 10, "hash_ids": []})"
                 "\n");
  const RunResult r = Simulate(out_dir(), {"--cluster", kTinyCluster, "--trace", trace});
  const nlohmann::json s = ReadJson(out_dir() + "/summary.json");
  EXPECT_EQ(s["requests"]["completed"], 0);
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}) {
    for (const char* stat : {"mean", "p50", "p90", "p99", "max"})
      EXPECT_TRUE(s[key][stat].is_null()) << key << "." << stat << " = " << s[key][stat];
  }
  EXPECT_TRUE(s["kv_transfer"]["time_ms"]["mean"].is_null());
  EXPECT_TRUE(s["ttft_breakdown_ms"]["queue"]["mean"].is_null());
  const std::string ttft_line = r.out.substr(
      r.out.find("TTFT ms"), r.out.find('\n', r.out.find("TTFT ms")) - r.out.find("TTFT ms"));
  EXPECT_TRUE(ContainsAll(ttft_line, {"mean       n/a", "p99       n/a"})) << r.out;
}

// A 1 MB line of binary garbage was echoed whole into the error message.
TEST_F(HostileInputTest, ErrorsQuoteABoundedPrintableExcerpt) {
  std::string garbage = "{\"timestamp\": \"";
  for (int i = 0; i < (1 << 20); ++i) garbage += static_cast<char>(i % 251 + 1);
  const std::string trace = tmp_.Write("garbage.jsonl", std::string(kGoodLine) + "\n" + garbage);
  const RunResult r = ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", trace},
                                  kInputError, {trace + ":2", "invalid JSON"});
  EXPECT_LT(r.err.size(), 1000u) << r.err.size() << " bytes";
  // The same for an Azure trace's raw fields, and a positional argument.
  const std::string azure = tmp_.Write(
      "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,\x1b[31m" +
                     std::string(5000, 'x') + ",5\n");
  const RunResult a = ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", azure},
                                  kInputError, {azure + ":2", "ContextTokens", "\\x1b"});
  EXPECT_LT(a.err.size(), 1000u) << a.err.size() << " bytes";
}

// Outputs were written in place: a failure half-way left some of them behind.
TEST_F(HostileInputTest, AFailedWriteLeavesNoOutputFiles) {
  fs::create_directories(fs::path(out_dir()) / "summary.json");  // cannot become a file
  const RunResult r =
      RunDuet({"simulate", "--cluster", kTinyCluster, "--trace", GoodTrace(), "--out", out_dir()});
  EXPECT_EQ(r.exit_code, kInputError) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"duet: error: ", "summary.json"})) << r;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out_dir())) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"summary.json"}) << "the run wrote some files";
}

// ---- The command line -----------------------------------------------------------------------

TEST_F(HostileInputTest, EveryCommandPrintsItsHelp) {
  for (const char* command : {"simulate", "replay", "generate", "make-test-model", "version"}) {
    for (const char* flag : {"--help", "-h"}) {
      const RunResult r = RunDuet({command, flag});
      EXPECT_EQ(r.exit_code, 0) << r;
      EXPECT_TRUE(ContainsAll(r.out, {std::string("duet ") + command})) << r;
      EXPECT_EQ(r.out.find("duet 0.1.0"), std::string::npos) << "help, not the version\n" << r;
    }
  }
}

// `duet simulate trace.csv` simulated the bundled trace.
TEST_F(HostileInputTest, PositionalArgumentsAreRejected) {
  ExpectError({"simulate", "trace.csv"}, kUsageError, {"unexpected argument 'trace.csv'"});
  ExpectError({"generate", "--model", "m", "--prompt", "p", "extra"}, kUsageError,
              {"unexpected argument 'extra'"}, /*add_out=*/false);
  ExpectError({"version", "extra"}, kUsageError, {"unexpected argument 'extra'"},
              /*add_out=*/false);
}

// boost's error message substitution looped forever on a token holding one of its own
// placeholders (found by fuzz/cli_args_fuzz.cpp).
TEST_F(HostileInputTest, OptionNamedLikeABoostPlaceholder) {
  ExpectError({"simulate", "--x%canonical_option%"}, kUsageError, {"unrecognised option"});
  ExpectError({"simulate", "--router", "%value%", "--limit", "x%option%"}, kUsageError,
              {"--limit"});
}

TEST_F(HostileInputTest, NegativeValuesOfUnsignedFlagsAreRejected) {
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", GoodTrace(), "--limit", "-1"},
              kUsageError, {"--limit", "'-1'"});
  ExpectError({"simulate", "--cluster", kTinyCluster, "--trace", GoodTrace(), "--seed", "-1"},
              kUsageError, {"--seed", "'-1'"});
}

TEST_F(HostileInputTest, ClusterThatIsADirectory) {
  const std::string dir = tmp_.File("cluster.json");
  fs::create_directories(dir);
  ExpectError({"simulate", "--cluster", dir, "--trace", GoodTrace()}, kInputError,
              {dir, "is a directory"});
}

// ---- duet generate --------------------------------------------------------------------------

class HostileGenerateTest : public HostileInputTest {
 protected:
  void SetUp() override {
    model_ = tmp_.File("model");
    const RunResult made = RunDuet({"make-test-model", "--out", model_});
    ASSERT_EQ(made.exit_code, 0) << made;
  }
  std::vector<std::string> Args(std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--model", model_, "--prompt", "Hello there"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::string model_;
};

TEST_F(HostileGenerateTest, SamplingAndThreadFlagsAreChecked) {
  // -1 aborted on an invariant; 100000 threads were started.
  ExpectError(Args({"--top-k", "-1"}), kUsageError, {"--top-k"}, false);
  ExpectError(Args({"--threads", "-1"}), kUsageError, {"--threads", "cores"}, false);
  ExpectError(Args({"--threads", "100000"}), kUsageError, {"--threads", "cores"}, false);
}

TEST_F(HostileGenerateTest, SizesAreCheckedBeforeAllocating) {
  // Both ended in a bare std::bad_alloc. The test model's context is 256 tokens.
  ExpectError(Args({"--max-tokens", "99999999999"}), kUsageError,
              {"--max-tokens", "max_position_embeddings"}, false);
  ExpectError(Args({"--kv-blocks", "99999999999"}), kUsageError, {"--kv-blocks", "memory"}, false);
}

TEST_F(HostileGenerateTest, PromptLongerThanTheContext) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "Hello there ";
  ExpectError({"generate", "--model", model_, "--prompt", prompt}, kUsageError,
              {"--prompt", "max_position_embeddings"}, false);
}

TEST_F(HostileGenerateTest, KvBlocksFlagIsCheckedNotRaised) {
  ExpectError(Args({"--kv-blocks", "-1"}), kUsageError, {"--kv-blocks"}, false);
  // 1 block was silently raised to what the prompt needs.
  ExpectError(Args({"--kv-blocks", "1"}), kUsageError, {"--kv-blocks", "at least"}, false);
}

TEST_F(HostileGenerateTest, UnwritableTimingsFailBeforeTheRun) {
  const std::string timings = tmp_.File("no-such-dir/steps.jsonl");
  const RunResult r = ExpectError(Args({"--timings", timings}), kInputError, {"--timings"}, false);
  EXPECT_TRUE(r.out.empty()) << "the model ran first\n" << r;
}

}  // namespace
}  // namespace duet::e2e
