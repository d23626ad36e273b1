// Faults on the worker link, driven from the other side of a real link over loopback: a worker
// that refuses a message answers an error for its request and keeps serving (the real worker,
// RunWorker, against a frontend played by the test; a worker of a directory against several), the
// frontend ends a refused request with an error and keeps the worker (the real LiveFrontend against
// workers played by the test), a request that takes down every worker it reaches is retried
// only so often (issue 40), and a worker that takes a lost worker's slot at once is routed to.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <set>
#include <thread>

#include "backend/cluster/clock_sync.h"
#include "backend/cluster/connection.h"
#include "backend/cluster/link_auth.h"
#include "backend/cluster/wire.h"
#include "backend/cluster/worker.h"
#include "tests/live/live_test_util.h"

namespace duet::backend::serve {
namespace {

using cluster::FrameHeader;
using cluster::MessageKind;
using policies::EngineMessage;
using policies::FinishReason;
using policies::InstanceRole;

constexpr char kSecret[] = "the worker link test's secret, 32 bytes or more";

// Frames one side of a link received, to wait on.
class Inbox {
 public:
  void Push(MessageKind kind, std::string body) {
    std::lock_guard lock(mu_);
    frames_.push_back({kind, std::move(body)});
    cv_.notify_all();
  }
  void Closed() {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  // The next frame of `kind` (others are dropped), or nullopt after `timeout` or once closed.
  // The timeout bounds the whole wait: the worker's heartbeats, which are dropped, do not extend
  // it.
  std::optional<std::string> Next(MessageKind kind,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(mu_);
    for (;;) {
      while (!frames_.empty()) {
        auto [k, body] = std::move(frames_.front());
        frames_.pop_front();
        if (k == kind) return body;
      }
      if (closed_ || !cv_.wait_until(lock, deadline, [&] { return closed_ || !frames_.empty(); }))
        return std::nullopt;
    }
  }
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<MessageKind, std::string>> frames_;
  bool closed_ = false;
};

class WorkerLink : public Frontend {
 protected:
  static models::ModelSpec Config() {
    auto loaded = LoadModelDir(dir_);
    EXPECT_TRUE(loaded.ok()) << loaded.error();
    return loaded->config;
  }
};

// A worker played by the test: registers into a colocated slot with the secret, then hands
// every frame it gets to its inbox. Refused (no free slot, with `expect_welcome` false): no
// connection.
class FakeWorker {
 public:
  FakeWorker(const std::string& address, const models::ModelSpec& config,
             bool expect_welcome = true) {
    auto fd = cluster::ConnectTo(address, 10.0);
    EXPECT_TRUE(fd.ok()) << fd.error();
    cluster::Hello hello;
    hello.role = InstanceRole::kColocated;
    hello.pid = ::getpid();
    hello.num_layers = config.num_hidden_layers;
    hello.vocab_size = config.vocab_size;
    hello.block_tokens = 16;
    hello.kv_bytes_per_token = config.KvBytesPerToken();
    hello.max_position_embeddings = config.max_position_embeddings;
    hello.num_blocks = 64;
    auto welcome = cluster::RegisterWorker(*fd, hello, kSecret, 10.0);
    if (!welcome.ok()) {
      EXPECT_FALSE(expect_welcome) << welcome.error();
      ::close(*fd);
      return;
    }
    instance = welcome->instance;
    connection = std::make_unique<cluster::Connection>(
        *fd,
        [this](const FrameHeader& h, std::string body) { inbox.Push(h.kind, std::move(body)); },
        [this](const std::string&) { inbox.Closed(); });
    connection->Start();
  }
  // The next request the frontend hands this worker, within `timeout`.
  std::optional<cluster::WireEngineMessage> NextRequest(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    for (;;) {
      auto body = inbox.Next(MessageKind::kEngine, timeout);
      if (!body) return std::nullopt;
      auto w = cluster::ParseEngine(*body);
      EXPECT_TRUE(w.ok()) << w.error();
      if (w->message.kind == EngineMessage::Kind::kNewRequest) return std::move(*w);
    }
  }

