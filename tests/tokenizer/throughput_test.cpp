// Encode and decode throughput on ~1 MB of English-like text with the test tokenizer. Prints
// MB/s; the bound is loose (shared CI machines, Debug builds) and only guards against
// pathological slowdowns such as quadratic merging or a cache that never hits.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"

namespace duet::backend {
namespace {

std::string EnglishText(std::size_t bytes) {
  static const char* kSentences[] = {
      "The scheduler moves long prompts to the prefill instances while decode keeps going. ",
      "Time to first token was 182 ms at the 99th percentile, down from 240 ms last week. ",
      "She said it's fine, but they'll check again tomorrow morning before 9:30.\n",
      "Each request carries a prompt of 1,024 tokens and asks for up to 256 more. ",
      "def step(batch):\n    return model.forward(batch.tokens, cache=batch.kv)\n",
      "Caf\u00e9 owners in Z\u00fcrich and \u6771\u4eac reported 12% more visitors in 2024. ",
      "Questions? Answers! (Parentheses) [brackets] {braces} -- and \"quotes\".\n\n",
  };
  std::string text;
  std::size_t i = 0;
  while (text.size() < bytes) {
    text += kSentences[i % std::size(kSentences)];
    // Varying numbers keep some pre-tokens out of the word cache.
    text += std::to_string(i * 7919 % 100000) + " ";
    ++i;
  }
  return text;
}

TEST(TokenizerThroughput, EncodesAMegabyteQuickly) {
  Result<Tokenizer> tokenizer = Tokenizer::FromJson(MakeTestTokenizerJson(2048), "test");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  const std::string text = EnglishText(1 << 20);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::int32_t> ids = tokenizer->Encode(text);
  const auto encoded = std::chrono::steady_clock::now();
  const std::string decoded = tokenizer->Decode(ids);
  const auto end = std::chrono::steady_clock::now();
  const double encode_s = std::chrono::duration<double>(encoded - start).count();
  const double decode_s = std::chrono::duration<double>(end - encoded).count();
  const double megabytes = static_cast<double>(text.size()) / (1 << 20);
  std::printf("encode: %.2f MB in %.3f s (%.1f MB/s, %zu tokens); decode: %.3f s\n", megabytes,
              encode_s, megabytes / encode_s, ids.size(), decode_s);
  EXPECT_EQ(decoded, text);
  EXPECT_LT(encode_s, 20.0);
}

}  // namespace
}  // namespace duet::backend
