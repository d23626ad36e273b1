// `duet serve`: an OpenAI-compatible HTTP/WebSocket server over the live frontend. Binds first
// (/health answers 503 while the model loads), loads the model once per instance, prints one
// line with its address when ready, and on SIGTERM/SIGINT drains: /health answers 503, new
// requests are refused, requests in flight complete, then it exits 0. docs/serving.md.
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "backend/cluster/link_auth.h"
#include "backend/discovery/etcd.h"
#include "backend/engine/fault_injecting_model.h"
#include "backend/frontend/frontend.h"
#include "backend/registry.h"
#include "backend/serve/api.h"
#include "backend/serve/http_server.h"
#include "backend/serve/live_metrics.h"
#include "backend/transport/kv_transport_registry.h"
#include "cli/child_processes.h"
#include "cli/commands.h"
#include "deploy/deployment.h"
#include "models/model_spec.h"

namespace po = boost::program_options;

namespace duet::cli {
namespace {

using backend::serve::HttpServer;
using backend::serve::LiveFrontend;

// SIGTERM / SIGINT, taken by sigwait on a thread of their own (blocked everywhere else, so no
// handler runs in the middle of the server's threads). The first asks for a drain; a second
// one while draining exits at once.
class ShutdownSignal {
 public:
  ShutdownSignal() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    // Before any other thread exists, so that every thread inherits the mask.
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    std::thread([this] {
      for (int count = 0;;) {
        int signal = 0;
        if (sigwait(&set_, &signal) != 0) continue;
        if (count++ > 0) {
          std::fprintf(stderr, "duet serve: second signal, exiting without draining\n");
          std::_Exit(kExitError);
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          received_ = signal;
        }
        cv_.notify_all();
      }
    }).detach();
  }
  int Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return received_ != 0; });
    return received_;
  }
  bool received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_ != 0;
  }

 private:
  sigset_t set_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int received_ = 0;
};

// Each connection is a file descriptor: the soft limit goes up to the hard one (often 1024
// against 4096+ connections), and a limit still below --max-connections is said at start.
void RaiseOpenFileLimit(int max_connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) getrlimit(RLIMIT_NOFILE, &limit);
  }
  // Beside the connections: the model's files, the engines', the workers' and stdio.
  constexpr rlim_t kOtherFiles = 64;
  if (limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < static_cast<rlim_t>(max_connections) + kOtherFiles) {
    std::fprintf(stderr,
                 "duet serve: the open files limit (%llu, ulimit -n) is below --max-connections "
                 "(%d) plus %d; past it new connections wait\n",
                 static_cast<unsigned long long>(limit.rlim_cur), max_connections,
                 static_cast<int>(kOtherFiles));
  }
}

}  // namespace

// (At the model's own KV dtype.)
std::int64_t DefaultKvBlocks(const models::ModelSpec& spec, std::int32_t block_tokens) {
  const std::int64_t context =
      spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096;
  const std::int64_t per_sequence = (context + block_tokens - 1) / block_tokens + 1;
  const double block_bytes = static_cast<double>(spec.KvBytesPerToken()) * block_tokens;
  const auto budget = static_cast<std::int64_t>(4.0 * kGiB / std::max(block_bytes, 1.0));
  return std::max(per_sequence + 1, std::min(16 * per_sequence, budget));
}

