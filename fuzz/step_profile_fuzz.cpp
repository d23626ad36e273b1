// Fuzz target: step profiles and step-measurement lines (models/step_profile.h). The first byte
// picks the parser, the rest is its input. Any input is parsed or rejected with an error, never
// a crash; a parsed profile re-formats to a file that parses to the same JSON, its fits price
// steps with finite, non-negative times (after an idle spell too), and its links move a terabyte in
// a finite time.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "models/step_profile.h"

using namespace duet::models;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    (void)ParseStepMeasurements(text, "fuzz.jsonl");
    return 0;
  }
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto profile = ParseStepProfile(doc, "fuzz.json");
  if (!profile.ok()) return 0;
  const nlohmann::json again = nlohmann::json::parse(FormatStepProfile(*profile));
  DUET_CHECK(ParseStepProfile(again, "again.json").ok());
  DUET_CHECK(again == StepProfileToJson(*profile));
  StepShape shape;
  shape.prefill = {{4096, 100000}};
  shape.decode_tokens = 512;
  shape.decode_context_tokens = 512 * 100000;
  for (const StepFit& fit : profile->fits) {
    const double t = FittedCostModel(fit).StepTime(shape);
    DUET_CHECK(std::isfinite(t) && t >= 0);
  }
  if (profile->after_idle) {
    for (const double spell : {0.0, 1e-3, 0.05, 1e9}) {
      for (const ShapeClass c : {ShapeClass::kPrefill, ShapeClass::kDecode, ShapeClass::kMixed}) {
        const double extra = profile->after_idle->Extra(c, spell);
        DUET_CHECK(std::isfinite(extra) && extra >= 0 && extra <= 3600);
      }
    }
  }
  for (const auto& pairs : {profile->after_step, profile->beside}) {
    if (!pairs) continue;
    std::vector<StepShape> shapes = {StepShape{}, shape, {{}, 1, 16}, {{{1, 0}}, 0, 0}};
    for (const StepShape& a : shapes)
      for (const StepShape& b : shapes) {
        const double extra = pairs->Extra(a, b);
        DUET_CHECK(std::isfinite(extra) && extra >= 0 && extra <= 3600);
      }
  }
  for (const LinkFit& link : profile->links) {
    const double t = link.Time(std::int64_t{1} << 40);
    DUET_CHECK(std::isfinite(t) && t > 0);
  }
  return 0;
}
