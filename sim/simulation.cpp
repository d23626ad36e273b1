// The SimGrid side of `duet simulate`: SimGrid implementations of the engine ports, the
// frontend actor (arrivals, admission check, routing) and one actor per instance running the
// shared engine loop. SimGrid exceptions are caught here and turned into Status values.
#include "sim/simulation.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <unordered_map>
#include <utility>

#include "common/progress.h"
#include "deploy/engine_settings.h"
#include "policies/admission.h"
#include "policies/block_hash.h"
#include "policies/engine.h"
#include "policies/kv_event_index.h"
#include "policies/prefix_lru.h"
#include "sim/comms.h"
#include "sim/platform.h"
#include "sim/sim_kv_transport.h"
#include "sim/sim_tier_storage.h"
#include "sim/timeline.h"
#include "traces/arrivals.h"

namespace duet::sim {

namespace sg4 = simgrid::s4u;
using policies::EngineMessage;
using policies::InstanceId;
using policies::Request;
using policies::RequestState;

namespace {

constexpr std::uint64_t kControlMessageBytes = 256;

struct World;

// One instance's inbox on SimGrid: messages in the order they were sent, each moving over the
// platform from the moment it is sent (as over a real connection), so all that have arrived by
// a step boundary are there to take. A message is a host-to-host communication that only the
// receiving instance tests or waits on; it is taken once it and every message before it have
// arrived. When the instance waits with its inbox empty, it cannot wait on a communication
// not yet sent, so it posts a receive on its doorbell mailbox and the next message travels as
// the matching send instead.
//
// Why not a mailbox with a receive always posted (as before): SimGrid 3.32 keeps each receive
// on its actor's list of activities until a wait ends on it, and a receive found complete by
// a test instead stays there for the rest of the run, while every wait that ends walks that
// list. Over the hour-long Mooncake trace that walk took 13% of the run.
class SimInbox {
 public:
  SimInbox(sg4::Host* host, const std::string& name)
      : host_(host), doorbell_mailbox_(sg4::Mailbox::by_name("doorbell-" + name)) {}

  // Called by the sender's actor: `bytes` start moving from its host to this instance's now.
  void Send(const EngineMessage& message, std::uint64_t bytes);
  // Called by the receiving instance only.
  bool TryReceive(EngineMessage* message);
  // The communication whose end lets TryReceive take a message: the oldest message's, or with
  // none in flight the doorbell's receive (posted now if need be).
  const sg4::CommPtr& Waitable();
  // Set while the receiver blocks on Waitable(): with none in flight, a sender rings the bell.
  void set_waiting(bool waiting) { waiting_ = waiting; }

 private:
  struct Entry {
    sg4::CommPtr comm;
    EngineMessage message;
    bool started;  // the sender returned from starting `comm`
  };
  sg4::Host* host_;
  sg4::Mailbox* doorbell_mailbox_;
  std::deque<Entry> entries_;
  sg4::CommPtr doorbell_;  // a posted receive that no send matched yet, or null
  void* doorbell_payload_ = nullptr;
  bool waiting_ = false;  // the receiver blocks on Waitable() with no message in flight
};

// Ports of one instance, on SimGrid: the clock is the simulated clock, the inbox a SimInbox,
// steps sleep for the cost model's time, KV transfers go over a SimKvTransport.
class SimPorts final : public policies::Clock,
                       public policies::Inbox,
                       public policies::Outbox,
                       public policies::StepExecutor {
 public:
  SimPorts(World& world, InstanceId id);
  SimKvTransport& transport() { return transport_; }

  Seconds Now() const override { return sg4::Engine::get_clock(); }
  bool TryReceive(EngineMessage* message) override;
  void WaitUntil(Seconds deadline) override;
  void Send(InstanceId to, const EngineMessage& message) override;
  bool CoalescesDecodeRuns() const override { return true; }
  void Execute(const policies::StepPlan& plan, policies::StepEvents& events,
               policies::StepResult* result) override;

 private:
  // Execute without the timeline's record.
  void ExecuteSteps(const policies::StepPlan& plan, policies::StepEvents& events,
                    policies::StepResult* result);
  // Layer-wise loading: a step whose prefills wait for loads from the lower tiers cannot end
  // before the last of them arrived, and ends one layer's compute after it. Waits for those
  // still in flight after the computation (the engine takes events meanwhile) and moves the
  // step's end. step_start_s: when the step began.
  void FinishOverlappedLoads(const policies::StepPlan& plan, Seconds step_start_s,
                             policies::StepEvents& events, policies::StepResult* result);
  // Blocks until the inbox or a transfer completes, or `timeout` (< 0: none). True if woken.
  bool WaitAny(double timeout);

  World& world_;
  InstanceId id_;
  SimInbox& inbox_;
  SimKvTransport transport_;
  std::vector<sg4::CommPtr> waitables_;  // reused
};

// Forwards lifecycle events to the metrics collector and the router, counts finished
// requests, draws the progress bar, and wakes the frontend when the last request finished.
class SimSink final : public policies::EventSink {
 public:
  explicit SimSink(World& world) : world_(world) {}
  void OnFinished(const Request& request) override;
  void OnPrefillDone(const Request& request) override;
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
  void OnPreempted(const Request& request, InstanceId instance) override;
  // With a stale router view: queued for delivery router_staleness_s from now.
  void OnKvEvents(InstanceId instance, std::span<const policies::KvCacheEvent> events) override;

