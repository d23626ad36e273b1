// The live frontend (see frontend.h): admission, the simulator's Router over a KV-event-fed view
// of each instance's prefix cache, dispatch to the instances, and the route back from each
// instance's events to the request's listener. Engine threads here; worker processes in
// frontend_workers.cpp.
#include "backend/frontend/frontend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "backend/frontend/frontend_impl.h"
#include "policies/block_hash.h"

namespace duet::backend::serve {

using policies::EngineMessage;
using policies::InstanceId;
using policies::Request;
using policies::RequestId;
using policies::RequestRecord;
using policies::RequestSpec;

namespace {

// An engine thread of this process.
class LocalInstance final : public Instance {
 public:
  explicit LocalInstance(std::unique_ptr<EngineThread> thread) : thread_(std::move(thread)) {}
  InstanceLoad load() const override { return thread_->load(); }
  void Stop() override { thread_->Stop(); }
  EngineThread& thread() { return *thread_; }

 private:
  std::unique_ptr<EngineThread> thread_;
};

}  // namespace

void LiveFrontend::Impl::InstanceSink::OnToken(const RequestSpec& spec, const RequestRecord& record,
                                               std::int32_t token) {
  RequestListener* listener = Listener(spec.id);
  if (!listener) return;  // a worker's event for an attempt retried meanwhile
  if (impl_.options.observer) impl_.options.observer->OnToken(spec, record, token);
  listener->OnToken(token);
}

void LiveFrontend::Impl::InstanceSink::OnFinished(const RequestSpec& spec, const RequestRecord& r) {
  FinishInfo info;
  info.reason = r.finish_reason;
  info.message = r.reason;
  info.cached_tokens = r.cached_tokens;
  info.tier_hit_tokens = r.tier_hit_tokens;
  info.instance = id_;
  info.frontend_s = spec.frontend_s;
  info.queue_s = policies::Elapsed(spec.arrival_s, r.first_scheduled_s).value_or(-1);
  info.prefill_done_s = policies::Elapsed(spec.arrival_s, r.prefill_done_s).value_or(-1);
  if (auto transfer = policies::Elapsed(r.prefill_done_s, r.kv_ready_s)) {
    info.kv_transfer_s = *transfer;
    info.kv_transfer_bytes = r.kv_transfer_bytes;
    info.kv_transfer_parts = policies::KvTransferBreakdown(r);
  }
  RequestListener* listener = Listener(spec.id);
  {
    // Its slot is free before anyone hears of the end, so a client that saw it may send the
    // next request at once.
    std::lock_guard lock(impl_.mu);
    auto it = impl_.entries.find(spec.id);
    if (!listener || it == impl_.entries.end()) return;  // retried meanwhile (workers)
    impl_.router->OnFinished(spec, r);
    Entry& entry = it->second;
    entry.finished = true;
    // A retried request reports what its client asked for and got, over all attempts.
    info.prompt_tokens = entry.prompt_tokens;
    info.completion_tokens = entry.tokens_before + r.generated_tokens;
    info.cached_tokens = std::min(info.cached_tokens, entry.prompt_tokens);
    if (entry.client_id != spec.id) impl_.retried.erase(entry.client_id);
    --impl_.pending;
    ++impl_.telling;
  }
  impl_.changed.notify_all();
  listener->OnFinished(info);
  {
    std::lock_guard lock(impl_.mu);
    --impl_.telling;
  }
  impl_.changed.notify_all();
  if (impl_.options.observer) impl_.options.observer->OnFinished(spec, r);
  finished_.push_back(spec.id);
}

void LiveFrontend::Impl::InstanceSink::OnPrefillDone(const RequestSpec& spec,
                                                     const RequestRecord& record) {
  {
    std::lock_guard lock(impl_.mu);
    impl_.router->OnPrefillDone(spec, record);
  }
  if (impl_.options.observer) impl_.options.observer->OnPrefillDone(spec, record);
}

void LiveFrontend::Impl::InstanceSink::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  if (impl_.options.observer) impl_.options.observer->OnTokenGaps(gap_s, count);
}

