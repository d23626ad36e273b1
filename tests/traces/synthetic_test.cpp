// Tests of the synthetic generator and its spec parser: determinism per seed, arrival rate and
// burstiness within statistical tolerance, length distributions and clamps, lengths sampled
// from real traces, the shared-prefix block structure, spec validation and the bundled specs.
#include "traces/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "tests/traces/test_util.h"

namespace duet::traces {
namespace {

using testing::ContainsAll;

SyntheticSpec BaseSpec(std::size_t n) {
  SyntheticSpec spec;
  spec.num_requests = n;
  spec.rate_per_s = 4.0;
  spec.input.kind = LengthDist::Kind::kFixed;
  spec.input.value = 100;
  spec.output.kind = LengthDist::Kind::kFixed;
  spec.output.value = 10;
  return spec;
}

Trace Generate(const SyntheticSpec& spec) {
  auto trace = GenerateSynthetic(spec);
  EXPECT_TRUE(trace.ok()) << trace.error();
  return trace.ok() ? std::move(*trace) : Trace{};
}

struct Moments {
  double mean = 0, cv = 0;
};

Moments GapMoments(const Trace& trace) {
  std::vector<double> gaps;
  for (std::size_t i = 1; i < trace.requests.size(); ++i) {
    gaps.push_back(trace.requests[i].arrival_s - trace.requests[i - 1].arrival_s);
  }
  double sum = 0, sum_sq = 0;
  for (double g : gaps) sum += g;
  const double mean = sum / static_cast<double>(gaps.size());
  for (double g : gaps) sum_sq += (g - mean) * (g - mean);
  const double sd = std::sqrt(sum_sq / static_cast<double>(gaps.size() - 1));
  return {mean, sd / mean};
}

Result<SyntheticSpec> ParseText(const std::string& text, const std::string& base_dir = "") {
  return ParseSyntheticSpec(nlohmann::json::parse(text), "specs/s.json", base_dir);
}

constexpr const char* kMinimalSpec = R"({
  "num_requests": 10,
  "arrival": {"process": "poisson", "rate_per_s": 2.0},
  "input": {"dist": "fixed", "value": 100},
  "output": {"dist": "uniform", "min": 1, "max": 9}})";

// ---- Determinism -----------------------------------------------------------------------------

TEST(SyntheticDeterminism, SameSeedSameTraceOtherSeedDifferent) {
  SyntheticSpec spec = BaseSpec(300);
  spec.arrival = SyntheticSpec::Arrival::kGamma;
  spec.gamma_cv = 1.5;
  spec.input = {LengthDist::Kind::kLognormal, 0, 1, 50000, 2000, 0.9, "", {}};
  spec.output = {LengthDist::Kind::kUniform, 0, 1, 500, 0, 0, "", {}};
  spec.prefix_groups = 4;
  spec.prefix_tokens = 1024;
  spec.prefix_zipf = 1.0;
  spec.seed = 11;
  const Trace a = Generate(spec);
  const Trace b = Generate(spec);
  spec.seed = 12;
  const Trace c = Generate(spec);
  ASSERT_EQ(a.requests.size(), 300u);
  ASSERT_EQ(b.requests.size(), 300u);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < 300; ++i) {
    EXPECT_EQ(a.requests[i].id, i);
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s);
    EXPECT_EQ(a.requests[i].input_tokens, b.requests[i].input_tokens);
    EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens);
    EXPECT_EQ(a.requests[i].block_ids, b.requests[i].block_ids);
    if (a.requests[i].input_tokens != c.requests[i].input_tokens ||
        a.requests[i].arrival_s != c.requests[i].arrival_s) {
      ++differing;
    }
  }
  EXPECT_GT(differing, 250u);
}

// Uniform lengths use only std::mt19937_64 (fixed by the standard) and integer arithmetic, so
// these values must be the same with every compiler and standard library. They were checked
// against an independent mt19937_64 in Python: request i's input is 1 + (draw 2i) % 1000 (draw
// 2i-1 is request i's arrival gap; no draw was rejected).
TEST(SyntheticDeterminism, UniformLengthsArePortable) {
  SyntheticSpec spec = BaseSpec(6);
  spec.input = {LengthDist::Kind::kUniform, 0, 1, 1000, 0, 0, "", {}};
  spec.seed = 42;
  const Trace trace = Generate(spec);
  std::vector<Tokens> inputs;
  for (const auto& r : trace.requests) inputs.push_back(r.input_tokens);
  EXPECT_EQ(inputs, (std::vector<Tokens>{407, 451, 382, 537, 551, 596}));
}

// ---- Arrivals --------------------------------------------------------------------------------

TEST(SyntheticArrivals, FirstArrivalIsZeroAndSorted) {
  const Trace trace = Generate(BaseSpec(1000));
  EXPECT_EQ(trace.requests.front().arrival_s, 0.0);
  for (std::size_t i = 1; i < trace.requests.size(); ++i) {
    ASSERT_LE(trace.requests[i - 1].arrival_s, trace.requests[i].arrival_s);
  }
  EXPECT_EQ(trace.source, "synthetic");
}

TEST(SyntheticArrivals, PoissonRateAndCv) {
  SyntheticSpec spec = BaseSpec(20000);
  spec.rate_per_s = 5.0;
  const Moments m = GapMoments(Generate(spec));
  // Mean gap 0.2 s; its standard error is 0.7%, so 3% is over 4 sigma.
  EXPECT_NEAR(m.mean, 0.2, 0.2 * 0.03);
  EXPECT_NEAR(m.cv, 1.0, 0.05);  // exponential gaps have CV 1
}

