// The replay load generator (client.h). One Session per request, kept alive by the handlers it
// has pending: connect, write, read the header, then read the body piece by piece (Beast's
// buffer_body parser undoes HTTP/1.1 chunking) into the SSE parser, timestamping each piece as
// its read completes. A per-request timer closes the socket at the timeout; every handler checks
// whether its session already finished, so a request ends exactly once.
#include "backend/replay/client.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/replay/sse.h"
#include "common/progress.h"
#include "common/text.h"

namespace duet::backend::replay {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using policies::Request;
using policies::RequestState;

// Error kinds (keys of summary.json's replay.errors; docs/outputs.md lists them).
constexpr const char* kConnect = "connect";                    // no TCP connection
constexpr const char* kSend = "send";                          // writing the request failed
constexpr const char* kRead = "read";                          // a socket error while reading
constexpr const char* kClosed = "closed_mid_stream";           // connection closed early
constexpr const char* kMalformed = "malformed_stream";         // not a completion stream
constexpr const char* kStreamError = "stream_error";           // an error object in the stream
constexpr const char* kNoFinish = "no_finish_reason";          // ended without a finish_reason
constexpr const char* kTimeout = "timeout";                    // --timeout passed
constexpr const char* kInterrupted = "interrupted";            // SIGINT/SIGTERM while in flight
constexpr const char* kNotSent = "not_sent";                   // SIGINT/SIGTERM before its send
constexpr const char* kDependency = "dependency";              // its dependency cannot go on
constexpr std::size_t kErrorBodyBytes = 4096;                  // kept of an HTTP error reply
constexpr std::size_t kJsonBodyBytes = std::size_t{64} << 20;  // a non-streamed reply, at most
constexpr Seconds kProgressPeriodS = 0.5;

Clock::duration ToDuration(Seconds s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string FormatSeconds(Seconds s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

policies::FinishReason ParseFinishReason(const std::string& reason) {
  if (reason == "length") return policies::FinishReason::kLength;
  if (reason == "abort") return policies::FinishReason::kAbort;
  return policies::FinishReason::kStop;  // "stop" and server-specific reasons
}

// Lets the process hold as many sockets as the system allows: thousands of requests may be
// in flight at once.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

Result<tcp::resolver::results_type> Resolve(net::io_context& io, const Endpoint& endpoint) {
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(endpoint.host, endpoint.port, ec);
  if (ec)
    return Status::Error(endpoint.url + ": cannot resolve host '" + endpoint.host +
                         "': " + ec.message());
  return results;
}

class Replay;

// One request: its connection, parser state and timings. Owned by its pending handlers.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // `arrival_s`: its scheduled send on the run's clock; `prompt_tokens`: the prompt sent.
  Session(Replay& run, std::size_t index, const traces::TraceRequest& request, Seconds arrival_s,
          Tokens prompt_tokens);
  void Start(std::string body);
  // Ends the request now (SIGINT): a failed record, unless it already finished.
  void Interrupt() { Fail(kInterrupted, "interrupted before the reply ended"); }

 private:
  void OnConnect(const boost::system::error_code& ec);
  void OnWrite(const boost::system::error_code& ec);
  void OnHeader(const boost::system::error_code& ec);
  void ReadBody();
  void OnBody(boost::system::error_code ec);
  void OnEvent(const SseEvent& event, Clock::time_point now);
  // The reply's body ended (HTTP message complete).
  void OnEnd(Clock::time_point now);
  void Complete();
  void Reject(const std::string& reason);
  void Fail(const std::string& kind, const std::string& reason);
  void Finish(Request record, const std::string& kind);
  std::string Received() const;

  Replay& run_;
  std::size_t index_;
  const traces::TraceRequest& request_;
  Seconds arrival_s_;
  Tokens prompt_tokens_;
  tcp::socket socket_;
  net::steady_timer deadline_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> http_request_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::array<char, 16384> piece_{};
  SseParser sse_;
  std::vector<SseEvent> events_;
  unsigned status_ = 0;
  bool event_stream_ = false;
  std::string body_;  // an error reply (first bytes) or a non-streamed reply
  bool finished_ = false;
  // Stream state.
  std::int64_t token_chunks_ = 0;
  Clock::time_point first_token_, last_token_, finish_seen_;
  std::vector<double> gaps_s_;
  std::string finish_reason_;
  CompletionChunk usage_;                // usage and "duet" fields, the last seen of each
  std::vector<std::int32_t> reply_ids_;  // the choices' token_ids, in order
};

class Replay {
 public:
  Replay(const traces::Trace& trace, const ReplayOptions& options,
         policies::MetricsCollector& metrics, tcp::resolver::results_type addresses,
         traces::Arrivals arrivals)
      : trace_(trace),
        options_(options),
        metrics_(metrics),
        addresses_(std::move(addresses)),
        arrivals_(std::move(arrivals)),
        timer_(io_),
        progress_timer_(io_),
        signals_(io_, SIGINT, SIGTERM) {
    // A closed loop's users start at 0; an open loop at the trace's first arrival.
    first_arrival_s_ = trace.requests.empty() || options.closed_loop.users > 0
                           ? 0.0
                           : trace.requests.front().arrival_s;
    states_.assign(trace.requests.size(), RequestState::kArrived);
  }

  ReplayReport Run() {
    start_ = Clock::now();
    signals_.async_wait([this](const boost::system::error_code& ec, int) {
      if (!ec) Interrupt();
    });
    if (options_.progress) DrawProgressLater();
    ScheduleNext();
    CheckDone();
    io_.run();
    report_.wall_s = std::chrono::duration<double>(Clock::now() - start_).count();
    report_.send_lag_ms = policies::Summarize(std::move(send_lag_ms_));
    if (options_.progress) DrawProgress();
    return report_;
  }

  net::io_context& io() { return io_; }
  const tcp::resolver::results_type& addresses() const { return addresses_; }
  const ReplayOptions& options() const { return options_; }
  // Seconds on the run's clock (the trace's arrival times) of a steady-clock instant.
  Seconds RunSeconds(Clock::time_point t) const {
    return first_arrival_s_ + std::chrono::duration<double>(t - start_).count();
  }

  // A session's final record; `gaps_s` are its inter-token gaps (completed requests only);
  // `reply_ids` the generated tokens' ids the server returned (asked for when later turns
  // continue this request's context).
  void Record(std::size_t index, Request record, const std::vector<double>& gaps_s,
              const std::string& error_kind, const CompletionChunk& usage,
              std::vector<std::int32_t> reply_ids = {}) {
    // Its session: a closed-loop user, or the trace's (per-user throughput).
    record.session = arrivals_.session(index);
    bool continued = record.state == RequestState::kCompleted;
    if (const auto context = contexts_.find(index); context != contexts_.end()) {
      // Later turns send this prompt and the reply's very tokens; without them they cannot.
      if (continued && static_cast<Tokens>(reply_ids.size()) != record.output_tokens) {
        unusable_[index] = "its reply carried " + std::to_string(reply_ids.size()) +
                           " token ids for " + std::to_string(record.output_tokens) +
                           " tokens (later turns need them: the server must support "
                           "return_token_ids)";
        continued = false;
      }
      if (continued) {
        context->second.insert(context->second.end(), reply_ids.begin(), reply_ids.end());
      } else {
        contexts_.erase(context);
      }
    }
    if (record.state == RequestState::kCompleted) {
      for (double g : gaps_s) metrics_.OnTokenGaps(g, 1);
      if (usage.cached_tokens) ++report_.cached_tokens_reported;
      if (usage.duet_queue_ms || usage.duet_instance) ++report_.duet_fields_reported;
      if (usage.prompt_tokens && *usage.prompt_tokens != record.input_tokens)
        ++report_.prompt_tokens_mismatched;
    } else {
      ++report_.errors[error_kind];
    }
    if (record.prefill_instance != policies::kNoInstance)
      report_.instances_seen = std::max(report_.instances_seen, record.prefill_instance + 1);
    metrics_.OnFinished(record, record);
    in_flight_.erase(index);
    states_[index] = record.state;
    ++recorded_;
    if (!stopping_) {
      // A closed-loop user is free again; requests that follow this one may be due (or never).
      arrivals_.OnFinished(index, RunSeconds(Clock::now()), continued);
      if (arrivals_.dynamic()) LaunchDue();
    }
    CheckDone();
  }

 private:
  // The next send the arrivals know of (none while a closed loop's users are all busy).
  void ScheduleNext() {
    const std::optional<Seconds> next = arrivals_.NextArrival();
    if (!next || stopping_) return;
    timer_.expires_at(start_ + ToDuration(*next - first_arrival_s_));
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && !stopping_) LaunchDue();
    });
  }

  // Requests that will never be sent because one they follow did not complete: rejected, as
  // the simulator records them.
  void RecordDropped() {
    while (const auto dropped = arrivals_.TakeDropped()) {
      const auto unusable = unusable_.find(dropped->cause);
      const std::string cause = "request " + std::to_string(trace_.requests[dropped->cause].id);
      Request record =
          UnsentRecord(dropped->index, RunSeconds(Clock::now()), RequestState::kRejected,
                       unusable != unusable_.end()
                           ? "dependency unusable: " + cause + " completed, but " + unusable->second
                           : "dependency not completed: " + cause + " was " +
                                 policies::ToString(states_[dropped->cause]));
      record.finished_s = record.arrival_s;
      ++report_.errors[kDependency];
      metrics_.OnFinished(record, record);
      states_[dropped->index] = record.state;
      // Last: it may free the reason read above.
      if (const auto parent = arrivals_.parent(dropped->index)) ReleaseContext(*parent);
      ++recorded_;
    }
  }

  // The final record of request `index`, never sent.
  Request UnsentRecord(std::size_t index, Seconds arrival_s, RequestState state,
                       std::string reason) const {
    const traces::TraceRequest& r = trace_.requests[index];
    Request record;
    record.id = r.id;
    record.arrival_s = arrival_s;
    record.input_tokens = r.input_tokens;
    record.output_tokens = r.output_tokens;
    record.state = state;
    record.session = arrivals_.session(index);
    record.reason = std::move(reason);
    return record;
  }

  // A later turn of request `parent` was sent or dropped: its context is freed after the last.
  void ReleaseContext(std::size_t parent) {
    if (arrivals_.continuations_left(parent) == 0) {
      contexts_.erase(parent);
      unusable_.erase(parent);
    }
  }

  void LaunchDue() {
    RecordDropped();
    // Everything due is sent now, in order; lateness is measured per request.
    for (Seconds now = RunSeconds(Clock::now()); const auto due = arrivals_.TakeDue(now);
         now = RunSeconds(Clock::now())) {
      send_lag_ms_.push_back((now - due->arrival_s) * 1e3);
      Launch(due->index, due->arrival_s);
    }
    ScheduleNext();
  }

  void Launch(std::size_t k, Seconds arrival_s) {
    const traces::TraceRequest& r = trace_.requests[k];
    std::vector<std::int32_t> prompt;
    if (const auto parent = arrivals_.parent(k)) {
      // A later turn: the parent's prompt and reply as the server saw and wrote them, then
      // this turn's new tokens (its own, as BuildPrompt makes them for a request without
      // block ids).
      prompt = contexts_.at(*parent);
      ReleaseContext(*parent);
      traces::TraceRequest turn = r;
      turn.input_tokens = std::max<Tokens>(0, r.input_tokens - r.context_tokens);
      const std::vector<std::int32_t> fresh =
          traces::BuildPrompt(turn, trace_.block_tokens, options_.prompt);
      prompt.insert(prompt.end(), fresh.begin(), fresh.end());
    } else {
      prompt = traces::BuildPrompt(r, trace_.block_tokens, options_.prompt);
    }
    const bool continued = arrivals_.continuations_left(k) > 0;
    // The body exists only while the request is being sent, and a prompt only until the last
    // turn that continues it is sent: memory stays bounded by the requests in flight and the
    // conversations open, not by the trace.
    std::string body = CompletionRequestBody(options_.model, prompt, r.output_tokens, continued);
    auto session =
        std::make_shared<Session>(*this, k, r, arrival_s, static_cast<Tokens>(prompt.size()));
    if (continued) contexts_[k] = std::move(prompt);
    in_flight_.emplace(k, session);
    ++report_.sent;
    report_.max_in_flight =
        std::max(report_.max_in_flight, static_cast<std::int64_t>(in_flight_.size()));
    session->Start(std::move(body));
  }

  void Interrupt() {
    report_.interrupted = true;
    stopping_ = true;
    timer_.cancel();
    // Copied first: each Interrupt() records and so erases its entry.
    std::vector<std::weak_ptr<Session>> sessions;
    for (const auto& [k, s] : in_flight_) sessions.push_back(s);
    for (const auto& weak : sessions) {
      if (auto s = weak.lock()) s->Interrupt();
    }
    // Every request without a record now was never sent.
    for (std::size_t next = 0; next < trace_.requests.size(); ++next) {
      if (policies::IsFinished(states_[next])) continue;
      Record(next,
             UnsentRecord(next, trace_.requests[next].arrival_s, RequestState::kFailed,
                          "not sent: the run was interrupted"),
             {}, kNotSent, {});
    }
    CheckDone();
  }

  void CheckDone() {
    // Interrupted: every request has a record. Otherwise: nothing more will be sent, and every
    // request sent has its record (a closed loop that ran out of time sends part of the trace).
    if (stopping_ ? recorded_ < trace_.requests.size()
                  : !arrivals_.Exhausted() || recorded_ < arrivals_.released())
      return;
    // Nothing left to send or read: cancel what keeps the loop alive so run() returns.
    timer_.cancel();
    progress_timer_.cancel();
    boost::system::error_code ignored;
    signals_.cancel(ignored);
  }

  void DrawProgressLater() {
    progress_timer_.expires_after(ToDuration(kProgressPeriodS));
    progress_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      DrawProgress();
      DrawProgressLater();
    });
  }

  // The bar every command draws, with what a live run adds.
  void DrawProgress() {
    const std::size_t total = trace_.requests.size();
    char detail[96];
    std::snprintf(detail, sizeof detail, "%zu/%zu requests  %zu in flight  %.1f s", recorded_,
                  total, in_flight_.size(),
                  std::chrono::duration<double>(Clock::now() - start_).count());
    duet::DrawProgress(recorded_, total, detail);
  }

  const traces::Trace& trace_;
  const ReplayOptions& options_;
  policies::MetricsCollector& metrics_;
  tcp::resolver::results_type addresses_;
  traces::Arrivals arrivals_;  // when each request is sent
  net::io_context io_{1};      // one thread: the caller's
  net::steady_timer timer_;
  net::steady_timer progress_timer_;
  net::signal_set signals_;
  Clock::time_point start_;
  Seconds first_arrival_s_ = 0;
  std::size_t recorded_ = 0;  // requests with a final record
  bool stopping_ = false;
  std::unordered_map<std::size_t, std::weak_ptr<Session>> in_flight_;
  std::vector<RequestState> states_;  // per request: its final record's, once it has one
  // Sessions: the prompt and reply of each request whose later turns are not all sent yet,
  // and why one that completed cannot be continued.
  std::unordered_map<std::size_t, std::vector<std::int32_t>> contexts_;
  std::unordered_map<std::size_t, std::string> unusable_;
  std::vector<double> send_lag_ms_;
  ReplayReport report_;
};

