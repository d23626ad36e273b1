// Batch scheduler of one instance: continuous batching with chunked prefill under a token
// budget and a batch-size cap, decode first, FCFS admission with prefix-cache reuse, and
// preemption by recompute when KV blocks run out. It plans; the engine executes the plan.
#pragma once

#include <deque>
#include <vector>

#include "common/units.h"
#include "models/cost_model.h"
#include "policies/block_manager.h"
#include "policies/request.h"

namespace duet::policies {

struct SchedulerConfig {
  Tokens max_num_batched_tokens = 8192;  // token budget of one step (decodes count 1 each)
  int max_num_seqs = 256;                // requests holding KV and being served at once
  double watermark = 0.01;  // fraction of blocks kept free at admission, to avoid thrashing
  // A request whose prefix loads from the lower tiers prefills the rest in the same step, the
  // step waiting for the load where it lasts longer (layer by layer, as LMCache does); off:
  // the request prefills only once its load finished.
  bool overlap_tier_loads = true;
};

// Prefix blocks of a prompt held below GPU memory, for admission (the engine implements it
// over the TierManager for its instance).
class LowerTierLookup {
 public:
  virtual ~LowerTierLookup() = default;
  // Fills request.loading_tokens with the prompt tokens, from block `first_block` on and at
  // most `max_tokens` (whole blocks), that can be loaded from each lower tier; returns their sum.
  virtual Tokens Find(Request& request, std::int64_t first_block, Tokens max_tokens) = 0;
};

struct PrefillItem {
  Request* request = nullptr;
  Tokens tokens = 0;   // prompt tokens computed in this step
  Tokens context = 0;  // tokens already in the KV cache before this chunk
};

// One planned step. Requests in `preempted` lost their KV and went back to the waiting queue
// (they will recompute); requests in `admitted` got KV blocks this step; those of them in
// `loads` have part of their prefix to load from the lower tiers (overlap_tier_loads: their
// prefill items are in this step, which cannot end before the load; else they prefill once
// it finished).
struct StepPlan {
  std::vector<PrefillItem> prefills;
  std::vector<Request*> decodes;
  std::vector<Request*> preempted;
  std::vector<Request*> admitted;
  std::vector<Request*> loads;
  // The block manager whose tables the step runs into (a real executor reads each request's
  // physical blocks from it). Set by BatchScheduler::Schedule.
  const KvBlockManager* blocks = nullptr;

  bool empty() const { return prefills.empty() && decodes.empty(); }
  void clear();
  // Shape of step `step_index` of a decode run started by this plan (0: this plan itself).
  models::StepShape Shape(int tp, int step_index = 0) const;
};

class BatchScheduler {
 public:
  explicit BatchScheduler(SchedulerConfig config) : config_(config) {}
  // Where admission looks for prefix blocks past the GPU hit (none: GPU prefix caching only).
  void set_lower_tiers(LowerTierLookup* lookup) { lower_tiers_ = lookup; }
  LowerTierLookup* lower_tiers() const { return lower_tiers_; }

  // A request that needs a prefill (new, or preempted for recompute) joins the queue's back.
  void AddWaiting(Request* request);
  // A request whose KV is already in `blocks` (PD: pulled from a prefill instance) and that
  // decodes from its next step on.
  void AddRunning(Request* request) { running_.push_back(request); }
  // Drops a request that left the instance (finished, or handed to a decode instance).
  void RemoveRunning(Request* request);

  // Plans the next step into `plan` (cleared first), allocating KV blocks in `blocks`:
  // 1. every decoding request gets one token (preempting the latest-admitted requests when a
  //    block cannot be found); 2. partially prefilled requests continue; 3. waiting requests
  //    are admitted FCFS while the budget, max_num_seqs and free blocks allow.
  void Schedule(KvBlockManager& blocks, StepPlan& plan);

  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  const SchedulerConfig& config() const { return config_; }
  // Prompt tokens queued here and not yet planned for computation (cache hits excluded).
  Tokens pending_prefill_tokens() const { return pending_prefill_tokens_; }

 private:
  void Preempt(Request* victim, KvBlockManager& blocks, StepPlan& plan);

  SchedulerConfig config_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order
  Tokens pending_prefill_tokens_ = 0;
  LowerTierLookup* lower_tiers_ = nullptr;
};

}  // namespace duet::policies
