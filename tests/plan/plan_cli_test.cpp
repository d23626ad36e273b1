// `duet plan` end to end on the bundled trace at 6x its rate: the answer it gives is checked by
// simulating the winner and its cheaper neighbours in full, a second run resumes from the
// results directory, and an exhaustive search agrees with the pruned one.
#include <gtest/gtest.h>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

std::vector<std::string> PlanArgs(const std::string& out) {
  return {"plan",
          "--trace",
          "traces/bundled/default.json",
          "--rate-scale",
          "6",
          "--slo",
          "ttft=1000,tpot=50",
          "--max-gpus",
          "6",
          "--tp",
          "1,2",
          "--token-budgets",
          "8192",
          "--dram-gib",
          "0",
          "--ssd-tib",
          "0",
          "--routers",
          "kv-aware",
          "--rates",
          "1,2",
          "--jobs",
          "2",
          "--progress",
          "never",
          "--out",
          out};
}

// The attainment of a full run (no early stop) of `cluster` on the planned traffic.
double Attainment(const TempDir& tmp, const std::string& cluster, const std::string& name) {
  const RunResult r = RunDuet(
      {"simulate", "--cluster", cluster, "--trace", "traces/bundled/default.json", "--rate-scale",
       "6", "--slo", "ttft=1000,tpot=50", "--out", tmp.File(name), "--progress", "never"});
  EXPECT_EQ(r.exit_code, 0) << r;
  const nlohmann::json s = ReadJson(tmp.File(name + "/summary.json"));
  EXPECT_FALSE(s["sim"]["stopped_early"].get<bool>());
  return s["goodput"]["attainment"].get<double>();
}

TEST(PlanCli, TheWinnerMeetsTheTargetAndEveryCheaperNeighbourMisses) {
  TempDir tmp;
  const RunResult r = RunDuet(PlanArgs(tmp.File("plan")));
  ASSERT_EQ(r.exit_code, 0) << r;
  const nlohmann::json plan = ReadJson(tmp.File("plan/plan.json"));
  ASSERT_TRUE(plan["winner"].is_object()) << plan.dump(2);
  const nlohmann::json winner = ReadJson(plan["winner"]["cluster"].get<std::string>());
  EXPECT_EQ(winner["router"], "kv-aware");
  EXPECT_GE(Attainment(tmp, plan["winner"]["cluster"], "winner"), 0.99);
  ASSERT_FALSE(plan["neighbours"].empty()) << "a winner with nothing cheaper next to it";
  for (const auto& n : plan["neighbours"]) {
    EXPECT_LT(n["cost_per_hour"].get<double>(), plan["winner"]["cost_per_hour"].get<double>());
    EXPECT_LT(Attainment(tmp, n["cluster"], n["key"]), 0.99) << n.dump();
  }
  // The frontier's cost does not fall as the rate rises, and its first point is the winner.
  ASSERT_FALSE(plan["frontier"].empty());
  EXPECT_EQ(plan["frontier"][0]["key"], plan["winner"]["key"]);
  for (std::size_t k = 1; k < plan["frontier"].size(); ++k)
    EXPECT_GE(plan["frontier"][k]["cost_per_hour"].get<double>(),
              plan["frontier"][k - 1]["cost_per_hour"].get<double>());
  EXPECT_NE(r.out.find("winner: "), std::string::npos) << r;
}

