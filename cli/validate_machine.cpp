#include "cli/validate_machine.h"

#include <algorithm>
#include <map>

#include "backend/calibrate/step_sweep.h"
#include "backend/model/llama_weights.h"
#include "backend/registry.h"
#include "cli/validate_steps.h"
#include "policies/metrics.h"

namespace duet::cli {

using nlohmann::json;

Result<MachineReference> MachineReference::Create(const std::string& model_dir,
                                                  const models::StepProfile& profile,
                                                  bool neighbour) {
  const std::vector<std::size_t> indices = ReferenceShapes(profile);
  if (indices.empty())
    return Status::Error(
        "the profile has no one-chunk prefill or decode-only measurement to time again");
  std::vector<models::StepMeasurement> shapes;
  for (std::size_t i : indices) shapes.push_back(profile.measurements[i]);
  backend::ModelPlacement placement;
  placement.device = profile.device;
  if (profile.source.contains("threads") && profile.source["threads"].is_number_integer())
    placement.cpu_threads = profile.source["threads"].get<int>();
  for (const models::StepMeasurement& m : shapes)
    placement.num_blocks =
        std::max(placement.num_blocks, backend::BlocksFor(m.shape, placement.block_tokens));
  std::unique_ptr<backend::ForwardModel> models[2];
  for (int i = 0; i < (neighbour ? 2 : 1); ++i) {
    auto model = backend::LoadModelDir(model_dir);
    if (!model) return Status::Error("--model: " + model.error());
    auto forward = backend::CreateForwardModel(std::move(*model), placement);
    if (!forward)
      return Status::Error("the profile's device '" + profile.device + "': " + forward.error());
    models[i] = std::move(*forward);
  }
  return MachineReference(std::move(models[0]), std::move(models[1]), std::move(shapes));
}

json MachineReference::Time(int repeats) {
  backend::StepTimer timer(*model_);
  std::vector<models::StepMeasurement> now = shapes_;
  for (models::StepMeasurement& m : now) m.seconds.clear();
  // Passes over the shapes, each timed in a run of its own kind, as calibrate times them.
  for (int pass = 0; pass < repeats; ++pass)
    for (models::StepMeasurement& m : now) m.seconds.push_back(timer.TimeInARun(m.shape));
  json out = {{"shapes", json::array()}};
  double calibrated_s = 0, now_s = 0;
  for (std::size_t i = 0; i < now.size(); ++i) {
    const Seconds then = shapes_[i].Median(), t = now[i].Median();
    calibrated_s += then;
    now_s += t;
    out["shapes"].push_back({{"name", ReferenceShapeName(now[i].shape)},
                             {"shape", models::StepShapeToJson(now[i].shape)},
                             {"calibrated_ms", 1e3 * then},
                             {"now_ms", 1e3 * t},
                             {"slower_pct", 100.0 * (t / then - 1)}});
  }
  out["slower_pct"] = 100.0 * (now_s / calibrated_s - 1);
  if (neighbour_) out["beside"] = TimeBeside(repeats, now);
  return out;
}

json MachineReference::TimeBeside(int repeats, const std::vector<models::StepMeasurement>& alone) {
  backend::StepTimer timer(*model_);
  json out = {{"shapes", json::array()}};
  double alone_s = 0, beside_s = 0;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    // The neighbour runs the first reference shape of the other kind (a prefill instance's
    // beside a decode step, a decode instance's beside a prefill step; the same shape where
    // there is none) until this one's passes are done.
    const bool decode = shapes_[i].shape.prefill.empty();
    const auto other_kind = std::find_if(shapes_.begin(), shapes_.end(), [&](const auto& m) {
      return m.shape.prefill.empty() != decode;
    });
    const models::StepShape& other = (other_kind != shapes_.end() ? *other_kind : shapes_[i]).shape;
    models::StepMeasurement beside{alone[i].shape, {}};
    {
      const backend::NeighbourLoop loop(*neighbour_, other);
      for (int pass = 0; pass <= repeats; ++pass) {
        const Seconds t = timer.Time(beside.shape);
        if (pass > 0) beside.seconds.push_back(t);
      }
    }
    const Seconds a = alone[i].Median(), b = beside.Median();
    alone_s += a;
    beside_s += b;
    out["shapes"].push_back({{"name", ReferenceShapeName(beside.shape)},
                             {"neighbour", ReferenceShapeName(other)},
                             {"alone_ms", 1e3 * a},
                             {"beside_ms", 1e3 * b},
                             {"slower_pct", 100.0 * (b / a - 1)}});
  }
  out["slower_pct"] = 100.0 * (beside_s / alone_s - 1);
  return out;
}

namespace {

// The median of `readings`' "slower_pct" with their range, and each shape's median.
json MedianReading(const std::vector<const json*>& readings) {
  std::vector<double> values;
  std::map<std::string, std::vector<double>> shapes;
  for (const json* r : readings) {
    values.push_back((*r)["slower_pct"].get<double>());
    for (const json& s : (*r)["shapes"])
      shapes[s["name"].get<std::string>()].push_back(s["slower_pct"].get<double>());
  }
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  json out = {
      {"slower_pct", policies::Summarize(values).p50}, {"min_pct", *low}, {"max_pct", *high}};
  for (const auto& [name, v] : shapes) out["shapes"][name] = policies::Summarize(v).p50;
  return out;
}

}  // namespace

json SummarizeReference(const std::vector<json>& timings) {
  if (timings.empty()) return nullptr;
  std::vector<const json*> readings, beside;
  for (const json& t : timings) {
    readings.push_back(&t);
    if (t.contains("beside")) beside.push_back(&t["beside"]);
  }
  json out = MedianReading(readings);
  if (!beside.empty()) out["beside"] = MedianReading(beside);
  out["timings"] = timings;
  return out;
}

Result<json> RereadReference(const json& machine, const json& timed_source,
                             const models::StepProfile& profile) {
  for (const char* key : {"device", "threads"}) {
    const json was =
        timed_source.is_object() && timed_source.contains(key) ? timed_source[key] : json();
    const json is = profile.SourceField(key);
    if (!was.is_null() && !is.is_null() && was != is)
      return Status::Error(std::string("they were timed with the ") + key + " " + was.dump() +
                           " of their profile, this one was measured with " + is.dump());
  }
  std::map<std::string, Seconds> measured;  // `profile`'s median of each shape, by its JSON
  for (const models::StepMeasurement& m : profile.measurements)
    measured.emplace(models::StepShapeToJson(m.shape).dump(), m.Median());
  std::vector<json> timings;
  for (json timing : machine["timings"]) {
    double then_ms = 0, now_ms = 0;
    for (json& shape : timing["shapes"]) {
      auto parsed = models::ParseStepShape(shape.value("shape", json()), "shape");
      const auto it =
          parsed ? measured.find(models::StepShapeToJson(*parsed).dump()) : measured.end();
      const std::string name = shape["name"].get<std::string>();
      if (it == measured.end() || it->second <= 0)
        return Status::Error("this profile has no measurement of their reference shape " + name);
      const double then = 1e3 * it->second, now = shape["now_ms"].get<double>();
      shape["calibrated_ms"] = then;
      shape["slower_pct"] = 100.0 * (now / then - 1);
      then_ms += then;
      now_ms += now;
    }
    timing["slower_pct"] = 100.0 * (now_ms / then_ms - 1);
    timings.push_back(std::move(timing));
  }
  return SummarizeReference(timings);
}

}  // namespace duet::cli
