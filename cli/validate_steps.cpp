// The step attribution of `duet validate` (validate_steps.h): live step logs priced by the cost
// model, and the profile scaled to the live steps.
#include "cli/validate_steps.h"

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <tuple>

#include "common/json_util.h"
#include "policies/step_log.h"

namespace duet::cli {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

namespace {

// Calls f(measurement, price) for each of the profile's measurements timed at least once at a tp
// it has a fit for, with that fit's price for its shape.
template <typename F>
void PriceMeasurements(const models::StepProfile& profile, F f) {
  std::map<int, models::FittedCostModel> fits;
  for (const models::StepFit& fit : profile.fits)
    fits.emplace(fit.tp, models::FittedCostModel(fit));
  for (const models::StepMeasurement& m : profile.measurements) {
    const auto fit = fits.find(m.shape.tp);
    if (fit != fits.end() && !m.seconds.empty()) f(m, fit->second.StepTime(m.shape));
  }
}

// What the cost model adds to a step's price for what ran before it (an idle spell, or a step of
// another kind) and beside it (other instances' steps on its node).
struct Added {
  Seconds after_idle = 0, after_step = 0, beside = 0;
  void operator+=(const Added& o) {
    after_idle += o.after_idle;
    after_step += o.after_step;
    beside += o.beside;
  }
};

// A live step as the attribution keeps it until its run's log is read.
struct Step {
  policies::InstanceId instance;
  std::size_t shape_class;
  int band;                 // BandOf
  std::size_t predecessor;  // what its instance ran before it (kPredecessors)
  Seconds start_s, iteration_s, forward_s, priced_s;
  Added added;                   // of priced_s, as Class keeps it
  std::optional<Seconds> cpu_s;  // the pass's thread CPU time, where the log has it
};

// A decode batch's band: floor(log2(rows)), so rows 1, 2-3, 4-7, ... (backends change kernels
// with the row count); a prefill step's alike by its new tokens.
int Band(Tokens n) { return std::bit_width(static_cast<std::uint64_t>(n)) - 1; }

// The band of a step of `shape_class` as validate reports it: a decode-only step's by its rows,
// a prefill-only step's by its new tokens; -1 for a mixed step.
int BandOf(models::ShapeClass shape_class, const models::StepShape& shape) {
  switch (shape_class) {
    case models::ShapeClass::kDecode:
      return Band(shape.decode_tokens);
    case models::ShapeClass::kPrefill:
      return Band(shape.PrefillTokens());
    case models::ShapeClass::kMixed:
      break;
  }
  return -1;
}

// What an instance ran before a step ("after"): an idle spell, or a step of a class.
constexpr std::size_t kAfterIdle = models::kShapeClasses;
constexpr std::size_t kPredecessors = models::kShapeClasses + 1;
std::string PredecessorName(std::size_t p) {
  return p == kAfterIdle ? "idle" : models::ToString(static_cast<models::ShapeClass>(p));
}

// Steps summed: their live forward passes and the cost model's prices, and, of those whose
// line has the pass's CPU time, the same again with that time.
struct Class {
  std::int64_t steps = 0;
  double forward_s = 0, priced_s = 0;
  Added added;                 // of priced_s
  std::vector<double> errors;  // per step, priced / forward - 1 (where kept)
  std::int64_t cpu_steps = 0;
  double cpu_forward_s = 0, cpu_priced_s = 0, cpu_s = 0;
  void Add(Seconds forward, Seconds priced, const Added& part, std::optional<Seconds> cpu) {
    ++steps;
    forward_s += forward;
    priced_s += priced;
    added += part;
    if (!cpu) return;
    ++cpu_steps;
    cpu_forward_s += forward;
    cpu_priced_s += priced;
    cpu_s += *cpu;
  }
  void Merge(const Class& o) {  // the sums, not the per-step errors
    steps += o.steps;
    forward_s += o.forward_s;
    priced_s += o.priced_s;
    added += o.added;
    cpu_steps += o.cpu_steps;
    cpu_forward_s += o.cpu_forward_s;
    cpu_priced_s += o.cpu_priced_s;
    cpu_s += o.cpu_s;
  }
};

// For each of a run's steps (sorted by start), how long other instances' iterations ran during
// its own: the length of its iteration's intersection with the union of theirs.
std::vector<double> OverlapWithOthers(const std::vector<Step>& steps) {
  std::vector<double> overlap(steps.size(), 0);
  std::vector<policies::InstanceId> instances;
  for (const Step& s : steps) instances.push_back(s.instance);
  std::sort(instances.begin(), instances.end());
  instances.erase(std::unique(instances.begin(), instances.end()), instances.end());
  if (instances.size() < 2) return overlap;
  for (const policies::InstanceId instance : instances) {
    std::vector<std::pair<double, double>> others;  // merged, in order
    for (const Step& s : steps) {
      if (s.instance == instance) continue;
      const double end = s.start_s + s.iteration_s;
      if (!others.empty() && s.start_s <= others.back().second)
        others.back().second = std::max(others.back().second, end);
      else
        others.emplace_back(s.start_s, end);
    }
    std::size_t first = 0;  // the first of `others` that ends after the current step starts
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      if (s.instance != instance) continue;
      const double end = s.start_s + s.iteration_s;
      while (first < others.size() && others[first].second <= s.start_s) ++first;
      for (std::size_t k = first; k < others.size() && others[k].first < end; ++k)
        overlap[i] += std::min(end, others[k].second) - std::max(s.start_s, others[k].first);
    }
  }
  return overlap;
}

// A sum's added parts as its "after_idle_s", "after_step_s" and "beside_s" (those that are not 0).
void AddedToJson(const Added& added, json& sum) {
  if (added.after_idle > 0) sum["after_idle_s"] = added.after_idle;
  if (added.after_step > 0) sum["after_step_s"] = added.after_step;
  if (added.beside > 0) sum["beside_s"] = added.beside;
}

// What the cost models add to each of a run's live steps (`lines`, each instance's in order) for
// the steps of its node's other instances (`mates`: sim::NodeMates) that its iteration overlaps,
// as the simulator adds it (sim/instance_ports.cpp): a step priced `alone` that takes `full`
// more beside another all its length runs at alone / (alone + full) of its pace while the other
// runs, so that W seconds beside it add W * full / (alone + full), up to `full`.
std::vector<Seconds> BesideOthers(
    const std::vector<policies::StepLogLine>& lines,
    const std::vector<std::unique_ptr<models::StepCostModel>>& cost_models,
    const std::vector<std::vector<policies::InstanceId>>& mates) {
  std::vector<Seconds> beside(lines.size(), 0);
  std::map<policies::InstanceId, std::vector<std::size_t>> by_instance;  // each by start
  for (std::size_t k = 0; k < lines.size(); ++k)
    if (lines[k].instance < static_cast<int>(mates.size()))
      by_instance[lines[k].instance].push_back(k);
  auto end_of = [&](std::size_t k) { return lines[k].start_s + lines[k].iteration_s; };
  for (auto& [instance, steps] : by_instance)
    std::sort(steps.begin(), steps.end(),
              [&](std::size_t a, std::size_t b) { return lines[a].start_s < lines[b].start_s; });
  for (const auto& [instance, steps] : by_instance) {
    const models::StepCostModel& cost = *cost_models[static_cast<std::size_t>(instance)];
    for (const policies::InstanceId mate : mates[static_cast<std::size_t>(instance)]) {
      const auto theirs = by_instance.find(mate);
      if (theirs == by_instance.end()) continue;
      const std::vector<std::size_t>& other = theirs->second;
      std::size_t first = 0;  // the first of `other` that ends after the current step starts
      for (const std::size_t k : steps) {
        const Seconds start = lines[k].start_s, end = end_of(k);
        const Seconds alone = cost.StepTime(lines[k].step.shape);
        while (first < other.size() && end_of(other[first]) <= start) ++first;
        Seconds delay = 0, most = 0;
        for (std::size_t o = first; o < other.size() && lines[other[o]].start_s < end; ++o) {
          const Seconds overlap =
              std::min(end, end_of(other[o])) - std::max(start, lines[other[o]].start_s);
          const Seconds full = cost.Beside(lines[k].step.shape, lines[other[o]].step.shape);
          if (overlap <= 0 || full <= 0) continue;
          delay += overlap * full / (alone + full);
          most = std::max(most, full);
        }
        beside[k] += std::min(delay, most);
      }
    }
  }
  return beside;
}

}  // namespace

