// The shared instance engine loop (see engine.h).
#include "policies/engine.h"

#include <algorithm>
#include <cmath>

#include "policies/block_hash.h"

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

Result<KvLoadFailurePolicy> ParseKvLoadFailurePolicy(const std::string& name) {
  if (name == "fail") return KvLoadFailurePolicy::kFail;
  if (name == "recompute") return KvLoadFailurePolicy::kRecompute;
  return Status::Error("unknown kv_load_failure_policy '" + name + "' (fail or recompute)");
}

const char* ToString(KvLoadFailurePolicy policy) {
  return policy == KvLoadFailurePolicy::kFail ? "fail" : "recompute";
}

void BlockingStepExecutor::Submit(const StepPlan& plan, StepEvents& events) {
  DUET_CHECK_MSG(plan_ == nullptr, "a blocking executor holds one step at a time");
  plan_ = &plan;
  events_ = &events;
}

void BlockingStepExecutor::Wait(StepResult* result) {
  DUET_CHECK_MSG(plan_ != nullptr, "no step was submitted");
  const StepPlan& plan = *plan_;
  plan_ = nullptr;
  Execute(plan, *events_, result);
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
    blocks_.set_event_log(&cache_events_);
  }
  if (config_.publish_kv_events) blocks_.set_event_log(&cache_events_);
  if (config_.async_steps) {
    DUET_CHECK_MSG(ports_.executor->max_in_flight() >= 2 && ports_.executor->NeedsInputs(),
                   "asynchronous steps need an executor that holds two steps and reads rows");
    max_in_flight_ = 2;
  }
  if (ports_.host_clock) {
    timed_sink_.emplace(*ports_.sink, *ports_.host_clock);
    ports_.sink = &*timed_sink_;
    scheduler_.set_host_clock(ports_.host_clock);
  }
}

template <typename F>
void InstanceEngine::TimedSink::Timed(F&& call) {
  const Seconds start = clock_.Now();
  call();
  seconds += clock_.Now() - start;
}
void InstanceEngine::TimedSink::OnFinished(const RequestSpec& spec, const RequestRecord& record) {
  Timed([&] { sink_.OnFinished(spec, record); });
}
void InstanceEngine::TimedSink::OnPrefillDone(const RequestSpec& spec,
                                              const RequestRecord& record) {
  Timed([&] { sink_.OnPrefillDone(spec, record); });
}
void InstanceEngine::TimedSink::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  Timed([&] { sink_.OnTokenGaps(gap_s, count); });
}
void InstanceEngine::TimedSink::OnTokenGapsOf(Seconds gap_s, std::span<const RequestId> requests) {
  Timed([&] { sink_.OnTokenGapsOf(gap_s, requests); });
}
void InstanceEngine::TimedSink::OnPreempted(const RequestSpec& spec, const RequestRecord& record,
                                            InstanceId instance) {
  Timed([&] { sink_.OnPreempted(spec, record, instance); });
}
void InstanceEngine::TimedSink::OnToken(const RequestSpec& spec, const RequestRecord& record,
                                        std::int32_t token) {
  Timed([&] { sink_.OnToken(spec, record, token); });
}
void InstanceEngine::TimedSink::OnKvEvents(InstanceId instance,
                                           std::span<const KvCacheEvent> events) {
  Timed([&] { sink_.OnKvEvents(instance, events); });
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
  return in_flight_ == 0 && scheduler_.waiting().empty() && scheduler_.running().empty() &&
         pulls_waiting_.empty() && pulls_in_flight_.empty() && leases_.empty() && loads_.empty() &&
         !(ports_.tiers && ports_.tiers->HasPendingWrites(config_.id));
}

void InstanceEngine::Run() {
  while (true) {
    if (RunOnce()) continue;
    if (shutdown_ && idle()) return;
    ports_.inbox->WaitUntil(kForever);
  }
}

Request* InstanceEngine::Held(RequestId id) const {
  const auto it = held_.find(id);
  DUET_CHECK_MSG(it != held_.end(), "request " + std::to_string(id) + " is not held by instance " +
                                        std::to_string(config_.id));
  return it->second.get();
}

