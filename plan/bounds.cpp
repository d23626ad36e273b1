#include "plan/bounds.h"

#include <algorithm>
#include <unordered_set>

#include "policies/block_hash.h"

namespace duet::plan {

std::vector<Tokens> ReusableTokens(const traces::Trace& trace, Tokens engine_block_tokens) {
  std::vector<Tokens> out(trace.requests.size(), 0);
  std::unordered_set<policies::BlockHash> seen;  // every block (prefix) seen so far
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    const traces::TraceRequest& r = trace.requests[k];
    Tokens matched = 0;
    bool matching = true;
    for (policies::BlockHash h : policies::EngineBlockHashes(r.block_ids, trace.block_tokens,
                                                             r.input_tokens, engine_block_tokens)) {
      if (matching && seen.count(h)) {
        matched += engine_block_tokens;
      } else {
        matching = false;
        seen.insert(h);
      }
    }
    if (r.parent) matched = std::max(matched, r.context_tokens);
    out[k] = std::min(matched, r.input_tokens);
  }
  return out;
}

std::vector<Seconds> PrefillFloors(const traces::Trace& trace, const std::vector<Tokens>& reusable,
                                   const models::StepCostModel& cost, Tokens token_budget, int tp) {
  std::vector<Seconds> out(trace.requests.size(), 0);
  models::StepShape shape;
  shape.tp = tp;
  shape.prefill.resize(1);
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    Tokens context = reusable[k];
    Seconds t = 0;
    while (context < trace.requests[k].input_tokens) {
      const Tokens chunk = std::min(token_budget, trace.requests[k].input_tokens - context);
      shape.prefill[0] = {chunk, context};
      t += cost.StepTime(shape);
      context += chunk;
    }
    out[k] = t;
  }
  return out;
}

std::size_t CountAbove(const std::vector<Seconds>& floors, Seconds ttft_s) {
  return static_cast<std::size_t>(
      std::count_if(floors.begin(), floors.end(), [ttft_s](Seconds f) { return f > ttft_s; }));
}

}  // namespace duet::plan
