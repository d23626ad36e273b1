// Tests of the selections (ScaleRate, KeepFirst, KeepWindow), format names, ReadTrace dispatch
// and the Mooncake writer (key order and a write/read round trip).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "tests/traces/test_util.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

using testing::ContainsAll;

// Requests with ids 0..n-1 arriving at the given times (already sorted).
Trace MakeTrace(const std::vector<Seconds>& arrivals_s) {
  Trace trace;
  trace.source = "made";
  for (std::size_t i = 0; i < arrivals_s.size(); ++i) {
    TraceRequest r;
    r.id = i;
    r.arrival_s = arrivals_s[i];
    r.input_tokens = static_cast<Tokens>(100 + i);
    r.output_tokens = static_cast<Tokens>(1 + i);
    trace.requests.push_back(r);
  }
  return trace;
}

std::vector<std::uint64_t> Ids(const Trace& trace) {
  std::vector<std::uint64_t> ids;
  for (const auto& r : trace.requests) ids.push_back(r.id);
  return ids;
}

TEST(TraceFormatName, KnownAndUnknown) {
  EXPECT_EQ(*ParseTraceFormat("mooncake"), TraceFormat::kMooncake);
  EXPECT_EQ(*ParseTraceFormat("azure"), TraceFormat::kAzure);
  EXPECT_EQ(*ParseTraceFormat("synthetic"), TraceFormat::kSynthetic);
  auto bad = ParseTraceFormat("Mooncake2");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(ContainsAll(bad.error(), {"'Mooncake2'", "mooncake, azure, synthetic"}));
}

TEST(ScaleRate, FactorTwoHalvesArrivals) {
  Trace trace = MakeTrace({0, 1, 3, 10});
  ASSERT_TRUE(ScaleRate(trace, 2.0).ok());
  EXPECT_EQ(trace.requests[1].arrival_s, 0.5);
  EXPECT_EQ(trace.requests[2].arrival_s, 1.5);
  EXPECT_EQ(trace.requests[3].arrival_s, 5.0);
  EXPECT_EQ(Ids(trace), (std::vector<std::uint64_t>{0, 1, 2, 3}));
  ASSERT_TRUE(ScaleRate(trace, 0.25).ok());
  EXPECT_EQ(trace.requests[3].arrival_s, 20.0);
}

TEST(ScaleRate, BadFactorIsAnErrorAndChangesNothing) {
  for (double factor : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()}) {
    Trace trace = MakeTrace({0, 1});
    Status status = ScaleRate(trace, factor);
    ASSERT_FALSE(status.ok()) << factor;
    EXPECT_TRUE(ContainsAll(status.message(), {"factor"}));
    EXPECT_EQ(trace.requests[1].arrival_s, 1.0);
  }
}

TEST(KeepFirst, KeepsPrefixInArrivalOrder) {
  Trace trace = MakeTrace({0, 1, 2, 3, 4});
  KeepFirst(trace, 3);
  EXPECT_EQ(Ids(trace), (std::vector<std::uint64_t>{0, 1, 2}));
  KeepFirst(trace, 0);  // 0: keep all
  EXPECT_EQ(trace.requests.size(), 3u);
  KeepFirst(trace, 10);  // more than there are: keep all
  EXPECT_EQ(trace.requests.size(), 3u);
}

TEST(KeepWindow, KeepsHalfOpenWindowAndShifts) {
  Trace trace = MakeTrace({0, 1, 2.5, 4, 5, 7});
  ASSERT_TRUE(KeepWindow(trace, 2, 5).ok());
  EXPECT_EQ(Ids(trace), (std::vector<std::uint64_t>{2, 3}));  // 5 is excluded
  EXPECT_EQ(trace.requests[0].arrival_s, 0.0);                // the first kept arrival moves to 0
  EXPECT_EQ(trace.requests[1].arrival_s, 1.5);
  EXPECT_EQ(trace.requests[1].input_tokens, 103);
}

TEST(KeepWindow, OpenEndedWindow) {
  Trace trace = MakeTrace({0, 1, 2});
  ASSERT_TRUE(KeepWindow(trace, 1, std::numeric_limits<double>::infinity()).ok());
  EXPECT_EQ(Ids(trace), (std::vector<std::uint64_t>{1, 2}));
}

