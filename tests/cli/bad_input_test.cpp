// End-to-end tests of `duet simulate` on bad input: every case must exit non-zero, print one
// error that says what is wrong and where (file, line and field for trace lines; file and field
// for cluster files; the flag for command-line values), and write nothing to the --out dir.
// The bad files are written to a temporary directory at test time.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

const char* const kBundledCluster = "sim/clusters/h100-8p8d-llama8b.json";
const char* const kGoodLine =
    R"({"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]})";
const char* const kGoodLine2 =
    R"({"timestamp": 5, "input_length": 200, "output_length": 20, "hash_ids": [2]})";

class BadInputTest : public ::testing::Test {
 protected:
  // A valid one-line trace, for cases where the trace is not what is under test.
  std::string GoodTrace() { return tmp_.Write("good.jsonl", std::string(kGoodLine) + "\n"); }

  // The bundled PD cluster, edited by `edit` and written to the temp dir.
  template <typename Edit>
  std::string ClusterVariant(const std::string& name, Edit edit) {
    nlohmann::json doc = ReadJson(SourceDir() + "/" + kBundledCluster);
    edit(doc);
    const std::string path = tmp_.File(name);
    WriteJson(path, doc);
    return path;
  }

  // Runs `duet simulate args... --out <tmp>/out` and checks the common contract: a non-zero
  // exit with the expected code, one "duet: error:" line on stderr, nothing on stdout, and no
  // summary.json / requests.csv.
  RunResult ExpectFailure(std::vector<std::string> args, int expected_code) {
    args.insert(args.begin(), "simulate");
    args.push_back("--out");
    args.push_back(out_dir());
    RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, expected_code) << r;
    EXPECT_NE(r.err.find("duet: error: "), std::string::npos) << r;
    EXPECT_TRUE(r.out.empty()) << r;
    ExpectNoOutputFiles();
    return r;
  }

  void ExpectNoOutputFiles() {
    EXPECT_FALSE(fs::exists(fs::path(out_dir()) / "summary.json")) << out_dir();
    EXPECT_FALSE(fs::exists(fs::path(out_dir()) / "requests.csv")) << out_dir();
  }

  std::string out_dir() const { return tmp_.File("out"); }

  TempDir tmp_;
};

constexpr int kInputError = 1;  // bad input files
constexpr int kUsageError = 2;  // bad command line

TEST_F(BadInputTest, MalformedTraceLineNamesFileAndLine) {
  const std::string trace =
      tmp_.Write("malformed.jsonl", std::string(kGoodLine) + "\n" + kGoodLine2 + "\nnot json\n");
  const RunResult r = ExpectFailure({"--cluster", kBundledCluster, "--trace", trace}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {trace + ":3:", "JSON"}));
}

TEST_F(BadInputTest, TraceLineMissingFieldNamesFieldAndLine) {
  const std::string trace =
      tmp_.Write("missing.jsonl", std::string(kGoodLine) + "\n" +
                                      R"({"timestamp": 7, "output_length": 5, "hash_ids": [3]})" +
                                      "\n" + kGoodLine2 + "\n");
  const RunResult r = ExpectFailure({"--cluster", kBundledCluster, "--trace", trace}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {trace + ":2:", "input_length", "missing"}));
}

TEST_F(BadInputTest, UnknownTraceFormat) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--trace-format", "parquet"},
      kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"trace format", "'parquet'", "mooncake"}));
}

TEST_F(BadInputTest, TraceExtensionWithoutFormat) {
  const std::string trace = tmp_.Write("trace.txt", std::string(kGoodLine) + "\n");
  const RunResult r = ExpectFailure({"--cluster", kBundledCluster, "--trace", trace}, kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {trace, "--trace-format"}));
}

TEST_F(BadInputTest, ClusterNodeMissingGpus) {
  const std::string cluster =
      ClusterVariant("no-gpus.json", [](nlohmann::json& c) { c["nodes"][0].erase("gpus"); });
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster, "nodes[0]", "'gpus'", "missing"}));
}

TEST_F(BadInputTest, ClusterNegativeNicBandwidth) {
  const std::string cluster = ClusterVariant(
      "negative-bw.json", [](nlohmann::json& c) { c["nodes"][0]["nic"]["bandwidth_GBps"] = -5; });
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster, "nodes[0].nic", "bandwidth_GBps", "-5"}));
}

TEST_F(BadInputTest, ClusterBadKvLeaseAndFailurePolicy) {
  const std::string lease =
      ClusterVariant("lease.json", [](nlohmann::json& c) { c["engine"]["kv_lease_s"] = 0; });
  RunResult r = ExpectFailure({"--cluster", lease, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {lease, "engine", "kv_lease_s"}));
  const std::string policy = ClusterVariant(
      "policy.json", [](nlohmann::json& c) { c["engine"]["kv_load_failure_policy"] = "retry"; });
  r = ExpectFailure({"--cluster", policy, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {policy, "kv_load_failure_policy", "fail or recompute", "retry"}));
}

TEST_F(BadInputTest, ClusterNotJson) {
  const std::string cluster = tmp_.Write("broken.json", "{\"name\": \"x\", \"nodes\": [\n");
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster}));
}

