// HttpServer on Boost.Beast: an acceptor, one HttpSession per connection (keep-alive and
// pipelining, limits, timeouts, SSE streaming with chunked transfer encoding, close-delimited
// for HTTP/1.0), upgraded to a WsSession on /v1/ws. Each connection runs on its own strand;
// engine callbacks reach it only through GenerationCall's posted pumps. A pending read during
// generation notices a client that goes away, which aborts its request in the engine. The
// connections are counted per client address; idle ones make way for new ones at the limits.
#include "backend/serve/http_server.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <thread>
#include <unordered_map>

#include "backend/cluster/link_auth.h"

namespace duet::backend::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

enum class Phase { kLoading, kServing, kDraining };

std::chrono::steady_clock::duration ToDuration(Seconds s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// The target's path, without the query string.
std::string PathOf(beast::string_view target) {
  const auto q = target.find('?');
  return std::string(target.substr(0, q));
}

constexpr Seconds kLingerS = 2;                   // reading what a refused client still sends
constexpr std::size_t kLingerBytes = 64u << 20;   // ... at most this much
constexpr std::size_t kMaxQueuedWsRequests = 16;  // requests waiting behind the current one
constexpr std::size_t kReadBytes = 16u << 10;     // one read from a connection, at most
// What a client may send ahead of its reply (pipelined requests) before the connection is left
// unread until the reply is out.
constexpr std::size_t kMaxReadAheadBytes = 64u << 10;

// Worker processes must not inherit the server's sockets (a child holding a client's socket
// keeps it from seeing its connection close). Forks racing this are covered by the children
// closing what they inherit.
void SetCloseOnExec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  std::unique_ptr<net::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<Phase> phase{Phase::kLoading};
  std::atomic<bool> stopped{false};
  std::uint16_t port = 0;
  std::string host;

  mutable std::mutex model_mutex;
  std::shared_ptr<const ServedModel> model;

  // Open connections, counted per client address; the idle ones (waiting for a request with
  // nothing of it received) in the order they became idle, the oldest first.
  struct Connection {
    std::string client;
    bool counted = true;  // false once evicted: no longer counted against the limits
    bool idle = false;
    std::list<std::shared_ptr<Connection>>::iterator idle_at;
    std::function<void()> evict;  // posts the close onto the connection's strand
  };
  std::mutex connections_mutex;
  int open_connections = 0;
  std::unordered_map<std::string, int> client_connections;
  std::list<std::shared_ptr<Connection>> idle_connections;

  std::mutex replies_mutex;
  std::condition_variable replies_cv;
  std::int64_t replies = 0;  // accepted generation requests whose reply is not fully written

  std::shared_ptr<const ServedModel> Model() const {
    std::lock_guard<std::mutex> lock(model_mutex);
    return model;
  }
  // "Authorization: Bearer KEY", the scheme in any case (RFC 9110 11.1), the key compared in
  // a time that does not depend on where it differs.
  bool Authorized(const http::request<http::string_body>& req) const {
    if (options.api_key.empty()) return true;
    beast::string_view header = req[http::field::authorization];
    const auto space = header.find(' ');
    if (space == beast::string_view::npos || !beast::iequals(header.substr(0, space), "bearer"))
      return false;
    beast::string_view key = header.substr(space + 1);
    while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.remove_prefix(1);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    return cluster::ConstantTimeEquals(options.api_key, std::string_view(key.data(), key.size()));
  }
  // A new connection from `client`: counted, or nullptr when it must be refused. Past a limit
  // it takes the place of the oldest idle connection, whose close is added to `evictions`.
  std::shared_ptr<Connection> Admit(const std::string& client,
                                    std::vector<std::function<void()>>* evictions);
  void Release(Connection* connection);
  void Uncount(Connection& connection);  // under connections_mutex
  void SetIdle(const std::shared_ptr<Connection>& connection, bool idle);
  void Accept();
  void StopNow();
  ~Impl() {
    StopNow();
    acceptor.reset();
    ioc.reset();  // destroys the sessions still queued in it while the rest is alive
  }
};

namespace {

using Impl = HttpServer::Impl;

// Counts one accepted reply until its last byte is written (or its client is gone).
class ReplyGuard {
 public:
  explicit ReplyGuard(Impl* server) : server_(server) {
    std::lock_guard<std::mutex> lock(server_->replies_mutex);
    ++server_->replies;
  }
  ~ReplyGuard() {
    std::lock_guard<std::mutex> lock(server_->replies_mutex);
    if (--server_->replies == 0) server_->replies_cv.notify_all();
  }
  ReplyGuard(const ReplyGuard&) = delete;
  ReplyGuard& operator=(const ReplyGuard&) = delete;