TEST(SyntheticArrivals, GammaRateAndCv) {
  for (double cv : {0.5, 2.0, 4.0}) {
    SyntheticSpec spec = BaseSpec(20000);
    spec.arrival = SyntheticSpec::Arrival::kGamma;
    spec.rate_per_s = 10.0;
    spec.gamma_cv = cv;
    spec.seed = 3;
    const Moments m = GapMoments(Generate(spec));
    // Standard error of the mean gap: cv / sqrt(n) (2.8% at cv 4); tolerance ~4 sigma.
    EXPECT_NEAR(m.mean, 0.1, 0.1 * 0.04 * std::max(1.0, cv)) << "cv " << cv;
    // The sample CV of heavy-tailed gaps is noisier; 10% still separates cv 0.5/1/2/4.
    EXPECT_NEAR(m.cv, cv, cv * 0.10) << "cv " << cv;
  }
}

// ---- Lengths ---------------------------------------------------------------------------------

TEST(SyntheticLengths, FixedIsExact) {
  const Trace trace = Generate(BaseSpec(200));
  for (const auto& r : trace.requests) {
    EXPECT_EQ(r.input_tokens, 100);
    EXPECT_EQ(r.output_tokens, 10);
    EXPECT_EQ(r.block_ids.size(), 1u);  // 100 tokens: one partial 512-token block
  }
}

TEST(SyntheticLengths, UniformCoversRangeEvenly) {
  SyntheticSpec spec = BaseSpec(18000);
  spec.output = {LengthDist::Kind::kUniform, 0, 3, 11, 0, 0, "", {}};
  std::map<Tokens, int> counts;
  for (const auto& r : Generate(spec).requests) ++counts[r.output_tokens];
  ASSERT_EQ(counts.size(), 9u);  // every value 3..11, nothing else
  EXPECT_EQ(counts.begin()->first, 3);
  EXPECT_EQ(counts.rbegin()->first, 11);
  for (const auto& [value, count] : counts) EXPECT_NEAR(count, 2000, 200) << value;
}

TEST(SyntheticLengths, LognormalMeanWithinTolerance) {
  SyntheticSpec spec = BaseSpec(20000);
  spec.input = {LengthDist::Kind::kLognormal, 0, 1, 1'000'000, 3000, 0.9, "", {}};
  std::vector<double> inputs;
  double sum = 0;
  for (const auto& r : Generate(spec).requests) {
    sum += static_cast<double>(r.input_tokens);
    inputs.push_back(static_cast<double>(r.input_tokens));
  }
  // Standard error of the mean: sqrt(exp(0.81) - 1) / sqrt(n) = 0.75%; tolerance 3%.
  EXPECT_NEAR(sum / 20000, 3000, 90);
  // The median is exp(mu) = 3000 * exp(-0.81 / 2) = 2000.
  std::nth_element(inputs.begin(), inputs.begin() + 10000, inputs.end());
  EXPECT_NEAR(inputs[10000], 2000.6, 60);
}

TEST(SyntheticLengths, ClampsRespectMinAndMax) {
  SyntheticSpec spec = BaseSpec(5000);
  spec.input = {LengthDist::Kind::kLognormal, 0, 500, 2000, 1000, 1.5, "", {}};
  Tokens lo = 1'000'000, hi = 0;
  for (const auto& r : Generate(spec).requests) {
    lo = std::min(lo, r.input_tokens);
    hi = std::max(hi, r.input_tokens);
  }
  EXPECT_EQ(lo, 500);  // sigma 1.5 puts plenty of mass beyond both bounds
  EXPECT_EQ(hi, 2000);
}

TEST(SyntheticLengths, JointSamplingFromTheRealTraceKeepsPairs) {
  auto real = ReadMooncake(testing::MooncakePath());
  ASSERT_TRUE(real.ok()) << real.error();
  std::set<std::pair<Tokens, Tokens>> pairs;
  for (const auto& r : real->requests) pairs.insert({r.input_tokens, r.output_tokens});

  SyntheticSpec spec = BaseSpec(2000);
  spec.input.kind = spec.output.kind = LengthDist::Kind::kTrace;
  spec.input.trace_path = spec.output.trace_path = testing::MooncakePath();
  spec.input.min = spec.output.min = 1;
  spec.input.max = spec.output.max = 1'000'000;
  std::set<std::pair<Tokens, Tokens>> seen;
  for (const auto& r : Generate(spec).requests) {
    ASSERT_TRUE(pairs.count({r.input_tokens, r.output_tokens}))
        << r.input_tokens << "," << r.output_tokens;
    seen.insert({r.input_tokens, r.output_tokens});
  }
  EXPECT_GT(seen.size(), 1500u);  // drawn across the trace, not one row repeated
}

TEST(SyntheticLengths, IndependentSamplingFromTwoTraces) {
  auto azure = ReadAzure(testing::AzurePath());
  auto mooncake = ReadMooncake(testing::MooncakePath());
  ASSERT_TRUE(azure.ok() && mooncake.ok());
  std::set<Tokens> mooncake_inputs, azure_outputs;
  for (const auto& r : mooncake->requests) mooncake_inputs.insert(r.input_tokens);
  for (const auto& r : azure->requests) azure_outputs.insert(r.output_tokens);

  SyntheticSpec spec = BaseSpec(1000);
  spec.input = {LengthDist::Kind::kTrace, 0, 1, 1'000'000, 0, 0, testing::MooncakePath(),
                TraceFormat::kMooncake};
  spec.output = {LengthDist::Kind::kTrace, 0, 1, 1'000'000, 0, 0, testing::AzurePath(),
                 TraceFormat::kAzure};
  for (const auto& r : Generate(spec).requests) {
    ASSERT_TRUE(mooncake_inputs.count(r.input_tokens)) << r.input_tokens;
    ASSERT_TRUE(azure_outputs.count(r.output_tokens)) << r.output_tokens;
  }
}