Session::Session(Replay& run, std::size_t index, const traces::TraceRequest& request,
                 Seconds arrival_s, Tokens prompt_tokens)
    : run_(run),
      index_(index),
      request_(request),
      arrival_s_(arrival_s),
      prompt_tokens_(prompt_tokens),
      socket_(run.io()),
      deadline_(run.io()) {}

void Session::Start(std::string body) {
  const ReplayOptions& o = run_.options();
  http_request_.method(http::verb::post);
  http_request_.target(o.endpoint.Target("/v1/completions"));
  http_request_.version(11);
  http_request_.set(http::field::host, o.endpoint.HostHeader());
  http_request_.set(http::field::user_agent, "duet-replay");
  http_request_.set(http::field::content_type, "application/json");
  http_request_.set(http::field::accept, "text/event-stream");
  // One connection per request, as vLLM's benchmark client does: the server closes it after
  // the reply, so no idle connection can go stale between requests.
  http_request_.set(http::field::connection, "close");
  if (!o.api_key.empty()) http_request_.set(http::field::authorization, "Bearer " + o.api_key);
  http_request_.body() = std::move(body);
  http_request_.prepare_payload();

  deadline_.expires_after(ToDuration(o.timeout_s));
  deadline_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (!ec)
      self->Fail(kTimeout, "timeout: no complete reply within " +
                               FormatSeconds(self->run_.options().timeout_s) + " s " +
                               self->Received());
  });
  net::async_connect(socket_, run_.addresses(),
                     [self = shared_from_this()](const boost::system::error_code& ec,
                                                 const tcp::endpoint&) { self->OnConnect(ec); });
}

