// Request parsing and validation of the OpenAI endpoints: every accepted form of a field, the
// defaults OpenAI documents, and each refusal (400 naming the field) for malformed JSON, wrong
// types, out-of-range values, unknown and unsupported fields.
#include "backend/serve/openai_protocol.h"

#include <gtest/gtest.h>

namespace duet::backend::serve {
namespace {

using nlohmann::json;

GenerationParams ParseOk(Endpoint endpoint, const json& body) {
  GenerationParams params;
  auto error = ParseGenerationRequest(endpoint, body, &params);
  EXPECT_FALSE(error) << body.dump() << " -> " << (error ? error->message : "");
  return params;
}

ApiError ParseError(Endpoint endpoint, const json& body) {
  GenerationParams params;
  auto error = ParseGenerationRequest(endpoint, body, &params);
  EXPECT_TRUE(error) << body.dump() << " was accepted";
  ApiError accepted;
  accepted.http_status = 0;
  return error.value_or(accepted);
}

json Completion(json extra = json::object()) {
  json body = {{"model", "m"}, {"prompt", "Hello"}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

json Chat(json extra = json::object()) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

TEST(OpenAiProtocol, CompletionDefaultsFollowOpenAi) {
  const GenerationParams p = ParseOk(Endpoint::kCompletions, Completion());
  EXPECT_EQ(p.model, "m");
  ASSERT_TRUE(p.prompt_text);
  EXPECT_EQ(*p.prompt_text, "Hello");
  EXPECT_FALSE(p.max_tokens);  // what fits, decided with the model
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FALSE(p.seed);
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.stream_given);
  EXPECT_TRUE(p.skip_special_tokens);
  EXPECT_FALSE(p.ignore_eos);
}

TEST(OpenAiProtocol, PromptForms) {
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, Completion({{"prompt", {1, 2, 3}}})).prompt_ids,
            (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(*ParseOk(Endpoint::kCompletions, Completion({{"prompt", {"one"}}})).prompt_text, "one");
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, Completion({{"prompt", {{4, 5}}}})).prompt_ids,
            (std::vector<std::int32_t>{4, 5}));
  EXPECT_EQ(*ParseOk(Endpoint::kCompletions, Completion({{"prompt", ""}})).prompt_text, "");
}

TEST(OpenAiProtocol, SamplingAndStopFields) {
  const GenerationParams p =
      ParseOk(Endpoint::kCompletions, Completion({{"temperature", 0},
                                                  {"top_p", 0.5},
                                                  {"top_k", -1},
                                                  {"seed", -3},
                                                  {"max_tokens", 7},
                                                  {"stop", {"a", "bc"}},
                                                  {"stop_token_ids", {9}},
                                                  {"ignore_eos", true},
                                                  {"return_token_ids", true},
                                                  {"skip_special_tokens", false},
                                                  {"stream", true},
                                                  {"stream_options", {{"include_usage", true}}},
                                                  {"user", "x"},
                                                  {"n", 1},
                                                  {"best_of", 1},
                                                  {"echo", false},
                                                  {"logprobs", nullptr},
                                                  {"frequency_penalty", 0},
                                                  {"presence_penalty", 0.0},
                                                  {"logit_bias", json::object()},
                                                  {"suffix", nullptr},
                                                  {"metadata", {{"k", "v"}}}}));
  EXPECT_FLOAT_EQ(p.temperature, 0.0f);
  EXPECT_FLOAT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.seed, static_cast<std::uint64_t>(-3));
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<std::int32_t>{9}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_TRUE(p.return_token_ids);
  EXPECT_FALSE(p.skip_special_tokens);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.stream_options_given);
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, Completion({{"stop", "x"}})).stop,
            (std::vector<std::string>{"x"}));
  EXPECT_TRUE(ParseOk(Endpoint::kCompletions, Completion({{"stop", nullptr}})).stop.empty());
}

TEST(OpenAiProtocol, ChatMessagesAndTokenLimits) {
  const GenerationParams p = ParseOk(
      Endpoint::kChatCompletions,
      Chat({{"messages",
             {{{"role", "developer"}, {"content", "Be brief."}},
              {{"role", "user"},
               {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}},
               {"name", "bob"}},
              {{"role", "assistant"}, {"content", "ok"}, {"tool_calls", nullptr}}}},
            {"max_tokens", 5},
            {"max_completion_tokens", 9},
            {"tools", json::array()},
            {"tool_choice", "none"},
            {"response_format", {{"type", "text"}}},
            {"logprobs", false},
            {"parallel_tool_calls", true},
            {"store", false},
            {"reasoning_effort", "low"}}));
  ASSERT_EQ(p.messages.size(), 3u);
  EXPECT_EQ(p.messages[0].role, "system");  // developer is the system role
  EXPECT_EQ(p.messages[1].content, "a\nb");
  EXPECT_EQ(p.messages[2].role, "assistant");
  EXPECT_EQ(p.max_tokens, 9);  // max_completion_tokens wins over the deprecated max_tokens
  EXPECT_EQ(ParseOk(Endpoint::kChatCompletions, Chat({{"max_tokens", 5}})).max_tokens, 5);
}