void LiveFrontend::Impl::InstanceSink::OnPreempted(const RequestSpec& spec,
                                                   const RequestRecord& record,
                                                   InstanceId instance) {
  if (impl_.options.observer) impl_.options.observer->OnPreempted(spec, record, instance);
}

void LiveFrontend::Impl::InstanceSink::OnKvEvents(InstanceId instance,
                                                  std::span<const policies::KvCacheEvent> events) {
  std::lock_guard lock(impl_.mu);
  impl_.index->Apply(instance, events);
}

void LiveFrontend::Impl::InstanceSink::ReleaseFinished() {
  if (finished_.empty()) return;
  {
    std::lock_guard lock(impl_.mu);
    for (RequestId id : finished_) impl_.entries.erase(id);
  }
  for (RequestId id : finished_) listeners_.erase(id);
  finished_.clear();
}

// The entry keeps the listener alive until ReleaseFinished, on this thread. Null when the
// request has no entry under this id (a worker's event for an attempt retried meanwhile).
RequestListener* LiveFrontend::Impl::InstanceSink::Listener(RequestId id) {
  auto it = listeners_.find(id);
  if (it != listeners_.end()) return it->second;
  std::lock_guard lock(impl_.mu);
  auto entry = impl_.entries.find(id);
  if (entry == impl_.entries.end()) return nullptr;
  RequestListener* l = entry->second.listener.get();
  listeners_.emplace(id, l);
  return l;
}

void LiveFrontend::Impl::PostAbort(RequestId id, const Entry& entry) {
  EngineMessage m{EngineMessage::Kind::kAbort, nullptr, policies::kNoInstance};
  m.request_id = id;
  outbox->Send(entry.prefill, m);
  if (entry.decode != entry.prefill) outbox->Send(entry.decode, m);
}

LiveFrontend::LiveFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {

// The instances' roles (empty: all colocated), checked: PD needs prefill and decode instances
// and no colocated one.
Result<std::vector<policies::InstanceRole>> CheckRoles(std::vector<policies::InstanceRole> roles,
                                                       std::size_t instances) {
  if (roles.empty()) roles.assign(instances, policies::InstanceRole::kColocated);
  if (roles.size() != instances) {
    return Status::Error(std::to_string(roles.size()) + " instance roles for " +
                         std::to_string(instances) + " instances");
  }
  auto count = [&](policies::InstanceRole role) { return std::ranges::count(roles, role); };
  const bool pd = count(policies::InstanceRole::kColocated) == 0;
  if (pd &&
      (count(policies::InstanceRole::kPrefill) == 0 || count(policies::InstanceRole::kDecode) == 0))
    return Status::Error("PD needs at least one prefill and one decode instance");
  if (!pd && count(policies::InstanceRole::kColocated) != static_cast<std::ptrdiff_t>(roles.size()))
    return Status::Error("colocated and PD instances cannot be mixed");
  return roles;
}

// What both kinds of start share: option checks, the routing index and the router.
Status InitImpl(LiveFrontend::Impl& s, const FrontendOptions& options,
                const std::vector<policies::InstanceRole>& roles) {
  if (options.max_pending_requests < 1)
    return Status::Error("max_pending_requests must be at least 1");
  DUET_RETURN_IF_ERROR(policies::CheckRouterConfig(options.router));
  if (options.router.kind == policies::RouterKind::kCacheAware &&
      options.router.prefill_tokens_per_s <= 0)
    return Status::Error("the cache-aware router needs a prefill rate (prefill_tokens_per_s)");
  // Settings from anywhere but their codec (a test's, a flag's) get its bounds too.
  auto checked =
      deploy::ParseEngineSettings(deploy::EngineSettingsToJson(options.engine), "engine");
  if (!checked) return checked.status();
  s.options = options;
  s.options.roles = roles;
  s.pd = roles.front() != policies::InstanceRole::kColocated;
  const int n = static_cast<int>(roles.size());
  std::vector<InstanceId> prefill_side, decode_side;
  for (int i = 0; i < n; ++i) {
    (roles[static_cast<std::size_t>(i)] == policies::InstanceRole::kDecode ? decode_side
                                                                           : prefill_side)
        .push_back(i);
  }
  s.index = std::make_unique<policies::KvEventIndex>(n, s.block_tokens);
  s.router = policies::MakeRouter(options.router, prefill_side, decode_side, s.index.get());
  for (int i = 0; i < n; ++i)
    s.sinks.push_back(std::make_unique<LiveFrontend::Impl::InstanceSink>(s, i));
  return Status::Ok();
}

}  // namespace

