// Synthetic trace generator and its JSON spec parser (format documented in synthetic.h).
// All sampling is written here on top of std::mt19937_64 (whose output the standard fixes)
// instead of std::*_distribution (whose output differs between standard libraries), so a
// seed gives the same trace with libstdc++ and libc++.
#include "traces/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <numbers>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/json_util.h"

namespace duet::traces {
namespace {

// The default upper clamp of lognormal and trace lengths.
constexpr Tokens kDefaultMaxTokens = 1'000'000;
// Sanity bounds: beyond these a spec is surely a typo, and sizes would overflow downstream.
constexpr std::int64_t kMaxRequests = 100'000'000;
constexpr std::int64_t kMaxGroups = 1'000'000;
constexpr double kMinRatePerS = 1e-6;
constexpr double kMaxRatePerS = 1e9;
// Memory a generated trace may take (requests and their block ids), checked before each
// allocation so that a spec within the field limits cannot exhaust memory.
constexpr std::uint64_t kMaxTraceBytes = std::uint64_t{2} << 30;
constexpr double kMinCv = 1e-3;   // below this the gamma shape 1/cv^2 gets absurdly large
constexpr double kMaxCv = 100.0;  // above this nearly every gap underflows to 0
constexpr double kMaxSigma = 10.0;
// Sessions: turns per session and think time between turns (ms).
constexpr Tokens kMaxTurns = 10'000;
constexpr Tokens kMaxThinkTimeMs = 3'600'000;  // one hour

// What a distribution may produce: values in [lowest, highest] (lognormal and trace clamps
// default to [lowest, default_max]), and whether it may sample a trace.
struct LengthLimits {
  Tokens lowest = 1;
  Tokens highest = kMaxRequestTokens;
  Tokens default_max = kDefaultMaxTokens;
  bool allow_trace = true;
};
constexpr LengthLimits kTokenLimits{};
constexpr LengthLimits kTurnLimits{1, kMaxTurns, kMaxTurns, false};
constexpr LengthLimits kThinkTimeLimits{0, kMaxThinkTimeMs, kDefaultMaxTokens, false};

// ---- Sampling -------------------------------------------------------------------------------

class Sampler {
 public:
  explicit Sampler(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double Uniform01() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n >= 1, unbiased: draws below 2^64 mod n are rejected so every
  // residue has the same number of preimages.
  std::uint64_t Below(std::uint64_t n) {
    const std::uint64_t reject_below =
        (std::uint64_t{0} - n) % n;  // (2^64 - n) mod n == 2^64 mod n
    while (true) {
      const std::uint64_t x = engine_();
      if (x >= reject_below) return x % n;
    }
  }

  // Exponential with mean 1, by inversion; 1 - u lies in (0, 1] so the log is finite.
  double Exponential() { return -std::log(1.0 - Uniform01()); }

  // Standard normal by Box-Muller (one of the pair is used: simpler, still deterministic).
  double Normal() {
    const double u1 = 1.0 - Uniform01();  // (0, 1]
    const double u2 = Uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  // Gamma(shape, scale 1) by Marsaglia and Tsang's squeeze method; for shape < 1, sample
  // Gamma(shape + 1) and multiply by u^(1/shape).
  double Gamma(double shape) {
    if (shape < 1.0) {
      const double u = 1.0 - Uniform01();  // (0, 1]
      return Gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      const double x = Normal();
      const double t = 1.0 + c * x;
      if (t <= 0) continue;
      const double v = t * t * t;
      const double u = 1.0 - Uniform01();  // (0, 1]: log(u) below is finite
      const double x2 = x * x;
      if (u < 1.0 - 0.0331 * x2 * x2) return d * v;
      if (std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v))) return d * v;
    }
  }

