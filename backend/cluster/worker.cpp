// A worker process's side of the frontend link (see worker.h).
#include "backend/cluster/worker.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "backend/cluster/clock_sync.h"
#include "backend/cluster/connection.h"
#include "backend/cluster/link_auth.h"
#include "backend/cluster/link_faults.h"
#include "backend/cluster/wire.h"
#include "backend/engine/engine_thread.h"

namespace duet::backend::cluster {

using policies::EngineMessage;
using policies::InstanceRole;
using policies::Request;
using policies::RequestId;
using policies::RequestRecord;
using policies::RequestSpec;

namespace {

// Probes at registration (the tightest sets the clock), how long each may wait for its reply,
// and how often one follows while serving.
constexpr int kClockProbesAtStart = 8;
constexpr Seconds kClockProbeTimeoutS = 2.0;
constexpr Seconds kClockProbeEveryS = 5.0;
// Discovery: what a connection to this worker's port has for the whole handshake.
constexpr Seconds kAcceptedHandshakeS = 3.0;

// The worker's half of the link: the engine's outbox and event sink (engine thread), the
// requests it holds, and the frames from the frontend (reader thread).
class WorkerLink final : public policies::Outbox, public policies::EventSink {
 public:
  WorkerLink(InstanceRole role, std::int64_t vocab_size, WorkerKvTransport& transport,
             SyncedClock& clock)
      : role_(role), vocab_size_(vocab_size), transport_(transport), clock_(clock) {}

  // `send`: the connection's send path (with the test-only faults, link_faults.h).
  void Attach(FaultInjectingLink* send, EngineThread* engine) {
    send_ = send;
    engine_ = engine;
  }

  // --- Outbox (engine thread): KV-ready and KV-release go to the frontend, which relays them.
  void Send(policies::InstanceId to, const EngineMessage& message) override {
    WireEngineMessage w{to, message, std::nullopt};
    w.message.request = nullptr;
    if (message.kind == EngineMessage::Kind::kKvReady) {
      w.message.request_id = message.request->id;
      w.request = *message.request;
      handed_off_.push_back(message.request->id);  // the decode instance serves it now
      std::lock_guard lock(mu_);
      leases_.insert(message.request->id);
    }
    FlushEvents();  // keeps this message after the events that came before it
    (*send_)(MessageKind::kEngine, EncodeEngine(w));
  }

  // --- EventSink (engine thread): buffered, sent after each iteration, but for the token a
  // decode instance delivers when a pull completes: that one is raised before the iteration's
  // step, which it would otherwise wait for (a whole step added to the request's TTFT).
  void OnToken(const RequestSpec& spec, const RequestRecord& record, std::int32_t token) override {
    WireEvent e;
    e.kind = WireEvent::Kind::kToken;
    e.request_id = spec.id;
    e.token = token;
    events_.events.push_back(std::move(e));
    if (role_ == InstanceRole::kDecode && record.generated_tokens == 1) FlushEvents();
  }
  void OnFinished(const RequestSpec& spec, const RequestRecord& record) override {
    Push(WireEvent::Kind::kFinished, spec.id, record);
    handed_off_.push_back(spec.id);
  }
  void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) override {
    Push(WireEvent::Kind::kPrefillDone, spec.id, record);
  }
  void OnPreempted(const RequestSpec& spec, const RequestRecord& record,
                   policies::InstanceId) override {
    Push(WireEvent::Kind::kPreempted, spec.id, record);
  }
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override {
    WireEvent e;
    e.kind = WireEvent::Kind::kTokenGaps;
    e.gap_s = gap_s;
    e.count = count;
    events_.events.push_back(std::move(e));
  }
  void OnKvEvents(policies::InstanceId, std::span<const policies::KvCacheEvent> events) override {
    WireEvent e;
    e.kind = WireEvent::Kind::kKvEvents;
    e.kv_events.assign(events.begin(), events.end());
    events_.events.push_back(std::move(e));
  }

  // Engine thread, after every iteration: sends what it produced and lets go of the requests
  // that finished or moved on.
  void AfterIteration() {
    FlushEvents();
    if (handed_off_.empty()) return;
    std::lock_guard lock(mu_);
    for (RequestId id : handed_off_) requests_.erase(id);
    handed_off_.clear();
  }

