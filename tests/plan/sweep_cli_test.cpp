// `duet sweep` end to end: every setup at every rate scale, one results.csv row per run that
// agrees with the run's own files, a second sweep that resumes, and a broken scenario refused.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::istringstream h(line);
  for (std::string col; std::getline(h, col, ',');) header.push_back(col);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    std::map<std::string, std::string> row;
    std::istringstream r(line);
    std::string cell;
    for (std::size_t k = 0; k < header.size() && std::getline(r, cell, ','); ++k)
      row[header[k]] = cell;
    rows.push_back(row);
  }
  return rows;
}

// Two setups: the bundled colocated cluster cut to 2 instances on one node by a JSON Patch, and
// the bundled PD cluster as it is.
std::string Scenario(const TempDir& tmp) {
  nlohmann::json patch = nlohmann::json::array();
  patch.push_back({{"op", "replace"}, {"path", "/instances/0/count"}, {"value", 2}});
  patch.push_back({{"op", "replace"}, {"path", "/nodes/0/count"}, {"value", 1}});
  nlohmann::json colo = {{"name", "colocated x2"},
                         {"cluster", "sim/clusters/h100-16colo-llama8b.json"},
                         {"patch", patch},
                         {"router", "kv-aware"}};
  nlohmann::json pd = {{"name", "PD 8+8"}, {"cluster", "sim/clusters/h100-8p8d-llama8b.json"}};
  const nlohmann::json scenario = {{"name", "test"},
                                   {"trace", "traces/bundled/default.json"},
                                   {"slo", "ttft=1000,tpot=50"},
                                   {"rate_scales", {1, 4}},
                                   {"setups", nlohmann::json::array({colo, pd})}};
  WriteJson(tmp.File("scenario.json"), scenario);
  return tmp.File("scenario.json");
}

TEST(SweepCli, EveryRunHasARowThatAgreesWithItsFilesAndASecondSweepResumes) {
  TempDir tmp;
  const std::string scenario = Scenario(tmp);
  const RunResult r =
      RunDuet({"sweep", "--scenario", scenario, "--out", tmp.File("out"), "--progress", "never"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("4 runs (0 resumed)"), std::string::npos) << r;
  // The patched cluster file is kept beside its runs, and is what they ran.
  const nlohmann::json patched = ReadJson(tmp.File("out/runs/colocated-x2/cluster.json"));
  EXPECT_EQ(patched["instances"][0]["count"], 2);
  EXPECT_EQ(ReadJson(tmp.File("out/runs/colocated-x2/rate-1/summary.json"))["run"]["instances"], 2);
  const auto rows = ReadCsv(tmp.File("out/results.csv"));
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> order = {
      {"\"colocated x2\"", "colocated-x2/rate-1"},
      {"\"PD 8+8\"", "pd-8-8/rate-1"},
      {"\"colocated x2\"", "colocated-x2/rate-4"},
      {"\"PD 8+8\"", "pd-8-8/rate-4"}};
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto& row = rows[k];
    EXPECT_EQ(row.at("setup"), order[k].first);
    const std::string dir = tmp.File("out/runs/" + order[k].second);
    const nlohmann::json s = ReadJson(dir + "/summary.json");
    EXPECT_EQ(std::stoi(row.at("completed")), s["requests"]["completed"].get<int>());
    EXPECT_DOUBLE_EQ(std::stod(row.at("attainment")), s["goodput"]["attainment"].get<double>());
    EXPECT_EQ(s["run"]["router"], k % 2 == 0 ? "kv-aware" : "prefix-aware");
    // Little's law over the completed requests of requests.csv.
    double sum = 0, first = 1e300, last = -1e300;
    for (const auto& req : ReadCsv(dir + "/requests.csv")) {
      if (req.at("status") != "completed") continue;
      const double a = std::stod(req.at("arrival_s"));
      const double end = a + std::stod(req.at("e2e_ms")) / 1e3;
      sum += end - a;
      first = std::min(first, a);
      last = std::max(last, end);
    }
    EXPECT_NEAR(std::stod(row.at("mean_concurrency")), sum / (last - first), 1e-3);
    EXPECT_GE(std::stoi(row.at("peak_concurrency")), std::stod(row.at("mean_concurrency")));
  }
  const RunResult again =
      RunDuet({"sweep", "--scenario", scenario, "--out", tmp.File("out"), "--progress", "never"});
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("4 runs (4 resumed)"), std::string::npos) << again;

  // Another patch is another sweep: refused there, and the directory left as it was.
  nlohmann::json other = ReadJson(scenario);
  other["setups"][0]["patch"][0]["value"] = 3;
  WriteJson(tmp.File("other.json"), other);
  const RunResult refused = RunDuet({"sweep", "--scenario", tmp.File("other.json"), "--out",
                                     tmp.File("out"), "--progress", "never"});
  EXPECT_EQ(refused.exit_code, 1) << refused;
  EXPECT_NE(refused.err.find("holds a sweep of another scenario"), std::string::npos) << refused;
  EXPECT_EQ(ReadJson(tmp.File("out/runs/colocated-x2/cluster.json"))["instances"][0]["count"], 2);
}

