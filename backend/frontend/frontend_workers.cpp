// The live frontend over worker processes (see frontend.h, WorkerFleet): registration into
// role slots, the relay of engine messages between workers, their events into the shared
// InstanceSink, heartbeats, and the retry of a lost worker's requests on survivors. A
// registration is a handshake on a thread of its own (mutual proof of the shared secret, then
// the model and slot checks); whatever a worker reports afterwards is bounded by what it said
// at hello.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <list>
#include <map>
#include <set>
#include <thread>

#include "backend/cluster/link_auth.h"
#include "backend/cluster/wire.h"
#include "backend/frontend/frontend_impl.h"
#include "policies/block_hash.h"

namespace duet::backend::serve {

using cluster::Connection;
using cluster::MessageKind;
using policies::EngineMessage;
using policies::InstanceId;
using policies::InstanceRole;
using policies::Request;
using policies::RequestId;
using Impl = LiveFrontend::Impl;

struct LiveFrontend::Impl::Fleet {
  struct Slot {
    InstanceRole role = InstanceRole::kColocated;
    std::shared_ptr<Connection> connection;  // null while no worker holds the slot
    std::int64_t pid = 0;
    std::int64_t joins = 0;
    std::uint64_t generation = 0;  // of the connection holding it (events of older ones drop)
    std::string kv_descriptor;
    InstanceLoad load;
    // The counters of the slot's earlier workers (lost ones), which load() adds: totals a
    // scrape reads must not fall back when a worker is replaced.
    InstanceLoad carried;
    std::chrono::steady_clock::time_point last_heard;
    // The worker's clock against this frontend's, as its last probe said (clock_sync.h).
    std::optional<std::int64_t> clock_offset_ns;
    std::optional<std::int64_t> clock_error_ns;
    // A handshake holds the slot for its worker (two registering at once never get the same).
    bool joining = false;
    // Its lost worker's requests are being sent elsewhere (Failover): until they are, a new
    // worker may not take the slot, or the router would mark the newcomer unavailable after it
    // joined and route nothing to it again.
    bool failing_over = false;
    std::string discovery_key;  // the directory's key of the worker holding it (discovery)
    bool up() const { return connection != nullptr; }
    bool free() const { return !up() && !joining && !failing_over; }
  };
  // A registration in progress on a thread of its own.
  struct Handshake {
    std::thread thread;
    bool done = false;
  };

  WorkerFleet settings;
  mutable std::mutex mu;  // guards what follows; taken after Impl::mu, never before
  std::condition_variable changed;
  std::vector<Slot> slots;
  std::vector<std::shared_ptr<Connection>> closed;  // to destroy off their own threads
  std::uint64_t next_generation = 1;
  bool stopping = false;
  std::list<Handshake> handshakes;
  std::set<int> handshake_fds;  // sockets handshakes hold (StopFleet shuts them down)
  // Discovery: the keys a handshake is connecting to, and those to try again only later (a
  // worker that could not be reached or was refused).
  std::set<std::string> dialing;
  std::map<std::string, std::chrono::steady_clock::time_point> retry_after;
  std::thread acceptor;
};

LiveFrontend::Impl::Impl() = default;
LiveFrontend::Impl::~Impl() = default;

namespace {

void Log(const std::string& line) { std::fprintf(stderr, "duet serve: %s\n", line.c_str()); }

// Discovery: how long a connection to a listed worker may take, and how long a worker that
// could not be reached or was refused waits before it is tried again.
constexpr Seconds kDialTimeoutS = 1.0;
constexpr auto kRetryRefusedAfter = std::chrono::seconds(2);

// Nanoseconds on the run's clock: what a worker's clock is set to (clock_sync.h).
std::int64_t RunClockNs(const Impl& s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              s.clock.start())
      .count();
}

// A worker slot as an instance.
class RemoteInstance final : public Instance {
 public:
  RemoteInstance(Impl::Fleet& fleet, InstanceId id) : fleet_(fleet), id_(id) {}
  // An engine message, its request (if any) by value.
  void Post(const EngineMessage& message) {
    cluster::WireEngineMessage w{id_, message, std::nullopt};
    w.message.request = nullptr;
    if (message.request) {
      w.message.request_id = message.request->id;
      w.request = *message.request;
    }
    Send(MessageKind::kEngine, cluster::EncodeEngine(w));
  }
  // Dropped while no worker holds the slot: the lost worker's requests are retried anyway.
  void Send(MessageKind kind, const std::string& body) {
    std::shared_ptr<Connection> c;
    {
      std::lock_guard lock(fleet_.mu);
      c = fleet_.slots[static_cast<std::size_t>(id_)].connection;
    }
    if (c) c->Send(kind, body);
  }
  InstanceLoad load() const override {
    std::lock_guard lock(fleet_.mu);
    const Impl::Fleet::Slot& slot = fleet_.slots[static_cast<std::size_t>(id_)];
    InstanceLoad l = slot.load;
    l += slot.carried;
    return l;
  }
  void Stop() override {}  // StopFleet

 private:
  Impl::Fleet& fleet_;
  InstanceId id_;
};

RemoteInstance& Remote(Impl& s, InstanceId id) {
  return static_cast<RemoteInstance&>(*s.instances[static_cast<std::size_t>(id)]);
}

// The frontend's port to its worker processes: each message over its slot's link.
class RemoteOutbox final : public policies::Outbox {
 public:
  explicit RemoteOutbox(Impl& s) : s_(s) {}
  void Send(InstanceId to, const EngineMessage& message) override { Remote(s_, to).Post(message); }

