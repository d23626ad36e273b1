// `duet validate --report`: one self-contained HTML page (inline SVG and CSS, no script, nothing
// fetched) that shows a validation: per load, the live runs' and the simulation's CDFs of TTFT,
// TPOT and E2E (each run's requests.csv), the error table, and where the error comes from.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/validate_flags.h"
#include "common/status.h"

namespace duet::cli {

// Writes the page for `report` (validation.json's form) to `path`, reading each load's runs from
// OUT/rate-R/ (live/, live-K/, sim/requests.csv).
Status WriteValidationHtml(const nlohmann::json& report, const std::vector<Metric>& metrics,
                           const std::string& out_dir, const std::string& path);

}  // namespace duet::cli
