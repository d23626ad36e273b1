// Step profiles (see step_profile.h): the shape and profile formats, the fitted cost model and
// its error on measurements.
#include "models/step_profile.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "common/json_util.h"

namespace duet::models {

using json = nlohmann::json;

namespace {

constexpr std::int64_t kMaxChunkTokens = std::int64_t{1} << 24;
constexpr std::int64_t kMaxChunks = 1 << 16;
constexpr std::int64_t kMaxDecodeRows = 1 << 20;
constexpr std::int64_t kMaxDecodeContext = std::int64_t{1} << 40;
constexpr std::int64_t kMaxTp = 64;
constexpr std::size_t kMaxRepeats = 1000;
constexpr std::size_t kMaxMeasurements = 100000;
constexpr std::size_t kMaxTimes = std::size_t{1} << 22;  // step times in one file: 32 MiB
constexpr double kMinStepSeconds = 1e-9;                 // a nanosecond: no step is shorter
constexpr double kMaxStepSeconds = 3600;
// A step beside another instance's at most this many times its time alone beyond it: two
// instances sharing a machine slow each other by a fraction, not by orders of magnitude.
constexpr double kMaxBesideShare = 100;
constexpr double kMaxCoefficient = 1e4;  // seconds per unit: above the longest step
constexpr std::size_t kMaxSourceBytes = 64 * 1024;
constexpr std::size_t kMaxLinks = 16;
constexpr std::size_t kMaxTransferSizes = 1000;
constexpr std::int64_t kMaxTransferBytes = std::int64_t{1} << 40;
// A link's fit, bounded as cluster files bound their links (sim/cluster_spec.cpp).
constexpr double kMinBandwidthGBps = 1e-6, kMaxBandwidthGBps = 1e6, kMaxLatencyUs = 1e6;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// ---- JSON ------------------------------------------------------------------------------------

json FitErrorToJson(const FitError& e) {
  return {{"shapes", e.shapes},
          {"mean_pct", e.mean_pct},
          {"p90_pct", e.p90_pct},
          {"max_pct", e.max_pct}};
}

Result<FitError> ParseFitError(const json& e, const std::string& where) {
  if (!e.is_object()) return Status::Error(where + ": must be an object");
  FitError out;
  auto shapes = JsonIntIn(e, "shapes", 0, std::int64_t(kMaxMeasurements), where);
  if (!shapes) return shapes.status();
  out.shapes = static_cast<int>(*shapes);
  double* fields[] = {&out.mean_pct, &out.p90_pct, &out.max_pct};
  const char* keys[] = {"mean_pct", "p90_pct", "max_pct"};
  for (std::size_t k = 0; k < 3; ++k) {
    auto v = JsonNumberIn(e, keys[k], 0, 1e9, where);
    if (!v) return v.status();
    *fields[k] = *v;
  }
  return out;
}

json ErrorToJson(const ClassErrors& errors) {
  json out = json::object();
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    if (errors[c].shapes == 0) continue;
    out[ToString(static_cast<ShapeClass>(c))] = FitErrorToJson(errors[c]);
  }
  return out;
}

Status ParseErrors(const json& fit, const std::string& key, const std::string& where,
                   ClassErrors& out) {
  if (!JsonHas(fit, key)) return Status::Ok();
  const json& obj = fit[key];
  const std::string w = where + ": " + key;
  if (!obj.is_object()) return Status::Error(w + ": must be an object");
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const char* name = ToString(static_cast<ShapeClass>(c));
    if (!JsonHas(obj, name)) continue;
    auto e = ParseFitError(obj[name], w + "." + name);
    if (!e) return e.status();
    out[c] = *e;
  }
  return Status::Ok();
}

std::optional<std::size_t> ClassNamed(std::string_view name) {
  for (std::size_t c = 0; c < kShapeClasses; ++c)
    if (name == ToString(static_cast<ShapeClass>(c))) return c;
  return std::nullopt;
}

json PiecesToJson(const std::vector<AffinePiece>& pieces) {
  json list = json::array();
  for (const AffinePiece& p : pieces) {
    json piece = json::object();
    for (std::size_t col = 0; col < kFitColumns; ++col)
      piece[std::string(kFitColumnNames[col])] = p.seconds_per[col];
    list.push_back(piece);
  }
  return list;
}

Status ParsePieces(const json& list, const std::string& where, std::vector<AffinePiece>& out) {
  if (!list.is_array() || list.empty() || list.size() > 2)
    return Status::Error(where + ": must be an array of 1 or 2 pieces");
  for (std::size_t k = 0; k < list.size(); ++k) {
    const json& p = list[k];
    const std::string wp = where + "[" + std::to_string(k) + "]";
    if (!p.is_object()) return Status::Error(wp + ": must be an object");
    for (const auto& [key, value] : p.items()) {
      if (std::find(kFitColumnNames.begin(), kFitColumnNames.end(), key) == kFitColumnNames.end())
        return Status::Error(wp + ": unknown column '" + key + "'");
    }
    AffinePiece piece;
    for (std::size_t col = 0; col < kFitColumns; ++col) {
      auto v = JsonNumberIn(p, std::string(kFitColumnNames[col]), 0, kMaxCoefficient, wp, 0.0);
      if (!v) return v.status();
      piece.seconds_per[col] = *v;
    }
    out.push_back(piece);
  }
  return Status::Ok();
}