 private:
  Impl& s_;
};

// A listener call to make once Impl::mu is released.
struct Ending {
  std::shared_ptr<RequestListener> listener;
  FinishInfo info;
};

bool OnRoute(const Impl::Entry& e, InstanceId i) { return e.prefill == i || e.decode == i; }

// Ends an entry here (its worker was lost and it cannot go on). Caller holds s.mu.
void EndHere(Impl& s, RequestId id, policies::FinishReason reason, const std::string& message,
             std::vector<Ending>* endings) {
  auto it = s.entries.find(id);
  Impl::Entry& e = it->second;
  FinishInfo info;
  info.reason = reason;
  info.message = message;
  info.prompt_tokens = e.prompt_tokens;
  info.completion_tokens = e.tokens_before + static_cast<Tokens>(e.request->output_ids.size());
  endings->push_back({e.listener, info});
  if (e.client_id != id) s.retried.erase(e.client_id);
  s.entries.erase(it);
  --s.pending;
  ++s.telling;  // Finish tells the listener
}

// Moves a request whose worker was lost to survivors, as the frontend policy decides: a new
// attempt whose prompt is the old prompt plus every token its listener got, for the tokens
// still to come; or its end. Caller holds s.mu.
void Retry(Impl& s, RequestId id, std::vector<Ending>* endings) {
  Impl::Entry& e = s.entries.at(id);
  policies::RecoveryDecision d = s.policy->Recover(*e.request, s.next_id, e.tokens_before,
                                                   e.max_tokens, ++e.workers_lost, s.block_tokens);
  switch (d.verdict) {
    using enum policies::RecoveryDecision::Verdict;
    case kResend:
      break;
    case kEndLength:
      return EndHere(s, id, policies::FinishReason::kLength, "", endings);
    case kEndStop:
      return EndHere(s, id, policies::FinishReason::kStop, "", endings);
    case kEndError:
      return EndHere(s, id, policies::FinishReason::kError, d.message, endings);
  }
  ++s.next_id;
  Impl::Entry moved = std::move(e);
  s.entries.erase(id);
  moved.tokens_before += static_cast<Tokens>(moved.request->output_ids.size());
  moved.kv_released = false;
  moved.prefill = d.route.prefill;
  moved.decode = d.route.decode;
  moved.request = std::make_unique<Request>(std::move(*d.attempt));
  const RequestId attempt = moved.request->id;
  s.retried[moved.client_id] = attempt;
  auto sent = std::make_shared<Request>(*moved.request);
  s.entries.emplace(attempt, std::move(moved));
  ++s.requests_retried;
  s.outbox->Send(d.route.prefill,
                 {EngineMessage::Kind::kNewRequest, std::move(sent), policies::kNoInstance});
}

// Tells the listeners of the entries EndHere ended. Caller does not hold s.mu.
void Finish(Impl& s, std::vector<Ending>& endings) {
  for (Ending& e : endings) e.listener->OnFinished(e.info);
  if (endings.empty()) return;
  {
    std::lock_guard lock(s.mu);
    s.telling -= static_cast<std::int64_t>(endings.size());
  }
  s.changed.notify_all();
}

// The instances of `e`'s route other than `i` drop what they hold of it: an abort, and a
// KV-release for a prefill side's lease. Caller holds s.mu.
void LetGoElsewhere(Impl& s, RequestId id, const Impl::Entry& e, InstanceId i) {
  EngineMessage abort{EngineMessage::Kind::kAbort, nullptr, policies::kNoInstance};
  abort.request_id = id;
  EngineMessage release{EngineMessage::Kind::kKvRelease, nullptr, policies::kNoInstance};
  release.request_id = id;
  for (InstanceId other : {e.prefill, e.decode}) {
    if (other == i) continue;
    s.outbox->Send(other, abort);
    if (s.options.roles[static_cast<std::size_t>(other)] == InstanceRole::kPrefill)
      s.outbox->Send(other, release);
  }
}

// Worker `i` refused an engine message for a request (a value it cannot hold: a bug, since
// the frontend checks what it forwards): that request ends with an error, which its client
// gets as a 500, and every instance on its route lets go of it; the worker stays.
void OnRefused(Impl& s, InstanceId i, const cluster::Refusal& refusal) {
  std::vector<Ending> endings;
  {
    std::lock_guard lock(s.mu);
    auto it = s.entries.find(refusal.request_id);
    if (it == s.entries.end() || it->second.finished || !OnRoute(it->second, i)) return;
    const Impl::Entry& e = it->second;
    s.router->OnFinished(*e.request, *e.request);
    // The refusing worker may hold an earlier copy (a request it refused as held already).
    EngineMessage abort{EngineMessage::Kind::kAbort, nullptr, policies::kNoInstance};
    abort.request_id = refusal.request_id;
    s.outbox->Send(i, abort);
    LetGoElsewhere(s, refusal.request_id, e, i);
    EndHere(s, refusal.request_id, policies::FinishReason::kError,
            "worker " + std::to_string(i) + " refused it: " + refusal.reason, &endings);
  }
  s.changed.notify_all();
  Finish(s, endings);
}

// Worker `i` is gone: no more routing to it; the survivors drop what they hold of its requests
// (leases, pulls from it) and those requests start again elsewhere.
void Failover(Impl& s, InstanceId i) {
  std::vector<Ending> endings;
  {
    std::lock_guard lock(s.mu);
    s.router->SetAvailable(i, false);
    if (s.options.roles[static_cast<std::size_t>(i)] == InstanceRole::kPrefill) {
      cluster::Peer gone{i, ""};
      for (std::size_t d = 0; d < s.instances.size(); ++d) {
        if (s.options.roles[d] == InstanceRole::kDecode)
          Remote(s, static_cast<InstanceId>(d)).Send(MessageKind::kPeer, cluster::EncodePeer(gone));
      }
    }
    std::vector<RequestId> lost;
    for (const auto& [id, e] : s.entries) {
      if (!e.finished && OnRoute(e, i)) lost.push_back(id);
    }
    for (RequestId id : lost) {
      const Impl::Entry& e = s.entries.at(id);
      // Past its handoff (the decode side released the prefill side's KV), a request no
      // longer needs its prefill instance.
      if (e.prefill == i && e.decode != i && e.kv_released) continue;
      LetGoElsewhere(s, id, e, i);
      Retry(s, id, &endings);
    }
  }
  s.changed.notify_all();
  Finish(s, endings);
}

void OnClose(Impl& s, InstanceId i, std::uint64_t generation, const std::string& why) {
  Impl::Fleet& f = *s.fleet;
  std::int64_t pid = 0;
  {
    std::lock_guard lock(f.mu);
    Impl::Fleet::Slot& slot = f.slots[static_cast<std::size_t>(i)];
    if (slot.generation != generation || !slot.up()) return;
    f.closed.push_back(std::move(slot.connection));
    slot.carried += slot.load.Counters();
    slot.load = {};
    pid = slot.pid;
    if (f.stopping) {
      f.changed.notify_all();
      return;
    }
    slot.failing_over = true;
  }
  f.changed.notify_all();
  Log("worker " + std::to_string(i) + " (" +
      policies::ToString(f.slots[static_cast<std::size_t>(i)].role) + ", pid " +
      std::to_string(pid) + ") lost: " + why + "; retrying its requests");
  Failover(s, i);
  {
    std::lock_guard lock(f.mu);
    f.slots[static_cast<std::size_t>(i)].failing_over = false;
  }
  f.changed.notify_all();
}

// What a worker reports of its load against what it said at hello (its KV blocks) and what the
// frontend can have sent it: a report past them is a broken or hostile worker, whose link ends
// before the value reaches the router or /metrics. Caller holds the fleet's lock.
Status CheckLoad(const Impl& s, const Impl::Fleet::Slot& slot, const InstanceLoad& e) {
  const std::int64_t total = slot.load.kv_blocks_total;  // from the hello, fixed
  auto over = [](const char* what, std::int64_t value, std::int64_t most) {
    return Status::Error("its load says " + std::string(what) + " " + std::to_string(value) +
                         ", more than the " + std::to_string(most) + " it can hold");
  };
  if (e.kv_blocks_total != total)
    return Status::Error("its load says " + std::to_string(e.kv_blocks_total) +
                         " KV blocks in all, not the " + std::to_string(total) + " of its hello");
  if (e.kv_blocks_used > total) return over("kv_used", e.kv_blocks_used, total);
  if (e.kv_blocks_free > total) return over("kv_free", e.kv_blocks_free, total);
  // A running request holds a block at least, and so does a lease.
  if (e.running > total) return over("running", e.running, total);
  if (e.leases_held > total) return over("leases_held", e.leases_held, total);
  // Requests it was sent and has not finished: the frontend's own bound, with room for aborted
  // and retried ones the worker has yet to drop.
  const std::int64_t most_waiting = 2 * s.options.max_pending_requests + 1024;
  if (e.waiting > most_waiting) return over("waiting", e.waiting, most_waiting);
  return Status::Ok();
}

// One message from worker `i`. A malformed one ends the connection (logged).
Status OnFrame(Impl& s, InstanceId i, const cluster::FrameHeader& header, const std::string& body) {
  // t1 of a clock probe: as soon as the frame is read, on the run's clock.
  const std::int64_t arrived_ns = RunClockNs(s);
  Impl::Fleet& f = *s.fleet;
  auto heard = [&](const InstanceLoad* load) {
    std::lock_guard lock(f.mu);
    Impl::Fleet::Slot& slot = f.slots[static_cast<std::size_t>(i)];
    if (load) {
      if (Status st = CheckLoad(s, slot, *load); !st.ok()) return st;
      slot.load = *load;
    }
    slot.last_heard = std::chrono::steady_clock::now();
    return Status::Ok();
  };
  if (header.kind == MessageKind::kHeartbeat) {
    auto load = cluster::ParseHeartbeat(body);
    if (!load.ok()) return load.status();
    return heard(&*load);
  }
  if (header.kind == MessageKind::kClockProbe) {
    auto probe = cluster::ParseClockProbe(body);
    if (!probe.ok()) return probe.status();
    if (Status st = heard(nullptr); !st.ok()) return st;
    {
      std::lock_guard lock(f.mu);
      Impl::Fleet::Slot& slot = f.slots[static_cast<std::size_t>(i)];
      slot.clock_offset_ns = probe->offset_ns;
      slot.clock_error_ns = probe->error_ns;
    }
    const cluster::ClockReply reply{probe->sent_ns, arrived_ns, RunClockNs(s)};
    Remote(s, i).Send(MessageKind::kClockReply, cluster::EncodeClockReply(reply));
    return Status::Ok();
  }
  if (header.kind == MessageKind::kEngine) {
    auto w = cluster::ParseEngine(body);
    if (!w.ok()) return w.status();
    heard(nullptr);
    const EngineMessage::Kind kind = w->message.kind;
    const InstanceId to = w->to;
    const bool ready = kind == EngineMessage::Kind::kKvReady;
    if ((!ready && kind != EngineMessage::Kind::kKvRelease) || to < 0 ||
        to >= static_cast<InstanceId>(s.instances.size()) ||
        s.options.roles[static_cast<std::size_t>(to)] !=
            (ready ? InstanceRole::kDecode : InstanceRole::kPrefill) ||
        w->message.from != i) {
      return Status::Error(
          "a worker may send only KV-ready to a decode instance and KV-release "
          "to a prefill instance, as itself");
    }
    std::lock_guard lock(s.mu);
    auto it = s.entries.find(w->message.request_id);
    const bool current = it != s.entries.end() && it->second.prefill == (ready ? i : to) &&
                         it->second.decode == (ready ? to : i);
    // The decode side is done with the prefill side's KV: the request needs it no more.
    if (current && !ready) it->second.kv_released = true;
    if (current || !ready) {
      // A release always goes through: it frees KV held for a pull.
      Remote(s, to).Send(MessageKind::kEngine, body);
    } else {
      // The request was retried meanwhile: the prefill side lets go of its KV now.
      EngineMessage release{EngineMessage::Kind::kKvRelease, nullptr, to};
      release.request_id = w->message.request_id;
      s.outbox->Send(i, release);
    }
    return Status::Ok();
  }
  if (header.kind == MessageKind::kRefused) {
    auto refusal = cluster::ParseRefused(body);
    if (!refusal.ok()) return refusal.status();
    heard(nullptr);
    Log("worker " + std::to_string(i) + " refused request " + std::to_string(refusal->request_id) +
        ": " + refusal->reason);
    OnRefused(s, i, *refusal);
    return Status::Ok();
  }
  if (header.kind != MessageKind::kEvents)
    return Status::Error("unexpected message kind " +
                         std::to_string(static_cast<int>(header.kind)));
  auto events = cluster::ParseEvents(body);
  if (!events.ok()) return events.status();
  if (Status st = heard(&events->load); !st.ok()) return st;
  Impl::InstanceSink& sink = *s.sinks[static_cast<std::size_t>(i)];
  for (cluster::WireEvent& e : events->events) {
    using Kind = cluster::WireEvent::Kind;
    if (e.kind == Kind::kTokenGaps) {
      sink.OnTokenGaps(e.gap_s, e.count);
      continue;
    }
    if (e.kind == Kind::kKvEvents) {
      sink.OnKvEvents(i, e.kv_events);
      continue;
    }
    // The request as of this event, copied under the lock: a retry may move it. The worker's
    // record replaces the mirror's; the spec stays the frontend's.
    policies::RequestSpec spec;
    policies::RequestRecord record;
    {
      std::lock_guard lock(s.mu);
      auto it = s.entries.find(e.request_id);
      if (it == s.entries.end() || !OnRoute(it->second, i) || it->second.finished) continue;
      Request& mirror = *it->second.request;
      if (e.kind == Kind::kToken) {
        mirror.output_ids.push_back(e.token);
        spec.id = mirror.id;  // all a token's listener needs
      } else {
        // The route is the frontend's own decision: a worker's record cannot move it.
        const InstanceId prefill = mirror.prefill_instance, decode = mirror.decode_instance;
        const std::optional<double> score = mirror.router_score;
        mirror.record() = *e.record;
        mirror.prefill_instance = prefill;
        mirror.decode_instance = decode;
        mirror.router_score = score;
        spec = mirror.spec();
        record = mirror.record();
      }
    }
    switch (e.kind) {
      case Kind::kToken:
        sink.OnToken(spec, record, e.token);
        break;
      case Kind::kPrefillDone:
        sink.OnPrefillDone(spec, record);
        break;
      case Kind::kFinished:
        sink.OnFinished(spec, record);
        break;
      case Kind::kPreempted:
        sink.OnPreempted(spec, record, i);
        break;
      default:
        break;
    }
  }
  sink.ReleaseFinished();
  return Status::Ok();
}

// Takes one registration: a hello, the mutual proof of the secret (link_auth.h), then a role
// with a free slot (`claimed`, when the directory says which) and the fleet's model; the whole
// within handshake_timeout_s. Runs on a handshake thread of its own.
void Register(Impl& s, int fd, const std::string& key, InstanceId claimed = policies::kNoInstance) {
  Impl::Fleet& f = *s.fleet;
  const WorkerFleet& w = f.settings;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(w.handshake_timeout_s));
  auto left_s = [&] {
    return std::max(
        0.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
  };
  // A peer that stops reading must not hold this thread past the deadline either.
  auto send_timeout = [fd](Seconds seconds) {
    timeval tv{static_cast<time_t>(seconds),
               static_cast<suseconds_t>((seconds - static_cast<time_t>(seconds)) * 1e6)};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  };
  send_timeout(w.handshake_timeout_s);
  InstanceId slot_id = policies::kNoInstance;  // reserved for this worker
  std::string who = "a worker";
  auto release_fd = [&] {
    std::lock_guard lock(f.mu);
    f.handshake_fds.erase(fd);
    // A worker of the directory that was refused is tried again only a while later.
    if (!key.empty()) f.retry_after[key] = std::chrono::steady_clock::now() + kRetryRefusedAfter;
    if (slot_id != policies::kNoInstance)
      f.slots[static_cast<std::size_t>(slot_id)].joining = false;
  };
  auto refuse = [&](const std::string& why) {
    Log("refused " + who + ": " + why);
    release_fd();
    ::close(fd);
  };
  auto frame = cluster::ReadFrame(fd, left_s(), cluster::kMaxHandshakeBodyBytes);
  if (!frame.ok()) return refuse(frame.error());
  if (frame->header.kind != MessageKind::kHello) return refuse("its first message is no hello");
  auto hello = cluster::ParseHello(frame->body);
  if (!hello.ok()) return refuse(hello.error());
  who = "a worker claiming pid " + std::to_string(hello->pid);

  // Challenge and response: the frontend proves it holds the secret over the worker's nonce,
  // the worker over the frontend's; neither proof is any use on another connection.
  auto nonce = cluster::RandomBytes(cluster::kNonceBytes);
  if (!nonce.ok()) return refuse(nonce.error());
  const cluster::Challenge challenge{
      *nonce, cluster::LinkProof(w.secret, cluster::ProofSide::kFrontend, frame->body, *nonce)};
  if (Status st =
          cluster::WriteFrame(fd, MessageKind::kChallenge, cluster::EncodeChallenge(challenge));
      !st.ok())
    return refuse(st.message());
  auto answer = cluster::ReadFrame(fd, left_s(), 1024);
  if (!answer.ok()) {
    return refuse("no proof that it holds the worker secret (" + answer.error() +
                  "; a worker holding another secret than this frontend's leaves here)");
  }
  auto proof = answer->header.kind == MessageKind::kProof
                   ? cluster::ParseProof(answer->body)
                   : Result<std::string>(Status::Error("its second message is no proof"));
  if (!proof.ok()) return refuse(proof.error());
  if (!cluster::ConstantTimeEquals(
          cluster::LinkProof(w.secret, cluster::ProofSide::kWorker, frame->body, *nonce), *proof)) {
    return refuse("its proof of the worker secret is wrong (another --worker-secret-file or $" +
                  std::string(cluster::kWorkerSecretEnv) +
                  " than this frontend's, or not a duet worker)");
  }
  who = "worker pid " + std::to_string(hello->pid);
  // Where it connected from: a pid names a process on its own host only.
  std::string peer_host = "?";
  {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    char text[INET_ADDRSTRLEN] = {};
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
        ::inet_ntop(AF_INET, &peer.sin_addr, text, sizeof text) != nullptr)
      peer_host = text;
  }