// Processes whose command line mentions `text` (the simulations of a sweep into a directory).
int ProcessesMentioning(const std::string& text) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(text) != std::string::npos) ++n;
  }
  return n;
}

TEST(SweepCli, SigintStopsTheSimulationsAndTheSameCommandResumes) {
  TempDir tmp;
  nlohmann::json scenario = ReadJson(Scenario(tmp));
  scenario["rate_scales"] = nlohmann::json::array();
  for (int k = 1; k <= 40; ++k) scenario["rate_scales"].push_back(k * 0.25);
  scenario["setups"] = nlohmann::json::array({scenario["setups"][0]});
  WriteJson(tmp.File("long.json"), scenario);
  const std::string out = tmp.File("out");
  const std::vector<std::string> args = {"sweep", "--scenario", tmp.File("long.json"),
                                         "--out", out,          "--jobs",
                                         "1",     "--progress", "never"};
  const std::string err = tmp.File("stderr");
  const pid_t pid = SpawnDuet(args, err);
  ASSERT_GE(pid, 0);
  // Wait (bounded) for the first run to finish, then interrupt.
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    started = fs::exists(out + "/runs/colocated-x2/rate-0.25/summary.json");
  }
  ASSERT_TRUE(started) << "no run finished in 30 s";
  ::kill(pid, SIGINT);
  const std::optional<int> status = WaitForExit(pid, std::chrono::seconds(30));
  ASSERT_TRUE(status && WIFEXITED(*status)) << "the sweep did not exit after SIGINT";
  EXPECT_EQ(WEXITSTATUS(*status), 130);
  EXPECT_NE(ReadFile(err).find("stopped by a signal"), std::string::npos) << ReadFile(err);
  EXPECT_FALSE(fs::exists(out + "/results.csv"));
  EXPECT_EQ(ProcessesMentioning(out), 0) << "simulations outlived the sweep";

  const RunResult again = RunDuet(args);
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_EQ(again.out.find("40 runs (0 resumed)"), std::string::npos) << again;
  EXPECT_EQ(ReadCsv(out + "/results.csv").size(), 40u);
}

TEST(SweepCli, ABrokenScenarioOrFlagIsRefusedNamingIt) {
  TempDir tmp;
  WriteFile(tmp.File("bad.json"),
            R"({"trace": "t", "rate_scales": [1], "setups": [{"name": "a"}]})");
  RunResult r = RunDuet({"sweep", "--scenario", tmp.File("bad.json"), "--out", tmp.File("out")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("bad.json: field 'setups[0].cluster' is missing"), std::string::npos) << r;
  nlohmann::json scenario = ReadJson(Scenario(tmp));
  scenario["setups"][0]["patch"][0]["path"] = "/instances/7/count";
  WriteJson(tmp.File("bad-patch.json"), scenario);
  r = RunDuet({"sweep", "--scenario", tmp.File("bad-patch.json"), "--out", tmp.File("out1")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("setup 'colocated x2': patch does not apply"), std::string::npos) << r;
  EXPECT_FALSE(fs::exists(tmp.File("out1/runs/colocated-x2"))) << "wrote before checking";
  r = RunDuet(
      {"sweep", "--scenario", Scenario(tmp), "--jobs", "100000", "--out", tmp.File("out2")});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("--jobs"), std::string::npos) << r;
  r = RunDuet(
      {"sweep", "--scenario", Scenario(tmp), "--ray", "nowhere", "--out", tmp.File("out3")});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("--ray needs HOST:PORT"), std::string::npos) << r;
}

}  // namespace
}  // namespace duet::e2e
