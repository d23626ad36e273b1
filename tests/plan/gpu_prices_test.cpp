// The GPU price tables of `duet plan`: the bundled one prices every bundled GPU, a user's table
// is merged over it, and a table's errors name the file and the key.
#include "plan/gpu_prices.h"

#include <gtest/gtest.h>

#include "tests/sim/e2e_util.h"

namespace duet::plan {
namespace {

TEST(GpuPrices, TheBundledTablePricesEveryBundledGpu) {
  std::vector<std::string> gpus;
  for (const auto& entry : e2e::fs::directory_iterator(e2e::SourceDir() + "/models/hardware"))
    gpus.push_back(entry.path().stem().string());
  ASSERT_GE(gpus.size(), 4u);
  auto prices = LoadGpuPrices(gpus, e2e::SourceDir(), "");
  ASSERT_TRUE(prices.ok()) << prices.error();
  EXPECT_EQ(prices->size(), gpus.size());
  EXPECT_DOUBLE_EQ(prices->at("h100-sxm"), 2.5) << "the price earlier results were priced at";
}

TEST(GpuPrices, AUsersTableIsMergedOverTheBundledOne) {
  e2e::TempDir tmp;
  const std::string path =
      tmp.Write("prices.json", R"({"notes": "ours", "h200": 3.1, "my-gpu": 9, "b200": null})");
  auto prices = LoadGpuPrices({"h100-sxm", "h200", "b200", "my-gpu"}, e2e::SourceDir(), path);
  ASSERT_TRUE(prices.ok()) << prices.error();
  EXPECT_EQ(*prices, (GpuPrices{{"h100-sxm", 2.5}, {"h200", 3.1}, {"b200", 5.5}, {"my-gpu", 9}}));

  auto missing = LoadGpuPrices({"h200", "h300"}, e2e::SourceDir(), path);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(e2e::ContainsAll(missing.error(), {"'h300'", path, "gpu_prices.json"}));
  auto unreadable = LoadGpuPrices({"h200"}, e2e::SourceDir(), tmp.File("none.json"));
  ASSERT_FALSE(unreadable.ok());
  EXPECT_NE(unreadable.error().find(tmp.File("none.json")), std::string::npos);
}

TEST(GpuPrices, ErrorsNameTheFileAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"([["h200", 3]])", "p.json: not a JSON object"},
      {R"({"h200": "3.5"})", "p.json: field 'h200' must be a number"},
      {R"({"h200": -1})", "p.json: field 'h200' must be a number between 0 and"},
      {R"({"h200": 1e300})", "p.json: field 'h200' must be a number between 0 and"},
      {R"({"h200": 3, "notes": 1})", "p.json: field 'notes' must be a string"}};
  for (const auto& [text, message] : bad) {
    auto r = ParseGpuPrices(nlohmann::json::parse(text), "p.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().find(message), std::string::npos) << r.error();
  }
}

}  // namespace
}  // namespace duet::plan
