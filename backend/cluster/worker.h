// A worker process (`duet worker`): one instance of a `duet serve` cluster, its engine thread
// running the shared InstanceEngine over the model, its messages and events crossing to the
// frontend as wire.h frames, its KV pulled or served over UCX (PD). It registers with the
// frontend (role, model, KV descriptor), takes the instance id and the engine settings the
// frontend gives, sets a clock to the frontend's, and serves until the frontend shuts it down
// or goes away.
//
// Found through a directory (discovery), a worker serves every frontend that connects to it,
// each over a link of its own: they must give it the same instance id and engine settings (one
// deployment; they agree on ids through the directory). The engine runs on the first
// frontend's clock; each link converts times to and from its own frontend's clock and request
// ids to and from the engine's, so that frontends need not share either. Tokens, records and
// token gaps go to the frontend that sent the request; KV events and load go to every frontend
// (one that joins is sent the prefix cache's contents first). A frontend lost costs only its
// own requests; one that shuts down has its requests finished and its link closed; the worker
// serves on until stopped.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/cluster/wire.h"
#include "backend/engine/forward_model.h"
#include "backend/engine/step_log.h"
#include "backend/transport/local_kv_transports.h"
#include "common/status.h"
#include "policies/engine.h"

namespace duet::backend::cluster {

struct WorkerOptions {
  std::string frontend;  // "host:port" where the frontend takes workers
  // When set, gives connections from frontends instead (discovery: the worker listens and the
  // frontends that found it connect): the next one within `timeout_s`, or -1. Called once the
  // model is warm, and again for every further frontend while the worker serves.
  std::function<Result<int>(Seconds timeout_s)> await_frontend;
  // Discovery: polled while serving; true ends the worker (its frontends' requests abandoned:
  // they retry them elsewhere).
  std::function<bool()> stop_requested;
  policies::InstanceRole role = policies::InstanceRole::kColocated;
  KvTransportOptions kv_transport;  // PD: UCX (loopback cannot cross processes)
  Seconds connect_timeout_s = 60;   // to reach the frontend and be welcomed
  StepLog* step_log = nullptr;      // every engine step, when set
  // The secret shared with the frontend (link_auth.h): each side proves it holds it at hello,
  // so neither a stray process posing as a frontend nor one posing as a worker gets through.
  std::string secret;
};

// A worker's side of registration on `fd`, connected to the frontend (not closed here): the
// hello (its nonce drawn here), the frontend's challenge checked against `secret`, this side's
// proof, and the welcome, each read within `timeout_s`. An error names the step that failed.
Result<Welcome> RegisterWorker(int fd, Hello hello, std::string_view secret, Seconds timeout_s);

// Blocks until the frontend sends kShutdown (returns Ok once the work held is done) or the
// connection is lost (an error saying so; the work held is abandoned: the frontend retries it
// elsewhere); with await_frontend, until stop_requested says so (Ok). An engine message it
// cannot take is refused (kRefused, naming its request) and the link stays.
Status RunWorker(std::unique_ptr<ForwardModel> model, const WorkerOptions& options);

}  // namespace duet::backend::cluster
