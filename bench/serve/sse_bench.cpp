// The frontend's cost per token under many concurrent SSE streams (bench/serve_sse.sh).
// One process holds the live frontend (the tiny test model on one engine thread), the HTTP
// server and a client that opens every stream at once, all timing with the same steady clock:
// the engine's emission of each token (the frontend's observer) is set against the moment the
// client has received it, counted exactly through vLLM's continuous usage stats (every chunk
// says how many tokens the request has so far). The yardstick, in the same run: the same
// streams submitted to the frontend in-process, each token taken by a listener on the engine
// thread (no HTTP, no detokenization, no JSON). The floor, in the same run: the same streams
// as raw loopback TCP connections, one fixed-size send per token by one writer thread (the
// least that any server giving each stream a connection and each token a write must spend).
// Usage: duet_sse_bench [--streams N] [--prompt-tokens P] [--max-tokens M] [--io-threads T]
//                       [--runs R]   (prints one JSON object per mode and run)
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/resource.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/frontend/frontend.h"
#include "backend/model/test_model.h"
#include "backend/registry.h"
#include "backend/replay/sse.h"
#include "backend/serve/api.h"
#include "backend/serve/http_server.h"
#include "backend/tokenizer/tokenizer.h"
#include "policies/metrics.h"

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace duet::bench {
namespace {

using backend::serve::LiveFrontend;

struct Config {
  int streams = 1000;
  int prompt_tokens = 32;
  int max_tokens = 64;
  int io_threads = 1;
  int runs = 1;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// CPU seconds this process has used, every thread together.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Stream i's prompt: its first two ids encode i, so the engine side knows whose token it saw.
std::vector<std::int32_t> Prompt(int i, int tokens) {
  std::vector<std::int32_t> p = {16 + i % 400, 16 + i / 400};
  for (int k = 2; k < tokens; ++k) p.push_back(16 + (i * 7 + k * 13) % 480);
  return p;
}
int StreamOf(const std::vector<std::int32_t>& ids) { return (ids[0] - 16) + 400 * (ids[1] - 16); }

// The engine's side: when each token of each stream left the engine (its observer runs on
// the engine thread right after the step that sampled the token). One engine thread writes.
class EmissionLog final : public policies::EventSink {
 public:
  explicit EmissionLog(int streams) : times_(static_cast<std::size_t>(streams)) {}
  void OnToken(const policies::RequestSpec& r, const policies::RequestRecord&,
               std::int32_t) override {
    times_[static_cast<std::size_t>(StreamOf(r.prompt_ids))].push_back(Clock::now());
  }
  void OnFinished(const policies::RequestSpec&, const policies::RequestRecord&) override {}
  void OnPrefillDone(const policies::RequestSpec&, const policies::RequestRecord&) override {}
  void OnTokenGaps(Seconds, std::int64_t) override {}
  void OnPreempted(const policies::RequestSpec&, const policies::RequestRecord&,
                   policies::InstanceId) override {}
  std::vector<std::vector<Clock::time_point>> times_;
};

// What a client saw of every stream: when each token arrived, and when the stream was sent.
struct Receipts {
  explicit Receipts(int streams) : times(static_cast<std::size_t>(streams)) {}
  std::vector<std::vector<Clock::time_point>> times;
  Clock::time_point start;
  double cpu_start_s = 0;  // ProcessCpuSeconds() at start
};

nlohmann::json Dist(std::vector<double> v) {
  const policies::Distribution d = policies::Summarize(std::move(v));
  return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90},
          {"p99", d.p99},   {"max", d.max}, {"samples", d.count}};
}

// Delivery delay (receipt - emission) of every token, the gaps between a stream's tokens as
// the receiver saw them, time to the first token, and the token rate.
nlohmann::json Report(const std::string& mode, const Config& c, const EmissionLog& emitted,
                      const Receipts& got, Clock::time_point end) {
  std::vector<double> delay, itl, ttft;
  std::int64_t tokens = 0, missing = 0;
  for (std::size_t s = 0; s < got.times.size(); ++s) {
    const auto& r = got.times[s];
    const auto& e = emitted.times_[s];
    tokens += static_cast<std::int64_t>(r.size());
    if (r.size() != static_cast<std::size_t>(c.max_tokens) || e.size() != r.size()) {
      ++missing;
      continue;
    }
    ttft.push_back(Ms(r[0] - got.start));
    for (std::size_t k = 0; k < r.size(); ++k) {
      delay.push_back(Ms(r[k] - e[k]));
      if (k > 0) itl.push_back(Ms(r[k] - r[k - 1]));
    }
  }
  const double wall_s = std::chrono::duration<double>(end - got.start).count();
  const double cpu_s = ProcessCpuSeconds() - got.cpu_start_s;
  return {
      {"mode", mode},
      {"streams", c.streams},
      {"prompt_tokens", c.prompt_tokens},
      {"max_tokens", c.max_tokens},
      {"incomplete_streams", missing},
      {"wall_s", wall_s},
      {"tokens", tokens},
      {"tokens_per_s", static_cast<double>(tokens) / wall_s},
      {"cpu_s", cpu_s},
      {"cpu_us_per_token", cpu_s * 1e6 / static_cast<double>(std::max<std::int64_t>(tokens, 1))},
      {"delivery_ms", Dist(delay)},
      {"itl_ms", Dist(itl)},
      {"ttft_ms", Dist(ttft)}};
}

std::unique_ptr<LiveFrontend> StartFrontend(const std::string& model_dir, const Config& c,
                                            policies::EventSink* observer) {
  auto loaded = backend::LoadModelDir(model_dir);
  if (!loaded) throw std::runtime_error(loaded.error());
  backend::ModelPlacement placement;
  placement.block_tokens = 16;
  placement.num_blocks =
      static_cast<std::int64_t>(c.streams) * ((c.prompt_tokens + c.max_tokens) / 16 + 2) + 16;
  placement.cpu_threads = 1;
  auto model = backend::CreateForwardModel(std::move(*loaded), placement);
  if (!model) throw std::runtime_error(model.error());
  std::vector<std::unique_ptr<backend::ForwardModel>> models;
  models.push_back(std::move(*model));
  backend::serve::FrontendOptions options;
  options.router.kind = policies::RouterKind::kRoundRobin;
  options.engine.scheduler.max_num_seqs = c.streams;  // every stream decodes in every step
  options.max_pending_requests = c.streams;
  options.observer = observer;
  auto f = LiveFrontend::Start(std::move(models), options);
  if (!f) throw std::runtime_error(f.error());
  return std::move(*f);
}

// ---- In-process: listeners on the engine thread --------------------------------------------

class Taker final : public backend::serve::RequestListener {
 public:
  Taker(std::vector<Clock::time_point>* times, std::mutex* mu, std::condition_variable* cv,
        int* left)
      : times_(times), mu_(mu), cv_(cv), left_(left) {}
  void OnToken(std::int32_t) override { times_->push_back(Clock::now()); }
  void OnFinished(const backend::serve::FinishInfo&) override {
    std::lock_guard lock(*mu_);
    if (--*left_ == 0) cv_->notify_all();
  }

 private:
  std::vector<Clock::time_point>* times_;
  std::mutex* mu_;
  std::condition_variable* cv_;
  int* left_;
};

nlohmann::json RunInProcess(const std::string& model_dir, const Config& c) {
  EmissionLog emitted(c.streams);
  auto frontend = StartFrontend(model_dir, c, &emitted);
  Receipts got(c.streams);
  std::mutex mu;
  std::condition_variable cv;
  int left = c.streams;
  got.start = Clock::now();
  got.cpu_start_s = ProcessCpuSeconds();
  for (int i = 0; i < c.streams; ++i) {
    backend::serve::LiveRequest r{Prompt(i, c.prompt_tokens), c.max_tokens, {}};
    const auto a = frontend->Submit(
        std::move(r),
        std::make_shared<Taker>(&got.times[static_cast<std::size_t>(i)], &mu, &cv, &left));
    if (a.status != backend::serve::AdmitStatus::kAccepted) throw std::runtime_error(a.message);
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  return Report("in-process", c, emitted, got, Clock::now());
}

// ---- Over HTTP: one SSE stream per connection ----------------------------------------------

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(net::io_context& io, std::string body, std::vector<Clock::time_point>* times)
      : socket_(io), times_(times) {
    request_.method(http::verb::post);
    request_.target("/v1/completions");
    request_.version(11);
    request_.set(http::field::host, "127.0.0.1");
    request_.set(http::field::content_type, "application/json");
    request_.set(http::field::connection, "close");
    request_.body() = std::move(body);
    request_.prepare_payload();
  }
  void Start(const tcp::endpoint& server) {
    socket_.async_connect(server, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->Fail("connect", ec);
      self->socket_.set_option(tcp::no_delay(true));
      http::async_write(self->socket_, self->request_, [self](beast::error_code ec, std::size_t) {
        if (ec) return self->Fail("write", ec);
        self->parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
        http::async_read_header(self->socket_, self->buffer_, self->parser_,
                                [self](beast::error_code ec, std::size_t) {
                                  if (ec) return self->Fail("read header", ec);
                                  self->ReadBody();
                                });
      });
    });
  }

 private:
  void ReadBody() {
    parser_.get().body().data = piece_;
    parser_.get().body().size = sizeof piece_;
    http::async_read_some(
        socket_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnBody(ec); });
  }
  void OnBody(beast::error_code ec) {
    const Clock::time_point now = Clock::now();
    if (ec == http::error::need_buffer) ec = {};
    const std::size_t n = sizeof piece_ - parser_.get().body().size;
    events_.clear();
    if (Status s = sse_.Feed(std::string_view(piece_, n), events_); !s.ok())
      return Fail("stream", {});
    for (const auto& e : events_) {
      // The usage so far, found by a scan rather than a JSON parse: the client shares the
      // machine with the server and should cost it as little as it can.
      static constexpr std::string_view kKey = "\"completion_tokens\":";
      const auto at = e.data.rfind(kKey);
      if (at == std::string::npos) continue;
      const long long count = std::strtoll(e.data.c_str() + at + kKey.size(), nullptr, 10);
      while (static_cast<long long>(times_->size()) < count) times_->push_back(now);
    }
    if (ec && ec != http::error::end_of_stream && ec != net::error::eof) return Fail("body", ec);
    if (parser_.is_done() || ec) return;
    ReadBody();
  }
  void Fail(const char* what, beast::error_code ec) {
    std::fprintf(stderr, "sse_bench: stream failed: %s %s\n", what, ec.message().c_str());
  }

  tcp::socket socket_;
  std::vector<Clock::time_point>* times_;
  http::request<http::string_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
  char piece_[16384];
  backend::replay::SseParser sse_;
  std::vector<backend::replay::SseEvent> events_;
};