 private:
  std::mt19937_64 engine_;
};

// Rounds a sampled length to whole tokens and clamps it into [min, max]; the clamp happens in
// double first so huge or NaN samples never reach llround.
Tokens ClampTokens(double value, Tokens min, Tokens max) {
  if (!(value >= static_cast<double>(min))) return min;  // also catches NaN
  if (value >= static_cast<double>(max)) return max;
  return std::clamp<Tokens>(std::llround(value), min, max);
}

// ---- Validation -----------------------------------------------------------------------------

Status CheckTokenRange(Tokens value, const std::string& where, const std::string& field,
                       Tokens lowest, Tokens highest = kMaxRequestTokens) {
  if (value < lowest || value > highest) {
    return FieldError(where, field,
                      "must be between " + std::to_string(lowest) + " and " +
                          std::to_string(highest) + ", got " + std::to_string(value));
  }
  return Status::Ok();
}

Status ValidateLength(const LengthDist& dist, const std::string& where,
                      const LengthLimits& limits = kTokenLimits) {
  switch (dist.kind) {
    case LengthDist::Kind::kFixed:
      return CheckTokenRange(dist.value, where, "value", limits.lowest, limits.highest);
    case LengthDist::Kind::kLognormal:
      if (!std::isfinite(dist.mean) || dist.mean <= 0 ||
          dist.mean > static_cast<double>(limits.highest)) {
        return FieldError(where, "mean",
                          "must be > 0 and at most " + std::to_string(limits.highest));
      }
      if (!std::isfinite(dist.sigma) || dist.sigma < 0 || dist.sigma > kMaxSigma) {
        return FieldError(where, "sigma", "must be between 0 and 10");
      }
      break;
    case LengthDist::Kind::kTrace:
      if (!limits.allow_trace) {
        return FieldError(where, "dist", "must be one of: fixed, uniform, lognormal");
      }
      if (dist.trace_path.empty()) return FieldError(where, "path", "must not be empty");
      if (dist.trace_format == TraceFormat::kSynthetic) {
        return FieldError(where, "format", "must be one of: mooncake, azure");
      }
      break;
    case LengthDist::Kind::kUniform:
      break;
  }
  DUET_RETURN_IF_ERROR(CheckTokenRange(dist.min, where, "min", limits.lowest, limits.highest));
  DUET_RETURN_IF_ERROR(CheckTokenRange(dist.max, where, "max", limits.lowest, limits.highest));
  if (dist.min > dist.max) {
    return FieldError(
        where, "min",
        "must be <= max (" + std::to_string(dist.min) + " > " + std::to_string(dist.max) + ")");
  }
  return Status::Ok();
}

Status ValidateSpec(const SyntheticSpec& spec, const std::string& where) {
  if (spec.num_requests < 1 || spec.num_requests > static_cast<std::size_t>(kMaxRequests)) {
    return FieldError(where, "num_requests",
                      "must be between 1 and " + std::to_string(kMaxRequests));
  }
  DUET_RETURN_IF_ERROR(CheckTokenRange(spec.block_tokens, where, "block_tokens", 1));
  const std::string arrival_where = where + ": arrival";
  if (!std::isfinite(spec.rate_per_s) || spec.rate_per_s < kMinRatePerS ||
      spec.rate_per_s > kMaxRatePerS) {
    return FieldError(arrival_where, "rate_per_s", "must be > 0 (between 1e-06 and 1e+09)");
  }
  if (spec.arrival == SyntheticSpec::Arrival::kGamma &&
      (!std::isfinite(spec.gamma_cv) || spec.gamma_cv < kMinCv || spec.gamma_cv > kMaxCv)) {
    return FieldError(arrival_where, "cv", "must be > 0 (between 0.001 and 100)");
  }
  DUET_RETURN_IF_ERROR(ValidateLength(spec.input, where + ": input"));
  DUET_RETURN_IF_ERROR(ValidateLength(spec.output, where + ": output"));
  const std::string prefix_where = where + ": prefix";
  if (spec.prefix_groups > static_cast<std::size_t>(kMaxGroups)) {
    return FieldError(prefix_where, "groups",
                      "must be between 0 and " + std::to_string(kMaxGroups));
  }
  if (spec.prefix_groups > 0) {
    DUET_RETURN_IF_ERROR(CheckTokenRange(spec.prefix_tokens, prefix_where, "tokens", 1));
  } else if (spec.prefix_tokens != 0) {
    return FieldError(prefix_where, "tokens", "needs 'groups' >= 1");
  }
  if (!std::isfinite(spec.prefix_zipf) || spec.prefix_zipf < 0) {
    return FieldError(prefix_where, "zipf", "must be >= 0 (0: uniform)");
  }
  if (spec.sessions) {
    const std::string sessions_where = where + ": sessions";
    DUET_RETURN_IF_ERROR(
        ValidateLength(spec.sessions->turns, sessions_where + ": turns", kTurnLimits));
    DUET_RETURN_IF_ERROR(
        ValidateLength(spec.sessions->new_tokens, sessions_where + ": new_tokens"));
    DUET_RETURN_IF_ERROR(ValidateLength(spec.sessions->think_time_ms,
                                        sessions_where + ": think_time_ms", kThinkTimeLimits));
    // 0 in a code-built spec means no limit; the JSON key takes 1..1e9.
    if (spec.sessions->max_context_tokens != 0) {
      DUET_RETURN_IF_ERROR(CheckTokenRange(spec.sessions->max_context_tokens, sessions_where,
                                           "max_context_tokens", 1));
    }
  }
  return Status::Ok();
}

// ---- Parsing --------------------------------------------------------------------------------

std::string JoinNames(std::initializer_list<const char*> names) {
  std::string out;
  for (const char* name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// Rejects keys the format does not know, so a typo ("rate" for "rate_per_s") is reported
// instead of silently falling back to a default.
Status CheckKeys(const nlohmann::json& obj, const std::string& where,
                 std::initializer_list<const char*> accepted) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* name : accepted) known = known || it.key() == name;
    if (!known) {
      return FieldError(where, it.key(),
                        "is not recognized (accepted: " + JoinNames(accepted) + ")");
    }
  }
  return Status::Ok();
}

Result<const nlohmann::json*> ObjectField(const nlohmann::json& doc, const std::string& key,
                                          const std::string& where, bool required) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) {
    if (required) return FieldError(where, key, "is missing");
    return static_cast<const nlohmann::json*>(nullptr);
  }
  if (!it->is_object()) return FieldError(where, key, "must be an object");
  return &*it;
}