 private:
  Impl* server_;
};

// One open connection's place in the server's count (moves from the HTTP session to its
// WebSocket session).
class ConnectionSlot {
 public:
  ConnectionSlot(Impl* server, std::shared_ptr<Impl::Connection> connection)
      : server_(server), connection_(std::move(connection)) {}
  ConnectionSlot(ConnectionSlot&& other) noexcept
      : server_(std::exchange(other.server_, nullptr)), connection_(std::move(other.connection_)) {}
  ConnectionSlot& operator=(ConnectionSlot&&) = delete;
  ~ConnectionSlot() {
    if (server_) server_->Release(connection_.get());
  }
  // Waiting for a request with nothing of it received: the first to go when a new connection
  // needs the place.
  void SetIdle(bool idle) {
    if (server_) server_->SetIdle(connection_, idle);
  }
  Impl::Connection& connection() { return *connection_; }

 private:
  Impl* server_;
  std::shared_ptr<Impl::Connection> connection_;
};

ApiError Unavailable(const std::string& message, const char* code) {
  return ApiError{503, message, "service_unavailable", "", code};
}

// ---------------------------------------------------------------------------------------------
// WebSocket: one JSON request per text message, its reply parts as text messages, "[DONE]"
// last. Requests on one connection are served one after another.
class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(beast::tcp_stream&& stream, Impl* server, ConnectionSlot slot)
      : ws_(std::move(stream)), server_(server), slot_(std::move(slot)) {}