// Whether the frontend's router reads instance `id`'s prefix cache: the instances that prefill.
bool PublishesKvEvents(const FrontendOptions& options, InstanceId id) {
  return options.engine.enable_prefix_caching &&
         options.roles[static_cast<std::size_t>(id)] != policies::InstanceRole::kDecode;
}

std::optional<std::string> KvLayoutMismatch(const FrontendOptions& options,
                                            const models::ModelSpec& config, Tokens block_tokens,
                                            Bytes kv_bytes_per_token) {
  const deploy::EngineSettings& e = options.engine;
  if (block_tokens != e.block_tokens)
    return "its KV blocks hold " + std::to_string(block_tokens) + " tokens, engine.block_tokens " +
           std::to_string(e.block_tokens);
  if (e.memory.kv_cache_dtype &&
      kv_bytes_per_token != config.KvBytesPerToken(e.memory.kv_cache_dtype))
    return "its KV cache takes " + std::to_string(kv_bytes_per_token) +
           " bytes per token, not the " +
           std::to_string(config.KvBytesPerToken(e.memory.kv_cache_dtype)) +
           " of engine.kv_cache_dtype " + models::TorchDtypeName(*e.memory.kv_cache_dtype);
  return std::nullopt;
}

Status SetLimits(LiveFrontend::Impl& s, std::span<const Tokens> admissible) {
  const auto limits = policies::AdmissionLimits::For(
      s.options.roles, admissible, s.config.max_position_embeddings, s.config.name);
  if (limits.prompt_limit() < 1 || limits.max_request_tokens() < 2)
    return Status::Error("the KV cache holds too few blocks to serve a request");
  std::lock_guard lock(s.mu);
  s.policy.emplace(limits, *s.router);
  return Status::Ok();
}

LiveFrontend::Impl::RemovedAtEnd::~RemovedAtEnd() {
  std::error_code ec;
  if (!path.empty()) std::filesystem::remove_all(path, ec);
}

