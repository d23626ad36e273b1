// Admission at step boundaries: every request that has reached an instance's inbox when a
// step is planned is considered for that step, as a real engine's scheduler sees its whole
// waiting queue. A burst of requests that arrive together is prefilled in one step.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

// One colocated tiny-test instance on one tiny GPU, behind the links of tests/data/1p1d-tiny.
nlohmann::json OneInstanceCluster() {
  nlohmann::json c = ReadJson(Src("tests/data/1p1d-tiny.json"));
  c["name"] = "1colo-tiny";
  c["nodes"][0]["count"] = 1;
  c["instances"] = nlohmann::json::array({{{"role", "colocated"}, {"count", 1}, {"tp", 1}}});
  return c;
}

TEST(BurstAdmission, RequestsArrivingTogetherArePrefilledInOneStep) {
  constexpr int kRequests = 8;
  constexpr Tokens kInput = 128;
  const nlohmann::json cluster = OneInstanceCluster();
  TempDir tmp;
  const std::string cluster_path = tmp.File("1colo-tiny.json");
  WriteJson(cluster_path, cluster);
  std::string trace;
  for (int i = 0; i < kRequests; ++i) {
    // Distinct prefixes: no request reuses another's KV.
    trace += nlohmann::json({{"timestamp", 0},
                             {"input_length", kInput},
                             {"output_length", 1},
                             {"hash_ids", {100 + i}}})
                 .dump() +
             "\n";
  }
  const std::string trace_path = tmp.Write("burst.jsonl", trace);

  // The eight prompts (4 bytes a token) leave the frontend at once and share its route
  // evenly, so all arrive together; then one step prefills them all.
  const Network net(cluster);
  const models::RooflineCostModel cost = CostModelFor(cluster, 1);
  const double frontend_s =
      MessageSeconds(kRequests * kInput * kBytesPerPromptToken, net.FrontendToGpu());
  models::StepShape shape;
  for (int i = 0; i < kRequests; ++i) shape.prefill.push_back({kInput, 0});
  const double step_s = cost.StepTime(shape);
  const double ttft_s = frontend_s + step_s;
  ASSERT_GT(cost.StepTime(PrefillShape(kInput, 0)) * 1e3, 10 * kCsvTolMs)
      << "one step more would show";

  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", cluster_path, "--trace", trace_path});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), static_cast<std::size_t>(kRequests));
  for (std::size_t i = 0; i < csv.size(); ++i) {
    EXPECT_EQ(csv.Get(i, "status"), "completed") << "request " << i;
    EXPECT_NEAR(csv.Number(i, "queue_ms"), frontend_s * 1e3, kCsvTolMs) << "request " << i;
    EXPECT_NEAR(csv.Number(i, "ttft_ms"), ttft_s * 1e3, kCsvTolMs) << "request " << i;
  }
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["sim"]["engine_steps"].get<int>(), 1) << "one prefill step for the whole burst";
}

}  // namespace
}  // namespace duet::e2e