  void Run(http::request<http::string_body> upgrade) {
    upgrade_ = std::move(upgrade);
    beast::get_lowest_layer(ws_).expires_never();  // the websocket's own timeouts take over
    websocket::stream_base::timeout timeouts =
        websocket::stream_base::timeout::suggested(beast::role_type::server);
    ws_.set_option(timeouts);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "duet"); }));
    ws_.read_message_max(server_->options.max_body_bytes);
    ws_.async_accept(upgrade_, beast::bind_front_handler(&WsSession::OnAccept, shared_from_this()));
  }

 private:
  struct Outgoing {
    std::string text;
    bool ends_reply = false;  // written: the reply's guard is released
  };

  void OnAccept(beast::error_code ec) {
    if (ec) return;
    upgrade_ = {};
    Read();
  }

  void Read() {
    ws_.async_read(rbuf_, beast::bind_front_handler(&WsSession::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, std::size_t) {
    if (ec) {  // closed by the client, a timeout, or a protocol error: stop its request
      closed_ = true;
      if (call_) call_->Cancel();
      call_.reset();
      return;
    }
    std::string message = beast::buffers_to_string(rbuf_.data());
    rbuf_.consume(rbuf_.size());
    if (!ws_.got_text()) {
      SendError(BadRequest("send requests as text messages holding JSON"));
    } else if (queued_.size() >= kMaxQueuedWsRequests) {
      ApiError e{429,
                 "more than " + std::to_string(kMaxQueuedWsRequests) +
                     " requests are waiting on this connection; wait for [DONE]",
                 "rate_limit_error", "", "rate_limit_exceeded"};
      SendError(e);
    } else {
      queued_.push_back({std::move(message), std::chrono::steady_clock::now()});
      ServeNext();
    }
    Read();
  }

  void ServeNext() {
    while (!call_ && !queued_.empty() && !closed_) {
      Queued next = std::move(queued_.front());
      queued_.pop_front();
      if (auto error = StartRequest(next.message, next.received)) SendError(*error);
    }
    MaybeCloseForDrain();
  }

  // Starts one request; an error when it was refused.
  std::optional<ApiError> StartRequest(const std::string& message,
                                       std::chrono::steady_clock::time_point received) {
    const json body = json::parse(message, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return BadRequest("the message is not valid JSON");
    if (!body.is_object()) return BadRequest("the message must be a JSON object");
    Endpoint endpoint;
    const auto it = body.find("endpoint");
    if (it == body.end() || !it->is_string())
      return BadRequest("'endpoint' must be \"/v1/completions\" or \"/v1/chat/completions\"",
                        "endpoint");
    if (*it == "/v1/completions") {
      endpoint = Endpoint::kCompletions;
    } else if (*it == "/v1/chat/completions") {
      endpoint = Endpoint::kChatCompletions;
    } else {
      return NotFound("unknown endpoint " + DumpJson(*it) +
                          " (\"/v1/completions\" or \"/v1/chat/completions\")",
                      "endpoint");
    }
    auto model = server_->Model();
    if (!model) return Unavailable("the model is still loading", "model_loading");
    if (server_->phase == Phase::kDraining)
      return Unavailable("the server is shutting down", "server_draining");
    GenerationParams params;
    if (auto error = ParseGenerationRequest(endpoint, body, &params, {"endpoint"})) return error;
    if (!params.stream_given) params.stream = true;  // WebSocket replies stream by default
    auto post = [ex = ws_.get_executor()](std::function<void()> task) {
      net::post(ex, std::move(task));
    };
    auto deliver = [weak = weak_from_this()](ReplyPart part) {
      if (auto self = weak.lock()) self->OnPart(std::move(part));
    };
    guards_.push_back(std::make_unique<ReplyGuard>(server_));
    auto started = GenerationCall::Start(params, std::move(model), post, deliver, received);
    if (auto* error = std::get_if<ApiError>(&started)) {
      guards_.pop_back();
      return *error;
    }
    call_ = std::get<std::shared_ptr<GenerationCall>>(std::move(started));
    return std::nullopt;
  }

  void OnPart(ReplyPart part) {
    if (closed_) return;
    if (!part.last) {
      Send(std::move(part.payload));
      return;
    }
    if (part.done_marker) {
      Send(std::move(part.payload), /*ends_reply=*/true);
    } else {
      Send(std::move(part.payload));
      Send(std::string(kDone), /*ends_reply=*/true);
    }
    call_.reset();
    ServeNext();
  }

  void SendError(const ApiError& error) {
    LogRequestError(error.http_status, "WS", "/v1/ws", error.message);
    json body = ErrorJson(error);
    body["status"] = error.http_status;
    Send(DumpJson(body));
    Send(std::string(kDone));
  }

  void Send(std::string text, bool ends_reply = false) {
    outgoing_.push_back({std::move(text), ends_reply});
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (closed_ || outgoing_.empty()) return;
    writing_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(outgoing_.front().text),
                    beast::bind_front_handler(&WsSession::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, std::size_t) {
    writing_ = false;
    if (ec) {
      closed_ = true;
      if (call_) call_->Cancel();
      call_.reset();
      guards_.clear();
      return;
    }
    if (outgoing_.front().ends_reply && !guards_.empty()) guards_.pop_front();
    outgoing_.pop_front();
    if (!outgoing_.empty()) {
      WriteNext();
    } else {
      MaybeCloseForDrain();
    }
  }

  // While draining, an idle connection is closed ("going away") once its replies are out.
  void MaybeCloseForDrain() {
    if (server_->phase != Phase::kDraining || call_ || !queued_.empty() || writing_ ||
        !outgoing_.empty() || closed_ || closing_)
      return;
    closing_ = true;
    ws_.async_close(websocket::close_code::going_away,
                    [self = shared_from_this()](beast::error_code) {});
  }

  websocket::stream<beast::tcp_stream> ws_;
  Impl* server_;
  ConnectionSlot slot_;
  http::request<http::string_body> upgrade_;
  beast::flat_buffer rbuf_;
  struct Queued {
    std::string message;
    std::chrono::steady_clock::time_point received;  // when it was read
  };
  std::deque<Queued> queued_;
  std::deque<Outgoing> outgoing_;
  std::deque<std::unique_ptr<ReplyGuard>> guards_;
  std::shared_ptr<GenerationCall> call_;
  bool writing_ = false;
  bool closed_ = false;
  bool closing_ = false;
};

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 (and 1.0): requests one after another on a keep-alive connection, answered in
// order (pipelined ones after the reply in progress, RFC 9112 9.3.2). While a request
// generates, a read stays pending on the socket: an error there means the client is gone (its
// request is aborted); bytes are what it sent ahead (a pipelined request, a stray empty line),
// kept for the parser up to kMaxReadAheadBytes, past which the connection is not read until
// the reply is out (TCP backpressure). End of file there is a half-close: the replies still go
// out, then the connection closes.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, Impl* server, std::shared_ptr<Impl::Connection> connection)
      : stream_(std::move(socket)),
        server_(server),
        slot_(server, std::move(connection)),
        hold_(stream_.get_executor()) {}

  void Run() {
    // The server evicts an idle connection from any thread: through its strand.
    slot_.connection().evict = [weak = weak_from_this(), ex = stream_.get_executor()] {
      net::post(ex, [weak] {
        if (auto self = weak.lock()) self->OnEvicted();
      });
    };
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&HttpSession::ReadRequest, shared_from_this()));
  }

 private:
  using Request = http::request<http::string_body>;
  // What a cancelled watch read does when it completes.
  enum class AfterWatch { kNothing, kReadRequest, kLinger };

  // The next request, from what was read ahead and what comes, in --read-timeout.
  void ReadRequest() {
    if (closed_) return;
    stream_.expires_after(ToDuration(server_->options.read_timeout_s));
    AwaitRequest();
  }

  // Empty lines before a request line are ignored (RFC 9112 2.2). With nothing of a request
  // received the connection is idle: the first to go when the server needs its place.
  void AwaitRequest() {
    SkipEmptyLines();
    if (buffer_.size() == 0) {
      if (peer_done_) return Close();  // half-closed, and every reply is out
      idle_ = true;
      slot_.SetIdle(true);
      stream_.async_read_some(
          buffer_.prepare(kReadBytes),
          beast::bind_front_handler(&HttpSession::OnRequestBytes, shared_from_this()));
      return;
    }
    method_.clear();
    target_.clear();
    head_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options.max_header_bytes));
    parser_->body_limit(server_->options.max_body_bytes);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&HttpSession::OnHeader, shared_from_this()));
  }

  void OnRequestBytes(beast::error_code ec, std::size_t n) {
    idle_ = false;
    slot_.SetIdle(false);
    buffer_.commit(n);
    if (ec) return OnReadError(ec);
    AwaitRequest();
  }

  void SkipEmptyLines() {
    const auto data = buffer_.data();
    const char* bytes = static_cast<const char*>(data.data());
    std::size_t n = 0;
    while (n < data.size() && (bytes[n] == '\r' || bytes[n] == '\n')) ++n;
    buffer_.consume(n);
  }

  // Another connection needed this one's place (Impl::Admit).
  void OnEvicted() {
    if (idle_) Close();  // else a request started meanwhile: it is served, uncounted
  }

  void OnHeader(beast::error_code ec, std::size_t) {
    if (ec) return OnReadError(ec);
    received_ = std::chrono::steady_clock::now();
    const Request& req = parser_->get();
    method_ = std::string(req.method_string());
    target_ = std::string(req.target());
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    head_ = req.method() == http::verb::head;
    if (auto error = CheckFraming(req)) {
      keep_alive_ = false;
      return RespondError(*error, /*close=*/true);
    }
    // HTTP/1.0 with Transfer-Encoding: framing that may be faulty; close after it (RFC 9112 6.1).
    if (version_ < 11 && req.count(http::field::transfer_encoding) > 0) keep_alive_ = false;
    if (const auto length = parser_->content_length();
        length && *length > server_->options.max_body_bytes) {
      return RespondTooLarge();
    }
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont =
          std::make_shared<http::response<http::empty_body>>(http::status::continue_, version_);
      http::async_write(stream_, *cont,
                        [self = shared_from_this(), cont](beast::error_code ec, std::size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  // A body whose end a proxy in front could see elsewhere than this parser (request smuggling)
  // is refused, and the connection closed: a transfer coding other than exactly "chunked", or
  // Transfer-Encoding with Content-Length (RFC 9112 6.1, 6.3).
  static std::optional<ApiError> CheckFraming(const Request& req) {
    const std::size_t codings = req.count(http::field::transfer_encoding);
    if (codings == 0) return std::nullopt;
    beast::string_view coding = req[http::field::transfer_encoding];
    while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t'))
      coding.remove_prefix(1);
    while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t'))
      coding.remove_suffix(1);
    if (codings > 1 || !beast::iequals(coding, "chunked"))
      return BadRequest("Transfer-Encoding other than chunked is not supported");
    if (req.count(http::field::content_length) > 0)
      return BadRequest("a request may not have both Transfer-Encoding and Content-Length");
    return std::nullopt;
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::OnRead, shared_from_this()));
  }

  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) return RespondTooLarge();
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return RespondError(ApiError{431,
                                   "the request headers exceed " +
                                       std::to_string(server_->options.max_header_bytes) + " bytes",
                                   "invalid_request_error", "", "headers_too_large"},
                          /*close=*/true);
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return Close();
    // A malformed request line or header: answer once, then close (the stream is unusable).
    if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
      keep_alive_ = false;
      if (method_.empty()) method_ = "?";
      return RespondError(BadRequest("malformed HTTP request: " + ec.message()), true);
    }
    Close();
  }

  void RespondTooLarge() {
    keep_alive_ = false;
    RespondError(ApiError{413,
                          "the request body exceeds " +
                              std::to_string(server_->options.max_body_bytes) + " bytes",
                          "invalid_request_error", "", "request_too_large"},
                 /*close=*/true);
  }

  void OnRead(beast::error_code ec, std::size_t) {
    if (ec) return OnReadError(ec);
    Handle();
  }

  void Handle() {
    Request& req = parser_->get();
    const std::string path = PathOf(req.target());
    if (websocket::is_upgrade(req)) {
      if (path != "/v1/ws") return RespondError(NotFound("no WebSocket endpoint at " + path));
      if (!server_->Authorized(req)) return RespondUnauthorized();
      auto ws = std::make_shared<WsSession>(std::move(stream_), server_, std::move(slot_));
      closed_ = true;  // this session is done; the socket belongs to the WebSocket now
      ws->Run(parser_->release());
      return;
    }
    struct Route {
      const char* path;
      http::verb verb;
    };
    static const Route kRoutes[] = {{"/health", http::verb::get},
                                    {"/metrics", http::verb::get},
                                    {"/v1/models", http::verb::get},
                                    {"/v1/completions", http::verb::post},
                                    {"/v1/chat/completions", http::verb::post},
                                    {"/v1/ws", http::verb::get}};
    const Route* route = nullptr;
    for (const Route& r : kRoutes)
      if (path == r.path) route = &r;
    if (!route) return RespondError(NotFound("no endpoint at " + path));
    // HEAD is GET without the body (RFC 9110 9.3.2).
    const bool get = route->verb == http::verb::get;
    if (req.method() != route->verb && !(get && head_)) {
      const std::string allowed = get ? "GET, HEAD" : std::string(http::to_string(route->verb));
      ApiError e{405,
                 std::string(req.method_string()) + " is not allowed on " + path + " (use " +
                     allowed + ")",
                 "invalid_request_error", "", "method_not_allowed"};
      allow_ = allowed;
      return RespondError(e);
    }
    if (path == "/health") return Health(req);
    auto model = server_->Model();
    if (path == "/metrics") {
      if (!model) return RespondError(Unavailable("the model is still loading", "model_loading"));
      return Respond(http::status::ok, model->metrics->Scrape(model->frontend->Stats()),
                     "text/plain; version=0.0.4; charset=utf-8");
    }
    if (!server_->Authorized(req)) return RespondUnauthorized();
    if (path == "/v1/ws")
      return RespondError(BadRequest("/v1/ws takes a WebSocket upgrade request"));
    if (!model) return RespondError(Unavailable("the model is still loading", "model_loading"));
    if (path == "/v1/models") return Respond(http::status::ok, ModelsJson(*model));
    Generate(path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions,
             std::move(model));
  }

  // 200 while serving with a worker of every role up: an empty body, or with worker processes
  // the list of them. 503 while loading, draining, or while a role has no worker up (the body
  // names the roles). Worker PIDs only to a request with the API key, when one is set.
  void Health(const Request& req) {
    if (server_->phase != Phase::kServing) {
      return RespondError(server_->phase == Phase::kDraining
                              ? Unavailable("the server is shutting down", "server_draining")
                              : Unavailable("the model is still loading", "model_loading"),
                          false, /*log=*/false);
    }
    auto serving = server_->Model();
    const auto workers = serving ? serving->frontend->Workers() : std::vector<WorkerStatus>{};
    if (workers.empty()) return Respond(http::status::ok, "", "text/plain");
    const bool pids = server_->Authorized(req);
    json list = json::array();
    std::vector<policies::InstanceRole> roles, roles_up;
    for (const WorkerStatus& w : workers) {
      json entry = {{"instance", w.instance},
                    {"role", policies::ToString(w.role)},
                    {"up", w.up},
                    {"joins", w.joins}};
      if (pids) entry["pid"] = w.pid;
      if (w.clock_error_s) {
        entry["clock_offset_s"] = *w.clock_offset_s;
        entry["clock_error_s"] = *w.clock_error_s;
      }
      list.push_back(std::move(entry));
      roles.push_back(w.role);
      if (w.up) roles_up.push_back(w.role);
    }
    std::string down;  // the roles with no worker up
    for (policies::InstanceRole role :
         {policies::InstanceRole::kPrefill, policies::InstanceRole::kDecode,
          policies::InstanceRole::kColocated}) {
      const auto has = [role](const std::vector<policies::InstanceRole>& v) {
        return std::find(v.begin(), v.end(), role) != v.end();
      };
      if (has(roles) && !has(roles_up))
        down += std::string(down.empty() ? "" : " or ") + policies::ToString(role);
    }
    if (down.empty()) {
      return Respond(http::status::ok, json{{"workers", list}}.dump(), "application/json");
    }
    json body = ErrorJson(Unavailable("no " + down + " worker is up", "no_worker_up"));
    body["workers"] = std::move(list);
    Respond(http::status::service_unavailable, DumpJson(body), "application/json");
  }

  void Generate(Endpoint endpoint, std::shared_ptr<const ServedModel> model) {
    if (server_->phase == Phase::kDraining)
      return RespondError(Unavailable("the server is shutting down", "server_draining"));
    GenerationParams params;
    {
      std::string body = std::move(parser_->release().body());  // the parser's memory goes now
      parser_.reset();
      if (auto error = ParseGenerationBody(endpoint, body, &params)) return RespondError(*error);
    }
    streaming_ = params.stream;
    headers_sent_ = final_chunk_sent_ = last_queued_ = close_delimited_ = false;
    out_.clear();
    // Watch the socket while generating: a client that goes away aborts its request.
    stream_.expires_never();
    Hold();
    Watch();
    auto post = [ex = stream_.get_executor()](std::function<void()> task) {
      net::post(ex, std::move(task));
    };
    auto deliver = [weak = weak_from_this()](ReplyPart part) {
      if (auto self = weak.lock()) self->OnPart(std::move(part));
    };
    guard_.emplace(server_);
    auto started = GenerationCall::Start(params, std::move(model), post, deliver, received_);
    if (auto* error = std::get_if<ApiError>(&started)) {
      guard_.reset();
      return RespondError(*error);  // the watch read stays pending; it ends with the response
    }
    call_ = std::get<std::shared_ptr<GenerationCall>>(std::move(started));
  }

  // The read pending while a request generates (see the class comment). Its read timer stays
  // off: it was set to never in Generate, and a write sets only its own while a read is pending.
  void Watch() {
    if (watching_ || peer_done_ || closed_ || buffer_.size() >= kMaxReadAheadBytes) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(kReadBytes),
                            beast::bind_front_handler(&HttpSession::OnWatch, shared_from_this()));
  }

  void OnWatch(beast::error_code ec, std::size_t n) {
    watching_ = false;
    buffer_.commit(n);
    const AfterWatch after = std::exchange(after_watch_, AfterWatch::kNothing);
    if (closed_) return;
    if (ec == net::error::eof) {
      peer_done_ = true;  // a half-close: the client still reads its replies
    } else if (ec && ec != net::error::operation_aborted) {
      return after == AfterWatch::kNothing ? Abandon() : Close();  // the client is gone
    }
    switch (after) {
      case AfterWatch::kReadRequest:
        return ReadRequest();
      case AfterWatch::kLinger:
        return Linger();
      case AfterWatch::kNothing:
        break;
    }
    if (!ec) Watch();
  }

  // While a reply is in progress the session must live even when no read or write is pending
  // (the watch ended at a half-close or at the read-ahead bound; the engine holds only a weak
  // reference): a wait that never fires holds it, owned by the io_context as any pending
  // operation is (so destroying the io_context at Stop still frees the session).
  void Hold() {
    if (holding_) return;
    holding_ = true;
    hold_.expires_at(net::steady_timer::time_point::max());
    hold_.async_wait([self = shared_from_this()](beast::error_code) {});
  }
  void Unhold() {
    if (!holding_) return;
    holding_ = false;
    hold_.cancel();
  }

  // Cancels the watch read; its completion does `after`.
  void EndWatch(AfterWatch after) {
    after_watch_ = after;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
  }

  void OnPart(ReplyPart part) {
    if (closed_) return;
    if (!streaming_) {
      if (!part.last) return;  // cannot happen: a whole reply is one part
      call_.reset();
      return Respond(static_cast<http::status>(part.http_status), std::move(part.payload));
    }
    out_ += SseData(part.payload);
    if (part.last) {
      last_queued_ = true;
      call_.reset();
    }
    WriteStream();
  }

  void WriteStream() {
    if (writing_ || closed_) return;
    auto done = beast::bind_front_handler(&HttpSession::OnStreamWritten, shared_from_this());
    if (!headers_sent_) {
      stream_res_ = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
      stream_res_->set(http::field::server, "duet");
      stream_res_->set(http::field::content_type, "text/event-stream");
      stream_res_->set(http::field::cache_control, "no-cache");
      if (version_ < 11) {
        // HTTP/1.0 has no chunked coding: the body ends where the connection does.
        close_delimited_ = true;
        keep_alive_ = false;
        stream_res_->set(http::field::connection, "close");
      } else {
        stream_res_->keep_alive(keep_alive_);
        stream_res_->chunked(true);
      }
      stream_sr_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_res_);
      headers_sent_ = true;
      StartWrite();
      http::async_write_header(stream_, *stream_sr_, std::move(done));
    } else if (!out_.empty()) {
      inflight_ = std::move(out_);
      out_.clear();
      StartWrite();
      if (close_delimited_) {
        net::async_write(stream_, net::buffer(inflight_), std::move(done));
      } else {
        net::async_write(stream_, http::make_chunk(net::buffer(inflight_)), std::move(done));
      }
    } else if (last_queued_ && !final_chunk_sent_) {
      final_chunk_sent_ = true;
      if (close_delimited_) return OnReplyWritten();
      StartWrite();
      net::async_write(stream_, http::make_chunk_last(), std::move(done));
    } else if (final_chunk_sent_) {
      OnReplyWritten();
    }
  }

  void StartWrite() {
    writing_ = true;
    stream_.expires_after(ToDuration(server_->options.write_timeout_s));  // the write timer
  }

  void OnStreamWritten(beast::error_code ec, std::size_t) {
    writing_ = false;
    if (ec) return Abandon();
    WriteStream();
  }

  // The reply's last byte is out: the next request (perhaps read ahead already), or close.
  void OnReplyWritten() {
    Unhold();
    guard_.reset();
    stream_res_.reset();
    stream_sr_.reset();
    inflight_.clear();
    inflight_.shrink_to_fit();
    // As the reply announced: a connection told "keep-alive" reads its next request even if
    // draining began meanwhile (it is answered, with "close", rather than dropped unanswered).
    if (!keep_alive_) return GracefulClose();
    if (watching_) return EndWatch(AfterWatch::kReadRequest);
    ReadRequest();
  }

  void Respond(http::status status, std::string body, const char* content_type = "application/json",
               bool close = false, int retry_after_s = 0) {
    auto res = std::make_shared<http::response<http::string_body>>(status, version_);
    res->set(http::field::server, "duet");
    res->set(http::field::content_type, content_type);
    if (retry_after_s > 0) res->set(http::field::retry_after, std::to_string(retry_after_s));
    if (!allow_.empty()) res->set(http::field::allow, std::exchange(allow_, {}));
    if (close || server_->phase == Phase::kDraining) keep_alive_ = false;
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    if (head_) {  // the headers a GET would get, Content-Length included, and no body
      const std::size_t length = res->body().size();
      res->body().clear();
      res->content_length(length);
    }
    // With the watch read pending this sets only the write timer.
    stream_.expires_after(ToDuration(server_->options.write_timeout_s));
    writing_ = true;
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (ec) return self->Abandon();
                        self->OnReplyWritten();
                      });
  }

  void RespondError(const ApiError& error, bool close = false, bool log = true) {
    if (log) LogRequestError(error.http_status, method_, target_, error.message);
    Respond(static_cast<http::status>(error.http_status), ErrorBody(error), "application/json",
            close, error.retry_after_s);
  }

  void RespondUnauthorized() {
    RespondError(ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                          "invalid_request_error", "", "invalid_api_key"});
  }

  // The client is gone or stalled: stop its request and drop the connection.
  void Abandon() {
    if (call_) call_->Cancel();
    call_.reset();
    guard_.reset();
    Unhold();
    Close();
  }

  // After a "Connection: close" reply: stop sending, read (and drop) what the client may still
  // be sending for a moment, so that closing does not reset the connection under its reply.
  void GracefulClose() {
    if (closed_ || lingering_) return;
    lingering_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    buffer_.consume(buffer_.size());
    linger_bytes_ = 0;
    if (watching_) return EndWatch(AfterWatch::kLinger);
    Linger();
  }

  void Linger() {
    if (peer_done_) return Close();
    buffer_.consume(buffer_.size());
    stream_.expires_after(ToDuration(kLingerS));
    stream_.async_read_some(buffer_.prepare(kReadBytes),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->linger_bytes_ += n;
                              if (ec || self->linger_bytes_ > kLingerBytes) return self->Close();
                              self->Linger();
                            });
  }

  void Close() {
    Unhold();
    if (idle_) {
      idle_ = false;
      slot_.SetIdle(false);
    }
    if (closed_ && !stream_.socket().is_open()) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  Impl* server_;
  ConnectionSlot slot_;
  beast::flat_buffer buffer_;  // received and not parsed yet: the request, and what came after
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string method_, target_, allow_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;  // a HEAD request: the reply has no body

  // The generation reply in progress.
  std::shared_ptr<GenerationCall> call_;
  std::optional<ReplyGuard> guard_;
  bool streaming_ = false;
  bool close_delimited_ = false;  // HTTP/1.0: no chunked coding; the close ends the body
  bool headers_sent_ = false;
  bool last_queued_ = false;
  // When the request's headers were read: its arrival.
  std::chrono::steady_clock::time_point received_;
  bool final_chunk_sent_ = false;
  std::string out_;       // SSE bytes not yet handed to a write
  std::string inflight_;  // SSE bytes being written
  std::shared_ptr<http::response<http::empty_body>> stream_res_;
  std::shared_ptr<http::response_serializer<http::empty_body>> stream_sr_;
  bool writing_ = false;
  bool watching_ = false;
  AfterWatch after_watch_ = AfterWatch::kNothing;
  bool peer_done_ = false;  // the client half-closed: nothing more will come
  bool idle_ = false;       // waiting for a request with nothing of it received
  bool closed_ = false;
  bool lingering_ = false;
  std::size_t linger_bytes_ = 0;
  net::steady_timer hold_;  // Hold()
  bool holding_ = false;
};

}  // namespace