TEST(SyntheticLengths, TraceSampledSpecResolvesRelativePathAndClamps) {
  testing::TempDir dir;
  // Output = input / 100 in every row: joint sampling keeps that; clamps apply per field.
  dir.Write("small.jsonl",
            R"({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1]})"
            "\n"
            R"({"timestamp": 5, "input_length": 200, "output_length": 2, "hash_ids": [2]})"
            "\n"
            R"({"timestamp": 9, "input_length": 900, "output_length": 9, "hash_ids": [3, 4]})"
            "\n");
  const std::string spec_path = dir.Write("spec.json", R"({
    "num_requests": 300, "seed": 5,
    "arrival": {"process": "poisson", "rate_per_s": 1},
    "input": {"dist": "trace", "path": "small.jsonl", "format": "mooncake", "max": 800},
    "output": {"dist": "trace", "path": "small.jsonl"}})");
  auto trace = ReadTrace(spec_path, TraceFormat::kSynthetic);
  ASSERT_TRUE(trace.ok()) << trace.error();
  std::set<Tokens> outputs;
  for (const auto& r : trace->requests) {
    const Tokens expected_input = std::min<Tokens>(r.output_tokens * 100, 800);
    EXPECT_EQ(r.input_tokens, expected_input);
    outputs.insert(r.output_tokens);
  }
  EXPECT_EQ(outputs, (std::set<Tokens>{1, 2, 9}));
}

TEST(SyntheticLengths, MissingTraceFileIsAnError) {
  SyntheticSpec spec = BaseSpec(10);
  spec.input = {LengthDist::Kind::kTrace, 0, 1, 100, 0, 0, "/nonexistent/t.jsonl",
                TraceFormat::kMooncake};
  auto trace = GenerateSynthetic(spec);
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"input", "/nonexistent/t.jsonl"}));
}

// ---- Shared prefixes -------------------------------------------------------------------------

// Checks the block structure: ids of the first `shared_blocks` positions are shared exactly by
// requests of one group (same first id) and appear nowhere else; every later id is unique.
void CheckPrefixStructure(const Trace& trace, std::size_t shared_blocks,
                          std::size_t expected_groups) {
  std::map<std::uint64_t, std::vector<std::uint64_t>> group_prefix;  // first id -> prefix ids
  std::map<std::uint64_t, std::size_t> position_of;                  // id -> block position
  std::set<std::uint64_t> unique_ids;
  for (const auto& r : trace.requests) {
    ASSERT_GT(r.block_ids.size(), shared_blocks);
    std::vector<std::uint64_t> prefix(r.block_ids.begin(), r.block_ids.begin() + shared_blocks);
    if (shared_blocks > 0) {
      auto [it, inserted] = group_prefix.emplace(prefix.front(), prefix);
      EXPECT_EQ(it->second, prefix) << "request " << r.id << " shares a first block only";
    }
    for (std::size_t b = 0; b < r.block_ids.size(); ++b) {
      const std::uint64_t id = r.block_ids[b];
      if (b < shared_blocks) {
        auto [it, inserted] = position_of.emplace(id, b);
        EXPECT_EQ(it->second, b) << "prefix id " << id << " at two positions";
        EXPECT_FALSE(unique_ids.count(id)) << "prefix id " << id << " reused after the prefix";
      } else {
        EXPECT_TRUE(unique_ids.insert(id).second) << "id " << id << " after the prefix reused";
        EXPECT_FALSE(position_of.count(id)) << "id " << id << " also used in a prefix";
      }
    }
  }
  // Different groups share no id: prefixes of distinct groups are disjoint.
  std::set<std::uint64_t> all_prefix_ids;
  for (const auto& [first, prefix] : group_prefix) {
    for (std::uint64_t id : prefix) EXPECT_TRUE(all_prefix_ids.insert(id).second) << id;
  }
  if (shared_blocks > 0) {
    EXPECT_EQ(group_prefix.size(), expected_groups);
  }
}

TEST(SyntheticPrefix, GroupsShareExactlyThePrefixBlocks) {
  SyntheticSpec spec = BaseSpec(2000);
  spec.input = {LengthDist::Kind::kUniform, 0, 1, 3000, 0, 0, "", {}};
  spec.prefix_groups = 6;
  spec.prefix_tokens = 1024;  // two full blocks
  const Trace trace = Generate(spec);
  for (const auto& r : trace.requests) {
    EXPECT_GE(r.input_tokens, 1025);  // prefix + at least one token of its own
    EXPECT_LE(r.input_tokens, 1024 + 3000);
    EXPECT_EQ(static_cast<Tokens>(r.block_ids.size()), (r.input_tokens + 511) / 512);
  }
  CheckPrefixStructure(trace, 2, 6);
}

TEST(SyntheticPrefix, PartialPrefixBlockIsUnique) {
  SyntheticSpec spec = BaseSpec(500);
  spec.prefix_groups = 3;
  spec.prefix_tokens = 1000;  // one full block; tokens 512..999 share a block with the suffix
  const Trace trace = Generate(spec);
  for (const auto& r : trace.requests) EXPECT_EQ(r.input_tokens, 1100);
  CheckPrefixStructure(trace, 1, 3);
}

TEST(SyntheticPrefix, NoGroupsMeansEveryBlockUnique) {
  SyntheticSpec spec = BaseSpec(300);
  spec.input.value = 2000;
  const Trace trace = Generate(spec);
  for (const auto& r : trace.requests) EXPECT_EQ(r.input_tokens, 2000);
  CheckPrefixStructure(trace, 0, 0);
}

TEST(SyntheticPrefix, ZipfAndUniformGroupFrequencies) {
  SyntheticSpec spec = BaseSpec(20000);
  spec.prefix_groups = 8;
  spec.prefix_tokens = 512;
  spec.prefix_zipf = 1.0;
  std::map<std::uint64_t, int> counts;  // first block id == group index (one prefix block)
  for (const auto& r : Generate(spec).requests) ++counts[r.block_ids[0]];
  double harmonic = 0;
  for (int g = 1; g <= 8; ++g) harmonic += 1.0 / g;
  for (std::uint64_t g = 0; g < 8; ++g) {
    EXPECT_NEAR(counts[g] / 20000.0, 1.0 / (g + 1) / harmonic, 0.012) << "group " << g;
  }

  spec.prefix_zipf = 0;
  counts.clear();
  for (const auto& r : Generate(spec).requests) ++counts[r.block_ids[0]];
  ASSERT_EQ(counts.size(), 8u);
  for (const auto& [g, count] : counts) EXPECT_NEAR(count / 20000.0, 0.125, 0.012) << g;
}

