// Tests of the Mooncake JSONL reader: the real conversation trace, one test per kind of bad
// input (each message must name the source, the line and the field), and agreement between
// the fast line scanner and the full nlohmann::json path.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "tests/traces/test_util.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

using testing::ContainsAll;

Result<Trace> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseMooncake(in, "traces/x.jsonl");
}

constexpr const char* kGoodLine =
    R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 2353, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]})";

TEST(MooncakeRealTrace, CountsFirstRequestAndMeans) {
  const auto start = std::chrono::steady_clock::now();
  auto trace = ReadMooncake(testing::MooncakePath());
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(trace.ok()) << trace.error();
  std::printf("ReadMooncake(real trace): %.1f ms\n", elapsed_ms);

  ASSERT_EQ(trace->requests.size(), 12031u);
  EXPECT_EQ(trace->source, testing::MooncakePath());
  EXPECT_EQ(trace->block_tokens, 512);
  // First line: {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0..13]}
  const TraceRequest& first = trace->requests.front();
  EXPECT_EQ(first.id, 0u);
  EXPECT_EQ(first.arrival_s, 0.0);
  EXPECT_EQ(first.input_tokens, 6758);
  EXPECT_EQ(first.output_tokens, 500);
  ASSERT_EQ(first.block_ids.size(), 14u);
  for (std::size_t i = 0; i < 14; ++i) EXPECT_EQ(first.block_ids[i], i);

  double input_sum = 0, output_sum = 0;
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const TraceRequest& r = trace->requests[i];
    if (i > 0) {
      ASSERT_LE(trace->requests[i - 1].arrival_s, r.arrival_s) << "not sorted at " << i;
    }
    // Every line of the real trace has ceil(input_length / 512) hash ids.
    ASSERT_EQ(static_cast<Tokens>(r.block_ids.size()), (r.input_tokens + 511) / 512) << i;
    input_sum += static_cast<double>(r.input_tokens);
    output_sum += static_cast<double>(r.output_tokens);
  }
  const double n = static_cast<double>(trace->requests.size());
  EXPECT_NEAR(input_sum / n, 12035.0, 1.0);  // README: average input 12,035 tokens
  EXPECT_NEAR(output_sum / n, 343.0, 1.0);   // README: average output 343 tokens
  // The trace spans one hour.
  EXPECT_GT(trace->requests.back().arrival_s, 3000.0);
  EXPECT_LT(trace->requests.back().arrival_s, 3700.0);
}

TEST(MooncakeParse, ReadsFieldsAndSkipsBlankLines) {
  auto trace = Parse(
      std::string("\n") + kGoodLine + "\n  \n\r\n" +
      R"({"timestamp": 1500, "input_length": 1, "output_length": 1, "hash_ids": [9]})" + "\r\n");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 2u);
  EXPECT_DOUBLE_EQ(trace->requests[0].arrival_s, 1.5);
  EXPECT_EQ(trace->requests[0].id, 1u);  // sorted by arrival; ids keep file positions
  EXPECT_DOUBLE_EQ(trace->requests[1].arrival_s, 27.482);
  EXPECT_EQ(trace->requests[1].input_tokens, 6955);
  EXPECT_EQ(trace->requests[1].output_tokens, 52);
  EXPECT_EQ(trace->requests[1].block_ids[3], 2353u);
}

TEST(MooncakeParse, SortsStablyWhenTimestampsGoBackwards) {
  auto trace =
      Parse(R"({"timestamp": 200, "input_length": 10, "output_length": 1, "hash_ids": [1]})"
            "\n"
            R"({"timestamp": 100, "input_length": 20, "output_length": 1, "hash_ids": [2]})"
            "\n"
            R"({"timestamp": 200, "input_length": 30, "output_length": 1, "hash_ids": [3]})"
            "\n"
            R"({"timestamp": 100, "input_length": 40, "output_length": 1, "hash_ids": [4]})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  std::vector<std::uint64_t> ids;
  for (const auto& r : trace->requests) ids.push_back(r.id);
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 3, 0, 2}));
}

