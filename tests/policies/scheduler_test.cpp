// Batch scheduler: decode first, chunked prefill under the token budget, max_num_seqs,
// FCFS admission with prefix reuse, preemption by recompute when blocks run out.
#include "policies/scheduler.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>

namespace duet::policies {
namespace {

Request MakeRequest(RequestId id, Tokens input, Tokens output) {
  Request r;
  r.id = id;
  r.input_tokens = input;
  r.output_tokens = output;
  return r;
}

// Applies a plan as the engine would, to the requests of its entries as the scheduler handed
// them over (which must be those the plan names): chunks computed, finished prefills start
// decoding, decodes produce a token.
void Apply(const StepPlan& plan, const std::vector<Request*>& requests) {
  ASSERT_EQ(requests.size(), plan.prefills.size() + plan.decodes.size());
  std::size_t entry = 0;
  for (const PrefillItem& p : plan.prefills) {
    Request* r = requests[entry++];
    ASSERT_EQ(r->id, p.request);
    r->computed_tokens += p.tokens;
    if (r->computed_tokens == r->prefill_target) {
      ++r->generated_tokens;
      r->state = RequestState::kDecoding;
    }
  }
  for (const DecodeItem& d : plan.decodes) {
    Request* r = requests[entry++];
    ASSERT_EQ(r->id, d.request);
    ++r->generated_tokens;
  }
}

TEST(BatchScheduler, ChunksLongPromptsUnderTheTokenBudget) {
  KvBlockManager blocks(1000, 16);
  BatchScheduler s({.max_num_batched_tokens = 100, .max_num_seqs = 8, .watermark = 0});
  Request a = MakeRequest(1, 250, 5);
  s.AddWaiting(&a);
  EXPECT_EQ(s.pending_prefill_tokens(), 250);
  StepPlan plan;
  std::vector<Request*> requests;
  std::vector<Tokens> chunks;
  for (int i = 0; i < 3; ++i) {
    s.Schedule(blocks, plan, requests);
    ASSERT_EQ(plan.prefills.size(), 1u);
    EXPECT_EQ(plan.prefills[0].context, a.computed_tokens);
    chunks.push_back(plan.prefills[0].tokens);
    Apply(plan, requests);
  }
  EXPECT_EQ(chunks, (std::vector<Tokens>{100, 100, 50}));
  EXPECT_EQ(a.state, RequestState::kDecoding);
  EXPECT_EQ(s.pending_prefill_tokens(), 0);
}

TEST(BatchScheduler, DecodesFirstThenPrefillsInTheRemainingBudget) {
  KvBlockManager blocks(1000, 16);
  BatchScheduler s({.max_num_batched_tokens = 64, .max_num_seqs = 8, .watermark = 0});
  Request a = MakeRequest(1, 10, 50), b = MakeRequest(2, 10, 50), c = MakeRequest(3, 200, 5);
  s.AddWaiting(&a);
  s.AddWaiting(&b);
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  Apply(plan, requests);  // a and b prefilled in one step
  ASSERT_EQ(a.state, RequestState::kDecoding);
  s.AddWaiting(&c);
  s.Schedule(blocks, plan, requests);
  ASSERT_EQ(plan.decodes.size(), 2u);
  ASSERT_EQ(plan.prefills.size(), 1u);
  EXPECT_EQ(plan.prefills[0].tokens, 62);  // 64 - 2 decode tokens
  // The entries' requests as the scheduler hands them over: prefills, then decodes.
  EXPECT_EQ(requests, (std::vector<Request*>{&c, &a, &b}));
  const auto shape = plan.Shape();
  EXPECT_EQ(shape.decode_tokens, 2);
  EXPECT_EQ(shape.decode_context_tokens, 20);  // 10 cached tokens each; the 11th is decoded
  EXPECT_EQ(shape.PrefillTokens(), 62);
  // Step 3 of a decode run from this plan attends over 3 more tokens per request.
  EXPECT_EQ(plan.Shape(3).decode_context_tokens, 20 + 6);
}

TEST(BatchScheduler, MaxNumSeqsCapsAdmission) {
  KvBlockManager blocks(1000, 16);
  BatchScheduler s({.max_num_batched_tokens = 10000, .max_num_seqs = 2, .watermark = 0});
  std::deque<Request> rs;
  for (RequestId i = 0; i < 4; ++i) s.AddWaiting(&rs.emplace_back(MakeRequest(i, 10, 10)));
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  EXPECT_EQ(plan.admitted.size(), 2u);
  EXPECT_EQ(s.running().size(), 2u);
  EXPECT_EQ(s.waiting().size(), 2u);
}

TEST(BatchScheduler, AdmissionIsFirstComeFirstServedWithPrefixReuse) {
  KvBlockManager blocks(10, 16);
  BatchScheduler s({.max_num_batched_tokens = 10000, .max_num_seqs = 8, .watermark = 0});
  Request big = MakeRequest(1, 16 * 12, 2);  // needs 12 blocks: never fits now
  Request small = MakeRequest(2, 16, 2);
  s.AddWaiting(&big);
  s.AddWaiting(&small);
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  EXPECT_TRUE(plan.empty());  // the head blocks the line; small is not admitted around it
  EXPECT_EQ(s.waiting().front(), &big);

  KvBlockManager cache(10, 16);
  BatchScheduler s2({.max_num_batched_tokens = 10000, .max_num_seqs = 8, .watermark = 0});
  Request first = MakeRequest(3, 64, 2), second = MakeRequest(4, 64, 2);
  first.block_hashes = second.block_hashes = {1, 2, 3, 4};
  s2.AddWaiting(&first);
  s2.Schedule(cache, plan, requests);
  Apply(plan, requests);
  cache.Register(first.id, first.block_hashes, 64);
  s2.AddWaiting(&second);
  s2.Schedule(cache, plan, requests);
  ASSERT_EQ(plan.prefills.size(), 1u);
  EXPECT_EQ(second.cached_tokens, 48);  // 3 of 4 blocks: one token must still be computed
  EXPECT_EQ(plan.prefills[0].context, 48);
  EXPECT_EQ(plan.prefills[0].tokens, 16);
}

TEST(BatchScheduler, PreemptsTheLatestAdmittedByRecomputeWhenBlocksRunOut) {
  // 4 blocks of 4 tokens. a and b each take 2 blocks, then a's growth needs a fifth.
  KvBlockManager blocks(4, 4);
  BatchScheduler s({.max_num_batched_tokens = 100, .max_num_seqs = 8, .watermark = 0});
  Request a = MakeRequest(1, 8, 10), b = MakeRequest(2, 8, 10);
  s.AddWaiting(&a);
  s.AddWaiting(&b);
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  Apply(plan, requests);
  ASSERT_EQ(blocks.kv_blocks_free(), 0);
  // Decoding a needs room for 9 tokens: 3 blocks. b (admitted last) is preempted.
  s.Schedule(blocks, plan, requests);
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], b.id);
  EXPECT_EQ(b.state, RequestState::kQueued);
  EXPECT_EQ(b.computed_tokens, 0);
  EXPECT_EQ(b.preemptions, 1);
  EXPECT_EQ(s.waiting().front(), &b);
  ASSERT_EQ(plan.decodes.size(), 1u);
  EXPECT_EQ(plan.decodes[0].request, a.id);
  EXPECT_TRUE(plan.prefills.empty());  // no admission in a step that preempted
  // b recomputes its prompt and the token it had generated.
  EXPECT_EQ(s.pending_prefill_tokens(), 9);
  ASSERT_TRUE(blocks.CheckInvariants().ok()) << blocks.CheckInvariants().message();
}