bool InstanceEngine::Plan(Seconds now, InFlight& step) {
  StepPlan& plan = step.plan;
  // The plan names its requests by id; the scheduler hands over its entries' requests too, for
  // everything the engine does with them until it applied the step, with no lookup per row.
  scheduler_.Schedule(blocks_, plan, step.requests);
  for (const RequestId id : plan.preempted) {
    Request* r = Held(id);
    ports_.sink->OnPreempted(r->spec(), r->record(), config_.id);
    for (Load& load : loads_) load.orphaned |= load.request == r;
  }
  const bool overlap = config_.scheduler.overlap_tier_loads;
  for (const RequestId id : plan.admitted) {
    Request* r = Held(id);
    if (r->first_scheduled_s < 0) r->first_scheduled_s = now;
    // Blocks up to here were computed elsewhere or come from the tiers: nothing to write down.
    const Tokens present = r->computed_tokens + (overlap ? 0 : r->LoadingTokens());
    r->offloaded_blocks = present / config_.block_tokens;
  }
  StartLoads(now, plan);  // pins the hits before write-back below can evict them
  // New requests that must wait: promote their prefix from the slow tiers while they do.
  for (Request* r : arrived_) {
    if (r->state == RequestState::kQueued)
      ports_.tiers->Prefetch(config_.id, r->block_hashes,
                             blocks_.CachedPrefixBlocks(r->block_hashes));
  }
  arrived_.clear();
  if (scheduler_.lower_tiers()) OffloadEvicted();
  return !plan.empty();
}

void InstanceEngine::Submit(InFlight& step, Seconds now) {
  step.coalesced = PrepareExecution(now, step);
  step.result.clear();
  if (plans_ahead()) {
    blocks_.Pin(step.plan.block_ids);
    Advance(step, 1);
  }
  in_step_ = true;
  ports_.executor->Submit(step.plan, *this);
  in_step_ = false;
  ++in_flight_;
  ++submitted_;
}

bool InstanceEngine::RunOnce() {
  const Clock* host = ports_.host_clock;
  const Seconds begin = host ? host->Now() : 0;
  if (host) timed_sink_->seconds = 0;
  finished_in_iteration_ = 0;
  const std::int64_t ended = submitted_ - in_flight_;
  std::erase_if(retired_, [&](const auto& retired) { return retired.first <= ended; });
  TakeEvents();
  const Seconds now = ports_.clock->Now();
  StartPulls(now);
  InFlight* next = nullptr;
  if (in_flight_ < max_in_flight_ && Plan(now, in_flight(in_flight_)))
    next = &in_flight(in_flight_);
  if (!next && in_flight_ == 0) {
    PublishCacheEvents();
    return false;
  }
  const Seconds planned = host ? host->Now() : 0;
  if (next) Submit(*next, now);
  const Seconds launched = host ? host->Now() : 0;
  if (next && in_flight_ < max_in_flight_) {  // the pipeline fills: plan another step first
    PublishCacheEvents();
    return true;
  }
  InFlight& step = in_flight(0);
  in_step_ = true;
  ports_.executor->Wait(&step.result);
  in_step_ = false;
  first_ = (first_ + 1) % 2;
  --in_flight_;
  const Seconds returned = host ? host->Now() : 0;
  const Seconds sink_before_apply = host ? timed_sink_->seconds : 0;
  const StepResult& result = step.result;
  DUET_CHECK(!result.step_end_s.empty() &&
             static_cast<int>(result.step_end_s.size()) <= step.plan.max_steps);
  if (!loads_.empty()) PollLoads(ports_.clock->Now());
  // Overlapped loads that outlasted the computation: their requests waited that long.
  for (const AwaitedLoad& a : step.plan.awaited_loads) {
    const auto& delayed = result.delayed_by_loads;
    if (std::find(delayed.begin(), delayed.end(), a.request) == delayed.end()) continue;
    Request* r = Held(a.request);
    if (r->prefill_done_s < 0) r->load_wait_s += result.load_wait_s;
  }
  steps_ += static_cast<std::int64_t>(result.step_end_s.size());
  if (result.status.ok()) {
    if (!plans_ahead()) Advance(step, static_cast<Tokens>(result.step_end_s.size()));
    Apply(step);
  } else {
    FailStep(step, result.status.message(), result.step_end_s.back());
  }
  if (plans_ahead()) blocks_.Unpin(step.plan.block_ids);
  for (const RequestId id : deferred_aborts_) Abort(id, ports_.clock->Now());
  deferred_aborts_.clear();
  PublishCacheEvents();
  if (host) RecordHostStep(step, begin, planned, launched, returned, sink_before_apply);
  return true;
}