// Lines the fast scanner leaves to nlohmann::json must read the same as the plain form.
TEST(MooncakeParse, UnusualButValidJsonReadsLikeThePlainForm) {
  const std::string plain =
      R"({"timestamp": 1500, "input_length": 513, "output_length": 7, "hash_ids": [5, 6]})";
  const std::vector<std::string> variants = {
      R"({"hash_ids":[5,6],"output_length":7,"input_length":513,"timestamp":1500})",
      R"({"timestamp": 1.5e3, "input_length": 513, "output_length": 7, "hash_ids": [5, 6]})",
      R"({"timestamp": 1500.0, "input_length": 513, "output_length": 7, "hash_ids": [5, 6]})",
      R"({"\u0074imestamp": 1500, "input_length": 513, "output_length": 7, "hash_ids": [5, 6]})",
      R"({"timestamp": 1500, "input_length": 513, "output_length": 7, "hash_ids": [5, 6], "x": "y"})",
      "\t{ \"timestamp\" : 1500 ,\"input_length\":513,\"output_length\":7,\"hash_ids\":[ 5 , 6 ] "
      "}\r",
  };
  auto expected = Parse(plain);
  ASSERT_TRUE(expected.ok()) << expected.error();
  for (const std::string& line : variants) {
    auto got = Parse(line);
    ASSERT_TRUE(got.ok()) << line << ": " << got.error();
    const TraceRequest& a = expected->requests[0];
    const TraceRequest& b = got->requests[0];
    EXPECT_EQ(a.arrival_s, b.arrival_s) << line;
    EXPECT_EQ(a.input_tokens, b.input_tokens) << line;
    EXPECT_EQ(a.output_tokens, b.output_tokens) << line;
    EXPECT_EQ(a.block_ids, b.block_ids) << line;
  }
}

TEST(MooncakeParse, EmptyHashIdsMeanNoPrefixInfo) {
  auto trace =
      Parse(R"({"timestamp": 0, "input_length": 2000, "output_length": 3, "hash_ids": []})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  EXPECT_TRUE(trace->requests[0].block_ids.empty());
}

// ---- Bad input: every message names the source, the line and the field ----------------------

TEST(MooncakeErrors, MalformedJsonLine) {
  auto trace = Parse(std::string(kGoodLine) + "\n" + R"({"timestamp": 5, "input_length": )");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:2:", "invalid JSON"}));
}

TEST(MooncakeErrors, LineThatIsNotAnObject) {
  auto trace = Parse("[1, 2, 3]");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "JSON object"}));
}

TEST(MooncakeErrors, MissingField) {
  auto trace = Parse(std::string(kGoodLine) + "\n\n" +
                     R"({"timestamp": 5, "output_length": 3, "hash_ids": [1]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:3:", "field 'input_length'", "missing"}));
}

TEST(MooncakeErrors, MissingHashIds) {
  auto trace = Parse(R"({"timestamp": 5, "input_length": 3, "output_length": 3})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "field 'hash_ids'", "missing"}));
}

TEST(MooncakeErrors, WrongType) {
  auto trace =
      Parse(R"({"timestamp": 5, "input_length": "100", "output_length": 3, "hash_ids": [1]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(),
                          {"traces/x.jsonl:1: field 'input_length' must be a positive integer"}));

  auto timestamp =
      Parse(R"({"timestamp": "now", "input_length": 100, "output_length": 3, "hash_ids": [1]})");
  ASSERT_FALSE(timestamp.ok());
  EXPECT_TRUE(ContainsAll(timestamp.error(), {"traces/x.jsonl:1:", "field 'timestamp'"}));

  auto ids = Parse(R"({"timestamp": 5, "input_length": 100, "output_length": 3, "hash_ids": 1})");
  ASSERT_FALSE(ids.ok());
  EXPECT_TRUE(ContainsAll(ids.error(), {"traces/x.jsonl:1:", "field 'hash_ids'", "array"}));
}

