// The JSON of replies field for field (what the openai client parses): completion and chat
// chunks, the finish chunk and usage chunk with the `duet` extension in the last one before
// [DONE], whole replies, SSE framing, reply ids.
#include "backend/serve/chunks.h"

#include <gtest/gtest.h>

#include <set>

namespace duet::backend::serve {
namespace {

using nlohmann::json;

TEST(Chunks, CompletionStreamWithoutUsage) {
  ReplyFormatter f(Endpoint::kCompletions, "cmpl-1", 1700000000, "tiny", false);
  EXPECT_EQ(json::parse(f.TextChunk("Hel")), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "tiny",
    "choices": [{"index": 0, "text": "Hel", "logprobs": null, "finish_reason": null}]})"));
  EXPECT_EQ(json::parse(f.FinishChunk("lo", "stop", {12.5, 1, 40.25})), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "tiny",
    "choices": [{"index": 0, "text": "lo", "logprobs": null, "finish_reason": "stop"}],
    "duet": {"queue_ms": 12.5, "instance": 1, "prefill_done_ms": 40.25, "kv_transfer_ms": null,
             "kv_transfer_bytes": null, "kv_transfer_parts_ms": null, "frontend_ms": null,
             "tier_hit_tokens": {"dram": 0, "ssd": 0, "remote": 0}}})"));
  // Field order as OpenAI writes it.
  EXPECT_EQ(f.TextChunk("x").rfind(R"({"id":"cmpl-1","object":"text_completion","created")", 0),
            0u);
}

// vLLM's return_token_ids: each choice carries the ids its text came from (none: an empty list).
TEST(Chunks, TokenIdsInEveryChoiceWhenAskedFor) {
  ReplyFormatter f(Endpoint::kCompletions, "cmpl-1", 1, "tiny", false, /*token_ids=*/true);
  const std::vector<std::int32_t> ids = {17, 4};
  EXPECT_EQ(json::parse(f.TextChunk("Hel", nullptr, ids)), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
    "choices": [{"index": 0, "text": "Hel", "logprobs": null, "finish_reason": null,
                 "token_ids": [17, 4]}]})"));
  EXPECT_EQ(json::parse(f.FinishChunk("", "length", {1, 0}))["choices"][0]["token_ids"],
            json::array());
  EXPECT_EQ(
      json::parse(f.FullReply("Hel", "length", {3, 2, 0}, {1, 0}, ids))["choices"][0]["token_ids"],
      json::parse("[17, 4]"));
  // Not asked for: no such field, whatever ids are given.
  ReplyFormatter plain(Endpoint::kCompletions, "cmpl-1", 1, "tiny", false);
  EXPECT_FALSE(
      json::parse(plain.TextChunk("Hel", nullptr, ids))["choices"][0].contains("token_ids"));
}

TEST(Chunks, ChatStreamWithUsage) {
  ReplyFormatter f(Endpoint::kChatCompletions, "chatcmpl-2", 5, "m", true);
  EXPECT_EQ(json::parse(f.RoleChunk()), json::parse(R"({
    "id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 5, "model": "m",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                 "finish_reason": null}], "usage": null})"));
  EXPECT_EQ(json::parse(f.TextChunk("Hi"))["choices"][0]["delta"],
            json::parse(R"({"content": "Hi"})"));
  EXPECT_EQ(json::parse(f.TextChunk("Hi"))["usage"], json());
  // The finish chunk: no text means an empty delta; with include_usage it has no duet field,
  // the usage chunk (empty choices) has it.
  const json finish = json::parse(f.FinishChunk("", "length", {3, 0}));
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(finish.contains("duet"));
  EXPECT_EQ(json::parse(f.UsageChunk({7, 4, 2}, {-1, -1})), json::parse(R"({
    "id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 5, "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11,
              "prompt_tokens_details": {"cached_tokens": 2}},
    "duet": {"queue_ms": null, "instance": null, "prefill_done_ms": null, "kv_transfer_ms": null,
             "kv_transfer_bytes": null, "kv_transfer_parts_ms": null, "frontend_ms": null,
             "tier_hit_tokens": {"dram": 0, "ssd": 0, "remote": 0}}})"));
}

