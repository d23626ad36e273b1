// Tests of the selections (ScaleRate, ScaleLengths, KeepFirst, KeepWindow), format names, ReadTrace
// dispatch and the Mooncake writer (key order and a write/read round trip).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

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

TEST(ScaleLengths, ShrinksPromptsOutputsAndPrefixBlocksAlike) {
  Trace trace = MakeTrace({0, 1});
  trace.block_tokens = 512;
  trace.requests[0].input_tokens = 1100;  // blocks 1, 2, 3 (the last partial)
  trace.requests[0].output_tokens = 40;
  trace.requests[0].block_ids = {1, 2, 3};
  trace.requests[1].input_tokens = 513;  // shares block 1; its second block holds one token
  trace.requests[1].output_tokens = 1;
  trace.requests[1].block_ids = {1, 9};
  ASSERT_TRUE(ScaleLengths(trace, 1.0 / 16).ok());
  EXPECT_EQ(trace.block_tokens, 32);
  EXPECT_EQ(trace.requests[0].input_tokens, 69);  // 68.75, rounded
  EXPECT_EQ(trace.requests[0].output_tokens, 3);  // 2.5, rounded away from zero
  EXPECT_EQ(trace.requests[0].block_ids, (std::vector<std::uint64_t>{1, 2, 3}));
  // 32.06 tokens round to one whole block: the id of the block left without tokens goes.
  EXPECT_EQ(trace.requests[1].input_tokens, 32);
  EXPECT_EQ(trace.requests[1].output_tokens, 1);  // never below one token
  EXPECT_EQ(trace.requests[1].block_ids, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(trace.requests[1].arrival_s, 1.0);  // arrivals are --rate-scale's
}

TEST(ScaleLengths, ASessionTurnContinuesItsParentsScaledContext) {
  Trace trace = MakeTrace({0, 5});
  trace.requests[0].input_tokens = 1000;
  trace.requests[0].output_tokens = 100;
  trace.requests[1].parent = 0;
  trace.requests[1].context_tokens = 1100;
  trace.requests[1].input_tokens = 1100 + 201;
  trace.requests[1].output_tokens = 51;
  ASSERT_TRUE(ScaleLengths(trace, 0.5).ok());
  EXPECT_EQ(trace.requests[0].input_tokens, 500);
  EXPECT_EQ(trace.requests[0].output_tokens, 50);
  EXPECT_EQ(trace.requests[1].context_tokens, 550);
  EXPECT_EQ(trace.requests[1].input_tokens, 550 + 101);  // 100.5 new tokens, rounded
  EXPECT_EQ(trace.requests[1].output_tokens, 26);
}

TEST(ScaleLengths, BadFactorIsAnErrorAndChangesNothing) {
  Trace with_blocks = MakeTrace({0, 1});
  with_blocks.requests[0].block_ids = {4};
  for (double factor : {0.0, -1.0, 0.3, 1e9, std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()}) {
    Trace trace = with_blocks;
    Status status = ScaleLengths(trace, factor);
    ASSERT_FALSE(status.ok()) << factor;
    EXPECT_TRUE(ContainsAll(status.message(), {"length scale factor"})) << status.message();
    EXPECT_EQ(trace.block_tokens, 512) << factor;
    EXPECT_EQ(trace.requests[1].input_tokens, 101) << factor;
  }
  Status whole = ScaleLengths(with_blocks, 0.3);
  EXPECT_TRUE(ContainsAll(whole.message(), {"512-token prefix blocks 153.6 tokens", "k/512"}))
      << whole.message();
  Status past = ScaleLengths(with_blocks, 1e8);
  EXPECT_TRUE(ContainsAll(past.message(), {"request 0's prompt", "past 1000000000"}))
      << past.message();
  // Without prefix blocks (Azure) any factor keeps the trace consistent.
  Trace no_blocks = MakeTrace({0, 1});
  ASSERT_TRUE(ScaleLengths(no_blocks, 0.3).ok());
  EXPECT_EQ(no_blocks.requests[1].input_tokens, 30);  // 30.3
}

TEST(ScaleLengths, TheMooncakeTraceKeepsItsPrefixSharingAtASixteenthOfItsLengths) {
  auto full = ReadTrace(testing::MooncakePath(), TraceFormat::kMooncake);
  ASSERT_TRUE(full.ok()) << full.error();
  Trace scaled = *full;
  ASSERT_TRUE(ScaleLengths(scaled, 0.0625).ok());
  EXPECT_EQ(scaled.block_tokens, 32);
  double input = 0, scaled_input = 0;
  std::size_t same_ids = 0;
  for (std::size_t i = 0; i < full->requests.size(); ++i) {
    input += static_cast<double>(full->requests[i].input_tokens);
    scaled_input += static_cast<double>(scaled.requests[i].input_tokens);
    same_ids += full->requests[i].block_ids == scaled.requests[i].block_ids;
    ASSERT_LE(scaled.requests[i].input_tokens,
              static_cast<Tokens>(scaled.requests[i].block_ids.size()) * 32)
        << "request " << i;
  }
  EXPECT_NEAR(scaled_input / input, 0.0625, 0.0005);
  // Only a block of at most 8 tokens, rounded away, loses its id.
  EXPECT_GT(same_ids, full->requests.size() * 95 / 100);
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

TEST(KeepWindow, DropsADependentWhoseParentIsOutsideAndKeepsOneWhoseParentIsInside) {
  Trace trace = MakeTrace({1, 3, 4, 4.5, 5, 6, 6, 20});
  // 1 continues 0 (outside the window), 2 continues 1: both go. 4 continues 3 (inside): kept.
  // 5 waits for 0 by `after`: goes. 6 waits for 3 and 4: kept. 7 is past the window.
  trace.requests[1].parent = 0;
  trace.requests[2].parent = 1;
  trace.requests[4].parent = 3;
  trace.requests[5].after = {0};
  trace.requests[6].after = {3, 4};
  EXPECT_TRUE(trace.HasDependencies());
  ASSERT_TRUE(KeepWindow(trace, 2, 10).ok());
  EXPECT_EQ(Ids(trace), (std::vector<std::uint64_t>{3, 4, 6}));
  EXPECT_EQ(trace.requests[0].arrival_s, 0.0);  // shifted by 4.5, the first kept arrival
  EXPECT_EQ(trace.requests[1].arrival_s, 0.5);
  EXPECT_EQ(trace.requests[1].parent, std::optional<std::uint64_t>(3));
  EXPECT_EQ(trace.requests[2].after, (std::vector<std::uint64_t>{3, 4}));
}

TEST(KeepWindow, DependentsOfADroppedDependentGoToo) {
  // Only the dependents are inside the window; nothing is left.
  Trace trace = MakeTrace({0, 5, 6});
  trace.requests[1].parent = 0;
  trace.requests[2].parent = 1;
  Status status = KeepWindow(trace, 1, 10);
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"no requests in window"}));
  EXPECT_EQ(trace.requests.size(), 3u);
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

