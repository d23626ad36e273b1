// The engine loop of one serving instance, shared by the simulator and the real backend.
// It owns the instance's KV block manager and batch scheduler, and acts on the world only
// through ports (ports.h): messages in and out, the step executor, the KV transport, events.
// It owns the requests it serves (handed over by messages) and alone updates them: the executor
// returns each step's result as a value, and tokens and records leave through the event sink. Not
// thread-safe: one thread (or SimGrid actor) drives it.
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "policies/block_manager.h"
#include "policies/instance_load.h"
#include "policies/kv_tiers.h"
#include "policies/ports.h"
#include "policies/scheduler.h"

namespace duet::policies {

enum class InstanceRole { kColocated, kPrefill, kDecode };
const char* ToString(InstanceRole role);

// PD decode: what happens to a request whose KV pull failed (the transport failed, or the
// prefill instance's lease ended first). kFail: it ends with an error. kRecompute: the decode
// instance prefills the prompt and the first token itself, and the stream goes on.
enum class KvLoadFailurePolicy { kFail, kRecompute };
// "fail", "recompute".
Result<KvLoadFailurePolicy> ParseKvLoadFailurePolicy(const std::string& name);
const char* ToString(KvLoadFailurePolicy policy);

struct EngineConfig {
  InstanceId id = 0;
  InstanceRole role = InstanceRole::kColocated;
  int tp = 1;
  std::int64_t num_blocks = 0;
  Tokens block_tokens = 16;
  bool enable_prefix_caching = true;
  // Runs of decode-only steps between two events execute as one port call (exact: the batch
  // cannot change in between) where the executor coalesces (StepExecutor::CoalescesDecodeRuns:
  // simulated ones). Off: one call per step, for equivalence tests.
  bool coalesce_decode_steps = true;
  // Asynchronous steps (NanoFlow's control flow): the engine plans and submits step i+1 while
  // step i runs, as if every decode of step i continued. A request that step i ends (a stop
  // token) drops out of step i+2's plan, and the token step i+1 sampled for it is dropped,
  // never streamed. Blocks a step in flight may touch are pinned until it ended. Needs an
  // executor that holds two steps (StepExecutor::max_in_flight) and reads only the rows.
  bool async_steps = false;
  Bytes kv_bytes_per_token = 0;  // whole instance (all TP shards), for KV transfer sizes
  // Layers of the model: a step overlapped with a prefix load ends one layer's compute after
  // the last layer's KV arrived.
  int num_layers = 1;
  // Publish the prefix cache's changes through EventSink::OnKvEvents after every iteration
  // (for a router that cannot read the block manager: another thread or process).
  bool publish_kv_events = false;
  // PD prefill: how long a request's KV stays held for the decode instance's pull; its blocks
  // are freed then, pulled or not. PD decode: what a failed pull leads to.
  Seconds kv_lease_s = kForever;
  KvLoadFailurePolicy kv_load_failure_policy = KvLoadFailurePolicy::kFail;
  SchedulerConfig scheduler;
};

struct EnginePorts {
  const Clock* clock = nullptr;
  Inbox* inbox = nullptr;
  Outbox* outbox = nullptr;
  StepExecutor* executor = nullptr;
  KvTransport* transport = nullptr;
  EventSink* sink = nullptr;
  TierManager* tiers = nullptr;  // KV tiers below GPU memory; null: GPU prefix caching only
  // Measures each iteration's host time by phase with this clock (last_host_step); null: not
  // measured (the simulator, whose clock does not move while the engine plans).
  const Clock* host_clock = nullptr;
};

class InstanceEngine final : private LowerTierLookup, private StepEvents {
 public:
  InstanceEngine(EngineConfig config, EnginePorts ports);
  InstanceEngine(const InstanceEngine&) = delete;  // ports_.sink may point into it
  InstanceEngine& operator=(const InstanceEngine&) = delete;

