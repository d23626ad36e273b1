// Continuous-batching scheduler with chunked prefill, decode-first budgeting and preemption
// by recompute (see scheduler.h).
#include "policies/scheduler.h"

#include <algorithm>
#include <cmath>

#include "policies/ports.h"

namespace duet::policies {

std::int64_t SchedulerConfig::WatermarkBlocks(std::int64_t num_blocks) const {
  return static_cast<std::int64_t>(std::ceil(watermark * static_cast<double>(num_blocks)));
}

Tokens SchedulerConfig::AdmissibleTokens(std::int64_t num_blocks, Tokens block_tokens) const {
  return (num_blocks - WatermarkBlocks(num_blocks)) * block_tokens;
}

void StepPlan::clear() {
  prefills.clear();
  decodes.clear();
  preempted.clear();
  admitted.clear();
  loads.clear();
  max_steps = 1;
  awaited_loads.clear();
  rows.clear();
  token_ids.clear();
  stop_ids.clear();
  block_ids.clear();
  block_offsets.clear();
}

void StepPlan::SnapshotInputs(std::span<const Request* const> requests,
                              const KvBlockManager& blocks) {
  DUET_CHECK(requests.size() == prefills.size() + decodes.size());
  rows.clear();
  token_ids.clear();
  stop_ids.clear();
  block_ids.clear();
  block_offsets.assign(1, 0);
  auto add = [&](const Request* r, Tokens position, Tokens count, bool sample) {
    DUET_CHECK(position >= 0 && count >= 1 && position + count <= r->SequenceTokens());
    // Planned ahead of the step in flight, a request may count one token whose id that step
    // has yet to sample; only a decode reads it.
    const Tokens known = r->input_tokens + static_cast<Tokens>(r->output_ids.size());
    DUET_CHECK(static_cast<Tokens>(r->prompt_ids.size()) == r->input_tokens &&
               (known == r->SequenceTokens() ||
                (known + 1 == r->SequenceTokens() && count == 1 && position == known)));
    const SamplingParams& s = r->sampling;
    StepRow& row = rows.emplace_back();
    row.request = r->id;
    row.position = position;
    row.tokens_from = static_cast<std::uint32_t>(token_ids.size());
    row.token_count = static_cast<std::uint32_t>(count);
    for (Tokens p = position; p < position + count; ++p)
      token_ids.push_back(p < known ? r->TokenAt(p) : -1);
    row.previous_token = position + count > known;
    row.sample = sample;
    row.temperature = s.temperature;
    row.top_p = s.top_p;
    row.top_k = s.top_k;
    // A given seed alone decides the random stream (equal requests with equal seeds give
    // equal outputs); without one it comes from the request id.
    row.seed = s.seed ? *s.seed : r->id;
    row.stops_from = static_cast<std::uint32_t>(stop_ids.size());
    row.stop_count = static_cast<std::uint32_t>(s.stop_token_ids.size());
    stop_ids.insert(stop_ids.end(), s.stop_token_ids.begin(), s.stop_token_ids.end());
    const auto table = blocks.Table(r->id);
    block_ids.insert(block_ids.end(), table.begin(), table.end());
    block_offsets.push_back(block_ids.size());
  };
  std::size_t entry = 0;
  for (const PrefillItem& p : prefills) {
    const Request* r = requests[entry++];
    DUET_CHECK(r->id == p.request);
    add(r, p.context, p.tokens, p.ends_prefill);
  }
  // A decode processes its newest token (sampled by the previous step).
  for (const DecodeItem& d : decodes) {
    const Request* r = requests[entry++];
    DUET_CHECK(r->id == d.request);
    add(r, d.context, 1, true);
  }
}

models::StepShape StepPlan::RowsShape() const {
  DUET_CHECK(rows.size() == prefills.size() + decodes.size());
  models::StepShape shape;
  shape.tp = tp;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const StepRow& row = rows[i];
    if (i < prefills.size()) {
      shape.prefill.push_back({row.token_count, row.position});
    } else {
      ++shape.decode_tokens;
      shape.decode_context_tokens += row.position;  // the tokens cached before its own
    }
  }
  return shape;
}

std::span<const std::int32_t> StepPlan::TokensOf(const StepRow& row) const {
  return std::span<const std::int32_t>(token_ids).subspan(row.tokens_from, row.token_count);
}

std::span<const std::int32_t> StepPlan::StopsOf(const StepRow& row) const {
  return std::span<const std::int32_t>(stop_ids).subspan(row.stops_from, row.stop_count);
}

std::span<const std::int32_t> StepPlan::BlockTable(std::size_t entry) const {
  DUET_CHECK(entry + 1 < block_offsets.size());
  return std::span<const std::int32_t>(block_ids).subspan(
      block_offsets[entry], block_offsets[entry + 1] - block_offsets[entry]);
}

models::StepShape StepPlan::Shape(int step_index) const {
  models::StepShape shape;
  shape.tp = tp;
  shape.prefill.reserve(prefills.size());
  for (const PrefillItem& p : prefills) shape.prefill.push_back({p.tokens, p.context});
  shape.decode_tokens = static_cast<Tokens>(decodes.size());
  // Context: tokens already cached; the token being decoded is the step's own token.
  for (const DecodeItem& d : decodes) {
    shape.decode_context_tokens += d.context;
    shape.decode_draft_tokens += d.drafts;
  }
  shape.decode_context_tokens += static_cast<Tokens>(step_index) * shape.decode_tokens;
  return shape;
}

void BatchScheduler::AddWaiting(Request* request) {
  pending_prefill_tokens_ += request->input_tokens + request->generated_tokens;
  waiting_.push_back(request);
}

void BatchScheduler::RemoveRunning(Request* request) {
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) running_.erase(it);
}