 private:
  void DrawProgress(bool final);
  World& world_;
  std::size_t last_drawn_ = 0;
};

// What the router knows of the instances' caches: their GPU prefix caches from the block
// managers, or with a staleness from the KV events delivered so far; the lower tiers as they are.
class EngineCacheView final : public policies::CacheView {
 public:
  explicit EngineCacheView(World& world) : world_(world) {}
  Tokens CachedPrefixTokens(InstanceId instance, const Request& request) const override;
  policies::PrefixReuse Reuse(InstanceId instance, const Request& request) const override;

 private:
  World& world_;
};

struct World {
  const ClusterSpec& cluster;
  const traces::Trace& trace;
  const SimOptions& options;
  Platform platform;
  std::vector<Request> requests;
  std::vector<std::unique_ptr<models::StepCostModel>> costs;
  std::vector<std::unique_ptr<SimPorts>> ports;
  std::vector<std::unique_ptr<policies::InstanceEngine>> engines;
  std::vector<std::unique_ptr<SimInbox>> inboxes;
  std::vector<SimKvEndpoint> instances;  // per instance, its GPUs and KV blocks
  policies::MetricsCollector metrics;
  std::unique_ptr<SimSink> sink;
  std::unique_ptr<SimTierStorage> storage;
  std::unique_ptr<policies::TierManager> tiers;  // null without tiers
  std::unique_ptr<EngineCacheView> cache_view;
  std::unique_ptr<policies::Router> router;
  std::unique_ptr<Timeline> timeline;  // with --timeline
  // Stale router view (router_staleness_s > 0): the GPU caches as KV events delivered so far
  // describe them, and the events still in flight, in delivery order.
  struct KvEventsInFlight {
    Seconds deliver_s;
    InstanceId instance;
    std::vector<policies::KvCacheEvent> events;
  };
  std::unique_ptr<policies::KvEventIndex> stale_index;
  std::deque<KvEventsInFlight> kv_events_in_flight;
  // The pooled reference: one prefix cache with the summed GPU KV blocks of the instances that
  // prefill, seeing every routed request at its arrival (hit tokens, as the engines count them).
  std::unique_ptr<policies::PrefixLru> pooled;
  Tokens pooled_lookup_tokens = 0, pooled_hit_tokens = 0;
  // When requests are sent (open loop, sessions, closed loop) and, with sessions, how many
  // later turns still need each request's context hashes.
  std::optional<traces::Arrivals> arrivals;
  // Arrival times that depend on finishes: the frontend sleeps on `wake` until the next known
  // arrival, and a finish wakes it.
  sg4::MutexPtr wake_mutex;
  sg4::ConditionVariablePtr wake;
  bool frontend_sleeping = false;
  sg4::Mailbox* done_mailbox = nullptr;
  bool frontend_waiting = false;
  std::size_t finished = 0;
  // options.stop_below_attainment: the SLO misses an attainment of it allows, those so far.
  std::size_t allowed_misses = 0, misses = 0;
  bool stopped_early = false;
  std::int64_t events = 0;  // actor wake-ups: arrivals, steps and runs, waits ended
  // Bytes each link carried (links.csv), counted on the route of every transfer started.
  std::unordered_map<const sg4::Link*, double> link_bytes;
  std::vector<sg4::Link*> route_scratch;

  // Starts a host-to-host transfer of `bytes` and counts them on its route.
  sg4::CommPtr Transfer(sg4::Host* src, sg4::Host* dst, std::uint64_t bytes) {
    CountRoute(src, dst, static_cast<double>(bytes));
    return sg4::Comm::sendto_async(src, dst, bytes);
  }
  // Transfer, for the ports.
  StartComm Starter() {
    return [this](sg4::Host* src, sg4::Host* dst, std::uint64_t bytes) {
      return Transfer(src, dst, bytes);
    };
  }
  void CountRoute(const sg4::Host* src, const sg4::Host* dst, double bytes) {
    route_scratch.clear();
    src->route_to(dst, route_scratch, nullptr);
    for (const sg4::Link* l : route_scratch) link_bytes[l] += bytes;
  }
  std::vector<std::string> errors;

