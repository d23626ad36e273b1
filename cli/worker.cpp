// `duet worker`: one instance of a `duet serve` cluster as a process of its own. It loads the
// model, registers with the frontend (`duet serve --cluster ... --workers process` starts
// these itself; an orchestrator or a person may start them by hand, to add or restart one),
// and serves until the frontend shuts it down (exit 0) or is lost (exit 1). docs/serving.md.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "backend/cluster/connection.h"
#include "backend/cluster/link_auth.h"
#include "backend/cluster/worker.h"
#include "backend/discovery/registration.h"
#include "backend/engine/fault_injecting_model.h"
#include "backend/registry.h"
#include "backend/transport/kv_transport_registry.h"
#include "cli/commands.h"
#include "cli/sim_runner.h"
#include "deploy/deployment.h"
#include "deploy/engine_settings.h"

namespace po = boost::program_options;

namespace duet::cli {
namespace {

// The network device the KV's UCX endpoints use: the one holding `advertise`, else the one of
// `listen_host` (discovery), else of the address this host reaches the frontend from, so that peers
// on other hosts reach the address the KV descriptor names. Set as UCX_NET_DEVICES for the whole
// process (before any UCX context: this process is one worker); a user's own UCX_NET_DEVICES stays.
Status ChooseKvDevice(const std::string& frontend, const std::string& advertise,
                      const std::string& listen_host) {
  if (std::getenv("UCX_NET_DEVICES") != nullptr) {
    if (!advertise.empty())
      return Status::Error(
          "--advertise and $UCX_NET_DEVICES both choose the KV's device: give one");
    return Status::Ok();
  }
  auto address = !advertise.empty()     ? Result<std::string>(advertise)
                 : !listen_host.empty() ? Result<std::string>(listen_host)
                                        : backend::cluster::SourceAddressToward(frontend);
  if (!address.ok()) return Status::Error("--frontend: " + address.error());
  auto device = backend::cluster::DeviceOfAddress(*address);
  if (!device.ok())
    return Status::Error((advertise.empty() ? "--listen: " : "--advertise: ") + device.error());
  ::setenv("UCX_NET_DEVICES", device->c_str(), 1);
  std::fprintf(stderr, "duet worker: KV reachable at %s (device %s)\n", address->c_str(),
               device->c_str());
  return Status::Ok();
}

}  // namespace

int Worker(int argc, char** argv) {
  po::options_description opts("duet worker: one prefill, decode or colocated instance");
  const std::string kv_transport_help =
      "PD: how KV moves between this worker and its peers: the transport of duet serve "
      "--kv-transport (this build's: " +
      backend::KvTransportNames() +
      "; duet serve --help describes them), or auto (the first that serves worker processes "
      "on --device)";
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("frontend", po::value<std::string>(),
     "host:port where the frontend takes workers (duet serve --worker-host, --worker-port)")
    ("discovery", po::value<std::string>(),
     "etcd://HOST:PORT: instead of --frontend, register there and wait for a frontend that "
     "finds this worker (duet serve --discovery) to connect to --listen")
    ("listen", po::value<std::string>(),
     "--discovery: HOST:PORT where frontends connect (an IPv4 address of this host that they "
     "reach; port 0: any free one)")
    ("discovery-ttl", po::value<int>()->default_value(5),
     "--discovery: seconds the registration outlives this worker's last renewal (1..3600)")
    ("role", po::value<std::string>()->required(), "prefill, decode or colocated")
    ("model", po::value<std::string>()->required(),
     "Hugging Face model directory (the frontend's model)")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu or cuda")
    ("block-tokens", po::value<int>()->default_value(16),
     "tokens per KV block (the frontend's engine.block_tokens)")
    ("kv-cache-dtype", po::value<std::string>()->default_value("auto"),
     "the KV cache's dtype: auto (the model's), bfloat16, float16 or float32 (the frontend's "
     "engine.kv_cache_dtype)")
    ("kv-blocks", po::value<std::int64_t>()->default_value(0),
     "KV cache blocks (0: 16 full contexts within 4 GiB)")
    ("threads", po::value<int>()->default_value(0), "CPU threads (0: every hardware thread)")
    ("kv-transport", po::value<std::string>()->default_value("auto"), kv_transport_help.c_str())
    ("ucx-tls", po::value<std::string>()->default_value(""),
     "PD: the UCX transports for KV (UCX_TLS: tcp, posix,cma, ...; empty: UCX's choice)")
    ("advertise", po::value<std::string>(),
     "PD: the IPv4 address of this host where other workers reach its KV (its network device "
     "carries the KV; default: the address this host reaches the frontend from, or --listen's)")
    ("worker-secret-file", po::value<std::string>(),
     "a file holding the secret shared with the frontend (duet serve --worker-secret-file; "
     "default: $DUET_WORKER_SECRET, which duet serve sets for the workers it starts)")
    ("connect-timeout", po::value<double>()->default_value(60.0),
     "seconds to reach the frontend and be welcomed")
    ("step-log", po::value<std::string>(),
     "append every engine step (shape, forward-pass and iteration time) to FILE as JSON lines");
  // clang-format on
  po::variables_map vm;
  int code = 0;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;

  backend::cluster::WorkerOptions options;
  if (vm.count("frontend") == vm.count("discovery"))
    return Fail("give --frontend HOST:PORT or --discovery etcd://HOST:PORT (with --listen)",
                kExitUsage);
  std::optional<backend::discovery::EtcdEndpoint> etcd;
  std::string listen_host;
  int listen_port = 0;
  const int ttl_s = vm["discovery-ttl"].as<int>();
  if (vm.count("discovery")) {
    auto parsed = backend::discovery::ParseEtcdUrl(vm["discovery"].as<std::string>());
    if (!parsed) return Fail("--discovery: " + parsed.error(), kExitUsage);
    etcd = *parsed;
    if (!vm.count("listen")) return Fail("--discovery needs --listen HOST:PORT", kExitUsage);
    auto listen = backend::cluster::ParseHostPort(vm["listen"].as<std::string>(), 0);
    if (!listen) return Fail("--listen: " + listen.error(), kExitUsage);
    if (listen->host == "0.0.0.0")
      return Fail("--listen: '0.0.0.0' is not an IPv4 address of this host that frontends reach",
                  kExitUsage);
    listen_host = listen->host;
    listen_port = listen->port;
    if (ttl_s < 1 || ttl_s > 3600) return Fail("--discovery-ttl must be in 1..3600", kExitUsage);
  } else {
    options.frontend = vm["frontend"].as<std::string>();
  }
  const std::string role = vm["role"].as<std::string>();
  auto parsed_role = deploy::ParseInstanceRole(role);
  if (!parsed_role) return Fail("--role " + parsed_role.error(), kExitUsage);
  options.role = *parsed_role;
  const std::string device = vm["device"].as<std::string>();
  if (device != "cpu" && device != "cuda") return Fail("--device must be cpu or cuda", kExitUsage);
  // The bounds of the engine settings (a cluster file's, which duet serve hands on).
  auto engine = deploy::ParseEngineSettings({{"block_tokens", vm["block-tokens"].as<int>()}},
                                            "--block-tokens");
  if (!engine) return Fail(engine.error(), kExitUsage);
  engine = deploy::ParseEngineSettings({{"kv_cache_dtype", vm["kv-cache-dtype"].as<std::string>()}},
                                       "--kv-cache-dtype", *engine);
  if (!engine) return Fail(engine.error(), kExitUsage);
  const auto block_tokens = static_cast<std::int32_t>(engine->block_tokens);
  const std::int64_t kv_blocks = vm["kv-blocks"].as<std::int64_t>();
  if (kv_blocks < 0) return Fail("--kv-blocks must be >= 0", kExitUsage);
  const int threads = vm["threads"].as<int>();
  if (Status s = CheckThreadsFlag(threads); !s.ok()) return Fail(s.message(), kExitUsage);
  options.connect_timeout_s = vm["connect-timeout"].as<double>();
  if (!(options.connect_timeout_s > 0) || options.connect_timeout_s > 86400)
    return Fail("--connect-timeout must be in (0, 86400]", kExitUsage);
  if (options.role != policies::InstanceRole::kColocated) {
    auto transport =
        backend::ChooseKvTransport("--kv-transport", vm["kv-transport"].as<std::string>(),
                                   {.processes = true, .device = device});
    if (!transport) return Fail(transport.error(), kExitUsage);
    options.kv_transport.transport = (*transport)->name;
    options.kv_transport.ucx_tls = vm["ucx-tls"].as<std::string>();
  }

  if (options.role != policies::InstanceRole::kColocated) {
    if (Status s = ChooseKvDevice(options.frontend,
                                  vm.count("advertise") ? vm["advertise"].as<std::string>() : "",
                                  listen_host);
        !s.ok())
      return Fail(s.message(), kExitUsage);
  }

  auto secret = backend::cluster::LoadWorkerSecret(
      vm.count("worker-secret-file") ? vm["worker-secret-file"].as<std::string>() : "");
  if (!secret) return Fail("--worker-secret-file: " + secret.error(), kExitUsage);
  if (secret->empty()) {
    return Fail(std::string("the frontend takes only workers holding its secret: give it with "
                            "--worker-secret-file FILE or $") +
                    backend::cluster::kWorkerSecretEnv,
                kExitUsage);
  }
  options.secret = std::move(*secret);

  // Discovery: listen now (a busy port fails before the model loads); register once warm, and
  // wait there for a frontend to connect.
  std::unique_ptr<backend::cluster::Listener> listener;
  std::unique_ptr<backend::discovery::WorkerRegistration> registration;
  if (etcd) {
    auto opened = backend::cluster::Listener::Open(listen_host, listen_port);
    if (!opened) return Fail("--listen: " + opened.error());
    listener = std::move(*opened);
    const std::string address = listen_host + ":" + std::to_string(listener->port());
    // Called for every frontend (and again after a connection that was none): the
    // registration stays.
    options.await_frontend = [&, address, role](Seconds timeout_s) -> Result<int> {
      if (!registration) {
        registration = std::make_unique<backend::discovery::WorkerRegistration>(
            backend::discovery::EtcdClient(*etcd),
            backend::discovery::WorkerRecord{role, address, ::getpid(), ttl_s});
        std::fprintf(stderr, "duet worker: registering in %s as %s; waiting for frontends at %s\n",
                     etcd->Text().c_str(), registration->key().c_str(), address.c_str());
      }
      return listener->Accept(timeout_s);
    };
    // It serves every frontend that finds it until SIGTERM or SIGINT.
    CatchStopSignals();
    options.stop_requested = [] { return StopRequested(); };
  }

  std::unique_ptr<backend::StepLog> step_log;
  if (vm.count("step-log")) {
    auto opened =
        backend::StepLog::Open(vm["step-log"].as<std::string>(), backend::StepLog::Mode::kAppend);
    if (!opened) return Fail("--step-log: " + opened.error());
    step_log = std::move(*opened);
    options.step_log = step_log.get();
  }

  auto loaded = backend::LoadModelDir(vm["model"].as<std::string>());
  if (!loaded) return Fail(loaded.error());
  backend::ModelPlacement placement;
  placement.device = device;
  placement.block_tokens = block_tokens;
  placement.num_blocks = kv_blocks > 0 ? kv_blocks : DefaultKvBlocks(loaded->config, block_tokens);
  placement.cpu_threads = threads;
  placement.kv_cache_dtype = engine->memory.kv_cache_dtype;
  // A prefill worker's KV goes where decode workers read it fastest (UCX's shared memory);
  // a decode worker pulls into the heap.
  if (options.role == policies::InstanceRole::kPrefill)
    placement.kv_allocator = backend::KvTransportAllocator(options.kv_transport);
  auto model = backend::CreateForwardModel(std::move(*loaded), placement);
  if (!model) return Fail("--device " + device + ": " + model.error());

  const Status s = backend::cluster::RunWorker(
      backend::InjectForwardFaultsFromEnvironment(std::move(*model)), options);
  if (!s.ok()) return Fail("worker: " + s.message());
  if (step_log) {
    if (Status closed = step_log->Close(); !closed.ok())
      return Fail("--step-log: " + closed.message());
  }
  std::fprintf(stderr,
               etcd ? "duet worker: stopped\n" : "duet worker: shut down by the frontend\n");
  return kExitOk;
}

}  // namespace duet::cli