  if (hello->num_layers != w.config.num_hidden_layers || hello->vocab_size != w.config.vocab_size)
    return refuse("it serves another model than the frontend's");
  if (auto mismatch =
          KvLayoutMismatch(s.options, w.config, hello->block_tokens, hello->kv_bytes_per_token))
    return refuse(*mismatch);
  std::optional<Tokens> required;  // none before every slot was first taken (StartFleet)
  {
    std::lock_guard lock(s.mu);
    if (s.policy) required = s.policy->limits().RequiredOf(hello->role);
  }
  if (required &&
      s.options.engine.scheduler.AdmissibleTokens(hello->num_blocks, s.block_tokens) < *required) {
    return refuse("it holds " + std::to_string(hello->num_blocks) +
                  " KV blocks, too few for the longest request the frontend admits");
  }
  if (hello->role == InstanceRole::kPrefill && hello->kv_descriptor.empty())
    return refuse("a prefill worker without a KV descriptor");
  {
    // A slot whose lost worker's requests are still being sent elsewhere is free a moment
    // later: a restarted worker waits for it rather than be refused.
    std::unique_lock lock(f.mu);
    f.changed.wait_for(lock, std::chrono::duration<double>(left_s()), [&] {
      bool failing_over = false;
      for (std::size_t i = 0; i < f.slots.size() && !f.stopping; ++i) {
        if (claimed != policies::kNoInstance && i != static_cast<std::size_t>(claimed)) continue;
        if (f.slots[i].role != hello->role) continue;
        if (f.slots[i].free()) {
          slot_id = static_cast<InstanceId>(i);
          f.slots[i].joining = true;
          return true;
        }
        failing_over = failing_over || f.slots[i].failing_over;
      }
      return f.stopping || !failing_over;
    });
  }
  if (slot_id == policies::kNoInstance && claimed != policies::kNoInstance)
    return refuse("its slot " + std::to_string(claimed) + " (claimed for it in " +
                  w.directory->Name() + ") is not free here for a " +
                  policies::ToString(hello->role) + " worker");
  if (slot_id == policies::kNoInstance)
    return refuse(std::string("no free slot for a ") + policies::ToString(hello->role) + " worker");

