// Faults on the worker link, driven from the other side of a real link over loopback: a worker
// that refuses a message answers an error for its request and keeps serving (the real worker,
// RunWorker, against a frontend played by the test), the frontend ends a refused request with
// an error and keeps the worker (the real LiveFrontend against workers played by the test), and
// a request that takes down every worker it reaches is retried only so often (issue 40).
#include <gtest/gtest.h>
#include <unistd.h>

#include <deque>
#include <thread>

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
  std::optional<std::string> Next(MessageKind kind,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock lock(mu_);
    for (;;) {
      while (!frames_.empty()) {
        auto [k, body] = std::move(frames_.front());
        frames_.pop_front();
        if (k == kind) return body;
      }
      if (closed_ || !cv_.wait_for(lock, timeout, [&] { return closed_ || !frames_.empty(); }))
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

// The real worker (RunWorker) against a frontend played by the test: a message it cannot take
// costs only the request it names.
TEST_F(WorkerLink, AWorkerRefusesAMessageItCannotTakeAndServesOn) {
  auto listener = cluster::Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.error();
  cluster::WorkerOptions options;
  options.frontend = "127.0.0.1:" + std::to_string((*listener)->port());
  options.secret = kSecret;
  options.connect_timeout_s = 30;
  Status ran = Status::Error("did not run");
  std::thread worker([&] { ran = cluster::RunWorker(Model(64), options); });

  // The frontend's side of the handshake.
  const int fd = (*listener)->Accept(30);
  ASSERT_GE(fd, 0);
  auto hello = cluster::ReadFrame(fd, 30);
  ASSERT_TRUE(hello.ok()) << hello.error();
  cluster::Challenge challenge;
  challenge.nonce = std::string(cluster::kNonceBytes, 'f');
  challenge.proof =
      cluster::LinkProof(kSecret, cluster::ProofSide::kFrontend, hello->body, challenge.nonce);
  ASSERT_TRUE(
      cluster::WriteFrame(fd, MessageKind::kChallenge, cluster::EncodeChallenge(challenge)).ok());
  ASSERT_TRUE(cluster::ReadFrame(fd, 30).ok());  // its proof
  cluster::Welcome welcome;
  welcome.engine.scheduler.max_num_seqs = 8;
  welcome.engine.kv_lease_s = 60;
  ASSERT_TRUE(cluster::WriteFrame(fd, MessageKind::kWelcome, cluster::EncodeWelcome(welcome)).ok());
  Inbox inbox;
  cluster::Connection link(
      fd, [&](const FrameHeader& h, std::string body) { inbox.Push(h.kind, std::move(body)); },
      [&](const std::string&) { inbox.Closed(); });
  link.Start();

  auto new_request = [&](policies::RequestId id, float top_p) {
    policies::Request r;
    r.id = id;
    r.prompt_ids = Prompt(20, static_cast<int>(id));
    r.input_tokens = 20;
    r.output_tokens = 4;
    r.prefill_instance = r.decode_instance = 0;
    r.sampling.top_p = top_p;
    cluster::WireEngineMessage w;
    w.message = {EngineMessage::Kind::kNewRequest, nullptr, policies::kNoInstance};
    w.message.request_id = id;
    w.request = r;
    link.Send(MessageKind::kEngine, cluster::EncodeEngine(w));
  };
  // A top_p of 0 (what 1e-300 became as a float before the edge checked it).
  new_request(7, 0.0f);
  auto refusal = inbox.Next(MessageKind::kRefused);
  if (!refusal) {
    link.Close();
    worker.join();
    FAIL() << "the worker closed its link instead of refusing: " << ran.message();
  }
  auto parsed = cluster::ParseRefused(*refusal);
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_EQ(parsed->request_id, 7u);
  EXPECT_NE(parsed->reason.find("'top_p'"), std::string::npos) << parsed->reason;

  // The link is up and the worker serves the next request to its end.
  new_request(8, 1.0f);
  bool finished = false;
  while (!finished) {
    auto body = inbox.Next(MessageKind::kEvents);
    ASSERT_TRUE(body) << "no events: the link closed";
    auto events = cluster::ParseEvents(*body);
    ASSERT_TRUE(events.ok()) << events.error();
    for (const cluster::WireEvent& e : events->events) {
      if (e.kind == cluster::WireEvent::Kind::kFinished) {
        EXPECT_EQ(e.request_id, 8u);
        EXPECT_EQ(e.record->finish_reason, FinishReason::kLength);
        finished = true;
      }
    }
  }
  cluster::WireEngineMessage shutdown;
  shutdown.message = {EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance};
  link.Send(MessageKind::kEngine, cluster::EncodeEngine(shutdown));
  worker.join();
  EXPECT_TRUE(ran.ok()) << ran.message();
}

}  // namespace
}  // namespace duet::backend::serve