Result<StepFit> ParseFit(const json& fit, const std::string& where) {
  if (!fit.is_object()) return Status::Error(where + ": must be an object");
  StepFit out;
  auto tp = JsonIntIn(fit, "tp", 1, kMaxTp, where);
  if (!tp) return tp.status();
  out.tp = static_cast<int>(*tp);
  if (!JsonHas(fit, "pieces") || !fit["pieces"].is_object())
    return FieldError(where, "pieces", "must be an object with prefill, decode and mixed");
  for (const auto& [key, value] : fit["pieces"].items()) {
    if (!ClassNamed(key)) return Status::Error(where + ": pieces: unknown class '" + key + "'");
  }
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const std::string name = ToString(static_cast<ShapeClass>(c));
    const json& list = fit["pieces"].contains(name) ? fit["pieces"][name] : json();
    DUET_RETURN_IF_ERROR(ParsePieces(list, where + ": pieces." + name, out.pieces[c]));
  }
  if (JsonHas(fit, "split")) {
    const json& split = fit["split"];
    if (!split.is_object()) return FieldError(where, "split", "must be an object");
    for (const auto& [key, value] : split.items()) {
      const std::optional<std::size_t> i = ClassNamed(key);
      if (!i) return Status::Error(where + ": split: unknown class '" + key + "'");
      const std::string wc = where + ": split." + key;
      if (!value.is_object()) return Status::Error(wc + ": must be an object");
      auto rows = JsonIntIn(value, "rows", 2, kMaxChunkTokens, wc);
      if (!rows) return rows.status();
      out.split_rows[*i] = *rows;
      const json& list = value.contains("pieces") ? value["pieces"] : json();
      DUET_RETURN_IF_ERROR(ParsePieces(list, wc + ".pieces", out.pieces_above[*i]));
    }
  }
  DUET_RETURN_IF_ERROR(ParseErrors(fit, "training_error", where, out.training));
  DUET_RETURN_IF_ERROR(ParseErrors(fit, "held_out_error", where, out.held_out));
  DUET_RETURN_IF_ERROR(ParseErrors(fit, "roofline_held_out_error", where, out.roofline_held_out));
  DUET_RETURN_IF_ERROR(ParseErrors(fit, "extrapolation_error", where, out.extrapolation));
  return out;
}

// "seconds": one number or an array of repeats, each in [1e-9, 3600].
Result<std::vector<Seconds>> ParseSeconds(const json& obj, const std::string& where) {
  const auto it = obj.find("seconds");
  if (it == obj.end() || it->is_null()) return FieldError(where, "seconds", "is missing");
  const json one = it->is_array() ? *it : json::array({*it});
  if (one.empty() || one.size() > kMaxRepeats)
    return FieldError(where, "seconds",
                      "must be a number or an array of 1 to " + std::to_string(kMaxRepeats));
  std::vector<Seconds> out;
  for (const json& v : one) {
    if (!v.is_number() || !(v.get<double>() >= kMinStepSeconds) ||
        v.get<double>() > kMaxStepSeconds)
      return FieldError(where, "seconds",
                        "must hold times in [1e-9, " + std::to_string(int(kMaxStepSeconds)) +
                            "] seconds (got " + DescribeJson(v) + ")");
    out.push_back(v.get<double>());
  }
  return out;
}

json LinkToJson(const LinkFit& link) {
  json measurements = json::array();
  for (const TransferMeasurement& m : link.measurements)
    measurements.push_back({{"bytes", m.bytes}, {"seconds", m.seconds}, {"held_out", m.held_out}});
  return {{"transport", link.transport},
          {"path", link.path},
          {"latency_us", link.latency * 1e6},
          {"bandwidth_GBps", link.bandwidth / 1e9},
          {"training_error", FitErrorToJson(link.training)},
          {"held_out_error", FitErrorToJson(link.held_out)},
          {"measurements", measurements}};
}

json HostFitToJson(const HostFit& host) {
  json per = json::object();
  for (std::size_t k = 0; k < kHostColumns; ++k)
    per[std::string(kHostColumnNames[k])] = host.seconds_per[k];
  return {{"seconds_per", per},
          {"steps", host.steps},
          {"training_error", FitErrorToJson(host.training)},
          {"held_out_error", FitErrorToJson(host.held_out)},
          {"held_out_total_pct", host.held_out_total_pct},
          {"wake_s", host.wake_s},
          {"wakes", host.wakes}};
}

Result<HostFit> ParseHostFit(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  HostFit host;
  if (!JsonHas(obj, "seconds_per") || !obj["seconds_per"].is_object())
    return FieldError(where, "seconds_per", "must be an object");
  const std::string per_where = where + ": seconds_per";
  for (std::size_t k = 0; k < kHostColumns; ++k) {
    auto v = JsonNumberIn(obj["seconds_per"], std::string(kHostColumnNames[k]), 0, kMaxStepSeconds,
                          per_where);
    if (!v) return v.status();
    host.seconds_per[k] = *v;
  }
  auto steps = JsonIntIn(obj, "steps", 0, std::int64_t{1} << 30, where);
  if (!steps) return steps.status();
  host.steps = static_cast<int>(*steps);
  for (auto [key, out] :
       {std::pair{"training_error", &host.training}, std::pair{"held_out_error", &host.held_out}}) {
    if (!JsonHas(obj, key)) continue;
    auto e = ParseFitError(obj[key], where + ": " + key);
    if (!e) return e.status();
    *out = *e;
  }
  auto total = JsonNumberIn(obj, "held_out_total_pct", -100, 1e9, where, 0.0);
  if (!total) return total.status();
  host.held_out_total_pct = *total;
  // (Absent in profiles fitted before the wake-up was measured.)
  auto wake_s = JsonNumberIn(obj, "wake_s", 0, kMaxStepSeconds, where, 0.0);
  if (!wake_s) return wake_s.status();
  host.wake_s = *wake_s;
  auto wakes = JsonIntIn(obj, "wakes", 0, std::int64_t{1} << 30, where, 0);
  if (!wakes) return wakes.status();
  host.wakes = static_cast<int>(*wakes);
  return host;
}

json AfterIdleFitToJson(const AfterIdleFit& fit) {
  return {{"idle_s", fit.idle_s},
          {"prefill_s", fit.prefill_s},
          {"decode_s", fit.decode_s},
          {"repeats", fit.repeats}};
}

