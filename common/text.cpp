// Printable, bounded excerpts of untrusted text, and numbers written short (see text.h).
#include "common/text.h"

#include <cstdio>

namespace duet {
namespace {

// Length of the valid UTF-8 sequence of 2 to 4 bytes starting at text[i], or 0.
std::size_t Utf8SequenceLength(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlong forms
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string Excerpt(std::string_view text, std::size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t n = 1;
    if (c >= 0x80) n = Utf8SequenceLength(text, i);
    if (i + (n ? n : 1) > max_bytes) break;
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (n > 1) {
      out.append(text.substr(i, n));
    } else {
      n = 1;
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
    i += n;
  }
  if (i < text.size()) out += "...";
  return out;
}

std::string ShortNumber(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

}  // namespace duet