  cluster::Welcome welcome;
  welcome.instance = slot_id;
  welcome.engine = s.options.engine;
  welcome.publish_kv_events = PublishesKvEvents(s.options, slot_id);
  welcome.heartbeat_interval_s = w.heartbeat_interval_s;
  if (Status sent = cluster::WriteFrame(fd, MessageKind::kWelcome, cluster::EncodeWelcome(welcome));
      !sent.ok())
    return refuse(sent.message());
  send_timeout(0);  // the connection's writer thread may wait on a slow reader from now on

  // The slot's previous connection has ended (its reader called OnClose after its last frame).
  s.sinks[static_cast<std::size_t>(slot_id)]->ForgetListeners();
  std::uint64_t generation = 0;
  std::shared_ptr<Connection> connection;
  // The prefill workers' KV descriptors reach every decode worker: the slot goes up under the
  // same lock that lists the others, so that of a prefill and a decode worker joining at once,
  // one sees the other up (a decode worker that missed its prefill peer failed its pulls:
  // "unknown source instance").
  std::vector<std::shared_ptr<Connection>> decode_connections;
  {
    std::lock_guard lock(f.mu);
    f.handshake_fds.erase(fd);
    Impl::Fleet::Slot& slot = f.slots[static_cast<std::size_t>(slot_id)];
    slot.joining = false;
    if (f.stopping) {
      ::close(fd);
      return;
    }
    generation = f.next_generation++;
    connection = std::make_shared<Connection>(
        fd,
        [&s, slot_id](const cluster::FrameHeader& h, std::string body) {
          if (Status st = OnFrame(s, slot_id, h, body); !st.ok()) {
            Log("worker " + std::to_string(slot_id) + ": rejected a message: " + st.message());
            std::lock_guard lock(s.fleet->mu);
            if (auto& c = s.fleet->slots[static_cast<std::size_t>(slot_id)].connection) c->Close();
          }
        },
        [&s, slot_id, generation](const std::string& why) {
          OnClose(s, slot_id, generation, why);
        });
    slot.connection = connection;
    slot.pid = hello->pid;
    ++slot.joins;
    slot.generation = generation;
    slot.kv_descriptor = hello->kv_descriptor;
    slot.load = {};
    slot.load.kv_blocks_total = hello->num_blocks;
    slot.load.kv_blocks_free = hello->num_blocks;
    slot.clock_offset_ns.reset();
    slot.clock_error_ns.reset();
    slot.discovery_key = key;
    slot.last_heard = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < f.slots.size(); ++i) {
      const Impl::Fleet::Slot& other = f.slots[i];
      if (!other.up() || i == static_cast<std::size_t>(slot_id)) continue;
      if (hello->role == InstanceRole::kDecode && other.role == InstanceRole::kPrefill)
        connection->Send(MessageKind::kPeer,
                         cluster::EncodePeer({static_cast<InstanceId>(i), other.kv_descriptor}));
      if (hello->role == InstanceRole::kPrefill && other.role == InstanceRole::kDecode)
        decode_connections.push_back(other.connection);
    }
  }
  connection->Start();
  const std::string peer = cluster::EncodePeer({slot_id, hello->kv_descriptor});
  for (auto& c : decode_connections) c->Send(MessageKind::kPeer, peer);
  {
    std::lock_guard lock(s.mu);
    s.router->SetAvailable(slot_id, true);
  }
  f.changed.notify_all();
  Log("worker " + std::to_string(slot_id) + " (" + policies::ToString(hello->role) + ", pid " +
      std::to_string(hello->pid) + ") joined from " + peer_host);
}

