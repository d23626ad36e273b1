// Tests of the completions protocol pieces of `duet replay` (backend/replay/openai.h): the
// endpoint URL, the request body, stream chunks as vLLM, SGLang and Duet send them (tokens,
// finish, usage, cached tokens, the "duet" object, errors), malformed chunks, error bodies and
// the model list.
#include "backend/replay/openai.h"

#include <gtest/gtest.h>

#include <array>

#include <nlohmann/json.hpp>

namespace duet::backend::replay {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Endpoint, ParsesHostPortAndBase) {
  auto e = ParseEndpoint("http://127.0.0.1:8000");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, "8000");
  EXPECT_EQ(e->base_path, "");
  EXPECT_EQ(e->url, "http://127.0.0.1:8000");
  EXPECT_EQ(e->Target("/v1/completions"), "/v1/completions");

  e = ParseEndpoint("HTTP://Server.example/openai/v1/");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->host, "Server.example");
  EXPECT_EQ(e->port, "80");
  EXPECT_EQ(e->base_path, "/openai");  // the trailing /v1 (and slash) dropped
  EXPECT_EQ(e->Target("/v1/models"), "/openai/v1/models");
  EXPECT_EQ(e->HostHeader(), "Server.example:80");

  e = ParseEndpoint("http://h:0080/v1/v1//");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->url, "http://h:80");
  EXPECT_EQ(ParseEndpoint(e->url)->url, e->url);

  e = ParseEndpoint("http://[::1]:9000/v1");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->HostHeader(), "[::1]:9000");
  EXPECT_EQ(e->url, "http://[::1]:9000");
}

TEST(Endpoint, RejectsWhatItCannotServe) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"localhost:8000", "is not a URL"},
      {"https://api.example.com", "https is not supported"},
      {"ftp://host", "unsupported scheme 'ftp'"},
      {"http://", "no host"},
      {"http://:8000", "no host"},
      {"http://host:", "empty port"},
      {"http://host:0", "port '0'"},
      {"http://host:65536", "port '65536'"},
      {"http://host:80a", "port '80a'"},
      {"http://host:123456789012", "port '123456789012'"},
      {"http://user:pw@host", "--api-key"},
      {"http://host/path?x=1", "query"},
      {"http://[::1", "IPv6"},
      // Found by replay_stream_fuzz: a bracketed host that is no IPv6 address would be written
      // back without its brackets and not parse again.
      {"http://[[[2]:80/v1", "not an IPv6 address"},
      {"http://[host]:80", "not an IPv6 address"},
      {"http://host/a b", "space"},
      {"http://host\r\nX-Injected: 1", "control character"},
  };
  for (const auto& [url, message] : bad) {
    auto e = ParseEndpoint(url);
    ASSERT_FALSE(e.ok()) << url;
    EXPECT_TRUE(Contains(e.error(), message)) << url << ": " << e.error();
    EXPECT_TRUE(Contains(e.error(), "'" + url + "'")) << url << ": " << e.error();
  }
}

TEST(CompletionRequest, BodyAsvLLMTakesIt) {
  const auto body = nlohmann::json::parse(CompletionRequestBody("m\"odel", {16, 17, 31999}, 42));
  EXPECT_EQ(body, nlohmann::json::parse(R"({"model": "m\"odel", "prompt": [16, 17, 31999],
      "max_tokens": 42, "stream": true, "stream_options": {"include_usage": true},
      "ignore_eos": true, "temperature": 0})"));
  // A request whose context later turns continue asks for its reply's token ids.
  EXPECT_EQ(nlohmann::json::parse(CompletionRequestBody("m", {16}, 2, true))["return_token_ids"],
            true);
}