Result<AfterIdleFit> ParseAfterIdleFit(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  constexpr std::size_t kMaxSpells = 32;
  AfterIdleFit fit;
  for (auto [key, out, lo, range] : {std::tuple{"idle_s", &fit.idle_s, kIdleGap, "[0.001, 3600]"},
                                     std::tuple{"prefill_s", &fit.prefill_s, 0.0, "[0, 3600]"},
                                     std::tuple{"decode_s", &fit.decode_s, 0.0, "[0, 3600]"}}) {
    if (!JsonHas(obj, key) || !obj[key].is_array() || obj[key].empty() ||
        obj[key].size() > kMaxSpells)
      return FieldError(where, key,
                        "must be an array of 1 to " + std::to_string(kMaxSpells) + " times");
    for (const json& v : obj[key]) {
      if (!v.is_number() || !(v.get<double>() >= lo) || v.get<double>() > kMaxStepSeconds)
        return FieldError(where, key, std::string("must hold seconds in ") + range);
      out->push_back(v.get<double>());
    }
  }
  for (std::size_t i = 1; i < fit.idle_s.size(); ++i)
    if (!(fit.idle_s[i] > fit.idle_s[i - 1]))
      return FieldError(where, "idle_s", "must be ascending");
  if (fit.prefill_s.size() != fit.idle_s.size() || fit.decode_s.size() != fit.idle_s.size())
    return Status::Error(where + ": prefill_s and decode_s must have a time for each of idle_s");
  auto repeats = JsonIntIn(obj, "repeats", 1, 1000, where);
  if (!repeats) return repeats.status();
  fit.repeats = static_cast<int>(*repeats);
  return fit;
}

json ShapePairFitToJson(const ShapePairFit& fit) {
  json out = {{"decode_rows", fit.decode_rows},
              {"prefill_tokens", fit.prefill_tokens},
              {"extra_s", fit.extra_s},
              {"repeats", fit.repeats}};
  if (!fit.alone_s.empty()) out["alone_s"] = fit.alone_s;
  return out;
}

// A profile's after_step (`after_step` true: 0 on the diagonal) or its beside (false: alone_s
// required, each row's extras bounded by kMaxBesideShare times its alone_s).
Result<ShapePairFit> ParseShapePairFit(const json& obj, const std::string& where, bool after_step) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  constexpr std::size_t kMaxShapes = 16;
  ShapePairFit fit;
  for (auto [key, out, max] :
       {std::tuple{"decode_rows", &fit.decode_rows, kMaxDecodeRows},
        std::tuple{"prefill_tokens", &fit.prefill_tokens, kMaxChunkTokens}}) {
    const std::string range = "[1, " + std::to_string(max) + "]";
    if (!JsonHas(obj, key) || !obj[key].is_array() || obj[key].empty() ||
        obj[key].size() > kMaxShapes)
      return FieldError(where, key,
                        "must be an array of 1 to " + std::to_string(kMaxShapes) + " sizes");
    for (const json& v : obj[key]) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > max)
        return FieldError(where, key, "must hold whole numbers in " + range);
      if (!out->empty() && v.get<Tokens>() <= out->back())
        return FieldError(where, key, "must be ascending");
      out->push_back(v.get<Tokens>());
    }
  }
  const std::size_t n = fit.decode_rows.size() + fit.prefill_tokens.size();
  const std::string square = "must be " + std::to_string(n) + " rows of " + std::to_string(n) +
                             " times in [0, 3600] (one per shape in decode_rows, then "
                             "prefill_tokens)" +
                             (after_step ? ", 0 on the diagonal" : "");
  if (!JsonHas(obj, "extra_s") || !obj["extra_s"].is_array() || obj["extra_s"].size() != n)
    return FieldError(where, "extra_s", square);
  for (std::size_t i = 0; i < n; ++i) {
    const json& row = obj["extra_s"][i];
    if (!row.is_array() || row.size() != n) return FieldError(where, "extra_s", square);
    fit.extra_s.emplace_back();
    for (std::size_t j = 0; j < n; ++j) {
      const json& v = row[j];
      if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > kMaxStepSeconds ||
          (after_step && i == j && v.get<double>() != 0))
        return FieldError(where, "extra_s", square);
      fit.extra_s.back().push_back(v.get<double>());
    }
  }
  if (!after_step) {
    const std::string times = "must be " + std::to_string(n) +
                              " times in [1e-9, 3600] (one per shape in decode_rows, then "
                              "prefill_tokens)";
    if (!JsonHas(obj, "alone_s") || !obj["alone_s"].is_array() || obj["alone_s"].size() != n)
      return FieldError(where, "alone_s", times);
    for (std::size_t i = 0; i < n; ++i) {
      const json& v = obj["alone_s"][i];
      if (!v.is_number() || !(v.get<double>() >= kMinStepSeconds) ||
          v.get<double>() > kMaxStepSeconds)
        return FieldError(where, "alone_s", times);
      fit.alone_s.push_back(v.get<double>());
      for (const Seconds extra : fit.extra_s[i])
        if (extra > kMaxBesideShare * fit.alone_s[i])
          return FieldError(where, "extra_s",
                            "must be at most " + std::to_string(int(kMaxBesideShare)) +
                                " times the shape's alone_s in each row");
    }
  }
  auto repeats = JsonIntIn(obj, "repeats", 1, 1000, where);
  if (!repeats) return repeats.status();
  fit.repeats = static_cast<int>(*repeats);
  return fit;
}

json FrontendFitToJson(const FrontendFit& frontend) {
  return {{"request_s", frontend.request_s},
          {"prompt_token_s", frontend.prompt_token_s},
          {"requests", frontend.requests},
          {"training_error", FitErrorToJson(frontend.training)}};
}

Result<FrontendFit> ParseFrontendFit(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  FrontendFit frontend;
  for (auto [key, out] : {std::pair{"request_s", &frontend.request_s},
                          std::pair{"prompt_token_s", &frontend.prompt_token_s}}) {
    auto v = JsonNumberIn(obj, key, 0, kMaxStepSeconds, where);
    if (!v) return v.status();
    *out = *v;
  }
  auto requests = JsonIntIn(obj, "requests", 0, std::int64_t{1} << 30, where);
  if (!requests) return requests.status();
  frontend.requests = static_cast<int>(*requests);
  if (JsonHas(obj, "training_error")) {
    auto e = ParseFitError(obj["training_error"], where + ": training_error");
    if (!e) return e.status();
    frontend.training = *e;
  }
  return frontend;
}