  World(const ClusterSpec& c, const traces::Trace& t, const SimOptions& o)
      : cluster(c), trace(t), options(o) {}
};

void SimInbox::Send(const EngineMessage& message, std::uint64_t bytes) {
  // Starting a communication is a simcall, where the sender yields and the receiver may run:
  // the inbox is changed before it.
  if (entries_.empty() && waiting_ && doorbell_) {
    // The receiver waits on the doorbell: this send matches its receive and wakes it on arrival.
    entries_.push_back({std::exchange(doorbell_, nullptr), message, true});
    // SimGrid needs a non-null payload to tell a send from a receive.
    static int token = 0;
    doorbell_mailbox_->put_init(&token, bytes)->detach();
    return;
  }
  sg4::CommPtr comm =
      sg4::Comm::sendto_init()->set_payload_size(bytes)->set_source(sg4::this_actor::get_host());
  Entry& entry = entries_.emplace_back(Entry{comm, message, false});
  comm->set_destination(host_);  // starts it; the entry stays (TryReceive takes started ones)
  entry.started = true;
}

bool SimInbox::TryReceive(EngineMessage* message) {
  // A test of a communication whose sender has not returned from starting it would start it
  // again; one that the sender is starting has not arrived anyway.
  if (entries_.empty() || !entries_.front().started || !entries_.front().comm->test()) return false;
  *message = std::move(entries_.front().message);
  entries_.pop_front();
  return true;
}

const sg4::CommPtr& SimInbox::Waitable() {
  // Posting the receive is a simcall, during which a sender may run and find no doorbell yet.
  // The oldest message may be one whose sender has not returned from starting it: the start
  // was handled before this actor's wait can be, since the sender yielded first.
  if (entries_.empty() && !doorbell_) doorbell_ = doorbell_mailbox_->get_async(&doorbell_payload_);
  return entries_.empty() ? doorbell_ : entries_.front().comm;
}

SimPorts::SimPorts(World& world, InstanceId id)
    : world_(world),
      id_(id),
      inbox_(*world.inboxes[static_cast<std::size_t>(id)]),
      transport_(world.instances, world.Starter(), world.timeline.get()) {}

bool SimPorts::TryReceive(EngineMessage* message) { return inbox_.TryReceive(message); }

bool SimPorts::WaitAny(double timeout) {
  waitables_.clear();
  waitables_.push_back(inbox_.Waitable());
  transport_.AppendWaitables(&waitables_);
  if (world_.storage) world_.storage->AppendWaitables(&waitables_);
  inbox_.set_waiting(true);
  const ssize_t woken = sg4::Comm::wait_any_for(waitables_, timeout);
  inbox_.set_waiting(false);
  ++world_.events;
  return woken >= 0;
}

void SimPorts::WaitUntil(Seconds deadline) {
  const double timeout = std::isinf(deadline) ? -1.0 : std::max(0.0, deadline - Now());
  WaitAny(timeout);
}

void SimPorts::Send(InstanceId to, const EngineMessage& message) {
  world_.CountRoute(world_.instances[static_cast<std::size_t>(id_)].gpus.front(),
                    world_.instances[static_cast<std::size_t>(to)].gpus.front(),
                    kControlMessageBytes);
  world_.inboxes[static_cast<std::size_t>(to)]->Send(message, kControlMessageBytes);
}

void SimPorts::Execute(const policies::StepPlan& plan, policies::StepEvents& events,
                       policies::StepResult* result) {
  const Seconds start_s = Now();
  ExecuteSteps(plan, events, result);
  if (!world_.timeline) return;
  const models::StepShape shape = plan.Shape();
  Seconds step_start_s = start_s;
  for (const Seconds end_s : result->step_end_s) {
    world_.timeline->Add(Timeline::Step{id_, step_start_s, end_s, shape.PrefillTokens(),
                                        shape.decode_tokens,
                                        static_cast<std::int32_t>(plan.prefills.size()),
                                        static_cast<std::int32_t>(plan.decodes.size())});
    step_start_s = end_s;
  }
}

void SimPorts::ExecuteSteps(const policies::StepPlan& plan, policies::StepEvents& events,
                            policies::StepResult* result) {
  const auto& cost = *world_.costs[static_cast<std::size_t>(id_)];
  const Seconds start = Now();
  std::vector<Seconds>* step_end_s = &result->step_end_s;
  models::StepShape shape = plan.Shape();
  if (plan.max_steps <= 1) {
    sg4::this_actor::sleep_for(cost.StepTime(shape));
    ++world_.events;
    step_end_s->push_back(Now());
    if (!plan.awaited_loads.empty()) FinishOverlappedLoads(plan, start, events, result);
    return;
  }
  cost.AppendDecodeRunEnds(shape, plan.max_steps, start, step_end_s);
  if (!WaitAny(step_end_s->back() - start)) return;  // ran to the end undisturbed
  // New work arrived: finish the step in progress and stop at its boundary.
  const Seconds now = Now();
  const auto boundary = std::lower_bound(step_end_s->begin(), step_end_s->end(), now);
  if (*boundary > now) {
    sg4::this_actor::sleep_until(*boundary);
    ++world_.events;
  }
  step_end_s->erase(boundary + 1, step_end_s->end());
}

void SimPorts::FinishOverlappedLoads(const policies::StepPlan& plan, Seconds step_start_s,
                                     policies::StepEvents& events, policies::StepResult* result) {
  policies::TierManager& tiers = *world_.tiers;
  for (const policies::AwaitedLoad& a : plan.awaited_loads) {
    if (!tiers.LoadFinished(a.load)) result->delayed_by_loads.push_back(a.request->id);
  }
  if (result->delayed_by_loads.empty()) return;  // they hid behind the computation
  auto loading = [&] {
    return std::any_of(plan.awaited_loads.begin(), plan.awaited_loads.end(),
                       [&](const policies::AwaitedLoad& a) { return !tiers.LoadFinished(a.load); });
  };
  // What else ends meanwhile is taken as between steps (it only queues work), and must be: a
  // finished transfer or message left untaken would end every wait at once.
  events.TakeEvents();
  while (loading()) {
    WaitUntil(policies::kForever);
    events.TakeEvents();
  }
  // The last layer's KV has just arrived: that layer's share of the step remains.
  const Seconds step_end = result->step_end_s.back();
  const Seconds end = Now() + (step_end - step_start_s) / plan.num_layers;
  while (Now() < end) {
    WaitUntil(end);
    events.TakeEvents();
  }
  result->load_wait_s = end - step_end;
  result->step_end_s.back() = end;
}

void SimSink::OnFinished(const Request& request) {
  // Nothing reads a finished request's prefix hashes again (routing, admission and offload
  // are behind it) unless a later turn continues its context: free them, about 6 KB per
  // Mooncake request, before the record is copied.
  const auto k = static_cast<std::size_t>(&request - world_.requests.data());
  Request& r = world_.requests[k];
  if (world_.arrivals->continuations_left(k) == 0) {
    std::vector<policies::BlockHash>().swap(r.block_hashes);
  } else if (world_.pooled && !world_.cluster.pd() && r.state == RequestState::kCompleted) {
    // Colocated instances cache the output of a request that later turns continue (the engine
    // does, at completion): so does the pooled reference.
    world_.pooled->Touch(r.block_hashes, r.input_tokens + r.output_tokens - 1);
  }
  world_.metrics.OnFinished(request);
  world_.router->OnFinished(request);
  ++world_.finished;
  if (world_.options.stop_below_attainment > 0 && !world_.options.slo.Met(r) &&
      ++world_.misses > world_.allowed_misses) {
    // The target is out of reach: end every actor, this one last. Nothing after this point
    // runs, and the run's end skips the checks of a drained cluster.
    world_.stopped_early = true;
    sg4::Actor::kill_all();
    sg4::this_actor::exit();
  }
  if (world_.options.progress) DrawProgress(false);
  world_.arrivals->OnFinished(k, sg4::Engine::get_clock(), r.state == RequestState::kCompleted);
  if (world_.frontend_sleeping) world_.wake->notify_all();
  if (world_.finished == world_.arrivals->released() && world_.arrivals->Exhausted() &&
      world_.frontend_waiting) {
    // SimGrid needs a non-null payload to tell a send from a receive.
    static int done_token = 0;
    world_.done_mailbox->put_init(&done_token, 0)->detach();
  }
}

void SimSink::OnPrefillDone(const Request& request) { world_.router->OnPrefillDone(request); }

void SimSink::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  world_.metrics.OnTokenGaps(gap_s, count);
}

void SimSink::OnPreempted(const Request& request, InstanceId instance) {
  world_.metrics.OnPreempted(request, instance);
}

void SimSink::OnKvEvents(InstanceId instance, std::span<const policies::KvCacheEvent> events) {
  world_.kv_events_in_flight.push_back(
      {sg4::Engine::get_clock() + world_.options.router_staleness_s, instance,
       std::vector<policies::KvCacheEvent>(events.begin(), events.end())});
}

void SimSink::DrawProgress(bool final) {
  const std::size_t total = world_.requests.size();
  const std::size_t step = std::max<std::size_t>(1, total / 100);
  if (!final && world_.finished - last_drawn_ < step && world_.finished != total) return;
  last_drawn_ = world_.finished;
  char detail[96];
  std::snprintf(detail, sizeof detail, "%zu/%zu requests  simulated %.1f s", world_.finished, total,
                sg4::Engine::get_clock());
  duet::DrawProgress(world_.finished, total, detail);
}

Tokens EngineCacheView::CachedPrefixTokens(InstanceId instance, const Request& request) const {
  if (world_.stale_index) return world_.stale_index->CachedPrefixTokens(instance, request);
  const auto& blocks = world_.engines[static_cast<std::size_t>(instance)]->blocks();
  return blocks.BlocksToTokens(blocks.CachedPrefixBlocks(request.block_hashes));
}

policies::PrefixReuse EngineCacheView::Reuse(InstanceId instance, const Request& request) const {
  policies::PrefixReuse reuse;
  reuse.gpu_tokens = CachedPrefixTokens(instance, request);
  if (!world_.tiers) return reuse;
  const Tokens block = world_.cluster.engine.block_tokens;
  // As at admission: at least one prompt token is computed.
  const std::int64_t gpu_blocks = reuse.gpu_tokens / block;
  const policies::TierHits hits = world_.tiers->Lookup(
      instance, request.block_hashes, gpu_blocks, (request.input_tokens - 1) / block - gpu_blocks);
  reuse.tier_tokens = hits.total() * block;
  reuse.load_s = world_.tiers->EstimateLoadSeconds(hits);
  return reuse;
}

// Largest KV footprint (tokens) an instance admits: its blocks less the admission watermark.
Tokens AdmissibleTokens(const World& w, InstanceId i) {
  const auto& blocks = w.engines[static_cast<std::size_t>(i)]->blocks();
  return w.cluster.engine.scheduler.AdmissibleTokens(blocks.num_blocks(), blocks.block_tokens());
}

// Hands the stale router view the KV events whose delivery time has come.
void DeliverKvEvents(World& w) {
  const Seconds now = sg4::Engine::get_clock();
  while (!w.kv_events_in_flight.empty() && w.kv_events_in_flight.front().deliver_s <= now) {
    const auto& e = w.kv_events_in_flight.front();
    w.stale_index->Apply(e.instance, e.events);
    w.kv_events_in_flight.pop_front();
  }
}

// The pooled reference cache sees `r` at its arrival: its hit counted, its prompt cached.
void LookUpPooled(World& w, const Request& r) {
  if (!w.pooled || r.input_tokens <= 0) return;
  const auto hit = w.pooled->Touch(r.block_hashes, r.input_tokens);
  if (!hit) return;  // larger than every prefill instance together: admission rejected it
  w.pooled_lookup_tokens += r.input_tokens;
  w.pooled_hit_tokens += *hit;
}

// A later turn of request `p` took its context hashes (or will never need them): once no turn
// needs them and `p` finished, they go.
void ReleaseContext(World& w, std::size_t p) {
  if (w.arrivals->continuations_left(p) == 0 && policies::IsFinished(w.requests[p].state))
    std::vector<policies::BlockHash>().swap(w.requests[p].block_hashes);
}

// Request `k`'s prefix hashes, set when it is sent. A later turn of a session inherits its
// parent's context hashes (prompt and output, computed when the parent was sent), then names
// its new tokens as its own; a request that later turns continue names its output too.
void SetBlockHashes(World& w, std::size_t k) {
  Request& r = w.requests[k];
  const traces::TraceRequest& tr = w.trace.requests[k];
  const Tokens block = w.cluster.engine.block_tokens;
  if (const auto p = w.arrivals->parent(k)) {
    Request& parent = w.requests[*p];
    const auto inherited = std::min<std::size_t>(
        parent.block_hashes.size(), static_cast<std::size_t>(tr.context_tokens / block));
    r.block_hashes.assign(parent.block_hashes.begin(),
                          parent.block_hashes.begin() + static_cast<std::ptrdiff_t>(inherited));
    ReleaseContext(w, *p);
    policies::ExtendUniqueBlockHashes(r.block_hashes, r.id, r.input_tokens / block);
  } else {
    r.block_hashes =
        policies::EngineBlockHashes(tr.block_ids, w.trace.block_tokens, r.input_tokens, block);
  }
  // Prompt content no trace id names, and the output, are this request's own.
  if (w.arrivals->continuations_left(k) > 0)
    policies::ExtendUniqueBlockHashes(r.block_hashes, r.id,
                                      (r.input_tokens + r.output_tokens) / block);
}

void Frontend(World& w) {
  std::vector<policies::InstanceRole> roles;
  std::vector<Tokens> admissible;
  for (std::size_t i = 0; i < w.cluster.instances.size(); ++i) {
    roles.push_back(w.cluster.instances[i].role);
    admissible.push_back(AdmissibleTokens(w, static_cast<InstanceId>(i)));
  }
  const auto limits = policies::AdmissionLimits::For(
      roles, admissible, w.cluster.model.max_position_embeddings, w.cluster.model.name);

  auto reject = [&](Request& r, std::string reason) {
    r.state = RequestState::kRejected;
    r.finished_s = sg4::Engine::get_clock();
    r.reason = std::move(reason);
    w.sink->OnFinished(r);
  };
  // Sends request `k`: admission checks, routing, the message to its prefill instance.
  auto send = [&](std::size_t k, Seconds arrival_s) {
    Request& r = w.requests[k];
    r.arrival_s = arrival_s;
    r.session = w.arrivals->session(k);
    SetBlockHashes(w, k);
    // Reasons read "<class>: <detail>": the summary counts them by class.
    if (auto too_long = limits.Check(r.input_tokens, r.output_tokens))
      return reject(r, std::move(*too_long));
    DeliverKvEvents(w);
    const policies::RoutingDecision d = w.router->Route(r);
    if (!d.reject_reason.empty()) return reject(r, d.reject_reason);
    r.prefill_instance = d.prefill;
    r.decode_instance = d.decode;
    r.router_score = d.score;
    LookUpPooled(w, r);
    r.state = RequestState::kQueued;
    // The request carries its token ids: 4 bytes a token.
    w.CountRoute(w.platform.frontend, w.instances[static_cast<std::size_t>(d.prefill)].gpus.front(),
                 static_cast<double>(r.input_tokens) * 4);
    w.inboxes[static_cast<std::size_t>(d.prefill)]->Send(
        EngineMessage{EngineMessage::Kind::kNewRequest, &r, policies::kNoInstance},
        static_cast<std::uint64_t>(r.input_tokens) * 4);
  };

  traces::Arrivals& arrivals = *w.arrivals;
  for (;;) {
    // A request whose dependency was rejected or failed is never sent.
    while (const auto dropped = arrivals.TakeDropped()) {
      Request& r = w.requests[dropped->index];
      r.arrival_s = sg4::Engine::get_clock();
      if (const auto parent = w.arrivals->parent(dropped->index)) ReleaseContext(w, *parent);
      const Request& cause = w.requests[dropped->cause];
      reject(r, std::string("dependency not completed: request ") + std::to_string(cause.id) +
                    " was " + policies::ToString(cause.state));
    }
    if (const auto due = arrivals.TakeDue(sg4::Engine::get_clock())) {
      send(due->index, due->arrival_s);
      continue;
    }
    if (arrivals.Exhausted()) break;
    const std::optional<Seconds> next = arrivals.NextArrival();
    if (!arrivals.dynamic()) {
      sg4::this_actor::sleep_until(*next);
    } else {
      // Until the next known arrival, or a finish that may bring one sooner.
      std::unique_lock lock(*w.wake_mutex);
      w.frontend_sleeping = true;
      if (next) {
        w.wake->wait_until(lock, *next);
      } else {
        w.wake->wait(lock);
      }
      w.frontend_sleeping = false;
    }
    ++w.events;
  }
  if (w.finished < arrivals.released()) {
    w.frontend_waiting = true;
    w.done_mailbox->get<int>();
    ++w.events;
  }
  for (std::size_t i = 0; i < w.engines.size(); ++i) {
    w.CountRoute(w.platform.frontend, w.instances[i].gpus.front(), kControlMessageBytes);
    w.inboxes[i]->Send(
        EngineMessage{EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance},
        kControlMessageBytes);
  }
}

policies::TierSetup TierSetupFor(const ClusterSpec& cluster) {
  using policies::TierKind;
  policies::TierSetup setup;
  setup.block_bytes = cluster.engine.block_tokens * cluster.KvBytesPerToken();
  setup.num_nodes = static_cast<int>(cluster.nodes.size());
  setup.prefetch_to_dram = cluster.tiers.dram.prefetch;
  for (const InstancePlacement& at : cluster.placements) setup.instance_node.push_back(at.node);
  // Routing estimates: the slowest resource on each tier's path into a GPU (first node's).
  const NodeSpec& node = cluster.nodes.front();
  const TiersSpec& t = cluster.tiers;
  const double mem = t.dram.enabled ? t.dram.link.bandwidth : 200 * kGB;
  const double read_bw[3] = {std::min(node.pcie.bandwidth, mem),
                             std::min({t.ssd.read_bw, node.pcie.bandwidth, mem}),
                             std::min({t.remote.link.bandwidth, cluster.switch_link.bandwidth,
                                       node.nic.bandwidth, node.pcie.bandwidth})};
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const TierSpec& spec = t[static_cast<TierKind>(k)];
    policies::TierConfig& c = setup.tiers[static_cast<std::size_t>(k)];
    c.enabled = spec.enabled;
    c.capacity_bytes = spec.capacity_bytes;
    c.placement = spec.placement;
    c.eviction = spec.eviction;
    c.read_bandwidth = read_bw[k];
  }
  return setup;
}