Result<json> AttributeSteps(const std::vector<std::string>& step_logs,
                            const sim::ClusterSpec& cluster, const json& simulated_summary) {
  std::array<Class, models::kShapeClasses> classes;
  // Of each class, the steps a fitted profile prices with the pieces above its split (the
  // class's split rows or more: StepFit::PiecesFor).
  std::array<Class, models::kShapeClasses> above_split;
  // Of each class, the steps the profile prices beyond its measurements: a fit column (tokens,
  // context, rows, ...) larger than in any shape of the class it measured, for the instance's TP.
  std::array<Class, models::kShapeClasses> beyond_sweep;
  const models::StepProfile* profile = cluster.cost_model.profile.get();
  using Columns = std::array<double, models::kFitColumns>;
  std::map<int, std::array<Columns, models::kShapeClasses>> measured_max;  // by TP
  if (profile) {
    for (const models::StepMeasurement& m : profile->measurements) {
      const models::StepFeatures f = models::FeaturesOf(m.shape);
      if (f.empty()) continue;
      Columns& max = measured_max[m.shape.tp][static_cast<std::size_t>(models::ClassOf(f))];
      const Columns columns = models::FitColumns(f);
      for (std::size_t c = 0; c < columns.size(); ++c) max[c] = std::max(max[c], columns[c]);
    }
  }
  // By class (decode and prefill) and band (BandOf).
  std::array<std::map<int, Class>, models::kShapeClasses> bands;
  std::map<int, std::array<Class, 2>> decode_bands_apart;  // decode's: alone, beside
  // Of each class, the steps by what their instance ran before them (kPredecessors).
  std::array<std::array<Class, kPredecessors>, models::kShapeClasses> after;
  std::vector<std::unique_ptr<models::StepCostModel>> cost_models;
  for (std::size_t i = 0; i < cluster.instances.size(); ++i)
    cost_models.push_back(sim::MakeStepCostModel(cluster, i));
  const std::vector<std::vector<policies::InstanceId>> mates = sim::NodeMates(cluster, cost_models);
  // Beside another instance: of each class, the steps whose iteration ran at least half its time
  // beside another instance's iterations in the same run (on one machine they share its cores,
  // memory bandwidth and caches, which `duet calibrate` times each shape without), and the rest.
  std::array<Class, models::kShapeClasses> beside, alone;
  std::array<double, models::kShapeClasses> beside_overlap_s{}, beside_iteration_s{};
  // By quarter of each live run (from its first step's start to its last's), summed over the
  // runs: whether the same shapes ran slower in one stretch of a run (a machine's speed moving)
  // or throughout.
  std::array<double, 4> quarter_forward{}, quarter_priced{};
  // Each run's: how fast each ran against the others (what a metric's spread over the runs owes
  // their speed, with the load's sensitivity to the step costs).
  using ByClass = std::array<double, models::kShapeClasses>;
  std::vector<ByClass> run_forward, run_priced;
  std::vector<Step> run_steps;  // the steps of the run being read
  auto end_run = [&] {
    run_forward.emplace_back();
    run_priced.emplace_back();
    for (const Step& s : run_steps) {
      run_forward.back()[s.shape_class] += s.forward_s;
      run_priced.back()[s.shape_class] += s.priced_s;
    }
    if (run_steps.empty()) return;
    std::sort(run_steps.begin(), run_steps.end(),
              [](const Step& a, const Step& b) { return a.start_s < b.start_s; });
    const double first = run_steps.front().start_s, span = run_steps.back().start_s - first;
    for (const Step& s : run_steps) {
      const auto q = span > 0 ? std::min<std::size_t>(
                                    3, static_cast<std::size_t>(4 * (s.start_s - first) / span))
                              : 0;
      quarter_forward[q] += s.forward_s;
      quarter_priced[q] += s.priced_s;
    }
    const std::vector<double> overlap = OverlapWithOthers(run_steps);
    for (std::size_t i = 0; i < run_steps.size(); ++i) {
      const Step& s = run_steps[i];
      const bool is_beside = s.iteration_s > 0 && overlap[i] >= 0.5 * s.iteration_s;
      const bool is_decode = s.shape_class == static_cast<std::size_t>(models::ShapeClass::kDecode);
      for (Class* c : {&(is_beside ? beside : alone)[s.shape_class],
                       is_decode ? &decode_bands_apart[s.band][is_beside] : nullptr,
                       &after[s.shape_class][s.predecessor]}) {
        if (c) c->Add(s.forward_s, s.priced_s, s.added, s.cpu_s);
      }
      if (is_beside) {
        beside_overlap_s[s.shape_class] += overlap[i];
        beside_iteration_s[s.shape_class] += s.iteration_s;
      }
    }
    run_steps.clear();
  };
  double iteration_s = 0;
  bool async = false;  // asynchronous steps: a forward pass overlaps its iteration
  // Iterations that logged their host time: by phase, and as the cost model prices it.
  std::int64_t host_steps = 0;
  double host_outside_s = 0, host_priced_s = 0;
  std::array<double, models::kHostPhases> host_phase_s{};
  Status bad_instance = Status::Ok();
  for (const std::string& step_log : step_logs) {
    // Each instance's previous iteration in this run: its end and shape. (Processes append their
    // lines to one log, each in its order.)
    std::map<policies::InstanceId, std::pair<Seconds, models::StepShape>> previous;
    std::vector<policies::StepLogLine> lines;
    const Status read =
        policies::ReadStepLog(ReadText(step_log), step_log,
                              [&](const policies::StepLogLine& line) { lines.push_back(line); });
    if (!read.ok()) return read;
    const std::vector<Seconds> beside_s = BesideOthers(lines, cost_models, mates);
    for (std::size_t k = 0; k < lines.size(); ++k) {
      const policies::StepLogLine& line = lines[k];
      if (line.instance >= static_cast<int>(cost_models.size())) {
        if (bad_instance.ok())
          bad_instance = Status::Error(step_log + ": instance " + std::to_string(line.instance) +
                                       " is not in the cluster file");
        continue;
      }
      const models::StepFeatures features = models::FeaturesOf(line.step.shape);
      const models::ShapeClass shape_class = models::ClassOf(features);
      // What ran before it: its instance's previous iteration, or an idle spell (since the
      // run's clock began, before its first), either of which the cost model may price.
      const models::StepCostModel& cost = *cost_models[static_cast<std::size_t>(line.instance)];
      const auto before = previous.find(line.instance);
      const bool first = before == previous.end();
      const models::StepCostModel::Before added = cost.AfterWhatRanBefore(
          line.step.shape, line.start_s - (first ? 0 : before->second.first),
          first ? nullptr : &before->second.second);
      const std::size_t predecessor =
          added.after_idle ? kAfterIdle
                           : static_cast<std::size_t>(
                                 models::ClassOf(models::FeaturesOf(before->second.second)));
      // And beside: the other instances' steps on its node that it overlapped.
      const Added part{added.after_idle ? added.seconds : 0, added.after_idle ? 0 : added.seconds,
                       beside_s[k]};
      previous.insert_or_assign(line.instance,
                                std::pair{line.start_s + line.iteration_s, line.step.shape});
      const Seconds priced = cost.StepTime(line.step.shape) + added.seconds + part.beside;
      auto add = [&](Class& c) {
        c.Add(line.step.seconds, priced, part, line.forward_cpu_s);
        c.errors.push_back(priced / line.step.seconds - 1);
      };
      add(classes[static_cast<std::size_t>(shape_class)]);
      const auto& instance = cluster.instances[static_cast<std::size_t>(line.instance)];
      if (const models::StepFit* fit = profile ? profile->FitFor(instance.tp) : nullptr) {
        const Tokens split = fit->split_rows[static_cast<std::size_t>(shape_class)];
        if (split > 0 && features.tokens() >= static_cast<double>(split))
          add(above_split[static_cast<std::size_t>(shape_class)]);
      }
      if (const auto it = measured_max.find(line.step.shape.tp); it != measured_max.end()) {
        const Columns& max = it->second[static_cast<std::size_t>(shape_class)];
        const Columns columns = models::FitColumns(features);
        bool beyond = false;
        for (std::size_t c = 0; c < columns.size(); ++c) beyond |= columns[c] > max[c];
        if (beyond) add(beyond_sweep[static_cast<std::size_t>(shape_class)]);
      }
      const int band = BandOf(shape_class, line.step.shape);
      if (band >= 0) add(bands[static_cast<std::size_t>(shape_class)][band]);
      iteration_s += line.iteration_s;
      async = async || line.async;
      run_steps.push_back({line.instance, static_cast<std::size_t>(shape_class), band, predecessor,
                           line.start_s, line.iteration_s, line.step.seconds, priced, part,
                           line.forward_cpu_s});
      if (line.host) {
        ++host_steps;
        host_outside_s += line.HostSeconds();
        host_priced_s +=
            cost_models[static_cast<std::size_t>(line.instance)]->HostTime(line.host->counts);
        for (std::size_t p = 0; p < models::kHostPhases; ++p)
          host_phase_s[p] += line.host->phase_s[p];
      }
    }
    if (!bad_instance.ok()) return bad_instance;
    end_run();
  }
  auto pct = [](double priced, double measured) {
    return measured > 0 ? json(100 * (priced / measured - 1)) : json();
  };
  auto totals = [&](const Class& c) {
    json t = {{"steps", c.steps},
              {"forward_s", c.forward_s},
              {"priced_s", c.priced_s},
              {"error_pct", pct(c.priced_s, c.forward_s)}};
    AddedToJson(c.added, t);
    // Of the steps whose line has it: how much of their passes' time the thread that ran them
    // was on a core, and the prices against that CPU time.
    if (c.cpu_steps > 0)
      t["on_cpu"] = {{"steps", c.cpu_steps},
                     {"forward_s", c.cpu_forward_s},
                     {"cpu_s", c.cpu_s},
                     {"share", c.cpu_forward_s > 0 ? json(c.cpu_s / c.cpu_forward_s) : json()},
                     {"priced_error_pct", pct(c.cpu_priced_s, c.cpu_s)}};
    return t;
  };
  json out = {{"classes", json::object()}};
  Class all;
  for (std::size_t k = 0; k < classes.size(); ++k) {
    Class& c = classes[k];
    all.Merge(c);
    json median;
    if (!c.errors.empty()) {
      auto mid = c.errors.begin() + static_cast<std::ptrdiff_t>(c.errors.size() / 2);
      std::nth_element(c.errors.begin(), mid, c.errors.end());
      median = 100 * *mid;
    }
    json& entry = out["classes"][models::ToString(static_cast<models::ShapeClass>(k))];
    entry = totals(c);
    entry["median_step_error_pct"] = median;
    // The live passes' time over what they would take at the median step's time over its price:
    // positive where a tail of slow steps, not a shift of all, makes the class's error.
    const json& error = entry["error_pct"];
    entry["tail_pct"] =
        median.is_number() && error.is_number()
            ? json(100 * ((100 + median.get<double>()) / (100 + error.get<double>()) - 1))
            : json();
    for (const auto& [key, part] :
         {std::pair{"above_split", &above_split[k]}, std::pair{"beyond_sweep", &beyond_sweep[k]}}) {
      if (part->steps > 0) entry[key] = totals(*part);
    }
  }
  if (cluster.instances.size() > 1) {
    json& split = out["beside_other_instances"] = json::object();
    for (std::size_t k = 0; k < classes.size(); ++k) {
      if (classes[k].steps == 0) continue;
      json& entry = split[models::ToString(static_cast<models::ShapeClass>(k))];
      entry = {{"alone", totals(alone[k])}, {"beside", totals(beside[k])}};
      entry["beside"]["overlap_share"] =
          beside_iteration_s[k] > 0 ? json(beside_overlap_s[k] / beside_iteration_s[k]) : json();
    }
  }
  // The profile's own decode and prefill measurements by band, priced by their fit: the fit's
  // error where the live steps' is, which the live steps' error includes (the rest is how they
  // ran live).
  struct Calibrated {
    std::int64_t shapes = 0;
    Seconds measured_s = 0, priced_s = 0;
  };
  std::array<std::map<int, Calibrated>, models::kShapeClasses> calibrated;  // by class, band
  if (profile) {
    PriceMeasurements(*profile, [&](const models::StepMeasurement& m, Seconds price) {
      const models::StepFeatures f = models::FeaturesOf(m.shape);
      if (f.empty()) return;
      const models::ShapeClass c = models::ClassOf(f);
      const int band = BandOf(c, m.shape);
      if (band < 0) return;
      Calibrated& b = calibrated[static_cast<std::size_t>(c)][band];
      ++b.shapes;
      b.measured_s += m.Median();
      b.priced_s += price;
    });
  }
  for (const auto& [shape_class, key, unit] :
       {std::tuple{models::ShapeClass::kDecode, "decode_by_rows", "rows"},
        std::tuple{models::ShapeClass::kPrefill, "prefill_by_tokens", "tokens"}}) {
    const auto k = static_cast<std::size_t>(shape_class);
    json& list = out[key] = json::array();
    for (const auto& [band, c] : bands[k]) {
      json b = totals(c);
      b[std::string(unit) + "_from"] = std::int64_t{1} << band;
      b[std::string(unit) + "_to"] = (std::int64_t{2} << band) - 1;
      if (const auto it = calibrated[k].find(band); it != calibrated[k].end())
        b["calibration"] = {{"shapes", it->second.shapes},
                            {"measured_s", it->second.measured_s},
                            {"priced_s", it->second.priced_s},
                            {"error_pct", pct(it->second.priced_s, it->second.measured_s)}};
      if (shape_class == models::ShapeClass::kDecode && cluster.instances.size() > 1) {
        b["alone"] = totals(decode_bands_apart[band][0]);
        b["beside"] = totals(decode_bands_apart[band][1]);
      }
      list.push_back(std::move(b));
    }
  }
  for (std::size_t k = 0; k < models::kShapeClasses; ++k) {
    json& entry = out["classes"][models::ToString(static_cast<models::ShapeClass>(k))];
    entry["after"] = json::object();
    for (std::size_t p = 0; p < kPredecessors; ++p)
      if (after[k][p].steps > 0) entry["after"][PredecessorName(p)] = totals(after[k][p]);
  }
  out["live_steps"] = all.steps;
  const json::json_pointer simulated_steps("/sim/engine_steps");
  out["simulated_steps"] =
      simulated_summary.contains(simulated_steps) ? simulated_summary[simulated_steps] : json();
  out["forward_s"] = all.forward_s;
  out["priced_s"] = all.priced_s;
  out["priced_error_pct"] = pct(all.priced_s, all.forward_s);
  AddedToJson(all.added, out);
  if (const json t = totals(all); t.contains("on_cpu")) out["on_cpu"] = t["on_cpu"];
  out["iteration_s"] = iteration_s;
  out["outside_forward_ms_per_step"] =
      all.steps > 0 && !async
          ? json(1e3 * (iteration_s - all.forward_s) / static_cast<double>(all.steps))
          : json();
  if (host_steps > 0) {
    // Per iteration, in ms: each phase, the rest outside the forward pass ("other": the loop's
    // own bookkeeping between phases), and what the cost model prices (0 where it does not).
    const double per = 1e3 / static_cast<double>(host_steps);
    json host = {{"steps", host_steps}, {"outside_forward_ms", per * host_outside_s}};
    double phases = 0;
    for (std::size_t p = 0; p < models::kHostPhases; ++p) {
      host[std::string(models::kHostPhaseNames[p]) + "_ms"] = per * host_phase_s[p];
      phases += host_phase_s[p];
    }
    host["other_ms"] = per * (host_outside_s - phases);
    host["priced_ms"] = per * host_priced_s;
    host["priced_error_pct"] = pct(host_priced_s, host_outside_s);
    out["host_per_step"] = std::move(host);
  }
  out["priced_error_pct_by_quarter"] = json::array();
  for (std::size_t q = 0; q < 4; ++q)
    out["priced_error_pct_by_quarter"].push_back(pct(quarter_priced[q], quarter_forward[q]));
  out["priced_error_pct_by_run"] = json::array();
  for (std::size_t k = 0; k < run_forward.size(); ++k) {
    const ByClass &f = run_forward[k], &p = run_priced[k];
    out["priced_error_pct_by_run"].push_back(
        pct(std::accumulate(p.begin(), p.end(), 0.0), std::accumulate(f.begin(), f.end(), 0.0)));
    for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
      json& entry = out["classes"][models::ToString(static_cast<models::ShapeClass>(c))];
      entry["priced_error_pct_by_run"].push_back(pct(p[c], f[c]));
    }
  }
  return out;
}

