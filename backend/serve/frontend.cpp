// The live frontend (see frontend.h): admission, the simulator's Router over a KV-event-fed view
// of each instance's prefix cache, dispatch to engine threads, and the route back from each
// engine's events to the request's listener.
#include "backend/serve/frontend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "backend/engine/engine_thread.h"
#include "policies/block_hash.h"
#include "policies/kv_event_index.h"

namespace duet::backend::serve {

using policies::EngineMessage;
using policies::InstanceId;
using policies::Request;
using policies::RequestId;

struct LiveFrontend::Impl {
  // A request: owned here from Submit until the engine thread that served it has finished the
  // iteration that ended it. It stops counting as pending (in flight) as soon as it finished.
  struct Entry {
    std::unique_ptr<Request> request;
    std::shared_ptr<RequestListener> listener;
    InstanceId prefill = policies::kNoInstance;
    InstanceId decode = policies::kNoInstance;  // colocated: the prefill instance
    bool finished = false;
  };

  // Ends `entry`'s request wherever it is: on its prefill instance or, past the handoff, on its
  // decode instance (an engine ignores an abort of a request it does not hold).
  void PostAbort(RequestId id, const Entry& entry) {
    EngineMessage m{EngineMessage::Kind::kAbort, nullptr, policies::kNoInstance};
    m.request_id = id;
    threads[static_cast<std::size_t>(entry.prefill)]->inbox().Post(m);
    if (entry.decode != entry.prefill)
      threads[static_cast<std::size_t>(entry.decode)]->inbox().Post(m);
  }

  // An instance's events, on its engine thread: tokens and final records to the request's
  // listener, lifecycle to the router and the observer, KV events to the routing index.
  class InstanceSink final : public policies::EventSink {
   public:
    InstanceSink(Impl& impl, InstanceId id) : impl_(impl), id_(id) {}

    void OnToken(const Request& r, std::int32_t token) override {
      if (impl_.options.observer) impl_.options.observer->OnToken(r, token);
      Listener(r.id)->OnToken(token);
    }
    void OnFinished(const Request& r) override {
      FinishInfo info;
      info.reason = r.finish_reason;
      info.message = r.reason;
      info.prompt_tokens = r.input_tokens;
      info.completion_tokens = r.generated_tokens;
      info.cached_tokens = r.cached_tokens;
      info.instance = id_;
      if (r.first_scheduled_s >= 0) info.queue_s = r.first_scheduled_s - r.arrival_s;
      RequestListener* listener = Listener(r.id);
      {
        // Its slot is free before anyone hears of the end, so a client that saw it may send
        // the next request at once.
        std::lock_guard lock(impl_.mu);
        impl_.router->OnFinished(r);
        impl_.entries.at(r.id).finished = true;
        --impl_.pending;
      }
      impl_.changed.notify_all();
      listener->OnFinished(info);
      if (impl_.options.observer) impl_.options.observer->OnFinished(r);
      finished_.push_back(r.id);
    }
    void OnPrefillDone(const Request& r) override {
      {
        std::lock_guard lock(impl_.mu);
        impl_.router->OnPrefillDone(r);
      }
      if (impl_.options.observer) impl_.options.observer->OnPrefillDone(r);
    }
    void OnTokenGaps(Seconds gap_s, std::int64_t count) override {
      if (impl_.options.observer) impl_.options.observer->OnTokenGaps(gap_s, count);
    }
    void OnPreempted(const Request& r, InstanceId instance) override {
      if (impl_.options.observer) impl_.options.observer->OnPreempted(r, instance);
    }
    void OnKvEvents(InstanceId instance, std::span<const policies::KvCacheEvent> events) override {
      std::lock_guard lock(impl_.mu);
      impl_.index->Apply(instance, events);
    }

    // After each iteration: the requests that finished in it are released.
    void ReleaseFinished() {
      if (finished_.empty()) return;
      {
        std::lock_guard lock(impl_.mu);
        for (RequestId id : finished_) impl_.entries.erase(id);
      }
      for (RequestId id : finished_) listeners_.erase(id);
      finished_.clear();
    }

   private:
    // The entry keeps the listener alive until ReleaseFinished, on this thread.
    RequestListener* Listener(RequestId id) {
      auto it = listeners_.find(id);
      if (it != listeners_.end()) return it->second;
      std::lock_guard lock(impl_.mu);
      RequestListener* l = impl_.entries.at(id).listener.get();
      listeners_.emplace(id, l);
      return l;
    }

    Impl& impl_;
    InstanceId id_;
    std::unordered_map<RequestId, RequestListener*> listeners_;
    std::vector<RequestId> finished_;
  };

  FrontendOptions options;
  std::vector<std::unique_ptr<ForwardModel>> models;
  SteadyClock clock;
  std::vector<std::unique_ptr<InstanceSink>> sinks;
  bool pd = false;
  std::unique_ptr<LocalKvTransports> transports;
  std::unique_ptr<LocalOutbox> outbox;
  std::vector<std::unique_ptr<EngineThread>> threads;
  Tokens max_request_tokens = 0;