// Every field of a request, dependencies included.
void ExpectSameRequest(const TraceRequest& a, const TraceRequest& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.arrival_s, b.arrival_s) << a.id;
  EXPECT_EQ(a.input_tokens, b.input_tokens) << a.id;
  EXPECT_EQ(a.output_tokens, b.output_tokens) << a.id;
  EXPECT_EQ(a.block_ids, b.block_ids) << a.id;
  EXPECT_EQ(a.parent, b.parent) << a.id;
  EXPECT_EQ(a.context_tokens, b.context_tokens) << a.id;
  EXPECT_EQ(a.after, b.after) << a.id;
  EXPECT_EQ(a.delay_s, b.delay_s) << a.id;
  EXPECT_EQ(a.session, b.session) << a.id;
}

// Sessions (a chain, a fork, a session without parent on its first line), `after`, delays and
// names that need JSON escapes: written and read back, the trace is the same.
constexpr const char* kSessionTrace =
    R"({"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2], "session_id": "chat \"1\"", "request_id": "root"})"
    "\n"
    R"({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [9], "request_id": 1})"
    "\n"
    R"({"input_length": 50, "output_length": 30, "session_id": "chat \"1\"", "delay": 1500})"
    "\n"
    R"({"timestamp": 1250, "input_length": 7, "output_length": 2, "parent": "root", "delay": 12})"
    "\n"
    R"({"timestamp": 1250, "input_length": 30, "output_length": 3, "hash_ids": [], "request_id": "x", "after": [1, "root"]})"
    "\n"
    R"({"timestamp": 1251, "input_length": 8, "output_length": 8, "hash_ids": [5], "session_id": 42, "after": ["x"], "delay": 1})"
    "\n"
    R"({"input_length": 9, "output_length": 9, "session_id": 42, "after": ["x"], "request_id": "last"})"
    "\n";