// Token counts are integers; JsonInt would wrap unsigned values above INT64_MAX, so those
// are rejected here with the range message.
Result<Tokens> TokenField(const nlohmann::json& obj, const std::string& key, Tokens fallback,
                          bool required, const std::string& where) {
  auto it = obj.find(key);
  if (it != obj.end() && it->is_number_unsigned() &&
      it->get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxRequestTokens)) {
    return FieldError(where, key, "must be at most " + std::to_string(kMaxRequestTokens));
  }
  if (required) return JsonInt(obj, key, where);
  return JsonIntOr(obj, key, fallback, where);
}

Result<LengthDist> ParseLength(const nlohmann::json& doc, const std::string& key,
                               const std::string& where, const std::string& base_dir,
                               const LengthLimits& limits = kTokenLimits) {
  auto field = ObjectField(doc, key, where, /*required=*/true);
  if (!field) return field.status();
  const nlohmann::json& obj = **field;
  const std::string here = where + ": " + key;
  auto dist_name = JsonString(obj, "dist", here);
  if (!dist_name) return dist_name.status();

  LengthDist dist;
  if (*dist_name == "fixed") {
    DUET_RETURN_IF_ERROR(CheckKeys(obj, here, {"dist", "value"}));
    dist.kind = LengthDist::Kind::kFixed;
    auto value = TokenField(obj, "value", 0, /*required=*/true, here);
    if (!value) return value.status();
    dist.value = *value;
    dist.min = dist.max = dist.value;
  } else if (*dist_name == "uniform") {
    DUET_RETURN_IF_ERROR(CheckKeys(obj, here, {"dist", "min", "max"}));
    dist.kind = LengthDist::Kind::kUniform;
    auto min = TokenField(obj, "min", 0, /*required=*/true, here);
    if (!min) return min.status();
    auto max = TokenField(obj, "max", 0, /*required=*/true, here);
    if (!max) return max.status();
    dist.min = *min;
    dist.max = *max;
  } else if (*dist_name == "lognormal" || (*dist_name == "trace" && limits.allow_trace)) {
    if (*dist_name == "lognormal") {
      DUET_RETURN_IF_ERROR(CheckKeys(obj, here, {"dist", "mean", "sigma", "min", "max"}));
      dist.kind = LengthDist::Kind::kLognormal;
      auto mean = JsonNumber(obj, "mean", here);
      if (!mean) return mean.status();
      auto sigma = JsonNumber(obj, "sigma", here);
      if (!sigma) return sigma.status();
      dist.mean = *mean;
      dist.sigma = *sigma;
    } else {
      DUET_RETURN_IF_ERROR(CheckKeys(obj, here, {"dist", "path", "format", "min", "max"}));
      dist.kind = LengthDist::Kind::kTrace;
      auto path = JsonString(obj, "path", here);
      if (!path) return path.status();
      auto format_name = JsonStringOr(obj, "format", "mooncake", here);
      if (!format_name) return format_name.status();
      if (*format_name == "mooncake") {
        dist.trace_format = TraceFormat::kMooncake;
      } else if (*format_name == "azure") {
        dist.trace_format = TraceFormat::kAzure;
      } else {
        return FieldError(here, "format",
                          "must be one of: mooncake, azure (got '" + *format_name + "')");
      }
      std::filesystem::path trace_path(*path);
      if (trace_path.is_relative() && !base_dir.empty()) {
        trace_path = (std::filesystem::path(base_dir) / trace_path).lexically_normal();
      }
      dist.trace_path = trace_path.string();
    }
    auto min = TokenField(obj, "min", limits.lowest, /*required=*/false, here);
    if (!min) return min.status();
    auto max = TokenField(obj, "max", std::min(limits.default_max, limits.highest),
                          /*required=*/false, here);
    if (!max) return max.status();
    dist.min = *min;
    dist.max = *max;
  } else {
    return FieldError(here, "dist",
                      std::string("must be one of: fixed, uniform, lognormal") +
                          (limits.allow_trace ? ", trace" : "") + " (got '" + *dist_name + "')");
  }
  DUET_RETURN_IF_ERROR(ValidateLength(dist, here, limits));
  return dist;
}