  // Reader thread: one frame from the frontend. A message this worker cannot take is refused
  // and the link stays: the framing is intact (the reader checked the header), and one bad
  // message, a bug on the frontend's side, must cost no more than the request it names,
  // which the frontend then ends with an error.
  void OnFrame(const FrameHeader& header, const std::string& body) {
    const std::int64_t arrived_ns = SteadyNowNs();  // t3 of a clock reply
    Status s = header.kind == MessageKind::kClockReply ? OnClockReply(body, arrived_ns)
                                                       : Handle(header, body);
    if (s.ok()) return;
    std::fprintf(stderr, "duet worker: refused a message from the frontend: %s\n",
                 s.message().c_str());
    if (header.kind != MessageKind::kEngine) return;
    if (const auto id = EngineRequestId(body))
      (*send_)(MessageKind::kRefused, EncodeRefused({*id, s.message()}));
  }

  // When the link is lost: ends everything held, so the engine thread stops at once.
  void AbandonAll() {
    std::lock_guard lock(mu_);
    for (RequestId id : requests_) {
      EngineMessage m{EngineMessage::Kind::kAbort, nullptr, policies::kNoInstance};
      m.request_id = id;
      engine_->inbox().Post(m);
    }
    for (RequestId id : leases_) {
      EngineMessage m{EngineMessage::Kind::kKvRelease, nullptr, policies::kNoInstance};
      m.request_id = id;
      engine_->inbox().Post(m);
    }
  }

  // Any thread: a clock probe (clock_sync.h), with this worker's offset and error so far.
  void SendClockProbe() {
    ClockProbe probe;
    if (const auto current = clock_.Current()) {
      probe.offset_ns = current->offset_ns;
      probe.error_ns = current->error_ns;
    }
    {
      std::lock_guard lock(mu_);
      probe.sent_ns = SteadyNowNs();
      // A reply lost with its link leaves its probe here: the oldest go first.
      if (probes_.size() >= kMaxProbesInFlight) probes_.erase(probes_.begin());
      probes_.insert(probe.sent_ns);
    }
    (*send_)(MessageKind::kClockProbe, EncodeClockProbe(probe));
  }

  // Before the engine starts: `probes` probes one after another, each answered within
  // `timeout_s` or given up; the clock takes the tightest. Whether one was answered.
  bool SyncClock(int probes, Seconds timeout_s) {
    for (int i = 0; i < probes; ++i) {
      std::unique_lock lock(mu_);
      const std::int64_t before = clock_replies_;
      lock.unlock();
      SendClockProbe();
      lock.lock();
      cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                   [&] { return clock_replies_ != before || lost_; });
      if (lost_) return false;
    }
    return clock_.Current().has_value();
  }

  bool WaitShutdown(Seconds heartbeat_s, const std::function<void()>& heartbeat) {
    std::unique_lock lock(mu_);
    while (!shutdown_ && !lost_) {
      if (!cv_.wait_for(lock, std::chrono::duration<double>(heartbeat_s),
                        [&] { return shutdown_ || lost_; })) {
        lock.unlock();
        heartbeat();
        lock.lock();
      }
    }
    return shutdown_;
  }
  void Lost(const std::string& why) {
    {
      std::lock_guard lock(mu_);
      if (!shutdown_) lost_why_ = why;
      lost_ = true;
    }
    cv_.notify_all();
  }
  std::string lost_why() {
    std::lock_guard lock(mu_);
    return lost_why_;
  }

 private:
  void Push(WireEvent::Kind kind, RequestId id, const RequestRecord& record) {
    WireEvent e;
    e.kind = kind;
    e.request_id = id;
    e.record = record;
    events_.events.push_back(std::move(e));
  }

  void FlushEvents() {
    if (events_.events.empty()) return;
    events_.load = engine_->load();
    (*send_)(MessageKind::kEvents, EncodeEvents(events_));
    events_.events.clear();
  }

