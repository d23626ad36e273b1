// The live frontend's state (see frontend.h), shared by its two kinds of instance: engine
// threads of this process (frontend.cpp) and worker processes (frontend_workers.cpp).
// Internal to backend/serve.
#pragma once

#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/engine/engine_thread.h"
#include "backend/frontend/frontend.h"
#include "backend/tiers/tier_storage.h"
#include "policies/frontend_policy.h"
#include "policies/kv_event_index.h"
#include "policies/kv_tiers.h"

namespace duet::backend::serve {

// An instance as the frontend sees it (messages to it go through Impl::outbox).
class Instance {
 public:
  virtual ~Instance() = default;
  virtual InstanceLoad load() const = 0;
  // Stops taking work once what it holds is done, and waits for that.
  virtual void Stop() = 0;
};

struct LiveFrontend::Impl {
  // A request, from Submit until the instance that served it has finished with it. Keyed by
  // the id of its current attempt: the client's id, or (after its worker was lost) a new id
  // per retry. `request` is what the frontend sent (the engine serving it holds a copy of its
  // own). Worker processes: it is the frontend's mirror, its record updated from the worker's
  // events (but for the route) and its output_ids extended by every token delivered, for a
  // retry.
  struct Entry {
    std::unique_ptr<policies::Request> request;
    std::shared_ptr<RequestListener> listener;
    policies::InstanceId prefill = policies::kNoInstance;
    policies::InstanceId decode = policies::kNoInstance;  // colocated: the prefill instance
    bool finished = false;
    // What the client asked for, and the tokens its listener got before this attempt.
    policies::RequestId client_id = 0;
    Tokens prompt_tokens = 0;
    Tokens max_tokens = 0;
    Tokens tokens_before = 0;
    // PD worker processes: the decode side released the prefill side's KV (the request no
    // longer needs its prefill instance).
    bool kv_released = false;
    // Worker processes lost while they served it (its attempts so far, less one).
    int workers_lost = 0;
  };

  // An instance's events (on its engine thread, or the reader thread of its worker's
  // connection): tokens and final records to the request's listener, lifecycle to the router
  // and the observer, KV events to the routing index.
  class InstanceSink final : public policies::EventSink {
   public:
    InstanceSink(Impl& impl, policies::InstanceId id) : impl_(impl), id_(id) {}

    void OnToken(const policies::RequestSpec& spec, const policies::RequestRecord& record,
                 std::int32_t token) override;
    void OnFinished(const policies::RequestSpec& spec,
                    const policies::RequestRecord& record) override;
    void OnPrefillDone(const policies::RequestSpec& spec,
                       const policies::RequestRecord& record) override;
    void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
    void OnPreempted(const policies::RequestSpec& spec, const policies::RequestRecord& record,
                     policies::InstanceId instance) override;
    void OnKvEvents(policies::InstanceId instance,
                    std::span<const policies::KvCacheEvent> events) override;
    // After each iteration: the requests that finished in it are released.
    void ReleaseFinished();
    // A new worker takes the slot: the listeners its lost predecessor looked up (of requests
    // since retried under new ids) are forgotten. No event of the slot may be in progress.
    void ForgetListeners() {
      listeners_.clear();
      finished_.clear();
    }

   private:
    RequestListener* Listener(policies::RequestId id);

    Impl& impl_;
    policies::InstanceId id_;
    std::unordered_map<policies::RequestId, RequestListener*> listeners_;
    std::vector<policies::RequestId> finished_;
  };

  // Ends `entry`'s request (`id`: its current attempt) wherever it is: on its prefill instance
  // or, past the handoff, on its decode instance (an instance ignores an abort of a request it
  // does not hold). Caller holds mu.
  void PostAbort(policies::RequestId id, const Entry& entry);

  FrontendOptions options;
  std::vector<std::unique_ptr<ForwardModel>> models;  // engine threads only
  models::ModelSpec config;
  std::int32_t block_tokens = 16;
  SteadyClock clock;
  std::vector<std::unique_ptr<InstanceSink>> sinks;
  bool pd = false;
  std::unique_ptr<LocalKvTransports> transports;  // engine threads only
  // KV tiers (engine threads with options.tiers): the storage outlives the manager, which
  // outlives the engines (declared after them). The SSD tier's own directory, if the server
  // made one, goes last.
  struct RemovedAtEnd {
    std::filesystem::path path;
    ~RemovedAtEnd();
  } tier_temp_dir;
  std::unique_ptr<HostTierStorage> tier_storage;
  std::unique_ptr<policies::TierManager> tiers;
  bool stopped = false;  // LiveFrontend::Stop ran
  // The one port to the instances (policies::Outbox, as the engines' own): the engine threads'
  // inboxes (LocalOutbox, which the engines send through too) or the worker processes' links.
  // A message's request, if any, is read during Send only by the workers' outbox, which sends a
  // copy; an engine thread keeps the pointer.
  std::unique_ptr<policies::Outbox> outbox;
  std::vector<std::unique_ptr<Instance>> instances;

  struct Fleet;  // worker processes (frontend_workers.cpp); null with engine threads
  std::unique_ptr<Fleet> fleet;

  mutable std::mutex mu;            // guards what follows
  std::condition_variable changed;  // a request finished
  std::unordered_map<policies::RequestId, Entry> entries;
  std::unordered_map<policies::RequestId, policies::RequestId> retried;  // client -> attempt
  std::int64_t pending = 0;                                              // entries not finished
  // Finished requests whose listener has not heard yet (Drain waits for them too).
  std::int64_t telling = 0;
  std::int64_t requests_retried = 0;
  std::unique_ptr<policies::KvEventIndex> index;
  std::unique_ptr<policies::Router> router;
  // The frontend policy (policies/frontend_policy.h: admission, routing, recovery) over
  // `router`, its limits from every instance's KV blocks; with worker processes, set once every
  // slot was first taken.
  std::optional<policies::FrontendPolicy> policy;
  policies::RequestId next_id = 0;
  bool draining = false;

  Impl();  // both in frontend_workers.cpp, where Fleet is complete
  ~Impl();
};

// Sets the admission limits from what each instance admits (in the order of options.roles).
Status SetLimits(LiveFrontend::Impl& s, std::span<const Tokens> admissible);
// Whether instance `id` publishes its prefix cache's changes (the router reads them).
bool PublishesKvEvents(const FrontendOptions& options, policies::InstanceId id);
// Why an instance's KV layout is not the one the engine settings ask for, if it is not.
std::optional<std::string> KvLayoutMismatch(const FrontendOptions& options,
                                            const models::ModelSpec& config, Tokens block_tokens,
                                            Bytes kv_bytes_per_token);

// frontend_workers.cpp: starts the fleet (every slot registered) into `impl`.
Status StartFleet(LiveFrontend::Impl& impl, WorkerFleet fleet);
// Asks every worker to shut down once idle and waits for them to leave.
void StopFleet(LiveFrontend::Impl& impl);
std::vector<WorkerStatus> FleetStatus(const LiveFrontend::Impl& impl);

}  // namespace duet::backend::serve