// Discovery: a worker the directory lists that this frontend does not hold.
struct Listed {
  std::string key;
  discovery::ListedWorker worker;
  std::optional<int> slot;  // claimed for it
  std::set<int> claimed;    // every claimed slot
};

// Discovery, on a handshake thread: takes the slot claimed for the worker `w` (claiming one of
// its role for it first, if no frontend has), connects to it and takes its registration as if
// it had connected here.
void Dial(Impl& s, const Listed& w) {
  Impl::Fleet& f = *s.fleet;
  auto retry_later = [&] {
    std::lock_guard lock(f.mu);
    f.dialing.erase(w.key);
    f.retry_after[w.key] = std::chrono::steady_clock::now() + kRetryRefusedAfter;
  };
  std::optional<int> slot = w.slot;
  if (!slot) {
    std::vector<int> candidates;
    {
      std::lock_guard lock(f.mu);
      for (std::size_t i = 0; i < f.slots.size(); ++i) {
        const Impl::Fleet::Slot& x = f.slots[i];
        if (policies::ToString(x.role) == w.worker.record.role && x.free() &&
            !w.claimed.count(static_cast<int>(i)))
          candidates.push_back(static_cast<int>(i));
      }
    }
    auto claimed =
        f.settings.directory->Claim(w.key, w.worker.lease, w.worker.record.role, candidates);
    if (!claimed.ok() || !*claimed) {
      Log("worker at " + w.worker.record.address + " (" + w.worker.record.role + "): " +
          (claimed.ok() ? "no free " + w.worker.record.role + " slot for it in " +
                              f.settings.directory->Name() + " (other workers hold every one)"
                        : claimed.error()));
      return retry_later();
    }
    slot = **claimed;
  }
  if (*slot < 0 || *slot >= static_cast<int>(f.slots.size()) ||
      policies::ToString(f.slots[static_cast<std::size_t>(*slot)].role) != w.worker.record.role) {
    Log("worker at " + w.worker.record.address + " (" + w.worker.record.role + "): slot " +
        std::to_string(*slot) + " is claimed for it in " + f.settings.directory->Name() +
        ", which this frontend's deployment has no " + w.worker.record.role +
        " slot at (frontends over one worker pool serve one deployment)");
    return retry_later();
  }
  auto fd = cluster::ConnectTo(w.worker.record.address, kDialTimeoutS);
  if (!fd.ok()) return retry_later();
  {
    std::lock_guard lock(f.mu);
    f.dialing.erase(w.key);
    if (f.stopping) {
      ::close(*fd);
      return;
    }
    f.handshake_fds.insert(*fd);
  }
  Register(s, *fd, w.key, static_cast<InstanceId>(*slot));
}