nlohmann::json RunHttp(const std::string& model_dir, const Config& c) {
  EmissionLog emitted(c.streams);
  auto frontend = StartFrontend(model_dir, c, &emitted);
  auto tokenizer = backend::Tokenizer::Load(model_dir + "/tokenizer.json");
  if (!tokenizer) throw std::runtime_error(tokenizer.error());
  backend::serve::LiveMetrics metrics;
  auto served = std::make_shared<backend::serve::ServedModel>("bench", *tokenizer);
  served->vocab_size = frontend->model_config().vocab_size;
  served->max_request_tokens = frontend->max_request_tokens();
  served->frontend = frontend.get();
  served->metrics = &metrics;
  backend::serve::ServerOptions options;
  options.port = 0;
  options.io_threads = c.io_threads;
  options.max_connections = c.streams + 16;
  auto server = backend::serve::HttpServer::Start(options);
  if (!server) throw std::runtime_error(server.error());
  (*server)->SetServing(served);

  Receipts got(c.streams);
  net::io_context io;
  const tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), (*server)->port());
  got.start = Clock::now();
  got.cpu_start_s = ProcessCpuSeconds();
  for (int i = 0; i < c.streams; ++i) {
    nlohmann::json body = {
        {"model", "bench"},
        {"prompt", Prompt(i, c.prompt_tokens)},
        {"max_tokens", c.max_tokens},
        {"temperature", 0},
        {"ignore_eos", true},
        {"stream", true},
        {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
    std::make_shared<Stream>(io, body.dump(), &got.times[static_cast<std::size_t>(i)])
        ->Start(endpoint);
  }
  io.run();  // until every stream ended
  nlohmann::json report = Report("http-sse", c, emitted, got, Clock::now());
  report["io_threads"] = c.io_threads;
  (*server)->Stop();
  frontend.reset();
  return report;
}

// ---- The floor: raw loopback TCP, one send per token --------------------------------------

// One streamed completion chunk with continuous usage stats, as the server sends it (about 300
// bytes from the tiny model: "data: {...}" and its blank line).
constexpr std::size_t kChunkBytes = 300;

// As a server's io thread: sends a chunk on a stream's socket for every token the engine
// thread hands it, in the order they came. Nothing else: no HTTP, JSON or detokenization.
class RawWriter {
 public:
  explicit RawWriter(std::vector<int> fds) : fds_(std::move(fds)), thread_([this] { Loop(); }) {}
  ~RawWriter() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Push(int stream) {  // the engine thread
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      wake = queue_.empty();
      queue_.push_back(stream);
    }
    if (wake) cv_.notify_one();
  }

 private:
  void Loop() {
    const std::string chunk(kChunkBytes, 'x');
    std::vector<int> batch;
    while (true) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        batch.swap(queue_);
      }
      for (int s : batch) {
        if (::send(fds_[static_cast<std::size_t>(s)], chunk.data(), chunk.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(chunk.size()))
          std::fprintf(stderr, "sse_bench: raw send to stream %d failed\n", s);
      }
      batch.clear();
    }
  }

  std::vector<int> fds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class RawTaker final : public backend::serve::RequestListener {
 public:
  RawTaker(RawWriter* writer, int stream) : writer_(writer), stream_(stream) {}
  void OnToken(std::int32_t) override { writer_->Push(stream_); }
  void OnFinished(const backend::serve::FinishInfo&) override {}

 private:
  RawWriter* writer_;
  int stream_;
};