TEST_F(BadInputTest, ModelDoesNotFitInGpuMemory) {
  const std::string cluster = ClusterVariant("70b-tp1.json", [](nlohmann::json& c) {
    c["model"] = "llama-3.1-70b";
    for (auto& group : c["instances"]) group["tp"] = 1;
  });
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster, "llama-3.1-70b", "h100-sxm", "does not fit"}));
}

TEST_F(BadInputTest, UnknownModelName) {
  const std::string cluster =
      ClusterVariant("no-model.json", [](nlohmann::json& c) { c["model"] = "no-such-model"; });
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster, "'model'", "no-such-model"}));
}

TEST_F(BadInputTest, SloValueNotANumber) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--slo", "ttft=abc"}, kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--slo", "ttft", "'abc'"}));
}

TEST_F(BadInputTest, SloItemWithoutEquals) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--slo", "ttft=100,tpot"},
      kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--slo", "'tpot'", "KEY=MILLISECONDS"}));
}

TEST_F(BadInputTest, SloUnknownKey) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--slo", "ttft=100,latency=5"},
      kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--slo", "unknown key", "'latency'"}));
}

TEST_F(BadInputTest, SloNonPositiveValue) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--slo", "tpot=-3"}, kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--slo", "tpot", "'-3'"}));
}

TEST_F(BadInputTest, UnknownRouter) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--router", "random-walk"},
      kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--router", "'random-walk'", "round-robin"}));
}

TEST_F(BadInputTest, BadRouterOptions) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expected;
  };
  for (const Case& c : std::vector<Case>{
           {{"--router-decode-weight", "-1"}, {"--router-*", "decode weight", "-1"}},
           {{"--router-temperature", "nan"}, {"--router-*", "temperature"}},
           {{"--router-load-guard", "0.5"}, {"--router-*", "load guard", "above 1"}},
           {{"--router-queue-weight", "0", "--router-decode-weight", "0"}, {"both 0"}},
           {{"--router-staleness-ms", "-5"}, {"--router-staleness-ms", "[0, 3600000]"}},
           {{"--router-staleness-ms", "inf"}, {"--router-staleness-ms"}},
           {{"--router-footprint-weight", "-1"}, {"--router-*", "footprint weight"}},
           {{"--router-interference-weight", "nan"}, {"--router-*", "interference weight"}},
           {{"--router-footprint-window", "0"}, {"--router-*", "footprint window", "(0, 3600]"}},
       }) {
    std::vector<std::string> args = {"--cluster", kBundledCluster, "--trace",
                                     GoodTrace(), "--router",      "kv-aware"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = ExpectFailure(args, kUsageError);
    for (const std::string& e : c.expected) EXPECT_TRUE(ContainsAll(r.err, {e})) << c.args[0];
  }
}

// A timeline or step log that cannot be written stops the run before it starts: nothing is
// written.
TEST_F(BadInputTest, UnwritableTimelineOrStepLog) {
  const std::string missing_dir = tmp_.File("no-such-dir") + "/t.json";
  RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--timeline", missing_dir},
      kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {missing_dir, "cannot write the timeline"}));
  r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--timeline", tmp_.path().string()},
      kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {"cannot write the timeline"}));
  r = ExpectFailure({"--cluster", kBundledCluster, "--trace", GoodTrace(), "--timeline", ""},
                    kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--timeline needs a file name"}));
  r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--step-log", missing_dir},
      kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {missing_dir, "cannot write the step log"}));
  r = ExpectFailure({"--cluster", kBundledCluster, "--trace", GoodTrace(), "--step-log", ""},
                    kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--step-log needs a file name"}));
}

TEST_F(BadInputTest, UnknownOption) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--no-such-flag", "1"}, kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"no-such-flag"}));
}

TEST_F(BadInputTest, BadProgressValue) {
  const RunResult r = ExpectFailure(
      {"--cluster", kBundledCluster, "--trace", GoodTrace(), "--progress", "sometimes"},
      kUsageError);
  EXPECT_TRUE(ContainsAll(r.err, {"--progress"}));
}

TEST_F(BadInputTest, MissingTraceFile) {
  const std::string trace = tmp_.File("does-not-exist.jsonl");
  const RunResult r = ExpectFailure({"--cluster", kBundledCluster, "--trace", trace}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {trace, "cannot open"}));
}

TEST_F(BadInputTest, MissingClusterFile) {
  const std::string cluster = tmp_.File("no-cluster.json");
  const RunResult r = ExpectFailure({"--cluster", cluster, "--trace", GoodTrace()}, kInputError);
  EXPECT_TRUE(ContainsAll(r.err, {cluster}));
}

TEST_F(BadInputTest, UnknownSubcommand) {
  const RunResult r = RunDuet({"simulat", "--out", out_dir()});
  EXPECT_EQ(r.exit_code, kUsageError) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"duet: error: ", "unknown command 'simulat'"}));
  EXPECT_TRUE(ContainsAll(r.out, {"usage: duet", "simulate"}));
  ExpectNoOutputFiles();
}

TEST_F(BadInputTest, NoSubcommandPrintsUsage) {
  const RunResult r = RunDuet({});
  EXPECT_EQ(r.exit_code, kUsageError) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"usage: duet"}));
}

}  // namespace
}  // namespace duet::e2e