// Discovery: the workers of the directory's listing that no slot holds and no handshake is
// connecting to (nor refused or unreachable a moment ago), and the slots whose worker's record
// is gone (their lease lapsed: dropped as lost, so they get no more requests). A worker held
// whose slot claim is gone (etcd lost it, or it registered again under a new lease) is claimed
// again (`reclaim`). Caller holds the fleet's lock.
std::vector<Listed> Reconcile(Impl::Fleet& f, const discovery::DirectoryListing& listing,
                              std::vector<std::pair<Listed, int>>* reclaim) {
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, int> slot_of;
  std::set<int> claimed;
  for (const auto& [index, claim] : listing.slots) {
    slot_of[claim.worker] = index;
    claimed.insert(index);
  }
  std::set<std::string> held;
  for (std::size_t i = 0; i < f.slots.size(); ++i) {
    Impl::Fleet::Slot& slot = f.slots[i];
    if (!slot.up() || slot.discovery_key.empty()) continue;
    const auto listed = listing.workers.find(slot.discovery_key);
    if (listed != listing.workers.end()) {
      held.insert(slot.discovery_key);
      if (!slot_of.count(slot.discovery_key))
        reclaim->push_back(
            {Listed{slot.discovery_key, listed->second, {}, claimed}, static_cast<int>(i)});
    } else if (!slot.connection->closed()) {
      Log("worker " + std::to_string(i) + " (" + policies::ToString(slot.role) + ", pid " +
          std::to_string(slot.pid) + "): its registration in " + f.settings.directory->Name() +
          " is gone (its lease lapsed)");
      slot.connection->Close();  // OnClose follows on its reader thread
    }
  }
  // Workers no longer listed need no retry time (ports taken afresh would grow the map).
  std::erase_if(f.retry_after,
                [&](const auto& entry) { return !listing.workers.count(entry.first); });
  std::vector<Listed> dial;
  for (const auto& [key, worker] : listing.workers) {
    if (held.count(key) || f.dialing.count(key)) continue;
    if (auto it = f.retry_after.find(key); it != f.retry_after.end() && now < it->second) continue;
    std::optional<int> slot;
    if (auto it = slot_of.find(key); it != slot_of.end()) slot = it->second;
    dial.push_back({key, worker, slot, claimed});
  }
  return dial;
}