void Session::OnConnect(const boost::system::error_code& ec) {
  if (finished_) return;
  if (ec) return Fail(kConnect, "connect: " + ec.message());
  boost::system::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  http::async_write(socket_, http_request_,
                    [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                      self->OnWrite(ec);
                    });
}

void Session::OnWrite(const boost::system::error_code& ec) {
  if (finished_) return;
  if (ec) return Fail(kSend, "send: " + ec.message());
  http_request_ = {};  // the prompt is no longer needed
  parser_.emplace();
  // The SSE parser bounds what is kept, not the body's size. (Not boost::none: Boost 1.74
  // compares a Content-Length with a disengaged limit as exceeding it.)
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t) { self->OnHeader(ec); });
}

void Session::OnHeader(const boost::system::error_code& ec) {
  if (finished_) return;
  if (ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset)
    return Fail(kClosed, "connection closed before the reply's header");
  if (ec) return Fail(kRead, "reading the reply's header: " + ec.message());
  const auto& header = parser_->get();
  status_ = header.result_int();
  const auto type = header[http::field::content_type];
  event_stream_ = type.size() >= 17 && beast::iequals(type.substr(0, 17), "text/event-stream");
  if (parser_->is_done()) return OnEnd(Clock::now());
  ReadBody();
}

void Session::ReadBody() {
  parser_->get().body().data = piece_.data();
  parser_->get().body().size = piece_.size();
  http::async_read_some(socket_, buffer_, *parser_,
                        [self = shared_from_this()](const boost::system::error_code& ec,
                                                    std::size_t) { self->OnBody(ec); });
}

