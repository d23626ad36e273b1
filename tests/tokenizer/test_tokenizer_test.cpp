// MakeTestTokenizerJson: deterministic, exactly the requested vocabulary size (also beyond
// what the corpus supports), the Llama-3 layout of added tokens, and loadable by Duet.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/tokenizer/chat_template.h"
#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"

namespace duet::backend {
namespace {

TEST(TestTokenizer, Deterministic) {
  EXPECT_EQ(MakeTestTokenizerJson(300), MakeTestTokenizerJson(300));
  EXPECT_NE(MakeTestTokenizerJson(300), MakeTestTokenizerJson(301));
}

TEST(TestTokenizer, HasRequestedSizeAndLlama3Layout) {
  for (int vocab_size : {256, 257, 512, 1000, 3000}) {
    SCOPED_TRACE(vocab_size);
    const std::string json = MakeTestTokenizerJson(vocab_size);
    const nlohmann::json doc = nlohmann::json::parse(json);
    EXPECT_EQ(doc["model"]["vocab"].size(), static_cast<std::size_t>(vocab_size));
    EXPECT_GE(doc["model"]["merges"].size(), static_cast<std::size_t>(vocab_size - 256));
    EXPECT_EQ(doc["model"]["ignore_merges"], true);
    ASSERT_EQ(doc["added_tokens"].size(), 7u);
    EXPECT_EQ(doc["added_tokens"][0]["content"], "<|begin_of_text|>");
    EXPECT_EQ(doc["added_tokens"][0]["id"], vocab_size);
    EXPECT_EQ(doc["added_tokens"][6]["content"], "<|im_end|>");
    EXPECT_EQ(doc["added_tokens"][6]["id"], vocab_size + 6);

    Result<Tokenizer> tokenizer = Tokenizer::FromJson(json, "test");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
    EXPECT_EQ(tokenizer->vocab_size(), vocab_size + 7);
    EXPECT_EQ(tokenizer->bos_token_id(), vocab_size);
    EXPECT_EQ(tokenizer->TokenToId("<|eot_id|>"), vocab_size + 4);
    const std::string text = "The quick brown fox, 12345 caf\u00e9 \U0001F642!";
    const std::vector<std::int32_t> ids = tokenizer->Encode(text, true);
    EXPECT_EQ(ids.front(), vocab_size);
    EXPECT_EQ(tokenizer->Decode(ids, true), text);
    for (std::int32_t id : ids) EXPECT_LT(id, tokenizer->vocab_size());
  }
}

TEST(TestTokenizer, LargerVocabulariesCompressMore) {
  Result<Tokenizer> small = Tokenizer::FromJson(MakeTestTokenizerJson(256), "small");
  Result<Tokenizer> large = Tokenizer::FromJson(MakeTestTokenizerJson(1000), "large");
  ASSERT_TRUE(small.ok() && large.ok());
  const std::string text = "The scheduler decides where each request goes and when.";
  EXPECT_EQ(small->Encode(text).size(), text.size());  // bytes only
  EXPECT_LT(large->Encode(text).size(), text.size() / 2);
}

}  // namespace
}  // namespace duet::backend