// ---- Sessions --------------------------------------------------------------------------------

// "s<i>" (built by appending: GCC 12 warns falsely about "s" + std::to_string(i)).
std::string SessionName(std::size_t i) {
  std::string name = "s";
  name += std::to_string(i);
  return name;
}

// BaseSpec (inputs 100, outputs 10 tokens) in sessions of `turns` turns adding 20 tokens each,
// 1.5 s apart.
SyntheticSpec SessionSpecOf(std::size_t n, Tokens turns) {
  SyntheticSpec spec = BaseSpec(n);
  SessionSpec sessions;
  sessions.turns = FixedLength(turns);
  sessions.new_tokens = FixedLength(20);
  sessions.think_time_ms = FixedLength(1500);
  spec.sessions = sessions;
  return spec;
}

TEST(SyntheticSessions, FixedTurnsGiveHandComputedPromptsAndContexts) {
  // 7 requests in sessions of 3: s0 and s1 complete, s2 cut short after its first turn.
  const Trace trace = Generate(SessionSpecOf(7, 3));
  ASSERT_EQ(trace.requests.size(), 7u);
  EXPECT_TRUE(trace.HasDependencies());
  // Turn 1: 100 + 10. Turn 2: 110 of context + 20 new = 130, + 10. Turn 3: 140 + 20 = 160.
  const Tokens inputs[] = {100, 130, 160, 100, 130, 160, 100};
  const Tokens contexts[] = {0, 110, 140, 0, 110, 140, 0};
  for (std::size_t i = 0; i < 7; ++i) {
    const TraceRequest& r = trace.requests[i];
    const std::size_t turn = i % 3;  // 0-based
    EXPECT_EQ(r.id, i);
    EXPECT_EQ(r.input_tokens, inputs[i]) << i;
    EXPECT_EQ(r.output_tokens, 10) << i;
    EXPECT_EQ(r.context_tokens, contexts[i]) << i;
    EXPECT_EQ(r.session, SessionName(i / 3)) << i;
    EXPECT_TRUE(r.after.empty());
    // Every turn arrives at its session's start, a lower bound for the later ones.
    EXPECT_EQ(r.arrival_s, trace.requests[i - turn].arrival_s) << i;
    if (turn == 0) {
      EXPECT_FALSE(r.parent) << i;
      EXPECT_EQ(r.delay_s, 0.0) << i;
      EXPECT_EQ(r.block_ids.size(), 1u) << i;
    } else {
      EXPECT_EQ(r.parent, std::optional<std::uint64_t>(i - 1)) << i;
      EXPECT_EQ(r.delay_s, 1.5) << i;
      EXPECT_TRUE(r.block_ids.empty()) << i;
    }
  }
  EXPECT_EQ(trace.requests[0].arrival_s, 0.0);
  EXPECT_GT(trace.requests[3].arrival_s, 0.0);
  EXPECT_GE(trace.requests[6].arrival_s, trace.requests[3].arrival_s);
  // First turns get unique blocks as without sessions.
  EXPECT_NE(trace.requests[0].block_ids, trace.requests[3].block_ids);
}

TEST(SyntheticSessions, FirstTurnsShareTheSystemPrompt) {
  SyntheticSpec spec = SessionSpecOf(20, 2);
  spec.prefix_groups = 1;
  spec.prefix_tokens = 512;
  const Trace trace = Generate(spec);
  ASSERT_EQ(trace.requests.size(), 20u);
  for (std::size_t i = 0; i < 20; i += 2) {
    const TraceRequest& first = trace.requests[i];
    const TraceRequest& second = trace.requests[i + 1];
    EXPECT_EQ(first.input_tokens, 612);
    ASSERT_EQ(first.block_ids.size(), 2u);
    EXPECT_EQ(first.block_ids[0], 0u);  // the group's one prefix block
    EXPECT_EQ(second.context_tokens, 622);
    EXPECT_EQ(second.input_tokens, 642);
    EXPECT_TRUE(second.block_ids.empty());
  }
}

TEST(SyntheticSessions, MaxContextTokensEndsSessionsEarly) {
  // Turn 2 needs 130 + 10 = 140 tokens, turn 3 160 + 10 = 170: with a limit of 150 every
  // session stops after two turns, and 6 requests take 3 sessions.
  SyntheticSpec spec = SessionSpecOf(6, 5);
  spec.sessions->max_context_tokens = 150;
  Trace trace = Generate(spec);
  ASSERT_EQ(trace.requests.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(trace.requests[i].session, SessionName(i / 2)) << i;
    EXPECT_EQ(trace.requests[i].parent.has_value(), i % 2 == 1) << i;
  }
  // 140 fits exactly.
  spec.sessions->max_context_tokens = 140;
  trace = Generate(spec);
  EXPECT_EQ(trace.requests[1].parent, std::optional<std::uint64_t>(0));
  // Below 140 every session is its first turn alone, which is never cut.
  spec.sessions->max_context_tokens = 139;
  trace = Generate(spec);
  ASSERT_EQ(trace.requests.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_FALSE(trace.requests[i].parent) << i;
    EXPECT_EQ(trace.requests[i].session, SessionName(i)) << i;
  }
  EXPECT_FALSE(trace.HasDependencies());
}

