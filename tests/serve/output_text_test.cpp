// Stop strings matched on decoded text across token and piece boundaries: the match and what
// follows are dropped, a possible start of a stop string is held back until it cannot be one,
// and the released pieces always concatenate to the text a client should see.
#include "backend/serve/output_text.h"

#include <gtest/gtest.h>

#include "backend/tokenizer/test_tokenizer.h"

namespace duet::backend::serve {
namespace {

// Feeds `pieces` and returns everything released, Flush included.
std::string Feed(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.Push(p);
  return out + m.Flush();
}

TEST(StopStringMatcher, NoStopsReleasesEverythingAtOnce) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("Hello"), "Hello");
  EXPECT_EQ(m.Push(" world"), " world");
  EXPECT_FALSE(m.matched());
}

TEST(StopStringMatcher, MatchAcrossPiecesDropsTheStopAndTheRest) {
  StopStringMatcher m({"o w"});
  EXPECT_EQ(m.Push("Hel"), "Hel");
  EXPECT_EQ(m.Push("lo"), "l");  // "o" could start "o w"
  EXPECT_EQ(m.held_bytes(), 1u);
  EXPECT_EQ(m.Push(" "), "");  // "o " still could
  EXPECT_EQ(m.Push("world"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcher, HeldTextIsReleasedWhenItStopsLookingLikeAStop) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ST"), "");
  EXPECT_EQ(m.Push("OR"), "STOR");
  EXPECT_EQ(m.Push("ST"), "");
  EXPECT_EQ(m.Flush(), "ST");  // the stream ended without the rest of the stop string
  EXPECT_FALSE(m.matched());
}

TEST(StopStringMatcher, EarliestMatchAmongSeveralStops) {
  StopStringMatcher m({"world", "lo"});
  EXPECT_EQ(Feed(m, {"Hello world"}), "Hel");
  StopStringMatcher n({"cd", "bcde"});
  EXPECT_EQ(Feed(n, {"ab", "c", "def"}), "a");  // "bcde" starts earlier than "cd"
}

TEST(StopStringMatcher, OverlappingPrefixesHoldTheLongestCandidate) {
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.Push("xaa"), "x");
  EXPECT_EQ(m.Push("a"), "a");  // "aaa": only the last "aa" can still start "aab"
  EXPECT_EQ(m.Push("b!"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcher, MultiByteStopStringsCutOnCharacterBoundaries) {
  StopStringMatcher m({"é!"});
  EXPECT_EQ(m.Push("café"), "caf");  // "é" (two bytes) may start "é!"
  EXPECT_EQ(m.Push("s"), "és");
  EXPECT_EQ(Feed(m, {"é", "!x"}), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcher, StopAtTheVeryStart) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(Feed(m, {"\n", "\nafter"}), "");
  EXPECT_TRUE(m.matched());
}

class OutputTextTest : public ::testing::Test {
 protected:
  OutputTextTest() : tokenizer_(Tokenizer::FromJson(MakeTestTokenizerJson(512), "test").value()) {}
  Tokenizer tokenizer_;
};

TEST_F(OutputTextTest, WithoutStopsThePiecesConcatenateToTheDecodedText) {
  const std::string text = "The quick brown fox — ünïcödé → 🦊 jumps.";
  const auto ids = tokenizer_.Encode(text);
  OutputText out(tokenizer_, {}, true);
  std::string joined;
  for (auto id : ids) joined += out.Push(id);
  joined += out.Finish();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(out.counted_tokens(), static_cast<std::int64_t>(ids.size()));
  EXPECT_FALSE(out.stopped());
}

TEST_F(OutputTextTest, StopStringSpanningTokensEndsTheTextAndCountsUpToTheMatch) {
  const std::string text = "Once upon a time there was a fox. The end.";
  const auto ids = tokenizer_.Encode(text);
  OutputText out(tokenizer_, {"was a f"}, true);
  std::string joined;
  std::size_t pushed = 0;
  for (auto id : ids) {
    joined += out.Push(id);
    ++pushed;
    if (out.stopped()) break;
  }
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(joined + out.Finish(), "Once upon a time there ");
  // The token that completed the stop string is the last one counted.
  auto decoded = [&](std::size_t n) {
    return tokenizer_.Decode(std::span<const std::int32_t>(ids.data(), n));
  };
  EXPECT_NE(decoded(pushed).find("was a f"), std::string::npos);
  EXPECT_EQ(decoded(pushed - 1).find("was a f"), std::string::npos);
  EXPECT_EQ(out.counted_tokens(), static_cast<std::int64_t>(pushed));
  EXPECT_EQ(out.Push(ids.back()), "");  // later tokens are ignored and not counted
  EXPECT_EQ(out.counted_tokens(), static_cast<std::int64_t>(pushed));
}

TEST_F(OutputTextTest, SpecialTokensAreSkippedOrKept) {
  const auto eot = tokenizer_.TokenToId("<|eot_id|>");
  ASSERT_TRUE(eot);
  std::vector<std::int32_t> ids = tokenizer_.Encode("Hi");
  ids.push_back(*eot);
  OutputText skip(tokenizer_, {}, true), keep(tokenizer_, {}, false);
  std::string a, b;
  for (auto id : ids) {
    a += skip.Push(id);
    b += keep.Push(id);
  }
  EXPECT_EQ(a + skip.Finish(), "Hi");
  EXPECT_EQ(b + keep.Finish(), "Hi<|eot_id|>");
}

}  // namespace
}  // namespace duet::backend::serve