double AddedBeyondShape(const json& sum) {
  return sum.value("after_idle_s", 0.0) + sum.value("after_step_s", 0.0) +
         sum.value("beside_s", 0.0);
}

namespace {

// A fit's pieces of class `c` scaled: below its split (or all, unsplit) by `k`, above by `k_above`.
void ScaleClass(models::StepFit& fit, std::size_t c, double k, double k_above) {
  for (models::AffinePiece& piece : fit.pieces[c])
    for (double& v : piece.seconds_per) v *= k;
  for (models::AffinePiece& piece : fit.pieces_above[c])
    for (double& v : piece.seconds_per) v *= k_above;
}

// A class's pieces by name: "decode", or "decode above split" where the class is split.
std::string PiecesName(std::size_t c, bool above) {
  return std::string(models::ToString(static_cast<models::ShapeClass>(c))) +
         (above ? " above split" : "");
}

}  // namespace

std::pair<models::StepProfile, json> ProfileAsLive(const sim::ClusterSpec& cluster,
                                                   const json& steps) {
  models::StepProfile profile = *cluster.cost_model.profile;
  json scales = json::object();
  auto ratio = [](double forward_s, double priced_s) {
    return forward_s > 0 && priced_s > 0 ? forward_s / priced_s : 1.0;
  };
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const std::string name = models::ToString(static_cast<models::ShapeClass>(c));
    const json& cls = steps["classes"][name];
    // The pieces' share of the price: the forward passes less what the cost model adds for what
    // ran before the steps, over the price less it, so that the pieces scaled and that added
    // again take the live passes' time.
    auto less_added = [](const json& t, const char* key) {
      return t[key].get<double>() - AddedBeyondShape(t);
    };
    std::int64_t below_steps = cls["steps"].get<std::int64_t>();
    double forward_s = less_added(cls, "forward_s"), priced_s = less_added(cls, "priced_s");
    double k_above = 1;
    if (cls.contains("above_split")) {
      const json& a = cls["above_split"];
      k_above = ratio(less_added(a, "forward_s"), less_added(a, "priced_s"));
      below_steps -= a["steps"].get<std::int64_t>();
      forward_s -= less_added(a, "forward_s");
      priced_s -= less_added(a, "priced_s");
      scales[PiecesName(c, true)] = k_above;
    }
    const double k = below_steps > 0 ? ratio(forward_s, priced_s) : 1.0;
    scales[name] = k;
    for (models::StepFit& fit : profile.fits) ScaleClass(fit, c, k, k_above);
  }
  return {std::move(profile), scales};
}

