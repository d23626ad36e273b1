// From validated parameters to the LiveRequest the frontend gets: the prompt tokenized as
// `duet generate` does it (text with BOS, chat through the template), stop ids from the model,
// the chat template and the client, max_tokens defaulted to what fits; and every refusal that
// needs the model (unknown model 404, prompt or max_tokens beyond the context, ids outside the
// vocabulary, chat without a template) plus the admission errors (429 with Retry-After, 503).
#include "backend/serve/api.h"

#include <gtest/gtest.h>

#include "backend/tokenizer/test_tokenizer.h"

namespace duet::backend::serve {
namespace {

using nlohmann::json;

class ApiTest : public ::testing::Test {
 protected:
  ApiTest() : model_("tiny", Tokenizer::FromJson(MakeTestTokenizerJson(512), "test").value()) {
    model_.chat_format = DetectChatFormat(model_.tokenizer).value();
    model_.chat_stop_token_ids = StopTokenIds(*model_.chat_format, model_.tokenizer);
    eos_ = *model_.tokenizer.TokenToId("<|end_of_text|>");
    model_.eos_token_ids = {eos_};
    model_.vocab_size = model_.tokenizer.vocab_size();
    model_.max_request_tokens = 64;
  }

  GenerationParams Params(Endpoint endpoint, const json& body) {
    GenerationParams p;
    auto e = ParseGenerationRequest(endpoint, body, &p);
    EXPECT_FALSE(e) << e->message;
    return p;
  }
  std::optional<ApiError> Build(const json& body, LiveRequest* out,
                                Endpoint endpoint = Endpoint::kCompletions) {
    return BuildLiveRequest(Params(endpoint, body), model_, out);
  }

  ServedModel model_;
  std::int32_t eos_ = 0;
};

TEST_F(ApiTest, TextPromptIsEncodedWithBosAndMaxTokensDefaultsToWhatFits) {
  LiveRequest r;
  ASSERT_FALSE(Build({{"prompt", "Hello there"}, {"temperature", 0}, {"seed", 4}}, &r));
  EXPECT_EQ(r.prompt, model_.tokenizer.Encode("Hello there", /*add_bos=*/true));
  EXPECT_EQ(r.max_tokens, 64 - static_cast<Tokens>(r.prompt.size()));
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.seed, 4u);
  EXPECT_EQ(r.sampling.stop_token_ids, std::vector<std::int32_t>{eos_});
}

TEST_F(ApiTest, ChatPromptGoesThroughTheTemplateWithItsStopTokens) {
  LiveRequest r;
  ASSERT_FALSE(Build({{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}}, &r,
                     Endpoint::kChatCompletions));
  const std::string text = ApplyChatTemplate(*model_.chat_format, {{"user", "Hi"}}, true);
  EXPECT_EQ(r.prompt, model_.tokenizer.Encode(text, /*add_bos=*/false));
  EXPECT_EQ(r.max_tokens, 3);
  const auto eot = *model_.tokenizer.TokenToId("<|eot_id|>");
  for (std::int32_t id : {eos_, eot})
    EXPECT_NE(std::find(r.sampling.stop_token_ids.begin(), r.sampling.stop_token_ids.end(), id),
              r.sampling.stop_token_ids.end());
}

TEST_F(ApiTest, IgnoreEosKeepsOnlyTheClientsStopIdsAndStopStringsPassThrough) {
  LiveRequest r;
  ASSERT_FALSE(Build({{"prompt", {1, 2}},
                      {"ignore_eos", true},
                      {"stop_token_ids", {7, 7, 3}},
                      {"stop", {"x", "yz"}}},
                     &r));
  EXPECT_EQ(r.prompt, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<std::int32_t>{3, 7}));
  EXPECT_EQ(r.sampling.stop_strings, (std::vector<std::string>{"x", "yz"}));
}

TEST_F(ApiTest, RefusalsThatNeedTheModel) {
  LiveRequest r;
  auto e = Build({{"model", "other"}, {"prompt", "x"}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 404);
  EXPECT_EQ(e->param, "model");
  EXPECT_EQ(e->code, "model_not_found");

  e = Build({{"prompt", std::vector<int>(64, 5)}}, &r);  // no room for one token
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_NE(e->message.find("64 tokens"), std::string::npos) << e->message;

  e = Build({{"prompt", std::vector<int>(60, 5)}, {"max_tokens", 5}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("65 tokens"), std::string::npos) << e->message;
  EXPECT_FALSE(Build({{"prompt", std::vector<int>(60, 5)}, {"max_tokens", 4}}, &r));

  e = Build({{"prompt", {1, model_.vocab_size}}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("prompt[1]"), std::string::npos) << e->message;

  e = Build({{"prompt", "x"}, {"stop_token_ids", {model_.vocab_size + 3}}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "stop_token_ids");

  model_.chat_format.reset();
  model_.chat_format_error = "no template";
  e = Build({{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, &r,
            Endpoint::kChatCompletions);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_NE(e->message.find("no template"), std::string::npos);
}

TEST_F(ApiTest, AdmissionErrors) {
  ApiError e = AdmissionError({AdmitStatus::kQueueFull, 0, "1024 in flight"});
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.retry_after_s, 1);
  EXPECT_NE(e.message.find("1024 in flight"), std::string::npos);
  EXPECT_EQ(AdmissionError({AdmitStatus::kDraining, 0, ""}).http_status, 503);
  e = AdmissionError({AdmitStatus::kTooLong, 0, "too long"});
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(AdmissionError({AdmitStatus::kInvalid, 0, "bad"}).http_status, 400);
}

TEST_F(ApiTest, ModelsListsTheServedModelWithItsContext) {
  const json models = json::parse(ModelsJson(model_));
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 64);
}

}  // namespace
}  // namespace duet::backend::serve

namespace duet::backend::serve {
namespace {

// Log lines (issue 40, finding 12): what a client sent cannot forge a line, reach a terminal as
// a control sequence, or make a line long.
TEST(EscapeForLogTest, ControlCharactersBackslashesAndInvalidUtf8AreEscaped) {
  EXPECT_EQ(EscapeForLog("plain `text` é €"), "plain `text` é €");
  EXPECT_EQ(EscapeForLog("a\nduet serve: 200\r\t\\"), "a\\nduet serve: 200\\r\\t\\\\");
  EXPECT_EQ(EscapeForLog(std::string("\x1b[31m\x07\x7f\0", 8)), "\\x1b[31m\\x07\\x7f\\x00");
  EXPECT_EQ(EscapeForLog("\xc2\x9b"
                         "2J"),
            "\\u009b2J");  // C1 CSI
  EXPECT_EQ(EscapeForLog("\xff\xc0\xaf\xed\xa0\x80\xe2\x82"),
            "\\xff\\xc0\\xaf\\xed\\xa0\\x80\\xe2\\x82");
  EXPECT_EQ(EscapeForLog("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");  // a 4-byte character stays
}

TEST(EscapeForLogTest, LongValuesAreCutWithTheirLength) {
  EXPECT_EQ(EscapeForLog(std::string(10, 'x'), 10), std::string(10, 'x'));
  EXPECT_EQ(EscapeForLog(std::string(4 << 20, 'm'), 200),
            std::string(200, 'm') + "...(4194304 bytes)");
}

}  // namespace
}  // namespace duet::backend::serve