  Status Handle(const FrameHeader& header, const std::string& body) {
    if (header.kind == MessageKind::kPeer) {
      Result<Peer> peer = ParsePeer(body);
      if (!peer.ok()) return peer.status();
      if (role_ == InstanceRole::kDecode)
        transport_.SetPeer(peer->instance, std::move(peer->kv_descriptor));
      return Status::Ok();
    }
    if (header.kind != MessageKind::kEngine)
      return Status::Error("unexpected message kind " +
                           std::to_string(static_cast<int>(header.kind)));
    Result<WireEngineMessage> w = ParseEngine(body);
    if (!w.ok()) return w.status();
    EngineMessage m = w->message;
    using Kind = EngineMessage::Kind;
    if (m.kind == Kind::kShutdown) {
      {
        std::lock_guard lock(mu_);
        shutdown_ = true;
      }
      cv_.notify_all();
      return Status::Ok();
    }
    const bool decode = role_ == InstanceRole::kDecode;
    if ((m.kind == Kind::kNewRequest && decode) || (m.kind == Kind::kKvReady && !decode) ||
        (m.kind == Kind::kKvRelease && role_ != InstanceRole::kPrefill)) {
      return Status::Error(std::string("a ") + KindName(m.kind) + " message for a " +
                           policies::ToString(role_) + " instance");
    }
    std::lock_guard lock(mu_);
    if (m.kind == Kind::kKvRelease) leases_.erase(m.request_id);
    if (w->request) {
      Request& r = *w->request;
      if (Status s = CheckRequest(r, m.kind); !s.ok()) return s;
      // A prefill instance's lease keeps the request's KV blocks under its id until released:
      // a request that came again with that id would trip the block manager's invariant.
      if (requests_.count(r.id) || leases_.count(r.id)) {
        return Status::Error("request " + std::to_string(r.id) + " is already held here");
      }
      requests_.insert(r.id);
      m.request = std::make_shared<Request>(std::move(r));  // the engine's from now on
    }
    engine_->inbox().Post(m);
    return Status::Ok();
  }

  // What the engine assumes of a request it is handed beyond what the parser bounds.
  Status CheckRequest(const Request& r, EngineMessage::Kind kind) const {
    const std::string what = "request " + std::to_string(r.id) + ": ";
    for (const auto* ids : {&r.prompt_ids, &r.output_ids}) {
      for (std::int32_t token : *ids) {
        if (token >= vocab_size_)
          return Status::Error(what + "token id " + std::to_string(token) +
                               " is outside the vocabulary");
      }
    }
    if (kind == EngineMessage::Kind::kNewRequest && r.generated_tokens != 0)
      return Status::Error(what + "a new request has generated no tokens yet");
    if (kind == EngineMessage::Kind::kKvReady &&
        (r.generated_tokens < 1 || r.generated_tokens >= r.output_tokens))
      return Status::Error(what + "KV-ready after its first token and before its last");
    return Status::Ok();
  }

  static const char* KindName(EngineMessage::Kind kind) {
    switch (kind) {
      case EngineMessage::Kind::kNewRequest:
        return "new-request";
      case EngineMessage::Kind::kKvReady:
        return "KV-ready";
      case EngineMessage::Kind::kKvRelease:
        return "KV-release";
      default:
        return "engine";
    }
  }