// Per tier: configuration, traffic and occupancy. Present with zeros when a tier is absent.
nlohmann::json TiersSummary(const World& w) {
  using policies::TierKind;
  nlohmann::json out = nlohmann::json::object();
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<TierKind>(k);
    const TierSpec& spec = w.cluster.tiers[kind];
    nlohmann::json j = {{"enabled", spec.enabled}, {"capacity_bytes", spec.capacity_bytes}};
    policies::TierCounters c;
    std::int64_t evictions = 0, peak = 0;
    if (w.tiers && spec.enabled) {
      c = w.tiers->counters(kind);
      evictions = w.tiers->evictions(kind);
      peak = w.tiers->peak_used_blocks(kind);
      j["placement"] = policies::ToString(spec.placement);
      j["eviction"] = policies::ToString(spec.eviction);
    }
    j["write_blocks"] = c.write_blocks;
    j["written_blocks"] = c.written_blocks;
    j["write_bytes"] = c.write_bytes;
    j["write_ios"] = c.write_ios;
    j["read_blocks"] = c.read_blocks;
    j["read_bytes"] = c.read_bytes;
    j["read_ios"] = c.read_ios;
    j["evictions"] = evictions;
    j["dropped_writes"] = c.dropped_writes;
    j["prefetch_blocks"] = c.prefetch_blocks;
    j["peak_used_blocks"] = peak;
    for (bool read : {false, true}) {
      SimTierStorage::IoTimes t;
      if (w.storage) t = w.storage->times(kind, read);
      j[read ? "read_time_ms" : "write_time_ms"] = {
          {"mean", t.count ? std::round(t.total_s / static_cast<double>(t.count) * 1e6) / 1e3 : 0},
          {"max", std::round(t.max_s * 1e6) / 1e3}};
    }
    out[policies::ToString(kind)] = j;
  }
  return out;
}