// ---- Generation -----------------------------------------------------------------------------

struct LengthRows {
  std::vector<std::pair<Tokens, Tokens>> rows;  // (input, output) per trace request
};

Result<LengthRows> LoadRows(const LengthDist& dist, const std::string& what) {
  auto trace = ReadTrace(dist.trace_path, dist.trace_format);
  if (!trace) return Status::Error(what + ": cannot load trace: " + trace.error());
  LengthRows out;
  out.rows.reserve(trace->requests.size());
  for (const TraceRequest& r : trace->requests) {
    out.rows.emplace_back(r.input_tokens, r.output_tokens);
  }
  return out;
}

Tokens SampleLength(const LengthDist& dist, Sampler& sampler) {
  switch (dist.kind) {
    case LengthDist::Kind::kFixed:
      return dist.value;
    case LengthDist::Kind::kUniform:
      return dist.min + static_cast<Tokens>(
                            sampler.Below(static_cast<std::uint64_t>(dist.max - dist.min) + 1));
    case LengthDist::Kind::kLognormal: {
      // Lognormal with the requested mean: E[X] = exp(mu + sigma^2 / 2).
      const double mu = std::log(dist.mean) - 0.5 * dist.sigma * dist.sigma;
      return ClampTokens(std::exp(mu + dist.sigma * sampler.Normal()), dist.min, dist.max);
    }
    case LengthDist::Kind::kTrace:
      break;  // sampled by the caller, which holds the rows
  }
  return dist.min;
}

}  // namespace