  // Reader thread: a reply to one of this worker's probes sets the clock, when it is tighter
  // than what the clock holds. A reply to no probe of this worker, or one whose times cannot
  // be, is refused (logged; the link stays).
  Status OnClockReply(const std::string& body, std::int64_t arrived_ns) {
    Result<ClockReply> reply = ParseClockReply(body);
    if (!reply.ok()) return reply.status();
    {
      std::lock_guard lock(mu_);
      if (probes_.erase(reply->probe_sent_ns) == 0)
        return Status::Error("a clock reply to no probe of this worker");
    }
    Result<ClockSample> sample =
        SampleOfProbe(reply->probe_sent_ns, reply->received_ns, reply->sent_ns, arrived_ns);
    if (!sample.ok()) return sample.status();
    clock_.Offer(*sample);
    {
      std::lock_guard lock(mu_);
      ++clock_replies_;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  // The clock probes this worker sent and has no reply to yet (their t0).
  static constexpr std::size_t kMaxProbesInFlight = 16;

  const InstanceRole role_;
  const std::int64_t vocab_size_;
  WorkerKvTransport& transport_;
  FaultInjectingLink* send_ = nullptr;
  SyncedClock& clock_;
  EngineThread* engine_ = nullptr;
  Events events_;                      // engine thread
  std::vector<RequestId> handed_off_;  // engine thread

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::unordered_set<RequestId> requests_;  // handed to the engine, not finished or moved on
  std::unordered_set<RequestId> leases_;    // KV held for a decode instance's pull
  std::set<std::int64_t> probes_;           // clock probes in flight
  std::int64_t clock_replies_ = 0;
  bool shutdown_ = false;
  bool lost_ = false;
  std::string lost_why_;
};

}  // namespace

Result<Welcome> RegisterWorker(int fd, Hello hello, std::string_view secret, Seconds timeout_s) {
  auto nonce = RandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  hello.nonce = *nonce;
  const std::string hello_body = EncodeHello(hello);
  if (Status s = WriteFrame(fd, MessageKind::kHello, hello_body); !s.ok()) return s;
  // The frontend proves it holds the secret first, over this worker's nonce; then this worker
  // proves it over the frontend's nonce.
  auto reply = ReadFrame(fd, timeout_s, kMaxHandshakeBodyBytes);
  if (!reply.ok())
    return Status::Error(reply.error() + " (the frontend's log says why it refused)");
  if (reply->header.kind != MessageKind::kChallenge)
    return Status::Error(
        "the frontend answered the hello with no challenge (another duet version?)");
  Result<Challenge> challenge = ParseChallenge(reply->body);
  if (!challenge.ok()) return challenge.status();
  if (!ConstantTimeEquals(LinkProof(secret, ProofSide::kFrontend, hello_body, challenge->nonce),
                          challenge->proof)) {
    return Status::Error(std::string("the frontend did not prove it holds the worker secret "
                                     "(another --worker-secret-file or $") +
                         kWorkerSecretEnv + " than this worker's, or not a duet serve)");
  }
  if (Status s = WriteFrame(
          fd, MessageKind::kProof,
          EncodeProof(LinkProof(secret, ProofSide::kWorker, hello_body, challenge->nonce)));
      !s.ok())
    return s;
  reply = ReadFrame(fd, timeout_s);
  if (!reply.ok())
    return Status::Error(reply.error() + " (the frontend's log says why it refused)");
  if (reply->header.kind != MessageKind::kWelcome)
    return Status::Error("the frontend answered with no welcome");
  return ParseWelcome(reply->body);
}

Status RunWorker(std::unique_ptr<ForwardModel> model, const WorkerOptions& options) {
  const models::ModelSpec& config = model->config();
  auto transport =
      WorkerKvTransport::Create(options.role, model->kv_region(), options.kv_transport);
  if (!transport.ok()) return Status::Error("KV transport: " + transport.error());

  // Warm up before registering, not on the engine thread when it starts (EngineThread::Start's
  // default): the frontend routes to a worker as soon as it registers, and a warm-up after that
  // delayed the first request by as much (0.5 s for the bench model on one thread). The engine
  // thread's own per-thread kernel state starts cold, which costs its first steps a few
  // milliseconds; the memory, the weights' pages first, is warm. A warm-up pass that failed
  // leaves the model cold, not unusable: each step that fails later ends its own requests.
  (void)WarmUp(*model, WarmUpPrompt(*model));

  auto fault = LinkFaultFromEnvironment();  // tests only
  if (!fault.ok()) return fault.status();

  // Register: hello, then the frontend's welcome.
  Hello hello;
  hello.role = options.role;
  hello.pid = ::getpid();
  hello.num_layers = config.num_hidden_layers;
  hello.vocab_size = config.vocab_size;
  hello.block_tokens = model->block_tokens();
  hello.kv_bytes_per_token = model->kv_bytes_per_token();
  hello.max_position_embeddings = config.max_position_embeddings;
  hello.num_blocks = model->num_blocks();
  hello.kv_descriptor = (*transport)->descriptor();
  Result<int> fd = Status::Error("not connected");
  Result<Welcome> welcome = Status::Error("not registered");
  while (true) {
    fd = options.await_frontend ? options.await_frontend()
                                : ConnectTo(options.frontend, options.connect_timeout_s);
    if (!fd.ok()) return Status::Error("reaching the frontend: " + fd.error());
    // A connection this worker took (discovery) may be anything: it has the frontend's 3 s
    // for the handshake, and one that fails costs only itself.
    welcome =
        RegisterWorker(*fd, hello, options.secret,
                       options.await_frontend ? kAcceptedHandshakeS : options.connect_timeout_s);
    if (welcome.ok()) break;
    ::close(*fd);
    if (!options.await_frontend)
      return Status::Error("registering with the frontend at " + options.frontend + ": " +
                           welcome.error());
    std::fprintf(stderr, "duet worker: a connection that is no frontend of this worker: %s\n",
                 welcome.error().c_str());
  }

  // The frontend checked the hello's block size and KV bytes against these settings.
  if (welcome->engine.block_tokens != model->block_tokens()) {
    ::close(*fd);
    return Status::Error("the frontend's engine.block_tokens is " +
                         std::to_string(welcome->engine.block_tokens) + ", this worker's " +
                         std::to_string(model->block_tokens()) + " (--block-tokens)");
  }
  (*transport)->SetSelf(welcome->instance);
  policies::EngineConfig engine_config =
      deploy::MakeEngineConfig(welcome->engine, welcome->instance, options.role);
  engine_config.publish_kv_events = welcome->publish_kv_events;
  engine_config.num_blocks = model->num_blocks();
  engine_config.kv_bytes_per_token = model->kv_bytes_per_token();
  engine_config.num_layers = config.num_hidden_layers;
  // The run's clock: this machine's steady clock set to the frontend's by the probes below.
  SyncedClock clock;

  WorkerLink link(options.role, config.vocab_size, **transport, clock);
  EngineThread engine(
      engine_config, *model,
      EngineThread::Ports{&clock, &link, transport->get(), &link, options.step_log},
      [&link] { link.AfterIteration(); }, /*warm_up=*/false);
  Connection connection(
      *fd, [&link](const FrameHeader& h, std::string body) { link.OnFrame(h, body); },
      [&link](const std::string& why) { link.Lost(why); });
  FaultInjectingLink send(
      [&connection](MessageKind kind, const std::string& body) { connection.Send(kind, body); },
      std::move(*fault));
  send.SetInstance(welcome->instance);
  link.Attach(&send, &engine);
  connection.Start();
  // The engine stamps the requests' timelines on this clock: it starts once the clock is set.
  // What the frontend routes here meanwhile waits in the engine's inbox.
  if (!link.SyncClock(kClockProbesAtStart, kClockProbeTimeoutS)) {
    connection.Close();
    return Status::Error(link.lost_why().empty()
                             ? "the frontend answered none of " +
                                   std::to_string(kClockProbesAtStart) + " clock probes"
                             : "lost the frontend: " + link.lost_why());
  }
  engine.Start();
  std::fprintf(stderr, "duet worker: instance %d (%s), pid %d, KV over %s\n", welcome->instance,
               policies::ToString(options.role), static_cast<int>(hello.pid),
               (*transport)->path().c_str());

  // A probe every kClockProbeEveryS keeps the offset within its error as the clocks drift.
  const auto heartbeats_per_probe = static_cast<std::int64_t>(
      std::max(1.0, std::ceil(kClockProbeEveryS / welcome->heartbeat_interval_s)));
  std::int64_t heartbeats = 0;
  const bool shutdown = link.WaitShutdown(welcome->heartbeat_interval_s, [&] {
    send(MessageKind::kHeartbeat, EncodeHeartbeat(engine.load()));
    if (++heartbeats % heartbeats_per_probe == 0) link.SendClockProbe();
  });
  if (!shutdown) link.AbandonAll();
  engine.Stop();  // serves what it holds to the end (nothing, once abandoned)
  if (!shutdown) return Status::Error("lost the frontend: " + link.lost_why());
  connection.WaitSent(10.0);
  return Status::Ok();
}

}  // namespace duet::backend::cluster
