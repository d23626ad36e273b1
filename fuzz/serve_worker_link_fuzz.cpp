// Fuzz target: raw frames into the frontend's worker-link handler (backend/serve/
// frontend_workers.cpp), in process: a real LiveFrontend over a prefill and a decode "worker"
// that are this target's own sockets on loopback, so the bytes reach the real accept loop,
// handshake and per-frame handler. The first byte picks the case:
//   even: the rest is a new connection's first bytes (the hello and its parse, the challenge,
//         the proof and its check), sent while both slots are free;
//   odd:  both workers register properly (they hold the secret), a request is submitted (to
//         the prefill worker), and the rest is one worker's frames after its welcome (engine
//         relay, events, heartbeats and the load's bounds); bit 1 picks prefill or decode.
// Whatever the bytes, the frontend refuses or handles them, never crashes; every input ends
// with both connections closed and the frontend stopped, each wait bounded.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "backend/cluster/connection.h"
#include "backend/cluster/wire.h"
#include "backend/cluster/worker.h"
#include "backend/frontend/frontend.h"

namespace {

using namespace duet;
using namespace duet::backend;

constexpr char kSecret[] = "the fuzz target's worker secret, 32+ bytes";
constexpr int kLayers = 2;
constexpr int kVocab = 300;
constexpr std::int32_t kBlockTokens = 16;
constexpr std::int64_t kBlocks = 64;

class NullListener final : public serve::RequestListener {
 public:
  void OnToken(std::int32_t) override {}
  void OnFinished(const serve::FinishInfo&) override {}
};

// Registers as a worker of `role` holding the secret: its socket once welcomed, else -1.
int Register(const std::string& address, policies::InstanceRole role) {
  auto fd = cluster::ConnectTo(address, 5.0);
  if (!fd.ok()) return -1;
  cluster::Hello hello;
  hello.role = role;
  hello.pid = 1;
  hello.num_layers = kLayers;
  hello.vocab_size = kVocab;
  hello.block_tokens = kBlockTokens;
  hello.max_position_embeddings = 256;
  hello.num_blocks = kBlocks;
  hello.kv_descriptor = role == policies::InstanceRole::kPrefill ? "kv" : "";
  if (cluster::RegisterWorker(*fd, hello, kSecret, 5.0).ok()) return *fd;
  ::close(*fd);
  return -1;
}

void SendAll(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return;  // the frontend closed it (a frame it refused)
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Waits (bounded) until the frontend has let go of slot `instance`.
void WaitDown(serve::LiveFrontend& frontend, int instance) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (frontend.Workers()[static_cast<std::size_t>(instance)].up &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > (1 << 20) + 64) return 0;
  const bool after_welcome = (data[0] & 1) != 0;
  const int target = (data[0] >> 1) & 1;  // 0: the prefill worker, 1: the decode worker
  ++data;
  --size;

  auto listener = cluster::Listener::Open("127.0.0.1", 0);
  DUET_CHECK(listener.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*listener)->port());
  serve::WorkerFleet fleet;
  fleet.listener = std::move(*listener);
  fleet.config.num_hidden_layers = kLayers;
  fleet.config.num_attention_heads = 1;
  fleet.config.num_key_value_heads = 1;
  fleet.config.head_dim = 4;
  fleet.config.vocab_size = kVocab;
  fleet.config.max_position_embeddings = 256;
  fleet.register_timeout_s = 20;
  fleet.handshake_timeout_s = 2;
  fleet.secret = kSecret;
  serve::FrontendOptions options;
  options.engine.block_tokens = kBlockTokens;
  options.roles = {policies::InstanceRole::kPrefill, policies::InstanceRole::kDecode};
  options.router.kind = policies::RouterKind::kRoundRobin;

  int workers[2] = {-1, -1};
  std::thread peer([&] {
    if (!after_welcome) {
      auto raw = cluster::ConnectTo(address, 5.0);
      DUET_CHECK(raw.ok());
      SendAll(*raw, data, size);
      ::shutdown(*raw, SHUT_WR);
      char sink[4096];
      while (::read(*raw, sink, sizeof sink) > 0) {
      }  // until the frontend refuses it (its deadline bounds this)
      ::close(*raw);
    }
    workers[0] = Register(address, policies::InstanceRole::kPrefill);
    workers[1] = Register(address, policies::InstanceRole::kDecode);
  });
  auto frontend = serve::LiveFrontend::StartWithWorkers(std::move(fleet), options);
  peer.join();
  DUET_CHECK(frontend.ok());
  DUET_CHECK(workers[0] >= 0 && workers[1] >= 0);

  if (after_welcome) {
    serve::LiveRequest request;
    request.prompt = {1, 2, 3};
    request.max_tokens = 4;
    (void)(*frontend)->Submit(request, std::make_shared<NullListener>());
    SendAll(workers[target], data, size);
  }
  for (int i : {target, 1 - target}) {
    ::close(workers[i]);
    WaitDown(**frontend, i);
  }
  frontend->reset();
  return 0;
}