TEST(MooncakeErrors, FractionalLength) {
  auto trace =
      Parse(R"({"timestamp": 5, "input_length": 100, "output_length": 2.5, "hash_ids": [1]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "field 'output_length'"}));
}

TEST(MooncakeErrors, NegativeLength) {
  auto trace =
      Parse(R"({"timestamp": 5, "input_length": -100, "output_length": 3, "hash_ids": [1]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(),
                          {"traces/x.jsonl:1: field 'input_length' must be a positive integer"}));
}

TEST(MooncakeErrors, ZeroLengths) {
  auto input = Parse(R"({"timestamp": 5, "input_length": 0, "output_length": 3, "hash_ids": []})");
  ASSERT_FALSE(input.ok());
  EXPECT_TRUE(ContainsAll(input.error(), {"traces/x.jsonl:1:", "field 'input_length'"}));
  auto output =
      Parse(R"({"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]})");
  ASSERT_FALSE(output.ok());
  EXPECT_TRUE(ContainsAll(output.error(), {"traces/x.jsonl:1:", "field 'output_length'"}));
}

TEST(MooncakeErrors, NegativeTimestamp) {
  auto trace =
      Parse(R"({"timestamp": -1, "input_length": 100, "output_length": 3, "hash_ids": [1]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "field 'timestamp'"}));
}

TEST(MooncakeErrors, NonIntegerHashId) {
  auto trace =
      Parse(R"({"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [1, "b"]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "field 'hash_ids'", "element 1"}));

  auto negative =
      Parse(R"({"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [-1, 2]})");
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(ContainsAll(negative.error(), {"field 'hash_ids'", "element 0"}));
  auto fractional =
      Parse(R"({"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2.5]})");
  ASSERT_FALSE(fractional.ok());
  EXPECT_TRUE(ContainsAll(fractional.error(), {"field 'hash_ids'", "element 1"}));
}

TEST(MooncakeErrors, HashIdCountDisagreesWithInputLength) {
  // 1025 tokens need ceil(1025 / 512) = 3 blocks.
  auto trace =
      Parse(R"({"timestamp": 5, "input_length": 1025, "output_length": 3, "hash_ids": [1, 2]})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:1:", "field 'hash_ids'", "= 3"}));
}

TEST(MooncakeErrors, EmptyFile) {
  auto trace = Parse("");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl", "no requests"}));
  auto blank = Parse("\n  \n");
  ASSERT_FALSE(blank.ok());
  EXPECT_TRUE(ContainsAll(blank.error(), {"traces/x.jsonl", "no requests"}));
}

// ---- Sessions and dependencies -----------------------------------------------------------------