TEST(Chunk, TokenIdsAreReadAndChecked) {
  auto c = ParseCompletionChunk(R"({"choices":[{"text":"ab","token_ids":[5, 2147483647]}]})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->token_ids, (std::vector<std::int32_t>{5, 2147483647}));
  c = ParseCompletionChunk(R"({"choices":[{"text":"ab","token_ids":null}]})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_TRUE(c->token_ids.empty());
  for (const char* bad : {R"({"choices":[{"text":"a","token_ids":5}]})",
                          R"({"choices":[{"text":"a","token_ids":[-1]}]})",
                          R"({"choices":[{"text":"a","token_ids":[2147483648]}]})",
                          R"({"choices":[{"text":"a","token_ids":["5"]}]})"}) {
    c = ParseCompletionChunk(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.error().find("token_ids"), std::string::npos) << c.error();
  }
}

TEST(Chunk, TokenChunkFinishAndUsage) {
  auto c = ParseCompletionChunk(
      R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_TRUE(c->token_event);
  EXPECT_EQ(c->finish_reason, "");
  EXPECT_FALSE(c->completion_tokens);
  EXPECT_FALSE(c->done);

  c = ParseCompletionChunk(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_FALSE(c->token_event);  // an empty piece that finishes: the stream's end
  EXPECT_EQ(c->finish_reason, "length");

  c = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":1024,"total_tokens":1034,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":512}},"duet":{"frontend_ms":0.125,"queue_ms":3.25,"instance":2,"prefill_done_ms":40.5,"kv_transfer_ms":1.25,"kv_transfer_bytes":73728,"kv_transfer_parts_ms":{"message":0.25,"wait":0.5,"pull":0.5},"tier_hit_tokens":{"dram":256,"ssd":64,"remote":0}}})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_FALSE(c->token_event);
  EXPECT_EQ(c->prompt_tokens, 1024);
  EXPECT_EQ(c->completion_tokens, 10);
  EXPECT_EQ(c->cached_tokens, 512);
  EXPECT_EQ(c->duet_frontend_ms, 0.125);
  EXPECT_EQ(c->duet_queue_ms, 3.25);
  EXPECT_EQ(c->duet_instance, 2);
  EXPECT_EQ(c->duet_prefill_done_ms, 40.5);
  EXPECT_EQ(c->duet_kv_transfer_ms, 1.25);
  EXPECT_EQ(c->duet_kv_transfer_bytes, 73728);
  ASSERT_TRUE(c->duet_kv_transfer_parts);
  EXPECT_EQ(c->duet_kv_transfer_parts->message_s, 0.25e-3);
  EXPECT_EQ(c->duet_kv_transfer_parts->wait_s, 0.5e-3);
  EXPECT_EQ(c->duet_kv_transfer_parts->pull_s, 0.5e-3);
  ASSERT_TRUE(c->duet_tier_hit_tokens);
  EXPECT_EQ(*c->duet_tier_hit_tokens, (std::array<Tokens, 3>{256, 64, 0}));

  // vLLM without --enable-prompt-tokens-details: the details are null, cached tokens unknown.
  c = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}})");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_FALSE(c->cached_tokens);
}

TEST(Chunk, KeepsTheLastReportOfEachField) {
  // A stream spreads its reports over chunks; a chunk that leaves a field out keeps the earlier
  // report of it.
  auto first = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1},"duet":{"queue_ms":2,"instance":1}})");
  auto last = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9},"duet":{"prefill_done_ms":30,"kv_transfer_ms":4,"kv_transfer_bytes":512,"kv_transfer_parts_ms":{"message":1,"wait":1,"pull":2}}})");
  ASSERT_TRUE(first.ok() && last.ok());
  CompletionChunk kept;
  kept.KeepReports(*first);
  kept.KeepReports(*last);
  EXPECT_EQ(kept.prompt_tokens, 7);
  EXPECT_EQ(kept.completion_tokens, 9);
  EXPECT_FALSE(kept.cached_tokens);
  EXPECT_EQ(kept.duet_queue_ms, 2);
  EXPECT_EQ(kept.duet_instance, 1);
  EXPECT_EQ(kept.duet_prefill_done_ms, 30);
  EXPECT_EQ(kept.duet_kv_transfer_ms, 4);
  EXPECT_EQ(kept.duet_kv_transfer_bytes, 512);
  ASSERT_TRUE(kept.duet_kv_transfer_parts);
  EXPECT_EQ(kept.duet_kv_transfer_parts->pull_s, 2e-3);
}

TEST(Chunk, OtherShapesThatCarryTokens) {
  for (const char* data : {R"({"choices":[{"text":"","token_ids":[5]}]})",
                           R"({"choices":[{"delta":{"content":"x"}}]})",
                           R"({"choices":[{"text":""},{"text":"y"}]})"}) {
    auto c = ParseCompletionChunk(data);
    ASSERT_TRUE(c.ok()) << data << ": " << c.error();
    EXPECT_TRUE(c->token_event) << data;
  }
  // A chunk of a generating stream whose piece is empty is a token too (llama.cpp's server
  // sends one per token, with empty text where the token ends inside a UTF-8 character).
  for (const char* data :
       {R"({"choices":[{"index":0,"text":"","finish_reason":null}]})",
        R"({"choices":[{"index":0,"text":""}]})", R"({"choices":[{"delta":{"content":""}}]})"}) {
    auto c = ParseCompletionChunk(data);
    ASSERT_TRUE(c.ok()) << data << ": " << c.error();
    EXPECT_TRUE(c->token_event) << data;
  }
  // Not tokens: a chat's role-only first delta, a choice that only finishes, usage alone.
  for (const char* data : {R"({"choices":[{"delta":{"role":"assistant"}}]})",
                           R"({"choices":[{"delta":{"role":"assistant","content":""}}]})",
                           R"({"choices":[{"delta":{},"finish_reason":"stop"}]})",
                           R"({"choices":[],"usage":{"completion_tokens":3}})"}) {
    auto c = ParseCompletionChunk(data);
    ASSERT_TRUE(c.ok()) << data << ": " << c.error();
    EXPECT_FALSE(c->token_event) << data;
  }
}