namespace {

// The tiers of options.tiers on this host, under the tier policies the simulator runs: every
// instance on node 0, each one's KV region registered with the storage.
Status StartTiers(LiveFrontend::Impl& s, const std::vector<KvRegion>& regions) {
  const std::int64_t block_bytes = regions.front().block_bytes;
  for (std::size_t i = 0; i < regions.size(); ++i)
    if (!regions[i].base || regions[i].block_bytes != block_bytes)
      return Status::Error("tiers: instance " + std::to_string(i) +
                           " exposes no KV region in host memory to offload from");
  const models::ModelSpec& m = s.config;
  // Blocks are shared (the remote store, SSD files after a restart) only between servers of the
  // same model and KV layout.
  const StoredBlockLayout layout{
      .fingerprint = LayoutFingerprint(
          m.name + "/" + m.model_type + "/layers=" + std::to_string(m.num_hidden_layers) +
          "/kv_heads=" + std::to_string(m.num_key_value_heads) +
          "/head_dim=" + std::to_string(m.head_dim) + "/vocab=" + std::to_string(m.vocab_size) +
          "/block_tokens=" + std::to_string(s.block_tokens) +
          "/block_bytes=" + std::to_string(block_bytes)),
      .block_bytes = block_bytes};
  const deploy::TiersSpec& tiers = s.options.tiers;
  if (s.options.engine.async_steps)
    return Status::Error(
        "tiers: not served with engine.async_steps yet (a tier write may read a block a step in "
        "flight writes); set async_steps false");
  // A real step cannot yet drop a request whose overlapped load failed (it would attend over
  // missing KV): a prefix found in a tier is loaded before its request is scheduled. The file
  // says so, so that the simulator runs the same policy.
  if (s.options.engine.scheduler.overlap_tier_loads)
    return Status::Error(
        "tiers: served live with engine.overlap_tier_loads false only (a prefix is loaded before "
        "its request is scheduled); set it in the cluster file, and the simulator runs the same");
  // Write-back from the GPU copies a block out when its block is reused, and a tier load into
  // that block may be posted before the copy: the live loop does not order them yet.
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<policies::TierKind>(k);
    if (!tiers[kind].enabled) continue;
    if (tiers[kind].placement == policies::TierPlacement::kWriteBack)
      return Status::Error(std::string("tiers.") + policies::ToString(kind) +
                           ": placement 'write-back' from the GPU is not served live yet; use "
                           "'write-through' for the first tier");
    break;  // the tiers below it are fed by it, write-back or not
  }
  if (tiers.ssd.enabled && tiers.ssd.directory.empty())
    s.tier_temp_dir.path =
        std::filesystem::temp_directory_path() / ("duet-ssd-tier-" + std::to_string(::getpid()));
  auto storage = MakeHostTierStorage(tiers, layout, s.tier_temp_dir.path);
  if (!storage) return storage.status();
  s.tier_storage = std::move(*storage);
  for (std::size_t i = 0; i < regions.size(); ++i)
    s.tier_storage->RegisterInstance(static_cast<policies::InstanceId>(i), regions[i]);
  s.tiers = std::make_unique<policies::TierManager>(
      deploy::TierSetupFor(tiers, block_bytes, std::vector<int>(regions.size(), 0), 1),
      s.tier_storage.get());
  // Blocks a server before this one left (SSD files, the remote store's) are served again.
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<policies::TierKind>(k);
    const TierBlocks* blocks = s.tier_storage->blocks(kind, 0);
    if (!blocks) continue;
    const TierRecovery& found = blocks->recovery();
    s.tiers->Adopt(kind, 0, found.blocks);
    if (found.blocks.empty() && found.partial + found.corrupt + found.over_capacity == 0 &&
        found.error.empty())
      continue;
    std::fprintf(stderr,
                 "duet serve: KV tier %s: %zu blocks found from before are served again; removed "
                 "%lld partial, %lld corrupt, %lld over the capacity%s%s\n",
                 policies::ToString(kind), found.blocks.size(),
                 static_cast<long long>(found.partial), static_cast<long long>(found.corrupt),
                 static_cast<long long>(found.over_capacity), found.error.empty() ? "" : "; ",
                 found.error.c_str());
  }
  s.tiers->ShareAcrossThreads();
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<LiveFrontend>> LiveFrontend::Start(
    std::vector<std::unique_ptr<ForwardModel>> models, FrontendOptions options) {
  if (models.empty()) return Status::Error("the live frontend needs at least one instance");
  const models::ModelSpec& config = models.front()->config();
  const std::int32_t block_tokens = models.front()->block_tokens();
  for (std::size_t i = 0; i < models.size(); ++i) {
    const ForwardModel& m = *models[i];
    if (m.config().vocab_size != config.vocab_size ||
        m.config().num_hidden_layers != config.num_hidden_layers)
      return Status::Error("every instance must serve the same model");
    if (auto mismatch = KvLayoutMismatch(options, config, m.block_tokens(), m.kv_bytes_per_token()))
      return Status::Error("instance " + std::to_string(i) + ": " + *mismatch);
  }
  auto roles = CheckRoles(options.roles, models.size());
  if (!roles.ok()) return roles.status();
  const bool pd = roles->front() != policies::InstanceRole::kColocated;
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
  s.config = config;
  s.block_tokens = block_tokens;
  if (Status st = InitImpl(s, options, *roles); !st.ok()) return st;
  s.models = std::move(models);
  const int n = static_cast<int>(s.models.size());
  std::vector<Tokens> admissible;
  for (const auto& m : s.models)
    admissible.push_back(options.engine.scheduler.AdmissibleTokens(m->num_blocks(), block_tokens));
  if (Status st = SetLimits(s, admissible); !st.ok()) return st;
  auto transports = LocalKvTransports::Create(regions, *roles, options.kv_transport);
  if (!transports.ok()) return Status::Error("KV transport: " + transports.error());
  s.transports = std::move(*transports);
  if (options.tiers.any()) {
    if (Status st = StartTiers(s, regions); !st.ok()) return st;
  }

  auto outbox = std::make_unique<LocalOutbox>();
  for (int i = 0; i < n; ++i) {
    policies::EngineConfig c =
        deploy::MakeEngineConfig(s.options.engine, i, s.options.roles[static_cast<std::size_t>(i)]);
    c.publish_kv_events = PublishesKvEvents(s.options, i);
    c.kv_bytes_per_token = s.models[static_cast<std::size_t>(i)]->kv_bytes_per_token();
    c.num_blocks = s.models[static_cast<std::size_t>(i)]->num_blocks();
    c.num_layers = config.num_hidden_layers;
    Impl::InstanceSink* sink = s.sinks[static_cast<std::size_t>(i)].get();
    auto thread = std::make_unique<EngineThread>(
        c, *s.models[static_cast<std::size_t>(i)],
        EngineThread::Ports{&s.clock, outbox.get(), &s.transports->transport(i), sink,
                            options.step_log, s.tiers.get()},
        [sink] { sink->ReleaseFinished(); });
    outbox->Add(&thread->inbox());
    s.instances.push_back(std::make_unique<LocalInstance>(std::move(thread)));
  }
  s.outbox = std::move(outbox);
  for (auto& instance : s.instances) static_cast<LocalInstance&>(*instance).thread().Start();
  return std::unique_ptr<LiveFrontend>(new LiveFrontend(std::move(impl)));
}