// The acceptor thread: registrations (each handed to a handshake thread, at most
// max_handshakes at once: past that, new connections wait in the listen backlog; with a
// directory, connections to the workers it lists, made on the handshake threads), heartbeat
// deadlines, and the connections and handshakes that ended. It never waits on a peer (on the
// directory, at most its client's deadline).
void AcceptLoop(Impl& s) {
  Impl::Fleet& f = *s.fleet;
  const auto timeout = std::chrono::duration<double>(f.settings.heartbeat_timeout_s);
  const auto tick =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(
          f.settings.listener ? f.settings.heartbeat_interval_s : f.settings.directory_interval_s));
  bool directory_failing = false;
  while (true) {
    bool full = false;
    {
      std::lock_guard lock(f.mu);
      full = static_cast<int>(f.handshakes.size()) >= f.settings.max_handshakes;
    }
    int fd = -1;
    if (full || !f.settings.listener) {
      std::unique_lock lock(f.mu);
      f.changed.wait_for(lock, tick, [&] { return f.stopping; });
    } else {
      fd = f.settings.listener->Accept(f.settings.heartbeat_interval_s);
    }
    // The directory is read outside the lock (a network round trip). While it cannot be read,
    // the workers held stay: an outage of the directory costs no worker.
    std::optional<discovery::DirectoryListing> listed;
    if (f.settings.directory && !full) {
      auto workers = f.settings.directory->List();
      if (workers.ok()) {
        if (directory_failing) Log("reading " + f.settings.directory->Name() + " again");
        directory_failing = false;
        listed = std::move(*workers);
      } else if (!directory_failing) {
        Log("cannot read " + f.settings.directory->Name() + " (" + workers.error() +
            "); keeping the workers held, trying again");
        directory_failing = true;
      }
    }
    std::vector<std::pair<Listed, int>> reclaim;
    std::vector<std::shared_ptr<Connection>> closed;
    std::list<Impl::Fleet::Handshake> ended;
    {
      std::lock_guard lock(f.mu);
      if (f.stopping) {
        if (fd >= 0) ::close(fd);
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < f.slots.size(); ++i) {
        Impl::Fleet::Slot& slot = f.slots[i];
        if (slot.up() && now - slot.last_heard > timeout) {
          Log("worker " + std::to_string(i) + " silent for " +
              std::to_string(f.settings.heartbeat_timeout_s) + " s");
          slot.connection->Close();  // OnClose follows on its reader thread
        }
      }
      closed.swap(f.closed);
      for (auto it = f.handshakes.begin(); it != f.handshakes.end();) {
        auto next = std::next(it);
        if (it->done) ended.splice(ended.end(), f.handshakes, it);
        it = next;
      }
      auto start = [&](std::function<void()> run) {
        f.handshakes.emplace_back();
        Impl::Fleet::Handshake& h = f.handshakes.back();
        h.thread = std::thread([&s, &h, run = std::move(run)] {
          run();
          std::lock_guard done_lock(s.fleet->mu);
          h.done = true;
          s.fleet->changed.notify_all();
        });
      };
      if (fd >= 0) {
        f.handshake_fds.insert(fd);
        start([&s, fd] { Register(s, fd, ""); });
      }
      if (listed) {
        for (auto& worker : Reconcile(f, *listed, &reclaim)) {
          if (static_cast<int>(f.handshakes.size()) >= f.settings.max_handshakes) break;
          f.dialing.insert(worker.key);
          start([&s, worker] { Dial(s, worker); });
        }
      }
    }
    // Outside the lock (round trips to the directory): a worker held keeps its slot, or, if
    // another frontend gave that slot to another worker meanwhile, is let go (it joins again
    // in the slot claimed for it).
    for (const auto& [worker, slot] : reclaim) {
      auto claimed = f.settings.directory->Claim(worker.key, worker.worker.lease,
                                                 worker.worker.record.role, {slot});
      if (!claimed.ok()) continue;  // the directory failed: the next round tries again
      if (*claimed == slot) continue;
      Log("worker " + std::to_string(slot) + ": its slot is claimed for " +
          (*claimed ? "it as slot " + std::to_string(**claimed) : std::string("another worker")) +
          " in " + f.settings.directory->Name() + " now; letting it go");
      std::lock_guard lock(f.mu);
      if (auto& c = f.slots[static_cast<std::size_t>(slot)].connection) c->Close();
    }
    closed.clear();  // joins their threads, outside the lock
    for (Impl::Fleet::Handshake& h : ended) h.thread.join();
  }
}

}  // namespace

