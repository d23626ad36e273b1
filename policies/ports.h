// The ports through which an instance's engine loop touches the world. Each has a simulated
// implementation (sim/, SimGrid time) and a real one (backend/, wall-clock time). Policies do
// no I/O and read no clock of their own: everything passes through here.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "policies/block_manager.h"
#include "policies/request.h"
#include "policies/scheduler.h"

namespace duet::policies {

inline constexpr Seconds kForever = std::numeric_limits<double>::infinity();

// Messages between the frontend and instances. kNewRequest and kKvReady hand a request over:
// the receiving engine owns it from then on, and the sender keeps nothing of it that it reads
// or writes again (what the sender wants to know comes back through the event sink). The other
// kinds name a request by id. Worker processes carry the request by value on the wire.
struct EngineMessage {
  enum class Kind {
    kNewRequest,  // frontend -> prefill or colocated instance
    kKvReady,     // PD: prefill instance -> decode instance: KV of `request` can be pulled
    kKvRelease,   // PD: decode instance -> prefill instance: KV of `request_id` has arrived
    kShutdown,    // frontend -> instance: no more work will come
    kAbort,       // frontend -> instance: stop serving `request_id` and free its blocks (the
                  // client went away); no effect once it finished
  };
  Kind kind = Kind::kNewRequest;
  std::shared_ptr<Request> request;  // kNewRequest, kKvReady
  InstanceId from = kNoInstance;
  RequestId request_id = 0;  // kAbort, kKvRelease
  // kKvReady: the prefill instance's blocks holding the request's KV, in position order.
  std::vector<KvBlockManager::BlockId> blocks = {};
  // kKvReady: when the prefill instance's lease on those blocks ends (its clock; every instance
  // of a run reads the run's clock, a worker process within its clock error). A pull seen complete
  // later read blocks that may be reused.
  Seconds lease_expires_s = std::numeric_limits<double>::infinity();
  // When it reached the receiving instance's inbox, on that instance's clock, stamped by the
  // inbox (-1: not stamped): what a message spent queued behind the engine's step is the time
  // from then to its TryReceive.
  Seconds delivered_s = -1;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Seconds Now() const = 0;
};

// Where an instance's messages arrive. Single consumer: the instance's engine loop.
class Inbox {
 public:
  virtual ~Inbox() = default;
  // Non-blocking: takes the next message if one has arrived.
  virtual bool TryReceive(EngineMessage* message) = 0;
  // Blocks until a message arrives, a posted KV transfer changes state, or `deadline`.
  virtual void WaitUntil(Seconds deadline) = 0;
};

class Outbox {
 public:
  virtual ~Outbox() = default;
  // Asynchronous, ordered per destination; never blocks the sender.
  virtual void Send(InstanceId to, const EngineMessage& message) = 0;
};

// A pull of one request's KV: the blocks that hold it on the source instance go, in order,
// into the destination's blocks (block i of src_blocks to block i of dst_blocks; dst_blocks
// may be longer, with room for the tokens still to come). `bytes` is what moves (the
// simulated transport moves only that). The spans are valid during Post only.
struct KvTransferRequest {
  RequestId request = 0;
  InstanceId src = kNoInstance;
  InstanceId dst = kNoInstance;
  Bytes bytes = 0;
  std::span<const KvBlockManager::BlockId> src_blocks = {};
  std::span<const KvBlockManager::BlockId> dst_blocks = {};
};
using TransferId = std::uint64_t;
enum class TransferStatus { kInProgress, kDone, kFailed };

// Moves a request's KV between instances: post, then poll ("in progress" is a normal status).
class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual TransferId Post(const KvTransferRequest& transfer) = 0;
  // kDone / kFailed are reported once; the id is released after that.
  virtual TransferStatus Poll(TransferId id) = 0;
};

// KV tiers below GPU memory, fastest first (policies/kv_tiers.h manages their contents).
enum class TierKind { kDram = 0, kSsd = 1, kRemote = 2 };

// One movement of blocks. A write goes into `tier` from the GPU of `instance`, or, when
// instance is kNoInstance, from the tier `from` (write-back, and write-through below the first
// tier). A read goes from `tier` into the GPU of `instance`. `node` is the node of that GPU or
// source tier, and of the DRAM or SSD tier itself (the remote store belongs to no node).
//
// A tier names a block by its chained prefix hash (`hashes`: what a content-addressed store
// keys it by, so that instances and restarts share it); an instance's GPU names it by its block
// id there (`gpu_blocks`, block i holding hashes[i]). The simulated storage moves `bytes` and
// reads neither; real storage needs both. The spans are valid during Post only.
struct TierIo {
  bool read = false;
  TierKind tier = TierKind::kDram;
  int node = -1;
  InstanceId instance = kNoInstance;
  TierKind from = TierKind::kDram;
  std::int64_t blocks = 0;
  Bytes bytes = 0;
  std::span<const BlockHash> hashes = {};
  // GPU to tier and tier to GPU: the instance's blocks, one per hash. Empty between tiers.
  std::span<const KvBlockManager::BlockId> gpu_blocks = {};
  // A write: the blocks `tier` evicted to make room for it. Their bytes may go once the I/Os
  // posted before this one have read them (a write-back of them is posted first).
  std::span<const BlockHash> evicted = {};
};
using TierIoId = std::uint64_t;