// The fields of `r` that tests compare, for one-line failure messages.
struct Deps {
  std::uint64_t id;
  Seconds arrival_s;
  Tokens input_tokens, output_tokens, context_tokens;
  std::optional<std::uint64_t> parent;
  std::vector<std::uint64_t> after;
  Seconds delay_s;
  std::string session;
  bool operator==(const Deps&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Deps& d) {
  out << "{id " << d.id << ", at " << d.arrival_s << ", in " << d.input_tokens << ", out "
      << d.output_tokens << ", context " << d.context_tokens << ", parent "
      << (d.parent ? std::to_string(*d.parent) : "none") << ", after [";
  for (std::uint64_t id : d.after) out << id << " ";
  return out << "], delay " << d.delay_s << ", session '" << d.session << "'}";
}
Deps Of(const TraceRequest& r) {
  return {r.id,     r.arrival_s, r.input_tokens, r.output_tokens, r.context_tokens,
          r.parent, r.after,     r.delay_s,      r.session};
}

TEST(MooncakeSessions, ThreeTurnsResolveParentsContextsAndArrivalBounds) {
  auto trace = Parse(
      // Turn 1 at 1 s: 600 + 20 tokens.
      R"({"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [1, 2], "session_id": "chat", "request_id": "t1"})"
      "\n"
      // Turn 2: no timestamp, no hash_ids; 50 new tokens after 620 of context.
      R"({"input_length": 50, "output_length": 30, "session_id": "chat", "delay": 1500})"
      "\n"
      // Turn 3: a timestamp before its parent's is only a lower bound; 670 + 30 of context.
      R"({"timestamp": 500, "input_length": 10, "output_length": 5, "hash_ids": [], "session_id": "chat"})"
      "\n"
      // Unrelated, earlier: sorted first. An integer session_id reads as its decimal text.
      R"({"timestamp": 200, "input_length": 100, "output_length": 1, "hash_ids": [9], "session_id": 7})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 4u);
  EXPECT_EQ(Of(trace->requests[0]), (Deps{3, 0.2, 100, 1, 0, std::nullopt, {}, 0, "7"}));
  EXPECT_EQ(Of(trace->requests[1]), (Deps{0, 1.0, 600, 20, 0, std::nullopt, {}, 0, "chat"}));
  EXPECT_EQ(Of(trace->requests[2]), (Deps{1, 1.0, 670, 30, 620, 0, {}, 1.5, "chat"}));
  EXPECT_EQ(Of(trace->requests[3]), (Deps{2, 1.0, 710, 5, 700, 1, {}, 0, "chat"}));
  EXPECT_EQ(trace->requests[1].block_ids, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_TRUE(trace->requests[2].block_ids.empty());
  EXPECT_TRUE(trace->requests[3].block_ids.empty());
  EXPECT_TRUE(trace->HasDependencies());
  EXPECT_FALSE(trace->requests[1].HasDependencies());
}

TEST(MooncakeSessions, TracesWithoutSessionFieldsHaveNoDependencies) {
  auto trace = Parse(std::string(kGoodLine) + "\n" + kGoodLine);
  ASSERT_TRUE(trace.ok()) << trace.error();
  EXPECT_FALSE(trace->HasDependencies());
  for (const TraceRequest& r : trace->requests) {
    EXPECT_EQ(Of(r), (Deps{r.id, 27.482, 6955, 52, 0, std::nullopt, {}, 0, ""}));
  }
}

TEST(MooncakeSessions, ExplicitParentOverridesTheSessionChain) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1], "request_id": "root", "session_id": "a"})"
      "\n"
      R"({"input_length": 5, "output_length": 1, "session_id": "a"})"
      "\n"
      // A fork: the same parent as the line before, not the line before.
      R"({"input_length": 7, "output_length": 2, "session_id": "a", "parent": "root"})"
      "\n"
      // The session chain goes on from the fork.
      R"({"input_length": 3, "output_length": 1, "session_id": "a", "hash_ids": null})"
      "\n"
      // A parent without a session_id: the request joins its parent's session.
      R"({"input_length": 1, "output_length": 1, "parent": "root", "delay": 0})"
      "\n"
      // Another session does not continue "a".
      R"({"timestamp": 0, "input_length": 4, "output_length": 4, "hash_ids": [], "session_id": "b"})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 6u);
  EXPECT_EQ(Of(trace->requests[0]), (Deps{0, 0, 100, 10, 0, std::nullopt, {}, 0, "a"}));
  EXPECT_EQ(Of(trace->requests[1]), (Deps{1, 0, 115, 1, 110, 0, {}, 0, "a"}));
  EXPECT_EQ(Of(trace->requests[2]), (Deps{2, 0, 117, 2, 110, 0, {}, 0, "a"}));
  EXPECT_EQ(Of(trace->requests[3]), (Deps{3, 0, 122, 1, 119, 2, {}, 0, "a"}));
  EXPECT_EQ(Of(trace->requests[4]), (Deps{4, 0, 111, 1, 110, 0, {}, 0, "a"}));
  EXPECT_EQ(Of(trace->requests[5]), (Deps{5, 0, 4, 4, 0, std::nullopt, {}, 0, "b"}));
}