  Inbox inbox;
  std::unique_ptr<cluster::Connection> connection;
  policies::InstanceId instance = policies::kNoInstance;
};

// Starts a frontend over `slots` colocated worker slots while `join` registers its workers.
std::unique_ptr<LiveFrontend> StartFleet(int slots, const models::ModelSpec& config,
                                         const std::function<void(const std::string&)>& join) {
  auto listener = cluster::Listener::Open("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.error();
  const std::string address = "127.0.0.1:" + std::to_string((*listener)->port());
  WorkerFleet fleet;
  fleet.listener = std::move(*listener);
  fleet.config = config;
  fleet.register_timeout_s = 30;
  fleet.heartbeat_timeout_s = 600;  // the test's workers send no heartbeats
  fleet.secret = kSecret;
  FrontendOptions options;
  options.roles.assign(static_cast<std::size_t>(slots), InstanceRole::kColocated);
  std::thread joining([&] { join(address); });
  auto frontend = LiveFrontend::StartWithWorkers(std::move(fleet), options);
  joining.join();
  EXPECT_TRUE(frontend.ok()) << frontend.error();
  return frontend.ok() ? std::move(*frontend) : nullptr;
}

TEST_F(WorkerLink, TheFrontendEndsARefusedRequestWithAnErrorAndKeepsTheWorker) {
  const models::ModelSpec config = Config();
  std::unique_ptr<FakeWorker> worker;
  auto frontend = StartFleet(
      1, config, [&](const std::string& at) { worker.reset(new FakeWorker(at, config)); });
  ASSERT_TRUE(frontend && worker);

  auto refused = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit({Prompt(20, 1), 8, {}}, refused).status, AdmitStatus::kAccepted);
  auto request = worker->NextRequest();
  ASSERT_TRUE(request);
  worker->connection->Send(
      MessageKind::kRefused,
      cluster::EncodeRefused({request->message.request_id, "the test cannot hold it"}));
  const auto info = refused->Wait();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->reason, FinishReason::kError);
  EXPECT_NE(info->message.find("worker 0 refused it: the test cannot hold it"), std::string::npos)
      << info->message;
  // The refusing worker is told to drop whatever copy it holds, and stays in its slot.
  auto abort = worker->inbox.Next(MessageKind::kEngine);
  ASSERT_TRUE(abort);
  EXPECT_EQ(cluster::ParseEngine(*abort)->message.kind, EngineMessage::Kind::kAbort);
  EXPECT_FALSE(worker->inbox.closed());
  const auto workers = frontend->Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].up);
  EXPECT_EQ(workers[0].joins, 1);
  EXPECT_EQ(frontend->Stats().requests_retried, 0);

  // The next request goes to it as before.
  auto next = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit({Prompt(20, 2), 8, {}}, next).status, AdmitStatus::kAccepted);
  ASSERT_TRUE(worker->NextRequest());
  worker->connection->Close();
}

