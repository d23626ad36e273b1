// Synthetic trace generator: arrivals (Poisson or Gamma at a rate), prompt and output lengths
// (fixed, uniform, lognormal, or sampled from a real trace), an optional shared-prefix
// structure (groups of requests share a system prompt of given length), and optional multi-turn
// sessions (each turn continues the previous one's context). Deterministic per seed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "traces/trace.h"

namespace duet::traces {

struct LengthDist {
  enum class Kind { kFixed, kUniform, kLognormal, kTrace } kind = Kind::kFixed;
  Tokens value = 0;         // kFixed
  Tokens min = 1, max = 1;  // kUniform (inclusive); also clamps kLognormal and kTrace
  double mean = 0;          // kLognormal: mean of the distribution (tokens)
  double sigma = 0;         // kLognormal: sigma of the underlying normal
  std::string trace_path;   // kTrace: sample lengths from this trace
  TraceFormat trace_format = TraceFormat::kMooncake;
};

// A distribution that always gives `value`.
inline LengthDist FixedLength(Tokens value) {
  LengthDist dist;
  dist.value = dist.min = dist.max = value;
  return dist;
}

// Multi-turn sessions (chat, agents): the arrival process gives session start times, and each
// session has `turns` turns. Turn 1 is drawn like a request without sessions (prefix group,
// "input", "output", block ids); turn k > 1 continues turn k-1 (its parent): its prompt is the
// whole context so far (turn k-1's prompt and output) and then `new_tokens` new tokens, with no
// block ids, its output from "output", sent `think_time_ms` after turn k-1 finished, its
// arrival_s the session start (a lower bound). All turns of session i are named "s<i>".
struct SessionSpec {
  LengthDist turns = FixedLength(1);          // per session: 1..10000
  LengthDist new_tokens;                      // per later turn: 1..1e9 tokens
  LengthDist think_time_ms = FixedLength(0);  // 0..3600000 ms (one hour)
  // A session ends before a later turn whose prompt + output would pass this (1..1e9; 0: no
  // limit of its own, 1e9 like any request's lengths). Turn 1 is never cut.
  Tokens max_context_tokens = 0;
};

struct SyntheticSpec {
  std::size_t num_requests = 0;
  enum class Arrival { kPoisson, kGamma } arrival = Arrival::kPoisson;
  double rate_per_s = 1.0;  // mean arrival rate
  double gamma_cv = 1.0;    // kGamma: coefficient of variation of inter-arrival times
  LengthDist input;
  LengthDist output;
  // Shared prefixes: each request picks one of `prefix_groups` groups (uniformly, or Zipf with
  // exponent prefix_zipf > 0) and starts with that group's `prefix_tokens` tokens.
  // prefix_groups == 0: no sharing; every block is unique.
  std::size_t prefix_groups = 0;
  Tokens prefix_tokens = 0;
  double prefix_zipf = 0;
  Tokens block_tokens = 512;
  std::uint64_t seed = 1;
  // Multi-turn sessions; nullopt: every request stands alone. num_requests counts all turns
  // (the last session may be cut short).
  std::optional<SessionSpec> sessions;
};

// Parses a spec from JSON; `where` names the file for error messages.
// Format (all keys snake_case):
// {"num_requests": 1000, "seed": 1, "block_tokens": 512,
//  "arrival": {"process": "poisson"|"gamma", "rate_per_s": 2.0, "cv": 2.0},
//  "input":  {"dist": "fixed", "value": 2048} | {"dist": "uniform", "min": 1, "max": 9}
//          | {"dist": "lognormal", "mean": 4000, "sigma": 0.8, "min": 16, "max": 32000}
//          | {"dist": "trace", "path": "../shared/traces/x.jsonl", "format": "mooncake"},
//  "output": {... same ...},
//  "prefix": {"groups": 8, "tokens": 1024, "zipf": 1.1},
//  "sessions": {"turns": {"dist": "uniform", "min": 1, "max": 8},
//               "new_tokens": {"dist": "lognormal", "mean": 200, "sigma": 1.0},
//               "think_time_ms": {"dist": "fixed", "value": 5000},
//               "max_context_tokens": 32768}}
// "sessions" is optional (SessionSpec above); in it "turns" and "new_tokens" are required,
// "think_time_ms" defaults to 0 and "max_context_tokens" to no limit. "turns" and
// "think_time_ms" take the fixed, uniform and lognormal forms (lognormal clamps default to
// [1, 10000] turns and [0, 1000000] ms), "new_tokens" also "trace" (a trace's input lengths).
// Draw order, part of determinism: per request (gap, prefix group, input, output); with
// sessions, per session (gap, turns, then turn 1's group, input, output) and per later turn
// (new_tokens, output, think time).
// A relative "path" in a "trace" distribution is resolved against `base_dir`.
Result<SyntheticSpec> ParseSyntheticSpec(const nlohmann::json& doc, const std::string& where,
                                         const std::string& base_dir);
Result<SyntheticSpec> ReadSyntheticSpec(const std::string& path);

Result<Trace> GenerateSynthetic(const SyntheticSpec& spec);

}  // namespace duet::traces