// Another model and GPU than the base's profile: the bundled profile of that pair where there
// is one (its TP degrees the only ones left), else the roofline.
TEST(PlanCli, PricesAnotherModelAndGpuWithTheirBundledProfile) {
  TempDir tmp;
  std::vector<std::string> args = PlanArgs(tmp.File("plan"));
  args.insert(args.end(), {"--model", "qwen3-32b", "--gpu", "h200", "--limit", "20"});
  RunResult r = RunDuet(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("pricing steps with the bundled profile h200-qwen3-32b"), std::string::npos)
      << r;
  const nlohmann::json inputs = ReadJson(tmp.File("plan/inputs.json"));
  EXPECT_EQ(inputs.dump().find("roofline"), std::string::npos) << inputs.dump(2);
  const nlohmann::json winner =
      ReadJson(ReadJson(tmp.File("plan/plan.json"))["winner"]["cluster"].get<std::string>());
  EXPECT_EQ(winner["cost_model"]["profile"], "h200-qwen3-32b");
  EXPECT_EQ(winner["model"], "qwen3-32b");

  args = PlanArgs(tmp.File("plan-b200"));
  args.insert(args.end(), {"--model", "llama-3.1-8b", "--gpu", "b200", "--limit", "20"});
  r = RunDuet(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("no bundled one is of llama-3.1-8b on b200: pricing steps with the "
                       "roofline"),
            std::string::npos)
      << r;
}

TEST(PlanCli, ResumesFromItsResultsDirectoryAndAgreesWithAnExhaustiveSearch) {
  TempDir tmp;
  ASSERT_EQ(RunDuet(PlanArgs(tmp.File("plan"))).exit_code, 0);
  const nlohmann::json first = ReadJson(tmp.File("plan/plan.json"));
  EXPECT_GT(first["simulated"].get<int>(), 0);

  const RunResult again = RunDuet(PlanArgs(tmp.File("plan")));
  ASSERT_EQ(again.exit_code, 0) << again;
  const nlohmann::json second = ReadJson(tmp.File("plan/plan.json"));
  EXPECT_EQ(second["simulated"], 0) << "a resumed search simulated again";
  EXPECT_GT(second["resumed"].get<int>(), 0);
  EXPECT_EQ(second["frontier"], first["frontier"]);

  std::vector<std::string> args = PlanArgs(tmp.File("exhaustive"));
  args.push_back("--exhaustive");
  const RunResult full = RunDuet(args);
  ASSERT_EQ(full.exit_code, 0) << full;
  const nlohmann::json all = ReadJson(tmp.File("exhaustive/plan.json"));
  EXPECT_EQ(all["simulated"], all["candidates"].get<int>() * 2) << "every candidate at each rate";
  EXPECT_LT(first["simulated"].get<int>(), all["simulated"].get<int>());
  EXPECT_EQ(all["frontier"], first["frontier"]);
}

TEST(PlanCli, RefusesAResultsDirectoryHoldingAnotherSearch) {
  TempDir tmp;
  ASSERT_EQ(RunDuet(PlanArgs(tmp.File("plan"))).exit_code, 0);
  std::vector<std::string> args = PlanArgs(tmp.File("plan"));
  *std::find(args.begin(), args.end(), "ttft=1000,tpot=50") = "ttft=900,tpot=50";
  const RunResult r = RunDuet(args);
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("holds a search of other inputs"), std::string::npos) << r;
}

TEST(PlanCli, BadFlagsNameTheFlag) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {{"--tp", "0"},
                                                                  {"--tp", "1,x"},
                                                                  {"--rates", "0"},
                                                                  {"--layouts", "ring"},
                                                                  {"--routers", "best"},
                                                                  {"--attainment", "1.5"},
                                                                  {"--token-budgets", "8"},
                                                                  {"--max-gpus", "0"},
                                                                  {"--jobs", "100000"}};
  for (const auto& [flag, value] : cases) {
    std::vector<std::string> args = PlanArgs(tmp.File("plan"));
    auto it = std::find(args.begin(), args.end(), flag);
    if (it == args.end()) {
      args.insert(args.end(), {flag, value});
    } else {
      *(it + 1) = value;
    }
    const RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, 2) << flag << " " << value << "\n" << r;
    EXPECT_NE(r.err.find(flag.substr(2)), std::string::npos) << r;
  }
  EXPECT_FALSE(fs::exists(tmp.File("plan"))) << "a bad command line left a results directory";
}

}  // namespace
}  // namespace duet::e2e
