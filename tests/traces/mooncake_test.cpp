// Tests of the Mooncake JSONL reader: the real conversation trace, one test per kind of bad
// input (each message must name the source, the line and the field), and agreement between
// the fast line scanner and the full nlohmann::json path.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
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

TEST(MooncakeErrors, MissingFile) {
  auto trace = ReadMooncake("/nonexistent/dir/trace.jsonl");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"/nonexistent/dir/trace.jsonl", "cannot open"}));
}

}  // namespace
}  // namespace duet::traces
