// Scenario files (sim/scenarios/*.json; docs/scenarios.md): a trace, rate scales and the setups
// `duet sweep` simulates at each, with errors that name the file and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace duet::plan {

struct Setup {
  std::string name;
  std::string slug;  // the name as a directory name: "(a) PD + offload" -> "a-pd-offload"
  std::string cluster, router;
  // RFC 6902 JSON Patch operations applied to the cluster file (a variant of it: another NIC,
  // tier size, P:D split); empty: none.
  nlohmann::json patch = nlohmann::json::array();
};

struct Scenario {
  std::string name, trace, trace_format, router, slo;
  std::vector<double> rate_scales;
  std::vector<Setup> setups;
};

Result<Scenario> ParseScenario(const nlohmann::json& doc, const std::string& path);

}  // namespace duet::plan
