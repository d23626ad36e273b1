// What rules a candidate out without simulating it. A request's TTFT is at least the time its
// prefill takes alone on an idle instance: its prompt less the longest prefix any earlier
// request could have left cached (an unbounded cache), in chunks of the full token budget, each
// a step of its own. If more requests than the attainment target allows cannot meet the TTFT
// SLO even so, no number of such instances meets it, at any rate. The floor holds as long as a
// step costs no less for having more work in it, as the roofline and the fitted models price
// steps.
#pragma once

#include <vector>

#include "common/units.h"
#include "models/cost_model.h"
#include "traces/trace.h"

namespace duet::plan {

// Per request, in trace order: the prompt tokens an unbounded prefix cache could hold for it (a
// later turn of a session: at least its parent's context), in whole engine blocks.
std::vector<Tokens> ReusableTokens(const traces::Trace& trace, Tokens engine_block_tokens);

// Per request: the least time its prefill takes on an idle instance of TP `tp` that prefills up
// to `token_budget` tokens a step, priced by `cost`.
std::vector<Seconds> PrefillFloors(const traces::Trace& trace, const std::vector<Tokens>& reusable,
                                   const models::StepCostModel& cost, Tokens token_budget, int tp);

// How many of the floors exceed `ttft_s`.
std::size_t CountAbove(const std::vector<Seconds>& floors, Seconds ttft_s);

}  // namespace duet::plan