std::shared_ptr<Impl::Connection> HttpServer::Impl::Admit(
    const std::string& client, std::vector<std::function<void()>>* evictions) {
  std::lock_guard<std::mutex> lock(connections_mutex);
  const auto evict = [&](std::shared_ptr<Connection> victim) {
    idle_connections.erase(victim->idle_at);
    victim->idle = false;
    Uncount(*victim);
    evictions->push_back(victim->evict);
  };
  const int per_client = options.max_connections_per_client;
  if (const auto it = client_connections.find(client);
      per_client > 0 && it != client_connections.end() && it->second >= per_client) {
    const auto victim =
        std::find_if(idle_connections.begin(), idle_connections.end(),
                     [&](const std::shared_ptr<Connection>& c) { return c->client == client; });
    if (victim == idle_connections.end()) return nullptr;
    evict(*victim);
  }
  if (open_connections >= options.max_connections) {
    if (idle_connections.empty()) return nullptr;
    evict(idle_connections.front());
  }
  auto connection = std::make_shared<Connection>();
  connection->client = client;
  ++open_connections;
  ++client_connections[client];
  return connection;
}

void HttpServer::Impl::Uncount(Connection& connection) {
  if (!connection.counted) return;
  connection.counted = false;
  --open_connections;
  const auto it = client_connections.find(connection.client);
  if (--it->second == 0) client_connections.erase(it);
}

