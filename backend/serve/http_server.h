// The HTTP and WebSocket server of `duet serve` (Boost.Beast over Asio): a few io threads,
// one strand per connection, no thread per connection. OpenAI endpoints (/v1/completions,
// /v1/chat/completions streamed as SSE or whole, /v1/models), /v1/ws (the same replies over
// WebSocket), /health and /metrics; keep-alive and pipelining, request size limits, timeouts
// and connection limits. Its sockets are close-on-exec (worker processes never hold them). It binds
// before the model is loaded (/health answers 503 until SetServing) and drains on request.
// docs/serving.md describes the protocol. Thread-safe: every public method may be called
// from any thread (the signal-watching main thread, typically).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/serve/api.h"
#include "common/status.h"
#include "common/units.h"

namespace duet::backend::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  std::uint16_t port = 8000;       // 0: an ephemeral port (port() says which)
  std::string api_key;  // non-empty: /v1/* needs "Authorization: Bearer <key>" (any case)
  int io_threads = 1;
  std::size_t max_body_bytes = 4u << 20;     // larger bodies: 413
  std::size_t max_header_bytes = 16u << 10;  // larger headers: 431
  Seconds read_timeout_s = 60;               // to receive a request, idle keep-alive time included
  Seconds write_timeout_s = 60;              // one write to a client that does not read
  // Open connections at most, and per client address (0: no per-client limit). A connection
  // past either limit takes the place of the oldest idle one (of that client, for its own
  // limit): one waiting for a request with nothing of it received yet. With none idle it is
  // closed at once.
  int max_connections = 4096;
  int max_connections_per_client = 1024;
};

class HttpServer {
 public:
  // Binds and starts the io threads; every generation endpoint answers 503 until SetServing.
  // Errors: an address that does not parse or cannot be bound.
  static Result<std::unique_ptr<HttpServer>> Start(const ServerOptions& options);
  // Stop(), if not done yet.
  ~HttpServer();

  std::uint16_t port() const;
  std::string address() const;  // "http://127.0.0.1:8000"

  // The model is loaded: serve it. `model` (and the frontend and metrics it points to) must
  // stay alive until Stop() returned.
  void SetServing(std::shared_ptr<const ServedModel> model);
  // Shutting down: /health answers 503, new generation requests 503, connections close after
  // their reply; replies in flight go on.
  void BeginDrain();
  // Blocks until no reply is in flight (every accepted request's last byte written or its
  // client gone) or `timeout_s` passed; true when none is.
  bool WaitRepliesDone(Seconds timeout_s);
  std::int64_t replies_in_flight() const;
  // Closes the listening socket and every connection and joins the io threads. After this no
  // callback of the server runs and nothing calls into the frontend. Shutdown order: Stop(),
  // then destroy the frontend (its last callbacks only queue work for the stopped server),
  // then the server.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace duet::backend::serve