void Session::OnBody(boost::system::error_code ec) {
  if (finished_) return;
  // Every piece read in one completion arrived together: one timestamp for all its events.
  const Clock::time_point now = Clock::now();
  if (ec == http::error::need_buffer) ec = {};
  const std::size_t got = piece_.size() - parser_->get().body().size;
  const std::string_view piece(piece_.data(), got);
  if (status_ != 200) {
    if (body_.size() < kErrorBodyBytes)
      body_.append(piece.substr(0, kErrorBodyBytes - body_.size()));
  } else if (event_stream_) {
    events_.clear();
    const Status s = sse_.Feed(piece, events_);
    // Events completed before a malformed line still count.
    for (const SseEvent& e : events_) {
      OnEvent(e, now);
      if (finished_) return;
    }
    if (!s.ok()) return Fail(kMalformed, "malformed stream: " + s.message());
  } else {
    if (body_.size() + piece.size() > kJsonBodyBytes)
      return Fail(kMalformed, "malformed reply: a non-streamed body over " +
                                  std::to_string(kJsonBodyBytes) + " bytes");
    body_.append(piece);
  }
  if (ec == http::error::partial_message || ec == net::error::eof ||
      ec == http::error::end_of_stream || ec == net::error::connection_reset)
    return Fail(kClosed, "connection closed mid-stream: " + Received());
  if (ec) return Fail(kRead, "reading the reply: " + ec.message() + " " + Received());
  if (parser_->is_done()) return OnEnd(now);
  ReadBody();
}