void HttpServer::Impl::Release(Connection* connection) {
  std::lock_guard<std::mutex> lock(connections_mutex);
  if (connection->idle) idle_connections.erase(connection->idle_at);
  connection->idle = false;
  Uncount(*connection);
}

void HttpServer::Impl::SetIdle(const std::shared_ptr<Connection>& connection, bool idle) {
  std::lock_guard<std::mutex> lock(connections_mutex);
  if (connection->idle == idle) return;
  if (idle) {
    if (!connection->counted) return;  // evicted already
    connection->idle_at = idle_connections.insert(idle_connections.end(), connection);
  } else {
    idle_connections.erase(connection->idle_at);
  }
  connection->idle = idle;
}

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(*ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped || !acceptor->is_open()) return;
    if (ec) {
      // A lasting error (EMFILE: out of file descriptors) would fail again at once: try again
      // a little later instead of spinning on the io thread.
      auto timer = std::make_shared<net::steady_timer>(*ioc, std::chrono::milliseconds(50));
      timer->async_wait([this, timer](beast::error_code) {
        if (!stopped) Accept();
      });
      return;
    }
    SetCloseOnExec(socket.native_handle());
    beast::error_code peer_ec;
    const tcp::endpoint peer = socket.remote_endpoint(peer_ec);
    std::vector<std::function<void()>> evictions;
    auto connection = peer_ec ? nullptr : Admit(peer.address().to_string(), &evictions);
    for (const auto& evict : evictions) evict();
    if (connection) {
      std::make_shared<HttpSession>(std::move(socket), this, std::move(connection))->Run();
    } else {
      beast::error_code ignored;
      socket.close(ignored);
    }
    Accept();
  });
}

