// A worker process (`duet worker`): one instance of a `duet serve` cluster, its engine thread
// running the shared InstanceEngine over the model, its messages and events crossing to the
// frontend as wire.h frames, its KV pulled or served over UCX (PD). It registers with the
// frontend (role, model, KV descriptor), takes the instance id, the run's clock and the
// engine settings the frontend gives, and serves until the frontend shuts it down or goes away.
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
  // When set, gives the connection to the frontend instead (discovery: the worker listens and
  // the frontend that found it connects); called once the model is warm.
  std::function<Result<int>()> await_frontend;
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
// elsewhere). An engine message it cannot take is refused (kRefused, naming its request) and
// the link stays.
Status RunWorker(std::unique_ptr<ForwardModel> model, const WorkerOptions& options);

}  // namespace duet::backend::cluster
