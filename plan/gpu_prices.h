// The price of a GPU-hour per GPU type for `duet plan`: the bundled table (plan/gpu_prices.json:
// round on-demand list prices assumed for planning) with a user's table of the same shape merged
// over it. A table is a JSON object of GPU type (as a cluster file names it) -> dollars per
// GPU-hour, beside an optional "notes" string.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace duet::plan {

// GPU type -> dollars per GPU-hour.
using GpuPrices = std::map<std::string, double>;

// A table's prices, each in [0, 1e6]; a null entry counts as absent. Errors name `path` and the
// key: a document that is not an object, a price that is not a number or out of range, notes
// that are not a string. (JSON holds no NaN or infinity: a file with 1e400 does not parse.)
Result<GpuPrices> ParseGpuPrices(const nlohmann::json& doc, const std::string& path);

// The price of each of `gpus`: the bundled table (plan/gpu_prices.json under `data_dir`) with the
// table at `user_path` (empty: none) merged over it. Errors: a table that cannot be read or
// parsed, a type that neither table prices.
Result<GpuPrices> LoadGpuPrices(const std::vector<std::string>& gpus, const std::string& data_dir,
                                const std::string& user_path);

}  // namespace duet::plan
