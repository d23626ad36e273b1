// LiveMetrics: prometheus-cpp families registered once; every metric object is itself
// thread-safe (atomic counters, locked histograms), so events need no lock of their own.
#include "backend/serve/live_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <vector>

#include "policies/kv_tiers.h"

namespace duet::backend::serve {
namespace {

using policies::FinishReason;
using policies::RequestRecord;
using policies::RequestSpec;
using policies::RequestState;

// Bucket bounds in seconds, roughly log-spaced over what each latency spans on CPU and GPU.
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
const prometheus::Histogram::BucketBoundaries kItlBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5, 10, 30};
const prometheus::Histogram::BucketBoundaries kLongBuckets = {
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560};

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter& MakeCounter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const char* name, const char* help,
                                     const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

void ObserveIfReached(prometheus::Histogram* h, Seconds from, Seconds to) {
  if (auto elapsed = policies::Elapsed(from, to)) h->Observe(*elapsed);
}

}  // namespace

LiveMetrics::LiveMetrics() : registry_(std::make_unique<prometheus::Registry>()) {
  auto& r = *registry_;
  running_ =
      &MakeGauge(r, "duet:num_requests_running", "Requests holding KV blocks, being served.");
  waiting_ = &MakeGauge(r, "duet:num_requests_waiting", "Requests accepted, not yet admitted.");
  kv_usage_ = &MakeGauge(r, "duet:kv_cache_usage_perc",
                         "Fraction of KV cache blocks in use (1 = 100 percent), all instances.");
  kv_used_ = &MakeGauge(r, "duet:kv_blocks_used", "KV cache blocks in use, all instances.");
  kv_free_ = &MakeGauge(r, "duet:kv_blocks_free",
                        "KV cache blocks free or holding evictable cached prefixes.");
  prompt_tokens_ = &MakeCounter(r, "duet:prompt_tokens_total", "Prompt tokens prefilled.");
  generation_tokens_ = &MakeCounter(r, "duet:generation_tokens_total", "Tokens generated.");
  auto& success = prometheus::BuildCounter()
                      .Name("duet:request_success_total")
                      .Help("Requests finished, by finish reason.")
                      .Register(r);
  success_stop_ = &success.Add({{"finished_reason", "stop"}});
  success_length_ = &success.Add({{"finished_reason", "length"}});
  success_abort_ = &success.Add({{"finished_reason", "abort"}});
  success_error_ = &success.Add({{"finished_reason", "error"}});
  cache_queries_ = &MakeCounter(r, "duet:prefix_cache_queries_total",
                                "Prompt tokens looked up in the prefix cache.");
  cache_hits_ = &MakeCounter(r, "duet:prefix_cache_hits_total",
                             "Prompt tokens served from the prefix cache.");
  auto& tier_hits = prometheus::BuildCounter()
                        .Name("duet:prefix_cache_tier_hits_total")
                        .Help(
                            "Prompt tokens served from each KV tier below GPU memory (part of "
                            "duet:prefix_cache_hits_total).")
                        .Register(r);
  for (int k = 0; k < policies::kNumLowerTiers; ++k)
    tier_hits_[static_cast<std::size_t>(k)] =
        &tier_hits.Add({{"tier", policies::ToString(static_cast<policies::TierKind>(k))}});
  preemptions_ = &MakeCounter(r, "duet:num_preemptions_total",
                              "Requests that lost their KV blocks and went back to the queue.");
  ttft_ = &MakeHistogram(r, "duet:time_to_first_token_seconds", "Arrival to first token (seconds).",
                         kTtftBuckets);
  itl_ = &MakeHistogram(r, "duet:inter_token_latency_seconds",
                        "Gaps between successive tokens of a request (seconds).", kItlBuckets);
  e2e_ = &MakeHistogram(r, "duet:e2e_request_latency_seconds", "Arrival to finish (seconds).",
                        kLongBuckets);
  queue_ = &MakeHistogram(r, "duet:request_queue_time_seconds",
                          "Arrival to first scheduled (seconds).", kLongBuckets);
  kv_transfer_ = &MakeHistogram(r, "duet:kv_transfer_seconds",
                                "PD: end of prefill to KV usable on the decode instance (seconds).",
                                kTtftBuckets);
  auto& parts = prometheus::BuildHistogram()
                    .Name("duet:kv_transfer_part_seconds")
                    .Help(
                        "PD: duet:kv_transfer_seconds in its parts (seconds): the KV-ready "
                        "message's way to the decode instance, its wait there for the pull, the "
                        "pull.")
                    .Register(r);
  for (std::size_t k = 0; k < kv_transfer_parts_.size(); ++k)
    kv_transfer_parts_[k] =
        &parts.Add({{"part", policies::KvTransferParts::kNames[k]}}, kTtftBuckets);
  kv_leases_held_ = &MakeGauge(r, "duet:kv_leases_held",
                               "PD: requests whose KV a prefill instance holds for a pull.");
  kv_leases_expired_ =
      &MakeCounter(r, "duet:kv_leases_expired_total",
                   "PD: KV leases that ended before the decode instance released them (freed).");
  kv_load_failures_ = &MakeCounter(r, "duet:kv_load_failures_total",
                                   "PD: KV pulls that failed or ended after their lease.");
  kv_load_recomputes_ =
      &MakeCounter(r, "duet:kv_load_recomputes_total",
                   "PD: failed pulls the decode instance recomputed (kv_load_failure_policy).");
  forward_failures_ = &MakeCounter(
      r, "duet:forward_failures_total",
      "Steps whose forward pass failed; their requests ended with finish_reason error.");
  worker_up_ = &prometheus::BuildGauge()
                    .Name("duet:worker_up")
                    .Help("Worker processes: 1 while the worker of the slot is up, else 0.")
                    .Register(r);
  worker_clock_error_ =
      &prometheus::BuildGauge()
           .Name("duet:worker_clock_error_seconds")
           .Help(
               "Worker processes: the bound on the error of the worker's clock against the "
               "frontend's (half its best clock probe's round trip, grown by drift).")
           .Register(r);
  requests_retried_ =
      &MakeCounter(r, "duet:requests_retried_total",
                   "Worker processes: requests moved to a survivor after their worker was lost.");
}

