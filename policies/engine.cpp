// The shared instance engine loop (see engine.h).
#include "policies/engine.h"

#include <algorithm>
#include <cmath>

namespace duet::policies {

const char* ToString(InstanceRole role) {
  switch (role) {
    case InstanceRole::kColocated:
      return "colocated";
    case InstanceRole::kPrefill:
      return "prefill";
    case InstanceRole::kDecode:
      return "decode";
  }
  return "unknown";
}

InstanceEngine::InstanceEngine(EngineConfig config, EnginePorts ports)
    : config_(config),
      ports_(ports),
      blocks_(config.num_blocks, config.block_tokens, config.enable_prefix_caching),
      scheduler_(config.scheduler) {
  DUET_CHECK(ports_.clock && ports_.inbox && ports_.outbox && ports_.executor && ports_.transport &&
             ports_.sink);
  if (ports_.tiers && ports_.tiers->setup().any() && config_.enable_prefix_caching &&
      config_.role != InstanceRole::kDecode) {
    scheduler_.set_lower_tiers(this);
    blocks_.set_eviction_log(&gpu_evicted_);
  }
}

Tokens InstanceEngine::Find(Request& request, std::int64_t first_block, Tokens max_tokens) {
  const TierHits hits = ports_.tiers->Lookup(config_.id, request.block_hashes, first_block,
                                             max_tokens / config_.block_tokens);
  for (int k = 0; k < kNumLowerTiers; ++k)
    request.loading_tokens[static_cast<std::size_t>(k)] =
        hits.blocks[static_cast<std::size_t>(k)] * config_.block_tokens;
  return request.LoadingTokens();
}

bool InstanceEngine::idle() const {
  return scheduler_.waiting().empty() && scheduler_.running().empty() && pulls_waiting_.empty() &&
         pulls_in_flight_.empty() && transferring_ == 0 && loads_.empty() &&
         !(ports_.tiers && ports_.tiers->HasPendingWrites(config_.id));
}

void InstanceEngine::Run() {
  while (true) {
    if (RunOnce()) continue;
    if (shutdown_ && idle()) return;
    ports_.inbox->WaitUntil(kForever);
  }
}

bool InstanceEngine::RunOnce() {
  TakeEvents();
  const Seconds now = ports_.clock->Now();
  StartPulls();

  scheduler_.Schedule(blocks_, plan_);
  for (Request* r : plan_.preempted) {
    ports_.sink->OnPreempted(*r, config_.id);
    for (Load& load : loads_) load.orphaned |= load.request == r;
  }
  const bool overlap = config_.scheduler.overlap_tier_loads;
  for (Request* r : plan_.admitted) {
    if (r->first_scheduled_s < 0) r->first_scheduled_s = now;
    // Blocks up to here were computed elsewhere or come from the tiers: nothing to write down.
    const Tokens present = r->computed_tokens + (overlap ? 0 : r->LoadingTokens());
    r->offloaded_blocks = present / config_.block_tokens;
  }
  StartLoads(now);  // pins the hits before write-back below can evict them
  // New requests that must wait: promote their prefix from the slow tiers while they do.
  for (Request* r : arrived_) {
    if (r->state == RequestState::kQueued)
      ports_.tiers->Prefetch(config_.id, r->block_hashes,
                             blocks_.CachedPrefixBlocks(r->block_hashes));
  }
  arrived_.clear();
  if (!gpu_evicted_.empty()) {
    ports_.tiers->OnGpuEvicted(config_.id, gpu_evicted_);
    gpu_evicted_.clear();
  }
  if (plan_.empty()) return false;
  const bool coalesce =
      config_.coalesce_decode_steps && plan_.prefills.empty() && !plan_.decodes.empty();
  const int max_steps = coalesce ? DecodeRunLength(plan_) : 1;
  step_end_s_.clear();
  ports_.executor->Execute(plan_, config_.tp, max_steps, &step_end_s_);
  DUET_CHECK(!step_end_s_.empty() && static_cast<int>(step_end_s_.size()) <= max_steps);
  if (!plan_.loads.empty() || !loads_.empty()) FinishOverlappedLoads(now, &step_end_s_);
  steps_ += static_cast<std::int64_t>(step_end_s_.size());
  Apply(plan_, step_end_s_, max_steps > 1);
  return true;
}

void InstanceEngine::HandleMessage(const EngineMessage& message) {
  Request* r = message.request;
  switch (message.kind) {
    case EngineMessage::Kind::kNewRequest:
      r->state = RequestState::kQueued;
      scheduler_.AddWaiting(r);
      if (scheduler_.lower_tiers()) arrived_.push_back(r);
      break;
    case EngineMessage::Kind::kKvReady:
      pulls_waiting_.emplace_back(r, message.from);
      break;
    case EngineMessage::Kind::kKvRelease:
      blocks_.Free(r->id);
      --transferring_;
      DUET_CHECK(transferring_ >= 0);
      break;
    case EngineMessage::Kind::kShutdown:
      shutdown_ = true;
      break;
  }
}

void InstanceEngine::PollTransfers(Seconds now) {
  for (std::size_t i = 0; i < pulls_in_flight_.size();) {
    const Pull pull = pulls_in_flight_[i];
    const TransferStatus status = ports_.transport->Poll(pull.transfer);
    if (status == TransferStatus::kInProgress) {
      ++i;
      continue;
    }
    pulls_in_flight_.erase(pulls_in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    Request* r = pull.request;
    // Either way the prefill instance may drop its copy now.
    ports_.outbox->Send(pull.from, {EngineMessage::Kind::kKvRelease, r, config_.id});
    if (status == TransferStatus::kFailed) {
      Fail(r, now, "KV transfer failed");
      continue;
    }
    r->kv_ready_s = now;
    // The first token was sampled by the prefill instance; the client sees it once the
    // decode instance, which streams the response, holds the KV.
    r->first_token_s = now;
    r->last_token_s = now;
    r->state = RequestState::kDecoding;
    scheduler_.AddRunning(r);
  }
}

void InstanceEngine::StartPulls() {
  const std::int64_t watermark_blocks = static_cast<std::int64_t>(
      std::ceil(config_.scheduler.watermark * static_cast<double>(blocks_.num_blocks())));
  while (!pulls_waiting_.empty()) {
    const int busy = static_cast<int>(scheduler_.running().size() + pulls_in_flight_.size());
    if (busy >= config_.scheduler.max_num_seqs) return;
    auto [r, from] = pulls_waiting_.front();
    // Room for the prompt's KV plus the token the first decode step processes.
    const Tokens tokens = r->SequenceTokens();
    if (!blocks_.Allocate(r->id, {}, tokens, 0, watermark_blocks)) return;
    pulls_waiting_.pop_front();
    r->computed_tokens = r->input_tokens;
    r->kv_transfer_bytes = r->input_tokens * config_.kv_bytes_per_token;
    const TransferId id = ports_.transport->Post({r->id, from, config_.id, r->kv_transfer_bytes});
    pulls_in_flight_.push_back({r, from, id});
  }
}

void InstanceEngine::StartLoads(Seconds now) {
  const bool overlap = config_.scheduler.overlap_tier_loads;
  for (Request* r : plan_.loads) {
    TierHits hits;
    for (int k = 0; k < kNumLowerTiers; ++k)
      hits.blocks[static_cast<std::size_t>(k)] =
          r->loading_tokens[static_cast<std::size_t>(k)] / config_.block_tokens;
    // Overlapped, the scheduler already counts the loaded tokens as present.
    const Tokens before = r->computed_tokens - (overlap ? r->LoadingTokens() : 0);
    const LoadId id =
        ports_.tiers->BeginLoad(config_.id, r->block_hashes, before / config_.block_tokens, hits);
    loads_.push_back({r, id, false, overlap, now});
  }
}

void InstanceEngine::TakeEvents() {
  EngineMessage message;
  while (ports_.inbox->TryReceive(&message)) HandleMessage(message);
  const Seconds now = ports_.clock->Now();
  if (ports_.tiers) ports_.tiers->Progress(config_.id);
  PollTransfers(now);
  PollLoads(now);
}

void InstanceEngine::FinishOverlappedLoads(Seconds step_start_s, std::vector<Seconds>* step_end_s) {
  auto waiting = [&](std::vector<Request*>* out) {
    out->clear();
    for (const PrefillItem& p : plan_.prefills) {
      if (p.request->state == RequestState::kLoading) out->push_back(p.request);
    }
    return !out->empty();
  };
  std::vector<Request*> delayed;
  PollLoads(ports_.clock->Now());  // those that finished during the step hid behind it
  if (!waiting(&delayed)) return;
  std::vector<Request*> still;
  while (waiting(&still)) {
    // What else ends meanwhile is taken as between steps (it only queues work), and must be:
    // a finished transfer or message left untaken would end every wait at once.
    ports_.inbox->WaitUntil(kForever);
    TakeEvents();
  }
  // The last layer's KV has just arrived: that layer's share of the step remains.
  const Seconds step_end = step_end_s->back();
  const Seconds end = ports_.clock->Now() + (step_end - step_start_s) / config_.num_layers;
  while (ports_.clock->Now() < end) {
    ports_.inbox->WaitUntil(end);
    TakeEvents();
  }
  for (Request* r : delayed) {
    if (r->prefill_done_s < 0) r->load_wait_s += end - step_end;
  }
  step_end_s->back() = end;
}

void InstanceEngine::PollLoads(Seconds now) {
  for (std::size_t i = 0; i < loads_.size();) {
    const TransferStatus status = ports_.tiers->PollLoad(loads_[i].id);
    if (status == TransferStatus::kInProgress) {
      ++i;
      continue;
    }
    const Load load = loads_[i];
    loads_.erase(loads_.begin() + static_cast<std::ptrdiff_t>(i));
    if (load.orphaned) continue;
    Request* r = load.request;
    DUET_CHECK(r->state == RequestState::kLoading);
    if (status == TransferStatus::kDone) {
      if (!load.overlapped) r->computed_tokens += r->LoadingTokens();
    } else {
      // A failed load is recomputed: those tokens were not served from the cache after all.
      if (load.overlapped) r->computed_tokens -= r->LoadingTokens();
      if (r->preemptions == 0 && r->generated_tokens == 0) {
        r->cached_tokens -= r->LoadingTokens();
        r->tier_hit_tokens = {};
      }
    }
    r->loading_tokens = {};
    if (!load.overlapped && r->prefill_done_s < 0) r->load_wait_s += now - load.started_s;
    r->state = RequestState::kPrefilling;
    // The loaded blocks join this GPU's prefix cache like computed ones.
    blocks_.Register(r->id, r->block_hashes, r->computed_tokens);
  }
}

void InstanceEngine::OffloadComputed(Request* r) {
  const std::int64_t full =
      std::min<std::int64_t>(std::min(r->computed_tokens, r->input_tokens) / config_.block_tokens,
                             static_cast<std::int64_t>(r->block_hashes.size()));
  if (full <= r->offloaded_blocks) return;
  ports_.tiers->OnComputed(config_.id,
                           std::span<const BlockHash>(r->block_hashes)
                               .subspan(static_cast<std::size_t>(r->offloaded_blocks),
                                        static_cast<std::size_t>(full - r->offloaded_blocks)));
  r->offloaded_blocks = full;
}

int InstanceEngine::DecodeRunLength(const StepPlan& plan) {
  Tokens k_max = 1 << 20;
  for (const Request* r : plan.decodes) k_max = std::min(k_max, r->RemainingOutput());
  if (k_max <= 1) return 1;
  // Step s of the run needs room for SequenceTokens() + s tokens. Extend only with blocks that
  // are free without evicting anything, so the run decides exactly what single steps would.
  const std::int64_t free_blocks = blocks_.kv_blocks_uncached_free();
  auto extra_blocks = [&](Tokens k) {
    std::int64_t extra = 0;
    for (const Request* r : plan.decodes) {
      extra += std::max<std::int64_t>(
          0, blocks_.TokensToBlocks(r->SequenceTokens() + k - 1) - blocks_.TableBlocks(r->id));
    }
    return extra;
  };
  Tokens lo = 1, hi = k_max;  // extra_blocks(1) == 0: the scheduler made room for step 0
  while (lo < hi) {
    const Tokens mid = lo + (hi - lo + 1) / 2;
    if (extra_blocks(mid) <= free_blocks) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  for (const Request* r : plan.decodes) {
    DUET_CHECK(blocks_.GrowWithoutEviction(r->id, r->SequenceTokens() + lo - 1));
  }
  return static_cast<int>(lo);
}

void InstanceEngine::Apply(const StepPlan& plan, const std::vector<Seconds>& step_end_s,
                           bool coalesced) {
  const Seconds end_s = step_end_s.back();
  for (const PrefillItem& item : plan.prefills) {
    Request* r = item.request;
    r->computed_tokens += item.tokens;
    blocks_.Register(r->id, r->block_hashes, std::min(r->computed_tokens, r->input_tokens));
    if (scheduler_.lower_tiers()) OffloadComputed(r);
    if (r->computed_tokens == r->prefill_target) FinishPrefill(r, end_s);
  }
  if (plan.decodes.empty()) return;
  // Inter-token gaps: the first step's gap depends on each request's previous token; later
  // steps of a run are one step duration for every request of the batch.
  for (const Request* r : plan.decodes)
    ports_.sink->OnTokenGaps(step_end_s[0] - r->last_token_s, 1);
  for (std::size_t s = 1; s < step_end_s.size(); ++s) {
    ports_.sink->OnTokenGaps(step_end_s[s] - step_end_s[s - 1],
                             static_cast<std::int64_t>(plan.decodes.size()));
  }
  const Tokens steps = static_cast<Tokens>(step_end_s.size());
  for (Request* r : plan.decodes) {
    r->generated_tokens += steps;
    r->computed_tokens = r->SequenceTokens() - 1;
    r->last_token_s = end_s;
    if (r->generated_tokens >= r->output_tokens) {
      Complete(r, end_s);
    } else if (coalesced) {
      blocks_.Shrink(r->id, r->computed_tokens);  // a run stopped early returns unused blocks
    }
  }
}

void InstanceEngine::FinishPrefill(Request* r, Seconds t) {
  ++r->generated_tokens;
  if (r->prefill_done_s < 0) {
    r->prefill_done_s = t;
    ports_.sink->OnPrefillDone(*r);
  }
  if (config_.role == InstanceRole::kPrefill && r->generated_tokens < r->output_tokens) {
    scheduler_.RemoveRunning(r);
    r->state = RequestState::kTransferring;
    ++transferring_;
    ports_.outbox->Send(r->decode_instance, {EngineMessage::Kind::kKvReady, r, config_.id});
    return;
  }
  if (r->first_token_s < 0) {
    r->first_token_s = t;
  } else {
    ports_.sink->OnTokenGaps(t - r->last_token_s, 1);  // the token after a recompute
  }
  r->last_token_s = t;
  r->state = RequestState::kDecoding;
  if (r->generated_tokens >= r->output_tokens) Complete(r, t);
}

void InstanceEngine::Complete(Request* r, Seconds t) {
  r->state = RequestState::kCompleted;
  r->finished_s = t;
  scheduler_.RemoveRunning(r);
  blocks_.Free(r->id);
  ports_.sink->OnFinished(*r);
}

void InstanceEngine::Fail(Request* r, Seconds t, const std::string& reason) {
  r->state = RequestState::kFailed;
  r->finished_s = t;
  r->reason = reason;
  scheduler_.RemoveRunning(r);
  blocks_.Free(r->id);
  ports_.sink->OnFinished(*r);
}

Status InstanceEngine::CheckInvariants() const {
  DUET_RETURN_IF_ERROR(blocks_.CheckInvariants());
  if (idle() && blocks_.kv_blocks_used() != 0) {
    return Status::Error("instance " + std::to_string(config_.id) + " is idle but " +
                         std::to_string(blocks_.kv_blocks_used()) + " KV blocks are still in use");
  }
  return Status::Ok();
}

}  // namespace duet::policies
