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

// Probes at a frontend's registration (the tightest sets its clock), how long each may wait for
// its reply, and how often one follows while serving.
constexpr int kClockProbesAtStart = 8;
constexpr Seconds kClockProbeTimeoutS = 2.0;
constexpr Seconds kClockProbeEveryS = 5.0;
// Discovery: what a connection to this worker's port has for the whole handshake.
constexpr Seconds kAcceptedHandshakeS = 3.0;
// The clock probes a link has sent and has no reply to yet (their t0), at most.
constexpr std::size_t kMaxProbesInFlight = 16;
// Frames a frontend may send while its clock is being set (they wait until it is), at most.
constexpr std::size_t kMaxEarlyBytes = std::size_t{64} << 20;

// One frontend's link: its connection, its run clock, and the ids its requests have here.
struct FrontendLink {
  // The connection goes first: its reader's last call (Worker::Lost) reads what follows.
  ~FrontendLink() { connection.reset(); }
  int id = 0;
  Welcome welcome;
  // This frontend's run clock (the worker's steady clock plus the offset its probes measured).
  std::shared_ptr<SyncedClock> clock = std::make_shared<SyncedClock>();
  std::unique_ptr<FaultInjectingLink> send;
  std::unique_ptr<Connection> connection;
  // Under Worker::mu_:
  std::unordered_map<RequestId, RequestId> engine_id;  // this frontend's request id -> engine's
  std::set<std::int64_t> probes;                       // clock probes in flight
  std::map<policies::InstanceId, std::string> peers;   // prefill peers it announced
  bool shutdown = false;  // asked this worker to finish its requests and leave
  bool lost = false;
  std::string lost_why;
  std::chrono::steady_clock::time_point next_heartbeat;
  std::int64_t heartbeats = 0;
  bool wants_cache = true;  // has not been sent the prefix cache's contents yet
};

// The frontend's times on a link are its clock's; the engine's are the engine clock's: what
// to add to go from the engine's to the link's (0 on the link whose clock the engine runs on).
Seconds LinkMinusEngine(const FrontendLink& link, const SyncedClock& engine_clock) {
  if (link.clock.get() == &engine_clock) return 0;
  const auto a = link.clock->Current();
  const auto b = engine_clock.Current();
  if (!a || !b) return 0;
  return static_cast<double>(a->offset_ns - b->offset_ns) * 1e-9;
}

// A probe of `clock` (its offset and error so far), sent now.
ClockProbe ProbeOf(const SyncedClock& clock) {
  ClockProbe probe;
  if (const auto current = clock.Current()) {
    probe.offset_ns = current->offset_ns;
    probe.error_ns = current->error_ns;
  }
  probe.sent_ns = SteadyNowNs();
  return probe;
}

// The link of the frontend that welcomed this worker on `fd`, its clock set before its
// connection starts: kClockProbesAtStart probes over `fd`, each answered within
// kClockProbeTimeoutS or given up, the tightest taken. The frames the frontend sends meanwhile
// are kept, in order, in `early`. An error when the link failed or no probe was answered.
Result<std::shared_ptr<FrontendLink>> ClockedLink(int fd, const Welcome& welcome,
                                                  std::vector<ReadFrameResult>* early) {
  auto link = std::make_shared<FrontendLink>();
  link->welcome = welcome;
  SyncedClock& clock = *link->clock;
  std::size_t early_bytes = 0;
  for (int i = 0; i < kClockProbesAtStart; ++i) {
    const ClockProbe probe = ProbeOf(clock);
    if (Status s = WriteFrame(fd, MessageKind::kClockProbe, EncodeClockProbe(probe)); !s.ok())
      return s;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(kClockProbeTimeoutS));
    while (true) {
      const Seconds left =
          std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;  // unanswered: the next probe
      auto frame = ReadFrame(fd, left);
      const std::int64_t arrived_ns = SteadyNowNs();
      if (!frame.ok()) {
        if (std::chrono::steady_clock::now() < deadline) return frame.status();
        break;
      }
      if (frame->header.kind != MessageKind::kClockReply) {
        early_bytes += frame->body.size();
        if (early_bytes > kMaxEarlyBytes)
          return Status::Error("the frontend sent over 64 MiB before answering a clock probe");
        early->push_back(std::move(*frame));
        continue;
      }
      auto reply = ParseClockReply(frame->body);
      if (!reply.ok()) return reply.status();
      if (reply->probe_sent_ns != probe.sent_ns) continue;  // an earlier probe's, late
      auto sample = SampleOfProbe(probe.sent_ns, reply->received_ns, reply->sent_ns, arrived_ns);
      if (sample.ok()) clock.Offer(*sample);
      break;
    }
  }
  if (!clock.Current())
    return Status::Error("the frontend answered none of " + std::to_string(kClockProbesAtStart) +
                         " clock probes");
  return link;
}

