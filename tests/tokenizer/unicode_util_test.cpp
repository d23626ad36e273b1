// UTF-8 helpers and NFC: expected values are Python's (bytes.decode(errors="replace") and
// unicodedata.normalize("NFC")), the references HF `tokenizers` agrees with.
#include <gtest/gtest.h>

#include <set>

#include "backend/tokenizer/unicode_util.h"

namespace duet::backend::unicode {
namespace {

TEST(Utf8, Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xF0\x9F\x99\x82 \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(LossyUtf8("\xF0\x9F"), "\uFFFD");
  EXPECT_EQ(LossyUtf8("\xC3("), "\uFFFD(");
  EXPECT_EQ(LossyUtf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(LossyUtf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(LossyUtf8("a\xE2\x82"), "a\uFFFD");
  EXPECT_EQ(LossyUtf8("\xE2\x82\xE2\x82\xAC"), "\uFFFD\u20AC");
  EXPECT_EQ(LossyUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
}

TEST(Utf8, NonFinalHoldsBackAnIncompleteTail) {
  std::string out;
  EXPECT_EQ(AppendLossyUtf8("ab\xF0\x9F\x99", false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendLossyUtf8("\xF0(", false, &out), 2u);  // cannot complete: replaced now
  EXPECT_EQ(out, "\uFFFD(");
  out.clear();
  EXPECT_EQ(AppendLossyUtf8("\xF0\x9F\x99", true, &out), 3u);
  EXPECT_EQ(out, "\uFFFD");
}

TEST(Utf8, DecodeAndEncodeCodePoints) {
  char32_t cp = 0;
  EXPECT_EQ(DecodeUtf8("\xE6\x97\xA5", 0, &cp), 3u);
  EXPECT_EQ(cp, U'\u65E5');
  EXPECT_EQ(DecodeUtf8("\xE6\x97", 0, &cp), 0u);
  EXPECT_EQ(CharLengthAt("\xE6\x97", 0), 1u);
  std::string out;
  for (char32_t c : {U'a', U'\u00E9', U'\u65E5', U'\U0001F642'}) AppendUtf8(c, &out);
  EXPECT_EQ(out, "a\xC3\xA9\xE6\x97\xA5\xF0\x9F\x99\x82");
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  const auto& alphabet = ByteLevelAlphabet();
  EXPECT_EQ(alphabet['A'], "A");
  EXPECT_EQ(alphabet[' '], "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(alphabet['\n'], "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(alphabet[0], "\xC4\x80");     // U+0100
  EXPECT_EQ(alphabet[0xAD], "\xC5\x83");  // soft hyphen maps past the control bytes: U+0143
  EXPECT_EQ(alphabet[0xE9], "\xC3\xA9");  // printable Latin-1 maps to itself
  std::set<std::string> distinct(alphabet.begin(), alphabet.end());
  EXPECT_EQ(distinct.size(), 256u);
  for (int b = 0; b < 256; ++b) {
    char32_t cp = 0;
    ASSERT_GT(DecodeUtf8(alphabet[b], 0, &cp), 0u);
    EXPECT_EQ(ByteLevelCharToByte(cp), b);
  }
  EXPECT_EQ(ByteLevelCharToByte(U' '), -1);
  EXPECT_EQ(ByteLevelCharToByte(U'\u65E5'), -1);
}

TEST(Nfc, ComposesReordersAndKeepsExclusions) {
  EXPECT_EQ(NfcNormalize("plain ascii stays"), "plain ascii stays");
  EXPECT_EQ(NfcNormalize("e\u0301"), "\u00E9");
  EXPECT_EQ(NfcNormalize("cafe\u0301 nai\u0308ve"), "caf\u00E9 na\u00EFve");
  EXPECT_EQ(NfcNormalize("a\u0301\u0323"), "\u1EA1\u0301");  // dot below sorts first
  EXPECT_EQ(NfcNormalize("\u212B"), "\u00C5");               // singleton: Angstrom sign
  EXPECT_EQ(NfcNormalize("\u0344"), "\u0308\u0301");         // excluded from composition
  EXPECT_EQ(NfcNormalize("\u1100\u1161\u11A8"), "\uAC01");   // Hangul L V T
  EXPECT_EQ(NfcNormalize("\uAC00\u11A8"), "\uAC01");         // Hangul LV + T
  EXPECT_EQ(NfcNormalize("\u00E9\u65E5\u672C"), "\u00E9\u65E5\u672C");
  EXPECT_EQ(NfcNormalize("\u0301e"), "\u0301e");  // nothing to attach to
  // Ill-formed bytes pass through and break composition around them.
  EXPECT_EQ(NfcNormalize("e\xFF\u0301"), "e\xFF\u0301");
}

TEST(Whitespace, Classes) {
  EXPECT_TRUE(IsUnicodeWhitespace(U' '));
  EXPECT_TRUE(IsUnicodeWhitespace(U'\u3000'));
  EXPECT_FALSE(IsUnicodeWhitespace(U'\x1F'));
  EXPECT_TRUE(IsPythonSpace(U'\x1F'));
  EXPECT_FALSE(IsPythonSpace(U'a'));
  EXPECT_FALSE(IsPythonSpace(U'\u200B'));  // zero width space is not whitespace
}

}  // namespace
}  // namespace duet::backend::unicode
