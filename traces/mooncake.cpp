// Reader for the Mooncake FAST'25 JSONL trace format: one JSON object per line with
// timestamp (ms), input_length, output_length and hash_ids (one id per 512-token block).
// Every rejected line gets a message naming the source, the 1-based line and the field, so a
// bad trace can be fixed without guessing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/json_util.h"
#include "common/text.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

// Mooncake's hash_ids each cover 512 prompt tokens (the last block may be partial).
constexpr Tokens kMooncakeBlockTokens = 512;

// "<source>:<line>": where a line's errors happen (field errors use the shared FieldError).
std::string LineWhere(const std::string& source, std::size_t line) {
  return source + ":" + std::to_string(line);
}

Status LineError(const std::string& source, std::size_t line, const std::string& what) {
  return Status::Error(LineWhere(source, line) + ": " + what);
}

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
  });
}

// A token count in 1..kMaxRequestTokens: a request needs at least one prompt token and
// produces at least one output token.
Result<Tokens> ReadLength(const nlohmann::json& obj, const char* field, const std::string& source,
                          std::size_t line) {
  auto it = obj.find(field);
  if (it == obj.end()) return FieldError(LineWhere(source, line), field, "is missing");
  std::int64_t value = 0;
  if (it->is_number_unsigned()) {
    const auto raw = it->get<std::uint64_t>();
    if (raw > static_cast<std::uint64_t>(kMaxRequestTokens)) {
      return FieldError(LineWhere(source, line), field,
                        "must be at most " + std::to_string(kMaxRequestTokens) + " tokens");
    }
    value = static_cast<std::int64_t>(raw);
  } else if (it->is_number_integer()) {
    value = it->get<std::int64_t>();  // negative: nlohmann stores non-negatives as unsigned
  } else {
    return FieldError(LineWhere(source, line), field, "must be a positive integer");
  }
  if (value < 1) return FieldError(LineWhere(source, line), field, "must be a positive integer");
  return value;
}

// Prompt blocks a request of `input_tokens` needs: ceil(input_tokens / 512), overflow-free.
Tokens ExpectedBlocks(Tokens input_tokens) {
  return input_tokens / kMooncakeBlockTokens + (input_tokens % kMooncakeBlockTokens != 0 ? 1 : 0);
}

// ---- Fast path ------------------------------------------------------------------------------
// Building an nlohmann::json DOM per line costs ~7 us, most of the time to read the real trace.
// Nearly every line has one shape: a flat object of the four known keys holding non-negative
// integers. This scanner accepts exactly such lines when they are also valid requests, and
// gives up (returns false) on anything else: floats, other keys, escapes, duplicate keys, bad
// syntax, out-of-range values. The caller then parses the line with nlohmann::json, which
// accepts all valid JSON and words the errors, so the fast path changes speed, not results.

class LineScanner {
 public:
  explicit LineScanner(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  void SkipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r' || *p_ == '\n')) ++p_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool AtEnd() {
    SkipSpace();
    return p_ == end_;
  }
  bool Peek(char c) {
    SkipSpace();
    return p_ < end_ && *p_ == c;
  }
  // A key without escapes or control characters (JSON forbids raw ones; escapes need decoding).
  bool Key(std::string_view& key) {
    if (!Consume('"')) return false;
    const char* start = p_;
    while (p_ < end_ && *p_ != '"') {
      if (*p_ == '\\' || static_cast<unsigned char>(*p_) < 0x20) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    key = std::string_view(start, static_cast<std::size_t>(p_ - start));
    ++p_;
    return true;
  }
  // A JSON integer >= 0 that fits in 64 bits; no leading zeros (invalid JSON), no fraction or
  // exponent (nlohmann would read those as floats).
  bool Unsigned(std::uint64_t& value) {
    SkipSpace();
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    if (*p_ == '0' && p_ + 1 < end_ && p_[1] >= '0' && p_[1] <= '9') return false;
    value = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const auto digit = static_cast<std::uint64_t>(*p_ - '0');
      if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
      value = value * 10 + digit;
      ++p_;
    }
    return p_ == end_ || (*p_ != '.' && *p_ != 'e' && *p_ != 'E');
  }