void InstanceEngine::RecordHostStep(const InFlight& step, Seconds begin, Seconds planned,
                                    Seconds launched, Seconds returned, Seconds sink_before_apply) {
  using models::HostPhase;
  const Seconds end = ports_.host_clock->Now();
  const Seconds sink_s = timed_sink_->seconds;
  models::HostStep& h = host_step_;
  h.at(HostPhase::kAllocate) = scheduler_.allocation_s();
  h.at(HostPhase::kSchedule) =
      std::max(0.0, planned - begin - scheduler_.allocation_s() - sink_before_apply);
  h.at(HostPhase::kPrepare) = launched - planned + step.result.prepare_s;
  h.at(HostPhase::kSample) = step.result.sample_s;
  h.at(HostPhase::kApply) = std::max(0.0, end - returned - (sink_s - sink_before_apply));
  h.at(HostPhase::kStream) = sink_s;
  h.counts = {static_cast<double>(step.plan.prefills.size() + step.plan.decodes.size()),
              static_cast<double>(step.plan.admitted.size()),
              static_cast<double>(finished_in_iteration_),
              static_cast<double>(step.result.tokens.size())};
}

void InstanceEngine::OffloadEvicted() {
  evicted_.clear();
  evicted_blocks_.clear();
  for (std::size_t i = events_to_tiers_; i < cache_events_.size(); ++i) {
    if (!cache_events_[i].stored) {
      evicted_.push_back(cache_events_[i].hash);
      evicted_blocks_.push_back(cache_events_[i].block);
    }
  }
  events_to_tiers_ = cache_events_.size();
  if (!evicted_.empty()) ports_.tiers->OnGpuEvicted(config_.id, evicted_, evicted_blocks_);
}

void InstanceEngine::PublishCacheEvents() {
  if (config_.publish_kv_events && !cache_events_.empty())
    ports_.sink->OnKvEvents(config_.id, cache_events_);
  cache_events_.clear();
  events_to_tiers_ = 0;
}

bool InstanceEngine::PrepareExecution(Seconds now, InFlight& step) {
  StepPlan& plan = step.plan;
  plan.tp = config_.tp;
  plan.num_layers = config_.num_layers;
  // Not with speculative decoding: a run's steps would gain unequal tokens.
  const bool coalesce = config_.coalesce_decode_steps && ports_.executor->CoalescesDecodeRuns() &&
                        max_in_flight_ == 1 && plan.prefills.empty() && !plan.decodes.empty() &&
                        !config_.scheduler.speculative.enabled();
  plan.max_steps = coalesce ? DecodeRunLength(plan) : 1;
  for (const Load& load : loads_) {
    if (load.overlapped && !load.orphaned && load.request->state == RequestState::kLoading)
      plan.awaited_loads.push_back({load.request->id, load.id});
  }
  if (ports_.executor->NeedsInputs()) plan.SnapshotInputs(step.requests, blocks_);
  return plan.max_steps > 1;
}

void InstanceEngine::HandleMessage(const EngineMessage& message) {
  switch (message.kind) {
    case EngineMessage::Kind::kNewRequest: {
      Request* r = Hold(message.request);
      r->state = RequestState::kQueued;
      scheduler_.AddWaiting(r);
      if (scheduler_.lower_tiers()) arrived_.push_back(r);
      break;
    }
    case EngineMessage::Kind::kKvReady: {
      Request* r = Hold(message.request);
      if (early_aborts_.erase(r->id) > 0) {  // the client went away during the handoff
        ReleaseKv(message.from, r);
        Fail(r, ports_.clock->Now(), "aborted", FinishReason::kAbort);
        break;
      }
      r->kv_arrived_s = message.delivered_s >= 0 ? message.delivered_s : ports_.clock->Now();
      pulls_waiting_.push_back({r, message.from, message.blocks, message.lease_expires_s});
      break;
    }
    case EngineMessage::Kind::kKvRelease:
      // By id: the request may be gone by now. Nothing to do when its lease ended first.
      if (leases_.erase(message.request_id) > 0) blocks_.Free(message.request_id);
      break;
    case EngineMessage::Kind::kShutdown:
      shutdown_ = true;
      break;
    case EngineMessage::Kind::kAbort:
      // A step in flight reads its requests: the abort takes effect at its end.
      if (in_step_) {
        deferred_aborts_.push_back(message.request_id);
      } else {
        Abort(message.request_id, ports_.clock->Now());
      }
      break;
  }
}

