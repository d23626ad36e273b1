// Request traces: the in-memory form every reader and generator produces, and the
// selections applied before a replay (rate and length scaling, first N, time window).
// Pure C++ (STL + nlohmann_json): no simulator, GPU or network headers.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace duet::traces {

// One request as recorded. `block_ids` carries prefix identity: entry i names the content of
// prompt tokens [i*block_tokens, (i+1)*block_tokens) together with everything before it
// being equal (Mooncake semantics); the last block may be partial. Empty: no prefix info.
//
// Dependencies (session and agentic traces, docs/workloads.md): a request may continue a
// parent's context and wait for other requests. It is sent `delay_s` after the last of its
// parent and `after` requests finished, and not before arrival_s, which for such a request is
// a lower bound (at least every dependency's). Dependencies always come earlier in the file.
struct TraceRequest {
  std::uint64_t id = 0;  // position in the trace file, 0-based, kept through selections
  Seconds arrival_s = 0;
  // The whole prompt. With a parent: context_tokens (the parent's prompt and output) and then
  // the turn's new tokens.
  Tokens input_tokens = 0;
  Tokens output_tokens = 0;
  // Prefix identity of the prompt; empty for a request with a parent (its prompt is the
  // parent's context, then new tokens of its own).
  std::vector<std::uint64_t> block_ids;
  std::optional<std::uint64_t> parent;  // id of the request whose context this one continues
  Tokens context_tokens = 0;            // the parent's input_tokens + output_tokens
  std::vector<std::uint64_t> after;     // ids of further requests it waits for
  Seconds delay_s = 0;                  // think time after its dependencies finished
  std::string session;                  // session name; "" for none

  bool HasDependencies() const { return parent.has_value() || !after.empty(); }
};

struct Trace {
  std::string source;                  // file path, or "synthetic" for generated traces
  Tokens block_tokens = 512;           // tokens covered by one block_ids entry
  std::vector<TraceRequest> requests;  // sorted by arrival_s (stable: file order on ties)

  // Whether any request depends on another (a session or agentic trace).
  bool HasDependencies() const;
};

enum class TraceFormat { kMooncake, kAzure, kSynthetic };

// The latest arrival a trace may have, after every selection: about 3.2 years. Readers reject
// later timestamps and --rate-scale may not push arrivals past it, so that simulated times stay
// finite and keep sub-microsecond resolution in double seconds.
inline constexpr Seconds kMaxArrivalS = 1e8;

// The most tokens a request's prompt or output may have, in every reader and selection: beyond
// it a trace is surely corrupt, and byte counts would overflow downstream (tokens x KV bytes
// per token in int64).
inline constexpr Tokens kMaxRequestTokens = 1'000'000'000;

// "mooncake", "azure", "synthetic"; error names the accepted values.
Result<TraceFormat> ParseTraceFormat(const std::string& name);

// Mooncake FAST'25 JSONL: {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]},
// with the optional session fields of docs/workloads.md ("request_id", "session_id", "parent",
// "after", "delay"; aiperf's mooncake_trace sessions read the same). Errors name `source_name`,
// the 1-based line and the field. Blank lines are skipped.
Result<Trace> ParseMooncake(std::istream& in, const std::string& source_name);
Result<Trace> ReadMooncake(const std::string& path);

// Azure LLM inference CSV: header TIMESTAMP,ContextTokens,GeneratedTokens; timestamps
// "YYYY-MM-DD HH:MM:SS.fffffff", replayed relative to the first row. No prefix info.
Result<Trace> ParseAzure(std::istream& in, const std::string& source_name);
Result<Trace> ReadAzure(const std::string& path);

// Reads `path` in `format`; for kSynthetic, `path` is a synthetic spec JSON (synthetic.h).
Result<Trace> ReadTrace(const std::string& path, TraceFormat format);

// Writes Mooncake JSONL (timestamps and delays rounded to ms), e.g. to save a generated trace;
// ParseMooncake reads it back to the same trace, dependencies included.
Status WriteMooncake(const Trace& trace, const std::string& path);

// Selections. Each keeps request ids and arrival order.
// Multiplies the arrival rate by `factor` (> 0): arrival_s /= factor. An error, with the trace
// unchanged, when an arrival would pass kMaxArrivalS.
Status ScaleRate(Trace& trace, double factor);
// Multiplies every request's token lengths by `factor` (> 0), so that a trace recorded on large
// GPUs loads a small backend alike: prompt and output lengths (each rounded, at least 1; a
// session turn's new tokens rounded, its context its parent's scaled prompt and output) and the
// tokens a block id covers, so prefix sharing keeps its shape. An error, with the trace unchanged,
// when the scaled block is not a whole number of tokens (for Mooncake's 512-token blocks, factors
// k/512 such as 0.0625) or a length would pass kMaxRequestTokens.
Status ScaleLengths(Trace& trace, double factor);
// Keeps the first `n` requests (n == 0: keep all).
void KeepFirst(Trace& trace, std::size_t n);
// Keeps requests with start_s <= arrival_s < end_s and shifts arrivals so the first is 0.
// A request whose dependency falls outside the window is dropped too (its context is gone).
Status KeepWindow(Trace& trace, Seconds start_s, Seconds end_s);

}  // namespace duet::traces