void BatchScheduler::ForgetPendingPrefill(const Request* request) {
  if (request->state == RequestState::kPrefilling || request->state == RequestState::kLoading)
    pending_prefill_tokens_ -=
        request->prefill_target - request->computed_tokens - request->LoadingTokens();
}

bool BatchScheduler::Remove(Request* request) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), request); it != waiting_.end()) {
    pending_prefill_tokens_ -= request->input_tokens + request->generated_tokens;
    waiting_.erase(it);
    return true;
  }
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it == running_.end()) return false;
  ForgetPendingPrefill(request);
  running_.erase(it);
  return true;
}

Request* BatchScheduler::Find(RequestId id) const {
  for (Request* r : waiting_) {
    if (r->id == id) return r;
  }
  for (Request* r : running_) {
    if (r->id == id) return r;
  }
  return nullptr;
}

template <typename F>
auto BatchScheduler::Timed(F&& call) {
  if (!host_clock_) return call();
  const Seconds start = host_clock_->Now();
  auto result = call();
  allocation_s_ += host_clock_->Now() - start;
  return result;
}

void BatchScheduler::Preempt(Request* victim, KvBlockManager& blocks, StepPlan& plan) {
  Timed([&] {
    blocks.Free(victim->id);
    return 0;
  });
  ForgetPendingPrefill(victim);
  victim->loading_tokens = {};
  pending_prefill_tokens_ += victim->input_tokens + victim->generated_tokens;
  victim->state = RequestState::kQueued;
  victim->computed_tokens = 0;
  victim->prefill_target = 0;
  ++victim->preemptions;
  waiting_.push_front(victim);  // first in line: it was admitted before anything waiting
  plan.preempted.push_back(victim->id);
}

void BatchScheduler::Schedule(KvBlockManager& blocks, StepPlan& plan,
                              std::vector<Request*>& requests) {
  plan.clear();
  requests.clear();
  decoding_.clear();
  allocation_s_ = 0;
  Tokens budget = config_.max_num_batched_tokens;

  // 1. Decode first: each decoding request needs room for the token it processes this step,
  // and for its drafts with speculative decoding.
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request* r = running_[i];
    if (r->state != RequestState::kDecoding) continue;
    const Tokens drafts = config_.speculative.DraftsFor(*r);
    if (budget < 1 + drafts) break;
    bool scheduled = true;
    while (!Timed([&] { return blocks.Grow(r->id, r->SequenceTokens() + drafts); })) {
      Request* victim = running_.back();
      running_.pop_back();
      // Victims come from the back, so none of them was planned yet in this loop.
      Preempt(victim, blocks, plan);
      if (victim == r) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;  // r was the last running request
    plan.decodes.push_back({r->id, r->SequenceTokens() - 1, drafts, r->RemainingOutput()});
    decoding_.push_back(r);
    budget -= 1 + drafts;
  }

  // 2. Continue chunked prefills already admitted.
  for (Request* r : running_) {
    if (budget <= 0) break;
    if (r->state != RequestState::kPrefilling) continue;
    const Tokens chunk = std::min(r->prefill_target - r->computed_tokens, budget);
    if (chunk <= 0) continue;
    plan.prefills.push_back({r->id, chunk, r->computed_tokens,
                             r->computed_tokens + chunk == r->prefill_target,
                             r->RemainingOutput()});
    requests.push_back(r);
    pending_prefill_tokens_ -= chunk;
    budget -= chunk;
  }

  // 3. Admit waiting requests, but not in a step that had to preempt: the freed blocks belong
  // to the running set.
  if (plan.preempted.empty()) Admit(blocks, budget, plan, requests);
  requests.insert(requests.end(), decoding_.begin(), decoding_.end());
}

void BatchScheduler::Admit(KvBlockManager& blocks, Tokens budget, StepPlan& plan,
                           std::vector<Request*>& requests) {
  // FCFS, no skipping: the head blocks the line, as in vLLM.
  const std::int64_t watermark_blocks = config_.WatermarkBlocks(blocks.num_blocks());
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    const Tokens target = r->input_tokens + r->generated_tokens;
    // At least one token is computed so that the step yields logits for the next token.
    const Tokens max_hit = target - 1;
    const auto hit = Timed(
        [&] { return blocks.Allocate(r->id, r->block_hashes, target, max_hit, watermark_blocks); });
    if (!hit) break;
    waiting_.pop_front();
    r->state = RequestState::kPrefilling;
    r->prefill_target = target;
    r->computed_tokens = *hit;
    // Past the GPU hit, the prefix may continue in the lower tiers: load it, compute the rest.
    const Tokens loaded =
        lower_tiers_ ? lower_tiers_->Find(*r, *hit / blocks.block_tokens(), max_hit - *hit) : 0;
    if (r->preemptions == 0 && r->generated_tokens == 0) {
      r->cached_tokens = *hit + loaded;
      r->tier_hit_tokens = r->loading_tokens;
    }
    running_.push_back(r);
    plan.admitted.push_back(r->id);
    if (loaded > 0) {
      r->state = RequestState::kLoading;
      plan.loads.push_back(r->id);
      if (!config_.overlap_tier_loads) {
        pending_prefill_tokens_ -= *hit + loaded;
        continue;  // prefills once the load finished
      }
      // The loaded tokens count as present: the step computing the rest waits for them.
      r->computed_tokens = *hit + loaded;
    }
    const Tokens context = r->computed_tokens;
    const Tokens chunk = std::min(target - context, budget);
    plan.prefills.push_back(
        {r->id, chunk, context, context + chunk == target, r->RemainingOutput()});
    requests.push_back(r);
    pending_prefill_tokens_ -= context + chunk;
    budget -= chunk;
  }
}

}  // namespace duet::policies