TEST(Chunks, WholeReplies) {
  ReplyFormatter chat(Endpoint::kChatCompletions, "chatcmpl-3", 9, "m", false);
  EXPECT_EQ(
      json::parse(chat.FullReply(
          "Hello", "stop", {5, 1, 0},
          {0.25, 0, 3, 1.5, 4096, {48, 16, 0}, 0.125, policies::KvTransferParts{0.5, 0.25, 0.75}})),
      json::parse(R"({
    "id": "chatcmpl-3", "object": "chat.completion", "created": 9, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                 "logprobs": null, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
              "prompt_tokens_details": {"cached_tokens": 0}},
    "duet": {"queue_ms": 0.25, "instance": 0, "prefill_done_ms": 3, "kv_transfer_ms": 1.5,
             "kv_transfer_bytes": 4096, "frontend_ms": 0.125,
             "kv_transfer_parts_ms": {"message": 500, "wait": 250, "pull": 750},
             "tier_hit_tokens": {"dram": 48, "ssd": 16, "remote": 0}}})"));
  ReplyFormatter text(Endpoint::kCompletions, "cmpl-4", 9, "m", false);
  const json reply = json::parse(text.FullReply("ab\"c\n", "length", {1, 2, 0}, {1, 2}));
  EXPECT_EQ(reply["object"], "text_completion");
  EXPECT_EQ(reply["choices"][0]["text"], "ab\"c\n");
  EXPECT_EQ(reply["usage"]["total_tokens"], 3);
}

// Text chunks come from a template built once per reply: byte for byte what the JSON of the
// whole chunk serializes to, for every endpoint, usage mode and kind of text (escapes, control
// characters, non-ASCII, bytes that are not UTF-8, the template's own placeholder).
TEST(Chunks, TemplatedTextChunksEqualTheWholeDocument) {
  using ojson = nlohmann::ordered_json;
  const std::string texts[] = {"a",
                               "quote\" back\\slash",
                               "\n\t\x01\x1f",
                               "h\xc3\xa9llo \xe2\x82\xac",
                               "bad \xff\xfe utf-8",
                               "\\u0001",
                               "\"\\u0001\""};
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    for (bool include_usage : {false, true}) {
      ReplyFormatter f(endpoint, "id-\"\x01", 42, "model \\u0001 \x01", include_usage);
      for (const std::string& text : texts) {
        for (bool continuous : {false, true}) {
          const Usage usage{123456789012, 3, 7};
          ojson want = {{"id", "id-\"\x01"},
                        {"object", endpoint == Endpoint::kCompletions ? "text_completion"
                                                                      : "chat.completion.chunk"},
                        {"created", 42},
                        {"model", "model \\u0001 \x01"}};
          ojson choice = {{"index", 0}};
          if (endpoint == Endpoint::kCompletions) {
            choice["text"] = text;
          } else {
            choice["delta"] = {{"content", text}};
          }
          choice["logprobs"] = nullptr;
          choice["finish_reason"] = nullptr;
          want["choices"] = ojson::array({choice});
          if (include_usage) want["usage"] = continuous ? ojson(UsageJson(usage)) : ojson(nullptr);
          EXPECT_EQ(f.TextChunk(text, continuous ? &usage : nullptr), DumpJson(want))
              << "text '" << text << "' usage " << include_usage << continuous;
        }
      }
    }
  }
}

TEST(Chunks, SseFramingAndIds) {
  EXPECT_EQ(SseData(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseData(kDone), "data: [DONE]\n\n");
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewReplyId("cmpl-");
    EXPECT_EQ(id.rfind("cmpl-", 0), 0u);
    EXPECT_EQ(id.size(), 5u + 24u);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

}  // namespace
}  // namespace duet::backend::serve
