// Chat templates: the exact strings of the official Llama-3 and ChatML Jinja templates
// (expected values rendered with jinja2 from those templates), format detection, stop ids.
#include <gtest/gtest.h>

#include "backend/tokenizer/chat_template.h"
#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"

namespace duet::backend {
namespace {

// User content with surrounding whitespace (an ideographic space, a unit separator) that the
// Llama-3 template trims and ChatML keeps.
const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant."},
    {"user", "\u3000 Hello!\x1f  \n"},
    {"assistant", "Hi there. \U0001F642"},
};

TEST(ChatTemplate, Llama3MatchesOfficialTemplate) {
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
      "assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_"
      "header_id|>assistant<|end_header_id|>\n\nHi there. \U0001F642<|eot_id|>";
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, kConversation, false), expected);
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, kConversation, true),
            expected + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No messages: no BOS (the template adds it to the first message only).
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, {}, true),
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ChatMlMatchesOfficialTemplate) {
  const std::string expected =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\u3000 "
      "Hello!\x1f  \n<|im_end|>\n<|im_start|>assistant\nHi there. \U0001F642<|im_end|>\n";
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kChatMl, kConversation, false), expected);
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kChatMl, kConversation, true),
            expected + "<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kChatMl, {}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3TrimKeepsInnerWhitespaceAndBadBytes) {
  const std::vector<ChatMessage> messages = {{"user", " \t a  b \xff \n"}};
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, messages, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na  b \xff<|eot_id|>");
  const std::vector<ChatMessage> blank = {{"user", " \n\t "}};
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, blank, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

TEST(ChatTemplate, TemplatedTextEncodesWithSpecialTokens) {
  Result<Tokenizer> tokenizer = Tokenizer::FromJson(MakeTestTokenizerJson(512), "test");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  const std::vector<std::int32_t> ids =
      tokenizer->Encode(ApplyChatTemplate(ChatFormat::kLlama3, kConversation, true));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), *tokenizer->bos_token_id());
  EXPECT_EQ(ids[1], *tokenizer->TokenToId("<|start_header_id|>"));
  EXPECT_EQ(tokenizer->Decode(ids), ApplyChatTemplate(ChatFormat::kLlama3, kConversation, true));
}

TEST(ChatTemplate, DetectsFormatFromTokens) {
  Result<Tokenizer> test = Tokenizer::FromJson(MakeTestTokenizerJson(256), "test");
  ASSERT_TRUE(test.ok()) << test.error();
  Result<ChatFormat> format = DetectChatFormat(*test);
  ASSERT_TRUE(format.ok()) << format.error();
  EXPECT_EQ(*format, ChatFormat::kLlama3);  // has both sets; Llama-3 wins

  const std::string chatml_json = R"({
    "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [{"id": 1, "content": "<|im_start|>", "special": true},
                     {"id": 2, "content": "<|im_end|>", "special": true},
                     {"id": 3, "content": "<|endoftext|>", "special": true}]})";
  Result<Tokenizer> chatml = Tokenizer::FromJson(chatml_json, "chatml.json");
  ASSERT_TRUE(chatml.ok()) << chatml.error();
  format = DetectChatFormat(*chatml);
  ASSERT_TRUE(format.ok()) << format.error();
  EXPECT_EQ(*format, ChatFormat::kChatMl);
  EXPECT_EQ(StopTokenIds(ChatFormat::kChatMl, *chatml), (std::vector<std::int32_t>{2, 3}));

  Result<Tokenizer> plain = Tokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "ByteLevel"}})",
      "plain.json");
  ASSERT_TRUE(plain.ok()) << plain.error();
  format = DetectChatFormat(*plain);
  ASSERT_FALSE(format.ok());
  EXPECT_NE(format.error().find("plain.json"), std::string::npos) << format.error();
}

TEST(ChatTemplate, DetectsFormatFromTemplateText) {
  EXPECT_EQ(*DetectChatFormatFromTemplate(
                "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}..."),
            ChatFormat::kLlama3);
  EXPECT_EQ(*DetectChatFormatFromTemplate("{{'<|im_start|>' + message['role'] + '\\n'}}"),
            ChatFormat::kChatMl);
  EXPECT_FALSE(DetectChatFormatFromTemplate("[INST] {{ content }} [/INST]").ok());
}

TEST(ChatTemplate, StopTokens) {
  Result<Tokenizer> test = Tokenizer::FromJson(MakeTestTokenizerJson(512), "test");
  ASSERT_TRUE(test.ok()) << test.error();
  // <|eom_id|> (Llama-3.1) is not in the test tokenizer, so it is left out.
  EXPECT_EQ(StopTokenIds(ChatFormat::kLlama3, *test),
            (std::vector<std::int32_t>{*test->TokenToId("<|eot_id|>"),
                                       *test->TokenToId("<|end_of_text|>")}));
  EXPECT_EQ(StopTokenIds(ChatFormat::kChatMl, *test),
            (std::vector<std::int32_t>{*test->TokenToId("<|im_end|>")}));
  EXPECT_EQ(StopTokens(ChatFormat::kChatMl).front(), "<|im_end|>");
  EXPECT_STREQ(ChatFormatName(ChatFormat::kLlama3), "llama3");
}

}  // namespace
}  // namespace duet::backend