 private:
  const char* p_;
  const char* end_;
};

bool FastParseLine(std::string_view text, TraceRequest& request) {
  LineScanner scan(text);
  if (!scan.Consume('{')) return false;
  std::uint64_t timestamp_ms = 0, input = 0, output = 0;
  bool seen[4] = {false, false, false, false};  // timestamp, input, output, hash_ids
  request.block_ids.clear();
  do {
    std::string_view key;
    if (!scan.Key(key) || !scan.Consume(':')) return false;
    int index = -1;
    if (key == "timestamp") index = 0;
    if (key == "input_length") index = 1;
    if (key == "output_length") index = 2;
    if (key == "hash_ids") index = 3;
    if (index < 0 || seen[index]) return false;
    seen[index] = true;
    if (index == 0 && !scan.Unsigned(timestamp_ms)) return false;
    if (index == 1 && !scan.Unsigned(input)) return false;
    if (index == 2 && !scan.Unsigned(output)) return false;
    if (index == 3) {
      if (!scan.Consume('[')) return false;
      if (!scan.Consume(']')) {
        do {
          std::uint64_t id = 0;
          if (!scan.Unsigned(id)) return false;
          request.block_ids.push_back(id);
        } while (scan.Consume(','));
        if (!scan.Consume(']')) return false;
      }
    }
  } while (scan.Consume(','));
  if (!scan.Consume('}') || !scan.AtEnd()) return false;
  if (!(seen[0] && seen[1] && seen[2] && seen[3])) return false;
  const auto max = static_cast<std::uint64_t>(kMaxRequestTokens);
  if (input < 1 || input > max || output < 1 || output > max) return false;
  request.input_tokens = static_cast<Tokens>(input);
  request.output_tokens = static_cast<Tokens>(output);
  if (!request.block_ids.empty() &&
      static_cast<Tokens>(request.block_ids.size()) != ExpectedBlocks(request.input_tokens)) {
    return false;
  }
  if (static_cast<double>(timestamp_ms) > kMaxArrivalS * 1000.0) return false;
  request.arrival_s = static_cast<double>(timestamp_ms) / 1000.0;
  return true;
}

// ---- Full path ------------------------------------------------------------------------------

// What the lines read so far define for the lines after them: request and session names.
struct Names {
  std::unordered_map<std::string, std::pair<std::uint64_t, std::size_t>> requests;  // id, line
  std::unordered_map<std::string, std::uint64_t> session_last;  // the session's latest request
};

// A request or session name: a non-empty string, or a non-negative integer (read as its decimal
// text, so 5 and "5" name the same request).
Result<std::string> ReadName(const nlohmann::json& value, const std::string& where,
                             const char* field) {
  if (value.is_string() && value.get_ref<const std::string&>().empty())
    return FieldError(where, field, "must not be empty");
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_unsigned()) return std::to_string(value.get<std::uint64_t>());
  return FieldError(where, field, "must be a string or a non-negative integer");
}

