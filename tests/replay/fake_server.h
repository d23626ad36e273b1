// A small OpenAI-compatible completions server for the `duet replay` tests: real HTTP on
// 127.0.0.1 (an ephemeral port), requests read with Boost.Beast, replies written byte by byte as
// the test wants them (HTTP/1.1 chunked, SSE events split across writes, CRLF line ends,
// comments). It streams one chunk per token at known times after each request arrives
// (first_chunk_delay_s, then chunk_gap_s apart), reports usage with the prompt tokens a prefix
// cache of 16-token blocks would have held, and can add Duet's "duet" object. Asked for
// return_token_ids, each token chunk carries its token's id: kReplyTokenBase + its position in
// the reply (unless token_ids is off, as on servers without the extension). max_tokens picks
// a misbehaviour, so one trace exercises them all:
//   7: HTTP 429 (queue full);  13: closes the connection after 3 chunks;  11: a chunk that is
//   not JSON;  17: HTTP 500;  20: two tokens per chunk (10 chunks; usage says 20);
//   anything else: a normal stream of max_tokens chunks ending with finish_reason "length"
//   (llama_cpp_chunks: max_tokens chunks with empty text, then one that finishes).
// One thread per connection (test traffic only); the destructor stops and joins them all.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace duet::replay_test {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

inline constexpr int kRejectTokens = 7;
inline constexpr int kDisconnectTokens = 13;
inline constexpr int kGarbageTokens = 11;
inline constexpr int kServerErrorTokens = 17;
inline constexpr int kTwoPerChunkTokens = 20;
inline constexpr int kDisconnectAfterChunks = 3;
inline constexpr std::int64_t kCacheBlockTokens = 16;