// `times`: the step and transfer times read so far, bounded by kMaxTimes.
Result<LinkFit> ParseLink(const json& obj, const std::string& where, std::size_t& times) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  LinkFit link;
  auto transport = JsonString(obj, "transport", where);
  if (!transport) return transport.status();
  if (transport->empty() || transport->size() > 64)
    return FieldError(where, "transport", "must be a name of 1 to 64 characters");
  link.transport = *transport;
  auto path = JsonStringOr(obj, "path", "", where);
  if (!path) return path.status();
  if (path->size() > 200) return FieldError(where, "path", "is longer than 200 characters");
  link.path = *path;
  auto latency = JsonNumberIn(obj, "latency_us", 0, kMaxLatencyUs, where);
  if (!latency) return latency.status();
  auto bandwidth = JsonNumberIn(obj, "bandwidth_GBps", kMinBandwidthGBps, kMaxBandwidthGBps, where);
  if (!bandwidth) return bandwidth.status();
  link.latency = *latency * 1e-6;
  link.bandwidth = *bandwidth * 1e9;
  for (auto [key, out] :
       {std::pair{"training_error", &link.training}, std::pair{"held_out_error", &link.held_out}}) {
    if (!JsonHas(obj, key)) continue;
    auto e = ParseFitError(obj[key], where + ": " + key);
    if (!e) return e.status();
    *out = *e;
  }
  if (JsonHas(obj, "measurements")) {
    const json& ms = obj["measurements"];
    if (!ms.is_array() || ms.size() > kMaxTransferSizes)
      return FieldError(where, "measurements",
                        "must be an array of at most " + std::to_string(kMaxTransferSizes));
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const std::string at = where + ": measurements[" + std::to_string(i) + "]";
      if (!ms[i].is_object()) return Status::Error(at + ": must be an object");
      TransferMeasurement m;
      auto bytes = JsonIntIn(ms[i], "bytes", 1, kMaxTransferBytes, at);
      if (!bytes) return bytes.status();
      m.bytes = *bytes;
      auto seconds = ParseSeconds(ms[i], at);
      if (!seconds) return seconds.status();
      m.seconds = std::move(*seconds);
      if ((times += m.seconds.size()) > kMaxTimes)
        return Status::Error(at + ": more than " + std::to_string(kMaxTimes) + " times");
      auto held = JsonBoolOr(ms[i], "held_out", false, at);
      if (!held) return held.status();
      m.held_out = *held;
      link.measurements.push_back(std::move(m));
    }
  }
  return link;
}

}  // namespace

Result<StepMeasurement> ParseStepMeasurement(const json& obj, const std::string& where) {
  auto shape = ParseStepShape(obj, where);
  if (!shape) return shape.status();
  StepMeasurement m;
  m.shape = std::move(*shape);
  if (FeaturesOf(m.shape).empty())
    return Status::Error(where + ": a step with no tokens (nothing to time)");
  auto seconds = ParseSeconds(obj, where);
  if (!seconds) return seconds.status();
  m.seconds = std::move(*seconds);
  auto held = JsonBoolOr(obj, "held_out", false, where);
  if (!held) return held.status();
  m.held_out = *held;
  return m;
}

std::array<double, kFitColumns> FitColumns(const StepFeatures& f) {
  return {1.0,
          f.prefill_chunks,
          f.prefill_tokens,
          f.prefill_context_tokens,
          f.prefill_pairs,
          f.decode_rows,
          f.decode_context_tokens};
}

json StepShapeToJson(const StepShape& shape) {
  json prefill = json::array();
  for (const PrefillChunk& c : shape.prefill) prefill.push_back({c.tokens, c.context});
  return {{"prefill", prefill},
          {"decode_tokens", shape.decode_tokens},
          {"decode_context_tokens", shape.decode_context_tokens},
          {"tp", shape.tp}};
}

json StepTiming::ToJson() const {
  json line = StepShapeToJson(shape);
  line["seconds"] = seconds;
  return line;
}

Result<StepShape> ParseStepShape(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  StepShape shape;
  if (JsonHas(obj, "prefill")) {
    const json& prefill = obj["prefill"];
    if (!prefill.is_array() || prefill.size() > std::size_t(kMaxChunks))
      return FieldError(
          where, "prefill",
          "must be an array of at most " + std::to_string(kMaxChunks) + " [tokens, context] pairs");
    for (std::size_t i = 0; i < prefill.size(); ++i) {
      const json& pair = prefill[i];
      const std::string key = "prefill[" + std::to_string(i) + "]";
      auto bad = [&] {
        return FieldError(where, key,
                          "must be [tokens, context] with tokens in [1, " +
                              std::to_string(kMaxChunkTokens) + "] and context in [0, " +
                              std::to_string(kMaxChunkTokens) + "] (got " + DescribeJson(pair) +
                              ")");
      };
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
          !pair[1].is_number_integer())
        return bad();
      const std::int64_t tokens = pair[0].get<std::int64_t>();
      const std::int64_t context = pair[1].get<std::int64_t>();
      // Unsigned values past INT64_MAX read as negative here, so they fail too.
      if (tokens < 1 || tokens > kMaxChunkTokens || context < 0 || context > kMaxChunkTokens)
        return bad();
      shape.prefill.push_back({tokens, context});
    }
  }
  auto rows = JsonIntIn(obj, "decode_tokens", 0, kMaxDecodeRows, where, 0);
  if (!rows) return rows.status();
  auto context = JsonIntIn(obj, "decode_context_tokens", 0, kMaxDecodeContext, where, 0);
  if (!context) return context.status();
  auto tp = JsonIntIn(obj, "tp", 1, kMaxTp, where, 1);
  if (!tp) return tp.status();
  shape.decode_tokens = *rows;
  shape.decode_context_tokens = *context;
  shape.tp = static_cast<int>(*tp);
  return shape;
}