  std::mutex mu;                    // guards what follows
  std::condition_variable changed;  // a request finished
  std::unordered_map<RequestId, Entry> entries;
  std::int64_t pending = 0;  // entries not finished
  std::unique_ptr<policies::KvEventIndex> index;
  std::unique_ptr<policies::Router> router;
  RequestId next_id = 0;
  bool draining = false;
};

LiveFrontend::LiveFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<LiveFrontend>> LiveFrontend::Start(
    std::vector<std::unique_ptr<ForwardModel>> models, FrontendOptions options) {
  if (models.empty()) return Status::Error("the live frontend needs at least one instance");
  const models::ModelSpec& config = models.front()->config();
  const std::int32_t block_tokens = models.front()->block_tokens();
  for (const auto& m : models) {
    if (m->block_tokens() != block_tokens || m->config().vocab_size != config.vocab_size ||
        m->config().num_hidden_layers != config.num_hidden_layers)
      return Status::Error("every instance must serve the same model with the same block size");
  }
  if (options.max_pending_requests < 1)
    return Status::Error("max_pending_requests must be at least 1");
  if (options.router.kind == policies::RouterKind::kCacheAware &&
      options.router.prefill_tokens_per_s <= 0)
    return Status::Error("the cache-aware router needs a prefill rate (prefill_tokens_per_s)");
  std::vector<policies::InstanceRole> roles = options.roles;
  if (roles.empty()) roles.assign(models.size(), policies::InstanceRole::kColocated);
  if (roles.size() != models.size()) {
    return Status::Error(std::to_string(roles.size()) + " instance roles for " +
                         std::to_string(models.size()) + " instances");
  }
  auto count = [&](policies::InstanceRole role) { return std::ranges::count(roles, role); };
  const bool pd = count(policies::InstanceRole::kColocated) == 0;
  if (pd &&
      (count(policies::InstanceRole::kPrefill) == 0 || count(policies::InstanceRole::kDecode) == 0))
    return Status::Error("PD needs at least one prefill and one decode instance");
  if (!pd && count(policies::InstanceRole::kColocated) != static_cast<std::ptrdiff_t>(roles.size()))
    return Status::Error("colocated and PD instances cannot be mixed");
  if (!(options.kv_lease_s > 0)) return Status::Error("kv_lease_s must be > 0");
  std::vector<KvRegion> regions;
  for (std::size_t i = 0; i < models.size(); ++i) {
    const std::optional<KvRegion> region = models[i]->kv_region();
    if (pd && !region)
      return Status::Error("instance " + std::to_string(i) +
                           ": this backend exposes no KV region, so its KV cannot move (PD)");
    regions.push_back(region.value_or(KvRegion{}));
  }

  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.options = options;
  s.models = std::move(models);
  const int n = static_cast<int>(s.models.size());
  s.max_request_tokens = std::numeric_limits<Tokens>::max();
  if (config.max_position_embeddings > 0) s.max_request_tokens = config.max_position_embeddings;
  for (const auto& m : s.models) {
    s.max_request_tokens = std::min(
        s.max_request_tokens, options.scheduler.AdmissibleTokens(m->num_blocks(), block_tokens));
  }
  if (s.max_request_tokens < 2)
    return Status::Error("the KV cache holds too few blocks to serve a request");

  std::vector<InstanceId> prefill_side, decode_side;
  for (int i = 0; i < n; ++i) {
    (roles[static_cast<std::size_t>(i)] == policies::InstanceRole::kDecode ? decode_side
                                                                           : prefill_side)
        .push_back(i);
  }
  s.pd = pd;
  s.index = std::make_unique<policies::KvEventIndex>(n, block_tokens);
  s.router = policies::MakeRouter(options.router, prefill_side, decode_side, s.index.get());
  auto transports = LocalKvTransports::Create(regions, roles, options.kv_transport);
  if (!transports.ok()) return Status::Error("KV transport: " + transports.error());
  s.transports = std::move(*transports);

  s.outbox = std::make_unique<LocalOutbox>();
  for (int i = 0; i < n; ++i) {
    s.sinks.push_back(std::make_unique<Impl::InstanceSink>(s, i));
    policies::EngineConfig c;
    c.id = i;
    c.role = roles[static_cast<std::size_t>(i)];
    c.kv_bytes_per_token = config.KvBytesPerToken();
    c.kv_lease_s = options.kv_lease_s;
    c.kv_load_failure_policy = options.kv_load_failure_policy;
    c.num_blocks = s.models[static_cast<std::size_t>(i)]->num_blocks();
    c.block_tokens = block_tokens;
    c.enable_prefix_caching = options.enable_prefix_caching;
    c.num_layers = config.num_hidden_layers;
    // The router reads the prefix caches of the instances that prefill.
    c.publish_kv_events =
        options.enable_prefix_caching && c.role != policies::InstanceRole::kDecode;
    c.scheduler = options.scheduler;
    Impl::InstanceSink* sink = s.sinks.back().get();
    s.threads.push_back(std::make_unique<EngineThread>(
        c, *s.models[static_cast<std::size_t>(i)],
        EngineThread::Ports{&s.clock, s.outbox.get(), &s.transports->transport(i), sink},
        [sink] { sink->ReleaseFinished(); }));
    s.outbox->Add(&s.threads.back()->inbox());
  }
  for (auto& t : s.threads) t->Start();
  return std::unique_ptr<LiveFrontend>(new LiveFrontend(std::move(impl)));
}

LiveFrontend::~LiveFrontend() {
  Drain(0);
  for (auto& t : impl_->threads) t->Stop();
}

Admission LiveFrontend::Submit(LiveRequest request, std::shared_ptr<RequestListener> listener) {
  Impl& s = *impl_;
  const models::ModelSpec& config = model_config();
  if (request.prompt.empty()) return {AdmitStatus::kInvalid, 0, "the prompt is empty"};
  if (request.max_tokens < 1) return {AdmitStatus::kInvalid, 0, "max_tokens must be at least 1"};
  for (std::int32_t id : request.prompt) {
    if (id < 0 || id >= config.vocab_size)
      return {AdmitStatus::kInvalid, 0,
              "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(config.vocab_size) + ")"};
  }
  const auto prompt_tokens = static_cast<Tokens>(request.prompt.size());
  if (prompt_tokens > s.max_request_tokens - request.max_tokens) {
    return {AdmitStatus::kTooLong, 0,
            "the prompt (" + std::to_string(prompt_tokens) + " tokens) plus max_tokens (" +
                std::to_string(request.max_tokens) + ") make " +
                std::to_string(prompt_tokens + request.max_tokens) + " tokens, more than the " +
                std::to_string(s.max_request_tokens) +
                " one request may have (the model's context and the KV cache)"};
  }
  auto r = std::make_unique<Request>();
  r->input_tokens = prompt_tokens;
  r->output_tokens = request.max_tokens;
  r->block_hashes = policies::TokenBlockHashes(request.prompt, s.models.front()->block_tokens());
  r->token_ids = std::move(request.prompt);
  r->sampling = std::move(request.sampling);

  std::lock_guard lock(s.mu);
  if (s.draining) return {AdmitStatus::kDraining, 0, "the server is shutting down"};
  if (s.pending >= s.options.max_pending_requests) {
    return {AdmitStatus::kQueueFull, 0,
            std::to_string(s.pending) +
                " requests are in flight, the most this server holds; "
                "retry later"};
  }
  r->id = s.next_id++;
  r->arrival_s = s.clock.Now();
  const policies::RoutingDecision d = s.router->Route(*r);
  if (!d.reject_reason.empty()) return {AdmitStatus::kQueueFull, 0, d.reject_reason};
  r->prefill_instance = d.prefill;
  r->decode_instance = s.pd ? d.decode : d.prefill;
  Request* raw = r.get();
  const RequestId id = r->id;
  s.entries.emplace(
      id, Impl::Entry{std::move(r), std::move(listener), d.prefill, raw->decode_instance, false});
  ++s.pending;
  s.threads[static_cast<std::size_t>(d.prefill)]->inbox().Post(
      {EngineMessage::Kind::kNewRequest, raw, policies::kNoInstance});
  return {AdmitStatus::kAccepted, id, ""};
}

void LiveFrontend::Abort(RequestId id) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  auto it = s.entries.find(id);
  if (it == s.entries.end() || it->second.finished) return;
  s.PostAbort(id, it->second);
}

