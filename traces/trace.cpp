// Format dispatch (ReadTrace), the Mooncake writer, and the selections applied before a replay
// (rate and length scaling, first N, time window). Readers live in mooncake.cpp and azure.cpp, the
// generator in synthetic.cpp.
#include "traces/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "traces/synthetic.h"

namespace duet::traces {
namespace {

// Shortest readable form of a number for messages ("0.5", "1e-09", "inf"), unlike
// std::to_string's fixed six decimals.
std::string FormatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// Largest arrival whose millisecond timestamp still fits the int64 llround returns.
constexpr Seconds kMaxWritableArrivalS = 9e15;

}  // namespace

Result<TraceFormat> ParseTraceFormat(const std::string& name) {
  if (name == "mooncake") return TraceFormat::kMooncake;
  if (name == "azure") return TraceFormat::kAzure;
  if (name == "synthetic") return TraceFormat::kSynthetic;
  return Status::Error("unknown trace format '" + name +
                       "' (accepted: mooncake, azure, synthetic)");
}

Result<Trace> ReadTrace(const std::string& path, TraceFormat format) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::Error(path + ": is a directory, not a trace file");
  switch (format) {
    case TraceFormat::kMooncake:
      return ReadMooncake(path);
    case TraceFormat::kAzure:
      return ReadAzure(path);
    case TraceFormat::kSynthetic: {
      auto spec = ReadSyntheticSpec(path);
      if (!spec) return spec.status();
      auto trace = GenerateSynthetic(*spec);
      if (!trace) return Status::Error(path + ": " + trace.error());
      trace->source = path;  // the spec file: more useful in reports than "synthetic"
      return trace;
    }
  }
  return Status::Error(path + ": unknown trace format");
}

Status WriteMooncake(const Trace& trace, const std::string& path) {
  // Mooncake hash_ids mean 512-token blocks; ids at another granularity would be misread.
  if (trace.block_tokens != 512) {
    for (const TraceRequest& r : trace.requests) {
      if (!r.block_ids.empty()) {
        return Status::Error(path + ": cannot write Mooncake with block_tokens " +
                             std::to_string(trace.block_tokens) +
                             " (the format's blocks are 512 tokens)");
      }
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing");
  // Written by hand rather than via nlohmann::json, whose objects would sort the keys; the
  // key order and spacing match the published trace.
  // Dependencies name requests by their line in this file; only those named get a request_id.
  std::unordered_map<std::uint64_t, std::size_t> line_of;
  std::vector<bool> named(trace.requests.size(), false);
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    const TraceRequest& r = trace.requests[k];
    // Only earlier lines are in line_of yet.
    auto name = [&](std::uint64_t id) {
      auto it = line_of.find(id);
      if (it == line_of.end()) return false;
      named[it->second] = true;
      return true;
    };
    bool ok = !r.parent || name(*r.parent);
    for (std::uint64_t id : r.after) ok = ok && name(id);
    if (!ok)
      return Status::Error(path + ": request " + std::to_string(r.id) +
                           " depends on a request not before it in the trace");
    if (r.delay_s > 0 && !r.HasDependencies())
      return Status::Error(path + ": request " + std::to_string(r.id) +
                           " has a delay but follows no request");
    line_of.emplace(r.id, k);
  }
  auto write_name = [&](std::string& out, std::uint64_t id) {
    out += std::to_string(line_of.at(id));
  };
  std::string line;
  char number[32];
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    const TraceRequest& r = trace.requests[k];
    if (!(r.arrival_s >= 0 && r.arrival_s <= kMaxWritableArrivalS)) {  // NaN fails too
      return Status::Error(path + ": request " + std::to_string(r.id) +
                           " has an invalid arrival time");
    }
    const long long timestamp_ms = std::llround(r.arrival_s * 1000.0);
    line.clear();
    std::snprintf(number, sizeof(number), "%lld", timestamp_ms);
    line += "{\"timestamp\": ";
    line += number;
    // With a parent, input_length counts the new tokens after the parent's context.
    line += ", \"input_length\": " + std::to_string(r.input_tokens - r.context_tokens);
    line += ", \"output_length\": " + std::to_string(r.output_tokens);
    line += ", \"hash_ids\": [";
    for (std::size_t i = 0; i < r.block_ids.size(); ++i) {
      if (i > 0) line += ", ";
      line += std::to_string(r.block_ids[i]);
    }
    line += "]";
    if (named[k]) line += ", \"request_id\": " + std::to_string(k);
    if (!r.session.empty()) line += ", \"session_id\": " + nlohmann::json(r.session).dump();
    if (r.parent) {
      line += ", \"parent\": ";
      write_name(line, *r.parent);
    }
    if (!r.after.empty()) {
      line += ", \"after\": [";
      for (std::size_t i = 0; i < r.after.size(); ++i) {
        if (i > 0) line += ", ";
        write_name(line, r.after[i]);
      }
      line += "]";
    }
    if (r.delay_s > 0) {
      std::snprintf(number, sizeof(number), "%lld", std::llround(r.delay_s * 1000.0));
      line += ", \"delay\": ";
      line += number;
    }
    line += "}\n";
    out << line;
  }
  out.flush();
  if (!out) return Status::Error(path + ": write error");
  return Status::Ok();
}

bool Trace::HasDependencies() const {
  return std::any_of(requests.begin(), requests.end(),
                     [](const TraceRequest& r) { return r.HasDependencies(); });
}