const char* ToString(ShapeClass c) {
  switch (c) {
    case ShapeClass::kPrefill:
      return "prefill";
    case ShapeClass::kDecode:
      return "decode";
    case ShapeClass::kMixed:
      break;
  }
  return "mixed";
}

ShapeClass ClassOf(const StepFeatures& f) {
  if (f.prefill_chunks > 0 && f.decode_rows > 0) return ShapeClass::kMixed;
  return f.prefill_chunks > 0 ? ShapeClass::kPrefill : ShapeClass::kDecode;
}

Seconds MedianOf(std::vector<Seconds> seconds) { return Percentile(std::move(seconds), 0.5); }

Seconds StepMeasurement::Median() const { return MedianOf(seconds); }

Seconds TransferMeasurement::Median() const { return MedianOf(seconds); }

Status PoolMeasurements(std::vector<StepMeasurement>& measurements,
                        const std::vector<StepMeasurement>& other, const std::string& where) {
  // Each shape's places in `other`, in order (a sweep may time one shape twice).
  std::map<std::string, std::deque<std::size_t>> places;
  for (std::size_t i = 0; i < other.size(); ++i)
    places[StepShapeToJson(other[i].shape).dump()].push_back(i);
  std::size_t times = 0;
  for (const StepMeasurement& m : measurements) times += m.seconds.size();
  for (const StepMeasurement& m : other) times += m.seconds.size();
  if (other.size() != measurements.size())
    return Status::Error(where + ": " + std::to_string(other.size()) +
                         " step shapes where these are " + std::to_string(measurements.size()) +
                         ": not the same sweep");
  if (times > kMaxTimes)
    return Status::Error(where + ": more than " + std::to_string(kMaxTimes) +
                         " step times together with these");
  for (StepMeasurement& m : measurements) {
    const std::string key = StepShapeToJson(m.shape).dump();
    auto it = places.find(key);
    if (it == places.end() || it->second.empty())
      return Status::Error(where + ": no step shape " + key + ": not the same sweep");
    const std::vector<Seconds>& more = other[it->second.front()].seconds;
    it->second.pop_front();
    m.seconds.insert(m.seconds.end(), more.begin(), more.end());
    m.held_out = false;
  }
  return Status::Ok();
}

std::vector<std::vector<double>> PassDeviationsPct(const std::vector<StepMeasurement>& measurements,
                                                   std::size_t parts) {
  const std::size_t n = measurements.size();
  if (parts == 0 || n < parts) return {};
  const std::size_t passes = measurements.front().seconds.size();
  if (passes < 2) return {};
  std::vector<Seconds> medians;
  for (const StepMeasurement& m : measurements) {
    if (m.seconds.size() != passes) return {};
    medians.push_back(m.Median());
  }
  std::vector<std::vector<double>> pct(passes);
  for (std::size_t k = 0; k < passes; ++k)
    for (std::size_t part = 0; part < parts; ++part) {
      std::vector<double> ratios;
      for (std::size_t i = part * n / parts; i < (part + 1) * n / parts; ++i)
        if (medians[i] > 0) ratios.push_back(measurements[i].seconds[k] / medians[i]);
      pct[k].push_back(ratios.empty() ? 0 : 100 * (Percentile(std::move(ratios), 0.5) - 1));
    }
  return pct;
}

Seconds AffinePiece::At(const std::array<double, kFitColumns>& columns) const {
  Seconds t = 0;
  for (std::size_t c = 0; c < kFitColumns; ++c) t += seconds_per[c] * columns[c];
  return t;
}

Seconds MaxOfPieces(const std::vector<AffinePiece>& pieces,
                    const std::array<double, kFitColumns>& columns, std::size_t* argmax) {
  Seconds best = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Seconds t = pieces[k].At(columns);
    if (k == 0 || t > best) {
      best = t;
      if (argmax) *argmax = k;
    }
  }
  return best;
}

const std::vector<AffinePiece>& StepFit::PiecesFor(ShapeClass c, double rows) const {
  const auto i = static_cast<std::size_t>(c);
  return split_rows[i] > 0 && rows >= static_cast<double>(split_rows[i]) ? pieces_above[i]
                                                                         : pieces[i];
}

Seconds StepFit::Predict(const StepFeatures& f) const {
  if (f.empty()) return 0;
  return MaxOfPieces(PiecesFor(ClassOf(f), f.tokens()), FitColumns(f));
}

const StepFit* StepProfile::FitFor(int tp) const {
  for (const StepFit& fit : fits)
    if (fit.tp == tp) return &fit;
  return nullptr;
}

nlohmann::json StepProfile::SourceField(const char* key) const {
  return source.is_object() && source.contains(key) ? source[key] : nlohmann::json();
}

const LinkFit* StepProfile::LinkFor(std::string_view transport) const {
  for (const LinkFit& link : links)
    if (link.transport == transport) return &link;
  return nullptr;
}

FitError SummarizeErrors(const std::vector<double>& pct) {
  FitError e;
  e.shapes = static_cast<int>(pct.size());
  if (pct.empty()) return e;
  e.mean_pct = std::accumulate(pct.begin(), pct.end(), 0.0) / double(pct.size());
  e.p90_pct = Percentile(pct, 0.9);
  e.max_pct = *std::max_element(pct.begin(), pct.end());
  return e;
}

ClassErrors ErrorOf(const StepCostModel& model, const std::vector<StepMeasurement>& measurements,
                    int tp, bool held_out) {
  std::array<std::vector<double>, kShapeClasses> pct;
  for (const StepMeasurement& m : measurements) {
    if (m.shape.tp != tp || m.held_out != held_out) continue;
    const auto c = static_cast<std::size_t>(ClassOf(FeaturesOf(m.shape)));
    pct[c].push_back(std::abs(model.StepTime(m.shape) / m.Median() - 1.0) * 100.0);
  }
  ClassErrors errors{};
  for (std::size_t c = 0; c < kShapeClasses; ++c) errors[c] = SummarizeErrors(pct[c]);
  return errors;
}