void HttpServer::Impl::StopNow() {
  if (stopped.exchange(true)) return;
  if (ioc) ioc->stop();
  for (std::thread& t : threads) t.join();
  threads.clear();
  beast::error_code ignored;
  if (acceptor) acceptor->close(ignored);
}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->ioc = std::make_unique<net::io_context>(std::max(1, options.io_threads));
  beast::error_code ec;
  tcp::resolver resolver(*impl->ioc);
  const auto results =
      resolver.resolve(options.host, std::to_string(options.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    return Status::Error("--host " + options.host + ": cannot resolve: " + ec.message());
  const tcp::endpoint endpoint = results.begin()->endpoint();
  impl->acceptor.emplace(*impl->ioc);
  auto& acceptor = *impl->acceptor;
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (acceptor.open(endpoint.protocol(), ec); ec)
    return Status::Error("cannot open a socket for " + where + ": " + ec.message());
  SetCloseOnExec(acceptor.native_handle());
  acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec)
    return Status::Error("cannot bind " + where + ": " + ec.message());
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec)
    return Status::Error("cannot listen on " + where + ": " + ec.message());
  impl->port = acceptor.local_endpoint().port();
  const auto address = acceptor.local_endpoint().address();
  impl->host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  impl->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i)
    impl->threads.emplace_back([ioc = impl->ioc.get()] {
      // A handler that throws (a bug) costs its connection, not the server: run on.
      for (;;) {
        try {
          ioc->run();
          return;
        } catch (const std::exception& e) {
          LogRequestError(500, "-", "-", std::string("internal error in a handler: ") + e.what());
        }
      }
    });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

std::uint16_t HttpServer::port() const { return impl_->port; }
std::string HttpServer::address() const {
  return "http://" + impl_->host + ":" + std::to_string(impl_->port);
}

void HttpServer::SetServing(std::shared_ptr<const ServedModel> model) {
  {
    std::lock_guard<std::mutex> lock(impl_->model_mutex);
    impl_->model = std::move(model);
  }
  Phase expected = Phase::kLoading;
  impl_->phase.compare_exchange_strong(expected, Phase::kServing);
}

void HttpServer::BeginDrain() { impl_->phase = Phase::kDraining; }

bool HttpServer::WaitRepliesDone(Seconds timeout_s) {
  std::unique_lock<std::mutex> lock(impl_->replies_mutex);
  return impl_->replies_cv.wait_for(lock, ToDuration(timeout_s),
                                    [&] { return impl_->replies == 0; });
}

std::int64_t HttpServer::replies_in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->replies_mutex);
  return impl_->replies;
}

void HttpServer::Stop() { impl_->StopNow(); }

}  // namespace duet::backend::serve