TEST_F(WorkerLink, ARequestThatCrashesEveryWorkerItReachesEndsWithAnError) {
  const models::ModelSpec config = Config();
  std::string address;
  std::vector<std::unique_ptr<FakeWorker>> workers;  // up: those whose link is open
  auto frontend = StartFleet(2, config, [&](const std::string& at) {
    address = at;
    for (int i = 0; i < 2; ++i) workers.push_back(std::make_unique<FakeWorker>(at, config));
  });
  ASSERT_TRUE(frontend && workers.size() == 2);

  auto poison = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit({Prompt(20, 3), 8, {}}, poison).status, AdmitStatus::kAccepted);
  // Whichever worker gets the request "crashes" (closes its link); a new worker takes the
  // free slot at once, as duet serve's restart would, so a survivor is always up.
  int crashes = 0;
  for (int round = 0; round < 6 && !poison->Wait(std::chrono::seconds(0)); ++round) {
    std::unique_ptr<FakeWorker>* holder = nullptr;
    for (int poll = 0; poll < 300 && !holder; ++poll) {
      for (auto& w : workers) {
        if (w->NextRequest(std::chrono::milliseconds(10))) holder = &w;
      }
    }
    if (!holder) break;  // none got it: it ended
    (*holder)->connection->Close();
    ++crashes;
    for (int attempt = 0; attempt < 100; ++attempt) {  // until the frontend freed the slot
      auto replacement = std::make_unique<FakeWorker>(address, config, /*expect_welcome=*/false);
      if (replacement->connection) {
        *holder = std::move(replacement);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const auto info = poison->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->reason, FinishReason::kError);
  EXPECT_NE(info->message.find("lost 3 times"), std::string::npos) << info->message;
  EXPECT_EQ(crashes, 3);
  EXPECT_EQ(frontend->Stats().requests_retried, 2);
  for (auto& w : workers)
    if (w->connection) w->connection->Close();
}

// This process's stderr made a full pipe for `stall`, as a log reader that falls behind makes
// it: whoever writes a line there waits until then. Then what was written goes on to the real
// stderr.
class StalledStderr {
 public:
  explicit StalledStderr(std::chrono::milliseconds stall) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    ::fcntl(fds[1], F_SETPIPE_SZ, 4096);
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
    const std::string fill(4096, '\0');
    while (::write(fds[1], fill.data(), fill.size()) > 0) {
    }
    ::fcntl(fds[1], F_SETFL, 0);
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[1]);
    drainer_ = std::thread([this, stall, read_end = fds[0]] {
      std::this_thread::sleep_for(stall);
      ::dup2(saved_, STDERR_FILENO);
      char buffer[4096];
      ssize_t n = 0;
      while ((n = ::read(read_end, buffer, sizeof buffer)) > 0) {  // to the writers' last line
        std::string text(buffer, static_cast<std::size_t>(n));
        std::erase(text, '\0');
        if (!text.empty() && ::write(saved_, text.data(), text.size()) < 0) break;
      }
      ::close(read_end);
    });
  }
  ~StalledStderr() {
    drainer_.join();
    ::close(saved_);
  }

 private:
  int saved_ = -1;
  std::thread drainer_;
};