json StepProfileToJson(const StepProfile& profile) {
  json fits = json::array();
  for (const StepFit& fit : profile.fits) {
    json pieces = json::object();
    json split = json::object();
    for (std::size_t c = 0; c < kShapeClasses; ++c) {
      const char* name = ToString(static_cast<ShapeClass>(c));
      pieces[name] = PiecesToJson(fit.pieces[c]);
      if (fit.split_rows[c] > 0)
        split[name] = {{"rows", fit.split_rows[c]}, {"pieces", PiecesToJson(fit.pieces_above[c])}};
    }
    json out = {{"tp", fit.tp}, {"pieces", pieces}};
    if (!split.empty()) out["split"] = split;
    out["training_error"] = ErrorToJson(fit.training);
    out["held_out_error"] = ErrorToJson(fit.held_out);
    out["roofline_held_out_error"] = ErrorToJson(fit.roofline_held_out);
    out["extrapolation_error"] = ErrorToJson(fit.extrapolation);
    fits.push_back(std::move(out));
  }
  json measurements = json::array();
  for (const StepMeasurement& m : profile.measurements) {
    json line = StepShapeToJson(m.shape);
    line["seconds"] = m.seconds;
    line["held_out"] = m.held_out;
    measurements.push_back(line);
  }
  json doc = {{"format", "duet-step-profile"},
              {"version", 1},
              {"device", profile.device},
              {"source", profile.source.is_object() ? profile.source : json::object()},
              {"model", ModelSpecToJson(profile.model)},
              {"fits", fits},
              {"measurements", measurements}};
  if (!profile.links.empty()) {
    json links = json::array();
    for (const LinkFit& link : profile.links) links.push_back(LinkToJson(link));
    doc["links"] = std::move(links);
  }
  if (profile.host) doc["host"] = HostFitToJson(*profile.host);
  if (profile.frontend) doc["frontend"] = FrontendFitToJson(*profile.frontend);
  if (profile.after_idle) doc["after_idle"] = AfterIdleFitToJson(*profile.after_idle);
  if (profile.after_step) doc["after_step"] = ShapePairFitToJson(*profile.after_step);
  if (profile.beside) doc["beside"] = ShapePairFitToJson(*profile.beside);
  return doc;
}

std::string FormatStepProfile(const StepProfile& profile) {
  json doc = StepProfileToJson(profile);
  const json measurements = std::move(doc["measurements"]);
  doc.erase("measurements");
  json links = json::array();
  if (doc.contains("links")) {
    links = std::move(doc["links"]);
    doc.erase("links");
  }
  // A list with one element a line (`indent` before each).
  auto lines = [](const json& list, const char* indent) {
    std::string text = "[";
    for (std::size_t i = 0; i < list.size(); ++i)
      text += (i ? ",\n" : "\n") + std::string(indent) + list[i].dump();
    return text + "\n" + std::string(indent).substr(1) + "]";
  };
  std::string text = doc.dump(1);
  text.pop_back();  // the closing brace
  if (!links.empty()) {
    // Each link's own fields on its first line, then its measurements one a line.
    text += ",\n \"links\": [";
    for (std::size_t i = 0; i < links.size(); ++i) {
      json link = links[i];
      const json ms = std::move(link["measurements"]);
      link.erase("measurements");
      std::string head = link.dump();
      head.pop_back();
      text += (i ? ",\n  " : "\n  ") + head + ", \"measurements\": " + lines(ms, "    ") + "}";
    }
    text += "\n ]";
  }
  text += ",\n \"measurements\": " + lines(measurements, "  ") + "\n}\n";
  return text;
}