int Serve(int argc, char** argv) {
  po::options_description opts("duet serve: an OpenAI-compatible server for a model");
  const std::string kv_transport_help =
      "PD: how decode instances pull KV from prefill instances, one of this build's transports: " +
      backend::DescribeKvTransports() +
      "; or auto (the first of them that serves --workers and --device: loopback between "
      "threads, ucx between processes)";
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("model", po::value<std::string>()->required(),
     "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu or cuda")
    ("instances", po::value<int>()->default_value(1),
     "colocated instances of the model, each with its own KV cache and engine thread")
    ("cluster", po::value<std::string>(),
     "a cluster file (docs/clusters.md): the roles and counts of its instances (colocated, or "
     "prefill and decode) and its engine settings")
    ("workers", po::value<std::string>(),
     "where instances run: process (a duet worker process each; the default with --cluster) "
     "or thread (an engine thread each in this process; the default otherwise)")
    ("worker-host", po::value<std::string>()->default_value("127.0.0.1"),
     "--workers process: the IPv4 address of this host where workers register (another "
     "host's workers need one they reach; 0.0.0.0: every address)")
    ("worker-port", po::value<int>()->default_value(0),
     "--workers process: the TCP port where workers register (0: any free port)")
    ("worker-restarts", po::value<int>()->default_value(5),
     "times duet serve starts a worker process of its own again when it exits unasked (each; "
     "0: never)")
    ("worker-healthy-after", po::value<double>()->default_value(300.0),
     "seconds after which a worker process that exits counts as having run healthy: its "
     "restarts (and their delay) start over")
    ("discovery", po::value<std::string>(),
     "--workers process: etcd://HOST:PORT where workers register (duet worker --discovery): "
     "connect to each it lists, drop one whose registration lapses; starts no workers and "
     "opens no worker port")
    ("spawn-workers", po::value<bool>()->default_value(true),
     "--workers process: start the workers (false: wait for duet worker processes started "
     "by hand or an orchestrator)")
    ("worker-secret-file", po::value<std::string>(),
     "--workers process: a file holding the secret workers prove they hold when they register "
     "(default: $DUET_WORKER_SECRET, else a fresh one for the workers duet serve starts; "
     "required with --spawn-workers false)")
    ("kv-transport", po::value<std::string>()->default_value("auto"), kv_transport_help.c_str())
    ("ucx-tls", po::value<std::string>()->default_value(""),
     "PD over UCX: the UCX transports (UCX_TLS: tcp, posix,cma, ...; empty: UCX's choice)")
    ("host", po::value<std::string>()->default_value("127.0.0.1"),
     "address to listen on (loopback by default; 0.0.0.0 for every interface)")
    ("port", po::value<int>()->default_value(8000), "TCP port (0: any free port)")
    ("api-key", po::value<std::string>(),
     "require 'Authorization: Bearer KEY' on /v1/* (default: $DUET_API_KEY, else none)")
    ("max-pending", po::value<std::int64_t>()->default_value(1024),
     "requests in flight at most; more get HTTP 429")
    ("max-num-seqs", po::value<int>()->default_value(256),
     "requests holding KV and batched together at most, per instance")
    ("max-num-batched-tokens", po::value<std::int64_t>()->default_value(8192),
     "tokens one engine step computes at most (prefill chunks plus one per decode)")
    ("kv-blocks", po::value<std::int64_t>()->default_value(0),
     "KV cache blocks of 16 tokens per instance (0: 16 full contexts within 4 GiB)")
    ("threads", po::value<int>()->default_value(0),
     "CPU threads per instance (0: the hardware threads shared among instances)")
    ("io-threads", po::value<int>()->default_value(1), "threads serving the network")
    ("served-model-name", po::value<std::string>(),
     "the model name clients send (default: --model as given)")
    ("read-timeout", po::value<double>()->default_value(60.0),
     "seconds a connection may take to send a request, idle keep-alive time included")
    ("max-connections", po::value<int>()->default_value(4096),
     "open HTTP connections at most; past it a new one takes the place of the oldest idle one")
    ("max-connections-per-client", po::value<int>()->default_value(1024),
     "open HTTP connections at most from one client address, likewise (0: no limit)")
    ("step-log", po::value<std::string>(),
     "write every engine step (shape, forward-pass and iteration time) to FILE as JSON lines, "
     "emptied first; worker processes append to it")
    ("drain-timeout", po::value<double>()->default_value(60.0),
     "seconds to let requests in flight finish on SIGTERM/SIGINT before aborting them");
  // clang-format on
  AddRouterOptions(opts, "least-loaded");
  po::variables_map vm;
  int code = 0;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;

  const std::string model_dir = vm["model"].as<std::string>();
  const std::string device = vm["device"].as<std::string>();
  if (device != "cpu" && device != "cuda") return Fail("--device must be cpu or cuda", kExitUsage);
  int instances = vm["instances"].as<int>();
  if (instances < 1 || instances > 64) return Fail("--instances must be in 1..64", kExitUsage);
  // A cluster file gives the instances and the engine settings; flags may not say otherwise.
  std::optional<deploy::Deployment> cluster;
  if (vm.count("cluster")) {
    for (const char* flag : {"instances", "max-num-seqs", "max-num-batched-tokens"}) {
      if (!vm[flag].defaulted())
        return Fail(std::string("--") + flag + " and --cluster: the cluster file says that",
                    kExitUsage);
    }
    // The deployment part of the file, read as the simulator reads it (deploy/).
    auto loaded_cluster = deploy::LoadDeployment(vm["cluster"].as<std::string>(), DataDir());
    if (!loaded_cluster) return Fail(loaded_cluster.error());
    cluster = std::move(*loaded_cluster);
    instances = static_cast<int>(cluster->instances.size());
    if (instances > 64) return Fail("--cluster: at most 64 instances", kExitUsage);
    // Each live instance runs on one device; the simulator prices the parallel layouts.
    for (const deploy::InstanceSpec& instance : cluster->instances) {
      if (instance.Gpus() > 1)
        return Fail("--cluster " + cluster->path + ": instance " + instance.name + " has tp " +
                        std::to_string(instance.tp) + " and dp " + std::to_string(instance.dp) +
                        ": the backends run an instance on one device, so tensor and data "
                        "parallel layouts are simulated only (duet simulate)",
                    kExitUsage);
    }
    if (cluster->speculative.enabled())
      return Fail("--cluster " + cluster->path +
                      ": speculative decoding is simulated only (duet simulate); the backends "
                      "verify no drafts yet",
                  kExitUsage);
  }
  const bool processes =
      vm.count("workers") ? vm["workers"].as<std::string>() == "process" : vm.count("cluster") > 0;
  if (vm.count("workers") && !processes && vm["workers"].as<std::string>() != "thread")
    return Fail("--workers must be process or thread", kExitUsage);
  if (processes && !cluster) return Fail("--workers process needs --cluster", kExitUsage);
  // KV tiers run behind the engine threads of this process, over host memory.
  if (cluster && cluster->tiers.any() && processes)
    return Fail("--cluster " + cluster->path +
                    ": tiers are served by engine threads for now: add --workers thread",
                kExitUsage);
  if (cluster && cluster->tiers.any() && device != "cpu")
    return Fail("--cluster " + cluster->path +
                    ": tiers offload from host memory, which the CPU backend's KV is in; the "
                    "CUDA path has no host copy yet: use --device cpu",
                kExitUsage);
  // A transport named is one this build has and serves what runs, PD or not; auto may find
  // none where no KV moves.
  const std::string kv_transport_flag = vm["kv-transport"].as<std::string>();
  const backend::KvTransportEntry* kv_transport = nullptr;
  if (auto chosen =
          backend::ChooseKvTransport("--kv-transport", kv_transport_flag, {processes, device})) {
    kv_transport = *chosen;
  } else if (kv_transport_flag != "auto" || (cluster && cluster->pd())) {
    return Fail(chosen.error(), kExitUsage);
  }
  const std::string worker_host = vm["worker-host"].as<std::string>();
  if (in_addr parsed{}; ::inet_pton(AF_INET, worker_host.c_str(), &parsed) != 1)
    return Fail("--worker-host: '" + worker_host + "' is not an IPv4 address", kExitUsage);
  const int worker_port = vm["worker-port"].as<int>();
  if (worker_port < 0 || worker_port > 65535)
    return Fail("--worker-port must be in 0..65535", kExitUsage);
  const int port = vm["port"].as<int>();
  if (port < 0 || port > 65535) return Fail("--port must be in 0..65535", kExitUsage);
  const std::int64_t max_pending = vm["max-pending"].as<std::int64_t>();
  if (max_pending < 1) return Fail("--max-pending must be at least 1", kExitUsage);
  const std::int64_t kv_blocks = vm["kv-blocks"].as<std::int64_t>();
  if (kv_blocks < 0) return Fail("--kv-blocks must be >= 0", kExitUsage);
  // The engine settings: the cluster file's, else the flags' (within the same bounds).
  deploy::EngineSettings engine;
  if (cluster) {
    engine = cluster->engine;
  } else {
    for (const auto& [flag, key, value] :
         {std::tuple<const char*, const char*, nlohmann::json>{"--max-num-seqs", "max_num_seqs",
                                                               vm["max-num-seqs"].as<int>()},
          {"--max-num-batched-tokens", "max_num_batched_tokens",
           vm["max-num-batched-tokens"].as<std::int64_t>()}}) {
      auto flagged = deploy::ParseEngineSettings({{key, value}}, flag, engine);
      if (!flagged) return Fail(flagged.error(), kExitUsage);
      engine = *flagged;
    }
  }
  const int threads = vm["threads"].as<int>();
  if (Status s = CheckThreadsFlag(threads); !s.ok()) return Fail(s.message(), kExitUsage);
  const int worker_restarts = vm["worker-restarts"].as<int>();
  if (worker_restarts < 0 || worker_restarts > 1000)
    return Fail("--worker-restarts must be in 0..1000", kExitUsage);
  const double worker_healthy_after_s = vm["worker-healthy-after"].as<double>();
  if (!(worker_healthy_after_s > 0) || worker_healthy_after_s > 1e6)
    return Fail("--worker-healthy-after must be in (0, 1000000]", kExitUsage);
  const int io_threads = vm["io-threads"].as<int>();
  if (io_threads < 1 || io_threads > 64) return Fail("--io-threads must be in 1..64", kExitUsage);
  const double drain_timeout_s = vm["drain-timeout"].as<double>();
  if (!(drain_timeout_s >= 0)) return Fail("--drain-timeout must be >= 0", kExitUsage);
  const double read_timeout_s = vm["read-timeout"].as<double>();
  if (!(read_timeout_s > 0)) return Fail("--read-timeout must be > 0", kExitUsage);
  const int max_connections = vm["max-connections"].as<int>();
  if (max_connections < 1 || max_connections > 1 << 20)
    return Fail("--max-connections must be in 1..1048576", kExitUsage);
  const int max_connections_per_client = vm["max-connections-per-client"].as<int>();
  if (max_connections_per_client < 0 || max_connections_per_client > 1 << 20)
    return Fail("--max-connections-per-client must be in 0..1048576", kExitUsage);
  policies::RouterConfig router;
  if (Status st = ParseRouterOptions(vm, &router); !st.ok()) return Fail(st.message(), kExitUsage);
  if (router.kind == policies::RouterKind::kCacheAware)
    return Fail("--router cache-aware needs a prefill rate; not offered by duet serve yet",
                kExitUsage);
  std::string api_key;
  if (vm.count("api-key")) {
    api_key = vm["api-key"].as<std::string>();
    if (api_key.empty()) return Fail("--api-key must not be empty", kExitUsage);
  } else if (const char* env = std::getenv("DUET_API_KEY"); env && *env) {
    api_key = env;
  }

  // The worker link's secret: the user's, or one made here for the workers this process
  // starts. Workers started by hand cannot know a generated one, so without --spawn-workers
  // one must be given: an unauthenticated worker port would take any local process as a
  // worker and hand it users' prompts.
  std::optional<backend::discovery::EtcdEndpoint> discovery;
  if (vm.count("discovery")) {
    if (!processes) return Fail("--discovery is for --workers process", kExitUsage);
    if (!vm["spawn-workers"].defaulted() && vm["spawn-workers"].as<bool>())
      return Fail("--discovery finds workers started elsewhere: not with --spawn-workers true",
                  kExitUsage);
    auto parsed = backend::discovery::ParseEtcdUrl(vm["discovery"].as<std::string>());
    if (!parsed) return Fail("--discovery: " + parsed.error(), kExitUsage);
    discovery = *parsed;
  }
  const bool spawn_workers = vm["spawn-workers"].as<bool>() && !discovery;
  std::string worker_secret;
  if (processes) {
    auto loaded_secret = backend::cluster::LoadWorkerSecret(
        vm.count("worker-secret-file") ? vm["worker-secret-file"].as<std::string>() : "");
    if (!loaded_secret) return Fail("--worker-secret-file: " + loaded_secret.error(), kExitUsage);
    worker_secret = std::move(*loaded_secret);
    if (worker_secret.empty() && !spawn_workers) {
      return Fail(std::string("--spawn-workers false, --discovery: workers started elsewhere "
                              "prove they hold a "
                              "shared secret; give it with --worker-secret-file FILE (or $") +
                      backend::cluster::kWorkerSecretEnv + "), here and to each duet worker",
                  kExitUsage);
    }
    if (worker_secret.empty()) {
      auto generated = backend::cluster::GenerateWorkerSecret();
      if (!generated) return Fail(generated.error());
      worker_secret = std::move(*generated);
    }
  } else if (vm.count("worker-secret-file")) {
    return Fail("--worker-secret-file is for --workers process", kExitUsage);
  }

  std::unique_ptr<backend::StepLog> step_log;
  if (vm.count("step-log")) {
    auto opened =
        backend::StepLog::Open(vm["step-log"].as<std::string>(), backend::StepLog::Mode::kTruncate);
    if (!opened) return Fail("--step-log: " + opened.error());
    step_log = std::move(*opened);
  }

  ShutdownSignal shutdown;  // before any thread starts

  backend::serve::ServerOptions server_options;
  server_options.host = vm["host"].as<std::string>();
  server_options.port = static_cast<std::uint16_t>(port);
  server_options.api_key = api_key;
  server_options.io_threads = io_threads;
  server_options.read_timeout_s = read_timeout_s;
  server_options.max_connections = max_connections;
  server_options.max_connections_per_client = max_connections_per_client;
  RaiseOpenFileLimit(max_connections);
  auto server = HttpServer::Start(server_options);
  if (!server) return Fail(server.error());

  // Load: the tokenizer once, the model once per instance.
  auto loaded = backend::LoadModelDir(model_dir);
  if (!loaded) return Fail(loaded.error());
  auto served = backend::serve::MakeServedModel(
      *loaded,
      vm.count("served-model-name") ? vm["served-model-name"].as<std::string>() : model_dir);
  if (!served) return Fail(served.error());
  const std::shared_ptr<backend::serve::ServedModel> model = *served;

  backend::ModelPlacement placement;
  placement.device = device;
  placement.block_tokens = static_cast<std::int32_t>(engine.block_tokens);
  placement.kv_cache_dtype = engine.memory.kv_cache_dtype;
  placement.num_blocks =
      kv_blocks > 0 ? kv_blocks : DefaultKvBlocks(loaded->config, placement.block_tokens);
  placement.cpu_threads =
      threads > 0 ? threads
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / instances);
  // Prefill instances keep their KV where the transport's peers read it fastest (UCX's shared
  // memory, as `duet worker` does); decode instances pull into the heap.
  backend::KvTransportOptions kv_transport_options;
  if (kv_transport) kv_transport_options.transport = kv_transport->name;
  kv_transport_options.ucx_tls = vm["ucx-tls"].as<std::string>();
  const backend::KvAllocator pulled_from =
      cluster && cluster->pd() ? backend::KvTransportAllocator(kv_transport_options) : nullptr;
  std::vector<std::unique_ptr<backend::ForwardModel>> models;
  for (int i = 0; i < instances && !processes; ++i) {
    if (shutdown.received()) return kExitOk;  // asked to stop while loading: nothing to drain
    auto instance_model = i == 0 ? std::move(loaded) : backend::LoadModelDir(model_dir);
    if (!instance_model) return Fail(instance_model.error());
    placement.kv_allocator = cluster && cluster->instances[static_cast<std::size_t>(i)].role ==
                                            policies::InstanceRole::kPrefill
                                 ? pulled_from
                                 : nullptr;
    auto forward = backend::CreateForwardModel(std::move(*instance_model), placement);
    if (!forward) return Fail("--device " + device + ": " + forward.error());
    models.push_back(backend::InjectForwardFaultsFromEnvironment(std::move(*forward)));
  }

  backend::serve::LiveMetrics metrics;
  backend::serve::FrontendOptions frontend_options;
  frontend_options.router = router;
  frontend_options.max_pending_requests = max_pending;
  frontend_options.engine = engine;
  frontend_options.kv_transport = kv_transport_options;
  std::string layout = std::to_string(instances) + " instance" + (instances == 1 ? "" : "s");
  if (cluster) {
    for (const deploy::InstanceSpec& spec : cluster->instances)
      frontend_options.roles.push_back(spec.role);
    if (cluster->pd()) {
      layout = std::to_string(cluster->CountRole(policies::InstanceRole::kPrefill)) +
               " prefill + " + std::to_string(cluster->CountRole(policies::InstanceRole::kDecode)) +
               " decode instances, KV over " + kv_transport_options.transport;
    }
  }
  frontend_options.observer = &metrics;
  frontend_options.step_log = step_log.get();
  if (cluster) frontend_options.tiers = cluster->tiers;
  ChildProcesses spawned;  // --spawn-workers
  Supervisor supervisor(spawned, {.max_restarts = worker_restarts,
                                  .healthy_after_s = worker_healthy_after_s,
                                  .name = "duet serve: worker process"});
  Result<std::unique_ptr<LiveFrontend>> frontend = Status::Error("not started");
  if (processes) {
    backend::serve::WorkerFleet fleet;
    std::string address;
    if (discovery) {
      fleet.directory = std::make_shared<backend::discovery::EtcdWorkerDirectory>(
          backend::discovery::EtcdClient(*discovery));
      std::fprintf(stderr, "duet serve: finding workers in %s\n", discovery->Text().c_str());
    } else {
      auto listener = backend::cluster::Listener::Open(worker_host, worker_port);
      if (!listener) return Fail("--worker-host, --worker-port: " + listener.error());
      const std::string port_text = std::to_string((*listener)->port());
      std::fprintf(stderr, "duet serve: workers register at %s:%s\n", worker_host.c_str(),
                   port_text.c_str());
      // The workers started here reach the listener on this host.
      address =
          (worker_host == "0.0.0.0" ? std::string("127.0.0.1") : worker_host) + ":" + port_text;
      fleet.listener = std::move(*listener);
    }
    // In the environment of the workers it starts (restarts too), never on their command line.
    spawned.SetEnv(backend::cluster::kWorkerSecretEnv, worker_secret);
    if (spawn_workers) {
      for (const deploy::InstanceSpec& spec : cluster->instances) {
        std::vector<std::string> args = {"worker",
                                         "--frontend",
                                         address,
                                         "--role",
                                         policies::ToString(spec.role),
                                         "--model",
                                         model_dir,
                                         "--device",
                                         device,
                                         "--block-tokens",
                                         std::to_string(placement.block_tokens),
                                         "--kv-cache-dtype",
                                         engine.memory.kv_cache_dtype
                                             ? models::TorchDtypeName(*engine.memory.kv_cache_dtype)
                                             : "auto",
                                         "--kv-blocks",
                                         std::to_string(placement.num_blocks),
                                         "--threads",
                                         std::to_string(placement.cpu_threads),
                                         "--kv-transport",
                                         kv_transport_options.transport,
                                         "--ucx-tls",
                                         vm["ucx-tls"].as<std::string>()};
        if (step_log) args.insert(args.end(), {"--step-log", vm["step-log"].as<std::string>()});
        const auto s = spawned.Spawn(args);
        if (!s) return Fail(s.error());
        supervisor.Keep(*s, std::move(args));
      }
    }
    fleet.config = loaded->config;
    fleet.secret = worker_secret;
    fleet.abandon = [&] {
      if (shutdown.received()) return std::string("asked to stop");
      const std::string exited = spawned.Exited();
      return exited.empty() ? exited : "worker " + exited + "; its error is above";
    };
    frontend = LiveFrontend::StartWithWorkers(std::move(fleet), frontend_options);
    layout += ", a worker process each";
  } else {
    frontend = LiveFrontend::Start(std::move(models), frontend_options);
  }
  if (!frontend) return Fail(frontend.error());
  std::unique_ptr<LiveFrontend> live = std::move(*frontend);
  supervisor.Start();  // every worker registered: from now on one that exits is started again

  model->vocab_size = live->model_config().vocab_size;
  model->max_request_tokens = live->max_request_tokens();
  model->created = static_cast<std::int64_t>(std::time(nullptr));
  model->frontend = live.get();
  model->metrics = &metrics;
  const std::string name = model->name;
  (*server)->SetServing(std::move(model));
  std::printf(
      "duet serve: serving %s at %s (%s on %s, %lld KV blocks each, "
      "max_model_len %lld)\n",
      name.c_str(), (*server)->address().c_str(), layout.c_str(), device.c_str(),
      static_cast<long long>(placement.num_blocks),
      static_cast<long long>(live->max_request_tokens()));
  std::fflush(stdout);

  const int signal = shutdown.Wait();
  supervisor.Stop();  // workers the frontend shuts down stay down
  std::fprintf(stderr, "duet serve: %s, draining %lld replies in flight\n",
               signal == SIGTERM ? "SIGTERM" : "SIGINT",
               static_cast<long long>((*server)->replies_in_flight()));
  (*server)->BeginDrain();
  const std::int64_t aborted = live->Drain(drain_timeout_s);
  // The engines are done; let the connections write their last chunks.
  const bool written = (*server)->WaitRepliesDone(10.0);
  (*server)->Stop();
  // After the server's Stop: the frontend's last callbacks only queue work for it.
  const Status stopped = live->Stop();
  live.reset();
  spawned.Reap(10.0);
  server->reset();
  if (aborted > 0)
    std::fprintf(stderr, "duet serve: %lld requests aborted after --drain-timeout\n",
                 static_cast<long long>(aborted));
  if (!written) std::fprintf(stderr, "duet serve: some replies were not fully written\n");
  if (step_log) {
    if (Status s = step_log->Close(); !s.ok()) return Fail("--step-log: " + s.message());
  }
  if (!stopped.ok()) return Fail(stopped.message());
  std::fprintf(stderr, "duet serve: stopped\n");
  return kExitOk;
}

}  // namespace duet::cli