// The session fields of a line (docs/workloads.md), after its Mooncake fields were read.
// `requests`: the lines before, in file order (ids are positions).
Status ParseDependencies(const nlohmann::json& obj, bool has_timestamp,
                         const std::vector<TraceRequest>& requests, Names& names,
                         const std::string& where, std::size_t line, TraceRequest& request) {
  auto earlier = [&](const nlohmann::json& value, const char* field) -> Result<std::uint64_t> {
    auto name = ReadName(value, where, field);
    if (!name) return name.status();
    auto it = names.requests.find(*name);
    if (it == names.requests.end())
      return FieldError(where, field,
                        "names '" + Excerpt(*name, 64) + "', which no earlier request_id is");
    return it->second.first;
  };
  if (auto it = obj.find("session_id"); it != obj.end() && !it->is_null()) {
    auto name = ReadName(*it, where, "session_id");
    if (!name) return name.status();
    request.session = *name;
  }
  if (auto it = obj.find("parent"); it != obj.end() && !it->is_null()) {
    auto parent = earlier(*it, "parent");
    if (!parent) return parent.status();
    request.parent = *parent;
  } else if (!request.session.empty()) {
    // A session's turns follow each other in file order.
    if (auto last = names.session_last.find(request.session); last != names.session_last.end())
      request.parent = last->second;
  }
  if (auto it = obj.find("after"); it != obj.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError(where, "after", "must be an array of request_ids");
    for (const nlohmann::json& value : *it) {
      auto id = earlier(value, "after");
      if (!id) return id.status();
      if (std::find(request.after.begin(), request.after.end(), *id) == request.after.end())
        request.after.push_back(*id);
    }
  }
  if (JsonHas(obj, "delay")) {
    if (!request.HasDependencies())
      return FieldError(where, "delay",
                        "needs a request to follow (parent, an earlier turn of its session_id, "
                        "or after)");
    auto delay = JsonNumberIn(obj, "delay", 0, kMaxArrivalS * 1000.0, where);
    if (!delay) return delay.status();
    request.delay_s = *delay / 1000.0;
  }
  if (!has_timestamp && !request.HasDependencies())
    return FieldError(where, "timestamp", "is missing");
  if (request.parent) {
    const TraceRequest& parent = requests[*request.parent];
    if (request.session.empty()) request.session = parent.session;
    if (!request.block_ids.empty())
      return FieldError(where, "hash_ids",
                        "must be empty for a request with a parent: its prompt is the parent's "
                        "context, then input_length new tokens");
    request.context_tokens = parent.input_tokens + parent.output_tokens;
    if (request.context_tokens + request.input_tokens > kMaxRequestTokens)
      return FieldError(where, "input_length",
                        "makes the prompt, after the parent's " +
                            std::to_string(request.context_tokens) +
                            " tokens of context, longer "
                            "than " +
                            std::to_string(kMaxRequestTokens) + " tokens");
    request.input_tokens += request.context_tokens;
  }
  // Sent after its dependencies: never before they arrived.
  if (request.parent)
    request.arrival_s = std::max(request.arrival_s, requests[*request.parent].arrival_s);
  for (std::uint64_t id : request.after)
    request.arrival_s = std::max(request.arrival_s, requests[id].arrival_s);
  if (auto it = obj.find("request_id"); it != obj.end() && !it->is_null()) {
    auto name = ReadName(*it, where, "request_id");
    if (!name) return name.status();
    auto [pos, inserted] = names.requests.try_emplace(*name, request.id, line);
    if (!inserted)
      return FieldError(where, "request_id",
                        "'" + Excerpt(*name, 64) + "' is already the request_id of line " +
                            std::to_string(pos->second.second));
  }
  if (!request.session.empty()) names.session_last[request.session] = request.id;
  return Status::Ok();
}