// A worker that takes a lost worker's slot the moment it is free is routed to. The frontend logs
// the loss between freeing the slot and sending the lost worker's requests elsewhere; a stalled
// stderr holds it there while the newcomer registers. The slot is not free until the requests
// went elsewhere, so the router's "unavailable" for the lost worker never lands after the
// newcomer's "available" (it did: a live worker, welcomed, that no request reached again).
TEST_F(WorkerLink, AWorkerThatTakesALostWorkersSlotAtOnceGetsTheNextRequest) {
  const models::ModelSpec config = Config();
  std::string address;
  std::unique_ptr<FakeWorker> worker;
  auto frontend = StartFleet(1, config, [&](const std::string& at) {
    address = at;
    worker = std::make_unique<FakeWorker>(at, config);
  });
  ASSERT_TRUE(frontend && worker);
  for (int round = 0; round < 3; ++round) {
    auto lost = std::make_shared<Collector>();
    ASSERT_EQ(frontend->Submit({Prompt(20, 4), 8, {}}, lost).status, AdmitStatus::kAccepted)
        << "round " << round;
    ASSERT_TRUE(worker->NextRequest()) << "round " << round;
    std::unique_ptr<FakeWorker> replacement;
    {
      StalledStderr stalled(std::chrono::milliseconds(300));
      std::thread joining([&] {
        for (int attempt = 0; attempt < 500 && !replacement; ++attempt) {
          auto next = std::make_unique<FakeWorker>(address, config, /*expect_welcome=*/false);
          if (next->connection)
            replacement = std::move(next);
          else
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      });
      worker->connection->Close();
      joining.join();
    }
    ASSERT_TRUE(replacement) << "round " << round;
    worker = std::move(replacement);
    ASSERT_TRUE(lost->Wait(std::chrono::seconds(10))) << "round " << round;

    // Welcomed, the worker is routed to a moment later (once its link is up): until then the
    // frontend answers that no instance is up.
    auto next = std::make_shared<Collector>();
    Admission admitted;
    for (int attempt = 0; attempt < 200; ++attempt) {
      admitted = frontend->Submit({Prompt(20, 5), 8, {}}, next);
      if (admitted.status != AdmitStatus::kQueueFull) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(admitted.status, AdmitStatus::kAccepted)
        << "round " << round << ": " << admitted.message;
    ASSERT_TRUE(worker->NextRequest(std::chrono::seconds(10)))
        << "round " << round << ": the worker that took the slot got no request";
  }
  worker->connection->Close();
}

// A frontend played by the test on `fd`, connected to a real worker: its side of the handshake
// (the welcome it is given), then a link that answers the worker's clock probes on a run clock
// `ahead_s` ahead of this process's steady clock, as another host's frontend's may be, and
// keeps every other frame in its inbox.
class FakeFrontend {
 public:
  FakeFrontend(int fd, const cluster::Welcome& welcome, Seconds ahead_s)
      : ahead_ns_(static_cast<std::int64_t>(ahead_s * 1e9)) {
    auto hello = cluster::ReadFrame(fd, 30);
    EXPECT_TRUE(hello.ok()) << hello.error();
    cluster::Challenge challenge;
    challenge.nonce = std::string(cluster::kNonceBytes, 'f');
    challenge.proof =
        cluster::LinkProof(kSecret, cluster::ProofSide::kFrontend, hello->body, challenge.nonce);
    EXPECT_TRUE(
        cluster::WriteFrame(fd, MessageKind::kChallenge, cluster::EncodeChallenge(challenge)).ok());
    EXPECT_TRUE(cluster::ReadFrame(fd, 30).ok());  // its proof
    EXPECT_TRUE(
        cluster::WriteFrame(fd, MessageKind::kWelcome, cluster::EncodeWelcome(welcome)).ok());
    link = std::make_unique<cluster::Connection>(
        fd,
        [this](const FrameHeader& h, std::string body) {
          if (h.kind == MessageKind::kClockProbe) {
            const std::int64_t arrived = RunClockNs();
            auto probe = cluster::ParseClockProbe(body);
            EXPECT_TRUE(probe.ok()) << probe.error();
            if (probe.ok())
              link->Send(MessageKind::kClockReply,
                         cluster::EncodeClockReply({probe->sent_ns, arrived, RunClockNs()}));
            return;
          }
          inbox.Push(h.kind, std::move(body));
        },
        [this](const std::string&) { inbox.Closed(); });
    link->Start();
  }
  // This frontend's run clock.
  std::int64_t RunClockNs() const { return cluster::SteadyNowNs() + ahead_ns_; }
  Seconds Now() const { return static_cast<double>(RunClockNs()) * 1e-9; }

  // A new request of a 20-token prompt for 4 tokens, served by instance 0 (and `decode`).
  void NewRequest(policies::RequestId id, std::vector<std::int32_t> prompt, float top_p,
                  policies::InstanceId decode = 0) {
    policies::Request r;
    r.id = id;
    r.prompt_ids = std::move(prompt);
    r.input_tokens = 20;
    r.output_tokens = 4;
    r.prefill_instance = 0;
    r.decode_instance = decode;
    r.sampling.top_p = top_p;
    r.arrival_s = Now();
    for (std::size_t b = 0; b + 16 <= r.prompt_ids.size(); b += 16)
      r.block_hashes.push_back(1000 + r.prompt_ids[b]);
    cluster::WireEngineMessage w;
    w.message = {EngineMessage::Kind::kNewRequest, nullptr, policies::kNoInstance};
    w.message.request_id = id;
    w.request = r;
    link->Send(MessageKind::kEngine, cluster::EncodeEngine(w));
  }
  // The refusal of the next message the worker refuses, or nullopt once the link closed.
  std::optional<cluster::Refusal> NextRefusal() {
    auto refusal = inbox.Next(MessageKind::kRefused);
    if (!refusal) return std::nullopt;
    auto parsed = cluster::ParseRefused(*refusal);
    EXPECT_TRUE(parsed.ok()) << parsed.error();
    return parsed.ok() ? std::optional(*parsed) : std::nullopt;
  }
  // Events until request `id` finished (its record), the KV cache's stored hashes among them
  // added to `stored`; nullopt if the link closed first.
  std::optional<policies::RequestRecord> Finished(policies::RequestId id,
                                                  std::set<policies::BlockHash>* stored) {
    for (;;) {
      auto body = inbox.Next(MessageKind::kEvents);
      if (!body) return std::nullopt;
      auto events = cluster::ParseEvents(*body);
      EXPECT_TRUE(events.ok()) << events.error();
      if (!events.ok()) return std::nullopt;
      Take(*events, stored);
      for (const cluster::WireEvent& e : events->events)
        if (e.kind == cluster::WireEvent::Kind::kFinished && e.request_id == id) return e.record;
    }
  }
  // Events frames until none came for `quiet`, the stored hashes added to `stored`.
  void ReadEvents(std::set<policies::BlockHash>* stored, std::chrono::milliseconds quiet) {
    while (auto body = inbox.Next(MessageKind::kEvents, quiet)) {
      auto events = cluster::ParseEvents(*body);
      ASSERT_TRUE(events.ok()) << events.error();
      Take(*events, stored);
    }
  }
  void Shutdown() {
    cluster::WireEngineMessage shutdown;
    shutdown.message = {EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance};
    link->Send(MessageKind::kEngine, cluster::EncodeEngine(shutdown));
  }

  Inbox inbox;
  std::unique_ptr<cluster::Connection> link;
  std::int64_t token_gaps = 0;  // ITL samples the events read so far carried

 private:
  // What a frame of events says of the cache (its stored hashes kept in `stored`) and of the
  // token gaps.
  void Take(const cluster::Events& events, std::set<policies::BlockHash>* stored) {
    for (const cluster::WireEvent& e : events.events) {
      if (e.kind == cluster::WireEvent::Kind::kTokenGaps) token_gaps += e.count;
      for (const policies::KvCacheEvent& k : e.kv_events) {
        if (k.stored) {
          stored->insert(k.hash);
        } else {
          stored->erase(k.hash);
        }
      }
    }
  }

  std::int64_t ahead_ns_;
};

// The welcome a frontend played by the test gives.
cluster::Welcome TestWelcome() {
  cluster::Welcome welcome;
  welcome.engine.scheduler.max_num_seqs = 8;
  welcome.engine.kv_lease_s = 60;
  return welcome;
}

// The real worker (RunWorker) on a thread, registered with a frontend played by the test (whose
// run clock is kRunClockAheadS ahead of this process's steady clock).
class RealWorker {
 public:
  static constexpr Seconds kRunClockAheadS = 1000;

  RealWorker(std::unique_ptr<ForwardModel> model, cluster::WorkerOptions options) {
    auto listener = cluster::Listener::Open("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.error();
    options.frontend = "127.0.0.1:" + std::to_string((*listener)->port());
    options.secret = kSecret;
    options.connect_timeout_s = 30;
    thread_ = std::thread([this, m = std::move(model), options]() mutable {
      ran = cluster::RunWorker(std::move(m), options);
    });
    const int fd = (*listener)->Accept(30);
    EXPECT_GE(fd, 0);
    frontend = std::make_unique<FakeFrontend>(fd, TestWelcome(), kRunClockAheadS);
  }
  ~RealWorker() {
    if (thread_.joinable()) Stop();
  }
  void Stop() {
    frontend->Shutdown();
    thread_.join();
  }

  std::unique_ptr<FakeFrontend> frontend;
  Status ran = Status::Error("did not run");

 private:
  std::thread thread_;
};

// A message the worker cannot take costs only the request it names. The request it serves is
// stamped on the frontend's clock, which its probes measured.
TEST_F(WorkerLink, AWorkerRefusesAMessageItCannotTakeAndServesOn) {
  RealWorker worker(Model(64), {});
  const Seconds sent_s = worker.frontend->Now();
  // A top_p of 0 (what 1e-300 became as a float before the edge checked it).
  worker.frontend->NewRequest(7, Prompt(20, 7), 0.0f);
  auto refusal = worker.frontend->NextRefusal();
  ASSERT_TRUE(refusal) << "the worker closed its link instead of refusing";
  EXPECT_EQ(refusal->request_id, 7u);
  EXPECT_NE(refusal->reason.find("'top_p'"), std::string::npos) << refusal->reason;

  // The link is up and the worker serves the next request to its end.
  worker.frontend->NewRequest(8, Prompt(20, 8), 1.0f);
  bool finished = false;
  while (!finished) {
    auto body = worker.frontend->inbox.Next(MessageKind::kEvents);
    ASSERT_TRUE(body) << "no events: the link closed";
    auto events = cluster::ParseEvents(*body);
    ASSERT_TRUE(events.ok()) << events.error();
    for (const cluster::WireEvent& e : events->events) {
      if (e.kind == cluster::WireEvent::Kind::kFinished) {
        EXPECT_EQ(e.request_id, 8u);
        EXPECT_EQ(e.record->finish_reason, FinishReason::kLength);
        // Within the clock's error (half a probe's round trip: small, but a loaded machine's
        // may take a while), far from the 1000 s it would be off without the probes.
        EXPECT_GE(e.record->finished_s, sent_s - 0.5);
        EXPECT_LE(e.record->finished_s, worker.frontend->Now() + 0.5);
        finished = true;
      }
    }
  }
  worker.Stop();
  EXPECT_TRUE(worker.ran.ok()) << worker.ran.message();
}

// A prefill worker holds a prefilled request's KV blocks under its id until the decode side
// releases them: a new request with that id is refused (its blocks would trip the block
// manager's invariant and end the process), and once released the id may come again.
TEST_F(WorkerLink, APrefillWorkerRefusesARequestWhoseIdItHoldsALeaseFor) {
#if !DUET_HAVE_UCX
  GTEST_SKIP() << "this build has no UCX (libucx-dev, which scripts/setup.sh installs): a "
                  "prefill worker's KV transport is UCX";
#endif
  cluster::WorkerOptions options;
  options.role = InstanceRole::kPrefill;
  options.kv_transport.transport = "ucx";
  options.kv_transport.ucx_tls = "tcp";
  auto loaded = LoadModelDir(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  CpuModelOptions model_options;
  model_options.num_blocks = 64;
  model_options.threads = 1;
  model_options.kv_allocator = KvTransportAllocator(options.kv_transport);
  auto model = CpuModel::Create(std::move(*loaded), model_options);
  ASSERT_TRUE(model.ok()) << model.error();
  RealWorker worker(std::move(*model), options);

  worker.frontend->NewRequest(9, Prompt(20, 9), 1.0f, /*decode=*/1);
  for (;;) {  // its KV is ready for instance 1: the worker holds a lease on it
    auto body = worker.frontend->inbox.Next(MessageKind::kEngine);
    ASSERT_TRUE(body) << "no KV-ready: the link closed";
    if (cluster::ParseEngine(*body)->message.kind == EngineMessage::Kind::kKvReady) break;
  }
  worker.frontend->NewRequest(9, Prompt(20, 9), 1.0f, /*decode=*/1);
  auto refusal = worker.frontend->NextRefusal();
  ASSERT_TRUE(refusal) << "the worker closed its link instead of refusing";
  EXPECT_EQ(refusal->request_id, 9u);
  EXPECT_NE(refusal->reason.find("already held here"), std::string::npos) << refusal->reason;

  cluster::WireEngineMessage release;
  release.message = {EngineMessage::Kind::kKvRelease, nullptr, 1};
  release.message.request_id = 9;
  const std::string released = cluster::EncodeEngine(release);
  worker.frontend->link->Send(MessageKind::kEngine, released);
  worker.frontend->NewRequest(9, Prompt(20, 9), 1.0f, /*decode=*/1);  // released: served again
  for (;;) {
    auto body = worker.frontend->inbox.Next(MessageKind::kEngine);
    ASSERT_TRUE(body) << "no KV-ready: the link closed";
    if (cluster::ParseEngine(*body)->message.kind == EngineMessage::Kind::kKvReady) break;
  }
  worker.frontend->link->Send(MessageKind::kEngine,
                              released);  // else the worker waits out the lease
  worker.Stop();
  EXPECT_TRUE(worker.ran.ok()) << worker.ran.message();
}

// Found through a directory, a worker serves every frontend that connects: each with request
// ids and a clock of its own (one id from two frontends is two requests; each one's records are
// on its own clock, its token gaps its own), a frontend that joins later is sent the prefix cache's
// contents first, one that gives another instance id is refused, one that is lost costs only its
// own link, and one that shuts down has its link closed while the worker serves on until told to
// stop.
TEST_F(WorkerLink, AWorkerOfADirectoryServesEveryFrontendOnItsOwnIdsAndClock) {
  auto listener = cluster::Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.error();
  const std::string address = "127.0.0.1:" + std::to_string((*listener)->port());
  std::atomic<bool> stop{false};
  cluster::WorkerOptions options;
  options.secret = kSecret;
  options.await_frontend = [&](Seconds timeout_s) -> Result<int> {
    return (*listener)->Accept(timeout_s);
  };
  options.stop_requested = [&] { return stop.load(); };
  Status ran = Status::Error("did not run");
  std::thread worker([&] { ran = cluster::RunWorker(Model(64), options); });
  auto connect = [&](const cluster::Welcome& welcome, Seconds ahead_s) {
    auto fd = cluster::ConnectTo(address, 30);
    EXPECT_TRUE(fd.ok()) << fd.error();
    return std::make_unique<FakeFrontend>(*fd, welcome, ahead_s);
  };
  cluster::Welcome welcome = TestWelcome();
  welcome.publish_kv_events = true;
  auto a = connect(welcome, 1000);
  std::set<policies::BlockHash> seen_by_a, seen_by_b;
  a->NewRequest(5, Prompt(20, 5), 1.0f);
  auto first = a->Finished(5, &seen_by_a);
  ASSERT_TRUE(first) << "the link closed";
  EXPECT_EQ(first->finish_reason, FinishReason::kLength);
  a->ReadEvents(&seen_by_a, std::chrono::milliseconds(500));
  ASSERT_FALSE(seen_by_a.empty()) << "its prompt's full block is cached";

  // Another frontend, its clock 4000 s ahead of the first's: sent the cache before anything.
  auto b = connect(welcome, 5000);
  b->ReadEvents(&seen_by_b, std::chrono::milliseconds(500));
  EXPECT_EQ(seen_by_b, seen_by_a);

  // One id from both: two requests, each reported to its own frontend, on its own clock, with
  // its own token gaps (3 each: 4 tokens), though one step decodes both.
  const Seconds a_sent = a->Now(), b_sent = b->Now();
  a->token_gaps = b->token_gaps = 0;
  a->NewRequest(6, Prompt(20, 6), 1.0f);
  b->NewRequest(6, Prompt(20, 7), 1.0f);
  auto at_a = a->Finished(6, &seen_by_a);
  auto at_b = b->Finished(6, &seen_by_b);
  ASSERT_TRUE(at_a && at_b) << "a link closed";
  EXPECT_EQ(at_a->finish_reason, FinishReason::kLength);
  EXPECT_EQ(at_b->finish_reason, FinishReason::kLength);
  EXPECT_EQ(a->token_gaps, 3);
  EXPECT_EQ(b->token_gaps, 3);
  // Within the clocks' errors (half a probe's round trip each), far from the 4000 s between.
  EXPECT_GE(at_a->finished_s, a_sent - 0.5);
  EXPECT_LE(at_a->finished_s, a->Now() + 0.5);
  EXPECT_GE(at_b->finished_s, b_sent - 0.5);
  EXPECT_LE(at_b->finished_s, b->Now() + 0.5);

  // A frontend that gives the worker another instance id is refused: its link closes.
  cluster::Welcome other = welcome;
  other.instance = 3;
  auto c = connect(other, 0);
  EXPECT_FALSE(c->inbox.Next(MessageKind::kEvents, std::chrono::seconds(10)));
  EXPECT_TRUE(c->inbox.closed());

  // The first frontend lost: the second is served on.
  a->link->Close();
  b->NewRequest(7, Prompt(20, 8), 1.0f);
  auto after = b->Finished(7, &seen_by_b);
  ASSERT_TRUE(after) << "the link closed";
  EXPECT_EQ(after->finish_reason, FinishReason::kLength);

  // The second shuts it down: its link closes, and the worker waits for others until stopped.
  b->Shutdown();
  EXPECT_FALSE(b->inbox.Next(MessageKind::kEngine, std::chrono::seconds(10)));
  EXPECT_TRUE(b->inbox.closed());
  stop = true;
  worker.join();
  EXPECT_TRUE(ran.ok()) << ran.message();
}

}  // namespace
}  // namespace duet::backend::serve
