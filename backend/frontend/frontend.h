// The live frontend behind `duet serve`: N instances of one model in this process, colocated or
// PD (prefill and decode instances moving KV through a real transport: loopback or UCX), each
// an engine thread running the shared InstanceEngine (policies/engine.h) over real-time ports,
// with the simulator's admission check and Router (policies/router.h) in front. Requests
// go in as token ids with their sampling settings; their tokens and final records come back
// through a per-request listener. No HTTP here: the server (backend/serve/http_server.h) is a
// thin driver of this class. Thread-safe: every public method may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cluster/connection.h"
#include "backend/discovery/registration.h"
#include "backend/engine/forward_model.h"
#include "backend/engine/step_log.h"
#include "backend/transport/local_kv_transports.h"
#include "common/status.h"
#include "deploy/engine_settings.h"
#include "deploy/tiers.h"
#include "policies/engine.h"
#include "policies/instance_load.h"
#include "policies/ports.h"
#include "policies/request.h"
#include "policies/router.h"
#include "policies/scheduler.h"

namespace duet::backend::serve {

// How a request ended, with the usage an OpenAI reply reports.
struct FinishInfo {
  policies::FinishReason reason = policies::FinishReason::kNone;  // kStop, kLength, kAbort, kError
  std::string message;                                            // kError: what went wrong
  Tokens prompt_tokens = 0;                                       // the prompt's length
  Tokens completion_tokens = 0;  // tokens generated (a stop token included)
  Tokens cached_tokens = 0;      // prompt tokens served from the prefix cache
  // Of those, the tokens each KV tier below GPU memory served (dram, ssd, remote).
  std::array<Tokens, policies::kNumLowerTiers> tier_hit_tokens{};
  policies::InstanceId instance = policies::kNoInstance;  // the instance that finished it
  Seconds frontend_s = 0;       // arrival to the hand-over to the engines (parsing, hashing)
  Seconds queue_s = -1;         // arrival to its first admission to a batch (-1: never admitted)
  Seconds prefill_done_s = -1;  // arrival to the end of its prefill step (-1: none)
  Seconds kv_transfer_s = -1;   // PD: end of its prefill to its KV usable on the decode instance
  Bytes kv_transfer_bytes = 0;  // PD: the KV bytes moved
  std::optional<policies::KvTransferParts> kv_transfer_parts;  // PD: the transfer's parts
};

// Receives one request's output. Called on the engine thread of the instance serving it, in
// order: OnToken for every generated token, then OnFinished exactly once (aborted and failed
// requests too), after which the listener is released. Must not block; may call
// LiveFrontend::Abort (it only posts a message).
class RequestListener {
 public:
  virtual ~RequestListener() = default;
  virtual void OnToken(std::int32_t token) = 0;
  virtual void OnFinished(const FinishInfo& info) = 0;
};

struct LiveRequest {
  std::vector<std::int32_t> prompt;  // token ids, at least one
  Tokens max_tokens = 16;            // at least one
  policies::SamplingParams sampling;
  // When the server got the request (its headers read), the request's arrival: the time until
  // Submit is its frontend time (RequestSpec::frontend_s). Absent: Submit's own time.
  std::optional<std::chrono::steady_clock::time_point> received = std::nullopt;
};

enum class AdmitStatus {
  kAccepted,
  kInvalid,    // empty prompt, max_tokens < 1, token ids outside the vocabulary (HTTP 400)
  kTooLong,    // prompt + max_tokens exceed the model's context or an instance's KV (HTTP 400)
  kQueueFull,  // max_pending_requests are in flight already (HTTP 429, retry later)
  kDraining,   // shutting down (HTTP 503)
};
struct Admission {
  AdmitStatus status = AdmitStatus::kAccepted;
  policies::RequestId id = 0;  // kAccepted: the id Abort takes
  std::string message;         // otherwise: why, in words for the error body
};

struct FrontendOptions {
  policies::RouterConfig router;  // the same policies the simulator routes with
  // Every instance's engine settings, as a cluster file gives them (the simulator's too). Their
  // block_tokens is the models' (threads) or the one workers must have (processes).
  deploy::EngineSettings engine;
  // Each instance's role, in the order of the models; empty: all colocated. PD: at least one
  // prefill and one decode instance, and no colocated one.
  std::vector<policies::InstanceRole> roles;
  // PD: how decode instances pull KV (how long prefill instances hold it for them, and what a
  // failed pull leads to, are engine settings).
  KvTransportOptions kv_transport;
  // Requests accepted and not yet finished, across instances; Submit answers kQueueFull past
  // it, so memory stays bounded however fast clients send.
  std::int64_t max_pending_requests = 1024;
  // Receives every engine's lifecycle events (the Prometheus metrics): called from every engine
  // thread, so it must be thread-safe. May be null. Must outlive the frontend.
  policies::EventSink* observer = nullptr;
  // Every engine step of the instances in this process, when set (--step-log). Must outlive
  // the frontend.
  StepLog* step_log = nullptr;
  // KV tiers below the instances' blocks (a cluster file's "tiers"; engine threads only): real
  // host memory, block files and a Redis store behind the simulator's tier policies.
  deploy::TiersSpec tiers;
};

// A worker slot, for /health and /metrics.
struct WorkerStatus {
  policies::InstanceId instance = 0;
  policies::InstanceRole role = policies::InstanceRole::kColocated;
  bool up = false;
  std::int64_t pid = 0;    // of the worker holding the slot now, or last
  std::int64_t joins = 0;  // registrations into this slot (1 + rejoins)
  // While up: the worker's clock against the frontend's (backend/cluster/clock_sync.h), as its
  // last probe reported: the offset it adds to its own steady clock, and the bound on its error.
  std::optional<double> clock_offset_s;
  std::optional<double> clock_error_s;
};

// What the frontend holds now (for /metrics gauges, /health and tests).
struct FrontendStats {
  // Summed over the instances (policies/instance_load.h): waiting is what was accepted and not
  // yet admitted to a batch, running what holds KV blocks and is being served.
  policies::InstanceLoad load;
  // Worker processes: the requests moved to a survivor after their worker was lost.
  std::int64_t requests_retried = 0;
  std::vector<WorkerStatus> workers = {};  // worker processes: every slot (LiveFrontend::Workers)
};

// Instances as worker processes (`duet worker`, backend/cluster/worker.h) rather than engine
// threads of this process. Workers register on `listener`, one per entry of
// FrontendOptions::roles; the frontend keeps taking registrations while it runs, so a restarted
// worker rejoins in a free slot of its role.
struct WorkerFleet {
  // Where workers come from: they register at `listener`, or the fleet connects to those that
  // `directory` lists (discovery: backend/discovery), polled every directory_interval_s; a
  // worker whose record is gone from a listing is dropped as a lost one. One of the two.
  std::unique_ptr<cluster::Listener> listener;
  std::shared_ptr<discovery::WorkerDirectory> directory;
  Seconds directory_interval_s = 0.25;
  models::ModelSpec config;          // the model every worker must serve (blocks: options.engine's)
  Seconds register_timeout_s = 600;  // for every slot to be taken at start (models load)
  Seconds heartbeat_interval_s = 0.5;
  // A worker whose connection is silent this long is taken for dead (SIGKILL shows at once, as
  // the connection closes; this catches a hung or stopped one).
  Seconds heartbeat_timeout_s = 5;
  // Asked while waiting for registrations: a non-empty answer gives up at once with it (the
  // caller's spawned workers exited, say). May be empty.
  std::function<std::string()> abandon;
  // The secret every worker proves it holds at hello, as the frontend proves it to them
  // (cluster/link_auth.h): at least kMinSecretBytes.
  std::string secret;
  // A connection has this long for the whole handshake (hello, challenge, proof); at most
  // max_handshakes run at once, each on a thread of its own, so a silent or slow peer holds up
  // neither other registrations nor the heartbeat checks.
  Seconds handshake_timeout_s = 3;
  int max_handshakes = 16;
};

class LiveFrontend {
 public:
  // One model per instance; each holds its own KV memory (ForwardModel::num_blocks()), and all
  // must share one config. PD needs models with a KV region (ForwardModel::kv_region()). Starts
  // the engine threads.
  static Result<std::unique_ptr<LiveFrontend>> Start(
      std::vector<std::unique_ptr<ForwardModel>> models, FrontendOptions options);
  // Worker processes (options.roles: one per slot, colocated if empty is not allowed). Returns
  // once every slot is taken, or an error after fleet.register_timeout_s. When a worker is
  // lost, its requests are retried on survivors: each resumes from its prompt plus the tokens
  // its listener already got, so the listener hears every token once, in order.
  static Result<std::unique_ptr<LiveFrontend>> StartWithWorkers(WorkerFleet fleet,
                                                                FrontendOptions options);
  // Aborts whatever is still in flight and joins the engine threads.
  ~LiveFrontend();

  // Admits, routes and dispatches; on kAccepted the listener will hear of the request.
  Admission Submit(LiveRequest request, std::shared_ptr<RequestListener> listener);
  // Ends the request at the next step boundary (its listener gets OnFinished with kAbort) and
  // frees its KV blocks. No effect once it finished or for an unknown id.
  void Abort(policies::RequestId id);
  // Stops admitting (Submit answers kDraining from now on) and blocks until every accepted
  // request finished or `timeout_s` passed; then aborts what is left. Returns the number aborted.
  std::int64_t Drain(Seconds timeout_s);
  // Drain(0), then stops the instances (engine threads finish what they hold, their tier writes
  // included) and checks what they leave: the KV tiers idle, within capacity and consistent
  // with their storage. Once; the destructor does it if not done.
  Status Stop();

  // The longest prompt + max_tokens one request may have (the model's context and the KV
  // capacity of the smallest instance, less the admission watermark).
  Tokens max_request_tokens() const;
  const models::ModelSpec& model_config() const;
  FrontendStats Stats() const;
  // Worker processes: every slot; empty with engine threads.
  std::vector<WorkerStatus> Workers() const;

  struct Impl;  // internal (frontend_impl.h)

 private:
  explicit LiveFrontend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace duet::backend::serve