// links.csv: bytes carried by every link direction and disk, and its busy time at full rate
// (bytes / bandwidth) and utilization over the simulated time.
Status WriteLinksCsv(const World& w, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  const double simulated_s = sg4::Engine::get_clock();
  out << "resource,kind,bandwidth_GBps,bytes,busy_s,utilization\n";
  auto row = [&](const std::string& name, const char* kind, double bw, double bytes) {
    const double busy = bw > 0 ? bytes / bw : 0.0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s,%s,%.3f,%.0f,%.6f,%.6f\n", name.c_str(), kind, bw / kGB,
                  bytes, busy, simulated_s > 0 ? busy / simulated_s : 0.0);
    out << buf;
  };
  auto links = sg4::Engine::get_instance()->get_all_links();
  std::sort(links.begin(), links.end(),
            [](const sg4::Link* a, const sg4::Link* b) { return a->get_name() < b->get_name(); });
  for (const sg4::Link* link : links) {
    if (link->get_name() == "__loopback__") continue;
    const std::string& name = link->get_name();
    const bool disk = name.find("-ssd-") != std::string::npos;
    auto it = w.link_bytes.find(link);
    row(name, disk ? "disk" : "link", link->get_bandwidth(),
        it == w.link_bytes.end() ? 0.0 : it->second);
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace

namespace {

// The output files of a run: each is written to a hidden temporary file in the output
// directory, and all are renamed into place only once every one was written, so a run that
// fails leaves none of them (and no stale mix of old and new).
class OutputFiles {
 public:
  explicit OutputFiles(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~OutputFiles() {
    std::error_code ignored;
    for (const auto& [tmp, final_path] : files_) std::filesystem::remove(tmp, ignored);
  }
  // Where to write `name` (in the output directory, or a path elsewhere) for now.
  std::string Add(const std::string& name) { return AddPath(dir_ / name); }
  std::string AddPath(const std::filesystem::path& path) {
    std::string hidden = ".";  // appended, not `"." + ...`: GCC 12 warns falsely (-Wrestrict)
    hidden += path.filename().string();
    hidden += ".tmp";
    files_.emplace_back(path.parent_path() / hidden, path);
    return files_.back().first.string();
  }
  Status Commit() {
    std::error_code ec;
    for (const auto& [tmp, final_path] : files_) {
      if (std::filesystem::is_directory(final_path, ec))
        return Status::Error(final_path.string() + ": cannot write: is a directory");
    }
    for (std::size_t i = 0; i < files_.size(); ++i) {
      std::filesystem::rename(files_[i].first, files_[i].second, ec);
      if (ec) {
        const Status error =
            Status::Error(files_[i].second.string() + ": cannot write: " + ec.message());
        // Take back the ones already in place: all of the run's files or none.
        for (std::size_t j = 0; j < i; ++j) std::filesystem::remove(files_[j].second, ec);
        return error;
      }
    }
    files_.clear();
    return Status::Ok();
  }

 private:
  std::filesystem::path dir_;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> files_;
};

Result<SimReport> Simulate(const ClusterSpec& cluster, const traces::Trace& trace,
                           const SimOptions& options) {
  namespace fs = std::filesystem;
  const auto wall_start = std::chrono::steady_clock::now();

  const std::unique_ptr<sg4::Engine> engine = MakeEngine();

  World w(cluster, trace, options);
  w.platform = BuildPlatform(cluster);
  w.requests.resize(trace.requests.size());
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    const auto& tr = trace.requests[k];
    Request& r = w.requests[k];
    r.id = tr.id;
    r.arrival_s = tr.arrival_s;
    r.input_tokens = tr.input_tokens;
    r.output_tokens = tr.output_tokens;
  }
  auto arrivals = traces::Arrivals::Create(trace, options.closed_loop);
  if (!arrivals) return arrivals.status();
  w.arrivals.emplace(std::move(*arrivals));
  if (options.stop_below_attainment > 0) {
    if (!options.slo.any() || options.closed_loop.users > 0 ||
        !(options.stop_below_attainment <= 1))
      return Status::Error(
          "stopping below an attainment needs one in (0, 1], an SLO and an open loop");
    // Met requests must reach ceil(a * N): the rest may miss.
    const auto n = static_cast<double>(trace.requests.size());
    w.allowed_misses =
        static_cast<std::size_t>(n - std::ceil(options.stop_below_attainment * n - 1e-9));
  }
  if (w.arrivals->dynamic()) {
    w.wake_mutex = sg4::Mutex::create();
    w.wake = sg4::ConditionVariable::create();
  }
  w.done_mailbox = sg4::Mailbox::by_name("frontend-done");
  w.sink = std::make_unique<SimSink>(w);
  w.cache_view = std::make_unique<EngineCacheView>(w);

  std::vector<InstanceId> prefill_side, decode_side;
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    const deploy::InstanceSpec& spec = cluster.instances[i];
    const InstancePlacement& at = cluster.placements[i];
    const auto id = static_cast<InstanceId>(i);
    (spec.role == policies::InstanceRole::kDecode ? decode_side : prefill_side).push_back(id);
    std::vector<sg4::Host*> hosts;
    for (int g : at.gpus)
      hosts.push_back(
          w.platform.gpus[static_cast<std::size_t>(at.node)][static_cast<std::size_t>(g)]);
    w.instances.push_back(
        {std::move(hosts),
         {cluster.engine.block_tokens * cluster.KvBytesPerToken(), at.memory.kv_blocks}});
    w.inboxes.push_back(std::make_unique<SimInbox>(w.instances.back().gpus.front(), spec.name));
    w.costs.push_back(MakeStepCostModel(cluster, i));
  }
  if (!options.timeline_path.empty()) w.timeline = std::make_unique<Timeline>();
  if (cluster.tiers.any()) {
    w.storage =
        std::make_unique<SimTierStorage>(w.platform, w.instances, w.Starter(), w.timeline.get());
    w.tiers = std::make_unique<policies::TierManager>(TierSetupFor(cluster), w.storage.get());
  }
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    const deploy::InstanceSpec& spec = cluster.instances[i];
    w.ports.push_back(std::make_unique<SimPorts>(w, static_cast<InstanceId>(i)));
    policies::EngineConfig config =
        deploy::MakeEngineConfig(cluster.engine, static_cast<InstanceId>(i), spec.role);
    config.tp = spec.tp;
    config.num_blocks = cluster.placements[i].memory.kv_blocks;
    config.kv_bytes_per_token = cluster.KvBytesPerToken();
    config.num_layers = cluster.model.num_hidden_layers;
    config.publish_kv_events = options.router_staleness_s > 0 &&
                               cluster.engine.enable_prefix_caching &&
                               spec.role != policies::InstanceRole::kDecode;
    SimPorts* p = w.ports.back().get();
    w.engines.push_back(std::make_unique<policies::InstanceEngine>(
        config, policies::EnginePorts{p, p, p, p, &p->transport(), w.sink.get(), w.tiers.get()}));
  }
  if (options.router_staleness_s > 0) {
    w.stale_index = std::make_unique<policies::KvEventIndex>(
        static_cast<int>(cluster.instances.size()), cluster.engine.block_tokens);
  }
  if (cluster.engine.enable_prefix_caching) {
    std::int64_t pooled_blocks = 0;
    for (InstanceId i : prefill_side)
      pooled_blocks += cluster.placements[static_cast<std::size_t>(i)].memory.kv_blocks;
    w.pooled = std::make_unique<policies::PrefixLru>(pooled_blocks, cluster.engine.block_tokens);
  }
  policies::RouterConfig router = options.router;
  {
    // The cache-aware router's prefill rate: a full token budget of prompt on one instance.
    const Tokens chunk = cluster.engine.scheduler.max_num_batched_tokens;
    models::StepShape shape;
    shape.tp = cluster.instances[static_cast<std::size_t>(prefill_side.front())].tp;
    shape.prefill.push_back({chunk, 0});
    router.prefill_tokens_per_s =
        static_cast<double>(chunk) /
        w.costs[static_cast<std::size_t>(prefill_side.front())]->StepTime(shape);
    if (options.reject_over_slo) router.reject_ttft_ms = options.slo.ttft_ms;
  }
  w.router = policies::MakeRouter(router, prefill_side, decode_side, w.cache_view.get());

  for (std::size_t i = 0; i < w.engines.size(); ++i) {
    sg4::Actor::create(cluster.instances[i].name, w.instances[i].gpus.front(), [&w, i] {
      w.engines[i]->Run();
      if (Status s = w.engines[i]->CheckInvariants(); !s.ok()) w.errors.push_back(s.message());
    });
  }
  sg4::Actor::create("frontend", w.platform.frontend, [&w] { Frontend(w); });
  try {
    engine->run();
  } catch (const std::exception& e) {
    return Status::Error(std::string("simulation failed: ") + e.what());
  }
  // The tier stores' end-of-run check reads every slot of tables of millions. Nothing changes
  // them any more, so it runs on a thread of its own (a second core, where there is one) while
  // the report and its files are made, and is waited for before the files are committed.
  std::future<Status> tiers_checked;
  if (w.tiers && !w.stopped_early) {
    tiers_checked = std::async([&w] { return w.tiers->CheckInvariants(/*expect_idle=*/true); });
  }
  const std::string broken = "simulation ended in a broken state: ";
  if (!w.errors.empty()) return Status::Error(broken + w.errors.front());

  SimReport report;
  // A closed loop that ran out of time sent only part of the trace.
  // A run stopped early counts what it never finished as failed.
  report.summary = w.metrics.Summary(
      w.stopped_early ? trace.requests.size() : w.arrivals->released(), options.slo);
  std::int64_t steps = 0;
  for (const auto& e : w.engines) steps += e->steps();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  report.summary["sim"] = {{"wall_s", std::round(wall_s * 1000) / 1000},
                           {"simulated_s", std::round(sg4::Engine::get_clock() * 1e6) / 1e6},
                           {"events", w.events},
                           {"engine_steps", steps},
                           {"stopped_early", w.stopped_early}};
  int gpus = 0;
  for (const InstancePlacement& at : cluster.placements) gpus += static_cast<int>(at.gpus.size());
  // The cluster is held for the whole simulated time, idle GPUs included.
  report.summary["gpu_hours"] = policies::Round(gpus * sg4::Engine::get_clock() / 3600.0, 6);
  report.summary["run"] = {{"cluster", cluster.name},
                           {"gpus", gpus},
                           {"closed_loop", traces::ToJson(options.closed_loop)},
                           {"model", cluster.model.name},
                           {"mode", cluster.pd() ? "pd" : "colocated"},
                           {"instances", cluster.instances.size()},
                           {"router", policies::ToString(options.router.kind)},
                           {"router_options",
                            {{"queue_weight", options.router.kv.QueueWeight(!cluster.pd())},
                             {"prefill_weight", options.router.kv.prefill_weight},
                             {"decode_weight", options.router.kv.decode_weight},
                             {"interference_weight", options.router.kv.interference_weight},
                             {"footprint_weight", options.router.kv.footprint_weight},
                             {"footprint_window_s", options.router.kv.footprint_window_s},
                             {"temperature", options.router.kv.temperature},
                             {"load_guard", options.router.load_guard},
                             {"staleness_ms", options.router_staleness_s * 1e3}}},
                           {"trace", trace.source},
                           {"seed", options.router.seed}};
  report.summary["prefix_cache"]["pooled_reference"] = {
      {"capacity_blocks", w.pooled ? w.pooled->num_blocks() : 0},
      {"lookup_tokens", w.pooled_lookup_tokens},
      {"hit_tokens", w.pooled_hit_tokens},
      {"hit_rate", w.pooled_lookup_tokens > 0
                       ? policies::Round(static_cast<double>(w.pooled_hit_tokens) /
                                             static_cast<double>(w.pooled_lookup_tokens),
                                         6)
                       : 0.0}};
  report.summary["tiers"] = TiersSummary(w);
  OutputFiles files(options.out_dir);
  DUET_RETURN_IF_ERROR(WriteLinksCsv(w, files.Add("links.csv")));
  std::vector<std::string> names;
  for (const auto& inst : cluster.instances) names.push_back(inst.name);
  DUET_RETURN_IF_ERROR(w.metrics.WriteRequestsCsv(files.Add("requests.csv"), names));
  if (w.timeline) {
    DUET_RETURN_IF_ERROR(
        w.timeline->Write(files.AddPath(options.timeline_path), names, w.requests));
  }
  const std::string summary_path = files.Add("summary.json");
  std::ofstream out(summary_path);
  out << report.summary.dump(2) << "\n";
  out.close();
  if (!out) return Status::Error(summary_path + ": write failed");
  if (tiers_checked.valid()) {
    if (Status s = tiers_checked.get(); !s.ok()) return Status::Error(broken + s.message());
  }
  DUET_RETURN_IF_ERROR(files.Commit());
  return report;
}

}  // namespace

