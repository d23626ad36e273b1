// The registry of KV transports: the one place that knows which transports this build has and
// what each can serve. Every command that moves KV between instances (`duet serve`,
// `duet worker`, `duet calibrate --transport`) chooses among them by name, and makes its sides
// through the entry's factory. loopback is always there; ucx where this build has UCX; cuda-ipc
// where it made the CUDA plugin (which is loaded when a side is made, not to list it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/transport/kv_transport.h"
#include "common/status.h"

namespace duet::backend {

struct KvTransportOptions {
  std::string transport = "loopback";  // a registered name
  std::string ucx_tls;  // UCX_TLS for every instance ("tcp", "posix,cma", ...); empty: UCX's
  // Tests: wraps each decode instance's transport (fault injection); null: none.
  std::function<std::unique_ptr<policies::KvTransport>(policies::KvTransport& inner,
                                                       policies::InstanceId instance)>
      wrap;
};

struct KvTransportEntry {
  std::string name;
  std::string description;  // a phrase, for --help
  // The process models it serves: instances that are engine threads of one process, instances
  // that are worker processes (of one host, for cuda-ipc).
  bool threads = false;
  bool processes = false;
  // The device whose KV it moves ("cpu": host memory, "cuda": device memory); empty: either.
  std::string device;
  // `self`'s side over its KV region.
  std::function<Result<std::unique_ptr<PeerKvTransport>>(policies::InstanceId self, KvRegion region,
                                                         const KvTransportOptions& options)>
      create;
  // What it goes over, for logs and calibration profiles ("ucx:tcp"); null: the name.
  std::function<std::string(const KvTransportOptions& options)> path;
  // Where a model pulled from should keep its KV (ModelPlacement::kv_allocator: UCX's own
  // memory, which peers on this host copy from directly); null: the model's own.
  std::function<KvAllocator(const KvTransportOptions& options)> allocator;
};

// This build's transports, in the order `auto` tries them.
const std::vector<KvTransportEntry>& KvTransports();
// "loopback, ucx, cuda-ipc": the names, for messages and --help.
std::string KvTransportNames();
// "name (description), ...": the transports, for --help.
std::string DescribeKvTransports();

// The transport of that name. Errors: a transport this build lacks (saying why), or an unknown
// name ("unknown KV transport 'x' (this build has: ...)").
Result<const KvTransportEntry*> FindKvTransport(std::string_view name);

// What a command runs: instances as engine threads or worker processes, on a device.
struct KvTransportMode {
  bool processes = false;
  std::string device = "cpu";
};
// Why `transport` cannot serve `mode` ("loopback moves KV within one process: use --workers
// thread"), or OK.
Status CheckKvTransportServes(const KvTransportEntry& transport, const KvTransportMode& mode);
// What a command's flag (`flag`, "--kv-transport") names: a transport that serves `mode`, or for
// "auto" the first that does. Errors start with the flag: "--kv-transport: unknown KV transport
// 'x' (this build has: ...)", "--kv-transport loopback moves KV within one process: ...",
// "--kv-transport auto: no KV transport of this build ...".
Result<const KvTransportEntry*> ChooseKvTransport(const std::string& flag, std::string_view value,
                                                  const KvTransportMode& mode);

// The options' transport's allocator for a model pulled from; null for an unknown transport
// or one without.
KvAllocator KvTransportAllocator(const KvTransportOptions& options);
// The entry's path for these options.
std::string KvTransportPath(const KvTransportEntry& transport, const KvTransportOptions& options);

}  // namespace duet::backend