void Session::OnEvent(const SseEvent& event, Clock::time_point now) {
  auto chunk = ParseCompletionChunk(event.data);
  if (!chunk) return Fail(kMalformed, "malformed stream: " + chunk.error());
  if (chunk->done) {
    // The reply is over: no need to wait for the server to close the connection.
    if (finish_reason_.empty())
      return Fail(kNoFinish, "the stream ended ([DONE]) without a finish_reason: " + Received());
    return Complete();
  }
  if (chunk->error) return Fail(kStreamError, "server error in the stream: " + *chunk->error);
  if (chunk->token_event) {
    if (token_chunks_ == 0) {
      first_token_ = now;
    } else {
      gaps_s_.push_back(std::chrono::duration<double>(now - last_token_).count());
    }
    last_token_ = now;
    ++token_chunks_;
  }
  if (!chunk->finish_reason.empty() && finish_reason_.empty()) {
    finish_reason_ = chunk->finish_reason;
    finish_seen_ = now;
  }
  // Kept up to one past the tokens asked for: more is a mismatch already (and a server that
  // streams ids without end cannot exhaust memory).
  const std::size_t room = static_cast<std::size_t>(request_.output_tokens) + 1 - reply_ids_.size();
  reply_ids_.insert(reply_ids_.end(), chunk->token_ids.begin(),
                    chunk->token_ids.begin() +
                        static_cast<std::ptrdiff_t>(std::min(room, chunk->token_ids.size())));
  usage_.KeepReports(*chunk);
}