  // Serves until a kShutdown message has arrived and no work is left. Blocking.
  void Run();
  // One iteration: takes messages and finished transfers, starts KV pulls, plans and executes
  // one step (or one decode run). Returns false when there was no step to run.
  // Asynchronous steps: submits a step and returns while the pipeline is not full; otherwise
  // waits for the oldest step in flight and applies it.
  bool RunOnce();
  bool idle() const;
  // A kShutdown message has arrived and no work is left: Run would return.
  bool done() const { return shutdown_ && idle(); }
  // KV pulls, tier loads or this instance's tier writes are in flight: their completion shows
  // only in a poll, which the next iteration makes, so a real-time loop must not wait for
  // messages alone.
  bool awaiting_transfers() const {
    return !pulls_in_flight_.empty() || !loads_.empty() ||
           (ports_.tiers && ports_.tiers->HasPendingWrites(config_.id));
  }
  // PD prefill: when the first KV lease held for a decode instance ends (kForever: none held);
  // a real-time loop must run an iteration then to free its blocks.
  Seconds next_lease_expiry() const;
  std::int64_t leases_held() const { return static_cast<std::int64_t>(leases_.size()); }
  // PD prefill: leases that ended before the decode instance released them (blocks freed).
  std::int64_t leases_expired() const { return leases_expired_; }
  // PD decode: pulls that failed (transport failure or lease ended), and of those, requests the
  // decode instance recomputed itself (kv_load_failure_policy recompute).
  std::int64_t kv_load_failures() const { return kv_load_failures_; }
  std::int64_t kv_load_recomputes() const { return kv_load_recomputes_; }
  // Steps that failed (StepResult::status; real backend: the forward pass returned an error).
  // Each ended the requests it planned with an error.
  std::int64_t forward_failures() const { return forward_failures_; }
  // What the instance holds now (its requests, blocks and leases) and its counters.
  InstanceLoad CurrentLoad() const;

  const EngineConfig& config() const { return config_; }
  const KvBlockManager& blocks() const { return blocks_; }
  const BatchScheduler& scheduler() const { return scheduler_; }
  // Steps ended (and applied), and steps submitted and not yet ended.
  std::int64_t steps() const { return steps_; }
  int steps_in_flight() const { return in_flight_; }
  // The last iteration that ran a step: its host time by phase and its counts (all zero unless
  // EnginePorts::host_clock is set). The forward pass is the executor's to time.
  const models::HostStep& last_host_step() const { return host_step_; }
  // Block-manager invariants, plus: once the engine is idle, no request holds blocks and the
  // engine holds no request; no block that a step in flight reads or writes is free, or held
  // by another request unless it is a shared prefix-cache block.
  Status CheckInvariants() const;

 private:
  struct Pull {
    Request* request;
    InstanceId from;
    TransferId transfer;
    bool aborted;  // the client went away while the KV moved: dropped when it arrives
    Seconds lease_expires_s;
  };

  struct Load {
    Request* request;
    LoadId id;
    bool orphaned;    // the request was preempted while loading: the result is dropped
    bool overlapped;  // its prefill runs in the step that waits for it
    Seconds started_s;
  };