TEST(SyntheticSessions, SameSeedSameTraceOtherSeedDifferent) {
  SyntheticSpec spec = BaseSpec(400);
  spec.input = {LengthDist::Kind::kLognormal, 0, 1, 50000, 2000, 0.9, "", {}};
  spec.output = {LengthDist::Kind::kUniform, 0, 1, 500, 0, 0, "", {}};
  spec.prefix_groups = 3;
  spec.prefix_tokens = 700;
  SessionSpec sessions;
  sessions.turns = {LengthDist::Kind::kUniform, 0, 1, 6, 0, 0, "", {}};
  sessions.new_tokens = {LengthDist::Kind::kLognormal, 0, 1, 4000, 300, 1.0, "", {}};
  sessions.think_time_ms = {LengthDist::Kind::kUniform, 0, 0, 20000, 0, 0, "", {}};
  sessions.max_context_tokens = 30000;
  spec.sessions = sessions;
  spec.seed = 5;
  const Trace a = Generate(spec);
  const Trace b = Generate(spec);
  spec.seed = 6;
  const Trace c = Generate(spec);
  ASSERT_EQ(a.requests.size(), 400u);
  ASSERT_EQ(b.requests.size(), 400u);
  ASSERT_EQ(c.requests.size(), 400u);
  std::size_t differing = 0, follow_ups = 0;
  std::set<Tokens> turn_counts;
  for (std::size_t i = 0; i < 400; ++i) {
    const TraceRequest& x = a.requests[i];
    const TraceRequest& y = b.requests[i];
    EXPECT_EQ(x.id, i);
    EXPECT_EQ(x.arrival_s, y.arrival_s);
    EXPECT_EQ(x.input_tokens, y.input_tokens);
    EXPECT_EQ(x.output_tokens, y.output_tokens);
    EXPECT_EQ(x.block_ids, y.block_ids);
    EXPECT_EQ(x.parent, y.parent);
    EXPECT_EQ(x.context_tokens, y.context_tokens);
    EXPECT_EQ(x.delay_s, y.delay_s);
    EXPECT_EQ(x.session, y.session);
    if (i > 0) {
      ASSERT_LE(a.requests[i - 1].arrival_s, x.arrival_s);
    }
    if (x.parent) {
      ++follow_ups;
      const TraceRequest& parent = a.requests[*x.parent];
      EXPECT_EQ(*x.parent, i - 1);
      EXPECT_EQ(x.context_tokens, parent.input_tokens + parent.output_tokens);
      EXPECT_GE(x.input_tokens, x.context_tokens + 1);
      EXPECT_LE(x.input_tokens, x.context_tokens + 4000);
      EXPECT_LE(x.input_tokens + x.output_tokens, 30000);
      EXPECT_GE(x.delay_s, 0.0);
      EXPECT_LE(x.delay_s, 20.0);
      EXPECT_EQ(x.session, parent.session);
      EXPECT_EQ(x.arrival_s, parent.arrival_s);
    } else {
      EXPECT_EQ(static_cast<Tokens>(x.block_ids.size()), (x.input_tokens + 511) / 512);
    }
    if (x.input_tokens != c.requests[i].input_tokens || x.arrival_s != c.requests[i].arrival_s) {
      ++differing;
    }
  }
  // Uniform 1..6 turns: about 5/6 of the requests follow another.
  EXPECT_GT(follow_ups, 250u);
  EXPECT_GT(differing, 300u);
}

TEST(SyntheticSessions, WithoutSessionsTheTraceIsUnchanged) {
  // An empty session spec is not the same as none: none keeps the draws of a plain trace.
  SyntheticSpec spec = BaseSpec(6);
  spec.input = {LengthDist::Kind::kUniform, 0, 1, 1000, 0, 0, "", {}};
  spec.seed = 42;
  const Trace plain = Generate(spec);
  for (const auto& r : plain.requests) {
    EXPECT_FALSE(r.HasDependencies());
    EXPECT_EQ(r.session, "");
  }
  // Sessions of one turn draw the turns too, so their inputs differ from the plain trace's.
  spec.sessions = SessionSpec{};
  spec.sessions->new_tokens = FixedLength(1);
  const Trace single = Generate(spec);
  ASSERT_EQ(single.requests.size(), 6u);
  EXPECT_FALSE(single.HasDependencies());
  EXPECT_EQ(single.requests[5].session, "s5");
}

TEST(SyntheticSessions, NewTokensSampledFromATrace) {
  testing::TempDir dir;
  const std::string path = dir.Write(
      "small.jsonl", R"({"timestamp": 0, "input_length": 7, "output_length": 1, "hash_ids": [1]})"
                     "\n"
                     R"({"timestamp": 5, "input_length": 9, "output_length": 2, "hash_ids": [2]})"
                     "\n");
  SyntheticSpec spec = SessionSpecOf(200, 4);
  spec.sessions->new_tokens = {LengthDist::Kind::kTrace, 0, 1, 8, 0, 0, path,
                               TraceFormat::kMooncake};
  std::set<Tokens> added;
  for (const auto& r : Generate(spec).requests) {
    if (r.parent) added.insert(r.input_tokens - r.context_tokens);
  }
  EXPECT_EQ(added, (std::set<Tokens>{7, 8}));  // 9 clamped to max 8
}