void InstanceEngine::Abort(RequestId id, Seconds now) {
  const std::string reason = "aborted";
  if (Request* r = scheduler_.Find(id)) {
    scheduler_.Remove(r);
    for (Load& load : loads_) load.orphaned |= load.request == r;
    std::erase(arrived_, r);
    r->loading_tokens = {};
    Fail(r, now, reason, FinishReason::kAbort);
    return;
  }
  for (auto it = pulls_waiting_.begin(); it != pulls_waiting_.end(); ++it) {
    if (it->request->id != id) continue;
    Request* r = it->request;
    const InstanceId from = it->from;
    pulls_waiting_.erase(it);
    ReleaseKv(from, r);
    Fail(r, now, reason, FinishReason::kAbort);
    return;
  }
  for (Pull& pull : pulls_in_flight_) {
    if (pull.request->id != id) continue;
    pull.aborted = true;
    return;
  }
  // Otherwise it finished already, or (PD prefill) its KV is on its way to the decode instance,
  // which serves it from then on, or (PD decode) its kKvReady is still on its way here.
  if (config_.role != InstanceRole::kDecode || config_.kv_lease_s == kForever) return;
  while (!early_abort_expiry_.empty() && early_abort_expiry_.front().first <= now) {
    early_aborts_.erase(early_abort_expiry_.front().second);
    early_abort_expiry_.pop_front();
  }
  if (early_aborts_.insert(id).second)
    early_abort_expiry_.emplace_back(now + config_.kv_lease_s, id);
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
    ReleaseKv(pull.from, r);
    if (pull.aborted) {
      Fail(r, now, "aborted", FinishReason::kAbort);
      continue;
    }
    if (status == TransferStatus::kFailed) {
      KvLoadFailed(r, now,
                   "the KV transfer from instance " + std::to_string(pull.from) + " failed");
      continue;
    }
    if (now > pull.lease_expires_s) {
      // The prefill instance may have reused the blocks while they were read.
      KvLoadFailed(r, now,
                   "the KV lease on instance " + std::to_string(pull.from) +
                       " ended before the transfer was seen complete");
      continue;
    }
    r->kv_ready_s = now;
    // The first token was sampled by the prefill instance; the client sees it once the
    // decode instance, which streams the response, holds the KV.
    r->first_token_s = now;
    r->last_token_s = now;
    r->state = RequestState::kDecoding;
    scheduler_.AddRunning(r);
    if (!r->output_ids.empty()) ports_.sink->OnToken(r->spec(), r->record(), r->output_ids.back());
  }
}

void InstanceEngine::ReleaseKv(InstanceId from, Request* r) {
  EngineMessage m{EngineMessage::Kind::kKvRelease, nullptr, config_.id};
  m.request_id = r->id;
  ports_.outbox->Send(from, m);
}

void InstanceEngine::KvLoadFailed(Request* r, Seconds now, const std::string& why) {
  ++kv_load_failures_;
  blocks_.Free(r->id);
  if (config_.kv_load_failure_policy == KvLoadFailurePolicy::kFail) {
    Fail(r, now, why, FinishReason::kError);
    return;
  }
  ++kv_load_recomputes_;
  // The client gets the prefill instance's first token now, and this instance computes the
  // prompt's KV and that token's itself, as after a preemption.
  r->first_token_s = now;
  r->last_token_s = now;
  if (!r->output_ids.empty()) ports_.sink->OnToken(r->spec(), r->record(), r->output_ids.back());
  r->computed_tokens = 0;
  r->kv_transfer_bytes = 0;
  r->state = RequestState::kQueued;
  scheduler_.AddWaiting(r);
}

void InstanceEngine::ExpireLeases(Seconds now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    blocks_.Free(it->first);
    ++leases_expired_;
    it = leases_.erase(it);
  }
}

InstanceLoad InstanceEngine::CurrentLoad() const {
  InstanceLoad l;
  l.waiting = static_cast<std::int64_t>(scheduler_.waiting().size());
  l.running = static_cast<std::int64_t>(scheduler_.running().size());
  l.kv_blocks_used = blocks_.kv_blocks_used();
  l.kv_blocks_free = blocks_.kv_blocks_free();
  l.kv_blocks_total = blocks_.num_blocks();
  l.leases_held = leases_held();
  l.leases_expired = leases_expired_;
  l.kv_load_failures = kv_load_failures_;
  l.kv_load_recomputes = kv_load_recomputes_;
  l.forward_failures = forward_failures_;
  return l;
}

Seconds InstanceEngine::next_lease_expiry() const {
  Seconds first = kForever;
  for (const auto& [id, expires] : leases_) first = std::min(first, expires);
  return first;
}

