// The engine loop of one serving instance, shared by the simulator and the real backend.
// It owns the instance's KV block manager and batch scheduler, and acts on the world only
// through ports (ports.h): messages in and out, the step executor, the KV transport, events.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/block_manager.h"
#include "policies/kv_tiers.h"
#include "policies/ports.h"
#include "policies/scheduler.h"

namespace duet::policies {

enum class InstanceRole { kColocated, kPrefill, kDecode };
const char* ToString(InstanceRole role);

struct EngineConfig {
  InstanceId id = 0;
  InstanceRole role = InstanceRole::kColocated;
  int tp = 1;
  std::int64_t num_blocks = 0;
  Tokens block_tokens = 16;
  bool enable_prefix_caching = true;
  // Runs of decode-only steps between two events execute as one port call (exact: the batch
  // cannot change in between). Off: one call per step, for equivalence tests.
  bool coalesce_decode_steps = true;
  Bytes kv_bytes_per_token = 0;  // whole instance (all TP shards), for KV transfer sizes
  // Layers of the model: a step overlapped with a prefix load ends one layer's compute after
  // the last layer's KV arrived.
  int num_layers = 1;
  SchedulerConfig scheduler;
};

struct EnginePorts {
  Clock* clock = nullptr;
  Inbox* inbox = nullptr;
  Outbox* outbox = nullptr;
  StepExecutor* executor = nullptr;
  KvTransport* transport = nullptr;
  EventSink* sink = nullptr;
  TierManager* tiers = nullptr;  // KV tiers below GPU memory; null: GPU prefix caching only
};

class InstanceEngine final : private LowerTierLookup {
 public:
  InstanceEngine(EngineConfig config, EnginePorts ports);

  // Serves until a kShutdown message has arrived and no work is left. Blocking.
  void Run();
  // One iteration: takes messages and finished transfers, starts KV pulls, plans and executes
  // one step (or one decode run). Returns false when there was no step to run.
  bool RunOnce();
  bool idle() const;

  const EngineConfig& config() const { return config_; }
  const KvBlockManager& blocks() const { return blocks_; }
  const BatchScheduler& scheduler() const { return scheduler_; }
  std::int64_t steps() const { return steps_; }
  // Block-manager invariants, plus: no request still holds blocks once the engine is idle.
  Status CheckInvariants() const;

 private:
  struct Pull {
    Request* request;
    InstanceId from;
    TransferId transfer;
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
  void PollLoads(Seconds now);
  void StartLoads(Seconds now);
  // Overlapped loads: the step that prefills past a loading prefix cannot end before the load;
  // waits for any still in flight and moves the step's end. step_start_s: when it began.
  void FinishOverlappedLoads(Seconds step_start_s, std::vector<Seconds>* step_end_s);
  // Takes arrived messages and finished transfers, tier writes and loads.
  void TakeEvents();
  void OffloadComputed(Request* r);
  void PollTransfers(Seconds now);
  void StartPulls();
  int DecodeRunLength(const StepPlan& plan);
  void Apply(const StepPlan& plan, const std::vector<Seconds>& step_end_s, bool coalesced);
  void FinishPrefill(Request* r, Seconds t);
  void Complete(Request* r, Seconds t);
  void Fail(Request* r, Seconds t, const std::string& reason);

  EngineConfig config_;
  EnginePorts ports_;
  KvBlockManager blocks_;
  BatchScheduler scheduler_;
  std::deque<std::pair<Request*, InstanceId>> pulls_waiting_;  // PD decode: KV announced
  std::vector<Pull> pulls_in_flight_;
  std::vector<Load> loads_;             // lower-tier prefix loads in flight
  std::vector<BlockHash> gpu_evicted_;  // the block manager's eviction log (write-back)
  std::vector<Request*> arrived_;       // new requests since the last step (for prefetch)
  int transferring_ = 0;  // PD prefill: prefilled, KV held until the decode instance has it
  bool shutdown_ = false;
  std::int64_t steps_ = 0;
  StepPlan plan_;                    // reused across steps
  std::vector<Seconds> step_end_s_;  // reused across steps
};

}  // namespace duet::policies
