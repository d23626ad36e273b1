// `duet validate` on a trace whose requests follow others (sessions, agent steps): each world
// sends a later request when its own replies finish, so a simulation that runs faster or slower
// than live also sends its later turns at other times, where they meet other batches, and its
// error compounds. The trace again with every request sent when a live run sent it: simulated
// from it, the error left is not the send times' (cli/validate.cpp runs it).
#pragma once

#include <string>

#include "common/status.h"
#include "traces/trace.h"

namespace duet::cli {

// Writes `trace` (validate's selection, requests with the ids the live run's records carry) to
// `path` as Mooncake JSONL with each request's arrival set to when the live run sent it (the
// arrival_s of its record in the requests.csv text `live_csv`, from `csv_source`) and its think
// time 0, so that it is sent at the later of that time and its dependencies' end; in the order
// of those times. Its dependencies and prompts are kept; block ids are dropped where no two
// requests share one (the ids of a length-scaled trace name blocks the format cannot carry, and
// ids that nothing shares say nothing). Errors: a request the live run has no record of, shared
// blocks of other than 512 tokens, a file that cannot be written.
Status WriteAtLiveSendTimes(const traces::Trace& trace, const std::string& live_csv,
                            const std::string& csv_source, const std::string& path);

}  // namespace duet::cli
