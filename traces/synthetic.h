// Synthetic trace generator: arrivals (Poisson or Gamma at a rate), prompt and output lengths
// (fixed, uniform, lognormal, or sampled from a real trace), and an optional shared-prefix
// structure (groups of requests share a system prompt of given length). Deterministic per seed.
#pragma once

#include <nlohmann/json.hpp>
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
};

// Parses a spec from JSON; `where` names the file for error messages.
// Format (all keys snake_case):
// {"num_requests": 1000, "seed": 1, "block_tokens": 512,
//  "arrival": {"process": "poisson"|"gamma", "rate_per_s": 2.0, "cv": 2.0},
//  "input":  {"dist": "fixed", "value": 2048} | {"dist": "uniform", "min": 1, "max": 9}
//          | {"dist": "lognormal", "mean": 4000, "sigma": 0.8, "min": 16, "max": 32000}
//          | {"dist": "trace", "path": "../shared/traces/x.jsonl", "format": "mooncake"},
//  "output": {... same ...},
//  "prefix": {"groups": 8, "tokens": 1024, "zipf": 1.1}}
// A relative "path" in a "trace" distribution is resolved against `base_dir`.
Result<SyntheticSpec> ParseSyntheticSpec(const nlohmann::json& doc, const std::string& where,
                                         const std::string& base_dir);
Result<SyntheticSpec> ReadSyntheticSpec(const std::string& path);

Result<Trace> GenerateSynthetic(const SyntheticSpec& spec);

}  // namespace duet::traces
