// Speculative decoding in the scheduler: the drafts a request keeps each step follow the
// configured acceptance rates and depend on the request and its progress alone; each decode row
// takes 1 + k of the token budget and KV slots for its drafts, fewer near the end of its output.
#include "policies/speculative.h"

#include <gtest/gtest.h>

#include "policies/scheduler.h"

namespace duet::policies {
namespace {

SpeculativeConfig Config(std::vector<double> acceptance) {
  SpeculativeConfig c;
  c.tokens = static_cast<int>(acceptance.size());
  c.acceptance = std::move(acceptance);
  return c;
}

TEST(Speculative, AcceptedDraftsFollowTheRatesAndAreReproducible) {
  const SpeculativeConfig c = Config({0.8, 0.6, 0.5});
  // 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.5
  EXPECT_DOUBLE_EQ(c.MeanAccepted(), 0.8 + 0.48 + 0.24);
  double sum = 0;
  int counts[4] = {0, 0, 0, 0};
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const RequestId id = static_cast<RequestId>(i % 1000);
    const Tokens generated = 1 + i / 1000;
    const int kept = c.Accepted(id, generated);
    ASSERT_GE(kept, 0);
    ASSERT_LE(kept, 3);
    ASSERT_EQ(kept, c.Accepted(id, generated)) << "the same request at the same point";
    ++counts[kept];
    sum += kept;
  }
  EXPECT_NEAR(sum / kDraws, c.MeanAccepted(), 0.01);
  // P(kept = 0) = 0.2, P(1) = 0.8 * 0.4, P(2) = 0.48 * 0.5, P(3) = 0.24.
  const double expected[4] = {0.2, 0.32, 0.24, 0.24};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(double(counts[k]) / kDraws, expected[k], 0.005) << k;
  // Certain rates are exact.
  EXPECT_EQ(Config({1, 1}).Accepted(7, 3), 2);
  EXPECT_EQ(Config({0, 1}).Accepted(7, 3), 0);
}

TEST(Speculative, DecodeRowsTakeTheirDraftsOfTheBudgetAndKvSlots) {
  KvBlockManager blocks(1000, 16);
  SchedulerConfig config{.max_num_batched_tokens = 20, .max_num_seqs = 8, .watermark = 0};
  config.speculative = Config({0.7, 0.7, 0.7});
  BatchScheduler s(config);
  Request a{}, b{};
  a.id = 1;
  a.input_tokens = 16;
  a.output_tokens = 50;
  b.id = 2;
  b.input_tokens = 16;
  b.output_tokens = 3;  // two tokens left after its prefill: one draft at most
  s.AddWaiting(&a);
  s.AddWaiting(&b);
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  ASSERT_EQ(plan.prefills.size(), 2u);
  for (std::size_t i = 0; i < plan.prefills.size(); ++i) {
    Request* r = requests[i];
    r->computed_tokens += plan.prefills[i].tokens;
    r->generated_tokens = 1;
    r->state = RequestState::kDecoding;
  }
  Request c{};
  c.id = 3;
  c.input_tokens = 100;
  c.output_tokens = 5;
  s.AddWaiting(&c);
  s.Schedule(blocks, plan, requests);
  ASSERT_EQ(plan.decodes.size(), 2u);
  EXPECT_EQ(plan.decodes[0].drafts, 3);
  EXPECT_EQ(plan.decodes[1].drafts, 1);
  const models::StepShape shape = plan.Shape();
  EXPECT_EQ(shape.decode_tokens, 2);
  EXPECT_EQ(shape.decode_draft_tokens, 3 + 1);
  // a holds room for its 17 tokens and 3 drafts: 2 blocks; b for 17 and 1 draft.
  EXPECT_EQ(blocks.TableBlocks(1), 2);
  EXPECT_EQ(blocks.TableBlocks(2), 2);
  // 20 - (1 + 3) - (1 + 1) tokens of budget are left for c's first chunk.
  ASSERT_EQ(plan.prefills.size(), 1u);
  EXPECT_EQ(plan.prefills[0].tokens, 14);
}

}  // namespace
}  // namespace duet::policies
