// Fuzz target: a step log (policies/step_log.h: a live server's or a simulation's), which
// `duet validate` reads. Any input is read or rejected with an error, never a crash; every line
// read that is not "async" has a forward pass (and host phases) within its iteration, and every
// line formats to a line that reads back the same.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "models/step_profile.h"
#include "policies/step_log.h"

using namespace duet;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)policies::ReadStepLog(text, "fuzz.jsonl", [](const policies::StepLogLine& line) {
    DUET_CHECK(line.instance >= 0 && (line.async || line.step.seconds <= line.iteration_s));
    DUET_CHECK(line.async || !line.host ||
               line.host->total() + line.step.seconds <= line.iteration_s * (1 + 1e-9) + 1e-9);
    const std::string again = policies::FormatStepLogLine(line);
    int lines = 0;
    const Status read = policies::ReadStepLog(again, "again", [&](const policies::StepLogLine& l) {
      ++lines;
      DUET_CHECK(l.instance == line.instance && l.start_s == line.start_s &&
                 l.iteration_s == line.iteration_s && l.step.seconds == line.step.seconds &&
                 l.async == line.async);
      DUET_CHECK(models::StepShapeToJson(l.step.shape) == models::StepShapeToJson(line.step.shape));
      DUET_CHECK(l.host.has_value() == line.host.has_value());
      DUET_CHECK(!l.host || models::HostStepToJson(*l.host) == models::HostStepToJson(*line.host));
    });
    DUET_CHECK(read.ok() && lines == 1);
  });
  return 0;
}