std::vector<std::size_t> ReferenceShapes(const models::StepProfile& profile) {
  constexpr Tokens kPrefillTokens = 256, kDecodeRows = 8, kDecodeContext = 256;
  std::optional<std::size_t> prefill, decode, one_row;
  const auto& ms = profile.measurements;
  auto context_per_row = [&](std::size_t i) {
    return ms[i].shape.decode_context_tokens / ms[i].shape.decode_tokens;
  };
  // Of two decode shapes of equal rows: the least context of at least kDecodeContext, else the
  // most.
  auto better_context = [&](std::size_t i, std::size_t than) {
    const Tokens c = context_per_row(i), best = context_per_row(than);
    return best < kDecodeContext ? c > best : (c >= kDecodeContext && c < best);
  };
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const models::StepShape& s = ms[i].shape;
    if (s.tp != 1 || ms[i].seconds.empty()) continue;
    if (s.decode_tokens == 0 && s.prefill.size() == 1 && s.prefill[0].context == 0 &&
        s.prefill[0].tokens <= kPrefillTokens &&
        (!prefill || s.prefill[0].tokens > ms[*prefill].shape.prefill[0].tokens))
      prefill = i;
    if (!s.prefill.empty() || s.decode_tokens == 0 || s.decode_tokens > kDecodeRows) continue;
    if (!decode || s.decode_tokens > ms[*decode].shape.decode_tokens ||
        (s.decode_tokens == ms[*decode].shape.decode_tokens && better_context(i, *decode)))
      decode = i;
    if (s.decode_tokens == 1 && (!one_row || better_context(i, *one_row))) one_row = i;
  }
  std::vector<std::size_t> out;
  if (prefill) out.push_back(*prefill);
  if (decode) out.push_back(*decode);
  if (one_row && one_row != decode) out.push_back(*one_row);
  return out;
}

