// UTF-8 and byte-level helpers shared by the tokenizer, its test tokenizer and the tests:
// validation, lossy conversion (maximal-subpart U+FFFD, as Rust's from_utf8_lossy and
// Python's errors="replace" do), the GPT-2 bytes<->unicode alphabet, and Unicode whitespace.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet::backend::unicode {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// True when `bytes` is well-formed UTF-8 (no surrogates, no overlongs, at most U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// Appends `bytes` to `out`, replacing each maximal ill-formed subpart with U+FFFD. When
// `final` is false, an incomplete sequence at the very end that could still become valid is
// left unconsumed, so a streaming caller can wait for the rest. Returns the bytes consumed.
std::size_t AppendLossyUtf8(std::string_view bytes, bool final, std::string* out);

// Lossy conversion of a whole buffer (final = true).
std::string LossyUtf8(std::string_view bytes);

// Decodes the code point at `pos`; returns its length in bytes, or 0 when the bytes there
// are not a valid sequence (then *cp is unchanged).
std::size_t DecodeUtf8(std::string_view bytes, std::size_t pos, char32_t* cp);

// Length of the character at `pos`: the valid sequence's length, else 1 (one invalid byte).
std::size_t CharLengthAt(std::string_view bytes, std::size_t pos);

void AppendUtf8(char32_t cp, std::string* out);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool IsUnicodeWhitespace(char32_t cp);

// Python's str.isspace(): White_Space plus the separators U+001C..U+001F, which Jinja's
// `trim` (str.strip) also removes.
bool IsPythonSpace(char32_t cp);

// The GPT-2 byte-level alphabet: each byte maps to one printable code point (printable
// Latin-1 bytes map to themselves, the rest to U+0100 upwards). ByteToChar gives its UTF-8.
const std::array<std::string, 256>& ByteLevelAlphabet();
// The byte a byte-level code point stands for, or -1 when `cp` is not in the alphabet.
int ByteLevelCharToByte(char32_t cp);

// Unicode Normalization Form C of a UTF-8 string. Ill-formed bytes pass through unchanged.
std::string NfcNormalize(std::string_view text);

}  // namespace duet::backend::unicode