Result<SyntheticSpec> ParseSyntheticSpec(const nlohmann::json& doc, const std::string& where,
                                         const std::string& base_dir) {
  if (!doc.is_object()) return Status::Error(where + ": top level must be a JSON object");
  DUET_RETURN_IF_ERROR(CheckKeys(doc, where,
                                 {"description", "num_requests", "seed", "block_tokens", "arrival",
                                  "input", "output", "prefix", "sessions"}));
  SyntheticSpec spec;

  auto num_requests = JsonInt(doc, "num_requests", where);
  if (!num_requests) return num_requests.status();
  if (*num_requests < 1 || *num_requests > kMaxRequests) {
    return FieldError(where, "num_requests",
                      "must be between 1 and " + std::to_string(kMaxRequests));
  }
  spec.num_requests = static_cast<std::size_t>(*num_requests);

  // Any 64-bit seed is valid, so it is read as unsigned (JsonInt would wrap large ones).
  if (auto seed = doc.find("seed"); seed != doc.end()) {
    if (!seed->is_number_unsigned()) {
      return FieldError(where, "seed", "must be a non-negative integer");
    }
    spec.seed = seed->get<std::uint64_t>();
  }
  auto block_tokens = TokenField(doc, "block_tokens", 512, /*required=*/false, where);
  if (!block_tokens) return block_tokens.status();
  spec.block_tokens = *block_tokens;

  auto arrival = ObjectField(doc, "arrival", where, /*required=*/true);
  if (!arrival) return arrival.status();
  const std::string arrival_where = where + ": arrival";
  auto process = JsonString(**arrival, "process", arrival_where);
  if (!process) return process.status();
  if (*process == "poisson") {
    DUET_RETURN_IF_ERROR(CheckKeys(**arrival, arrival_where, {"process", "rate_per_s"}));
    spec.arrival = SyntheticSpec::Arrival::kPoisson;
  } else if (*process == "gamma") {
    DUET_RETURN_IF_ERROR(CheckKeys(**arrival, arrival_where, {"process", "rate_per_s", "cv"}));
    spec.arrival = SyntheticSpec::Arrival::kGamma;
    auto cv = JsonNumber(**arrival, "cv", arrival_where);
    if (!cv) return cv.status();
    spec.gamma_cv = *cv;
  } else {
    return FieldError(arrival_where, "process",
                      "must be one of: poisson, gamma (got '" + *process + "')");
  }
  auto rate = JsonNumber(**arrival, "rate_per_s", arrival_where);
  if (!rate) return rate.status();
  spec.rate_per_s = *rate;

  auto input = ParseLength(doc, "input", where, base_dir);
  if (!input) return input.status();
  spec.input = std::move(*input);
  auto output = ParseLength(doc, "output", where, base_dir);
  if (!output) return output.status();
  spec.output = std::move(*output);

  auto prefix = ObjectField(doc, "prefix", where, /*required=*/false);
  if (!prefix) return prefix.status();
  if (*prefix != nullptr) {
    const std::string prefix_where = where + ": prefix";
    DUET_RETURN_IF_ERROR(CheckKeys(**prefix, prefix_where, {"groups", "tokens", "zipf"}));
    auto groups = JsonInt(**prefix, "groups", prefix_where);
    if (!groups) return groups.status();
    if (*groups < 0 || *groups > kMaxGroups) {
      return FieldError(prefix_where, "groups",
                        "must be between 0 and " + std::to_string(kMaxGroups));
    }
    spec.prefix_groups = static_cast<std::size_t>(*groups);
    auto tokens = TokenField(**prefix, "tokens", 0, /*required=*/true, prefix_where);
    if (!tokens) return tokens.status();
    spec.prefix_tokens = *tokens;
    auto zipf = JsonNumberOr(**prefix, "zipf", 0.0, prefix_where);
    if (!zipf) return zipf.status();
    spec.prefix_zipf = *zipf;
  }

  auto sessions = ObjectField(doc, "sessions", where, /*required=*/false);
  if (!sessions) return sessions.status();
  if (*sessions != nullptr) {
    const nlohmann::json& obj = **sessions;
    const std::string sessions_where = where + ": sessions";
    DUET_RETURN_IF_ERROR(CheckKeys(obj, sessions_where,
                                   {"turns", "new_tokens", "think_time_ms", "max_context_tokens"}));
    SessionSpec session;
    auto turns = ParseLength(obj, "turns", sessions_where, base_dir, kTurnLimits);
    if (!turns) return turns.status();
    session.turns = std::move(*turns);
    auto new_tokens = ParseLength(obj, "new_tokens", sessions_where, base_dir);
    if (!new_tokens) return new_tokens.status();
    session.new_tokens = std::move(*new_tokens);
    if (JsonHas(obj, "think_time_ms")) {
      auto think = ParseLength(obj, "think_time_ms", sessions_where, base_dir, kThinkTimeLimits);
      if (!think) return think.status();
      session.think_time_ms = std::move(*think);
    }
    auto max_context =
        JsonIntIn(obj, "max_context_tokens", 1, kMaxRequestTokens, sessions_where, 0);
    if (!max_context) return max_context.status();
    session.max_context_tokens = *max_context;
    spec.sessions = std::move(session);
  }

  DUET_RETURN_IF_ERROR(ValidateSpec(spec, where));
  return spec;
}

