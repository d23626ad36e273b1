// Fuzz target for `duet serve`'s HTTP server (backend/serve/http_server.h), the whole edge in
// process: a real HttpServer on an ephemeral loopback port, serving the CPU test model through
// a real LiveFrontend, gets each input as the bytes of one connection; the client then
// half-closes and reads until the server closes or a short deadline passes. Whatever the bytes
// (requests pipelined or cut short, any headers, bodies, WebSocket upgrades), every reply must
// start as HTTP/1.x, no reply may stay in flight once the connection is gone, and the server
// must go on answering /health. The sanitizers watch the parser, the session and the handlers.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "backend/cpu/cpu_model.h"
#include "backend/frontend/frontend.h"
#include "backend/model/test_model.h"
#include "backend/serve/api.h"
#include "backend/serve/http_server.h"
#include "backend/serve/live_metrics.h"
#include "backend/tokenizer/chat_template.h"

using namespace duet::backend;
using namespace duet::backend::serve;

namespace {

// The seeds' requests carry this key; others exercise the 401 path.
constexpr const char* kApiKey = "fuzz-key";
constexpr int kReplyDeadlineMs = 2000;      // to read the replies after the half-close
constexpr int kInFlightDeadlineMs = 20000;  // for a request whose client left to end
constexpr std::size_t kMaxReplyBytes = 4u << 20;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "serve_http_fuzz: %s\n", what);
    std::abort();
  }
}

// The server and what it serves; started once, on the first input, and never stopped (the
// fuzzer exits with the process).
struct Served {
  LiveMetrics metrics;
  std::unique_ptr<LiveFrontend> frontend;
  std::unique_ptr<HttpServer> server;
};

Served& Instance() {
  static Served* served = [] {
    auto* s = new Served;
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("duet_serve_http_fuzz_" + std::to_string(::getpid())))
                                .string();
    Check(WriteTestModel(dir, TestModelOptions{}).ok(), "cannot write the test model");
    auto loaded = LoadModelDir(dir);
    Check(loaded.ok(), "cannot load the test model");
    auto tokenizer = Tokenizer::Load(loaded->tokenizer_json_path);
    Check(tokenizer.ok(), "cannot load the test tokenizer");
    auto model = std::make_shared<ServedModel>("tiny", *tokenizer);
    if (auto format = DetectChatFormat(*tokenizer, loaded->tokenizer_config_path); format.ok()) {
      model->chat_format = *format;
      model->chat_stop_token_ids = StopTokenIds(*format, *tokenizer);
    }
    for (std::int64_t id : loaded->config.eos_token_ids)
      model->eos_token_ids.push_back(static_cast<std::int32_t>(id));
    CpuModelOptions cpu;
    cpu.num_blocks = 64;
    cpu.threads = 1;
    auto forward = CpuModel::Create(std::move(*loaded), cpu);
    Check(forward.ok(), "cannot create the CPU model");
    std::filesystem::remove_all(dir);
    std::vector<std::unique_ptr<ForwardModel>> models;
    models.push_back(std::move(*forward));
    FrontendOptions options;
    options.observer = &s->metrics;
    options.max_pending_requests = 64;
    auto frontend = LiveFrontend::Start(std::move(models), options);
    Check(frontend.ok(), "cannot start the frontend");
    s->frontend = std::move(*frontend);
    ServerOptions server_options;
    server_options.port = 0;
    server_options.api_key = kApiKey;
    server_options.read_timeout_s = 2;
    server_options.write_timeout_s = 2;
    server_options.max_body_bytes = 64u << 10;
    auto server = HttpServer::Start(server_options);
    Check(server.ok(), "cannot start the server");
    s->server = std::move(*server);
    model->vocab_size = s->frontend->model_config().vocab_size;
    model->max_request_tokens = s->frontend->max_request_tokens();
    model->frontend = s->frontend.get();
    model->metrics = &s->metrics;
    s->server->SetServing(std::move(model));
    return s;
  }();
  return *served;
}

int Connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Check(fd >= 0, "socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  Check(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0,
        "cannot connect to the server");
  return fd;
}

// Sends `bytes`, half-closes, and reads what comes back until the server closes or
// `deadline_ms` passed. Reading while sending: a server that answers early is not blocked on.
std::string Exchange(std::uint16_t port, std::string_view bytes, int deadline_ms) {
  const int fd = Connect(port);
  std::string reply;
  std::size_t sent = 0;
  bool half_closed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  for (;;) {
    if (sent == bytes.size() && !half_closed) {
      ::shutdown(fd, SHUT_WR);
      half_closed = true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, static_cast<short>(POLLIN | (half_closed ? 0 : POLLOUT)), 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[16384];
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;  // closed or reset
      if (n > 0 && reply.size() < kMaxReplyBytes) reply.append(buffer, static_cast<std::size_t>(n));
    }
    if (!half_closed && (p.revents & POLLOUT)) {
      const ssize_t n =
          ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<std::size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        sent = bytes.size();  // reset by the server: nothing more goes
      }
    }
  }
  // A reset rather than a lingering close: the fuzzer's side keeps no TIME_WAIT.
  linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
  return reply;
}

bool StartsAsHttp(std::string_view reply) {
  return reply.empty() || reply.substr(0, 9) == "HTTP/1.1 " || reply.substr(0, 9) == "HTTP/1.0 ";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Served& served = Instance();
  const std::uint16_t port = served.server->port();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string reply = Exchange(port, input, kReplyDeadlineMs);
  Check(StartsAsHttp(reply), "a reply that is not HTTP/1.x");
  // The connection is gone: its requests end (streams abort at their next write; a whole reply
  // runs to its end, bounded by the model's context).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kInFlightDeadlineMs);
  while (served.server->replies_in_flight() > 0) {
    Check(std::chrono::steady_clock::now() < deadline, "a reply stays in flight");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The server still answers.
  static std::uint64_t runs = 0;
  if (++runs % 64 == 1) {
    const std::string health = Exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 10000);
    Check(health.substr(0, 12) == "HTTP/1.1 200", "/health does not answer 200");
  }
  return 0;
}
