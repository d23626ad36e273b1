// Batch scheduler of one instance: continuous batching with chunked prefill under a token
// budget and a batch-size cap, decode first, FCFS admission with prefix-cache reuse, and
// preemption by recompute when KV blocks run out. It plans; the engine executes the plan.
#pragma once

#include <deque>
#include <span>
#include <vector>

#include "common/units.h"
#include "models/cost_model.h"
#include "policies/block_manager.h"
#include "policies/request.h"
#include "policies/speculative.h"

namespace duet::policies {

class Clock;

struct SchedulerConfig {
  Tokens max_num_batched_tokens = 8192;  // token budget of one step (decodes count 1 each)
  int max_num_seqs = 256;                // requests holding KV and being served at once
  double watermark = 0.01;  // fraction of blocks kept free at admission, to avoid thrashing
  // A request whose prefix loads from the lower tiers prefills the rest in the same step, the
  // step waiting for the load where it lasts longer (layer by layer, as LMCache does); off:
  // the request prefills only once its load finished.
  bool overlap_tier_loads = true;
  // Speculative decoding: each decode row also verifies its drafts, which take KV slots and
  // count against the token budget (as vLLM schedules them). Off by default.
  SpeculativeConfig speculative{};

  // Blocks kept free at admission out of `num_blocks` (the watermark, rounded up).
  std::int64_t WatermarkBlocks(std::int64_t num_blocks) const;
  // The largest KV footprint (prompt + output tokens) one request can ever be admitted with on
  // an instance of `num_blocks` blocks of `block_tokens`: all blocks less the watermark.
  Tokens AdmissibleTokens(std::int64_t num_blocks, Tokens block_tokens) const;
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

// A prefill chunk of a step: its request by id, and by value what an executor that prices the
// step (the simulated one) reads of it.
struct PrefillItem {
  RequestId request = 0;
  Tokens tokens = 0;   // prompt tokens computed in this step
  Tokens context = 0;  // tokens already in the KV cache before this chunk
  // The chunk completes the prefill: the step samples the request's next token.
  bool ends_prefill = false;
  Tokens remaining_output = 0;  // output tokens the request still had to produce when planned
};

// A decoding request of a step (one token, plus its drafts with speculative decoding): its
// request by id, and by value what an executor that prices the step reads of it.
struct DecodeItem {
  RequestId request = 0;
  Tokens context = 0;  // tokens already in the KV cache: all but the one the step processes
  Tokens drafts = 0;   // draft tokens it verifies (DraftTokens)
  Tokens remaining_output = 0;  // output tokens the request still had to produce when planned
};

// A prefix load from the lower tiers (policies/kv_tiers.h) that a step's prefill waits for.
using LoadId = std::uint64_t;
struct AwaitedLoad {
  RequestId request = 0;
  LoadId load = 0;
};

// One row of a step as an executor that runs it receives it (StepPlan::rows): everything by
// value, so that the executor reads none of the engine's requests and may run the step on a
// thread of its own while the engine changes them.
struct StepRow {
  RequestId request = 0;
  Tokens position = 0;  // of the row's first token in the request's sequence
  // The row's token ids: StepPlan::token_ids[tokens_from, tokens_from + token_count).
  std::uint32_t tokens_from = 0;
  std::uint32_t token_count = 0;
  bool sample = false;  // the row emits a token: a prefill's last chunk, or a decode
  // Its last token is the one the step submitted before this one samples for the request
  // (asynchronous steps: planned before that step ended). Its id in token_ids is -1 until the
  // executor puts that token there.
  bool previous_token = false;
  // The request's sampling settings (SamplingParams), its seed resolved (the request id where
  // it gave none); its stop token ids are StepPlan::stop_ids[stops_from, +stop_count).
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::int32_t top_k = 0;
  std::uint64_t seed = 0;
  std::uint32_t stops_from = 0;
  std::uint32_t stop_count = 0;
};

// One planned step: a decision as data, which names its requests by id and points into none of
// them, so that it can be logged, compared and handed to an executor on another thread while
// the engine changes its requests. Requests in `preempted` lost their KV and went back to the
// waiting queue (they will recompute); requests in `admitted` got KV blocks this step; those of
// them in `loads` have part of their prefix to load from the lower tiers (overlap_tier_loads:
// their prefill items are in this step, which cannot end before the load; else they prefill
// once it finished).
//
// The engine completes the plan for the executor (the fields below the scheduler's) and applies
// it to its own requests (those of the entries as the scheduler hands them over, the others
// looked up by id). An executor reads only the plan, and changes it not: a simulated one its
// items (Shape()), one that runs the step its rows.
struct StepPlan {
  std::vector<PrefillItem> prefills;
  std::vector<DecodeItem> decodes;
  std::vector<RequestId> preempted;
  std::vector<RequestId> admitted;
  std::vector<RequestId> loads;

