// `duet validate`'s report (cli/validate_report.h) from inputs written here by hand: where each
// world's percentiles fall among the live runs' requests (requests.csv files), and the load
// against its --tolerance with what each miss is down to.
#include "cli/validate_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/sim/e2e_util.h"

namespace duet::cli {
namespace {

using nlohmann::json;

class PlaceInLiveTest : public ::testing::Test {
 protected:
  // A run's live/ directory whose requests.csv has one completed request per TPOT in `tpots`
  // (TTFT and E2E alike, scaled), then a rejected one and a completed one-token request (no
  // TPOT) that no percentile counts.
  std::string Run(const std::string& name, const std::vector<double>& tpots) {
    std::string csv = "request_id,status,ttft_ms,tpot_ms,e2e_ms\n";
    int id = 0;
    for (double t : tpots)
      csv += std::to_string(id++) + ",completed," + std::to_string(10 * t) + "," +
             std::to_string(t) + "," + std::to_string(100 * t) + "\n";
    csv += std::to_string(id++) + ",rejected,,1,\n";
    csv += std::to_string(id++) + ",completed,1000,,1000\n";
    std::filesystem::create_directories(tmp_.File(name));
    e2e::WriteFile(tmp_.File(name + "/requests.csv"), csv);
    return tmp_.File(name);
  }
  e2e::TempDir tmp_;
};

TEST_F(PlaceInLiveTest, PlacesEachWorldsPercentilesAmongThePooledLiveRequests) {
  const std::vector<std::string> dirs = {Run("live", {10, 20, 30, 40}),
                                         Run("live-2", {50, 60, 70, 80})};
  json load = {{"rate_scale", 1}, {"metrics", json::object()}};
  load["metrics"]["tpot_ms.p50"] = {{"live", 45},
                                    {"live_runs", {25, 65}},
                                    {"simulated", 30},
                                    {"simulated_at_live_speed", 45},
                                    {"simulated_as_live", nullptr}};
  load["metrics"]["tpot_ms.p99"] = {{"live", 60}, {"live_runs", {39.7, 79.7}}, {"simulated", 90}};
  load["metrics"]["throughput.output_tokens_per_s"] = {{"live", 5}, {"simulated", 4}};
  load["metrics"]["tpot_ms.mean"] = {{"live", 45}, {"simulated", 40}};
  ASSERT_TRUE(PlaceInLive(load, Metrics(false), dirs).ok());

  const json& p50 = load["metrics"]["tpot_ms.p50"]["place_in_live"];
  EXPECT_EQ(p50["quantile"], 50);
  EXPECT_EQ(p50["requests"], 8);  // neither the rejected request nor the one-token one
  EXPECT_EQ(p50["live_runs"], json({25.0, 75.0}));
  EXPECT_EQ(p50["simulated"], 31.25);  // 10 and 20 below, 30 itself counting half
  EXPECT_EQ(p50["simulated_at_live_speed"], 50.0);
  EXPECT_FALSE(p50.contains("simulated_as_live"));  // not simulated: no place
  const json& p99 = load["metrics"]["tpot_ms.p99"]["place_in_live"];
  EXPECT_EQ(p99["quantile"], 99);
  EXPECT_EQ(p99["simulated"], 100.0);  // beyond every live request
  EXPECT_EQ(p99["live_runs"], json({37.5, 87.5}));
  // Not a percentile of a per-request latency: no place.
  EXPECT_FALSE(load["metrics"]["throughput.output_tokens_per_s"].contains("place_in_live"));
  EXPECT_FALSE(load["metrics"]["tpot_ms.mean"].contains("place_in_live"));

  EXPECT_EQ(PlacesText(load),
            "tpot_ms.p50 simulated p31.2 (at the live runs' speed p50.0), the live runs' own "
            "p25.0 to p75.0; tpot_ms.p99 simulated p100.0, the live runs' own p37.5 to p87.5");
}

TEST_F(PlaceInLiveTest, OneLiveRunIsPlacedByItsValue) {
  const std::vector<std::string> dirs = {Run("live", {10, 20, 30, 40})};
  json load = {{"metrics", json::object()}};
  load["metrics"]["e2e_ms.p50"] = {{"live", 2500}, {"simulated", 1000}};
  ASSERT_TRUE(PlaceInLive(load, Metrics(false), dirs).ok());
  const json& place = load["metrics"]["e2e_ms.p50"]["place_in_live"];
  // E2E counts the one-token request (1,000 ms) that TPOT does not.
  EXPECT_EQ(place["requests"], 5);
  EXPECT_EQ(place["live_runs"], json({60.0}));
  EXPECT_EQ(place["simulated"], 20.0);  // ties with the first and the one-token one: half of two
}

TEST_F(PlaceInLiveTest, AMissingOrBadRequestsFileIsNamed) {
  const std::string good = Run("live", {10, 20});
  json load = {{"metrics", {{"ttft_ms.p50", {{"live", 150}, {"simulated", 100}}}}}};
  Status missing = PlaceInLive(load, Metrics(false), {good, tmp_.File("live-2")});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(tmp_.File("live-2/requests.csv")), std::string::npos)
      << missing.message();
  std::filesystem::create_directories(tmp_.File("live-3"));
  e2e::WriteFile(tmp_.File("live-3/requests.csv"), "request_id,ttft_ms\n0,12\n");
  Status bad = PlaceInLive(load, Metrics(false), {good, tmp_.File("live-3")});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("live-3/requests.csv"), std::string::npos) << bad.message();
  EXPECT_FALSE(load["metrics"]["ttft_ms.p50"].contains("place_in_live"));
}

