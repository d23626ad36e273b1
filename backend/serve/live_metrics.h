// The live server's Prometheus metrics (/metrics), named as design/METRICS.md lists them and
// modelled on vLLM's: counters and histograms fed by the engines' lifecycle events (this class
// is the frontend's EventSink observer), gauges read from LiveFrontend::Stats() at scrape time.
// Families and text exposition come from prometheus-cpp core, not hand-written text.
// Thread-safe: events arrive from every engine thread, scrapes from the server's io threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "backend/frontend/frontend.h"
#include "policies/ports.h"

namespace prometheus {
template <typename T>
class Family;
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace duet::backend::serve {

class LiveMetrics final : public policies::EventSink {
 public:
  LiveMetrics();
  ~LiveMetrics() override;
  LiveMetrics(const LiveMetrics&) = delete;
  LiveMetrics& operator=(const LiveMetrics&) = delete;

  // EventSink (any thread). Times in the records are seconds on one steady clock.
  void OnFinished(const policies::RequestSpec& spec,
                  const policies::RequestRecord& record) override;
  void OnPrefillDone(const policies::RequestSpec& spec,
                     const policies::RequestRecord& record) override;
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
  void OnPreempted(const policies::RequestSpec&, const policies::RequestRecord&,
                   policies::InstanceId) override;
  void OnToken(const policies::RequestSpec&, const policies::RequestRecord&,
               std::int32_t token) override;

  // Every metric in the Prometheus text format (version 0.0.4), the gauges set from `stats`.
  std::string Scrape(const FrontendStats& stats);

 private:
  std::unique_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_free_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* success_stop_;
  prometheus::Counter* success_length_;
  prometheus::Counter* success_abort_;
  prometheus::Counter* success_error_;
  prometheus::Counter* cache_queries_;
  prometheus::Counter* cache_hits_;
  std::array<prometheus::Counter*, policies::kNumLowerTiers> tier_hits_{};  // by tier
  prometheus::Counter* preemptions_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  prometheus::Histogram* kv_transfer_;
  // One per part, in policies::KvTransferParts::kNames order.
  std::array<prometheus::Histogram*, policies::KvTransferParts::kNames.size()> kv_transfer_parts_{};
  prometheus::Gauge* kv_leases_held_;
  prometheus::Counter* kv_leases_expired_;
  prometheus::Counter* kv_load_failures_;
  prometheus::Counter* kv_load_recomputes_;
  prometheus::Counter* forward_failures_;
  prometheus::Family<prometheus::Gauge>* worker_up_;
  prometheus::Family<prometheus::Gauge>* worker_clock_error_;
  prometheus::Counter* requests_retried_;
  std::mutex scrape_mutex_;  // one scrape sets the gauges and collects at a time
};

}  // namespace duet::backend::serve