  Tokens Find(Request& request, std::int64_t first_block, Tokens max_tokens) override;
  void HandleMessage(const EngineMessage& message);
  void Abort(RequestId id, Seconds now);
  void PollLoads(Seconds now);
  void StartLoads(Seconds now, const StepPlan& plan);
  // Takes arrived messages and finished transfers, tier writes and loads (also while a step is
  // in flight, when the executor asks).
  void TakeEvents() override;
  // Hands the request's full prompt blocks among its first `computed` tokens to the tiers.
  void OffloadComputed(Request* r, Tokens computed);
  void PollTransfers(Seconds now);
  void StartPulls(Seconds now);
  // PD decode: tells the prefill instance it may free request `r`'s KV.
  void ReleaseKv(InstanceId from, Request* r);
  // PD decode: a pull of `r` failed (its blocks here are free): kv_load_failure_policy.
  void KvLoadFailed(Request* r, Seconds now, const std::string& why);
  // PD prefill: frees the blocks of leases that ended.
  void ExpireLeases(Seconds now);
  // A submitted step: its plan and result, and what it does to each of its entries.
  struct InFlight {
    StepPlan plan;
    // The requests of the plan's entries (prefills then decodes), as the scheduler planned them:
    // valid until the step ended (Retire keeps a finished one until then).
    std::vector<Request*> requests;
    StepResult result;
    bool coalesced = false;  // a decode run
    // Per entry, prefills then decodes: the request's generated_tokens once the step ended,
    // and whether the step ends the request's prefill.
    std::vector<Tokens> generated_after;
    std::vector<char> ends_prefill;
  };
  InFlight& in_flight(int k) {
    return in_flight_steps_[static_cast<std::size_t>((first_ + k) % 2)];
  }
  const InFlight& in_flight(int k) const {
    return in_flight_steps_[static_cast<std::size_t>((first_ + k) % 2)];
  }
  // Asynchronous steps: a step is advanced (Advance) when it is submitted, the next one
  // planned before it ended.
  bool plans_ahead() const { return max_in_flight_ > 1; }

  // Plans the next step into `step.plan` (preemptions, admissions, tier loads and write-back
  // included), its entries' requests into `step.requests`. Returns whether it has work.
  bool Plan(Seconds now, InFlight& step);
  // Completes and submits a planned step.
  void Submit(InFlight& step, Seconds now);
  int DecodeRunLength(const StepPlan& plan);
  // Completes the scheduler's plan for the executor (TP degree, decode run length, awaited
  // loads, block tables). Returns whether it coalesces a decode run.
  bool PrepareExecution(Seconds now, InFlight& step);
  // What the step does whatever it samples: the tokens it computes, each request's output
  // count (`steps` tokens per decode), and, with asynchronous steps, the requests that it
  // ends or hands over leaving the batch.
  void Advance(InFlight& step, Tokens steps);
  // Hands new GPU evictions to the tiers (write-back).
  void OffloadEvicted();
  // Publishes the cache events of this iteration (publish_kv_events), then drops them.
  void PublishCacheEvents();
  // Applies an ended step's result: tokens, timelines, prefix-cache blocks, requests ended.
  void Apply(const InFlight& step);
  // The step failed: ends each of its requests with `why` (FinishReason::kError) and frees
  // their blocks, computed by the step or not.
  void FailStep(const InFlight& step, const std::string& why, Seconds now);
  // `generated`: the request's output count once the step ended.
  void FinishPrefill(Request* r, Seconds t, const SampledToken* token, Tokens generated);
  // Ends a request whose output counts `generated` tokens (a step planned ahead may have
  // counted one more).
  void End(Request* r, Seconds t, FinishReason reason, Tokens generated);
  // Ends a served request: completed (stop or length) or failed (error or abort).
  void Complete(Request* r, Seconds t, FinishReason reason);
  void Fail(Request* r, Seconds t, const std::string& reason, FinishReason finish);
  // Takes a request a message handed over; this engine owns it until it finishes or leaves.
  Request* Hold(std::shared_ptr<Request> request);
  // `r` left this engine (PD prefill: handed to the decode instance): its handle, for the
  // message that carries it.
  std::shared_ptr<Request> Release(Request* r);
  // `r` finished here: freed at the start of the first iteration after every step submitted
  // so far ended (nothing reads it after, but the pointers held until then stay valid).
  void Retire(Request* r);
  // The request with this id that the engine holds (it must hold it).
  Request* Held(RequestId id) const;
  // `r` ended while a step that plans it was in flight: that step's result for it is dropped.
  static bool Gone(const Request* r) {
    return r->state == RequestState::kCompleted || r->state == RequestState::kFailed;
  }

