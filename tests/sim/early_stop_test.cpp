// `duet simulate --stop-below-attainment`: a run that cannot reach the attainment stops as soon
// as that is certain; a run that reaches it is the same run as without the flag.
#include <gtest/gtest.h>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

// The bundled colocated cluster cut to `instances` TP1 instances on one node.
std::string Cluster(const TempDir& tmp, int instances) {
  nlohmann::json c = ReadJson(SourceDir() + "/sim/clusters/h100-16colo-llama8b.json");
  c["nodes"][0]["count"] = 1;
  c["instances"][0]["count"] = instances;
  const std::string path = tmp.File("cluster" + std::to_string(instances) + ".json");
  WriteJson(path, c);
  return path;
}

RunResult Simulate(const std::string& cluster, const std::string& out, bool stop) {
  std::vector<std::string> args = {"simulate",
                                   "--cluster",
                                   cluster,
                                   "--trace",
                                   "traces/bundled/default.json",
                                   "--rate-scale",
                                   "6",
                                   "--slo",
                                   "ttft=1000,tpot=50",
                                   "--out",
                                   out,
                                   "--progress",
                                   "never"};
  if (stop) args.insert(args.end(), {"--stop-below-attainment", "0.99"});
  return RunDuet(args);
}

TEST(EarlyStop, ARunThatCannotReachTheAttainmentStopsOnceThatIsCertain) {
  TempDir tmp;
  const std::string cluster = Cluster(tmp, 1);
  ASSERT_EQ(Simulate(cluster, tmp.File("full"), false).exit_code, 0);
  const RunResult r = Simulate(cluster, tmp.File("stop"), true);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("stopped early"), std::string::npos) << r;
  const nlohmann::json full = ReadJson(tmp.File("full/summary.json"));
  const nlohmann::json stop = ReadJson(tmp.File("stop/summary.json"));
  ASSERT_LT(full["goodput"]["attainment"].get<double>(), 0.99) << "the full run must miss";
  EXPECT_FALSE(full["sim"]["stopped_early"].get<bool>());
  EXPECT_TRUE(stop["sim"]["stopped_early"].get<bool>());
  EXPECT_LT(stop["sim"]["simulated_s"].get<double>(), full["sim"]["simulated_s"].get<double>() / 2);
  // Every request counts: those never finished as failed.
  const int total = full["requests"]["total"].get<int>();
  EXPECT_EQ(stop["requests"]["total"], total);
  EXPECT_LT(stop["requests"]["completed"].get<int>(), total);
  // 2,000 requests at 99%: the 21st miss ends the run, so exactly 21 finished requests missed.
  const int finished =
      stop["requests"]["completed"].get<int>() + stop["requests"]["rejected"].get<int>();
  const double met = stop["goodput"]["attainment"].get<double>() * total;
  EXPECT_NEAR(finished - met, 21, 0.5);
}

TEST(EarlyStop, ARunThatReachesTheAttainmentIsTheRunWithoutTheFlag) {
  TempDir tmp;
  const std::string cluster = Cluster(tmp, 6);
  ASSERT_EQ(Simulate(cluster, tmp.File("full"), false).exit_code, 0);
  ASSERT_EQ(Simulate(cluster, tmp.File("stop"), true).exit_code, 0);
  nlohmann::json full = ReadJson(tmp.File("full/summary.json"));
  nlohmann::json stop = ReadJson(tmp.File("stop/summary.json"));
  ASSERT_GE(full["goodput"]["attainment"].get<double>(), 0.99);
  full["sim"].erase("wall_s");
  stop["sim"].erase("wall_s");
  EXPECT_EQ(stop, full);
  EXPECT_EQ(ReadFile(tmp.File("stop/requests.csv")), ReadFile(tmp.File("full/requests.csv")));
}

TEST(EarlyStop, NeedsAnSloAnAttainmentInRangeAndAnOpenLoop) {
  TempDir tmp;
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--stop-below-attainment", "0.9"},
        {"--stop-below-attainment", "1.5", "--slo", "ttft=1000"},
        {"--stop-below-attainment", "0", "--slo", "ttft=1000"},
        {"--stop-below-attainment", "0.9", "--slo", "ttft=1000", "--concurrency", "4"}}) {
    std::vector<std::string> args = {"simulate", "--out", tmp.File("out"), "--progress", "never"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_NE(r.err.find("--stop-below-attainment"), std::string::npos) << r;
  }
  EXPECT_FALSE(fs::exists(tmp.File("out")));
}

}  // namespace
}  // namespace duet::e2e