Result<SimReport> RunSimulation(const ClusterSpec& cluster, const traces::Trace& trace,
                                const SimOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool existed = fs::exists(options.out_dir, ec);
  fs::create_directories(options.out_dir, ec);
  if (ec)
    return Status::Error(options.out_dir + ": cannot create output directory: " + ec.message());
  // Fail now, not after a long run, when the directory cannot take the files.
  const fs::path probe = fs::path(options.out_dir) / ".duet-write-test.tmp";
  if (!std::ofstream(probe)) {
    if (!existed) fs::remove(options.out_dir, ec);
    return Status::Error(options.out_dir + ": cannot write into the output directory");
  }
  fs::remove(probe, ec);
  if (!options.timeline_path.empty()) {
    fs::path dir = fs::path(options.timeline_path).parent_path();
    if (dir.empty()) dir = ".";
    const fs::path timeline_probe = dir / ".duet-write-test.tmp";
    if (fs::is_directory(options.timeline_path, ec) || !std::ofstream(timeline_probe)) {
      if (!existed) fs::remove(options.out_dir, ec);
      return Status::Error(options.timeline_path + ": cannot write the timeline there");
    }
    fs::remove(timeline_probe, ec);
  }
  Result<SimReport> report = Simulate(cluster, trace, options);
  // A failed run leaves nothing behind: not even the directory it created (if still empty).
  if (!report.ok() && !existed) fs::remove(options.out_dir, ec);
  return report;
}

}  // namespace duet::sim