TEST(WriteMooncake, SessionTraceRoundTripsWithEveryField) {
  testing::TempDir dir;
  auto original = ReadMooncake(dir.Write("in.jsonl", kSessionTrace));
  ASSERT_TRUE(original.ok()) << original.error();
  ASSERT_EQ(original->requests.size(), 7u);
  // File order is arrival order here, so ids are positions in the written file too.
  for (std::size_t i = 0; i < 7; ++i) ASSERT_EQ(original->requests[i].id, i);
  EXPECT_EQ(original->requests[6].parent, std::optional<std::uint64_t>(5));
  EXPECT_EQ(original->requests[6].after, (std::vector<std::uint64_t>{4}));

  ASSERT_TRUE(WriteMooncake(*original, dir.File("out.jsonl")).ok());
  auto read = ReadMooncake(dir.File("out.jsonl"));
  ASSERT_TRUE(read.ok()) << read.error();
  ASSERT_EQ(read->requests.size(), original->requests.size());
  for (std::size_t i = 0; i < read->requests.size(); ++i) {
    ExpectSameRequest(original->requests[i], read->requests[i]);
  }
  // Written twice, the file is the same.
  ASSERT_TRUE(WriteMooncake(*read, dir.File("again.jsonl")).ok());
  std::ifstream a(dir.File("out.jsonl")), b(dir.File("again.jsonl"));
  std::stringstream text_a, text_b;
  text_a << a.rdbuf();
  text_b << b.rdbuf();
  EXPECT_EQ(text_a.str(), text_b.str());
}

TEST(WriteMooncake, DependencyLinesKeepTheirShape) {
  testing::TempDir dir;
  Trace trace = MakeTrace({0, 0, 1});
  trace.requests[0].session = "s";
  trace.requests[1].session = "s";
  trace.requests[1].parent = 0;
  trace.requests[1].context_tokens = 101;  // 100 + 1
  trace.requests[1].input_tokens = 101 + 5;
  trace.requests[1].delay_s = 2.5;
  trace.requests[2].after = {0, 1};
  ASSERT_TRUE(WriteMooncake(trace, dir.File("t.jsonl")).ok());
  std::ifstream in(dir.File("t.jsonl"));
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(
      lines[0],
      R"({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [], "request_id": 0, "session_id": "s"})");
  EXPECT_EQ(
      lines[1],
      R"({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [], "request_id": 1, "session_id": "s", "parent": 0, "delay": 2500})");
  EXPECT_EQ(
      lines[2],
      R"({"timestamp": 1000, "input_length": 102, "output_length": 3, "hash_ids": [], "after": [0, 1]})");
}

TEST(WriteMooncake, SortedTraceGetsRenumberedReferences) {
  // Timestamps going backwards: after sorting, ids are no longer positions. The written file
  // names requests by their new lines, and reading it back gives the same dependencies.
  testing::TempDir dir;
  auto original = ReadMooncake(dir.Write(
      "in.jsonl",
      R"({"timestamp": 900, "input_length": 10, "output_length": 1, "hash_ids": [1], "session_id": "a"})"
      "\n"
      R"({"timestamp": 100, "input_length": 20, "output_length": 2, "hash_ids": [2], "session_id": "b"})"
      "\n"
      R"({"input_length": 3, "output_length": 1, "session_id": "a", "delay": 100})"
      "\n"
      R"({"input_length": 4, "output_length": 1, "session_id": "b", "delay": 200})"
      "\n"));
  ASSERT_TRUE(original.ok()) << original.error();
  EXPECT_EQ(Ids(*original), (std::vector<std::uint64_t>{1, 3, 0, 2}));
  ASSERT_TRUE(WriteMooncake(*original, dir.File("out.jsonl")).ok());
  auto read = ReadMooncake(dir.File("out.jsonl"));
  ASSERT_TRUE(read.ok()) << read.error();
  EXPECT_EQ(Ids(*read), (std::vector<std::uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(read->requests[1].parent, std::optional<std::uint64_t>(0));
  EXPECT_EQ(read->requests[3].parent, std::optional<std::uint64_t>(2));
  for (std::size_t i = 0; i < 4; ++i) {
    const TraceRequest& a = original->requests[i];
    const TraceRequest& b = read->requests[i];
    EXPECT_EQ(a.arrival_s, b.arrival_s);
    EXPECT_EQ(a.input_tokens, b.input_tokens);
    EXPECT_EQ(a.context_tokens, b.context_tokens);
    EXPECT_EQ(a.delay_s, b.delay_s);
    EXPECT_EQ(a.session, b.session);
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

// What the reader would refuse is not written: a request that depends on itself, or has a
// delay but follows nothing.
TEST(WriteMooncake, RefusesDependenciesTheReaderWouldRefuse) {
  testing::TempDir dir;
  Trace self = MakeTrace({0, 1});
  self.requests[1].parent = self.requests[1].id;
  Status status = WriteMooncake(self, dir.File("t.jsonl"));
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"t.jsonl", "request 1", "not before it"}));
  Trace delay = MakeTrace({0, 1});
  delay.requests[1].delay_s = 0.5;
  status = WriteMooncake(delay, dir.File("t.jsonl"));
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"request 1", "delay but follows no request"}));
}

TEST(WriteMooncake, UnwritablePathIsAnError) {
  Status status = WriteMooncake(MakeTrace({0}), "/nonexistent/dir/t.jsonl");
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(ContainsAll(status.message(), {"/nonexistent/dir/t.jsonl"}));
}

}  // namespace
}  // namespace duet::traces