TEST(SyntheticSessions, RoundTripsThroughMooncake) {
  SyntheticSpec spec = BaseSpec(300);
  spec.rate_per_s = 2;
  spec.input = {LengthDist::Kind::kUniform, 0, 1, 3000, 0, 0, "", {}};
  spec.output = {LengthDist::Kind::kUniform, 0, 1, 300, 0, 0, "", {}};
  spec.prefix_groups = 4;
  spec.prefix_tokens = 1024;
  SessionSpec sessions;
  sessions.turns = {LengthDist::Kind::kUniform, 0, 1, 5, 0, 0, "", {}};
  sessions.new_tokens = {LengthDist::Kind::kUniform, 0, 1, 500, 0, 0, "", {}};
  sessions.think_time_ms = {LengthDist::Kind::kLognormal, 0, 0, 60000, 3000, 1.0, "", {}};
  spec.sessions = sessions;
  spec.seed = 9;
  const Trace generated = Generate(spec);
  ASSERT_EQ(generated.requests.size(), 300u);

  testing::TempDir dir;
  ASSERT_TRUE(WriteMooncake(generated, dir.File("sessions.jsonl")).ok());
  auto read = ReadMooncake(dir.File("sessions.jsonl"));
  ASSERT_TRUE(read.ok()) << read.error();
  ASSERT_EQ(read->requests.size(), generated.requests.size());
  for (std::size_t i = 0; i < read->requests.size(); ++i) {
    const TraceRequest& a = generated.requests[i];
    const TraceRequest& b = read->requests[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_NEAR(a.arrival_s, b.arrival_s, 0.0005 + 1e-12);  // rounded to whole ms
    EXPECT_EQ(a.input_tokens, b.input_tokens);
    EXPECT_EQ(a.output_tokens, b.output_tokens);
    EXPECT_EQ(a.block_ids, b.block_ids);
    EXPECT_EQ(a.parent, b.parent);
    EXPECT_EQ(a.context_tokens, b.context_tokens);
    EXPECT_EQ(a.after, b.after);
    EXPECT_EQ(a.delay_s, b.delay_s);  // whole ms
    EXPECT_EQ(a.session, b.session);
  }
}

TEST(SyntheticSessions, ParsesTheSessionsObject) {
  auto spec = ParseText(R"({
    "num_requests": 10,
    "arrival": {"process": "poisson", "rate_per_s": 2.0},
    "input": {"dist": "fixed", "value": 100},
    "output": {"dist": "fixed", "value": 10},
    "sessions": {"turns": {"dist": "lognormal", "mean": 4, "sigma": 0.5},
                 "new_tokens": {"dist": "uniform", "min": 5, "max": 50},
                 "think_time_ms": {"dist": "uniform", "min": 0, "max": 3600000},
                 "max_context_tokens": 32768}})");
  ASSERT_TRUE(spec.ok()) << spec.error();
  ASSERT_TRUE(spec->sessions);
  EXPECT_EQ(spec->sessions->turns.kind, LengthDist::Kind::kLognormal);
  EXPECT_EQ(spec->sessions->turns.min, 1);
  EXPECT_EQ(spec->sessions->turns.max, 10000);  // the default clamp of turns
  EXPECT_EQ(spec->sessions->new_tokens.min, 5);
  EXPECT_EQ(spec->sessions->new_tokens.max, 50);
  EXPECT_EQ(spec->sessions->think_time_ms.min, 0);
  EXPECT_EQ(spec->sessions->think_time_ms.max, 3600000);
  EXPECT_EQ(spec->sessions->max_context_tokens, 32768);

  auto minimal = ParseText(R"({
    "num_requests": 10,
    "arrival": {"process": "poisson", "rate_per_s": 2.0},
    "input": {"dist": "fixed", "value": 100},
    "output": {"dist": "fixed", "value": 10},
    "sessions": {"turns": {"dist": "fixed", "value": 3},
                 "new_tokens": {"dist": "fixed", "value": 20}}})");
  ASSERT_TRUE(minimal.ok()) << minimal.error();
  EXPECT_EQ(minimal->sessions->think_time_ms.kind, LengthDist::Kind::kFixed);
  EXPECT_EQ(minimal->sessions->think_time_ms.value, 0);  // no think time by default
  EXPECT_EQ(minimal->sessions->max_context_tokens, 0);   // no limit by default
  EXPECT_FALSE(ParseText(kMinimalSpec)->sessions);
  auto think_lognormal = ParseText(R"({
    "num_requests": 10,
    "arrival": {"process": "poisson", "rate_per_s": 2.0},
    "input": {"dist": "fixed", "value": 100},
    "output": {"dist": "fixed", "value": 10},
    "sessions": {"turns": {"dist": "fixed", "value": 3},
                 "new_tokens": {"dist": "fixed", "value": 20},
                 "think_time_ms": {"dist": "lognormal", "mean": 5000, "sigma": 1}}})");
  ASSERT_TRUE(think_lognormal.ok()) << think_lognormal.error();
  EXPECT_EQ(think_lognormal->sessions->think_time_ms.min, 0);
  EXPECT_EQ(think_lognormal->sessions->think_time_ms.max, 1000000);
}

// ---- Spec parsing and validation -------------------------------------------------------------

TEST(SyntheticSpecParse, ReadsAllFields) {
  auto spec = ParseText(R"({
    "num_requests": 1000, "seed": 18446744073709551615, "block_tokens": 256,
    "arrival": {"process": "gamma", "rate_per_s": 2.5, "cv": 3},
    "input": {"dist": "lognormal", "mean": 4000, "sigma": 0.8, "min": 16, "max": 32000},
    "output": {"dist": "trace", "path": "../t/x.csv", "format": "azure"},
    "prefix": {"groups": 8, "tokens": 1024, "zipf": 1.1}})",
                        "/base/specs");
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(spec->num_requests, 1000u);
  EXPECT_EQ(spec->seed, 18446744073709551615ull);
  EXPECT_EQ(spec->block_tokens, 256);
  EXPECT_EQ(spec->arrival, SyntheticSpec::Arrival::kGamma);
  EXPECT_EQ(spec->rate_per_s, 2.5);
  EXPECT_EQ(spec->gamma_cv, 3.0);
  EXPECT_EQ(spec->input.kind, LengthDist::Kind::kLognormal);
  EXPECT_EQ(spec->input.mean, 4000);
  EXPECT_EQ(spec->input.sigma, 0.8);
  EXPECT_EQ(spec->input.min, 16);
  EXPECT_EQ(spec->input.max, 32000);
  EXPECT_EQ(spec->output.kind, LengthDist::Kind::kTrace);
  EXPECT_EQ(spec->output.trace_path, "/base/t/x.csv");
  EXPECT_EQ(spec->output.trace_format, TraceFormat::kAzure);
  EXPECT_EQ(spec->output.min, 1);        // default clamp
  EXPECT_EQ(spec->output.max, 1000000);  // default clamp
  EXPECT_EQ(spec->prefix_groups, 8u);
  EXPECT_EQ(spec->prefix_tokens, 1024);
  EXPECT_EQ(spec->prefix_zipf, 1.1);

  auto minimal = ParseText(kMinimalSpec);
  ASSERT_TRUE(minimal.ok()) << minimal.error();
  EXPECT_EQ(minimal->seed, 1u);
  EXPECT_EQ(minimal->block_tokens, 512);
  EXPECT_EQ(minimal->prefix_groups, 0u);
}

struct BadSpec {
  const char* name;
  const char* patch;  // JSON merge patch applied to kMinimalSpec
  std::vector<std::string> expected;
};