TEST(MooncakeSessions, AfterSeveralRequestsWithDelayInSeconds) {
  auto trace = Parse(
      R"({"timestamp": 100, "input_length": 10, "output_length": 1, "hash_ids": [1], "request_id": 1})"
      "\n"
      R"({"timestamp": 300, "input_length": 20, "output_length": 2, "hash_ids": [2], "request_id": "b"})"
      "\n"
      // 1 and "1" name the same request; repeats count once. Its own prompt, no parent.
      R"({"timestamp": 200, "input_length": 40, "output_length": 3, "hash_ids": [3], "after": ["b", 1, "1"], "delay": 250})"
      "\n"
      // Parent and after together; a fractional delay in ms.
      R"({"input_length": 5, "output_length": 1, "parent": 1, "after": ["b"], "delay": 12.5})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 4u);
  EXPECT_EQ(Of(trace->requests[0]), (Deps{0, 0.1, 10, 1, 0, std::nullopt, {}, 0, ""}));
  EXPECT_EQ(Of(trace->requests[1]), (Deps{1, 0.3, 20, 2, 0, std::nullopt, {}, 0, ""}));
  // The arrival bound is the latest dependency's arrival, 0.3 s, above its own 0.2 s.
  EXPECT_EQ(Of(trace->requests[2]), (Deps{2, 0.3, 40, 3, 0, std::nullopt, {1, 0}, 0.25, ""}));
  EXPECT_EQ(trace->requests[2].block_ids, (std::vector<std::uint64_t>{3}));
  EXPECT_EQ(Of(trace->requests[3]), (Deps{3, 0.3, 16, 1, 11, 0, {1}, 0.0125, ""}));
}

TEST(MooncakeSessions, FastAndFullPathsAgreeOnPlainLinesAmongSessionLines) {
  // A plain line between session lines keeps its own fields and breaks no chain.
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "session_id": "s"})"
      "\n" +
      std::string(kGoodLine) + "\n" +
      R"({"input_length": 10, "output_length": 1, "session_id": "s"})");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 3u);
  EXPECT_EQ(Of(trace->requests[1]), (Deps{2, 0, 21, 1, 11, 0, {}, 0, "s"}));
  EXPECT_EQ(Of(trace->requests[2]), (Deps{1, 27.482, 6955, 52, 0, std::nullopt, {}, 0, ""}));
}

TEST(MooncakeSessionErrors, UnknownParentName) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "a"})"
      "\n\n"
      R"({"input_length": 10, "output_length": 1, "parent": "nope"})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:3: field 'parent'", "'nope'"}));

  // A name defined only on a later line is unknown too (dependencies come first).
  auto forward = Parse(
      R"({"input_length": 10, "output_length": 1, "parent": "later"})"
      "\n"
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "later"})");
  ASSERT_FALSE(forward.ok());
  EXPECT_TRUE(ContainsAll(forward.error(), {"traces/x.jsonl:1: field 'parent'", "'later'"}));

  auto after = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": 3})"
      "\n"
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "after": [3, 4]})");
  ASSERT_FALSE(after.ok());
  EXPECT_TRUE(ContainsAll(after.error(), {"traces/x.jsonl:2: field 'after'", "'4'"}));
}

TEST(MooncakeSessionErrors, DuplicateRequestIdNamesTheFirstLine) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "a"})"
      "\n"
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "b"})"
      "\n\n"
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "a"})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(
      ContainsAll(trace.error(), {"traces/x.jsonl:4: field 'request_id'", "'a'", "line 1"}));
}