void InstanceEngine::StartPulls(Seconds now) {
  const std::int64_t watermark_blocks = config_.scheduler.WatermarkBlocks(blocks_.num_blocks());
  while (!pulls_waiting_.empty()) {
    const int busy = static_cast<int>(scheduler_.running().size() + pulls_in_flight_.size());
    if (busy >= config_.scheduler.max_num_seqs) return;
    Request* r = pulls_waiting_.front().request;
    const InstanceId from = pulls_waiting_.front().from;
    const Seconds lease_expires_s = pulls_waiting_.front().lease_expires_s;
    if (now >= lease_expires_s) {  // waited too long for room: the KV is gone
      pulls_waiting_.pop_front();
      ReleaseKv(from, r);
      KvLoadFailed(r, now,
                   "the KV lease on instance " + std::to_string(from) +
                       " ended before this instance had room to pull");
      continue;
    }
    // Room for the prompt's KV plus the token the first decode step processes.
    const Tokens tokens = r->SequenceTokens();
    if (!blocks_.Allocate(r->id, {}, tokens, 0, watermark_blocks)) return;
    r->computed_tokens = r->input_tokens;
    r->kv_transfer_bytes = r->input_tokens * config_.kv_bytes_per_token;
    r->kv_pull_started_s = now;
    const TransferId id =
        ports_.transport->Post({r->id, from, config_.id, r->kv_transfer_bytes,
                                pulls_waiting_.front().blocks, blocks_.Table(r->id)});
    pulls_waiting_.pop_front();
    pulls_in_flight_.push_back({r, from, id, false, lease_expires_s});
  }
}

void InstanceEngine::StartLoads(Seconds now, const StepPlan& plan) {
  const bool overlap = config_.scheduler.overlap_tier_loads;
  for (const RequestId request : plan.loads) {
    Request* r = Held(request);
    TierHits hits;
    for (int k = 0; k < kNumLowerTiers; ++k)
      hits.blocks[static_cast<std::size_t>(k)] =
          r->loading_tokens[static_cast<std::size_t>(k)] / config_.block_tokens;
    // Overlapped, the scheduler already counts the loaded tokens as present.
    const Tokens before = r->computed_tokens - (overlap ? r->LoadingTokens() : 0);
    const std::int64_t first = before / config_.block_tokens;
    DUET_CHECK(blocks_.TableBlocks(r->id) >= first + hits.total());
    const LoadId id = ports_.tiers->BeginLoad(
        config_.id, r->block_hashes, first, hits,
        blocks_.Table(r->id).subspan(static_cast<std::size_t>(first),
                                     static_cast<std::size_t>(hits.total())));
    loads_.push_back({r, id, false, overlap, now});
  }
}

void InstanceEngine::TakeEvents() {
  EngineMessage message;
  while (ports_.inbox->TryReceive(&message)) HandleMessage(message);
  const Seconds now = ports_.clock->Now();
  if (ports_.tiers) ports_.tiers->Progress(config_.id);
  if (!leases_.empty()) ExpireLeases(now);
  PollTransfers(now);
  PollLoads(now);
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
      // The tier lost those blocks (and forgot them): computed again, they are written again.
      r->offloaded_blocks =
          std::min(r->offloaded_blocks, r->computed_tokens / config_.block_tokens);
    }
    r->loading_tokens = {};
    if (!load.overlapped && r->prefill_done_s < 0) r->load_wait_s += now - load.started_s;
    r->state = RequestState::kPrefilling;
    // The loaded blocks join this GPU's prefix cache like computed ones.
    blocks_.Register(r->id, r->block_hashes, r->computed_tokens);
  }
}

void InstanceEngine::OffloadComputed(Request* r, Tokens computed) {
  const std::int64_t full =
      std::min<std::int64_t>(std::min(computed, r->input_tokens) / config_.block_tokens,
                             static_cast<std::int64_t>(r->block_hashes.size()));
  if (full <= r->offloaded_blocks) return;
  const auto from = static_cast<std::size_t>(r->offloaded_blocks);
  const auto count = static_cast<std::size_t>(full - r->offloaded_blocks);
  ports_.tiers->OnComputed(config_.id,
                           std::span<const BlockHash>(r->block_hashes).subspan(from, count),
                           blocks_.Table(r->id).subspan(from, count));
  r->offloaded_blocks = full;
}