class SyntheticSpecErrors : public ::testing::TestWithParam<BadSpec> {};

TEST_P(SyntheticSpecErrors, MessageNamesFileAndField) {
  nlohmann::json doc = nlohmann::json::parse(kMinimalSpec);
  doc.merge_patch(nlohmann::json::parse(GetParam().patch));
  auto spec = ParseSyntheticSpec(doc, "specs/s.json", "");
  ASSERT_FALSE(spec.ok()) << GetParam().patch;
  std::vector<std::string> expected = GetParam().expected;
  expected.push_back("specs/s.json");
  for (const auto& part : expected) {
    EXPECT_TRUE(ContainsAll(spec.error(), {part})) << GetParam().patch;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, SyntheticSpecErrors,
    ::testing::Values(
        BadSpec{"NumRequestsZero", R"({"num_requests": 0})", {"field 'num_requests'"}},
        BadSpec{"NumRequestsMissing", R"({"num_requests": null})", {"field 'num_requests'"}},
        BadSpec{"NumRequestsString", R"({"num_requests": "10"})", {"field 'num_requests'"}},
        BadSpec{"SeedNegative", R"({"seed": -1})", {"field 'seed'"}},
        BadSpec{"BlockTokensZero", R"({"block_tokens": 0})", {"field 'block_tokens'"}},
        BadSpec{"UnknownKey", R"({"rate": 3})", {"field 'rate'", "not recognized"}},
        BadSpec{"RateZero", R"({"arrival": {"rate_per_s": 0}})", {"arrival", "'rate_per_s'"}},
        BadSpec{"RateMissing",
                R"({"arrival": {"rate_per_s": null}})",
                {"arrival", "'rate_per_s'", "missing"}},
        BadSpec{"UnknownProcess",
                R"({"arrival": {"process": "hawkes"}})",
                {"arrival", "'process'", "poisson, gamma", "hawkes"}},
        BadSpec{"GammaWithoutCv",
                R"({"arrival": {"process": "gamma"}})",
                {"arrival", "'cv'", "missing"}},
        BadSpec{
            "GammaCvZero", R"({"arrival": {"process": "gamma", "cv": 0}})", {"arrival", "'cv'"}},
        BadSpec{"CvOnPoisson", R"({"arrival": {"cv": 2}})", {"arrival", "'cv'", "not recognized"}},
        BadSpec{"ArrivalNotObject", R"({"arrival": 3})", {"field 'arrival'", "object"}},
        BadSpec{"InputMissing", R"({"input": null})", {"field 'input'", "missing"}},
        BadSpec{"UnknownDist",
                R"({"input": {"dist": "pareto"}})",
                {"input", "'dist'", "fixed, uniform, lognormal, trace", "pareto"}},
        BadSpec{"FixedZero", R"({"input": {"value": 0}})", {"input", "'value'"}},
        BadSpec{"UniformMinAboveMax",
                R"({"output": {"min": 10, "max": 9}})",
                {"output", "'min'", "max"}},
        BadSpec{"LognormalNegativeSigma",
                R"({"input": {"dist": "lognormal", "value": null, "mean": 10, "sigma": -1}})",
                {"input", "'sigma'"}},
        BadSpec{"LognormalZeroMean",
                R"({"input": {"dist": "lognormal", "value": null, "mean": 0, "sigma": 1}})",
                {"input", "'mean'"}},
        BadSpec{"LognormalMinAboveMax",
                R"({"input": {"dist": "lognormal", "value": null, "mean": 10, "sigma": 1,
                              "min": 20, "max": 10}})",
                {"input", "'min'"}},
        BadSpec{"TraceBadFormat",
                R"({"input": {"dist": "trace", "value": null, "path": "x", "format": "csv"}})",
                {"input", "'format'", "mooncake, azure"}},
        BadSpec{"TraceNoPath",
                R"({"input": {"dist": "trace", "value": null}})",
                {"input", "'path'", "missing"}},
        BadSpec{"PrefixTokensWithoutGroups",
                R"({"prefix": {"groups": 0, "tokens": 512}})",
                {"prefix", "'tokens'"}},
        BadSpec{"PrefixGroupsWithoutTokens",
                R"({"prefix": {"groups": 4, "tokens": 0}})",
                {"prefix", "'tokens'"}},
        BadSpec{"PrefixNegativeZipf",
                R"({"prefix": {"groups": 4, "tokens": 512, "zipf": -1}})",
                {"prefix", "'zipf'"}},
        BadSpec{"PrefixNegativeGroups",
                R"({"prefix": {"groups": -4, "tokens": 512}})",
                {"prefix", "'groups'"}},
        BadSpec{"SessionsNotObject", R"({"sessions": [1]})", {"field 'sessions'", "object"}},
        BadSpec{"SessionsUnknownKey",
                R"({"sessions": {"turn": {"dist": "fixed", "value": 2}}})",
                {"sessions", "field 'turn'", "not recognized"}},
        BadSpec{"SessionsTurnsMissing",
                R"({"sessions": {"new_tokens": {"dist": "fixed", "value": 5}}})",
                {"sessions", "field 'turns'", "missing"}},
        BadSpec{"SessionsNewTokensMissing",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2}}})",
                {"sessions", "field 'new_tokens'", "missing"}},
        BadSpec{"SessionsTurnsZero",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 0},
                                 "new_tokens": {"dist": "fixed", "value": 5}}})",
                {"sessions: turns", "field 'value'"}},
        BadSpec{"SessionsTurnsTooMany",
                R"({"sessions": {"turns": {"dist": "uniform", "min": 1, "max": 10001},
                                 "new_tokens": {"dist": "fixed", "value": 5}}})",
                {"sessions: turns", "field 'max'", "10000"}},
        BadSpec{"SessionsTurnsFromATrace",
                R"({"sessions": {"turns": {"dist": "trace", "path": "x.jsonl"},
                                 "new_tokens": {"dist": "fixed", "value": 5}}})",
                {"sessions: turns", "field 'dist'", "fixed, uniform, lognormal"}},
        BadSpec{"SessionsNewTokensZero",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "uniform", "min": 0, "max": 5}}})",
                {"sessions: new_tokens", "field 'min'"}},
        BadSpec{"SessionsThinkTimeNegative",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "think_time_ms": {"dist": "fixed", "value": -1}}})",
                {"sessions: think_time_ms", "field 'value'"}},
        BadSpec{"SessionsThinkTimePastAnHour",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "think_time_ms": {"dist": "fixed", "value": 3600001}}})",
                {"sessions: think_time_ms", "field 'value'", "3600000"}},
        BadSpec{"SessionsThinkTimeLognormalMeanPastAnHour",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "think_time_ms": {"dist": "lognormal", "mean": 4e6,
                                                   "sigma": 1}}})",
                {"sessions: think_time_ms", "field 'mean'"}},
        BadSpec{"SessionsThinkTimeFromATrace",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "think_time_ms": {"dist": "trace", "path": "x.jsonl"}}})",
                {"sessions: think_time_ms", "field 'dist'"}},
        BadSpec{"SessionsMaxContextZero",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "max_context_tokens": 0}})",
                {"sessions", "field 'max_context_tokens'", "1000000000"}},
        BadSpec{"SessionsMaxContextTooLarge",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "max_context_tokens": 1000000001}})",
                {"sessions", "field 'max_context_tokens'"}},
        BadSpec{"SessionsMaxContextFractional",
                R"({"sessions": {"turns": {"dist": "fixed", "value": 2},
                                 "new_tokens": {"dist": "fixed", "value": 5},
                                 "max_context_tokens": 100.5}})",
                {"sessions", "field 'max_context_tokens'"}}),
    [](const ::testing::TestParamInfo<BadSpec>& info) { return info.param.name; });