LiveMetrics::~LiveMetrics() = default;

void LiveMetrics::OnFinished(const RequestSpec& spec, const RequestRecord& request) {
  if (request.state == RequestState::kRejected) return;  // never served: no latencies
  // The reason first: the engine ends an aborted request as kFailed with reason kAbort.
  switch (request.finish_reason) {
    case FinishReason::kLength:
      success_length_->Increment();
      break;
    case FinishReason::kAbort:
      success_abort_->Increment();
      break;
    case FinishReason::kError:
      success_error_->Increment();
      break;
    case FinishReason::kStop:
      success_stop_->Increment();
      break;
    case FinishReason::kNone:  // an engine that sets no reason: failed, or ran to an end
      (request.state == RequestState::kFailed ? success_error_ : success_stop_)->Increment();
      break;
  }
  ObserveIfReached(ttft_, spec.arrival_s, request.first_token_s);
  ObserveIfReached(queue_, spec.arrival_s, request.first_scheduled_s);
  ObserveIfReached(e2e_, spec.arrival_s, request.finished_s);
  ObserveIfReached(kv_transfer_, request.prefill_done_s, request.kv_ready_s);
  if (const auto parts = policies::KvTransferBreakdown(request)) {
    const auto seconds = parts->InOrder();
    for (std::size_t k = 0; k < seconds.size(); ++k) kv_transfer_parts_[k]->Observe(seconds[k]);
  }
}

void LiveMetrics::OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) {
  prompt_tokens_->Increment(static_cast<double>(spec.input_tokens));
  cache_queries_->Increment(static_cast<double>(spec.input_tokens));
  cache_hits_->Increment(static_cast<double>(record.cached_tokens));
  for (std::size_t k = 0; k < tier_hits_.size(); ++k)
    tier_hits_[k]->Increment(static_cast<double>(record.tier_hit_tokens[k]));
}

void LiveMetrics::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  if (count <= 0 || !(gap_s >= 0)) return;
  // One bucket update for `count` equal samples rather than `count` locked observations.
  std::vector<double> increments(kItlBuckets.size() + 1, 0.0);
  const auto bucket = std::lower_bound(kItlBuckets.begin(), kItlBuckets.end(), gap_s);
  increments[static_cast<std::size_t>(bucket - kItlBuckets.begin())] = static_cast<double>(count);
  itl_->ObserveMultiple(increments, gap_s * static_cast<double>(count));
}

void LiveMetrics::OnPreempted(const RequestSpec&, const RequestRecord&, policies::InstanceId) {
  preemptions_->Increment();
}

void LiveMetrics::OnToken(const RequestSpec&, const RequestRecord&, std::int32_t) {
  generation_tokens_->Increment();
}

std::string LiveMetrics::Scrape(const FrontendStats& stats) {
  std::lock_guard<std::mutex> lock(scrape_mutex_);
  const policies::InstanceLoad& load = stats.load;
  running_->Set(static_cast<double>(load.running));
  waiting_->Set(static_cast<double>(load.waiting));
  kv_used_->Set(static_cast<double>(load.kv_blocks_used));
  kv_free_->Set(static_cast<double>(load.kv_blocks_free));
  kv_usage_->Set(load.kv_blocks_total > 0 ? static_cast<double>(load.kv_blocks_used) /
                                                static_cast<double>(load.kv_blocks_total)
                                          : 0.0);
  kv_leases_held_->Set(static_cast<double>(load.leases_held));
  // The engines count these; a counter only moves up, by what they added since the last scrape.
  for (const auto& [counter, total] : {std::pair{kv_leases_expired_, load.leases_expired},
                                       std::pair{kv_load_failures_, load.kv_load_failures},
                                       std::pair{kv_load_recomputes_, load.kv_load_recomputes},
                                       std::pair{forward_failures_, load.forward_failures},
                                       std::pair{requests_retried_, stats.requests_retried}}) {
    const double added = static_cast<double>(total) - counter->Value();
    if (added > 0) counter->Increment(added);
  }
  for (const WorkerStatus& w : stats.workers) {
    const prometheus::Labels labels = {{"instance", std::to_string(w.instance)},
                                       {"role", policies::ToString(w.role)}};
    worker_up_->Add(labels).Set(w.up ? 1.0 : 0.0);
    // Only while a worker holds the slot and has reported its clock: no stale bound.
    if (w.clock_error_s) {
      worker_clock_error_->Add(labels).Set(*w.clock_error_s);
    } else if (worker_clock_error_->Has(labels)) {
      worker_clock_error_->Remove(&worker_clock_error_->Add(labels));
    }
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace duet::backend::serve
