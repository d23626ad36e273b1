// Fuzz target for the Mooncake JSONL reader: any bytes must give a trace or an error Status,
// never a crash, hang or sanitizer report. Accepted traces are checked for the reader's
// promises (sorted arrivals, positive lengths, hash id counts) and, line by line, against a
// plain nlohmann::json parse, which catches the reader's fast scanner disagreeing with JSON.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "traces/trace.h"

namespace {

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
  });
}

// Compares request `r` with an independent parse of its line.
void CheckAgainstJson(std::string_view line, const duet::traces::TraceRequest& r) {
  const nlohmann::json obj = nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (obj.is_discarded() || !obj.is_object()) std::abort();
  if (obj.at("timestamp").get<double>() / 1000.0 != r.arrival_s) std::abort();
  if (obj.at("input_length").get<std::int64_t>() != r.input_tokens) std::abort();
  if (obj.at("output_length").get<std::int64_t>() != r.output_tokens) std::abort();
  const nlohmann::json& ids = obj.at("hash_ids");
  if (ids.size() != r.block_ids.size()) std::abort();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i].get<std::uint64_t>() != r.block_ids[i]) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  auto trace = duet::traces::ParseMooncake(in, "fuzz.jsonl");
  if (!trace.ok()) {
    // Every error names the source.
    if (trace.error().rfind("fuzz.jsonl", 0) != 0) std::abort();
    return 0;
  }
  if (trace->requests.empty()) std::abort();
  std::vector<const duet::traces::TraceRequest*> by_id(trace->requests.size(), nullptr);
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& r = trace->requests[i];
    if (r.input_tokens < 1 || r.output_tokens < 1 || r.arrival_s < 0) std::abort();
    if (i > 0 && trace->requests[i - 1].arrival_s > r.arrival_s) std::abort();
    if (!r.block_ids.empty() &&
        static_cast<std::int64_t>(r.block_ids.size()) != (r.input_tokens + 511) / 512) {
      std::abort();
    }
    if (r.id >= by_id.size() || by_id[r.id] != nullptr) std::abort();
    by_id[r.id] = &r;
  }
  // Request ids count the non-blank lines.
  std::size_t next_id = 0, pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (IsBlank(line)) continue;
    if (next_id >= by_id.size()) std::abort();
    CheckAgainstJson(line, *by_id[next_id++]);
  }
  if (next_id != by_id.size()) std::abort();
  return 0;
}