void Session::OnEnd(Clock::time_point now) {
  if (status_ == 429 || status_ == 503) {
    return Reject("HTTP " + std::to_string(status_) + " " +
                  std::string(http::obsolete_reason(static_cast<http::status>(status_))) + ": " +
                  DescribeErrorBody(body_));
  }
  if (status_ != 200) {
    return Fail("http_" + std::to_string(status_),
                "HTTP " + std::to_string(status_) + " " +
                    std::string(http::obsolete_reason(static_cast<http::status>(status_))) + ": " +
                    DescribeErrorBody(body_));
  }
  if (!event_stream_) {
    // A server that ignored "stream": the whole reply at once, first token = last token.
    auto chunk = ParseCompletionChunk(body_);
    if (!chunk) return Fail(kMalformed, "malformed reply: " + chunk.error());
    if (chunk->error) return Fail(kStreamError, "server error in the reply: " + *chunk->error);
    OnEvent(SseEvent{"", body_, ""}, now);
    if (finished_) return;
  }
  if (finish_reason_.empty())
    return Fail(kNoFinish, "the reply ended without a finish_reason: " + Received());
  Complete();
}

void Session::Complete() {
  Request r;
  r.id = request_.id;
  r.arrival_s = arrival_s_;
  r.input_tokens = prompt_tokens_;
  r.state = RequestState::kCompleted;
  r.finish_reason = ParseFinishReason(finish_reason_);
  r.output_tokens = usage_.completion_tokens.value_or(token_chunks_);
  // Token events time the tokens whatever text they carry; the reply's last token is delivered
  // when its stream says it is finished (a server may send the finish in a chunk of its own
  // after the last token). A reply without token events (the whole text in the finishing
  // chunk): its tokens count as delivered then.
  const Clock::time_point first = token_chunks_ ? first_token_ : finish_seen_;
  const Clock::time_point last = token_chunks_ ? std::max(last_token_, finish_seen_) : finish_seen_;
  r.first_token_s = run_.RunSeconds(first);
  r.last_token_s = run_.RunSeconds(last);
  // The second chunk that carries tokens (AIPerf's TTST: first chunk to second).
  if (!gaps_s_.empty()) r.second_token_s = r.first_token_s + gaps_s_.front();
  r.finished_s = r.last_token_s;  // E2E: arrival to the last token
  r.generated_tokens = r.output_tokens;
  r.cached_tokens = usage_.cached_tokens.value_or(0);
  if (usage_.duet_tier_hit_tokens) {
    const auto& hits = *usage_.duet_tier_hit_tokens;
    constexpr Tokens kMost = std::numeric_limits<Tokens>::max();
    Tokens sum = 0;
    for (Tokens t : hits) sum = t > kMost - sum ? kMost : sum + t;
    if (sum > r.cached_tokens)
      return Fail(kMalformed, "malformed reply: duet.tier_hit_tokens add up to " +
                                  std::to_string(sum) + ", more than the " +
                                  std::to_string(r.cached_tokens) + " cached tokens it reports");
    r.tier_hit_tokens = hits;
  }
  if (usage_.duet_frontend_ms) r.frontend_s = *usage_.duet_frontend_ms / 1000.0;
  if (usage_.duet_queue_ms) r.first_scheduled_s = r.arrival_s + *usage_.duet_queue_ms / 1000.0;
  if (usage_.duet_instance) r.prefill_instance = r.decode_instance = *usage_.duet_instance;
  // The transfer's parts split the transfer: they need it. Worker processes stamp the end of the
  // prefill and the message's arrival on two clocks: where those disagree by more than the
  // message took, the server reads the message as 0 and the wait and the pull (on one clock)
  // add up to more than the whole. Only then may the parts exceed it (to a nanosecond: the server
  // writes each in ms from the same stamps).
  const auto& parts = usage_.duet_kv_transfer_parts;
  if (parts) {
    if (!usage_.duet_prefill_done_ms || !usage_.duet_kv_transfer_ms)
      return Fail(kMalformed,
                  "malformed reply: duet.kv_transfer_parts_ms without the prefill_done_ms and "
                  "kv_transfer_ms they split");
    const double sum_ms = 1000 * (parts->message_s + parts->wait_s + parts->pull_s);
    if (sum_ms > *usage_.duet_kv_transfer_ms + 1e-6 && parts->message_s > 0)
      return Fail(kMalformed, "malformed reply: duet.kv_transfer_parts_ms add up to " +
                                  ShortNumber(sum_ms) + " ms, more than the kv_transfer_ms " +
                                  ShortNumber(*usage_.duet_kv_transfer_ms) +
                                  ", with a message part that is not 0");
  }
  // The server's times from its arrival, on this run's clock from the scheduled send, as
  // queue_ms is (the request's way to the server counts into neither).
  if (usage_.duet_prefill_done_ms) {
    r.prefill_done_s = r.arrival_s + *usage_.duet_prefill_done_ms / 1000.0;
    if (usage_.duet_kv_transfer_ms) {
      r.kv_ready_s = r.prefill_done_s + *usage_.duet_kv_transfer_ms / 1000.0;
      r.kv_transfer_bytes = usage_.duet_kv_transfer_bytes.value_or(0);
      // Back from the KV's readiness: the pull and the wait as the server measured them (on the
      // decode instance's clock), the message what is left (0 where the clocks disagreed).
      if (parts) {
        r.kv_pull_started_s = std::max(0.0, r.kv_ready_s - parts->pull_s);
        r.kv_arrived_s = std::max(0.0, r.kv_pull_started_s - parts->wait_s);
      }
    }
  }
  Finish(std::move(r), "");
}