std::int64_t LiveFrontend::Drain(Seconds timeout_s) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  s.draining = true;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeout_s)));
  s.changed.wait_until(lock, deadline, [&] { return s.pending == 0; });
  const std::int64_t aborted = s.pending;
  for (const auto& [id, entry] : s.entries) {
    if (entry.finished) continue;
    s.PostAbort(id, entry);
  }
  // An abort takes effect at the instance's next step boundary; bounded in case a step hangs.
  s.changed.wait_for(lock, std::chrono::seconds(60), [&] { return s.pending == 0; });
  return aborted;
}

Tokens LiveFrontend::max_request_tokens() const { return impl_->max_request_tokens; }
const models::ModelSpec& LiveFrontend::model_config() const {
  return impl_->models.front()->config();
}

FrontendStats LiveFrontend::Stats() const {
  FrontendStats stats;
  for (const auto& t : impl_->threads) {
    const InstanceLoad load = t->load();
    stats.waiting += load.waiting;
    stats.running += load.running;
    stats.kv_blocks_used += load.kv_blocks_used;
    stats.kv_blocks_free += load.kv_blocks_free;
    stats.kv_blocks_total += t->kv_blocks_total();
    stats.kv_leases_held += load.leases_held;
    stats.kv_leases_expired += load.leases_expired;
    stats.kv_load_failures += load.kv_load_failures;
    stats.kv_load_recomputes += load.kv_load_recomputes;
  }
  return stats;
}

}  // namespace duet::backend::serve
