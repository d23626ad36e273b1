// The step log's lines (see step_log.h).
#include "policies/step_log.h"

#include <limits>

#include "common/json_util.h"

namespace duet::policies {

Seconds StepLogLine::HostSeconds() const {
  DUET_CHECK(host.has_value());
  return async ? host->total() : iteration_s - step.seconds;
}

std::optional<Seconds> StepLogLine::RequestWakeS() const {
  if (step.shape.prefill.empty()) return std::nullopt;
  return woke_s;
}

std::string FormatStepLogLine(const StepLogLine& line) {
  nlohmann::json doc = line.step.ToJson();
  doc["instance"] = line.instance;
  doc["start_s"] = line.start_s;
  doc["iteration_s"] = line.iteration_s;
  if (line.host) doc["host"] = models::HostStepToJson(*line.host);
  if (line.async) doc["async"] = true;
  if (line.woke_s) doc["woke_s"] = *line.woke_s;
  if (line.forward_cpu_s) doc["forward_cpu_s"] = *line.forward_cpu_s;
  return doc.dump() + "\n";
}

Status ReadStepLog(std::string_view text, const std::string& where,
                   const std::function<void(const StepLogLine&)>& each) {
  // A server's clock runs for at most years; an iteration lasts at most a step's longest time.
  constexpr double kMaxTime = 1e9;
  return ForEachJsonLine(text, where, [&](const nlohmann::json& doc, const std::string& at) {
    auto m = models::ParseStepMeasurement(doc, at);
    if (!m) return m.status();
    if (m->seconds.size() != 1) return FieldError(at, "seconds", "must be one number");
    auto instance = JsonIntIn(doc, "instance", 0, std::numeric_limits<InstanceId>::max(), at);
    if (!instance) return instance.status();
    auto start_s = JsonNumberIn(doc, "start_s", 0, kMaxTime, at);
    if (!start_s) return start_s.status();
    auto async = JsonBoolOr(doc, "async", false, at);
    if (!async) return async.status();
    // A forward pass that overlapped its iteration may have begun in the one before.
    auto iteration_s = JsonNumberIn(doc, "iteration_s", *async ? 0 : m->seconds[0], kMaxTime, at);
    if (!iteration_s) return iteration_s.status();
    std::optional<models::HostStep> host;
    if (JsonHas(doc, "host")) {
      auto h = models::ParseHostStep(doc["host"], at + ": host", *async ? kMaxTime : *iteration_s);
      if (!h) return h.status();
      // The phases and the forward pass are parts of the iteration (to rounding).
      if (!*async && h->total() + m->seconds[0] > *iteration_s * (1 + 1e-9) + 1e-9)
        return FieldError(at, "host", "phases and \"seconds\" add up to more than \"iteration_s\"");
      host = *h;
    }
    std::optional<Seconds> woke_s;
    if (JsonHas(doc, "woke_s")) {
      auto w = JsonNumberIn(doc, "woke_s", 0, kMaxTime, at);
      if (!w) return w.status();
      woke_s = *w;
    }
    std::optional<Seconds> forward_cpu_s;
    if (JsonHas(doc, "forward_cpu_s")) {
      // A thread's CPU time within the pass is at most the pass's time (to the two clocks'
      // reading, a microsecond apart at most).
      auto c = JsonNumberIn(doc, "forward_cpu_s", 0, m->seconds[0] + 1e-6, at);
      if (!c) return c.status();
      forward_cpu_s = *c;
    }
    each({static_cast<InstanceId>(*instance),
          *start_s,
          *iteration_s,
          {std::move(m->shape), m->seconds[0]},
          host,
          *async,
          woke_s,
          forward_cpu_s});
    return Status::Ok();
  });
}

}  // namespace duet::policies
