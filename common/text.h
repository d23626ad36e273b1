// Safe excerpts of untrusted text for messages: an error that quotes a trace line, a JSON
// parser's "last read" token or a command-line value must stay one short printable line,
// whatever the input holds (a 256 MB line, raw binary, terminal escape sequences).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace duet {

// At most `max_bytes` bytes of `text` (cut at a character boundary, then "..." appended when
// anything was cut), with control characters, DEL and bytes that are not valid UTF-8 written
// as \xNN escapes; valid UTF-8 beyond ASCII is kept.
std::string Excerpt(std::string_view text, std::size_t max_bytes = 80);

// A number as a person writes it, to 10 significant digits: 2 for 2.0, 1.5, 0.001, 1e+20.
// Stable for file names and CSV cells (the same double always gives the same text).
std::string ShortNumber(double x);

}  // namespace duet