// Moves the bytes of a TierIo (simulated: SimGrid communications; real: pinned host memory and
// files). Post, then poll; kDone / kFailed are reported once. An implementation may complete
// an I/O only when polled from the engine that posted it (SimGrid: the posting actor).
class TierStorage {
 public:
  virtual ~TierStorage() = default;
  virtual TierIoId Post(const TierIo& io) = 0;
  virtual TransferStatus Poll(TierIoId id) = 0;
};

// The token one request got from a step (real executors; the simulator has no token ids).
struct SampledToken {
  RequestId request = 0;
  std::int32_t token = 0;
  bool stop = false;  // one of the request's stop token ids: the request ends with it
};

// What a step produced. The executor fills it; only the engine updates requests from it.
struct StepResult {
  // When each step ended: one entry, or one per step of a coalesced decode run.
  std::vector<Seconds> step_end_s;
  // Real executors: the token of every request that completed its prefill or decoded, in plan
  // order (prefills first). Empty in simulation.
  std::vector<SampledToken> tokens;
  // Overlapped loads that outlasted the step's computation: the requests they delayed, and how
  // long the step ran past its computation waiting for them.
  std::vector<RequestId> delayed_by_loads;
  Seconds load_wait_s = 0;
  // Real executors: host time of the step outside its forward pass, as the executor measured
  // it on the clock it times the forward pass with: preparing it (the model's inputs, waits on
  // tier writes) and sampling its tokens. They and the forward pass do not overlap.
  Seconds prepare_s = 0;
  Seconds sample_s = 0;
  // Not ok: the step failed (real executors: its forward pass returned an error). Nothing it
  // planned was computed and `tokens` is empty; step_end_s still says when it ended. The engine
  // ends every request of the plan with an error and frees their blocks.
  Status status;

  void clear() {
    step_end_s.clear();
    tokens.clear();
    delayed_by_loads.clear();
    load_wait_s = 0;
    prepare_s = 0;
    sample_s = 0;
    status = Status::Ok();
  }
};

// What an executor may ask of the engine while a step is in flight: take what has arrived
// (messages, finished transfers, tier writes and loads) as between steps, without planning.
class StepEvents {
 public:
  virtual ~StepEvents() = default;
  virtual void TakeEvents() = 0;
};

// Runs planned steps, in the order submitted. Submit hands it a step; Wait blocks until the
// oldest step submitted and not yet waited for has ended, and fills its result (cleared by the
// caller). It holds at most max_in_flight() steps: 1 (it may run the step in either call), or 2
// for one that runs a step while the engine plans and submits the next
// (EngineConfig::async_steps). It reads only the plan, which names requests by id and carries
// by value what the executor needs of them (a simulated one its items, one that runs the step
// its rows), and changes it not; the plan stays valid and unchanged until its Wait returned.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Whether a decode-only plan may run for plan.max_steps > 1 steps in one step, stopping at
  // the first step boundary after new work reached the inbox (simulated executors: one event
  // per run instead of one per step). Real executors never do: new work joins the batch at the
  // next step boundary.
  virtual bool CoalescesDecodeRuns() const { return false; }
  // Whether the plan must carry every row's inputs by value (StepPlan::rows, token and stop
  // ids, block tables): executors that run the step, and read no request.
  virtual bool NeedsInputs() const { return false; }
  virtual int max_in_flight() const { return 1; }
  // Honours plan.awaited_loads: an executor that waits for them may let the engine take events
  // meanwhile through `events`.
  virtual void Submit(const StepPlan& plan, StepEvents& events) = 0;
  virtual void Wait(StepResult* result) = 0;
};

// An executor that runs one step at a time, in one blocking call (Execute, made by Wait).
class BlockingStepExecutor : public StepExecutor {
 public:
  void Submit(const StepPlan& plan, StepEvents& events) final;
  void Wait(StepResult* result) final;
  virtual void Execute(const StepPlan& plan, StepEvents& events, StepResult* result) = 0;

 private:
  const StepPlan* plan_ = nullptr;
  StepEvents* events_ = nullptr;
};

// Lifecycle events. Called from the engine loop (and the frontend) of the run. A request leaves
// here as what was asked (its spec) and what happened (its record), never as the engine's
// working state: the record is what METRICS.md's outputs are computed from, in both worlds.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // The request's final record: completed, rejected or failed.
  virtual void OnFinished(const RequestSpec& spec, const RequestRecord& record) = 0;
  // The request's first prefill finished (first token sampled).
  virtual void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) = 0;
  // `count` inter-token gaps of `gap_s` each (ITL samples).
  virtual void OnTokenGaps(Seconds gap_s, std::int64_t count) = 0;
  // The same, naming the requests whose gaps they are (one each): what the engine raises. A
  // sink that serves several clients (a worker serving several frontends) tells each its own;
  // by default, their count.
  virtual void OnTokenGapsOf(Seconds gap_s, std::span<const RequestId> requests) {
    OnTokenGaps(gap_s, static_cast<std::int64_t>(requests.size()));
  }
  virtual void OnPreempted(const RequestSpec& spec, const RequestRecord& record,
                           InstanceId instance) = 0;
  // Real backend: the request got `token`, its record already counting it with its timeline
  // updated; for its last token, before OnFinished. The simulator (no token ids) never calls it.
  virtual void OnToken(const RequestSpec& spec, const RequestRecord& record, std::int32_t token) {}
  // The GPU prefix cache of `instance` changed so, in this order
  // (EngineConfig::publish_kv_events).
  virtual void OnKvEvents(InstanceId instance, std::span<const KvCacheEvent> events) {}
};

}  // namespace duet::policies