std::string ReferenceShapeName(const models::StepShape& s) {
  if (s.decode_tokens == 0) return "prefill " + std::to_string(s.PrefillTokens());
  return "decode " + std::to_string(s.decode_tokens) + "x" +
         std::to_string(s.decode_context_tokens / s.decode_tokens);
}

std::pair<models::StepProfile, json> ProfileAtMachineSpeed(const models::StepProfile& profile,
                                                           const json& machine) {
  const double all = 1 + machine["slower_pct"].get<double>() / 100;
  // Of each set of pieces (PiecesName) that prices a reference shape: the shapes' calibrated
  // time, their time now, and their names.
  struct Reading {
    double then_ms = 0, now_ms = 0;
    std::string by;
  };
  std::map<std::string, Reading> readings;
  const models::StepFit* fit = profile.FitFor(1);  // the reference shapes' TP
  if (fit && machine.contains("shapes"))
    for (const json& shape : machine["timings"].front()["shapes"]) {
      const std::string name = shape["name"].get<std::string>();
      auto parsed = models::ParseStepShape(shape.value("shape", json()), "shape");
      if (!parsed || !machine["shapes"].contains(name)) continue;
      const models::StepFeatures f = models::FeaturesOf(*parsed);
      if (f.empty()) continue;
      const models::ShapeClass c = models::ClassOf(f);
      const auto i = static_cast<std::size_t>(c);
      const bool above = &fit->PiecesFor(c, f.tokens()) == &fit->pieces_above[i];
      Reading& r = readings[PiecesName(i, above)];
      const double then_ms = shape["calibrated_ms"].get<double>();
      r.then_ms += then_ms;
      r.now_ms += then_ms * (1 + machine["shapes"][name].get<double>() / 100);
      r.by += (r.by.empty() ? "" : ", ") + name;
    }
  json out = {{"scale", all}, {"scales", json::object()}, {"by", json::object()}};
  auto scale_of = [&](std::size_t c, bool above) {
    const std::string name = PiecesName(c, above);
    const auto it = readings.find(name);
    const double k = it != readings.end() && it->second.then_ms > 0
                         ? it->second.now_ms / it->second.then_ms
                         : all;
    out["scales"][name] = k;
    if (it != readings.end()) out["by"][name] = it->second.by;
    return k;
  };
  models::StepProfile scaled = profile;
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const double k = scale_of(c, false);
    const double k_above = fit && fit->split_rows[c] > 0 ? scale_of(c, true) : k;
    for (models::StepFit& f : scaled.fits) ScaleClass(f, c, k, k_above);
  }
  return {std::move(scaled), std::move(out)};
}