Status ScaleRate(Trace& trace, double factor) {
  if (!std::isfinite(factor) || factor <= 0) {
    return Status::Error("rate scale factor must be finite and > 0, got " + FormatNumber(factor));
  }
  // Requests are sorted by arrival: the last one is the latest.
  if (!trace.requests.empty()) {
    const Seconds last = trace.requests.back().arrival_s / factor;
    if (!(last <= kMaxArrivalS)) {
      return Status::Error("rate scale factor " + FormatNumber(factor) + " puts request " +
                           std::to_string(trace.requests.back().id) + " at " + FormatNumber(last) +
                           " s, past the " + FormatNumber(kMaxArrivalS) + " s horizon");
    }
  }
  for (TraceRequest& r : trace.requests) r.arrival_s /= factor;
  return Status::Ok();
}

Status ScaleLengths(Trace& trace, double factor) {
  if (!std::isfinite(factor) || factor <= 0)
    return Status::Error("length scale factor must be finite and > 0, got " + FormatNumber(factor));
  const double block = static_cast<double>(trace.block_tokens) * factor;
  const bool has_blocks = std::any_of(trace.requests.begin(), trace.requests.end(),
                                      [](const TraceRequest& r) { return !r.block_ids.empty(); });
  const Tokens block_tokens = static_cast<Tokens>(std::llround(std::min(block, 1e18)));
  // A length scaled and rounded, at least `lowest`; an error past the bound.
  auto scale = [&](Tokens tokens, Tokens lowest, const TraceRequest& r,
                   const char* what) -> Result<Tokens> {
    const double scaled = std::round(static_cast<double>(tokens) * factor);
    if (!(scaled <= static_cast<double>(kMaxRequestTokens)))
      return Status::Error("length scale factor " + FormatNumber(factor) + " makes request " +
                           std::to_string(r.id) + "'s " + what + " " + FormatNumber(scaled) +
                           " tokens, past " + std::to_string(kMaxRequestTokens));
    return std::max(lowest, static_cast<Tokens>(scaled));
  };
  // Scaled into a copy, so that an error leaves the trace unchanged. Parents come first.
  std::vector<TraceRequest> scaled = trace.requests;
  std::unordered_map<std::uint64_t, Tokens> context_of;  // id -> scaled prompt + output
  for (TraceRequest& r : scaled) {
    auto output = scale(r.output_tokens, 1, r, "output");
    if (!output) return output.status();
    if (r.parent) {
      const Tokens own = r.input_tokens - r.context_tokens;
      auto turn = scale(own, own > 0 ? 1 : 0, r, "new prompt");
      if (!turn) return turn.status();
      const auto parent = context_of.find(*r.parent);
      r.context_tokens = parent == context_of.end() ? 0 : parent->second;
      if (r.context_tokens + *turn > kMaxRequestTokens)
        return Status::Error("length scale factor " + FormatNumber(factor) + " makes request " +
                             std::to_string(r.id) + "'s prompt past " +
                             std::to_string(kMaxRequestTokens) + " tokens");
      r.input_tokens = r.context_tokens + *turn;
    } else {
      auto input = scale(r.input_tokens, 1, r, "prompt");
      if (!input) return input.status();
      r.input_tokens = *input;
      // Rounding never adds a block; it may leave the last id without tokens.
      const auto blocks = static_cast<std::size_t>((r.input_tokens + block_tokens - 1) /
                                                   std::max<Tokens>(block_tokens, 1));
      if (r.block_ids.size() > blocks) r.block_ids.resize(blocks);
    }
    r.output_tokens = *output;
    context_of[r.id] = r.input_tokens + r.output_tokens;
  }
  if (has_blocks &&
      (block_tokens < 1 || std::abs(block - static_cast<double>(block_tokens)) > 1e-6))
    return Status::Error("length scale factor " + FormatNumber(factor) + " makes the trace's " +
                         std::to_string(trace.block_tokens) + "-token prefix blocks " +
                         FormatNumber(block) +
                         " tokens; choose a factor that keeps them whole (k/" +
                         std::to_string(trace.block_tokens) + ")");
  trace.requests = std::move(scaled);
  trace.block_tokens = std::max<Tokens>(block_tokens, 1);
  return Status::Ok();
}

void KeepFirst(Trace& trace, std::size_t n) {
  if (n != 0 && n < trace.requests.size()) trace.requests.resize(n);
}

Status KeepWindow(Trace& trace, Seconds start_s, Seconds end_s) {
  // end_s may be +infinity ("until the end"); NaN fails every comparison below.
  if (!(start_s >= 0) || !std::isfinite(start_s) || !(end_s > start_s)) {
    return Status::Error("time window [" + FormatNumber(start_s) + ", " + FormatNumber(end_s) +
                         ") must have 0 <= start < end");
  }
  // Dependencies come first in arrival order: one pass sees each request's before it.
  std::vector<TraceRequest> kept;
  std::unordered_set<std::uint64_t> kept_ids;
  for (TraceRequest& r : trace.requests) {
    if (!(r.arrival_s >= start_s && r.arrival_s < end_s)) continue;
    bool context = !r.parent || kept_ids.count(*r.parent);
    for (std::uint64_t id : r.after) context = context && kept_ids.count(id);
    if (!context) continue;
    kept_ids.insert(r.id);
    kept.push_back(std::move(r));
  }
  if (kept.empty()) {
    // Nothing was moved out, so the trace is unchanged on this error.
    return Status::Error(trace.source + ": no requests in window [" + FormatNumber(start_s) + ", " +
                         FormatNumber(end_s) + ")");
  }
  // Readers sort by arrival, but a hand-built trace may not be: shift by the earliest.
  Seconds shift_s = kept.front().arrival_s;
  for (const TraceRequest& r : kept) shift_s = std::min(shift_s, r.arrival_s);
  for (TraceRequest& r : kept) r.arrival_s -= shift_s;
  trace.requests = std::move(kept);
  return Status::Ok();
}

}  // namespace duet::traces
