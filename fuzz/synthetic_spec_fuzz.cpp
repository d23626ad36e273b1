// Fuzz target for the synthetic spec parser and generator: any JSON must parse to a spec or an
// error naming the file. Specs that parse are generated when small enough to stay fast (at
// most 1000 requests and ~1M block ids), and never from "trace" distributions, which would
// read whatever file the input names. Session turns are checked against their parents.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "traces/synthetic.h"

namespace {

using duet::traces::LengthDist;

// Largest prompt a length distribution can produce (before the shared prefix).
std::int64_t MaxTokens(const LengthDist& dist) {
  return dist.kind == LengthDist::Kind::kFixed ? dist.value : dist.max;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return 0;
  auto spec = duet::traces::ParseSyntheticSpec(doc, "fuzz.json", "/nonexistent");
  if (!spec.ok()) {
    if (spec.error().rfind("fuzz.json", 0) != 0) std::abort();
    return 0;
  }
  if (spec->num_requests > 1000) return 0;
  if (spec->input.kind == LengthDist::Kind::kTrace ||
      spec->output.kind == LengthDist::Kind::kTrace ||
      (spec->sessions && spec->sessions->new_tokens.kind == LengthDist::Kind::kTrace)) {
    return 0;
  }
  const double blocks_per_request =
      static_cast<double>(MaxTokens(spec->input) + spec->prefix_tokens) /
      static_cast<double>(spec->block_tokens);
  if (blocks_per_request * static_cast<double>(spec->num_requests) > 1e6) return 0;

  auto trace = duet::traces::GenerateSynthetic(*spec);
  if (!trace.ok() || trace->requests.size() != spec->num_requests) std::abort();
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& r = trace->requests[i];
    if (r.input_tokens < 1 || r.output_tokens < 1) std::abort();
    if (i > 0 && !(trace->requests[i - 1].arrival_s <= r.arrival_s)) std::abort();
    if (r.id != i || !r.after.empty()) std::abort();
    if (r.parent) {
      // A session's later turn: the previous request's whole context, then new tokens.
      if (!spec->sessions || *r.parent != i - 1 || !r.block_ids.empty()) std::abort();
      const auto& p = trace->requests[i - 1];
      if (r.context_tokens != p.input_tokens + p.output_tokens) std::abort();
      if (r.input_tokens <= r.context_tokens || r.session != p.session) std::abort();
      if (r.arrival_s != p.arrival_s || !(r.delay_s >= 0 && r.delay_s <= 3600)) std::abort();
      const std::int64_t limit = spec->sessions->max_context_tokens > 0
                                     ? spec->sessions->max_context_tokens
                                     : 1'000'000'000;
      if (r.input_tokens + r.output_tokens > limit) std::abort();
      continue;
    }
    if (r.context_tokens != 0 || r.delay_s != 0) std::abort();
    // With sessions every request names its session; without, none does.
    if (spec->sessions.has_value() == r.session.empty()) std::abort();
    const auto blocks = (r.input_tokens + spec->block_tokens - 1) / spec->block_tokens;
    if (static_cast<std::int64_t>(r.block_ids.size()) != blocks) std::abort();
  }
  return 0;
}