TEST(BatchScheduler, ARequestThatCannotGrowAloneIsPreemptedItself) {
  KvBlockManager blocks(2, 4);
  BatchScheduler s({.max_num_batched_tokens = 100, .max_num_seqs = 8, .watermark = 0});
  Request a = MakeRequest(1, 8, 10);
  s.AddWaiting(&a);
  StepPlan plan;
  std::vector<Request*> requests;
  s.Schedule(blocks, plan, requests);
  Apply(plan, requests);
  s.Schedule(blocks, plan, requests);
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], a.id);
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(blocks.kv_blocks_used(), 0);
}

// A plan is data: it names its requests by id and carries what an executor reads of them, so a
// copy of it still says what the step does once the requests and the scheduler are gone.
TEST(BatchScheduler, APlanNamesItsRequestsByIdAndOutlivesThem) {
  StepPlan copy;
  models::StepShape shape;
  {
    KvBlockManager blocks(1000, 16);
    BatchScheduler s({.max_num_batched_tokens = 40, .max_num_seqs = 8, .watermark = 0});
    auto a = std::make_unique<Request>(MakeRequest(7, 10, 5));
    auto b = std::make_unique<Request>(MakeRequest(9, 100, 3));
    s.AddWaiting(a.get());
    StepPlan plan;
    std::vector<Request*> requests;
    s.Schedule(blocks, plan, requests);
    Apply(plan, requests);  // a prefilled: it decodes next
    s.AddWaiting(b.get());
    s.Schedule(blocks, plan, requests);
    EXPECT_EQ(plan.admitted, std::vector<RequestId>{9});
    copy = plan;
    shape = plan.Shape();
    a.reset();
    b.reset();
  }
  ASSERT_EQ(copy.decodes.size(), 1u);
  EXPECT_EQ(copy.decodes[0].request, 7);
  EXPECT_EQ(copy.decodes[0].context, 10);  // its prompt; the step processes its first token
  EXPECT_EQ(copy.decodes[0].remaining_output, 4);
  ASSERT_EQ(copy.prefills.size(), 1u);
  EXPECT_EQ(copy.prefills[0].request, 9);
  EXPECT_EQ(copy.prefills[0].tokens, 39);  // the budget left after a's decode
  EXPECT_FALSE(copy.prefills[0].ends_prefill);
  EXPECT_EQ(copy.prefills[0].remaining_output, 3);
  // The copy prices the step as the plan did while its requests lived.
  const models::StepShape again = copy.Shape();
  EXPECT_EQ(again.PrefillTokens(), shape.PrefillTokens());
  EXPECT_EQ(again.decode_tokens, shape.decode_tokens);
  EXPECT_EQ(again.decode_context_tokens, shape.decode_context_tokens);
  EXPECT_EQ(again.decode_context_tokens, 10);
}

}  // namespace
}  // namespace duet::policies
