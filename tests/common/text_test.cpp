// Excerpt: bounded, printable quotes of untrusted text for error messages.
#include "common/text.h"

#include <gtest/gtest.h>

namespace duet {
namespace {

TEST(Excerpt, KeepsShortPrintableTextAsItIs) {
  EXPECT_EQ(Excerpt("trace.csv"), "trace.csv");
  EXPECT_EQ(Excerpt("caf\xC3\xA9"), "caf\xC3\xA9");  // valid UTF-8 stays
}

TEST(Excerpt, EscapesControlBytesAndInvalidUtf8) {
  EXPECT_EQ(Excerpt("a\nb\x1b[31m\x7f"), "a\\x0ab\\x1b[31m\\x7f");
  EXPECT_EQ(Excerpt("\xC3"), "\\xc3");                    // truncated sequence
  EXPECT_EQ(Excerpt("\xC0\xAF"), "\\xc0\\xaf");           // overlong form
  EXPECT_EQ(Excerpt("\xED\xA0\x80"), "\\xed\\xa0\\x80");  // surrogate
}

TEST(Excerpt, CutsAtTheLimitOnACharacterBoundary) {
  EXPECT_EQ(Excerpt(std::string(1 << 20, 'x'), 10), std::string(10, 'x') + "...");
  EXPECT_EQ(Excerpt("abcd\xC3\xA9", 5), "abcd...");  // never half a character
  EXPECT_EQ(Excerpt("", 3), "");
}

}  // namespace
}  // namespace duet