Result<std::unique_ptr<LiveFrontend>> LiveFrontend::StartWithWorkers(WorkerFleet fleet,
                                                                     FrontendOptions options) {
  if (options.roles.empty()) return Status::Error("worker processes need their roles");
  auto roles = CheckRoles(options.roles, options.roles.size());
  if (!roles.ok()) return roles.status();
  auto impl = std::make_unique<Impl>();
  impl->config = fleet.config;
  impl->block_tokens = static_cast<std::int32_t>(options.engine.block_tokens);
  if (Status st = InitImpl(*impl, options, *roles); !st.ok()) return st;
  if (Status st = StartFleet(*impl, std::move(fleet)); !st.ok()) return st;
  return std::unique_ptr<LiveFrontend>(new LiveFrontend(std::move(impl)));
}

LiveFrontend::~LiveFrontend() { (void)Stop(); }

Status LiveFrontend::Stop() {
  Impl& s = *impl_;
  if (s.stopped) return Status::Ok();
  s.stopped = true;
  Drain(0);
  if (s.fleet) {
    StopFleet(s);
  } else {
    for (auto& instance : s.instances) instance->Stop();
  }
  if (!s.tiers) return Status::Ok();
  s.tier_storage->Drain();
  if (Status st = s.tiers->CheckInvariants(/*expect_idle=*/true); !st.ok())
    return Status::Error("KV tiers: " + st.message());
  if (Status st = s.tier_storage->CheckInvariants(); !st.ok())
    return Status::Error("KV tiers: " + st.message());
  return Status::Ok();
}

