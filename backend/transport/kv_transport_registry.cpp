// The registry of KV transports (see kv_transport_registry.h): with backend/registry.cpp, the
// only file that reads DUET_HAVE_* build flags.
#include "backend/transport/kv_transport_registry.h"

#include <dlfcn.h>

#include <utility>

#include "backend/registry.h"
#if DUET_HAVE_UCX
#include "backend/transport/ucx_kv_transport.h"
#endif

namespace duet::backend {

namespace {

using policies::InstanceId;

KvTransportEntry Loopback() {
  return {.name = "loopback",
          .description = "a copy, between engine threads of one process; KV in host memory",
          .threads = true,
          .processes = false,
          .device = "cpu",
          .create = [](InstanceId self, KvRegion region,
                       const KvTransportOptions&) -> Result<std::unique_ptr<PeerKvTransport>> {
            return std::unique_ptr<PeerKvTransport>(
                std::make_unique<LoopbackKvTransport>(self, region));
          },
          .path = nullptr,
          .allocator = nullptr};
}

#if DUET_HAVE_UCX
KvTransportEntry Ucx() {
  return {
      .name = "ucx",
      .description =
          "RMA gets through UCX (tcp, shared memory, ...: --ucx-tls), between "
          "engine threads or worker processes, across hosts too",
      .threads = true,
      .processes = true,
      .device = "",
      .create = [](InstanceId self, KvRegion region,
                   const KvTransportOptions& options) -> Result<std::unique_ptr<PeerKvTransport>> {
        auto t = UcxKvTransport::Create(self, region, options.ucx_tls);
        if (!t.ok()) return t.status();
        return std::unique_ptr<PeerKvTransport>(std::move(*t));
      },
      .path =
          [](const KvTransportOptions& options) {
            return "ucx:" + (options.ucx_tls.empty() ? std::string("auto") : options.ucx_tls);
          },
      .allocator = [](const KvTransportOptions& options) -> KvAllocator {
        return [tls = options.ucx_tls](std::int64_t bytes) -> Result<std::unique_ptr<KvMemory>> {
          auto memory = UcxKvMemory::Allocate(bytes, tls);
          if (!memory.ok())
            return Status::Error("KV transport (UCX_TLS '" + tls + "'): " + memory.error());
          return std::unique_ptr<KvMemory>(std::move(*memory));
        };
      }};
}
#endif

// Made by the CUDA plugin, which alone links the CUDA runtime.
KvTransportEntry CudaIpc() {
  return {.name = "cuda-ipc",
          .description =
              "copies through CUDA IPC handles, between engine threads or worker "
              "processes of one host; KV in GPU memory",
          .threads = true,
          .processes = true,
          .device = "cuda",
          .create = [](InstanceId self, KvRegion region,
                       const KvTransportOptions&) -> Result<std::unique_ptr<PeerKvTransport>> {
            auto plugin = LoadCudaPlugin();
            if (!plugin) return plugin.status();
            using Create = PeerKvTransport* (*)(int, const KvRegion*, std::string*);
            auto create = reinterpret_cast<Create>(dlsym(*plugin, "DuetCreateCudaIpcKvTransport"));
            if (!create) return Status::Error(std::string("CUDA plugin: ") + dlerror());
            std::string error;
            std::unique_ptr<PeerKvTransport> t(create(self, &region, &error));
            if (!t) return Status::Error(error);
            return t;
          },
          .path = nullptr,
          .allocator = nullptr};
}

struct Registry {
  std::vector<KvTransportEntry> built;
  // Transports Duet has that this build lacks, and why: what asking for one says.
  std::vector<std::pair<std::string, std::string>> absent;
};

const Registry& TheRegistry() {
  static const Registry registry = [] {
    Registry r;
    r.built.push_back(Loopback());
#if DUET_HAVE_UCX
    r.built.push_back(Ucx());
#else
    r.absent.emplace_back("ucx", "this build of Duet has no UCX (see docs/development.md)");
#endif
    if (CudaPluginBuilt()) {
      r.built.push_back(CudaIpc());
    } else {
      r.absent.emplace_back("cuda-ipc",
                            "this build of Duet has no CUDA plugin (configure with nvcc present)");
    }
    return r;
  }();
  return registry;
}

}  // namespace

const std::vector<KvTransportEntry>& KvTransports() { return TheRegistry().built; }

std::string KvTransportNames() {
  std::string names;
  for (const KvTransportEntry& t : KvTransports()) names += (names.empty() ? "" : ", ") + t.name;
  return names;
}

std::string DescribeKvTransports() {
  std::string text;
  for (const KvTransportEntry& t : KvTransports())
    text += (text.empty() ? "" : ", ") + t.name + " (" + t.description + ")";
  return text;
}

Result<const KvTransportEntry*> FindKvTransport(std::string_view name) {
  for (const KvTransportEntry& t : KvTransports()) {
    if (t.name == name) return &t;
  }
  for (const auto& [absent, why] : TheRegistry().absent) {
    if (absent == name) return Status::Error(why);
  }
  return Status::Error("unknown KV transport '" + std::string(name) +
                       "' (this build has: " + KvTransportNames() + ")");
}

Status CheckKvTransportServes(const KvTransportEntry& transport, const KvTransportMode& mode) {
  if (mode.processes && !transport.processes)
    return Status::Error(transport.name + " moves KV within one process: use --workers thread");
  if (!mode.processes && !transport.threads)
    return Status::Error(transport.name +
                         " moves KV between worker processes only: use --workers process");
  if (!transport.device.empty() && transport.device != mode.device) {
    const auto memory = [](const std::string& device) {
      return device == "cuda" ? std::string("GPU memory") : std::string("host memory");
    };
    const std::string backend = mode.device == "cuda" ? "CUDA" : "CPU";
    return Status::Error(transport.name + " moves KV in " + memory(transport.device) +
                         ", and the " + backend + " backend (--device " + mode.device +
                         ") keeps its KV in " + memory(mode.device) + ": use --device " +
                         transport.device);
  }
  return Status::Ok();
}

Result<const KvTransportEntry*> ChooseKvTransport(const std::string& flag, std::string_view value,
                                                  const KvTransportMode& mode) {
  if (value == "auto") {
    for (const KvTransportEntry& t : KvTransports()) {
      if (CheckKvTransportServes(t, mode).ok()) return &t;
    }
    return Status::Error(flag + " auto: no KV transport of this build (" + KvTransportNames() +
                         ") moves KV between " +
                         (mode.processes ? "worker processes" : "engine threads") +
                         " on --device " + mode.device);
  }
  auto found = FindKvTransport(value);
  if (!found) return Status::Error(flag + ": " + found.error());
  if (Status s = CheckKvTransportServes(**found, mode); !s.ok())
    return Status::Error(flag + " " + s.message());
  return *found;
}

KvAllocator KvTransportAllocator(const KvTransportOptions& options) {
  auto found = FindKvTransport(options.transport);
  if (!found || !(*found)->allocator) return nullptr;
  return (*found)->allocator(options);
}

std::string KvTransportPath(const KvTransportEntry& transport, const KvTransportOptions& options) {
  return transport.path ? transport.path(options) : transport.name;
}

}  // namespace duet::backend
