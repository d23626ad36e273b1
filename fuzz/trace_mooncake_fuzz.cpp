// Fuzz target for the Mooncake JSONL reader: any bytes must give a trace or an error Status,
// never a crash, hang or sanitizer report. Accepted traces are checked for the reader's
// promises (sorted arrivals, positive lengths, hash id counts, dependencies before dependents)
// and, line by line, against a plain nlohmann::json parse, which catches the reader's fast
// scanner disagreeing with JSON. The session fields (request_id, session_id, parent, after,
// delay) are resolved here again, independently of the reader.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "traces/trace.h"

namespace {

using duet::traces::TraceRequest;

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
  });
}

// A present, non-null field (the reader reads null as absent).
const nlohmann::json* Field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A request or session name as the reader reads it: a string, or an unsigned integer's digits.
std::string Name(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_unsigned()) return std::to_string(value.get<std::uint64_t>());
  std::abort();  // the reader accepted a name of another type
}

// What the lines so far named: request_ids, and each session's latest request.
struct Names {
  std::unordered_map<std::string, std::uint64_t> requests;
  std::unordered_map<std::string, std::uint64_t> session_last;
};

// Compares request `r` (file line `r.id`) with an independent parse of its line; `by_id` holds
// every request of the trace by id.
void CheckAgainstJson(std::string_view line, const TraceRequest& r,
                      const std::vector<const TraceRequest*>& by_id, Names& names) {
  const nlohmann::json obj = nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (obj.is_discarded() || !obj.is_object()) std::abort();
  auto earlier = [&](const nlohmann::json& value) {
    auto it = names.requests.find(Name(value));
    if (it == names.requests.end() || it->second >= r.id) std::abort();
    return it->second;
  };

  // Dependencies: an explicit parent, else the previous line of the same session; `after`
  // without repeats.
  std::string session;
  if (const nlohmann::json* value = Field(obj, "session_id")) session = Name(*value);
  std::optional<std::uint64_t> parent;
  if (const nlohmann::json* value = Field(obj, "parent")) {
    parent = earlier(*value);
  } else if (auto it = names.session_last.find(session);
             !session.empty() && it != names.session_last.end()) {
    parent = it->second;
  }
  std::vector<std::uint64_t> after;
  if (const nlohmann::json* value = Field(obj, "after")) {
    if (!value->is_array()) std::abort();
    for (const nlohmann::json& name : *value) {
      const std::uint64_t id = earlier(name);
      if (std::find(after.begin(), after.end(), id) == after.end()) after.push_back(id);
    }
  }
  if (r.parent != parent || r.after != after) std::abort();
  if (parent && session.empty()) session = by_id[*parent]->session;  // joins its parent's
  if (r.session != session) std::abort();

  // Lengths: with a parent, input_length counts the tokens after the parent's context.
  const std::int64_t input_length = obj.at("input_length").get<std::int64_t>();
  if (obj.at("output_length").get<std::int64_t>() != r.output_tokens) std::abort();
  if (parent) {
    const TraceRequest& p = *by_id[*parent];
    if (r.context_tokens != p.input_tokens + p.output_tokens) std::abort();
    if (r.input_tokens != r.context_tokens + input_length) std::abort();
    if (!r.block_ids.empty()) std::abort();
  } else {
    if (r.context_tokens != 0 || r.input_tokens != input_length) std::abort();
    const nlohmann::json* ids = Field(obj, "hash_ids");
    // Absent or null only on a line with a session_id (its session's first).
    if (ids == nullptr && Field(obj, "session_id") == nullptr) std::abort();
    const std::size_t count = ids == nullptr ? 0 : ids->size();
    if (count != r.block_ids.size()) std::abort();
    for (std::size_t i = 0; i < count; ++i) {
      if ((*ids)[i].get<std::uint64_t>() != r.block_ids[i]) std::abort();
    }
  }

  // Arrival: the timestamp (absent only when following others), raised to every dependency's.
  const nlohmann::json* timestamp = Field(obj, "timestamp");
  if (timestamp == nullptr && !parent && after.empty()) std::abort();
  double arrival_s = timestamp == nullptr ? 0.0 : timestamp->get<double>() / 1000.0;
  if (parent) arrival_s = std::max(arrival_s, by_id[*parent]->arrival_s);
  for (std::uint64_t id : after) arrival_s = std::max(arrival_s, by_id[id]->arrival_s);
  if (arrival_s != r.arrival_s) std::abort();
  const nlohmann::json* delay = Field(obj, "delay");
  if (delay != nullptr && !r.HasDependencies()) std::abort();
  if ((delay == nullptr ? 0.0 : delay->get<double>() / 1000.0) != r.delay_s) std::abort();

  if (const nlohmann::json* value = Field(obj, "request_id")) {
    if (!names.requests.emplace(Name(*value), r.id).second) std::abort();  // a duplicate
  }
  if (!session.empty()) names.session_last[session] = r.id;
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
  std::vector<const TraceRequest*> by_id(trace->requests.size(), nullptr);
  std::vector<std::size_t> position(trace->requests.size(), 0);  // by id, in sorted order
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& r = trace->requests[i];
    if (r.input_tokens < 1 || r.output_tokens < 1 || r.arrival_s < 0) std::abort();
    if (r.input_tokens > 1'000'000'000 || r.output_tokens > 1'000'000'000) std::abort();
    if (i > 0 && trace->requests[i - 1].arrival_s > r.arrival_s) std::abort();
    if (!r.block_ids.empty() &&
        static_cast<std::int64_t>(r.block_ids.size()) != (r.input_tokens + 511) / 512) {
      std::abort();
    }
    if (r.id >= by_id.size() || by_id[r.id] != nullptr) std::abort();
    by_id[r.id] = &r;
    position[r.id] = i;
  }
  // Dependencies have smaller ids and come earlier in arrival order; a parent's prompt and
  // output are the start of its child's prompt.
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& r = trace->requests[i];
    std::vector<std::uint64_t> deps = r.after;
    if (r.parent) deps.push_back(*r.parent);
    for (std::uint64_t id : deps) {
      if (id >= r.id || position[id] >= i) std::abort();
      if (by_id[id]->arrival_s > r.arrival_s) std::abort();
    }
    if (r.parent) {
      const TraceRequest& p = *by_id[*r.parent];
      if (r.context_tokens != p.input_tokens + p.output_tokens) std::abort();
      if (r.input_tokens <= r.context_tokens || !r.block_ids.empty()) std::abort();
    } else if (r.context_tokens != 0) {
      std::abort();
    }
    if (r.delay_s < 0 || (r.delay_s > 0 && !r.HasDependencies())) std::abort();
  }
  // Request ids count the non-blank lines; lines are checked in file order (names resolve to
  // earlier lines only).
  Names names;
  std::size_t next_id = 0, pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (IsBlank(line)) continue;
    if (next_id >= by_id.size()) std::abort();
    CheckAgainstJson(line, *by_id[next_id++], by_id, names);
  }
  if (next_id != by_id.size()) std::abort();
  return 0;
}