  int tp = 1;  // the instance's tensor-parallel degree
  // Decode-only plans: the executor may run up to this many steps of the same batch (each
  // request one more token per step), for executors that coalesce decode runs (simulated).
  int max_steps = 1;
  // Overlapped prefix loads of this step's prefills: the step cannot end before they have all
  // arrived, and ends one layer's compute after the last (as layer-wise loading does).
  std::vector<AwaitedLoad> awaited_loads;
  int num_layers = 1;
  // For executors that run the step (StepExecutor::NeedsInputs: real ones), a row per entry,
  // prefills first, then decodes, in plan order, with its token ids and stop ids, and a
  // snapshot of its physical KV blocks (BlockTable(i)).
  std::vector<StepRow> rows;
  std::vector<std::int32_t> token_ids;
  std::vector<std::int32_t> stop_ids;
  std::vector<std::int32_t> block_ids;
  std::vector<std::size_t> block_offsets;  // entry i: block_ids[offsets[i], offsets[i + 1])

  bool empty() const { return prefills.empty() && decodes.empty(); }
  void clear();
  // Shape of step `step_index` of a decode run started by this plan (0: this plan itself).
  models::StepShape Shape(int step_index = 0) const;
  // Copies every entry's inputs out of its request and its block table out of `blocks`;
  // `requests` are the entries' requests (the plan's ids resolved), prefills then decodes.
  void SnapshotInputs(std::span<const Request* const> requests, const KvBlockManager& blocks);
  // Shape() of a single step from the rows alone (after SnapshotInputs): what an executor that
  // reads no request times.
  models::StepShape RowsShape() const;
  std::span<const std::int32_t> BlockTable(std::size_t entry) const;
  std::span<const std::int32_t> TokensOf(const StepRow& row) const;
  std::span<const std::int32_t> StopsOf(const StepRow& row) const;
};

class BatchScheduler {
 public:
  explicit BatchScheduler(SchedulerConfig config) : config_(config) {}
  // Where admission looks for prefix blocks past the GPU hit (none: GPU prefix caching only).
  void set_lower_tiers(LowerTierLookup* lookup) { lower_tiers_ = lookup; }
  // Times the block manager's calls of each Schedule with `clock` (allocation_s); null: not.
  void set_host_clock(const Clock* clock) { host_clock_ = clock; }
  // The last Schedule's time in the block manager: allocation, prefix lookups, preemptions' frees.
  Seconds allocation_s() const { return allocation_s_; }
  LowerTierLookup* lower_tiers() const { return lower_tiers_; }

  // A request that needs a prefill (new, or preempted for recompute) joins the queue's back.
  void AddWaiting(Request* request);
  // A request whose KV is already in `blocks` (PD: pulled from a prefill instance) and that
  // decodes from its next step on.
  void AddRunning(Request* request) { running_.push_back(request); }
  // Drops a request that left the instance (finished, or handed to a decode instance).
  void RemoveRunning(Request* request);
  // Takes back a request that must stop wherever it is (waiting or running; an abort): the
  // caller frees its blocks. False when it is in neither list.
  bool Remove(Request* request);
  // The request with this id among those waiting or running, or null.
  Request* Find(RequestId id) const;

  // Plans the next step into `plan` (cleared first), allocating KV blocks in `blocks`:
  // 1. every decoding request gets one token (preempting the latest-admitted requests when a
  //    block cannot be found); 2. partially prefilled requests continue; 3. waiting requests
  //    are admitted FCFS while the budget, max_num_seqs and free blocks allow.
  // The plan names its requests by id; `requests` (cleared first) gets the requests of its
  // entries, prefills then decodes, so that the engine need not look them up.
  void Schedule(KvBlockManager& blocks, StepPlan& plan, std::vector<Request*>& requests);

  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  const SchedulerConfig& config() const { return config_; }
  // Prompt tokens queued here and not yet planned for computation (cache hits excluded).
  Tokens pending_prefill_tokens() const { return pending_prefill_tokens_; }

 private:
  void Preempt(Request* victim, KvBlockManager& blocks, StepPlan& plan);
  // Step 3 of Schedule, with `budget` tokens left: admits waiting requests, their prefill items
  // into `plan` and their requests onto `requests`.
  void Admit(KvBlockManager& blocks, Tokens budget, StepPlan& plan,
             std::vector<Request*>& requests);
  // `call()`, timed into allocation_s_ when a host clock is set.
  template <typename F>
  auto Timed(F&& call);
  // Drops what `request`, admitted and not fully prefilled, still counts in the pending tokens.
  void ForgetPendingPrefill(const Request* request);

  SchedulerConfig config_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;   // admission order
  std::vector<Request*> decoding_;  // scratch: a step's decoding requests
  Tokens pending_prefill_tokens_ = 0;
  LowerTierLookup* lower_tiers_ = nullptr;
  const Clock* host_clock_ = nullptr;
  Seconds allocation_s_ = 0;
};

}  // namespace duet::policies