Result<SyntheticSpec> ReadSyntheticSpec(const std::string& path) {
  auto doc = ReadJsonFile(path);
  if (!doc) return doc.status();
  std::string base_dir = std::filesystem::path(path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";
  return ParseSyntheticSpec(*doc, path, base_dir);
}

Result<Trace> GenerateSynthetic(const SyntheticSpec& spec) {
  DUET_RETURN_IF_ERROR(ValidateSpec(spec, "synthetic spec"));

  // Lengths sampled from a real trace. When input and output name the same trace, one row is
  // drawn for both so the joint (input, output) distribution is kept.
  const bool input_from_trace = spec.input.kind == LengthDist::Kind::kTrace;
  const bool output_from_trace = spec.output.kind == LengthDist::Kind::kTrace;
  const bool joint = input_from_trace && output_from_trace &&
                     spec.input.trace_path == spec.output.trace_path &&
                     spec.input.trace_format == spec.output.trace_format;
  LengthRows input_rows, output_rows;
  if (input_from_trace) {
    auto rows = LoadRows(spec.input, "input");
    if (!rows) return rows.status();
    input_rows = std::move(*rows);
  }
  if (output_from_trace && !joint) {
    auto rows = LoadRows(spec.output, "output");
    if (!rows) return rows.status();
    output_rows = std::move(*rows);
  }
  LengthRows new_rows;  // sessions' new tokens per later turn (the trace's input lengths)
  if (spec.sessions && spec.sessions->new_tokens.kind == LengthDist::Kind::kTrace) {
    auto rows = LoadRows(spec.sessions->new_tokens, "sessions: new_tokens");
    if (!rows) return rows.status();
    new_rows = std::move(*rows);
  }

  // Zipf group weights P(g) ~ 1/(g+1)^s as a cumulative table; s == 0 is drawn uniformly.
  std::vector<double> group_cdf;
  if (spec.prefix_groups > 0 && spec.prefix_zipf > 0) {
    group_cdf.resize(spec.prefix_groups);
    double total = 0;
    for (std::size_t g = 0; g < spec.prefix_groups; ++g) {
      total += std::pow(static_cast<double>(g + 1), -spec.prefix_zipf);
      group_cdf[g] = total;
    }
  }
  // Block ids: group g's full prefix blocks are g * prefix_blocks + j; every other block
  // (a partial prefix block included) takes the next id of a counter starting after them.
  const Tokens prefix_tokens = spec.prefix_groups > 0 ? spec.prefix_tokens : 0;
  const std::uint64_t prefix_blocks = static_cast<std::uint64_t>(prefix_tokens / spec.block_tokens);
  std::uint64_t next_unique_id = spec.prefix_groups * prefix_blocks;

  Trace trace;
  trace.source = "synthetic";
  trace.block_tokens = spec.block_tokens;
  std::uint64_t trace_bytes = spec.num_requests * sizeof(TraceRequest);
  // Every request has at least the shared prefix and the shortest input: refuse up front a
  // spec whose block ids alone would pass the limit, before generating anything.
  const Tokens min_input =
      spec.input.kind == LengthDist::Kind::kFixed ? spec.input.value : spec.input.min;
  const std::uint64_t min_blocks = static_cast<std::uint64_t>(
      (std::max<Tokens>(min_input, 1) + prefix_tokens + spec.block_tokens - 1) / spec.block_tokens);
  // (With sessions only first turns have block ids: the draws below still check each one.)
  if (!spec.sessions && trace_bytes <= kMaxTraceBytes &&
      min_blocks * sizeof(std::uint64_t) > (kMaxTraceBytes - trace_bytes) / spec.num_requests) {
    return Status::Error(
        "synthetic spec: fields 'num_requests' (" + std::to_string(spec.num_requests) +
        "), 'prefix.tokens' (" + std::to_string(prefix_tokens) + ") and 'input' ask for at least " +
        std::to_string(min_blocks) + " block ids of " + std::to_string(spec.block_tokens) +
        " tokens per request, more than fit in the " + std::to_string(kMaxTraceBytes >> 30) +
        " GiB a trace may take: fewer requests, shorter prompts or larger "
        "'block_tokens'");
  }
  if (trace_bytes > kMaxTraceBytes) {
    return FieldError("synthetic spec", "num_requests",
                      "asks for " + std::to_string(spec.num_requests) +
                          " requests, more than fit in the " +
                          std::to_string(kMaxTraceBytes >> 30) + " GiB a trace may take (at most " +
                          std::to_string(kMaxTraceBytes / sizeof(TraceRequest)) + ")");
  }
  trace.requests.reserve(spec.num_requests);
  Sampler sampler(spec.seed);
  // Arrival shape and scale: Gamma(k = 1/cv^2, theta = cv^2/rate) has mean 1/rate and CV cv.
  const double gamma_shape = 1.0 / (spec.gamma_cv * spec.gamma_cv);
  const double gamma_scale = spec.gamma_cv * spec.gamma_cv / spec.rate_per_s;
  // The gap to the next arrival (of a request, or of a session's start).
  auto gap_s = [&]() {
    return spec.arrival == SyntheticSpec::Arrival::kPoisson
               ? sampler.Exponential() / spec.rate_per_s
               : sampler.Gamma(gamma_shape) * gamma_scale;
  };
  // Request i standing alone (or a session's first turn) arriving at `arrival_s`: its prefix
  // group, input and output lengths, and block ids, drawn in that order.
  auto draw_request = [&](std::size_t i, Seconds arrival_s) -> Result<TraceRequest> {
    std::uint64_t group = 0;
    if (spec.prefix_groups > 0) {
      if (group_cdf.empty()) {
        group = sampler.Below(spec.prefix_groups);
      } else {
        const double target = sampler.Uniform01() * group_cdf.back();
        group = static_cast<std::uint64_t>(
            std::upper_bound(group_cdf.begin(), group_cdf.end(), target) - group_cdf.begin());
        group = std::min<std::uint64_t>(group, spec.prefix_groups - 1);
      }
    }

    TraceRequest request;
    request.id = i;
    request.arrival_s = arrival_s;
    if (joint) {
      const auto& row = input_rows.rows[sampler.Below(input_rows.rows.size())];
      request.input_tokens = std::clamp(row.first, spec.input.min, spec.input.max);
      request.output_tokens = std::clamp(row.second, spec.output.min, spec.output.max);
    } else {
      request.input_tokens =
          input_from_trace
              ? std::clamp(input_rows.rows[sampler.Below(input_rows.rows.size())].first,
                           spec.input.min, spec.input.max)
              : SampleLength(spec.input, sampler);
      request.output_tokens =
          output_from_trace
              ? std::clamp(output_rows.rows[sampler.Below(output_rows.rows.size())].second,
                           spec.output.min, spec.output.max)
              : SampleLength(spec.output, sampler);
    }
    // The sampled input is the part after the shared prefix, so every request has at least
    // one token of its own and the prefix is always complete.
    request.input_tokens += prefix_tokens;

    const std::uint64_t blocks = static_cast<std::uint64_t>(
        (request.input_tokens + spec.block_tokens - 1) / spec.block_tokens);
    trace_bytes += blocks * sizeof(std::uint64_t);
    if (trace_bytes > kMaxTraceBytes) {
      return Status::Error(
          "synthetic spec: fields 'num_requests', 'input', 'prefix.tokens' and 'block_tokens' "
          "ask for more than the " +
          std::to_string(kMaxTraceBytes >> 30) + " GiB a trace may take (request " +
          std::to_string(i) + " of " + std::to_string(spec.num_requests) + " alone has " +
          std::to_string(blocks) + " prompt blocks of " + std::to_string(spec.block_tokens) +
          " tokens): fewer requests, shorter prompts or larger blocks");
    }
    request.block_ids.resize(blocks);
    for (std::uint64_t b = 0; b < blocks; ++b) {
      request.block_ids[b] = b < prefix_blocks ? group * prefix_blocks + b : next_unique_id++;
    }
    return request;
  };

  if (!spec.sessions) {
    Seconds arrival_s = 0;  // the first request arrives at 0, like the real traces
    for (std::size_t i = 0; i < spec.num_requests; ++i) {
      // Draw order per request is fixed (gap, group, input, output): part of determinism.
      if (i > 0) {
        arrival_s += gap_s();
        if (arrival_s > kMaxArrivalS) {
          return Status::Error(
              "synthetic spec: fields 'num_requests' and 'arrival.rate_per_s' put request " +
              std::to_string(i) + " past the 1e8 s trace horizon: fewer requests or a higher rate");
        }
      }
      auto request = draw_request(i, arrival_s);
      if (!request) return request.status();
      trace.requests.push_back(std::move(*request));
    }
    return trace;
  }

  // Sessions: draw order per session (gap, turns, then turn 1 as above) and per later turn
  // (new tokens, output, think time). Each session's turns are emitted together, in session
  // start order: arrivals stay sorted and every parent comes just before its child.
  const SessionSpec& sessions = *spec.sessions;
  const Tokens context_limit =
      sessions.max_context_tokens > 0 ? sessions.max_context_tokens : kMaxRequestTokens;
  auto sample_new_tokens = [&]() {
    return new_rows.rows.empty()
               ? SampleLength(sessions.new_tokens, sampler)
               : std::clamp(new_rows.rows[sampler.Below(new_rows.rows.size())].first,
                            sessions.new_tokens.min, sessions.new_tokens.max);
  };
  // A later turn's output: from "output" as for turn 1 (a joint trace's output column).
  auto sample_output = [&]() {
    if (!output_from_trace) return SampleLength(spec.output, sampler);
    const LengthRows& rows = joint ? input_rows : output_rows;
    return std::clamp(rows.rows[sampler.Below(rows.rows.size())].second, spec.output.min,
                      spec.output.max);
  };
  Seconds start_s = 0;  // the first session starts at 0
  for (std::size_t session = 0; trace.requests.size() < spec.num_requests; ++session) {
    if (session > 0) {
      start_s += gap_s();
      if (start_s > kMaxArrivalS) {
        return Status::Error(
            "synthetic spec: fields 'num_requests' and 'arrival.rate_per_s' put session " +
            std::to_string(session) +
            " past the 1e8 s trace horizon: fewer requests or a higher rate");
      }
    }
    const Tokens turns = SampleLength(sessions.turns, sampler);
    auto first = draw_request(trace.requests.size(), start_s);
    if (!first) return first.status();
    first->session = "s";
    first->session += std::to_string(session);
    trace.requests.push_back(std::move(*first));
    for (Tokens turn = 2; turn <= turns && trace.requests.size() < spec.num_requests; ++turn) {
      const Tokens new_tokens = sample_new_tokens();
      const Tokens output_tokens = sample_output();
      const Tokens think_ms = SampleLength(sessions.think_time_ms, sampler);
      const TraceRequest& previous = trace.requests.back();
      const Tokens context_tokens = previous.input_tokens + previous.output_tokens;
      const Tokens input_tokens = context_tokens + new_tokens;
      if (input_tokens + output_tokens > context_limit) break;  // the session ends here
      TraceRequest request;
      request.id = trace.requests.size();
      request.arrival_s = start_s;
      request.input_tokens = input_tokens;
      request.output_tokens = output_tokens;
      request.parent = previous.id;
      request.context_tokens = context_tokens;
      request.delay_s = static_cast<double>(think_ms) / 1000.0;
      request.session = previous.session;
      trace.requests.push_back(std::move(request));
    }
  }
  return trace;
}

}  // namespace duet::traces
