#include "plan/gpu_prices.h"

#include <filesystem>

#include "common/json_util.h"

namespace duet::plan {

Result<GpuPrices> ParseGpuPrices(const nlohmann::json& doc, const std::string& path) {
  if (!doc.is_object())
    return Status::Error(path + ": not a JSON object of GPU type -> price per GPU-hour (got " +
                         DescribeJson(doc) + ")");
  GpuPrices prices;
  for (const auto& [key, value] : doc.items()) {
    if (value.is_null()) continue;
    if (key == "notes") {
      if (!value.is_string()) return FieldError(path, key, "must be a string");
      continue;
    }
    auto price = JsonNumberIn(doc, key, 0, 1e6, path);
    if (!price) return price.status();
    prices[key] = *price;
  }
  return prices;
}

Result<GpuPrices> LoadGpuPrices(const std::vector<std::string>& gpus, const std::string& data_dir,
                                const std::string& user_path) {
  const std::string bundled_path =
      (std::filesystem::path(data_dir) / "plan" / "gpu_prices.json").string();
  GpuPrices table;
  for (const std::string& path : {bundled_path, user_path}) {
    if (path.empty()) continue;
    auto doc = ReadJsonFile(path);
    if (!doc) return doc.status();
    auto prices = ParseGpuPrices(*doc, path);
    if (!prices) return prices.status();
    for (const auto& [gpu, price] : *prices) table.insert_or_assign(gpu, price);
  }
  GpuPrices out;
  for (const std::string& gpu : gpus) {
    auto it = table.find(gpu);
    if (it == table.end())
      return Status::Error("no price per GPU-hour for GPU '" + gpu + "' in " + bundled_path +
                           (user_path.empty() ? "" : " or " + user_path) +
                           ": give it one in a --gpu-prices table, or price every type with "
                           "--gpu-hour-cost");
    out.insert(*it);
  }
  return out;
}

}  // namespace duet::plan