Admission LiveFrontend::Submit(LiveRequest request, std::shared_ptr<RequestListener> listener) {
  Impl& s = *impl_;
  const models::ModelSpec& config = s.config;
  if (request.prompt.empty()) return {AdmitStatus::kInvalid, 0, "the prompt is empty"};
  if (request.max_tokens < 1) return {AdmitStatus::kInvalid, 0, "max_tokens must be at least 1"};
  if (auto problem = policies::CheckSampling(request.sampling))
    return {AdmitStatus::kInvalid, 0, "'" + problem->field + "' " + problem->message};
  for (std::int32_t id : request.prompt) {
    if (id < 0 || id >= config.vocab_size)
      return {AdmitStatus::kInvalid, 0,
              "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(config.vocab_size) + ")"};
  }
  const auto prompt_tokens = static_cast<Tokens>(request.prompt.size());
  auto r = std::make_unique<Request>();
  r->input_tokens = prompt_tokens;
  r->output_tokens = request.max_tokens;
  r->block_hashes = policies::TokenBlockHashes(request.prompt, s.block_tokens);
  r->prompt_ids = std::move(request.prompt);
  r->sampling = std::move(request.sampling);
  // What the frontend policy decides: admission first, whatever this server holds now.
  auto reply = [](policies::FrontendDecision d) -> Admission {
    switch (d.verdict) {
      using enum policies::FrontendDecision::Verdict;
      case kDispatch:
        break;
      case kInvalid:
        return {AdmitStatus::kInvalid, 0, std::move(d.reason)};
      case kTooLong:
        return {AdmitStatus::kTooLong, 0, std::move(d.reason)};
      case kUnroutable:
        return {AdmitStatus::kQueueFull, 0, std::move(d.reason)};
    }
    return {AdmitStatus::kAccepted, 0, ""};
  };
  if (std::optional<policies::FrontendDecision> refused = s.policy->Check(*r))
    return reply(std::move(*refused));

  std::lock_guard lock(s.mu);
  if (s.draining) return {AdmitStatus::kDraining, 0, "the server is shutting down"};
  if (s.pending >= s.options.max_pending_requests) {
    return {AdmitStatus::kQueueFull, 0,
            std::to_string(s.pending) +
                " requests are in flight, the most this server holds; "
                "retry later"};
  }
  r->id = s.next_id++;
  const Seconds now = s.clock.Now();
  r->arrival_s = request.received ? std::min(now, s.clock.At(*request.received)) : now;
  policies::FrontendDecision d = s.policy->Route(*r);
  if (!d.dispatched()) return reply(std::move(d));
  r->frontend_s = s.clock.Now() - r->arrival_s;
  Request* raw = r.get();
  const RequestId id = r->id;
  Impl::Entry entry{std::move(r), std::move(listener), d.prefill, d.decode, false};
  entry.client_id = id;
  entry.prompt_tokens = prompt_tokens;
  entry.max_tokens = request.max_tokens;
  s.entries.emplace(id, std::move(entry));
  ++s.pending;
  // The instance serves a copy of its own; what becomes of it comes back through its sink.
  s.outbox->Send(d.prefill, {EngineMessage::Kind::kNewRequest, std::make_shared<Request>(*raw),
                             policies::kNoInstance});
  return {AdmitStatus::kAccepted, id, ""};
}

void LiveFrontend::Abort(RequestId id) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (auto retried = s.retried.find(id); retried != s.retried.end()) id = retried->second;
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
  s.changed.wait_until(lock, deadline, [&] { return s.pending == 0 && s.telling == 0; });
  const std::int64_t aborted = s.pending;
  for (const auto& [id, entry] : s.entries) {
    if (entry.finished) continue;
    s.PostAbort(id, entry);
  }
  // An abort takes effect at the instance's next step boundary; bounded in case a step hangs.
  s.changed.wait_for(lock, std::chrono::seconds(60),
                     [&] { return s.pending == 0 && s.telling == 0; });
  return aborted;
}

Tokens LiveFrontend::max_request_tokens() const {
  return impl_->policy->limits().max_request_tokens();
}
const models::ModelSpec& LiveFrontend::model_config() const { return impl_->config; }

FrontendStats LiveFrontend::Stats() const {
  FrontendStats stats;
  for (const auto& instance : impl_->instances) stats.load += instance->load();
  stats.workers = Workers();
  std::lock_guard lock(impl_->mu);
  stats.requests_retried = impl_->requests_retried;
  return stats;
}

std::vector<WorkerStatus> LiveFrontend::Workers() const {
  if (!impl_->fleet) return {};
  return FleetStatus(*impl_);
}

}  // namespace duet::backend::serve
