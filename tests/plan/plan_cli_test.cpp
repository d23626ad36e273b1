// `duet plan` end to end on the bundled trace at 6x its rate: the answer it gives is checked by
// simulating the winner and its cheaper neighbours in full, a second run resumes from the
// results directory, and an exhaustive search agrees with the pruned one.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

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

// The rows of a CSV file without quoted commas in the columns read, by column name.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream in(ReadFile(path));
  std::string line;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (char ch : line) {
      if (ch == '"') {
        quoted = !quoted;
      } else if (ch == ',' && !quoted) {
        cells.push_back(cell);
        cell.clear();
      } else {
        cell += ch;
      }
    }
    cells.push_back(cell);
    if (header.empty()) {
      header = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (std::size_t k = 0; k < header.size() && k < cells.size(); ++k) row[header[k]] = cells[k];
    rows.push_back(row);
  }
  return rows;
}

// Two GPU types in one search: A100s cost less per GPU-hour than H100s, but none of their
// candidates as cheap as the H100 winner meets the target, so an H100 cluster wins; every
// output names the GPU.
TEST(PlanCli, SearchesSeveralGpuTypesAndPicksTheCheapestThatMeets) {
  TempDir tmp;
  std::vector<std::string> args = PlanArgs(tmp.File("plan"));
  args.insert(args.end(), {"--gpu", "a100-80gb,h100-sxm"});
  const RunResult r = RunDuet(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("no bundled one is of llama-3.1-8b on a100-80gb: pricing steps with the "
                       "roofline"),
            std::string::npos)
      << r;
  const nlohmann::json plan = ReadJson(tmp.File("plan/plan.json"));
  ASSERT_TRUE(plan["winner"].is_object()) << plan.dump(2);
  EXPECT_EQ(plan["winner"]["gpu"], "h100-sxm");
  EXPECT_EQ(plan["winner"]["key"].get<std::string>().rfind("h100-sxm-", 0), 0u);
  EXPECT_NE(plan["winner"]["layout"].get<std::string>().find(" on h100-sxm"), std::string::npos);
  EXPECT_EQ(plan["frontier"][0]["gpu"], "h100-sxm");
  const nlohmann::json winner = ReadJson(plan["winner"]["cluster"].get<std::string>());
  EXPECT_EQ(winner["nodes"][0]["gpu"], "h100-sxm");
  EXPECT_EQ(winner["cost_model"]["profile"], "h100-sxm-llama-3.1-8b");
  const double winner_cost = plan["winner"]["cost_per_hour"].get<double>();

  // The cheaper A100 candidates were simulated at the target rate and missed it.
  int cheaper_a100 = 0;
  for (const auto& row : ReadCsv(tmp.File("plan/candidates.csv"))) {
    ASSERT_TRUE(row.count("gpu")) << "no gpu column";
    EXPECT_EQ(row.at("key").rfind(row.at("gpu") + "-", 0), 0u) << row.at("key");
    if (row.at("gpu") != "a100-80gb" || row.at("rate") != "1") continue;
    const std::string dir = tmp.File("plan/runs/" + row.at("key") + "/rate-1/cluster.json");
    EXPECT_EQ(ReadJson(dir)["cost_model"]["kind"], "roofline") << row.at("key");
    if (std::stod(row.at("cost_per_hour")) < winner_cost) {
      ++cheaper_a100;
      EXPECT_EQ(row.at("met"), "0") << row.at("key");
    }
  }
  EXPECT_GT(cheaper_a100, 0) << "no A100 candidate cheaper than the winner was simulated";
  // The bound prices each type's prefills with its own cost model: TP1 prefills take too long
  // on an A100 (the roofline), so its TP1 candidates are out of reach, not those of an H100.
  EXPECT_NE(r.out.find("h100-sxm-colo-1xtp1-"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("a100-80gb-colo-1xtp1-"), std::string::npos) << r;
  EXPECT_EQ(ReadCsv(tmp.File("plan/frontier.csv"))[0].at("gpu"), "h100-sxm");
  EXPECT_NE(r.out.find("a100-80gb"), std::string::npos) << "the table names no A100 candidate";

  // The search's identity holds the types and their prices (the bundled table's).
  const nlohmann::json inputs = ReadJson(tmp.File("plan/inputs.json"));
  ASSERT_EQ(inputs["gpus"].size(), 2u) << inputs.dump(2);
  EXPECT_EQ(inputs["gpus"][0]["gpu"], "a100-80gb");
  EXPECT_EQ(inputs["gpus"][0]["gpu_hour_cost"], 1.8);
  EXPECT_EQ(inputs["gpus"][1]["gpu_hour_cost"], 2.5);
  // Other prices are another search.
  args.insert(args.end(), {"--gpu-prices", tmp.Write("prices.json", R"({"a100-80gb": 1.5})")});
  const RunResult other = RunDuet(args);
  EXPECT_EQ(other.exit_code, 1) << other;
  EXPECT_NE(other.err.find("holds a search of other inputs"), std::string::npos) << other;
}

TEST(PlanCli, BadGpuTypesAndPriceTablesFailNamingThem) {
  TempDir tmp;
  nlohmann::json my_gpu = ReadJson(SourceDir() + "/models/hardware/h200.json");
  my_gpu["name"] = "my-gpu";
  WriteJson(tmp.File("my-gpu.json"), my_gpu);
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> message;
  };
  const std::string not_object = tmp.Write("list.json", R"([["h200", 3]])");
  const std::string text = tmp.Write("text.json", R"({"h100-sxm": 2, "h200": "3.5"})");
  const std::string negative = tmp.Write("negative.json", R"({"h200": -2})");
  const std::string infinite = tmp.Write("infinite.json", R"({"h200": 1e400})");
  const std::vector<Case> cases = {
      {{"--gpu", "h100-sxm,h300"}, {"h300"}},
      {{"--gpu", "h200", "--gpu-prices", not_object}, {not_object, "JSON object"}},
      {{"--gpu", "h200", "--gpu-prices", text}, {text, "'h200'", "must be a number"}},
      {{"--gpu", "h200", "--gpu-prices", negative}, {negative, "'h200'", "between 0"}},
      {{"--gpu", "h200", "--gpu-prices", infinite}, {infinite, "1e400"}},
      {{"--gpu", "h200", "--gpu-prices", tmp.File("none.json")}, {tmp.File("none.json")}},
      {{"--gpu", "h200," + tmp.File("my-gpu.json")}, {"no price", tmp.File("my-gpu.json")}},
      {{"--gpu", "h200,h200.json"}, {"--gpu", "h200.json", "name of another type"}},
      {{"--gpu-prices", text, "--gpu-hour-cost", "2"}, {"--gpu-prices", "--gpu-hour-cost"}}};
  for (const Case& c : cases) {
    std::vector<std::string> args = PlanArgs(tmp.File("plan"));
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, 2) << r;
    for (const std::string& part : c.message) EXPECT_NE(r.err.find(part), std::string::npos) << r;
  }
  EXPECT_FALSE(fs::exists(tmp.File("plan"))) << "a bad command line left a results directory";
  // A GPU the tables do not price runs at --gpu-hour-cost.
  std::vector<std::string> args = PlanArgs(tmp.File("priced"));
  args.insert(args.end(), {"--gpu", tmp.File("my-gpu.json"), "--gpu-hour-cost", "3"});
  const RunResult r = RunDuet(args);
  EXPECT_NE(r.exit_code, 2) << r;
  EXPECT_EQ(ReadJson(tmp.File("priced/inputs.json"))["gpus"][0]["gpu_hour_cost"], 3);
}

}  // namespace
}  // namespace duet::e2e