TEST(KeepWindow, BadOrEmptyWindowIsAnError) {
  Trace trace = MakeTrace({0, 1, 2});
  Status reversed = KeepWindow(trace, 2, 1);
  ASSERT_FALSE(reversed.ok());
  EXPECT_TRUE(ContainsAll(reversed.message(), {"window"}));
  EXPECT_FALSE(KeepWindow(trace, 1, 1).ok());
  EXPECT_FALSE(KeepWindow(trace, -1, 1).ok());
  EXPECT_FALSE(KeepWindow(trace, std::numeric_limits<double>::quiet_NaN(), 1).ok());

  Status empty = KeepWindow(trace, 10, 20);
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(ContainsAll(empty.message(), {"made: no requests in window [10, 20)"}));
  EXPECT_EQ(trace.requests.size(), 3u);  // unchanged on error
}

TEST(ReadTrace, DispatchesOnFormat) {
  auto mooncake = ReadTrace(testing::MooncakePath(), TraceFormat::kMooncake);
  ASSERT_TRUE(mooncake.ok()) << mooncake.error();
  EXPECT_EQ(mooncake->requests.size(), 12031u);
  auto azure = ReadTrace(testing::AzurePath(), TraceFormat::kAzure);
  ASSERT_TRUE(azure.ok()) << azure.error();
  EXPECT_EQ(azure->requests.size(), 19366u);
  auto synthetic = ReadTrace(testing::BundledPath("tiny.json"), TraceFormat::kSynthetic);
  ASSERT_TRUE(synthetic.ok()) << synthetic.error();
  EXPECT_EQ(synthetic->source, testing::BundledPath("tiny.json"));
  // The Azure file is not Mooncake JSONL: line 1 is not JSON.
  auto wrong = ReadTrace(testing::AzurePath(), TraceFormat::kMooncake);
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(ContainsAll(wrong.error(), {testing::AzurePath() + ":1:", "invalid JSON"}));
}

TEST(WriteMooncake, KeyOrderMatchesThePublishedTrace) {
  testing::TempDir dir;
  Trace trace = MakeTrace({0.0004, 1.2345});
  trace.requests[0].block_ids = {7};
  ASSERT_TRUE(WriteMooncake(trace, dir.File("t.jsonl")).ok());
  std::ifstream in(dir.File("t.jsonl"));
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(first, R"({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [7]})");
  EXPECT_EQ(second,
            R"({"timestamp": 1235, "input_length": 101, "output_length": 2, "hash_ids": []})");
}

TEST(WriteMooncake, GeneratedTraceRoundTrips) {
  SyntheticSpec spec;
  spec.num_requests = 500;
  spec.rate_per_s = 20;
  spec.input.kind = LengthDist::Kind::kLognormal;
  spec.input.mean = 1500;
  spec.input.sigma = 1.0;
  spec.input.min = 1;
  spec.input.max = 20000;
  spec.output.kind = LengthDist::Kind::kUniform;
  spec.output.min = 1;
  spec.output.max = 300;
  spec.prefix_groups = 5;
  spec.prefix_tokens = 1100;
  spec.seed = 7;
  auto generated = GenerateSynthetic(spec);
  ASSERT_TRUE(generated.ok()) << generated.error();

  testing::TempDir dir;
  ASSERT_TRUE(WriteMooncake(*generated, dir.File("gen.jsonl")).ok());
  auto read = ReadMooncake(dir.File("gen.jsonl"));
  ASSERT_TRUE(read.ok()) << read.error();
  ASSERT_EQ(read->requests.size(), generated->requests.size());
  for (std::size_t i = 0; i < read->requests.size(); ++i) {
    const TraceRequest& a = generated->requests[i];
    const TraceRequest& b = read->requests[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.input_tokens, b.input_tokens);
    EXPECT_EQ(a.output_tokens, b.output_tokens);
    EXPECT_EQ(a.block_ids, b.block_ids);
    EXPECT_NEAR(a.arrival_s, b.arrival_s, 0.0005 + 1e-12);  // rounded to whole ms
  }
}

TEST(WriteMooncake, RefusesBlocksOtherThan512Tokens) {
  testing::TempDir dir;
  Trace trace = MakeTrace({0});
  trace.block_tokens = 64;
  trace.requests[0].block_ids = {1, 2};
  Status status = WriteMooncake(trace, dir.File("t.jsonl"));
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"t.jsonl", "block_tokens 64"}));
}

TEST(WriteMooncake, UnwritablePathIsAnError) {
  Status status = WriteMooncake(MakeTrace({0}), "/nonexistent/dir/t.jsonl");
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"/nonexistent/dir/t.jsonl"}));
}

}  // namespace
}  // namespace duet::traces