// The worker's side of its frontends' links: the engine's outbox and event sink (engine
// thread), the requests it holds and whose they are, and the frames from each frontend (their
// reader threads). See worker.h.
class Worker final : public policies::Outbox, public policies::EventSink {
 public:
  Worker(InstanceRole role, std::int64_t vocab_size, Seconds kv_lease_s,
         WorkerKvTransport& transport)
      : role_(role), vocab_size_(vocab_size), kv_lease_s_(kv_lease_s), transport_(transport) {}

  void Attach(EngineThread* engine, std::shared_ptr<SyncedClock> engine_clock) {
    engine_ = engine;
    engine_clock_ = std::move(engine_clock);
  }

  // A frontend registered on `fd` with its clock set (`early`: what it sent meanwhile) joins:
  // its early frames are taken in order, then its connection starts.
  void Join(std::shared_ptr<FrontendLink> link, int fd, std::optional<LinkFault> fault,
            std::vector<ReadFrameResult> early) {
    FrontendLink* l = link.get();
    l->connection = std::make_unique<Connection>(
        fd, [this, l](const FrameHeader& h, std::string body) { OnFrame(*l, h, body); },
        [this, l](const std::string& why) { Lost(*l, why); });
    l->send = std::make_unique<FaultInjectingLink>(
        [l](MessageKind kind, const std::string& body) { l->connection->Send(kind, body); },
        std::move(fault));
    l->send->SetInstance(l->welcome.instance);
    l->next_heartbeat = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      l->id = next_link_++;
      links_.push_back(std::move(link));
    }
    for (const ReadFrameResult& frame : early) OnFrame(*l, frame.header, frame.body);
    l->connection->Start();
    engine_->inbox().Wake();  // an iteration sends it the prefix cache's contents
  }

  // --- Outbox (engine thread): KV-ready and KV-release go to the request's frontend, which
  // relays them.
  void Send(policies::InstanceId to, const EngineMessage& message) override {
    const bool ready = message.kind == EngineMessage::Kind::kKvReady;
    const RequestId id = ready ? message.request->id : message.request_id;
    WireEngineMessage w{to, message, std::nullopt};
    w.message.request = nullptr;
    std::shared_ptr<FrontendLink> link;
    Seconds shift = 0;
    {
      std::lock_guard lock(mu_);
      const auto owner = owner_.find(id);
      if (owner == owner_.end()) return;  // its frontend is gone
      link = Live(owner->second.link);
      if (link == nullptr) return;
      w.message.request_id = owner->second.id;
      shift = LinkMinusEngine(*link, *engine_clock_);
      if (ready) {
        // The request moved on: the engine let go of it (no event of it follows), and only its
        // lease holds its blocks here now. At once, not after the iteration: a release that
        // comes before the iteration ends must leave nothing of it that refuses its id again.
        requests_.erase(id);
        leases_.insert(id);
      }
    }
    if (ready) {
      w.request = *message.request;
      w.request->id = w.message.request_id;
      ToClock(*w.request, shift);
      if (std::isfinite(w.message.lease_expires_s)) w.message.lease_expires_s += shift;
    }
    FlushEvents();  // keeps this message after the events that came before it
    (*link->send)(MessageKind::kEngine, EncodeEngine(w));
  }

  // --- EventSink (engine thread): buffered per frontend, sent after each iteration, but for the
  // token a decode instance delivers when a pull completes: that one is raised before the
  // iteration's step, which it would otherwise wait for (a whole step added to its TTFT).
  void OnToken(const RequestSpec& spec, const RequestRecord& record, std::int32_t token) override {
    WireEvent e;
    e.kind = WireEvent::Kind::kToken;
    e.token = token;
    if (!ToOwner(spec.id, std::move(e), nullptr)) return;
    if (role_ == InstanceRole::kDecode && record.generated_tokens == 1) FlushEvents();
  }
  void OnFinished(const RequestSpec& spec, const RequestRecord& record) override {
    Push(WireEvent::Kind::kFinished, spec.id, record);
    finished_.push_back(spec.id);
  }
  void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) override {
    Push(WireEvent::Kind::kPrefillDone, spec.id, record);
  }
  void OnPreempted(const RequestSpec& spec, const RequestRecord& record,
                   policies::InstanceId) override {
    Push(WireEvent::Kind::kPreempted, spec.id, record);
  }
  // Each frontend is told of its own requests' gaps (the engine raises OnTokenGapsOf).
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override {
    DUET_CHECK_MSG(false, "a worker's engine names the requests of its token gaps");
    (void)gap_s, (void)count;
  }
  void OnTokenGapsOf(Seconds gap_s, std::span<const RequestId> requests) override {
    std::lock_guard lock(mu_);
    gap_counts_.clear();
    for (RequestId id : requests) {
      const auto owner = owner_.find(id);
      if (owner != owner_.end()) ++gap_counts_[owner->second.link];
    }
    for (const auto& [link, count] : gap_counts_) {
      if (Live(link) == nullptr) continue;
      WireEvent e;
      e.kind = WireEvent::Kind::kTokenGaps;
      e.gap_s = gap_s;
      e.count = count;
      pending_[link].events.push_back(std::move(e));
    }
  }
  // The cache's contents are kept here too, for a frontend that joins later.
  void OnKvEvents(policies::InstanceId, std::span<const policies::KvCacheEvent> events) override {
    WireEvent e;
    e.kind = WireEvent::Kind::kKvEvents;
    e.kv_events.assign(events.begin(), events.end());
    std::lock_guard lock(mu_);
    for (const policies::KvCacheEvent& c : events) {
      if (c.stored) {
        cached_[c.hash] = c.block;
      } else {
        cached_.erase(c.hash);
      }
    }
    for (const auto& l : links_)
      if (!l->lost) pending_[l->id].events.push_back(e);
  }

  // Engine thread, after every iteration: sends what it produced and lets go of the requests
  // that finished in it (one that moved on to a decode instance was let go as its KV-ready
  // went).
  void AfterIteration() {
    FlushEvents();
    if (finished_.empty()) return;
    std::lock_guard lock(mu_);
    for (RequestId id : finished_) {
      requests_.erase(id);
      Forget(id);
    }
    finished_.clear();
  }

  // Main thread: heartbeats (with this worker's load) and clock probes on every link due one;
  // links whose frontend left or was lost are closed and dropped. Returns when the next
  // heartbeat is due.
  std::chrono::steady_clock::time_point Tend() {
    const auto now = std::chrono::steady_clock::now();
    auto next = now + std::chrono::seconds(1);
    std::vector<std::shared_ptr<FrontendLink>> due, gone;
    {
      std::lock_guard lock(mu_);
      for (auto it = links_.begin(); it != links_.end();) {
        FrontendLink& l = **it;
        if (l.lost || (l.shutdown && !Holds(l))) {
          if (l.lost) {
            std::fprintf(stderr, "duet worker: lost frontend %d: %s\n", l.id, l.lost_why.c_str());
          } else {
            std::fprintf(stderr, "duet worker: frontend %d left\n", l.id);
          }
          std::vector<policies::InstanceId> peers;
          for (const auto& [peer, descriptor] : l.peers) peers.push_back(peer);
          for (policies::InstanceId peer : peers) Withdraw(l, peer);
          gone.push_back(std::move(*it));
          it = links_.erase(it);
          continue;
        }
        if (l.next_heartbeat <= now) {
          due.push_back(*it);
          l.next_heartbeat =
              now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(l.welcome.heartbeat_interval_s));
        }
        next = std::min(next, l.next_heartbeat);
        ++it;
      }
    }
    for (auto& l : due) {
      (*l->send)(MessageKind::kHeartbeat, EncodeHeartbeat(engine_->load()));
      const auto per_probe = static_cast<std::int64_t>(
          std::max(1.0, std::ceil(kClockProbeEveryS / l->welcome.heartbeat_interval_s)));
      if (++l->heartbeats % per_probe == 0) SendClockProbe(*l);
    }
    // Destroyed with the last reference (the engine thread may hold one a moment longer).
    for (auto& l : gone) {
      l->connection->WaitSent(1.0);
      l->connection->Close();
    }
    return next;
  }

  // Main thread: the links to frontends now.
  std::size_t Links() {
    std::lock_guard lock(mu_);
    return links_.size();
  }
  // Main thread: waits up to `until` for a link to change (a shutdown, a loss).
  void Wait(std::chrono::steady_clock::time_point until) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, until);
  }
  // Whether `link` asked this worker to shut down, and whether it was lost.
  bool ShutDown(const FrontendLink& link) {
    std::lock_guard lock(mu_);
    return link.shutdown;
  }
  bool IsLost(const FrontendLink& link, std::string* why) {
    std::lock_guard lock(mu_);
    if (link.lost) *why = link.lost_why;
    return link.lost;
  }

  // When the worker stops: ends everything every frontend sent, so the engine stops at once.
  void AbandonAll() {
    std::lock_guard lock(mu_);
    for (auto& l : links_) Abandon(*l);
  }

  // Closes every link once what is queued went out, and waits for their threads (after
  // AbandonAll and the engine's stop: nothing sends on them any more).
  void CloseAll() {
    std::vector<std::shared_ptr<FrontendLink>> links;
    {
      std::lock_guard lock(mu_);
      links.swap(links_);
    }
    for (auto& l : links) l->connection->WaitSent(1.0);
    for (auto& l : links) l->connection.reset();
  }

 private:
  struct Owner {
    int link = 0;
    RequestId id = 0;  // the frontend's id of the request
  };

  // Reader thread of `link`: one frame from its frontend. A message this worker cannot take is
  // refused and the link stays: the framing is intact (the reader checked the header), and one
  // bad message, a bug on the frontend's side, must cost no more than the request it names,
  // which the frontend then ends with an error.
  void OnFrame(FrontendLink& link, const FrameHeader& header, const std::string& body) {
    const std::int64_t arrived_ns = SteadyNowNs();  // t3 of a clock reply
    Status s = header.kind == MessageKind::kClockReply ? OnClockReply(link, body, arrived_ns)
                                                       : Handle(link, header, body);
    if (s.ok()) return;
    std::fprintf(stderr, "duet worker: refused a message from frontend %d: %s\n", link.id,
                 s.message().c_str());
    if (header.kind != MessageKind::kEngine) return;
    if (const auto id = EngineRequestId(body))
      (*link.send)(MessageKind::kRefused, EncodeRefused({*id, s.message()}));
  }

  // Reader thread of `link`, when it ends: what its frontend sent ends here (the frontend, if
  // it lives, retries it elsewhere).
  void Lost(FrontendLink& link, const std::string& why) {
    {
      std::lock_guard lock(mu_);
      if (!link.shutdown) link.lost_why = why;
      link.lost = true;
      Abandon(link);
    }
    cv_.notify_all();
  }

  // Ends every request `link`'s frontend sent and the KV leases held for them. Caller holds mu_.
  void Abandon(FrontendLink& link) {
    for (const auto& [theirs, ours] : link.engine_id) {
      if (requests_.count(ours)) Post(EngineMessage::Kind::kAbort, ours);
      if (leases_.count(ours)) Post(EngineMessage::Kind::kKvRelease, ours);
    }
  }
  void Post(EngineMessage::Kind kind, RequestId id) {
    EngineMessage m{kind, nullptr, policies::kNoInstance};
    m.request_id = id;
    engine_->inbox().Post(m);
  }

  // Whether `link`'s frontend has a request or a lease here still. Caller holds mu_.
  bool Holds(const FrontendLink& link) const {
    for (const auto& [theirs, ours] : link.engine_id)
      if (requests_.count(ours) || leases_.count(ours)) return true;
    return false;
  }
  // The link `id`, if its frontend is still there. Caller holds mu_.
  std::shared_ptr<FrontendLink> Live(int id) const {
    for (const auto& l : links_)
      if (l->id == id) return l->lost ? nullptr : l;
    return nullptr;
  }
  // Drops the engine id `id` once nothing holds it (no request, no lease, no early abort).
  // Caller holds mu_.
  void Forget(RequestId id) {
    if (requests_.count(id) || leases_.count(id) || early_aborted_.count(id)) return;
    const auto owner = owner_.find(id);
    if (owner == owner_.end()) return;
    for (const auto& l : links_) {
      if (l->id == owner->second.link) l->engine_id.erase(owner->second.id);
    }
    owner_.erase(owner);
  }

  // The engine's times of a request it hands to (or takes from) a frontend, on that frontend's
  // clock (or the engine's): `shift` added.
  static void ToClock(policies::Request& r, Seconds shift) {
    if (shift == 0) return;
    r.arrival_s = std::max(0.0, r.arrival_s + shift);
    policies::ShiftTimeline(r, shift);
  }

  // Engine thread: an event of request `id` (the engine's id) to its frontend; false when it
  // has none any more.
  bool ToOwner(RequestId id, WireEvent e, const RequestRecord* record) {
    int link_id = 0;
    {
      std::lock_guard lock(mu_);
      const auto owner = owner_.find(id);
      if (owner == owner_.end()) return false;
      const auto link = Live(owner->second.link);
      if (link == nullptr) return false;
      link_id = link->id;
      e.request_id = owner->second.id;
      if (record) {
        e.record = *record;
        policies::ShiftTimeline(*e.record, LinkMinusEngine(*link, *engine_clock_));
      }
    }
    pending_[link_id].events.push_back(std::move(e));
    return true;
  }
  void Push(WireEvent::Kind kind, RequestId id, const RequestRecord& record) {
    WireEvent e;
    e.kind = kind;
    ToOwner(id, std::move(e), &record);
  }
  void FlushEvents() {
    {
      // A frontend that joined gets the prefix cache's contents first, as stored events: its
      // router then sees what the others see. The events queued for it since it joined are
      // in them already (the cache here is updated as they are queued); sent again after
      // them, they change nothing.
      std::lock_guard lock(mu_);
      for (const auto& l : links_) {
        if (!l->wants_cache || l->lost) continue;
        l->wants_cache = false;
        if (cached_.empty()) continue;
        WireEvent e;
        e.kind = WireEvent::Kind::kKvEvents;
        for (const auto& [hash, block] : cached_) e.kv_events.push_back({hash, true, block});
        auto& events = pending_[l->id].events;
        events.insert(events.begin(), std::move(e));
      }
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.events.empty()) {
        ++it;
        continue;
      }
      std::shared_ptr<FrontendLink> link;
      {
        std::lock_guard lock(mu_);
        link = Live(it->first);
      }
      if (link == nullptr) {  // its frontend is gone (and, lost, will not come back)
        it = pending_.erase(it);
        continue;
      }
      it->second.load = engine_->load();
      (*link->send)(MessageKind::kEvents, EncodeEvents(it->second));
      it->second.events.clear();
      ++it;
    }
  }

  Status Handle(FrontendLink& link, const FrameHeader& header, const std::string& body) {
    if (header.kind == MessageKind::kPeer) {
      Result<Peer> peer = ParsePeer(body);
      if (!peer.ok()) return peer.status();
      if (role_ != InstanceRole::kDecode) return Status::Ok();
      std::lock_guard lock(mu_);
      if (peer->kv_descriptor.empty()) {
        Withdraw(link, peer->instance);
      } else {
        link.peers[peer->instance] = peer->kv_descriptor;
        std::string& current = peers_[peer->instance];
        if (current != peer->kv_descriptor) {  // a new peer, or one that came back
          current = peer->kv_descriptor;
          transport_.SetPeer(peer->instance, current);
        }
      }
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
        link.shutdown = true;
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
    const Seconds shift = -LinkMinusEngine(link, *engine_clock_);
    if (w->request) {
      Request& r = *w->request;
      if (Status s = CheckRequest(r, m.kind); !s.ok()) return s;
      RequestId id = 0;
      if (const auto known = link.engine_id.find(r.id); known != link.engine_id.end()) {
        // A prefill instance's lease keeps the request's KV blocks under its id until
        // released: a request that came again with that id would trip the block manager's
        // invariant. One aborted before it came (below) takes the id of its abort.
        if (requests_.count(known->second) || leases_.count(known->second))
          return Status::Error("request " + std::to_string(r.id) + " is already held here");
        id = known->second;
      } else {
        id = next_id_++;
        link.engine_id[r.id] = id;
        owner_[id] = {link.id, r.id};
      }
      requests_.insert(id);
      r.id = id;
      ToClock(r, shift);
      if (std::isfinite(m.lease_expires_s)) m.lease_expires_s += shift;
      m.request = std::make_shared<Request>(std::move(r));  // the engine's from now on
    } else {
      const auto known = link.engine_id.find(m.request_id);
      if (known != link.engine_id.end()) {
        m.request_id = known->second;
        if (m.kind == Kind::kKvRelease) {
          leases_.erase(m.request_id);
          Forget(m.request_id);
        }
      } else if (m.kind == Kind::kAbort && decode && std::isfinite(kv_lease_s_)) {
        // Its KV-ready may still be on its way here: the engine keeps the abort (for the
        // lease's time) under the id the request will take.
        ExpireEarlyAborts();
        const RequestId id = next_id_++;
        link.engine_id[m.request_id] = id;
        owner_[id] = {link.id, m.request_id};
        early_aborted_.insert(id);
        early_aborts_.emplace_back(std::chrono::steady_clock::now(), id);
        m.request_id = id;
      } else {
        return Status::Ok();  // nothing of it here (finished, or moved on)
      }
    }
    engine_->inbox().Post(m);
    return Status::Ok();
  }

  // Caller holds mu_: the early aborts older than the KV lease are forgotten (the engine has
  // forgotten them too).
  void ExpireEarlyAborts() {
    const auto horizon = std::chrono::steady_clock::now() -
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(kv_lease_s_));
    while (!early_aborts_.empty() && early_aborts_.front().first < horizon) {
      const RequestId id = early_aborts_.front().second;
      early_aborts_.pop_front();
      early_aborted_.erase(id);
      Forget(id);
    }
  }

  // `link` no longer announces prefill peer `peer` (it left, or its frontend did): the
  // transport keeps it while another frontend announces it. Caller holds mu_.
  void Withdraw(FrontendLink& link, policies::InstanceId peer) {
    link.peers.erase(peer);
    const auto current = peers_.find(peer);
    if (current == peers_.end()) return;
    std::string other;
    for (const auto& l : links_) {
      if (l.get() == &link || l->lost) continue;
      if (const auto it = l->peers.find(peer); it != l->peers.end()) {
        other = it->second;
        if (other == current->second) return;  // still announced as it is
      }
    }
    if (other.empty()) {
      peers_.erase(current);
    } else {
      current->second = other;
    }
    transport_.SetPeer(peer, other);
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

  // A clock probe on `link` (clock_sync.h), with its clock's offset and error so far.
  void SendClockProbe(FrontendLink& link) {
    ClockProbe probe = ProbeOf(*link.clock);
    {
      std::lock_guard lock(mu_);
      probe.sent_ns = SteadyNowNs();
      // A reply lost with its link leaves its probe here: the oldest go first.
      if (link.probes.size() >= kMaxProbesInFlight) link.probes.erase(link.probes.begin());
      link.probes.insert(probe.sent_ns);
    }
    (*link.send)(MessageKind::kClockProbe, EncodeClockProbe(probe));
  }

  // Reader thread: a reply to one of the link's probes sets its clock, when it is tighter than
  // what the clock holds. A reply to no probe of the link, or one whose times cannot be, is
  // refused (logged; the link stays).
  Status OnClockReply(FrontendLink& link, const std::string& body, std::int64_t arrived_ns) {
    Result<ClockReply> reply = ParseClockReply(body);
    if (!reply.ok()) return reply.status();
    {
      std::lock_guard lock(mu_);
      if (link.probes.erase(reply->probe_sent_ns) == 0)
        return Status::Error("a clock reply to no probe of this worker");
    }
    Result<ClockSample> sample =
        SampleOfProbe(reply->probe_sent_ns, reply->received_ns, reply->sent_ns, arrived_ns);
    if (!sample.ok()) return sample.status();
    link.clock->Offer(*sample);
    return Status::Ok();
  }

  const InstanceRole role_;
  const std::int64_t vocab_size_;
  const Seconds kv_lease_s_;
  WorkerKvTransport& transport_;
  EngineThread* engine_ = nullptr;
  std::shared_ptr<SyncedClock> engine_clock_;
  std::map<int, Events> pending_;  // engine thread: events per link, sent after each iteration
  std::map<int, std::int64_t> gap_counts_;  // engine thread: token gaps per link (reused)
  std::vector<RequestId> finished_;         // engine thread: finished in the iteration

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::vector<std::shared_ptr<FrontendLink>> links_;
  int next_link_ = 1;
  RequestId next_id_ = 1;                        // the engine's request ids
  std::unordered_map<RequestId, Owner> owner_;   // engine id -> its frontend and id there
  std::unordered_set<RequestId> requests_;       // handed to the engine, not finished or moved on
  std::unordered_set<RequestId> leases_;         // KV held for a decode instance's pull
  std::unordered_set<RequestId> early_aborted_;  // aborts of requests not here yet
  std::deque<std::pair<std::chrono::steady_clock::time_point, RequestId>> early_aborts_;
  std::map<policies::InstanceId, std::string> peers_;  // the prefill peers the transport has
  std::unordered_map<policies::BlockHash, std::int32_t> cached_;  // the prefix cache: its blocks
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

namespace {

// A frontend after the first (discovery) registering on `fd`: it must give the instance id
// and engine settings the first gave. The link, its clock set; an error says why not.
Result<std::shared_ptr<FrontendLink>> RegisterAnother(int fd, const Hello& hello,
                                                      const WorkerOptions& options,
                                                      const Welcome& first,
                                                      std::vector<ReadFrameResult>* early) {
  auto welcome = RegisterWorker(fd, hello, options.secret, kAcceptedHandshakeS);
  if (!welcome.ok())
    return Status::Error("a connection that is no frontend of this worker: " + welcome.error());
  if (welcome->instance != first.instance)
    return Status::Error("a frontend gave this worker instance " +
                         std::to_string(welcome->instance) + ", another gave it " +
                         std::to_string(first.instance) +
                         " (frontends over one worker pool agree on ids through the directory)");
  Welcome same = *welcome;
  same.heartbeat_interval_s = first.heartbeat_interval_s;  // each link has its own
  if (EncodeWelcome(same) != EncodeWelcome(first))
    return Status::Error(
        "a frontend whose engine settings differ from the first frontend's "
        "(frontends over one worker pool serve one deployment)");
  auto link = ClockedLink(fd, *welcome, early);
  if (!link.ok()) return Status::Error("setting the clock: " + link.error());
  return link;
}

}  // namespace

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
  const bool many = static_cast<bool>(options.await_frontend);
  Result<int> fd = Status::Error("not connected");
  Result<Welcome> welcome = Status::Error("not registered");
  while (true) {
    if (many) {
      fd = options.await_frontend(1.0);
      if (fd.ok() && *fd < 0) {
        if (options.stop_requested && options.stop_requested()) return Status::Ok();
        continue;
      }
    } else {
      fd = ConnectTo(options.frontend, options.connect_timeout_s);
    }
    if (!fd.ok()) return Status::Error("reaching the frontend: " + fd.error());
    // A connection this worker took (discovery) may be anything: it has the frontend's 3 s
    // for the handshake, and one that fails costs only itself.
    welcome = RegisterWorker(*fd, hello, options.secret,
                             many ? kAcceptedHandshakeS : options.connect_timeout_s);
    if (welcome.ok()) break;
    ::close(*fd);
    if (!many)
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

  // The engine runs on the first frontend's clock: this machine's steady clock set to that
  // frontend's by the probes below, before the engine starts (it stamps the requests'
  // timelines). What the frontend sends meanwhile waits.
  std::vector<ReadFrameResult> early;
  auto clocked = ClockedLink(*fd, *welcome, &early);
  if (!clocked.ok()) {
    ::close(*fd);
    return Status::Error("setting the clock with the frontend: " + clocked.error());
  }
  const std::shared_ptr<FrontendLink> first = std::move(*clocked);

  Worker worker(options.role, config.vocab_size, engine_config.kv_lease_s, **transport);
  EngineThread engine(
      engine_config, *model,
      EngineThread::Ports{first->clock.get(), &worker, transport->get(), &worker, options.step_log},
      [&worker] { worker.AfterIteration(); }, /*warm_up=*/false);
  worker.Attach(&engine, first->clock);
  engine.Start();
  std::fprintf(stderr, "duet worker: instance %d (%s), pid %d, KV over %s\n", welcome->instance,
               policies::ToString(options.role), static_cast<int>(hello.pid),
               (*transport)->path().c_str());
  worker.Join(first, *fd, *fault, std::move(early));

  // Discovery: further frontends, each registered and clocked on this thread.
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  if (many) {
    acceptor = std::thread([&] {
      while (!stopping.load()) {
        auto next = options.await_frontend(0.5);
        if (!next.ok() || *next < 0) continue;
        std::vector<ReadFrameResult> frames;
        auto link = RegisterAnother(*next, hello, options, *welcome, &frames);
        if (!link.ok()) {
          std::fprintf(stderr, "duet worker: refused a frontend: %s\n", link.error().c_str());
          ::close(*next);
          continue;
        }
        worker.Join(*link, *next, *fault, std::move(frames));
        std::fprintf(stderr, "duet worker: another frontend joined (%d in all)\n",
                     static_cast<int>(worker.Links()));
      }
    });
  }

  // Heartbeats and clock probes on every link; without discovery, until the one frontend
  // shuts this worker down or is lost; with it, until told to stop.
  std::string lost_why;
  bool shutdown = false;
  while (true) {
    const auto next = worker.Tend();
    if (!many) {
      shutdown = worker.ShutDown(*first);
      if (shutdown || worker.IsLost(*first, &lost_why)) break;
    } else if (options.stop_requested && options.stop_requested()) {
      break;
    }
    worker.Wait(next);
  }
  stopping = true;
  if (acceptor.joinable()) acceptor.join();
  if (!shutdown) worker.AbandonAll();
  engine.Stop();  // serves what it holds to the end (nothing, once abandoned)
  worker.CloseAll();
  first->connection.reset();  // its threads call into `worker`: they end before it goes
  if (!many && !shutdown) return Status::Error("lost the frontend: " + lost_why);
  return Status::Ok();
}

}  // namespace duet::backend::cluster
