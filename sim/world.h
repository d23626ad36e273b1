// The simulated world of one `duet simulate` run, shared by its parts: the SimGrid ports of
// each instance (instance_ports.cpp), the frontend actor (frontend_actor.cpp), the outputs
// (outputs.cpp) and the run that builds and drives them (simulation.cpp). Internal to sim/.
#pragma once

#include <simgrid/s4u.hpp>

#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "policies/engine.h"
#include "policies/kv_event_index.h"
#include "policies/metrics.h"
#include "policies/prefix_lru.h"
#include "policies/router.h"
#include "policies/step_log.h"
#include "sim/comms.h"
#include "sim/platform.h"
#include "sim/sim_kv_transport.h"
#include "sim/sim_tier_storage.h"
#include "sim/simulation.h"
#include "sim/timeline.h"
#include "traces/arrivals.h"

namespace duet::sim {

namespace sg4 = simgrid::s4u;
using policies::EngineMessage;
using policies::InstanceId;
using policies::Request;

// What a control message (a shutdown) weighs on the links.
inline constexpr std::uint64_t kControlMessageBytes = 256;

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
  bool waiting_ = false;          // the receiver blocks on Waitable() with no message in flight
  Seconds last_delivered_s_ = 0;  // when the message taken last was there to take
};

// Ports of one instance, on SimGrid: the clock is the simulated clock, the inbox a SimInbox,
// steps sleep for the cost model's time, KV transfers go over a SimKvTransport.
class SimPorts final : public policies::Clock,
                       public policies::Inbox,
                       public policies::Outbox,
                       public policies::BlockingStepExecutor {
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
  // Execute without the timeline's and the step log's records.
  void ExecuteSteps(const policies::StepPlan& plan, policies::StepEvents& events,
                    policies::StepResult* result);
  // Beside the steps its node's other instances are running: each of this plan's steps (`ends`,
  // back to back from `start`) runs at alone / (alone + extra) of its pace while theirs run, and
  // theirs alike while this plan's run (the extra: models::StepCostModel::Beside), each step's
  // later ones moving with it. Every overlapping pair is priced once, when the later of the two
  // starts; the steps priced ahead (a decode run) then move while they run, and the waits below
  // follow their ends. Then this plan's steps are running, for the mates' steps that start
  // before they end.
  void StartBeside(Seconds start, const models::StepShape& shape, std::vector<Seconds>* ends);
  // Sleeps until the last of `ends` (the running steps') ends, however far the mates move it.
  void SleepUntilEnd(const std::vector<Seconds>& ends);
  // An expert-parallel all-to-all (models::StepCostModel::ExpertTraffic) over the simulated
  // network, where KV transfers and tier traffic share the links with it: each of the
  // instance's GPUs sends `a2a`'s bytes, `times` over. Returns when all have arrived.
  void MoveExpertTraffic(const models::StepCostModel::AllToAll& a2a, double times);
  // Layer-wise loading: a step whose prefills wait for loads from the lower tiers cannot end
  // before the last of them arrived, and ends one layer's compute after it. Waits for those
  // still in flight after the computation (the engine takes events meanwhile) and moves the
  // step's end. step_start_s: when the step began.
  void FinishOverlappedLoads(const policies::StepPlan& plan, Seconds step_start_s,
                             policies::StepEvents& events, policies::StepResult* result);
  // Blocks until the inbox or a transfer completes, or `timeout` (< 0: none). Returns the index
  // of what ended the wait (0: the inbox), or -1 at the timeout.
  ssize_t WaitAny(double timeout);
  // The same until `deadline` on the clock (infinite: none).
  ssize_t WaitFor(Seconds deadline);

  World& world_;
  InstanceId id_;
  // engine.async_steps: a step's host time overlaps the forward pass of the step before it.
  bool async_;
  Seconds last_step_end_s_ = -1;  // when this instance's last step ended
  // The wake-up priced before the iteration after an idle wait a message ended, until the step
  // log's line of its step carries it (the step log's "woke_s").
  std::optional<Seconds> woke_s_;
  // What the first step of the plan being executed took beyond its price after what its
  // instance ran before it: an idle spell (StepCostModel::AfterIdle) or another step
  // (AfterStep), for the step log.
  Seconds after_s_ = 0;
  std::optional<models::StepShape> last_shape_;  // the shape of this instance's last step
  // The steps running (StartBeside): from `running_start_`, ending at `*running_ends_` (null
  // when none), each with what it took beside the mates' steps (`beside_s_`, for the step log).
  Seconds running_start_ = 0;
  std::vector<Seconds>* running_ends_ = nullptr;
  std::vector<Seconds> beside_s_;
  // Per instance: until when the running steps are priced beside its steps (StartBeside).
  std::vector<Seconds> priced_beside_until_;
  SimInbox& inbox_;
  SimKvTransport transport_;
  std::vector<sg4::CommPtr> waitables_;  // reused
  std::vector<sg4::CommPtr> comms_;      // reused
};

// Forwards lifecycle events to the metrics collector and the router, counts finished
// requests, draws the progress bar, and wakes the frontend when the last request finished.
class SimSink final : public policies::EventSink {
 public:
  explicit SimSink(World& world) : world_(world) {}
  void OnFinished(const policies::RequestSpec& spec,
                  const policies::RequestRecord& record) override;
  void OnPrefillDone(const policies::RequestSpec& spec,
                     const policies::RequestRecord& record) override;
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
  void OnPreempted(const policies::RequestSpec& spec, const policies::RequestRecord& record,
                   InstanceId instance) override;
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
  // The trace's requests, in its order, as the frontend sent them, each with its final record
  // once it finished (the engines serve copies of their own).
  std::vector<Request> requests;
  std::unordered_map<policies::RequestId, std::size_t> request_index;  // id -> requests[index]
  std::vector<std::unique_ptr<models::StepCostModel>> costs;
  std::vector<std::unique_ptr<SimPorts>> ports;
  // Per instance, the other instances on its node whose steps its steps meet
  // (models::StepCostModel::Beside); empty where no cost model prices it.
  std::vector<std::vector<InstanceId>> node_mates;
  std::vector<std::unique_ptr<policies::InstanceEngine>> engines;
  std::vector<std::unique_ptr<SimInbox>> inboxes;
  std::vector<SimKvEndpoint> instances;  // per instance, its GPUs and KV blocks
  policies::MetricsCollector metrics;
  std::unique_ptr<SimSink> sink;
  std::unique_ptr<SimTierStorage> storage;
  std::unique_ptr<policies::TierManager> tiers;  // null without tiers
  std::unique_ptr<EngineCacheView> cache_view;
  std::unique_ptr<policies::Router> router;
  std::unique_ptr<Timeline> timeline;   // with --timeline
  std::optional<std::string> step_log;  // with --step-log: its lines so far
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
  // Not SimGrid's link-load plugin: in 3.32 it samples a link's rate only when a communication
  // crossing it starts or ends, which counts latencies as bytes and misses the rate changes
  // that other links cause (tests/sim_links/link_load_test.cpp checks the count against it
  // where its sampling is exact).
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

// The frontend actor: releases each request at its arrival, rejects what no instance could
// serve (policies/admission.h), routes the rest and sends them to their prefill instance; then
// shuts the instances down once every request finished (frontend_actor.cpp).
void RunFrontend(World& w);

// Per tier: configuration, traffic and occupancy (summary.json's "tiers"; outputs.cpp).
nlohmann::json TiersSummary(const World& w);
// links.csv (outputs.cpp).
Status WriteLinksCsv(const World& w, const std::string& path);

}  // namespace duet::sim
