// Fuzz target for `duet validate --again`'s reading of the report a previous run left in OUT
// (cli/validate_report.h RecordedReport): any JSON document is taken or refused with a message;
// what is taken has one load per rate scale wanted, each of 1 to 10 recorded runs.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/validate_report.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json doc =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  const duet::cli::RecordedRuns wanted{
      "trace.jsonl", {"--limit", "200"}, {0.5, 1}, std::nullopt, 64};
  auto report = duet::cli::RecordedReport(doc, "validation.json", wanted);
  if (report.ok()) {
    DUET_CHECK((*report)["loads"].size() == wanted.rate_scales.size());
    for (const nlohmann::json& load : (*report)["loads"]) {
      const std::int64_t runs = load["repeats"].get<std::int64_t>();
      DUET_CHECK(runs >= 1 && runs <= 10);
    }
  } else {
    DUET_CHECK(!report.error().empty());
  }
  return 0;
}