// Parses one non-blank line into `request` (id and block_ids filled, arrival in seconds).
Status ParseLine(std::string_view text, const std::string& source, std::size_t line,
                 const std::vector<TraceRequest>& earlier, Names& names, TraceRequest& request) {
  nlohmann::json obj = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                             /*allow_exceptions=*/false);
  if (obj.is_discarded()) {
    // Parse again with exceptions only to recover the position for the message.
    try {
      const nlohmann::json reparsed = nlohmann::json::parse(text.begin(), text.end());
      (void)reparsed;
    } catch (const nlohmann::json::exception& e) {
      return LineError(source, line, "invalid JSON: " + Excerpt(e.what(), 200));
    }
    return LineError(source, line, "invalid JSON");
  }
  if (!obj.is_object()) return LineError(source, line, "expected a JSON object");

  // Checked once the dependencies are known: a request that follows others may omit it.
  auto ts = obj.find("timestamp");
  const bool has_timestamp = ts != obj.end() && !ts->is_null();
  request.arrival_s = 0;
  if (has_timestamp) {
    if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0) {
      return FieldError(LineWhere(source, line), "timestamp",
                        "must be a non-negative number (milliseconds)");
    }
    if (ts->get<double>() > kMaxArrivalS * 1000.0) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", kMaxArrivalS * 1000.0);
      return FieldError(LineWhere(source, line), "timestamp",
                        std::string("must be at most ") + limit + " ms (the trace horizon)");
    }
    request.arrival_s = ts->get<double>() / 1000.0;
  }

  auto input = ReadLength(obj, "input_length", source, line);
  if (!input) return input.status();
  request.input_tokens = *input;
  auto output = ReadLength(obj, "output_length", source, line);
  if (!output) return output.status();
  request.output_tokens = *output;

  auto ids = obj.find("hash_ids");
  // A request that continues a parent's context has none of its own.
  const bool follows = JsonHas(obj, "parent") || JsonHas(obj, "session_id");
  if (ids == obj.end() || (follows && ids->is_null())) {
    if (!follows) return FieldError(LineWhere(source, line), "hash_ids", "is missing");
    request.block_ids.clear();
    return ParseDependencies(obj, has_timestamp, earlier, names, LineWhere(source, line), line,
                             request);
  }
  if (!ids->is_array()) {
    return FieldError(LineWhere(source, line), "hash_ids",
                      "must be an array of non-negative integers");
  }
  // The real trace always carries ceil(input_length / 512) ids; an empty array is also
  // accepted and means "no prefix information" (what WriteMooncake emits for such traces).
  const Tokens blocks = ExpectedBlocks(request.input_tokens);
  if (!ids->empty() && static_cast<Tokens>(ids->size()) != blocks) {
    return FieldError(LineWhere(source, line), "hash_ids",
                      "has " + std::to_string(ids->size()) + " entries, but input_length " +
                          std::to_string(request.input_tokens) + " needs ceil(" +
                          std::to_string(request.input_tokens) +
                          "/512) = " + std::to_string(blocks) + " (or none)");
  }
  request.block_ids.clear();
  request.block_ids.reserve(ids->size());
  for (std::size_t i = 0; i < ids->size(); ++i) {
    const nlohmann::json& id = (*ids)[i];
    if (!id.is_number_unsigned()) {
      return FieldError(LineWhere(source, line), "hash_ids",
                        "element " + std::to_string(i) + " must be a non-negative integer");
    }
    request.block_ids.push_back(id.get<std::uint64_t>());
  }
  return ParseDependencies(obj, has_timestamp, earlier, names, LineWhere(source, line), line,
                           request);
}

Result<Trace> ParseMooncakeText(std::string_view text, const std::string& source_name) {
  Trace trace;
  trace.source = source_name;
  trace.block_tokens = kMooncakeBlockTokens;
  Names names;
  std::size_t line = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view content = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (IsBlank(content)) continue;
    TraceRequest request;
    request.id = trace.requests.size();
    if (!FastParseLine(content, request)) {
      DUET_RETURN_IF_ERROR(ParseLine(content, source_name, line, trace.requests, names, request));
    }
    trace.requests.push_back(std::move(request));
  }
  if (trace.requests.empty()) return Status::Error(source_name + ": no requests");
  // Timestamps may go backwards in a trace; replay needs arrival order, file order on ties
  // (which keeps every request after its dependencies: its arrival bound is at least theirs).
  std::stable_sort(
      trace.requests.begin(), trace.requests.end(),
      [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_s < b.arrival_s; });
  return trace;
}

}  // namespace

Result<Trace> ParseMooncake(std::istream& in, const std::string& source_name) {
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return ParseMooncakeText(buffer.view(), source_name);
}

Result<Trace> ReadMooncake(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open file");
  // One read of the whole file, then line views into it: no per-line string copies.
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::string text;
  if (size > 0) {
    text.resize(static_cast<std::size_t>(size));
    in.read(text.data(), size);
    if (!in) return Status::Error(path + ": read error");
  } else {
    // Not seekable (a pipe): fall back to a stream copy.
    std::ostringstream buffer;
    buffer << in.rdbuf();
    text = std::move(buffer).str();
  }
  return ParseMooncakeText(text, path);
}

}  // namespace duet::traces