void Session::Reject(const std::string& reason) {
  Request r;
  r.id = request_.id;
  r.arrival_s = arrival_s_;
  r.input_tokens = prompt_tokens_;
  r.output_tokens = request_.output_tokens;
  r.state = RequestState::kRejected;
  r.reason = reason;
  r.finished_s = run_.RunSeconds(Clock::now());
  Finish(std::move(r), "http_" + std::to_string(status_));
}

void Session::Fail(const std::string& kind, const std::string& reason) {
  if (finished_) return;
  Request r;
  r.id = request_.id;
  r.arrival_s = arrival_s_;
  r.input_tokens = prompt_tokens_;
  r.output_tokens = request_.output_tokens;
  r.state = RequestState::kFailed;
  r.finish_reason = policies::FinishReason::kError;
  r.reason = reason;
  r.finished_s = run_.RunSeconds(Clock::now());
  Finish(std::move(r), kind);
}

void Session::Finish(Request record, const std::string& kind) {
  if (finished_) return;
  finished_ = true;
  deadline_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  run_.Record(index_, record, gaps_s_, kind, usage_, std::move(reply_ids_));
}

std::string Session::Received() const {
  if (!parser_ || status_ == 0) return "(no reply)";
  return "(" + std::to_string(token_chunks_) + " token chunks received)";
}