models::StepProfile ProfileScaled(const models::StepProfile& profile, double k,
                                  std::optional<models::ShapeClass> only) {
  models::StepProfile scaled = profile;
  for (models::StepFit& fit : scaled.fits)
    for (std::size_t c = 0; c < models::kShapeClasses; ++c)
      if (!only || static_cast<std::size_t>(*only) == c) ScaleClass(fit, c, k, k);
  return scaled;
}

json LiveSpeed(const models::StepProfile& profile, const json& steps) {
  Seconds measured_s = 0, priced_s = 0;
  PriceMeasurements(profile, [&](const models::StepMeasurement& m, Seconds price) {
    measured_s += m.Median();
    priced_s += price;
  });
  // Less what the cost model adds for what ran before and beside the steps, which a profile
  // scaled to this speed adds as it is.
  const double added_s = AddedBeyondShape(steps);
  const double live_s = steps["forward_s"].get<double>() - added_s,
               live_priced_s = steps["priced_s"].get<double>() - added_s;
  if (measured_s <= 0 || priced_s <= 0 || live_s <= 0 || live_priced_s <= 0) return nullptr;
  const double live_over_priced = live_s / live_priced_s,
               fits_over_measured = priced_s / measured_s;
  return {{"scale", live_over_priced * fits_over_measured},
          {"live_over_priced", live_over_priced},
          {"fits_over_measured", fits_over_measured}};
}

Result<std::string> WriteClusterWithProfile(const sim::ClusterSpec& cluster,
                                            const models::StepProfile& profile,
                                            const std::string& dir, const std::string& name) {
  const std::string profile_path =
      fs::absolute(fs::path(dir) / ("profile-" + name + ".json")).string();
  const std::string cluster_path = (fs::path(dir) / ("cluster-" + name + ".json")).string();
  auto doc = ReadJsonFile(cluster.path);
  if (!doc) return doc.status();
  sim::AbsolutizeClusterRefs(*doc, fs::absolute(cluster.path).parent_path().string());
  (*doc)["cost_model"]["profile"] = profile_path;
  for (const auto& [path, text] : {std::pair{profile_path, models::FormatStepProfile(profile)},
                                   std::pair{cluster_path, doc->dump(1) + "\n"}}) {
    std::ofstream out(path);
    out << text;
    if (!out) return Status::Error("--out: cannot write " + path);
  }
  return cluster_path;
}

}  // namespace duet::cli