struct BadCase {
  Endpoint endpoint;
  json body;
  std::string param;  // the field the error names
  std::string words;  // in the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.body.dump(); }

class OpenAiProtocolBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(OpenAiProtocolBad, RefusedWith400NamingTheField) {
  const BadCase& c = GetParam();
  const ApiError e = ParseError(c.endpoint, c.body);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, c.param) << e.message;
  EXPECT_NE(e.message.find(c.words), std::string::npos) << e.message;
  const json body = json::parse(ErrorBody(e));
  EXPECT_EQ(body["error"]["message"], e.message);
  EXPECT_EQ(body["error"]["param"], c.param.empty() ? json() : json(c.param));
}

const Endpoint kC = Endpoint::kCompletions;
const Endpoint kChat = Endpoint::kChatCompletions;

INSTANTIATE_TEST_SUITE_P(
    Cases, OpenAiProtocolBad,
    ::testing::Values(
        BadCase{kC, json::array({1}), "", "JSON object"},
        BadCase{kC, {{"model", "m"}}, "prompt", "required"},
        BadCase{kChat, {{"model", "m"}}, "messages", "required"},
        BadCase{kC, Completion({{"frobnicate", 1}}), "frobnicate", "Unrecognized"},
        BadCase{kChat, Chat({{"prompt", "x"}}), "prompt", "Unrecognized"},
        BadCase{kC, Completion({{"messages", json::array()}}), "messages", "Unrecognized"},
        BadCase{kC, Completion({{"model", 3}}), "model", "must be a string"},
        BadCase{kC, Completion({{"prompt", 3}}), "prompt", "must be a string"},
        BadCase{kC, Completion({{"prompt", json::array()}}), "prompt", "empty"},
        BadCase{kC, Completion({{"prompt", {"a", "b"}}}), "prompt", "2 prompts"},
        BadCase{kC, Completion({{"prompt", {{1}, {2}}}}), "prompt", "2 prompts"},
        BadCase{kC, Completion({{"prompt", {1, "a"}}}), "prompt[1]", "integer"},
        BadCase{kC, Completion({{"prompt", {1, -2}}}), "prompt[1]", "[0,"},
        BadCase{kC, Completion({{"prompt", {true}}}), "prompt[0]", "a string or an array"},
        BadCase{kC, Completion({{"max_tokens", 0}}), "max_tokens", "[1,"},
        BadCase{kC, Completion({{"max_tokens", 2.5}}), "max_tokens", "integer"},
        BadCase{kC, Completion({{"max_tokens", "9"}}), "max_tokens", "not a string"},
        BadCase{kChat, Chat({{"max_completion_tokens", -1}}), "max_completion_tokens", "[1,"},
        BadCase{kC, Completion({{"temperature", "hot"}}), "temperature", "number"},
        BadCase{kC, Completion({{"temperature", 2.5}}), "temperature", "[0, 2]"},
        BadCase{kC, Completion({{"top_p", 0}}), "top_p", "(0, 1]"},
        BadCase{kC, Completion({{"top_p", 1.5}}), "top_p", "(0, 1]"},
        BadCase{kC, Completion({{"top_k", -2}}), "top_k", "[-1,"},
        BadCase{kC, Completion({{"seed", 1.5}}), "seed", "integer"},
        BadCase{kC, Completion({{"seed", 18446744073709551615ull}}), "seed", "out of range"},
        BadCase{kC, Completion({{"stop", 5}}), "stop", "a string or an array"},
        BadCase{kC, Completion({{"stop", ""}}), "stop", "empty stop string"},
        BadCase{kC, Completion({{"stop", {"a", 1}}}), "stop[1]", "a string"},
        BadCase{kC,
                Completion({{"stop", json::array({"1", "2", "3", "4", "5", "6", "7", "8", "9", "10",
                                                  "11", "12", "13", "14", "15", "16", "17"})}}),
                "stop", "at most 16"},
        BadCase{kC, Completion({{"stop_token_ids", {"a"}}}), "stop_token_ids[0]", "integer"},
        BadCase{kC, Completion({{"ignore_eos", 1}}), "ignore_eos", "boolean"},
        BadCase{kC, Completion({{"return_token_ids", "yes"}}), "return_token_ids", "boolean"},
        BadCase{kC, Completion({{"stream", "yes"}}), "stream", "boolean"},
        BadCase{kC, Completion({{"stream_options", {{"include_usage", 1}}}}),
                "stream_options.include_usage", "boolean"},
        BadCase{kC, Completion({{"stream_options", {{"continuous", true}}}}),
                "stream_options.continuous", "Unrecognized"},
        BadCase{kC, Completion({{"n", 2}}), "n", "not supported"},
        BadCase{kC, Completion({{"n", "2"}}), "n", "integer"},
        BadCase{kC, Completion({{"best_of", 3}}), "best_of", "not supported"},
        BadCase{kC, Completion({{"logprobs", 2}}), "logprobs", "not supported"},
        BadCase{kC, Completion({{"logprobs", 0}}), "logprobs", "not supported"},
        BadCase{kC, Completion({{"echo", true}}), "echo", "not supported"},
        BadCase{kC, Completion({{"suffix", "end"}}), "suffix", "not supported"},
        BadCase{kC, Completion({{"frequency_penalty", 0.5}}), "frequency_penalty", "not supported"},
        BadCase{kC, Completion({{"presence_penalty", -1}}), "presence_penalty", "not supported"},
        BadCase{kC, Completion({{"logit_bias", {{"50256", -100}}}}), "logit_bias", "not supported"},
        BadCase{kChat, Chat({{"logprobs", true}}), "logprobs", "not supported"},
        BadCase{kChat, Chat({{"top_logprobs", 2}}), "top_logprobs", "not supported"},
        BadCase{kChat, Chat({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}),
                "tools", "not supported"},
        BadCase{kChat, Chat({{"tool_choice", "auto"}}), "tool_choice", "not supported"},
        BadCase{kChat, Chat({{"functions", {{{"name", "f"}}}}}), "functions", "not supported"},
        BadCase{kChat, Chat({{"response_format", {{"type", "json_object"}}}}), "response_format",
                "not supported"},
        BadCase{kChat, Chat({{"modalities", {"text", "audio"}}}), "modalities", "not supported"},
        BadCase{kChat, Chat({{"audio", {{"voice", "alloy"}}}}), "audio", "not supported"},
        BadCase{kChat, Chat({{"messages", "hi"}}), "messages", "array"},
        BadCase{kChat, Chat({{"messages", json::array()}}), "messages", "empty"},
        BadCase{kChat, Chat({{"messages", {1}}}), "messages[0]", "object"},
        BadCase{kChat, Chat({{"messages", {{{"content", "x"}}}}}), "messages", "role' is missing"},
        BadCase{kChat, Chat({{"messages", {{{"role", "user"}}}}}), "messages",
                "content' is missing"},
        BadCase{kChat, Chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), "messages",
                "messages[0].role"},
        BadCase{kChat, Chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}),
                "messages[0].content", "a string or an array"},
        BadCase{kChat,
                Chat({{"messages",
                       {{{"role", "user"},
                         {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
                "messages[0].content[0].type", "only text"},
        BadCase{kChat,
                Chat({{"messages", {{{"role", "user"}, {"content", "x"}, {"mood", "happy"}}}}}),
                "messages", "messages[0].mood"},
        BadCase{
            kChat,
            Chat({{"messages",
                   {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", json::array()}}}}}),
            "messages[0].tool_calls", "not supported"}));

TEST(OpenAiProtocol, MalformedJsonSaysWhere) {
  GenerationParams params;
  auto error = ParseGenerationBody(Endpoint::kCompletions, R"({"prompt": "x",)", &params);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->http_status, 400);
  EXPECT_NE(error->message.find("not valid JSON"), std::string::npos);
  EXPECT_NE(error->message.find("column 16"), std::string::npos) << error->message;
  EXPECT_TRUE(ParseGenerationBody(Endpoint::kCompletions, "", &params));
  EXPECT_FALSE(ParseGenerationBody(Endpoint::kCompletions, R"({"prompt": "x"})", &params));
}

TEST(OpenAiProtocol, HostileBodiesGetAnErrorNotAnException) {
  GenerationParams params;
  // A number beyond a double, invalid UTF-8 (quoted back in the message), deep nesting.
  for (const std::string& body :
       {std::string(R"({"prompt": "x", "max_tokens": 1e400})"),
        std::string("{\"prompt\": \"\xff\xfe\"}"), std::string(100000, '[')}) {
    auto error = ParseGenerationBody(Endpoint::kCompletions, body, &params);
    ASSERT_TRUE(error) << body.substr(0, 40);
    EXPECT_EQ(error->http_status, 400);
    const json reparsed = json::parse(ErrorBody(*error));  // valid JSON, valid UTF-8
    EXPECT_NE(reparsed["error"]["message"].get<std::string>().find("not valid JSON"),
              std::string::npos);
  }
}

TEST(OpenAiProtocol, EnvelopeKeysCanBeSkipped) {
  GenerationParams params;
  const json body = {{"endpoint", "/v1/completions"}, {"prompt", "x"}};
  EXPECT_TRUE(ParseGenerationRequest(Endpoint::kCompletions, body, &params));
  EXPECT_FALSE(ParseGenerationRequest(Endpoint::kCompletions, body, &params, {"endpoint"}));
}

TEST(OpenAiProtocol, ErrorJsonHasOpenAiShape) {
  ApiError e = BadRequest("bad", "temperature");
  const json body = ErrorJson(e);
  EXPECT_EQ(body, json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error",
                                            "param": "temperature", "code": null}})"));
  e = NotFound("gone", "model", "model_not_found");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(ErrorJson(e)["error"]["code"], "model_not_found");
}

}  // namespace
}  // namespace duet::backend::serve
