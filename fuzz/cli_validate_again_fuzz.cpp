// Fuzz target for `duet validate --again`'s reading of the report a previous run left in OUT
// (cli/validate_report.h RecordedReport): any JSON document is taken or refused with a message;
// what is taken has 1 to 8 loads, each of 1 to 10 recorded runs, with what was measured beside
// them in the form the report prints.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/validate_report.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json doc =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  static const duet::cli::RecordedRuns wanted{
      "trace.jsonl",
      {"--limit", "200"},
      std::nullopt,
      64,
      nlohmann::json::parse(R"({"instances": [{"name": "c0", "role": "colocated", "tp": 1,
                                               "dp": 1, "node": 0}],
                                "engine": {"max_num_seqs": 16, "block_tokens": 16}})")};
  auto report = duet::cli::RecordedReport(doc, "validation.json", wanted);
  if (report.ok()) {
    DUET_CHECK(!(*report)["loads"].empty() && (*report)["loads"].size() <= 8);
    for (const nlohmann::json& load : (*report)["loads"]) {
      const std::int64_t runs = load["repeats"].get<std::int64_t>();
      DUET_CHECK(runs >= 1 && runs <= 10);
      DUET_CHECK(load["cpu"]["cores"].is_number_integer());
      const nlohmann::json& machine = load.contains("machine") ? load["machine"] : nullptr;
      for (const char* key : {"slower_pct", "min_pct", "max_pct"})
        DUET_CHECK(machine.is_null() || (machine.contains(key) && machine[key].is_number()));
    }
  } else {
    DUET_CHECK(!report.error().empty());
  }
  return 0;
}