  // The event sink, timed by the host clock: its calls are the stream phase of a step.
  class TimedSink final : public EventSink {
   public:
    TimedSink(EventSink& sink, const Clock& clock) : sink_(sink), clock_(clock) {}
    void OnFinished(const RequestSpec& spec, const RequestRecord& record) override;
    void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) override;
    void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
    void OnTokenGapsOf(Seconds gap_s, std::span<const RequestId> requests) override;
    void OnPreempted(const RequestSpec& spec, const RequestRecord& record,
                     InstanceId instance) override;
    void OnToken(const RequestSpec& spec, const RequestRecord& record, std::int32_t token) override;
    void OnKvEvents(InstanceId instance, std::span<const KvCacheEvent> events) override;
    Seconds seconds = 0;  // in the sink since the last reset

   private:
    template <typename F>
    void Timed(F&& call);
    EventSink& sink_;
    const Clock& clock_;
  };

  // Records host_step_ of an iteration whose phases ended at these host-clock times (and that
  // spent `sink_before_apply` of its sink time before the step's results were applied).
  void RecordHostStep(const InFlight& step, Seconds begin, Seconds planned, Seconds launched,
                      Seconds returned, Seconds sink_before_apply);

  EngineConfig config_;
  EnginePorts ports_;
  std::optional<TimedSink> timed_sink_;  // with a host clock: ports_.sink points at it
  models::HostStep host_step_;
  // The requests this engine serves, by id (every Request* below points into one of them),
  // and those that finished, each with the count of steps submitted when it did.
  std::unordered_map<RequestId, std::shared_ptr<Request>> held_;
  std::vector<std::pair<std::int64_t, std::shared_ptr<Request>>> retired_;
  std::int64_t finished_in_iteration_ = 0;
  KvBlockManager blocks_;
  BatchScheduler scheduler_;
  struct AnnouncedKv {  // PD decode: a kKvReady not yet pulled
    Request* request;
    InstanceId from;
    std::vector<KvBlockManager::BlockId> blocks;  // on `from`
    Seconds lease_expires_s;
  };
  std::deque<AnnouncedKv> pulls_waiting_;
  // PD decode: aborts of requests not here (yet): the frontend aborts a request on both of its
  // instances, and the one to the decode instance may overtake the prefill instance's kKvReady.
  // Remembered for a lease's time (its KV is gone by then), oldest first.
  std::deque<std::pair<Seconds, RequestId>> early_abort_expiry_;
  std::unordered_set<RequestId> early_aborts_;
  std::vector<Pull> pulls_in_flight_;
  std::vector<Load> loads_;  // lower-tier prefix loads in flight
  // The block manager's event log: evictions feed write-back to the tiers (events before
  // `events_to_tiers_` were looked at already); everything is published when asked.
  std::vector<KvCacheEvent> cache_events_;
  std::size_t events_to_tiers_ = 0;
  std::vector<BlockHash> evicted_;                       // scratch
  std::vector<KvBlockManager::BlockId> evicted_blocks_;  // scratch: the blocks that held them
  std::vector<Request*> arrived_;  // new requests since the last step (for prefetch)
  // PD prefill: prefilled requests whose KV is held until the decode instance has it (or the
  // lease ends), by request id, with when their lease ends.
  std::unordered_map<RequestId, Seconds> leases_;
  std::int64_t leases_expired_ = 0;
  std::int64_t kv_load_failures_ = 0;
  std::int64_t kv_load_recomputes_ = 0;
  std::int64_t forward_failures_ = 0;
  bool shutdown_ = false;
  bool in_step_ = false;                    // the executor is running a step
  std::vector<RequestId> deferred_aborts_;  // arrived while a step was in flight
  std::vector<RequestId> gap_requests_;     // a step's decodes, for their token gaps (reused)
  std::int64_t steps_ = 0;
  // Steps submitted and not yet ended, oldest at first_: a ring of two, reused across steps.
  int max_in_flight_ = 1;
  std::array<InFlight, 2> in_flight_steps_;
  int first_ = 0;
  int in_flight_ = 0;
  std::int64_t submitted_ = 0;  // of which in_flight_ have not ended
};

}  // namespace duet::policies