Status StartFleet(Impl& s, WorkerFleet settings) {
  if (!settings.listener == !settings.directory)
    return Status::Error("worker processes need a listener or a directory, one of the two");
  if (settings.secret.size() < cluster::kMinSecretBytes)
    return Status::Error("worker processes need a shared secret of " +
                         std::to_string(cluster::kMinSecretBytes) + " bytes at least");
  auto fleet = std::make_unique<Impl::Fleet>();
  fleet->settings = std::move(settings);
  for (InstanceRole role : s.options.roles) {
    fleet->slots.emplace_back();
    fleet->slots.back().role = role;
  }
  s.fleet = std::move(fleet);
  Impl::Fleet& f = *s.fleet;
  for (std::size_t i = 0; i < f.slots.size(); ++i) {
    s.instances.push_back(std::make_unique<RemoteInstance>(f, static_cast<InstanceId>(i)));
    s.router->SetAvailable(static_cast<InstanceId>(i), false);
  }
  s.outbox = std::make_unique<RemoteOutbox>(s);
  f.acceptor = std::thread([&s] { AcceptLoop(s); });

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(f.settings.register_timeout_s));
  std::unique_lock lock(f.mu);
  bool all = false;
  std::string abandoned;
  while (!all && abandoned.empty() && std::chrono::steady_clock::now() < deadline) {
    all = f.changed.wait_for(lock, std::chrono::milliseconds(200), [&] {
      return std::ranges::all_of(f.slots, [](const Impl::Fleet::Slot& x) { return x.up(); });
    });
    if (!all && f.settings.abandon) {
      lock.unlock();
      abandoned = f.settings.abandon();
      lock.lock();
    }
  }
  std::vector<Tokens> admissible;
  std::string missing;
  for (std::size_t i = 0; i < f.slots.size(); ++i) {
    admissible.push_back(s.options.engine.scheduler.AdmissibleTokens(
        f.slots[i].load.kv_blocks_total, s.block_tokens));
    if (!f.slots[i].up())
      missing += (missing.empty() ? "" : ", ") + std::to_string(i) + " (" +
                 policies::ToString(f.slots[i].role) + ")";
  }
  lock.unlock();
  if (!abandoned.empty()) {
    StopFleet(s);
    return Status::Error(abandoned);
  }
  if (!all) {
    StopFleet(s);
    return Status::Error("worker slots " + missing + " were not taken within " +
                         std::to_string(f.settings.register_timeout_s) + " s");
  }
  if (Status st = SetLimits(s, admissible); !st.ok()) {
    StopFleet(s);
    return Status::Error("the workers' KV caches: " + st.message());
  }
  return Status::Ok();
}

void StopFleet(Impl& s) {
  Impl::Fleet& f = *s.fleet;
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::unique_lock lock(f.mu);
    f.stopping = true;
    for (Impl::Fleet::Slot& slot : f.slots) {
      if (!slot.up()) continue;
      EngineMessage shutdown{EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance};
      slot.connection->Send(MessageKind::kEngine, cluster::EncodeEngine({-1, shutdown, {}}));
    }
    // Workers finish what they hold (nothing, after a drain) and leave.
    f.changed.wait_for(lock, std::chrono::seconds(30), [&] {
      return std::ranges::none_of(f.slots, [](const Impl::Fleet::Slot& x) { return x.up(); });
    });
    for (Impl::Fleet::Slot& slot : f.slots) {
      if (slot.connection) connections.push_back(std::move(slot.connection));
    }
    for (auto& c : f.closed) connections.push_back(std::move(c));
    f.closed.clear();
  }
  if (f.settings.listener) f.settings.listener->Close();
  f.changed.notify_all();  // the acceptor's wait, with a directory
  if (f.acceptor.joinable()) f.acceptor.join();
  {
    std::lock_guard lock(f.mu);
    for (int fd : f.handshake_fds) ::shutdown(fd, SHUT_RDWR);
  }
  for (Impl::Fleet::Handshake& h : f.handshakes) h.thread.join();  // each ends at once now
  f.handshakes.clear();
  for (auto& c : connections) c->Close();
  connections.clear();
}

std::vector<WorkerStatus> FleetStatus(const Impl& s) {
  const Impl::Fleet& f = *s.fleet;
  std::lock_guard lock(f.mu);
  std::vector<WorkerStatus> out;
  for (std::size_t i = 0; i < f.slots.size(); ++i) {
    const Impl::Fleet::Slot& slot = f.slots[i];
    WorkerStatus w{static_cast<InstanceId>(i), slot.role, slot.up(), slot.pid, slot.joins, {}, {}};
    if (slot.up() && slot.clock_error_ns) {
      w.clock_offset_s = static_cast<double>(*slot.clock_offset_ns) * 1e-9;
      w.clock_error_s = static_cast<double>(*slot.clock_error_ns) * 1e-9;
    }
    out.push_back(w);
  }
  return out;
}

}  // namespace duet::backend::serve
