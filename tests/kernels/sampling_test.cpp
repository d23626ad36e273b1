// Sample: greedy and its tie rule, top_k = 1 equal to greedy, determinism per (seed, step),
// frequencies matching the softmax, top-k and top-p truncation, NaN / -inf logits, and the
// counter-based uniform's range and spread.
#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace duet::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingParams& params,
                                int draws) {
  std::vector<double> counts(logits.size(), 0.0);
  for (int s = 0; s < draws; ++s) {
    counts[Sample(logits.data(), static_cast<std::int32_t>(logits.size()), params, s)] += 1.0;
  }
  for (double& c : counts) c /= draws;
  return counts;
}

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualMaxima) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams greedy;
  for (std::uint64_t step = 0; step < 10; ++step)
    EXPECT_EQ(Sample(logits.data(), 5, greedy, step), 1);
  const std::vector<float> with_nan = {std::nanf(""), -1.0f, 0.5f};
  EXPECT_EQ(Sample(with_nan.data(), 3, greedy, 0), 2);
  const std::vector<float> all_minus_inf = {-kInf, -kInf};
  EXPECT_EQ(Sample(all_minus_inf.data(), 2, greedy, 0), 0);
}

TEST(Sampling, TopKOfOneEqualsGreedyAtAnyTemperature) {
  const std::vector<float> random = testing::RandomFloats(1000, 3, -5, 5);
  std::vector<float> ties = random;
  ties[10] = ties[500] = 7.0f;  // a tie for the maximum
  for (const auto& logits : {random, ties}) {
    const std::int32_t greedy = Sample(logits.data(), 1000, SamplingParams{}, 0);
    for (float temperature : {0.1f, 1.0f, 1.7f, 50.0f}) {
      SamplingParams params{temperature, 1, 1.0f, 99};
      for (std::uint64_t step = 0; step < 20; ++step) {
        EXPECT_EQ(Sample(logits.data(), 1000, params, step), greedy) << temperature;
      }
    }
  }
}

TEST(Sampling, DeterministicForSeedAndStep) {
  const std::vector<float> logits = testing::RandomFloats(5000, 4, -3, 3);
  SamplingParams params{0.8f, 50, 0.9f, 1234};
  std::set<std::int32_t> distinct;
  for (std::uint64_t step = 0; step < 200; ++step) {
    const std::int32_t a = Sample(logits.data(), 5000, params, step);
    EXPECT_EQ(a, Sample(logits.data(), 5000, params, step));
    distinct.insert(a);
  }
  EXPECT_GT(distinct.size(), 5u);  // the step index actually varies the draw
  SamplingParams other = params;
  other.seed = 1235;
  int differ = 0;
  for (std::uint64_t step = 0; step < 200; ++step) {
    differ += Sample(logits.data(), 5000, params, step) != Sample(logits.data(), 5000, other, step);
  }
  EXPECT_GT(differ, 50);
}

TEST(Sampling, TwoTokenFrequenciesFollowTheSoftmax) {
  // p(1) = e^ln3 / (1 + e^ln3) = 0.75; over 20000 draws the standard error is 0.0031.
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  const auto freq = Frequencies(logits, SamplingParams{1.0f, 0, 1.0f, 7}, 20000);
  EXPECT_NEAR(freq[1], 0.75, 0.015);
  // Temperature 2 flattens: p(1) = sqrt(3) / (1 + sqrt(3)).
  const auto flat = Frequencies(logits, SamplingParams{2.0f, 0, 1.0f, 8}, 20000);
  EXPECT_NEAR(flat[1], std::sqrt(3.0) / (1.0 + std::sqrt(3.0)), 0.015);
}

TEST(Sampling, TopKAndTopPTruncateThenRenormalise) {
  // Probabilities 0.5, 0.3, 0.15, 0.05.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  const auto top2 = Frequencies(logits, SamplingParams{1.0f, 2, 1.0f, 1}, 20000);
  EXPECT_NEAR(top2[0], 0.625, 0.015);
  EXPECT_NEAR(top2[1], 0.375, 0.015);
  EXPECT_EQ(top2[2] + top2[3], 0.0);
  // top_p 0.7: 0.5 < 0.7 <= 0.8, so the nucleus is {0, 1}.
  const auto nucleus = Frequencies(logits, SamplingParams{1.0f, 0, 0.7f, 2}, 20000);
  EXPECT_NEAR(nucleus[0], 0.625, 0.015);
  EXPECT_EQ(nucleus[2] + nucleus[3], 0.0);
  // top_p 0.4 keeps only the most likely; top_p 0.9 keeps three.
  const auto one = Frequencies(logits, SamplingParams{1.0f, 0, 0.4f, 3}, 2000);
  EXPECT_EQ(one[0], 1.0);
  const auto three = Frequencies(logits, SamplingParams{1.0f, 0, 0.9f, 4}, 20000);
  EXPECT_NEAR(three[2], 0.15 / 0.95, 0.015);
  EXPECT_EQ(three[3], 0.0);
  // Both: top_k 3 then top_p 0.6 of the renormalised (0.526, 0.316, 0.158) keeps {0, 1}.
  const auto both = Frequencies(logits, SamplingParams{1.0f, 3, 0.6f, 5}, 20000);
  EXPECT_NEAR(both[0], 0.625, 0.015);
  EXPECT_EQ(both[2] + both[3], 0.0);
}

TEST(Sampling, TopPOnALargeVocabularyNeedsMoreThanTheFirstPrefix) {
  // 1000 equal logits: a nucleus of 0.5 needs 500 tokens, beyond the first sorted prefix of 64;
  // equal probabilities sort by id, so exactly ids < 500 may come out.
  const std::vector<float> logits(1000, 0.25f);
  std::set<std::int32_t> seen;
  for (std::uint64_t step = 0; step < 2000; ++step) {
    const std::int32_t id = Sample(logits.data(), 1000, SamplingParams{1.0f, 0, 0.5f, 6}, step);
    ASSERT_LT(id, 500);
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), 450u);
}

TEST(Sampling, NanAndMinusInfinityLogitsAreNeverSampled) {
  const std::vector<float> logits = {std::nanf(""), -kInf, 0.0f, 0.0f, -kInf};
  for (std::uint64_t step = 0; step < 2000; ++step) {
    const std::int32_t id = Sample(logits.data(), 5, SamplingParams{1.0f, 0, 1.0f, 1}, step);
    ASSERT_TRUE(id == 2 || id == 3) << id;
  }
}

TEST(Sampling, TinyTemperatureBehavesLikeGreedy) {
  const std::vector<float> logits = {1.0f, 1.5f, 1.4999f, -3.0f};
  for (std::uint64_t step = 0; step < 100; ++step) {
    EXPECT_EQ(Sample(logits.data(), 4, SamplingParams{1e-30f, 0, 1.0f, 1}, step), 1);
  }
}

TEST(Sampling, UniformIsInRangeAndSpread) {
  double sum = 0.0;
  for (std::uint64_t step = 0; step < 100000; ++step) {
    const double u = SampleUniform(42, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_NE(SampleUniform(0, 1), SampleUniform(1, 0));
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);  // the reference splitmix64 first output
}

}  // namespace
}  // namespace duet::kernels::cpu