TEST(Chunk, DoneSentinel) {
  for (const char* data : {"[DONE]", " [DONE] "}) {
    auto c = ParseCompletionChunk(data);
    ASSERT_TRUE(c.ok()) << data;
    EXPECT_TRUE(c->done) << data;
  }
  EXPECT_FALSE(ParseCompletionChunk("[DONE]x").ok());
}

TEST(Chunk, ErrorObjectsInTheStream) {
  for (const auto& [data, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"error":{"message":"out of memory","type":"internal"}})", "out of memory"},
           {R"({"error":"plain"})", "plain"},
           {R"({"object":"error","message":"too long","code":400})", "too long"}}) {
    auto c = ParseCompletionChunk(data);
    ASSERT_TRUE(c.ok()) << data << ": " << c.error();
    ASSERT_TRUE(c->error) << data;
    EXPECT_EQ(*c->error, message);
  }
}

TEST(Chunk, MalformedChunksSayWhat) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"this is not JSON", "not JSON: this is not JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"choices":{}})", "choices must be an array"},
      {R"({"choices":[1]})", "a choice is not an object"},
      {R"({"choices":[{"finish_reason":3}]})", "finish_reason must be a string"},
      {R"({"usage":[]})", "usage must be an object"},
      {R"({"usage":{"completion_tokens":-1}})", "usage.completion_tokens must be a non-negative"},
      {R"({"usage":{"prompt_tokens":"9"}})", "usage.prompt_tokens must be"},
      {R"({"usage":{"prompt_tokens_details":{"cached_tokens":1.5}}})",
       "usage.prompt_tokens_details.cached_tokens"},
      {R"({"duet":{"queue_ms":-1}})", "duet.queue_ms"},
      {R"({"duet":{"frontend_ms":[]}})", "duet.frontend_ms must be a number >= 0"},
      {R"({"duet":{"prefill_done_ms":"soon"}})", "duet.prefill_done_ms must be a number >= 0"},
      {R"({"duet":{"kv_transfer_ms":-0.5}})", "duet.kv_transfer_ms must be a number >= 0"},
      {R"({"duet":{"kv_transfer_bytes":-5}})", "duet.kv_transfer_bytes must be a non-negative"},
      {R"({"duet":{"kv_transfer_parts_ms":2}})", "duet.kv_transfer_parts_ms must be an object"},
      {R"({"duet":{"kv_transfer_parts_ms":{"message":1,"wait":-1,"pull":1}}})",
       "duet.kv_transfer_parts_ms.wait must be a number >= 0"},
      {R"({"duet":{"kv_transfer_parts_ms":{"message":1,"wait":1}}})",
       "duet.kv_transfer_parts_ms must give message, wait and pull"},
      {R"({"duet":{"instance":70000}})", "duet.instance"},
      {R"({"duet":7})", "duet must be an object"},
      {R"({"duet":{"tier_hit_tokens":[1,2,3]}})", "duet.tier_hit_tokens must be an object"},
      {R"({"duet":{"tier_hit_tokens":{"ssd":-2}}})",
       "duet.tier_hit_tokens.ssd must be a non-negative integer"},
  };
  for (const auto& [data, message] : bad) {
    auto c = ParseCompletionChunk(data);
    ASSERT_FALSE(c.ok()) << data;
    EXPECT_TRUE(Contains(c.error(), message)) << data << ": " << c.error();
  }
}

TEST(ErrorBody, MessagesFromTheCommonShapes) {
  EXPECT_EQ(DescribeErrorBody(R"({"error":{"message":"queue full","code":429}})"), "queue full");
  EXPECT_EQ(DescribeErrorBody(R"({"object":"error","message":"bad","type":"x"})"), "bad");
  EXPECT_EQ(DescribeErrorBody(R"({"detail":"Not Found"})"), "Not Found");
  EXPECT_EQ(DescribeErrorBody("\n<html>\r\nBad Gateway</html>"), "<html>  Bad Gateway</html>");
  EXPECT_EQ(DescribeErrorBody(""), "(empty body)");
  const std::string long_text(500, 'x');
  EXPECT_EQ(DescribeErrorBody(long_text, 10), "xxxxxxxxxx...");
  // Cut before a multi-byte character rather than inside it.
  EXPECT_EQ(DescribeErrorBody("abcdefghi\xC3\xA9z", 10), "abcdefghi...");
}

TEST(ModelList, FirstId) {
  auto m = ParseFirstModelId(
      R"({"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B","object":"model"},{"id":"b"}]})");
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_EQ(*m, "meta-llama/Llama-3.1-8B");
  EXPECT_TRUE(Contains(ParseFirstModelId(R"({"data":[]})").error(), "no models"));
  EXPECT_TRUE(Contains(ParseFirstModelId(R"({"models":[]})").error(), "\"data\""));
  EXPECT_TRUE(Contains(ParseFirstModelId(R"({"data":[{"name":"x"}]})").error(), "\"id\""));
  EXPECT_TRUE(Contains(ParseFirstModelId("<html>").error(), "not a JSON object"));
}

}  // namespace
}  // namespace duet::backend::replay
