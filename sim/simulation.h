// `duet simulate`: replays a trace against a cluster on SimGrid and writes METRICS.md files
// (summary.json, requests.csv), links.csv (bytes and busy time per link and disk) and, when
// asked, a timeline.
// One simulation per process (SimGrid's engine is a process-wide singleton).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "policies/metrics.h"
#include "policies/router.h"
#include "sim/cluster_spec.h"
#include "traces/arrivals.h"
#include "traces/trace.h"

namespace duet::sim {

struct SimOptions {
  policies::RouterConfig router;
  policies::Slo slo;
  std::string out_dir;    // summary.json and requests.csv are written here
  bool progress = false;  // a progress bar on stderr
  // cache-aware router: reject at arrival a request whose estimated TTFT exceeds slo.ttft_ms.
  bool reject_over_slo = false;
  // > 0: the router reads the GPU prefix caches from KV events delivered this late (a real
  // router's view); 0: from the block managers directly. Lower tiers are always read as is.
  Seconds router_staleness_s = 0;
  // users > 0: a closed loop replaces the trace's arrival times (traces/arrivals.h).
  traces::ClosedLoop closed_loop;
  // Non-empty: also write a Perfetto / Chrome trace of the run there (sim/timeline.h).
  std::string timeline_path;
  // Non-empty: also write every step as a line of the step log there (policies/step_log.h: the
  // format of a live server's `--step-log`, the forward pass as the cost model priced it).
  std::string step_log_path;
  // > 0 (with an SLO, open loop): stop the run as soon as more requests have missed the SLO
  // than an attainment of this fraction allows; the summary then says so (sim.stopped_early)
  // and counts the requests not yet finished as failed. What a capacity search needs to know
  // of a configuration that cannot meet its target, at a fraction of a full run's cost.
  double stop_below_attainment = 0;
};

struct SimReport {
  nlohmann::json summary;  // as written to summary.json
};

// Runs the whole simulation. Errors: output directory not writable, a SimGrid failure, or a
// broken invariant found at the end (leaked KV blocks).
Result<SimReport> RunSimulation(const ClusterSpec& cluster, const traces::Trace& trace,
                                const SimOptions& options);

}  // namespace duet::sim