struct FakeServerOptions {
  double first_chunk_delay_s = 0.100;
  double chunk_gap_s = 0.020;
  bool duet_fields = false;  // add {"duet": {"queue_ms": kQueueMs, "instance": max_tokens % 2}}
  // With duet_fields, > 0: also "tier_hit_tokens": {"dram": this} (however few tokens it cached).
  std::int64_t dram_hit_tokens = 0;
  // With duet_fields: more fields of the last chunk's "duet" object.
  nlohmann::json duet_extra = nlohmann::json::object();
  bool report_cached = true;  // usage.prompt_tokens_details.cached_tokens
  bool list_models = true;    // answer GET /v1/models (else 404)
  bool token_ids = true;      // honour return_token_ids
  // As llama.cpp's server streams a reply: every token chunk's text empty (as for a token that
  // ends inside a UTF-8 character), no token ids, and the finish_reason with the usage in a
  // chunk of its own, finish_delay_s after the last token's.
  bool llama_cpp_chunks = false;
  double finish_delay_s = 0.030;
};
inline constexpr std::int32_t kReplyTokenBase = 7000;
inline constexpr double kQueueMs = 5.5;
inline constexpr const char* kModelName = "fake-model";

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions options = {}) : options_(options) {
    tcp::endpoint local(net::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(local.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(local);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeServer() {
    stopping_ = true;
    // Wake the blocking accept with a connection of our own.
    boost::system::error_code ignored;
    tcp::socket waker(io_);
    waker.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ignored);
    accept_thread_.join();
    waker.close(ignored);
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  unsigned short port() const { return port_; }

  // Bodies of the completion requests received, in arrival order.
  std::vector<nlohmann::json> Completions() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return completions_;
  }
  // Authorization headers of every request received ("" when absent).
  std::vector<std::string> Authorizations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return authorizations_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stopping_) return;
      if (ec) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.emplace_back([this, s = std::move(socket)]() mutable { Serve(std::move(s)); });
    }
  }

  static void Write(tcp::socket& socket, const std::string& bytes) {
    boost::system::error_code ignored;
    net::write(socket, net::buffer(bytes), ignored);
  }
  static std::string Chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
  }

  void Reply(tcp::socket& socket, int status, const std::string& reason, const std::string& body) {
    Write(socket, "HTTP/1.1 " + std::to_string(status) + " " + reason +
                      "\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  }

  // Prompt tokens a prefix cache of 16-token blocks holds from earlier prompts; remembers this one.
  std::int64_t CachedTokens(const std::vector<std::int64_t>& prompt) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::uint64_t h = 1469598103934665603ull;
    std::int64_t cached = 0;
    bool hit = true;
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      h = (h ^ static_cast<std::uint64_t>(prompt[i])) * 1099511628211ull;
      if ((i + 1) % kCacheBlockTokens != 0) continue;
      if (hit && blocks_.count(h)) {
        cached = static_cast<std::int64_t>(i + 1);
      } else {
        hit = false;
      }
      blocks_.insert(h);
    }
    return cached;
  }

  void Serve(tcp::socket socket) {
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    boost::system::error_code ec;
    http::read(socket, buffer, request, ec);
    if (ec) return;
    const auto start = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      authorizations_.emplace_back(request[http::field::authorization]);
    }
    if (request.target() == "/v1/models" && options_.list_models) {
      return Reply(socket, 200, "OK",
                   std::string(R"({"object":"list","data":[{"id":")") + kModelName +
                       R"(","object":"model"}]})");
    }
    if (request.target() != "/v1/completions" || request.method() != http::verb::post)
      return Reply(socket, 404, "Not Found", R"({"detail":"Not Found"})");
    const nlohmann::json body = nlohmann::json::parse(request.body(), nullptr, false);
    if (body.is_discarded() || !body.contains("prompt") || !body.contains("max_tokens"))
      return Reply(socket, 400, "Bad Request", R"({"error":{"message":"bad body"}})");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completions_.push_back(body);
    }
    const int max_tokens = body["max_tokens"].get<int>();
    const auto prompt = body["prompt"].get<std::vector<std::int64_t>>();
    const std::int64_t cached = CachedTokens(prompt);
    if (max_tokens == kRejectTokens)
      return Reply(socket, 429, "Too Many Requests",
                   R"({"object":"error","message":"queue full","type":"rate_limited"})");
    if (max_tokens == kServerErrorTokens)
      return Reply(socket, 500, "Internal Server Error", R"({"error":{"message":"boom"}})");

    Write(socket,
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
          "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    const int per_chunk = max_tokens == kTwoPerChunkTokens ? 2 : 1;
    const bool llama = options_.llama_cpp_chunks;
    const bool token_ids = !llama && options_.token_ids && body.value("return_token_ids", false);
    const int chunks = max_tokens / per_chunk;
    // The whole stream, laid out in advance; ends[k] is where token event k ends. Line ends
    // alternate between "\n" (even k) and "\r\n" (odd k), with a comment every third event.
    std::string all;
    std::vector<std::size_t> ends;
    for (int k = 0; k < chunks; ++k) {
      const std::string eol = k % 2 ? "\r\n" : "\n";
      if (k % 3 == 0) all += ": keep-alive" + eol;
      if (max_tokens == kGarbageTokens && k == 1) {
        all += "data: this is not JSON" + eol + eol;
      } else {
        nlohmann::json choice = {
            {"index", 0},
            {"text", llama            ? ""
                     : per_chunk == 2 ? " tok tok"
                                      : " tok"},
            {"logprobs", nullptr},
            {"finish_reason",
             k + 1 == chunks && !llama ? nlohmann::json("length") : nlohmann::json(nullptr)}};
        if (token_ids) {
          choice["token_ids"] = nlohmann::json::array();
          for (int t = 0; t < per_chunk; ++t)
            choice["token_ids"].push_back(kReplyTokenBase + k * per_chunk + t);
        }
        const nlohmann::json data = {{"id", "cmpl-1"},
                                     {"object", "text_completion"},
                                     {"model", kModelName},
                                     {"choices", {choice}},
                                     {"usage", nullptr}};
        all += "data: " + data.dump() + eol + eol;
      }
      ends.push_back(all.size());
    }
    nlohmann::json usage = {
        {"prompt_tokens", prompt.size()},
        {"completion_tokens", max_tokens},
        {"total_tokens", static_cast<std::int64_t>(prompt.size()) + max_tokens}};
    usage["prompt_tokens_details"] =
        options_.report_cached ? nlohmann::json({{"cached_tokens", cached}}) : nlohmann::json();
    nlohmann::json last = {{"id", "cmpl-1"},
                           {"object", "text_completion"},
                           {"model", kModelName},
                           {"choices", nlohmann::json::array()},
                           {"usage", usage}};
    if (options_.duet_fields) last["duet"] = {{"queue_ms", kQueueMs}, {"instance", max_tokens % 2}};
    if (options_.duet_fields && options_.dram_hit_tokens > 0)
      last["duet"]["tier_hit_tokens"] = {{"dram", options_.dram_hit_tokens}};
    if (options_.duet_fields) last["duet"].update(options_.duet_extra);
    if (llama)
      last["choices"] = {
          {{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", "length"}}};
    all += "data: " + last.dump() + "\r\n\r\ndata: [DONE]\r\n\r\n";
    const std::size_t tokens_end = llama ? ends.back() : all.size();

    // At its time, each write completes token event k and cuts the stream inside the next
    // event's first line (LF events), or between the "\r" and "\n" of the blank line that ends
    // event k (CRLF events: "\r" alone already ends the line, so the event is complete).
    const auto at = [&](double s) {
      std::this_thread::sleep_until(start +
                                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(s)));
    };
    std::size_t sent = 0;
    for (int k = 0; k < chunks; ++k) {
      at(options_.first_chunk_delay_s + options_.chunk_gap_s * k);
      if (max_tokens == kDisconnectTokens && k == kDisconnectAfterChunks) {
        boost::system::error_code ignored;
        socket.shutdown(tcp::socket::shutdown_both, ignored);
        socket.close(ignored);
        return;
      }
      const std::size_t end = k + 1 == chunks ? tokens_end : (k % 2 ? ends[k] - 1 : ends[k] + 7);
      Write(socket, Chunk(all.substr(sent, end - sent)));
      sent = end;
    }
    if (sent < all.size()) {
      at(options_.first_chunk_delay_s + options_.chunk_gap_s * (chunks - 1) +
         options_.finish_delay_s);
      Write(socket, Chunk(all.substr(sent)));
    }
    Write(socket, "0\r\n\r\n");
  }

  FakeServerOptions options_;
  net::io_context io_;
  tcp::acceptor acceptor_{io_};
  unsigned short port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::vector<std::thread> threads_;
  std::vector<nlohmann::json> completions_;
  std::vector<std::string> authorizations_;
  std::set<std::uint64_t> blocks_;
};

}  // namespace duet::replay_test