int InstanceEngine::DecodeRunLength(const StepPlan& plan) {
  Tokens k_max = 1 << 20;
  for (const DecodeItem& d : plan.decodes) k_max = std::min(k_max, d.remaining_output);
  if (k_max <= 1) return 1;
  // Step s of the run needs room for the sequence (context + 1 tokens) + s tokens. Extend only
  // with blocks that are free without evicting anything, so the run decides exactly what single
  // steps would.
  const std::int64_t free_blocks = blocks_.kv_blocks_uncached_free();
  auto extra_blocks = [&](Tokens k) {
    std::int64_t extra = 0;
    for (const DecodeItem& d : plan.decodes) {
      extra += std::max<std::int64_t>(
          0, blocks_.TokensToBlocks(d.context + k) - blocks_.TableBlocks(d.request));
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
  for (const DecodeItem& d : plan.decodes) {
    DUET_CHECK(blocks_.GrowWithoutEviction(d.request, d.context + lo));
  }
  return static_cast<int>(lo);
}

void InstanceEngine::Advance(InFlight& step, Tokens steps) {
  const bool ahead = plans_ahead();  // the next plan is made before this step ends
  step.generated_after.clear();
  step.ends_prefill.clear();
  std::size_t entry = 0;
  for (const PrefillItem& item : step.plan.prefills) {
    Request* r = step.requests[entry++];
    r->computed_tokens += item.tokens;
    const bool ends = r->computed_tokens == r->prefill_target;
    if (ends) ++r->generated_tokens;
    step.generated_after.push_back(r->generated_tokens);
    step.ends_prefill.push_back(ends);
    if (!ahead || !ends) continue;
    // Planned on as if it continued: a request whose output is complete, or whose KV goes to a
    // decode instance, leaves the batch; the others decode from the next step on.
    if (r->generated_tokens >= r->output_tokens || config_.role == InstanceRole::kPrefill) {
      scheduler_.RemoveRunning(r);
    } else {
      r->state = RequestState::kDecoding;
    }
  }
  const SpeculativeConfig& speculative = config_.scheduler.speculative;
  for (Request* r : std::span<Request* const>(step.requests).subspan(entry)) {
    // With speculative decoding (one step at a time), its token and the drafts it kept.
    r->generated_tokens +=
        speculative.enabled()
            ? 1 + std::min<Tokens>(speculative.Accepted(r->id, r->generated_tokens),
                                   speculative.DraftsFor(*r))
            : steps;
    r->computed_tokens = r->SequenceTokens() - 1;
    step.generated_after.push_back(r->generated_tokens);
    if (ahead && r->generated_tokens >= r->output_tokens) scheduler_.RemoveRunning(r);
  }
}

void InstanceEngine::Apply(const InFlight& step) {
  const StepPlan& plan = step.plan;
  const std::vector<Seconds>& step_end_s = step.result.step_end_s;
  const Seconds end_s = step_end_s.back();
  // Real executors return the token of each request that completed its prefill or decoded,
  // in plan order; simulated ones none.
  const std::vector<SampledToken>& tokens = step.result.tokens;
  const SampledToken* token = tokens.empty() ? nullptr : tokens.data();
  const SampledToken* const tokens_end = token + tokens.size();
  auto next_token = [&](const Request* r) -> const SampledToken* {
    if (!token) return nullptr;
    DUET_CHECK_MSG(token != tokens_end && token->request == r->id,
                   "step result tokens do not follow the plan");
    return token++;
  };
  std::size_t entry = 0;
  for (const PrefillItem& item : plan.prefills) {
    Request* r = step.requests[entry];
    const Tokens generated = step.generated_after[entry];
    const bool ends = step.ends_prefill[entry++] != 0;
    const SampledToken* t = ends ? next_token(r) : nullptr;
    if (Gone(r)) continue;
    // Preempted while the step ran (asynchronous steps), it holds no blocks; its token counts.
    if (r->state != RequestState::kQueued) {
      const Tokens computed = item.context + item.tokens;
      blocks_.Register(r->id, r->block_hashes, std::min(computed, r->input_tokens));
      if (scheduler_.lower_tiers()) OffloadComputed(r, computed);
    }
    if (ends) FinishPrefill(r, end_s, t, generated);
  }
  if (plan.decodes.empty()) return;
  // Inter-token gaps: the first step's gap depends on each request's previous token; later
  // steps of a run are one step duration for every request of the batch.
  const auto decodes = std::span<Request* const>(step.requests).subspan(plan.prefills.size());
  gap_requests_.clear();
  for (const Request* r : decodes) {
    gap_requests_.push_back(r->id);
    if (!Gone(r)) ports_.sink->OnTokenGapsOf(step_end_s[0] - r->last_token_s, {&r->id, 1});
  }
  for (std::size_t s = 1; s < step_end_s.size(); ++s)
    ports_.sink->OnTokenGapsOf(step_end_s[s] - step_end_s[s - 1], gap_requests_);
  for (Request* r : decodes) {
    const Tokens generated = step.generated_after[entry++];
    const SampledToken* t = next_token(r);
    if (Gone(r)) continue;  // a token sampled past its end: dropped
    // Unset, it is this step's: the first of a run, or of a step that kept drafts.
    if (r->second_token_s < 0 && generated >= 2) r->second_token_s = step_end_s[0];
    r->last_token_s = end_s;
    if (t) {
      r->output_ids.push_back(t->token);
      ports_.sink->OnToken(r->spec(), r->record(), t->token);
    }
    if (t && t->stop) {
      End(r, end_s, FinishReason::kStop, generated);
    } else if (generated >= r->output_tokens) {
      End(r, end_s, FinishReason::kLength, generated);
    } else if (step.coalesced) {
      blocks_.Shrink(r->id, r->computed_tokens);  // a run stopped early returns unused blocks
    }
  }
  DUET_CHECK(token == nullptr || token == tokens_end);
}

void InstanceEngine::FailStep(const InFlight& step, const std::string& why, Seconds now) {
  ++forward_failures_;
  // The scheduler counted each prefill chunk as done when it planned it; with the chunk counted
  // in computed_tokens too, Remove forgets exactly the prefill work still pending. Nothing is
  // registered in the prefix cache: the blocks the step wrote hold no KV to trust.
  if (!plans_ahead()) {
    for (std::size_t i = 0; i < step.plan.prefills.size(); ++i)
      step.requests[i]->computed_tokens += step.plan.prefills[i].tokens;
  }
  auto fail = [&](Request* r) {
    if (Gone(r)) return;
    scheduler_.Remove(r);
    for (Load& load : loads_) load.orphaned |= load.request == r;
    r->loading_tokens = {};
    Fail(r, now, why, FinishReason::kError);
  };
  for (Request* r : step.requests) fail(r);
}

void InstanceEngine::FinishPrefill(Request* r, Seconds t, const SampledToken* token,
                                   Tokens generated) {
  if (token) r->output_ids.push_back(token->token);
  if (r->prefill_done_s < 0) {
    r->prefill_done_s = t;
    ports_.sink->OnPrefillDone(r->spec(), r->record());
  }
  const bool stop = token && token->stop;
  if (config_.role == InstanceRole::kPrefill && generated < r->output_tokens && !stop) {
    // The first token travels with the request; the decode instance delivers it.
    scheduler_.RemoveRunning(r);
    r->state = RequestState::kTransferring;
    const Seconds lease_expires_s = t + config_.kv_lease_s;
    leases_.emplace(r->id, lease_expires_s);
    // The blocks holding the prompt's KV (the first sampled token's is computed by decode).
    const auto prompt_blocks = static_cast<std::size_t>(
        (r->input_tokens + config_.block_tokens - 1) / config_.block_tokens);
    DUET_CHECK(blocks_.Table(r->id).size() >= prompt_blocks);
    const auto table = blocks_.Table(r->id).first(prompt_blocks);
    const InstanceId decode = r->decode_instance;
    ports_.outbox->Send(decode, {EngineMessage::Kind::kKvReady,
                                 Release(r),
                                 config_.id,
                                 0,
                                 {table.begin(), table.end()},
                                 lease_expires_s});
    return;
  }
  if (r->first_token_s < 0) {
    r->first_token_s = t;
  } else {
    ports_.sink->OnTokenGapsOf(t - r->last_token_s, {&r->id, 1});  // the token after a recompute
    if (r->second_token_s < 0) r->second_token_s = t;
  }
  r->last_token_s = t;
  if (r->state != RequestState::kQueued) r->state = RequestState::kDecoding;
  if (token) ports_.sink->OnToken(r->spec(), r->record(), token->token);
  if (stop) {
    End(r, t, FinishReason::kStop, generated);
  } else if (generated >= r->output_tokens) {
    End(r, t, FinishReason::kLength, generated);
  }
}

void InstanceEngine::End(Request* r, Seconds t, FinishReason reason, Tokens generated) {
  r->generated_tokens = generated;
  r->computed_tokens = r->SequenceTokens() - 1;
  if (r->state == RequestState::kQueued) scheduler_.Remove(r);  // preempted while it ran
  Complete(r, t, reason);
}

void InstanceEngine::Complete(Request* r, Seconds t, FinishReason reason) {
  r->state = RequestState::kCompleted;
  r->finish_reason = reason;
  r->finished_s = t;
  scheduler_.RemoveRunning(r);
  // Hashes past the prompt name its output's blocks: they join the prefix cache where the
  // request ran whole, for a later turn that continues this context. The real backend names
  // them by the tokens generated, as vLLM does for every request; the simulator's hashes reach
  // past the prompt only for a request that a later turn of its trace continues.
  if (config_.role == InstanceRole::kColocated && blocks_.HasTable(r->id)) {
    std::vector<BlockHash> sequence_hashes;  // real backend: of the prompt and the output
    if (!r->output_ids.empty()) {
      std::vector<std::int32_t> sequence = r->prompt_ids;
      sequence.insert(sequence.end(), r->output_ids.begin(), r->output_ids.end());
      sequence_hashes = TokenBlockHashes(sequence, config_.block_tokens);
    }
    const std::vector<BlockHash>& hashes =
        r->output_ids.empty() ? r->block_hashes : sequence_hashes;
    if (static_cast<Tokens>(hashes.size()) * config_.block_tokens > r->input_tokens)
      blocks_.Register(r->id, hashes, r->computed_tokens);
  }
  blocks_.Free(r->id);
  ports_.sink->OnFinished(r->spec(), r->record());
  Retire(r);
}

void InstanceEngine::Fail(Request* r, Seconds t, const std::string& reason, FinishReason finish) {
  r->state = RequestState::kFailed;
  r->finish_reason = finish;
  r->finished_s = t;
  r->reason = reason;
  scheduler_.RemoveRunning(r);
  blocks_.Free(r->id);
  ports_.sink->OnFinished(r->spec(), r->record());
  Retire(r);
}

Request* InstanceEngine::Hold(std::shared_ptr<Request> request) {
  DUET_CHECK_MSG(request != nullptr, "a new request or KV-ready message without its request");
  Request* r = request.get();
  const bool fresh = held_.emplace(r->id, std::move(request)).second;
  DUET_CHECK_MSG(fresh, "request " + std::to_string(r->id) + " is already held by instance " +
                            std::to_string(config_.id));
  return r;
}

std::shared_ptr<Request> InstanceEngine::Release(Request* r) {
  auto it = held_.find(r->id);
  DUET_CHECK(it != held_.end() && it->second.get() == r);
  std::shared_ptr<Request> handle = std::move(it->second);
  held_.erase(it);
  return handle;
}

void InstanceEngine::Retire(Request* r) {
  retired_.emplace_back(submitted_, Release(r));
  ++finished_in_iteration_;
}

Status InstanceEngine::CheckInvariants() const {
  DUET_RETURN_IF_ERROR(blocks_.CheckInvariants());
  if (in_flight_ > 0) {
    // Who holds each block now: a block a step in flight reads or writes may be shared only
    // as a prefix-cache block (its contents are its hash's, whoever holds it).
    std::unordered_multimap<KvBlockManager::BlockId, RequestId> holders;
    blocks_.ForEachTable([&](RequestId id, std::span<const KvBlockManager::BlockId> table) {
      for (const KvBlockManager::BlockId b : table) holders.emplace(b, id);
    });
    for (int k = 0; k < in_flight_; ++k) {
      const StepPlan& plan = in_flight(k).plan;
      for (std::size_t i = 0; i < plan.rows.size(); ++i) {
        const RequestId id = plan.rows[i].request;
        for (const KvBlockManager::BlockId b : plan.BlockTable(i)) {
          const std::string block = "block " + std::to_string(b) + " of request " +
                                    std::to_string(id) + " in a step in flight";
          if (!blocks_.InUse(b)) return Status::Error(block + " is free");
          if (blocks_.Cached(b)) continue;
          const auto [from, to] = holders.equal_range(b);
          for (auto it = from; it != to; ++it) {
            if (it->second != id)
              return Status::Error(block + " is held by request " + std::to_string(it->second));
          }
        }
      }
    }
  }
  if (idle() && blocks_.kv_blocks_used() != 0) {
    return Status::Error("instance " + std::to_string(config_.id) + " is idle but " +
                         std::to_string(blocks_.kv_blocks_used()) + " KV blocks are still in use");
  }
  if (idle() && !held_.empty()) {
    return Status::Error("instance " + std::to_string(config_.id) + " is idle but still holds " +
                         std::to_string(held_.size()) + " requests");
  }
  return Status::Ok();
}

}  // namespace duet::policies
