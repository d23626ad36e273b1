// Tests of the Azure CSV reader: the real 2023 conversation trace, timestamp conversion (7-digit
// fractions, month and leap-year boundaries), and one test per kind of bad input.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/traces/test_util.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

using testing::ContainsAll;

constexpr const char* kHeader = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

Result<Trace> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseAzure(in, "traces/a.csv");
}

TEST(AzureRealTrace, CountsArrivalsAndTokens) {
  auto trace = ReadAzure(testing::AzurePath());
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 19366u);
  EXPECT_EQ(trace->source, testing::AzurePath());
  const TraceRequest& first = trace->requests[0];
  EXPECT_EQ(first.id, 0u);
  EXPECT_EQ(first.arrival_s, 0.0);
  EXPECT_EQ(first.input_tokens, 374);
  EXPECT_EQ(first.output_tokens, 44);
  EXPECT_TRUE(first.block_ids.empty());
  // 18:15:50.9951690 - 18:15:46.6805900 = 4.3145790 s (exact in 100 ns ticks).
  EXPECT_EQ(trace->requests[1].id, 1u);
  EXPECT_NEAR(trace->requests[1].arrival_s, 4.314579, 1e-9);
  EXPECT_EQ(trace->requests[1].input_tokens, 396);
  EXPECT_EQ(trace->requests[1].output_tokens, 109);
  // Last row 19:14:08.4025270: 58 min 21.721937 s after the first.
  EXPECT_NEAR(trace->requests.back().arrival_s, 58 * 60 + 21.721937, 1e-6);
  for (std::size_t i = 1; i < trace->requests.size(); ++i) {
    ASSERT_LE(trace->requests[i - 1].arrival_s, trace->requests[i].arrival_s) << i;
  }
}

TEST(AzureParse, FractionDigitsAndDateBoundaries) {
  auto trace = Parse(std::string(kHeader) +
                     "2024-02-28 23:59:59.5,10,1\n"
                     "2024-02-29 00:00:00,20,2\n"            // leap day, no fraction
                     "2024-03-01 00:00:00.0000001,30,3\r\n"  // one tick, CRLF
                     "\n"
                     "2025-01-01 00:00:00.25,40,4\n");
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 4u);
  EXPECT_DOUBLE_EQ(trace->requests[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(trace->requests[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ(trace->requests[2].arrival_s, 0.5 + 86400 + 1e-7);
  // 2024-02-29 to 2025-01-01: 307 days (2024 is a leap year).
  EXPECT_DOUBLE_EQ(trace->requests[3].arrival_s, 0.5 + 307 * 86400.0 + 0.25);
  EXPECT_EQ(trace->requests[3].input_tokens, 40);
  EXPECT_EQ(trace->requests[3].id, 3u);  // data-row index, blank lines not counted
}

TEST(AzureParse, RowsGoingBackwardsAreSortedAndStartAtZero) {
  auto trace = Parse(std::string(kHeader) +
                     "2023-11-16 18:15:50.0,10,1\n"
                     "2023-11-16 18:15:46.0,20,2\n"
                     "2023-11-16 18:15:50.0,30,3\n");
  ASSERT_TRUE(trace.ok()) << trace.error();
  EXPECT_EQ(trace->requests[0].id, 1u);
  EXPECT_EQ(trace->requests[0].arrival_s, 0.0);
  EXPECT_EQ(trace->requests[1].id, 0u);
  EXPECT_DOUBLE_EQ(trace->requests[1].arrival_s, 4.0);
  EXPECT_EQ(trace->requests[2].id, 2u);
}

// ---- Bad input: every message names the source, the line and the field ----------------------

TEST(AzureErrors, BadHeader) {
  auto trace = Parse("TIMESTAMP,Context,Generated\n2023-11-16 18:15:46.6805900,374,44\n");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/a.csv:1:", "header", "TIMESTAMP,Context,"}));
}

TEST(AzureErrors, BadTimestamp) {
  for (const char* stamp :
       {"2023-11-16T18:15:46.6805900", "2023-13-16 18:15:46", "2023-02-29 18:15:46",
        "2023-11-16 24:00:00", "2023-11-16 18:15:46.12345678", "2023-11-16 18:15:4", "yesterday",
        ""}) {
    auto trace =
        Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,374,44\n" + stamp + ",5,6\n");
    ASSERT_FALSE(trace.ok()) << stamp;
    EXPECT_TRUE(ContainsAll(trace.error(), {"traces/a.csv:3:", "field 'TIMESTAMP'"})) << stamp;
  }
}

TEST(AzureErrors, WrongColumnCount) {
  auto trace = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,374\n");
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"traces/a.csv:2:", "3 columns", "got 2"}));
  auto extra = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,374,44,\n");
  ASSERT_FALSE(extra.ok());
  EXPECT_TRUE(ContainsAll(extra.error(), {"traces/a.csv:2:", "got 4"}));
}

TEST(AzureErrors, NegativeOrNonIntegerTokens) {
  auto negative = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,-374,44\n");
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(ContainsAll(negative.error(), {"traces/a.csv:2:", "field 'ContextTokens'"}));
  auto fractional = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,374,4.5\n");
  ASSERT_FALSE(fractional.ok());
  EXPECT_TRUE(ContainsAll(fractional.error(), {"traces/a.csv:2:", "field 'GeneratedTokens'"}));
  auto zero = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,374,0\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(ContainsAll(zero.error(), {"traces/a.csv:2:", "field 'GeneratedTokens'"}));
  auto huge = Parse(std::string(kHeader) + "2023-11-16 18:15:46.6805900,99999999999999999999,1\n");
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(ContainsAll(huge.error(), {"traces/a.csv:2:", "field 'ContextTokens'"}));
}

TEST(AzureErrors, EmptyFile) {
  auto empty = Parse("");
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(ContainsAll(empty.error(), {"traces/a.csv", "no requests"}));
  auto header_only = Parse(kHeader);
  ASSERT_FALSE(header_only.ok());
  EXPECT_TRUE(ContainsAll(header_only.error(), {"traces/a.csv", "no requests"}));
}

}  // namespace
}  // namespace duet::traces