// A metric held to `tolerance` at `held` (HoldTolerance's fields), with its errors.
json Held(double tolerance, const std::string& held, json errors) {
  errors["tolerance_pct"] = tolerance;
  errors["tolerance_at"] = held;
  errors["within"] = std::abs(errors[held].get<double>()) <= tolerance;
  return errors;
}

TEST(GoalTest, PutsEachMissDownToTheFirstPartThatBringsItWithin) {
  json load = {{"metrics", json::object()}};
  json& m = load["metrics"];
  m["ttft_ms.p50"] = Held(5, "error_pct", {{"error_pct", 2.0}, {"live_spread_pct", 1.0}});
  // Within both as live and handing over as live: put down to the step costs, the first.
  m["tpot_ms.p50"] = Held(5, "error_pct",
                          {{"error_pct", -12.4},
                           {"live_spread_pct", 4.2},
                           {"within_live_range", false},
                           {"error_at_live_speed_pct", -8.0},
                           {"error_as_live_pct", -3.9},
                           {"error_as_live_hand_over_pct", -0.2}});
  // Within no part, and the live runs apart by more than the tolerance.
  m["e2e_ms.p99"] = Held(10, "error_pct",
                         {{"error_pct", 14.0},
                          {"live_spread_pct", 22.0},
                          {"within_live_range", true},
                          {"error_as_live_pct", 12.0},
                          {"error_at_live_speed_pct", -13.0},
                          {"error_as_live_hand_over_pct", nullptr}});
  // Held at the live runs' speed: that simulation is the held one, not a part.
  m["ttft_ms.p99"] = Held(10, "error_at_live_speed_pct",
                          {{"error_pct", 2.0},
                           {"live_spread_pct", 5.0},
                           {"error_at_live_speed_pct", 11.0},
                           {"error_as_live_pct", 9.0}});
  m["throughput.output_tokens_per_s"] = {{"error_pct", 30.0}};  // held by no tolerance
  StateGoal(load);

  const json& goal = load["goal"];
  EXPECT_EQ(goal["held"], 4);
  EXPECT_EQ(goal["within"], 1);
  ASSERT_EQ(goal["missed"].size(), 3u) << goal;
  const json& e2e = goal["missed"][0];
  EXPECT_EQ(e2e["metric"], "e2e_ms.p99");
  EXPECT_EQ(e2e["spread_below_tolerance"], false);
  EXPECT_EQ(e2e["within_when"], nullptr);
  EXPECT_EQ(e2e["nearest"], "as_live");
  EXPECT_EQ(e2e["nearest_error_pct"], 12.0);
  const json& tpot = goal["missed"][1];
  EXPECT_EQ(tpot["error_pct"], -12.4);
  EXPECT_EQ(tpot["spread_below_tolerance"], true);
  EXPECT_EQ(tpot["within_when"], "as_live");
  EXPECT_EQ(tpot["within_when_error_pct"], -3.9);
  EXPECT_EQ(tpot["nearest"], "as_live_hand_over");
  const json& ttft = goal["missed"][2];
  EXPECT_EQ(ttft["error_pct"], 11.0);
  EXPECT_EQ(ttft["within_when"], "as_live");

  EXPECT_EQ(
      GoalText(load),
      "1 of 4 held metrics within; missed where the live runs differ by less than the "
      "tolerance: tpot_ms.p50 -12.4% (the live runs 4.2% apart): within with the steps "
      "priced as they ran live (the step costs), -3.9%; ttft_ms.p99 +11.0% (the live runs "
      "5.0% apart): within with the steps priced as they ran live (the step costs), +9.0%; "
      "missed where the live runs differ by as much or more (or ran once): e2e_ms.p99 "
      "+14.0% (the live runs 22.0% apart, the simulation within their range): no simulation of "
      "one part brings it within; nearest with the steps priced as they ran live (the step "
      "costs), +12.0%");
}

TEST(GoalTest, NoToleranceNoGoal) {
  json load = {{"metrics", {{"ttft_ms.p50", {{"error_pct", 30.0}}}}}};
  StateGoal(load);
  EXPECT_FALSE(load.contains("goal"));
  EXPECT_EQ(GoalText(load), "");
}

}  // namespace
}  // namespace duet::cli