TEST(SyntheticSpecParse, GenerateValidatesCodeBuiltSpecs) {
  SyntheticSpec spec = BaseSpec(10);
  spec.rate_per_s = -1;
  auto trace = GenerateSynthetic(spec);
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {"arrival", "'rate_per_s'"}));
  spec = BaseSpec(0);
  EXPECT_TRUE(ContainsAll(GenerateSynthetic(spec).error(), {"'num_requests'"}));
}

TEST(SyntheticSpecParse, GenerateValidatesCodeBuiltSessions) {
  SyntheticSpec spec = BaseSpec(10);
  spec.sessions = SessionSpec{};  // new_tokens left unset
  EXPECT_TRUE(ContainsAll(GenerateSynthetic(spec).error(),
                          {"synthetic spec: sessions: new_tokens", "'value'"}));
  spec.sessions->new_tokens = FixedLength(5);
  spec.sessions->turns = FixedLength(0);
  EXPECT_TRUE(ContainsAll(GenerateSynthetic(spec).error(), {"sessions: turns", "'value'"}));
  spec.sessions->turns = FixedLength(2);
  spec.sessions->think_time_ms = {LengthDist::Kind::kTrace, 0, 0, 10, 0, 0, "t.jsonl", {}};
  EXPECT_TRUE(ContainsAll(GenerateSynthetic(spec).error(), {"sessions: think_time_ms", "'dist'"}));
  spec.sessions->think_time_ms = FixedLength(0);
  spec.sessions->max_context_tokens = -5;
  EXPECT_TRUE(ContainsAll(GenerateSynthetic(spec).error(), {"sessions", "'max_context_tokens'"}));
  spec.sessions->max_context_tokens = 0;
  EXPECT_TRUE(GenerateSynthetic(spec).ok());
}

TEST(SyntheticSpecParse, FileErrorsNameThePath) {
  testing::TempDir dir;
  auto missing = ReadSyntheticSpec(dir.File("none.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(ContainsAll(missing.error(), {dir.File("none.json")}));
  const std::string bad = dir.Write("bad.json", R"({"num_requests": 5, )");
  auto invalid = ReadSyntheticSpec(bad);
  ASSERT_FALSE(invalid.ok());
  EXPECT_TRUE(ContainsAll(invalid.error(), {bad, "invalid JSON"}));
  const std::string zero = dir.Write("zero.json", R"({"num_requests": 0})");
  auto trace = ReadTrace(zero, TraceFormat::kSynthetic);
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(ContainsAll(trace.error(), {zero, "'num_requests'"}));
}

// ---- Bundled specs ---------------------------------------------------------------------------

TEST(BundledSpecs, DefaultIsAboutTenMinutesOfTwoThousandRequests) {
  auto trace = ReadTrace(testing::BundledPath("default.json"), TraceFormat::kSynthetic);
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 2000u);
  EXPECT_GT(trace->requests.back().arrival_s, 500.0);
  EXPECT_LT(trace->requests.back().arrival_s, 700.0);
  double output_sum = 0;
  for (const auto& r : trace->requests) {
    EXPECT_GE(r.input_tokens, 2048 + 64);
    EXPECT_LE(r.input_tokens, 2048 + 28000);
    EXPECT_GE(r.output_tokens, 1);
    EXPECT_LE(r.output_tokens, 2048);
    output_sum += static_cast<double>(r.output_tokens);
  }
  EXPECT_NEAR(output_sum / 2000, 250, 25);
  CheckPrefixStructure(*trace, 4, 16);
}

TEST(BundledSpecs, TinyIsSmallAndShared) {
  auto trace = ReadTrace(testing::BundledPath("tiny.json"), TraceFormat::kSynthetic);
  ASSERT_TRUE(trace.ok()) << trace.error();
  ASSERT_EQ(trace->requests.size(), 40u);
  EXPECT_LT(trace->requests.back().arrival_s, 10.0);
  for (const auto& r : trace->requests) {
    EXPECT_GE(r.input_tokens, 64);
    EXPECT_LE(r.input_tokens, 512);
    EXPECT_GE(r.output_tokens, 4);
    EXPECT_LE(r.output_tokens, 64);
  }
  CheckPrefixStructure(*trace, 2, 3);
}

}  // namespace
}  // namespace duet::traces