Result<StepProfile> ParseStepProfile(const json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::Error(where + ": must be a JSON object");
  auto format = JsonString(doc, "format", where);
  if (!format) return format.status();
  if (*format != "duet-step-profile")
    return FieldError(where, "format", "must be 'duet-step-profile' (got '" + *format + "')");
  auto version = JsonIntIn(doc, "version", 1, 1, where);
  if (!version) return version.status();
  StepProfile profile;
  auto device = JsonString(doc, "device", where);
  if (!device) return device.status();
  if (device->empty() || device->size() > 200)
    return FieldError(where, "device", "must be a name of 1 to 200 characters");
  profile.device = *device;
  if (JsonHas(doc, "source")) {
    if (!doc["source"].is_object()) return FieldError(where, "source", "must be an object");
    if (doc["source"].dump(-1, ' ', false, json::error_handler_t::replace).size() > kMaxSourceBytes)
      return FieldError(where, "source", "is larger than 64 KiB");
    profile.source = doc["source"];
  }
  if (!JsonHas(doc, "model")) return FieldError(where, "model", "is missing");
  auto model = ParseModelSpec(doc["model"], where + ": model");
  if (!model) return model.status();
  profile.model = std::move(*model);
  if (!JsonHas(doc, "fits") || !doc["fits"].is_array() || doc["fits"].empty() ||
      doc["fits"].size() > std::size_t(kMaxTp))
    return FieldError(where, "fits",
                      "must be an array of 1 to " + std::to_string(kMaxTp) + " fits");
  for (std::size_t i = 0; i < doc["fits"].size(); ++i) {
    auto fit = ParseFit(doc["fits"][i], where + ": fits[" + std::to_string(i) + "]");
    if (!fit) return fit.status();
    if (profile.FitFor(fit->tp))
      return Status::Error(where + ": fits[" + std::to_string(i) + "]: a second fit for tp " +
                           std::to_string(fit->tp));
    profile.fits.push_back(std::move(*fit));
  }
  std::size_t times = 0;
  if (JsonHas(doc, "measurements")) {
    const json& ms = doc["measurements"];
    if (!ms.is_array() || ms.size() > kMaxMeasurements)
      return FieldError(where, "measurements",
                        "must be an array of at most " + std::to_string(kMaxMeasurements));
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const std::string at = where + ": measurements[" + std::to_string(i) + "]";
      auto m = ParseStepMeasurement(ms[i], at);
      if (!m) return m.status();
      if ((times += m->seconds.size()) > kMaxTimes)
        return Status::Error(at + ": more than " + std::to_string(kMaxTimes) + " step times");
      profile.measurements.push_back(std::move(*m));
    }
  }
  if (JsonHas(doc, "links")) {
    const json& links = doc["links"];
    if (!links.is_array() || links.size() > kMaxLinks)
      return FieldError(where, "links",
                        "must be an array of at most " + std::to_string(kMaxLinks) + " links");
    for (std::size_t i = 0; i < links.size(); ++i) {
      const std::string at = where + ": links[" + std::to_string(i) + "]";
      auto link = ParseLink(links[i], at, times);
      if (!link) return link.status();
      if (profile.LinkFor(link->transport))
        return Status::Error(at + ": a second link for transport '" + link->transport + "'");
      profile.links.push_back(std::move(*link));
    }
  }
  if (JsonHas(doc, "host")) {
    auto host = ParseHostFit(doc["host"], where + ": host");
    if (!host) return host.status();
    profile.host = std::move(*host);
  }
  if (JsonHas(doc, "frontend")) {
    auto frontend = ParseFrontendFit(doc["frontend"], where + ": frontend");
    if (!frontend) return frontend.status();
    profile.frontend = *frontend;
  }
  if (JsonHas(doc, "after_idle")) {
    auto after_idle = ParseAfterIdleFit(doc["after_idle"], where + ": after_idle");
    if (!after_idle) return after_idle.status();
    profile.after_idle = std::move(*after_idle);
  }
  if (JsonHas(doc, "after_step")) {
    auto after_step = ParseShapePairFit(doc["after_step"], where + ": after_step", true);
    if (!after_step) return after_step.status();
    profile.after_step = std::move(*after_step);
  }
  if (JsonHas(doc, "beside")) {
    auto beside = ParseShapePairFit(doc["beside"], where + ": beside", false);
    if (!beside) return beside.status();
    profile.beside = std::move(*beside);
  }
  return profile;
}

Result<StepProfile> LoadStepProfile(const std::string& path) {
  auto doc = ReadJsonFile(path);
  if (!doc) return doc.status();
  return ParseStepProfile(*doc, path);
}

Result<std::vector<StepMeasurement>> ParseStepMeasurements(std::string_view text,
                                                           const std::string& where) {
  std::vector<StepMeasurement> out;
  std::size_t times = 0;
  DUET_RETURN_IF_ERROR(ForEachJsonLine(text, where, [&](const json& doc, const std::string& at) {
    if (out.size() >= kMaxMeasurements)
      return Status::Error(at + ": more than " + std::to_string(kMaxMeasurements) +
                           " measurements");
    auto m = ParseStepMeasurement(doc, at);
    if (!m) return m.status();
    if ((times += m->seconds.size()) > kMaxTimes)
      return Status::Error(at + ": more than " + std::to_string(kMaxTimes) + " step times");
    out.push_back(std::move(*m));
    return Status::Ok();
  }));
  return out;
}

std::optional<std::string> ArchitectureMismatch(const ModelSpec& measured, const ModelSpec& used) {
  struct Field {
    const char* name;
    std::int64_t a, b;
  };
  const Field fields[] = {
      {"num_hidden_layers", measured.num_hidden_layers, used.num_hidden_layers},
      {"hidden_size", measured.hidden_size, used.hidden_size},
      {"num_attention_heads", measured.num_attention_heads, used.num_attention_heads},
      {"num_key_value_heads", measured.num_key_value_heads, used.num_key_value_heads},
      {"head_dim", measured.head_dim, used.head_dim},
      {"intermediate_size", measured.intermediate_size, used.intermediate_size},
      {"vocab_size", measured.vocab_size, used.vocab_size},
      {"bytes per weight", measured.BytesPerElement(), used.BytesPerElement()},
      {"tie_word_embeddings", measured.tie_word_embeddings, used.tie_word_embeddings},
      // Experts, latent attention and fp8 weights, where the fields above agree.
      {"parameters", measured.ParamCount(), used.ParamCount()},
      {"active parameters", measured.ActiveParamCount(), used.ActiveParamCount()},
      {"weight bytes", measured.WeightBytes(), used.WeightBytes()},
      {"KV bytes per token", measured.KvBytesPerToken(), used.KvBytesPerToken()},
  };
  for (const Field& f : fields) {
    if (f.a != f.b)
      return std::string(f.name) + ": " + std::to_string(f.a) + " vs " + std::to_string(f.b);
  }
  return std::nullopt;
}

Seconds HostFit::Predict(const HostCounts& c) const {
  const std::array<double, kHostColumns> columns = HostColumns(c);
  Seconds t = 0;
  for (std::size_t k = 0; k < kHostColumns; ++k) t += seconds_per[k] * columns[k];
  return t;
}

Seconds AfterIdleFit::Extra(ShapeClass c, Seconds idle) const {
  const std::vector<Seconds>& extra = c == ShapeClass::kDecode ? decode_s : prefill_s;
  if (idle < kIdleGap || idle_s.empty()) return 0;
  if (idle <= idle_s.front()) return extra.front() * idle / idle_s.front();
  for (std::size_t i = 1; i < idle_s.size(); ++i) {
    if (idle > idle_s[i]) continue;
    const double at = std::log(idle / idle_s[i - 1]) / std::log(idle_s[i] / idle_s[i - 1]);
    return extra[i - 1] + at * (extra[i] - extra[i - 1]);
  }
  return extra.back();
}