// A blocking HTTP GET with a deadline, for the checks before a run.
Result<std::pair<unsigned, std::string>> Get(const Endpoint& endpoint, const std::string& path,
                                             const std::string& api_key, Seconds timeout_s) {
  const std::string where = "GET " + endpoint.url + path;
  net::io_context io;
  auto addresses = Resolve(io, endpoint);
  if (!addresses) return addresses.status();
  beast::tcp_stream stream(io);
  stream.expires_after(ToDuration(timeout_s));
  http::request<http::empty_body> request(http::verb::get, endpoint.Target(path), 11);
  request.set(http::field::host, endpoint.HostHeader());
  request.set(http::field::user_agent, "duet-replay");
  request.set(http::field::connection, "close");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{16} << 20);
  boost::system::error_code failure;
  std::string step = "connect";
  stream.async_connect(*addresses, [&](const boost::system::error_code& ec, const tcp::endpoint&) {
    if (ec) {
      failure = ec;
      return;
    }
    step = "send";
    http::async_write(stream, request, [&](const boost::system::error_code& ec, std::size_t) {
      if (ec) {
        failure = ec;
        return;
      }
      step = "read";
      http::async_read(stream, buffer, parser,
                       [&](const boost::system::error_code& ec, std::size_t) { failure = ec; });
    });
  });
  io.run();
  if (failure) {
    const std::string what = failure == beast::error::timeout
                                 ? "no answer within " + FormatSeconds(timeout_s) + " s"
                                 : failure.message();
    return Status::Error(where + ": " + step + ": " + what);
  }
  return std::make_pair(parser.get().result_int(), parser.get().body());
}

}  // namespace

Result<std::string> QueryFirstModel(const Endpoint& endpoint, const std::string& api_key,
                                    Seconds timeout_s) {
  auto reply = Get(endpoint, "/v1/models", api_key, timeout_s);
  if (!reply) return reply.status();
  const std::string where = "GET " + endpoint.url + "/v1/models";
  const auto& [status, body] = *reply;
  if (status != 200)
    return Status::Error(where + ": HTTP " + std::to_string(status) + " " +
                         std::string(http::obsolete_reason(static_cast<http::status>(status))) +
                         ": " + DescribeErrorBody(body) + " (--model NAME skips this query)");
  auto model = ParseFirstModelId(body);
  if (!model) return Status::Error(where + ": " + model.error() + " (give --model NAME)");
  return model;
}

Status CheckReachable(const Endpoint& endpoint, Seconds timeout_s) {
  net::io_context io;
  auto addresses = Resolve(io, endpoint);
  if (!addresses) return addresses.status();
  beast::tcp_stream stream(io);
  stream.expires_after(ToDuration(timeout_s));
  boost::system::error_code failure;
  stream.async_connect(
      *addresses, [&](const boost::system::error_code& ec, const tcp::endpoint&) { failure = ec; });
  io.run();
  if (failure) {
    const std::string what = failure == beast::error::timeout
                                 ? "no answer within " + FormatSeconds(timeout_s) + " s"
                                 : failure.message();
    return Status::Error(endpoint.url + ": connect: " + what);
  }
  return Status::Ok();
}

Result<ReplayReport> RunReplay(const traces::Trace& trace, const ReplayOptions& options,
                               policies::MetricsCollector& metrics) {
  if (options.model.empty()) return Status::Error("no model name to send");
  DUET_RETURN_IF_ERROR(traces::CheckPromptOptions(options.prompt));
  if (!(options.timeout_s > 0 && options.timeout_s <= kMaxTimeoutS))
    return Status::Error("the request timeout must be in (0, " + FormatSeconds(kMaxTimeoutS) +
                         "] s");
  RaiseOpenFileLimit();
  net::io_context resolver_io;
  auto addresses = Resolve(resolver_io, options.endpoint);
  if (!addresses) return addresses.status();
  auto arrivals = traces::Arrivals::Create(trace, options.closed_loop);
  if (!arrivals) return arrivals.status();
  Replay replay(trace, options, metrics, *addresses, std::move(*arrivals));
  return replay.Run();
}

}  // namespace duet::backend::replay