TEST(MooncakeSessionErrors, BadRequestAndSessionNames) {
  for (const char* bad : {"-1", "1.5", "[1]", "true", "\"\""}) {
    auto request = Parse(
        std::string(
            R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": )") +
        bad + "}");
    ASSERT_FALSE(request.ok()) << bad;
    EXPECT_TRUE(ContainsAll(request.error(), {"traces/x.jsonl:1: field 'request_id'"})) << bad;
    auto session = Parse(
        std::string(
            R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "session_id": )") +
        bad + "}");
    ASSERT_FALSE(session.ok()) << bad;
    EXPECT_TRUE(ContainsAll(session.error(), {"traces/x.jsonl:1: field 'session_id'"})) << bad;
  }
}

TEST(MooncakeSessionErrors, NonEmptyHashIdsOnAFollowUp) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "session_id": "s"})"
      "\n"
      R"({"input_length": 10, "output_length": 1, "hash_ids": [2], "session_id": "s"})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:2: field 'hash_ids'", "parent"}));
}

TEST(MooncakeSessionErrors, DelayWithoutADependency) {
  auto root = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "delay": 5})");
  ASSERT_FALSE(root.ok());
  EXPECT_TRUE(ContainsAll(root.error(), {"traces/x.jsonl:1: field 'delay'", "follow"}));
  // A session's first line follows nothing either.
  auto first_turn = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "session_id": "s", "delay": 5})");
  ASSERT_FALSE(first_turn.ok());
  EXPECT_TRUE(ContainsAll(first_turn.error(), {"traces/x.jsonl:1: field 'delay'"}));
  auto negative =
      Parse(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "session_id": "s"})"
            "\n"
            R"({"input_length": 10, "output_length": 1, "session_id": "s", "delay": -1})");
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(ContainsAll(negative.error(), {"traces/x.jsonl:2: field 'delay'"}));
}

TEST(MooncakeSessionErrors, MissingTimestampOnARoot) {
  auto plain = Parse(R"({"input_length": 10, "output_length": 1, "hash_ids": []})");
  ASSERT_FALSE(plain.ok());
  EXPECT_TRUE(ContainsAll(plain.error(), {"traces/x.jsonl:1: field 'timestamp'", "missing"}));
  // The first line of a session has nothing to follow: it needs a time of its own.
  auto first_turn =
      Parse(std::string(kGoodLine) + "\n" +
            R"({"input_length": 10, "output_length": 1, "session_id": "s", "timestamp": null})");
  ASSERT_FALSE(first_turn.ok());
  EXPECT_TRUE(ContainsAll(first_turn.error(), {"traces/x.jsonl:2: field 'timestamp'", "missing"}));
}

TEST(MooncakeSessionErrors, PromptPastOneBillionTokensThroughContextGrowth) {
  const std::string first =
      R"({"timestamp": 0, "input_length": 600000000, "output_length": 1, "hash_ids": [], "session_id": "s"})";
  // 600000001 tokens of context + 399999999 new ones: exactly 1e9, accepted.
  auto at_limit =
      Parse(first + "\n" + R"({"input_length": 399999999, "output_length": 1, "session_id": "s"})");
  ASSERT_TRUE(at_limit.ok()) << at_limit.error();
  EXPECT_EQ(at_limit->requests[1].input_tokens, 1'000'000'000);
  // One more token is too many, though each line's own lengths are in range.
  auto past =
      Parse(first + "\n" + R"({"input_length": 400000000, "output_length": 1, "session_id": "s"})");
  ASSERT_FALSE(past.ok());
  EXPECT_TRUE(ContainsAll(past.error(),
                          {"traces/x.jsonl:2: field 'input_length'", "600000001", "1000000000"}));
}

TEST(MooncakeSessionErrors, AfterThatIsNotAnArray) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "request_id": "a"})"
      "\n"
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [], "after": "a"})");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/x.jsonl:2: field 'after'", "array"}));
}

TEST(MooncakeErrors, MissingFile) {
  auto trace = ReadMooncake("/nonexistent/dir/trace.jsonl");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"/nonexistent/dir/trace.jsonl", "cannot open"}));
}

}  // namespace
}  // namespace duet::traces
