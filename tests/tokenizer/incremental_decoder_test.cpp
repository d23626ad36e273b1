// Streaming detokenization: every piece IncrementalDecoder returns is valid UTF-8, nothing is
// emitted before a character is complete, and the pieces add up to Decode of all ids.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "backend/tokenizer/tokenizer.h"
#include "backend/tokenizer/unicode_util.h"
#include "tests/tokenizer/tokenizer_test_util.h"

namespace duet::backend {
namespace {

using Ids = std::vector<std::int32_t>;

const Tokenizer& TestTokenizer() {
  static const Tokenizer tokenizer = [] {
    Result<Tokenizer> t = Tokenizer::Load(testing::FixturePath("test_tokenizer.json"));
    DUET_CHECK_MSG(t.ok(), t.error());
    return *t;
  }();
  return tokenizer;
}

// The id of the single-byte token for `byte` in a byte-level vocabulary.
std::int32_t ByteToken(const Tokenizer& tokenizer, unsigned char byte) {
  return *tokenizer.TokenToId(unicode::ByteLevelAlphabet()[byte]);
}

// Streams `ids`, checking each piece, and returns the concatenation.
std::string Stream(const Tokenizer& tokenizer, const Ids& ids, bool skip_special) {
  IncrementalDecoder decoder(tokenizer, skip_special);
  std::string all;
  for (std::int32_t id : ids) {
    const std::string piece = decoder.Push(id);
    EXPECT_TRUE(unicode::IsValidUtf8(piece)) << "after id " << id;
    EXPECT_LE(decoder.pending_bytes(), 3u);
    all += piece;
  }
  const std::string tail = decoder.Flush();
  EXPECT_TRUE(unicode::IsValidUtf8(tail));
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  return all + tail;
}

TEST(IncrementalDecoder, EmojiSplitAcrossByteTokens) {
  const Tokenizer& tokenizer = TestTokenizer();
  IncrementalDecoder decoder(tokenizer);
  const std::string emoji = "\U0001F642";  // F0 9F 99 82
  for (std::size_t i = 0; i + 1 < emoji.size(); ++i) {
    EXPECT_EQ(decoder.Push(ByteToken(tokenizer, static_cast<unsigned char>(emoji[i]))), "");
    EXPECT_EQ(decoder.pending_bytes(), i + 1);
  }
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, static_cast<unsigned char>(emoji.back()))), emoji);
  EXPECT_EQ(decoder.Push(*tokenizer.TokenToId("a")), "a");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoder, BrokenSequencesBecomeReplacementCharacters) {
  const Tokenizer& tokenizer = TestTokenizer();
  IncrementalDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 0xF0)), "");
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 0x9F)), "");
  // 'A' cannot continue the sequence: the held bytes become one U+FFFD.
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 'A')), "\uFFFDA");
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 0x80)), "\uFFFD");  // stray continuation byte
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 0xE2)), "");
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 0x82)), "");
  EXPECT_EQ(decoder.Flush(), "\uFFFD");                     // unfinished at the end
  EXPECT_EQ(decoder.Push(ByteToken(tokenizer, 'b')), "b");  // usable after Flush
  EXPECT_EQ(decoder.Push(-1), "\uFFFD");                    // an id that names no token
}

TEST(IncrementalDecoder, SkipsSpecialTokensWhenAsked) {
  const Tokenizer& tokenizer = TestTokenizer();
  const Ids ids = tokenizer.Encode("hi<|eot_id|>", true);
  EXPECT_EQ(Stream(tokenizer, ids, true), "hi");
  EXPECT_EQ(Stream(tokenizer, ids, false), "<|begin_of_text|>hi<|eot_id|>");
}

TEST(IncrementalDecoder, FixtureStringsStreamToTheFullDecode) {
  const std::string text = testing::ReadFile(testing::FixturePath("encodings.json"));
  ASSERT_FALSE(text.empty());
  const nlohmann::json doc = nlohmann::json::parse(text);
  const Tokenizer& tokenizer = TestTokenizer();
  for (const auto& c : doc["cases"]) {
    if (c["tokenizer"] != "llama3_style") continue;
    const Ids ids = c["ids"].get<Ids>();
    EXPECT_EQ(Stream(tokenizer, ids, false), tokenizer.Decode(ids, false)) << c["text"];
    EXPECT_EQ(Stream(tokenizer, ids, true), tokenizer.Decode(ids, true)) << c["text"];
  }
  // Multi-byte text that the small vocabulary splits into byte tokens mid-character.
  const std::string unicode_text = "日本語 🙂🙃 café naïve 👨‍👩‍👧 ok";
  const Ids ids = tokenizer.Encode(unicode_text);
  EXPECT_GT(ids.size(), 20u);
  EXPECT_EQ(Stream(tokenizer, ids, false), unicode_text);
}

TEST(IncrementalDecoder, RandomIdsStayValidUtf8) {
  const Tokenizer& tokenizer = TestTokenizer();
  std::mt19937 rng(1234);
  for (int round = 0; round < 300; ++round) {
    Ids ids(rng() % 40);
    for (std::int32_t& id : ids) {
      // Mostly byte tokens (to split characters), some merged and special, a few invalid.
      const unsigned kind = rng() % 10;
      if (kind < 6) {
        id = ByteToken(tokenizer, static_cast<unsigned char>(0x80 + rng() % 0x80));
      } else if (kind < 9) {
        id = static_cast<std::int32_t>(rng() % tokenizer.vocab_size());
      } else {
        id = static_cast<std::int32_t>(rng() % 3) - 1 + (rng() % 2) * tokenizer.vocab_size();
      }
    }
    for (bool skip : {false, true}) {
      EXPECT_EQ(Stream(tokenizer, ids, skip), tokenizer.Decode(ids, skip));
    }
  }
}

TEST(IncrementalDecoder, OutlivesItsTokenizer) {
  std::optional<IncrementalDecoder> decoder;
  {
    Result<Tokenizer> tokenizer = Tokenizer::Load(testing::FixturePath("test_tokenizer.json"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
    decoder.emplace(*tokenizer);
  }
  EXPECT_EQ(decoder->Push(ByteToken(TestTokenizer(), 'x')), "x");
}

}  // namespace
}  // namespace duet::backend