namespace {

// A step as a reference size of a ShapePairFit: a prefill-carrying step by its new tokens, a
// decode-only step by its rows; the sizes of its class and their first index into extra_s.
struct PairSize {
  double size = 0;  // 0 for an empty step
  const std::vector<Tokens>* sizes = nullptr;
  std::size_t first = 0;
};

PairSize PairSizeOf(const ShapePairFit& fit, const StepShape& shape) {
  const Tokens prefill = shape.PrefillTokens();
  if (prefill > 0) return {double(prefill), &fit.prefill_tokens, fit.decode_rows.size()};
  return {double(shape.decode_tokens), &fit.decode_rows, 0};
}

// The two reference shapes around `at` and their weights, linear in the logarithm of the size
// (the end one, all its weight, beyond either end).
std::array<std::pair<std::size_t, double>, 2> Around(const PairSize& at) {
  const std::vector<Tokens>& sizes = *at.sizes;
  std::size_t hi = 0;
  while (hi < sizes.size() && double(sizes[hi]) < at.size) ++hi;
  if (hi == 0) return {{{at.first, 1.0}, {at.first, 0.0}}};
  if (hi == sizes.size()) return {{{at.first + hi - 1, 1.0}, {at.first, 0.0}}};
  const double w = std::log(at.size / double(sizes[hi - 1])) /
                   std::log(double(sizes[hi]) / double(sizes[hi - 1]));
  return {{{at.first + hi - 1, 1 - w}, {at.first + hi, w}}};
}

}  // namespace

std::optional<std::size_t> ShapePairFit::Nearest(const StepShape& shape) const {
  const PairSize at = PairSizeOf(*this, shape);
  if (at.size == 0) return std::nullopt;
  const std::vector<Tokens>& sizes = *at.sizes;
  std::size_t best = 0;
  for (std::size_t i = 1; i < sizes.size(); ++i)
    if (std::abs(std::log(double(sizes[i]) / at.size)) <
        std::abs(std::log(double(sizes[best]) / at.size)))
      best = i;
  return at.first + best;
}

Seconds ShapePairFit::Extra(const StepShape& shape, const StepShape& other) const {
  const std::optional<std::size_t> i = Nearest(shape), j = Nearest(other);
  return i && j ? extra_s[*i][*j] : 0;
}

Seconds ShapePairFit::ShareBeside(const StepShape& shape, const StepShape& other,
                                  Seconds shape_alone) const {
  DUET_CHECK(alone_s.size() == extra_s.size());
  const PairSize mine = PairSizeOf(*this, shape), theirs = PairSizeOf(*this, other);
  if (mine.size == 0 || theirs.size == 0) return 0;
  double share = 0;
  for (const auto& [i, wi] : Around(mine))
    for (const auto& [j, wj] : Around(theirs)) share += wi * wj * extra_s[i][j] / alone_s[i];
  return share * shape_alone;
}

FittedCostModel::FittedCostModel(StepFit fit, std::optional<HostFit> host,
                                 std::optional<AfterIdleFit> after_idle,
                                 std::optional<ShapePairFit> after_step,
                                 std::optional<ShapePairFit> beside)
    : fit_(std::move(fit)),
      host_(std::move(host)),
      after_idle_(std::move(after_idle)),
      after_step_(std::move(after_step)),
      beside_(std::move(beside)) {
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    DUET_CHECK(!fit_.pieces[c].empty());
    DUET_CHECK(fit_.split_rows[c] == 0 || !fit_.pieces_above[c].empty());
  }
}

Seconds FittedCostModel::StepTime(const StepShape& shape) const {
  // Measured steps verify no drafts: a cluster file refuses speculative decoding with a fit.
  DUET_CHECK(shape.decode_draft_tokens == 0);
  return fit_.Predict(FeaturesOf(shape));
}

Seconds FittedCostModel::AfterIdle(const StepShape& shape, Seconds idle_s) const {
  if (!after_idle_ || idle_s < kIdleGap) return 0;
  const StepFeatures f = FeaturesOf(shape);
  return f.empty() ? 0 : after_idle_->Extra(ClassOf(f), idle_s);
}

Seconds FittedCostModel::AfterStep(const StepShape& shape, const StepShape& previous) const {
  return after_step_ ? after_step_->Extra(shape, previous) : 0;
}

Seconds FittedCostModel::Beside(const StepShape& shape, const StepShape& neighbour) const {
  return beside_ ? beside_->ShareBeside(shape, neighbour, StepTime(shape)) : 0;
}

Seconds FittedCostModel::HostTime(const HostCounts& counts) const {
  return host_ ? host_->Predict(counts) : 0;
}

void FittedCostModel::AppendDecodeRunEnds(StepShape shape, int steps, Seconds start,
                                          std::vector<Seconds>* ends) const {
  const StepFeatures f = FeaturesOf(shape);
  if (f.empty() || ClassOf(f) != ShapeClass::kDecode)
    return StepCostModel::AppendDecodeRunEnds(std::move(shape), steps, start, ends);
  // From step to step only the decode context changes, the last column, and AffinePiece::At
  // sums the columns in order: each piece's sum before it is the same for every step, and
  // adding the last term to it gives At's result bit for bit. (Decode runs are most of the
  // simulator's 2.6 million steps on the Mooncake trace.)
  static_assert(kFitColumns == 7, "the decode context is FitColumns' last column");
  constexpr std::size_t kLast = kFitColumns - 1;
  const std::vector<AffinePiece>& pieces = fit_.PiecesFor(ShapeClass::kDecode, f.tokens());
  const std::array<double, kFitColumns> columns = FitColumns(f);
  std::vector<Seconds> before(pieces.size(), 0.0);
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    for (std::size_t c = 0; c < kLast; ++c) before[k] += pieces[k].seconds_per[c] * columns[c];
  }
  Seconds t = start;
  for (int s = 0; s < steps; ++s) {
    const auto context = static_cast<double>(shape.decode_context_tokens);
    Seconds best = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const Seconds v = before[k] + pieces[k].seconds_per[kLast] * context;
      if (k == 0 || v > best) best = v;
    }
    t += best;
    ends->push_back(t);
    shape.decode_context_tokens += shape.decode_tokens;
  }
}

}  // namespace duet::models