// The client's end of one raw stream: a token is a whole chunk received.
class RawStream : public std::enable_shared_from_this<RawStream> {
 public:
  RawStream(tcp::socket socket, int tokens, std::vector<Clock::time_point>* times)
      : socket_(std::move(socket)), tokens_(tokens), times_(times) {}
  void Read() {
    socket_.async_read_some(
        net::buffer(piece_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
          const Clock::time_point now = Clock::now();
          if (ec) {
            std::fprintf(stderr, "sse_bench: raw read: %s\n", ec.message().c_str());
            return;
          }
          self->bytes_ += n;
          while (self->times_->size() < self->bytes_ / kChunkBytes) self->times_->push_back(now);
          if (static_cast<int>(self->times_->size()) < self->tokens_) self->Read();
        });
  }

 private:
  tcp::socket socket_;
  int tokens_;
  std::vector<Clock::time_point>* times_;
  std::size_t bytes_ = 0;
  char piece_[16384];
};

nlohmann::json RunRawTcp(const std::string& model_dir, const Config& c) {
  EmissionLog emitted(c.streams);
  auto frontend = StartFrontend(model_dir, c, &emitted);
  net::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  std::vector<tcp::socket> server_side;
  std::vector<std::shared_ptr<RawStream>> streams;
  Receipts got(c.streams);
  for (int i = 0; i < c.streams; ++i) {
    tcp::socket client(io);
    client.connect(acceptor.local_endpoint());
    server_side.push_back(acceptor.accept());
    client.set_option(tcp::no_delay(true));
    server_side.back().set_option(tcp::no_delay(true));
    streams.push_back(std::make_shared<RawStream>(std::move(client), c.max_tokens,
                                                  &got.times[static_cast<std::size_t>(i)]));
  }
  std::vector<int> fds;
  for (auto& s : server_side) fds.push_back(s.native_handle());
  RawWriter writer(fds);
  got.start = Clock::now();
  got.cpu_start_s = ProcessCpuSeconds();
  for (int i = 0; i < c.streams; ++i) {
    backend::serve::LiveRequest r{Prompt(i, c.prompt_tokens), c.max_tokens, {}};
    const auto a = frontend->Submit(std::move(r), std::make_shared<RawTaker>(&writer, i));
    if (a.status != backend::serve::AdmitStatus::kAccepted) throw std::runtime_error(a.message);
    streams[static_cast<std::size_t>(i)]->Read();
  }
  io.run();  // until every stream has all its tokens
  nlohmann::json report = Report("raw-tcp", c, emitted, got, Clock::now());
  frontend.reset();
  return report;
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  using namespace duet;
  bench::Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--streams")
      c.streams = value;
    else if (flag == "--prompt-tokens")
      c.prompt_tokens = value;
    else if (flag == "--max-tokens")
      c.max_tokens = value;
    else if (flag == "--io-threads")
      c.io_threads = value;
    else if (flag == "--runs")
      c.runs = value;
    else {
      std::fprintf(stderr, "sse_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (c.streams < 1 || c.streams > 160000 || c.prompt_tokens < 2 || c.max_tokens < 1 ||
      c.prompt_tokens + c.max_tokens > 256 || c.io_threads < 1 || c.runs < 1) {
    std::fprintf(stderr, "sse_bench: bad sizes (prompt + max tokens at most 256)\n");
    return 2;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("duet_sse_bench_" + std::to_string(getpid())))
          .string();
  if (Status s = backend::WriteTestModel(dir, backend::TestModelOptions{}); !s.ok()) {
    std::fprintf(stderr, "sse_bench: %s\n", s.message().c_str());
    return 1;
  }
  try {
    for (int run = 0; run < c.runs; ++run) {
      // Interleaved: each run measures the yardstick and the server back to back.
      for (auto* mode : {&bench::RunInProcess, &bench::RunRawTcp, &bench::RunHttp}) {
        nlohmann::json r = (*mode)(dir, c);
        r["run"] = run;
        std::printf("%s\n", r.dump().c_str());
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sse_bench: %s\n", e.what());
    std::filesystem::remove_all(dir);
    return 1;
  }
  std::filesystem::remove_all(dir);
  return 0;
}
