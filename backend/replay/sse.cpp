// The server-sent events parser (sse.h), following the WHATWG "interpret an event stream"
// algorithm, kept incremental: every state that can straddle two pieces of input (a line, a
// CRLF pair, a byte-order mark) is held between calls.
#include "backend/replay/sse.h"

namespace duet::backend::replay {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

}  // namespace

Status SseParser::Feed(std::string_view bytes, std::vector<SseEvent>& events) {
  if (!error_.empty()) return Status::Error(error_);
  std::size_t i = 0;
  // A byte-order mark may itself arrive split; hold its bytes until it is decided.
  while (!started_ && i < bytes.size()) {
    if (bytes[i] == kBom[bom_seen_]) {
      ++i;
      if (++bom_seen_ == kBom.size()) started_ = true;
      continue;
    }
    // Not a byte-order mark: the bytes matched so far were ordinary content.
    line_.assign(kBom.substr(0, bom_seen_));
    started_ = true;
  }
  while (i < bytes.size()) {
    const char c = bytes[i++];
    if (c == '\n' && after_cr_) {
      after_cr_ = false;  // the second half of a CRLF already ended the line
      continue;
    }
    after_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      if (Status s = ProcessLine(events); !s.ok()) return s;
      continue;
    }
    // Copy the run of ordinary bytes at once.
    std::size_t end = i;
    while (end < bytes.size() && bytes[end] != '\r' && bytes[end] != '\n') ++end;
    line_ += c;
    line_.append(bytes.substr(i, end - i));
    i = end;
    if (line_.size() + data_.size() > max_event_bytes_) {
      error_ = "an event is longer than " + std::to_string(max_event_bytes_) + " bytes";
      return Status::Error(error_);
    }
  }
  return Status::Ok();
}

Status SseParser::ProcessLine(std::vector<SseEvent>& events) {
  std::string_view line = line_;
  if (line.empty()) {
    // A blank line dispatches the event; one without data lines is dropped (per the format).
    if (has_data_) {
      data_.pop_back();  // the '\n' after the last data line
      events.push_back(SseEvent{std::move(type_), std::move(data_), id_});
    }
    data_.clear();
    type_.clear();
    has_data_ = false;
    return Status::Ok();
  }
  if (line.front() == ':') {  // a comment (servers send them as keep-alives)
    line_.clear();
    return Status::Ok();
  }
  std::string_view field = line, value;
  if (const auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_ += '\n';
    has_data_ = true;
  } else if (field == "event") {
    type_.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) id_.assign(value);
  }  // "retry" and unknown fields: nothing to do for a client that does not reconnect
  line_.clear();
  return Status::Ok();
}

}  // namespace duet::backend::replay
