// An incremental parser for server-sent events (the WHATWG HTML "event stream" format), as
// OpenAI-compatible servers stream completions: bytes go in as they arrive from the network, in
// pieces of any size (split mid-line, mid-CRLF, several events per piece), and complete events
// come out. No I/O; not thread-safe (one parser per stream).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace duet::backend::replay {

struct SseEvent {
  std::string type;  // the "event:" field; empty for the default type ("message")
  std::string data;  // the "data:" lines joined by '\n'
  std::string id;    // the "id:" field, empty when none was given
};

class SseParser {
 public:
  // A line or an event's data longer than `max_event_bytes` is an error: the stream's memory
  // stays bounded whatever the server sends.
  explicit SseParser(std::size_t max_event_bytes = std::size_t{16} << 20)
      : max_event_bytes_(max_event_bytes) {}

  // Parses `bytes` (the next piece of the stream) and appends every event it completes to
  // `events`. Lines end with "\r\n", "\n" or "\r"; a blank line ends an event; lines starting
  // with ':' are comments; "data:" lines append to the data; unknown fields are ignored; an event
  // without a data line is not dispatched; a UTF-8 byte-order mark at the very start is skipped.
  // After an error every later call fails too.
  Status Feed(std::string_view bytes, std::vector<SseEvent>& events);

  // True when bytes of an unfinished line or event are held (per the format, an event a
  // stream ends in the middle of is discarded).
  bool pending() const { return !line_.empty() || has_data_ || !type_.empty(); }

 private:
  Status ProcessLine(std::vector<SseEvent>& events);

  std::size_t max_event_bytes_;
  std::string line_;          // the current line so far
  std::string data_;          // data of the current event (each line followed by '\n')
  std::string type_, id_;     // fields of the current event; id_ persists across events
  bool has_data_ = false;     // a data line was seen in the current event
  bool after_cr_ = false;     // the last byte was '\r': a '\n' next belongs to that line end
  std::size_t bom_seen_ = 0;  // bytes of a leading byte-order mark matched so far
  bool started_ = false;      // past the possible byte-order mark
  std::string error_;         // set once the stream is malformed
};

}  // namespace duet::backend::replay
