// The frontend actor of `duet simulate` (see world.h): arrivals, and the driver of the frontend
// policy shared with the live server (policies/frontend_policy.h): admission and routing
// decided there, the message to each dispatched request's prefill instance sent here.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>

#include "policies/block_hash.h"
#include "policies/frontend_policy.h"
#include "sim/world.h"

namespace duet::sim {

using policies::RequestState;

namespace {

// The frontend's port to the instances (policies::Outbox, as the live frontend's): a message
// moves from the frontend's host over the platform to the instance's first GPU, a new request
// carrying its token ids (4 bytes a token), anything else a control message's bytes.
class FrontendOutbox final : public policies::Outbox {
 public:
  explicit FrontendOutbox(World& w) : w_(w) {}
  void Send(InstanceId to, const EngineMessage& message) override {
    const std::uint64_t bytes = message.kind == EngineMessage::Kind::kNewRequest && message.request
                                    ? static_cast<std::uint64_t>(message.request->input_tokens) * 4
                                    : kControlMessageBytes;
    const auto i = static_cast<std::size_t>(to);
    w_.CountRoute(w_.platform.frontend, w_.instances[i].gpus.front(), static_cast<double>(bytes));
    w_.inboxes[i]->Send(message, bytes);
  }

 private:
  World& w_;
};

// Largest KV footprint (tokens) an instance admits: its blocks less the admission watermark.
Tokens AdmissibleTokens(const World& w, InstanceId i) {
  const auto& blocks = w.engines[static_cast<std::size_t>(i)]->blocks();
  return w.cluster.engine.scheduler.AdmissibleTokens(blocks.num_blocks(), blocks.block_tokens());
}

// Hands the stale router view the KV events whose delivery time has come.
void DeliverKvEvents(World& w) {
  const Seconds now = sg4::Engine::get_clock();
  while (!w.kv_events_in_flight.empty() && w.kv_events_in_flight.front().deliver_s <= now) {
    const auto& e = w.kv_events_in_flight.front();
    w.stale_index->Apply(e.instance, e.events);
    w.kv_events_in_flight.pop_front();
  }
}

// The pooled reference cache sees `r` at its arrival: its hit counted, its prompt cached.
void LookUpPooled(World& w, const Request& r) {
  if (!w.pooled || r.input_tokens <= 0) return;
  const auto hit = w.pooled->Touch(r.block_hashes, r.input_tokens);
  if (!hit) return;  // larger than every prefill instance together: admission rejected it
  w.pooled_lookup_tokens += r.input_tokens;
  w.pooled_hit_tokens += *hit;
}

// A later turn of request `p` took its context hashes (or will never need them): once no turn
// needs them and `p` finished, they go.
void ReleaseContext(World& w, std::size_t p) {
  if (w.arrivals->continuations_left(p) == 0 && policies::IsFinished(w.requests[p].state))
    std::vector<policies::BlockHash>().swap(w.requests[p].block_hashes);
}

// Request `k`'s prefix hashes, set when it is sent. A later turn of a session inherits its
// parent's context hashes (prompt and output, computed when the parent was sent), then names
// its new tokens as its own; a request that later turns continue names its output too.
void SetBlockHashes(World& w, std::size_t k) {
  Request& r = w.requests[k];
  const traces::TraceRequest& tr = w.trace.requests[k];
  const Tokens block = w.cluster.engine.block_tokens;
  if (const auto p = w.arrivals->parent(k)) {
    Request& parent = w.requests[*p];
    const auto inherited = std::min<std::size_t>(
        parent.block_hashes.size(), static_cast<std::size_t>(tr.context_tokens / block));
    r.block_hashes.assign(parent.block_hashes.begin(),
                          parent.block_hashes.begin() + static_cast<std::ptrdiff_t>(inherited));
    ReleaseContext(w, *p);
    policies::ExtendUniqueBlockHashes(r.block_hashes, r.id, r.input_tokens / block);
  } else {
    r.block_hashes =
        policies::EngineBlockHashes(tr.block_ids, w.trace.block_tokens, r.input_tokens, block);
  }
  // Prompt content no trace id names, and the output, are this request's own.
  if (w.arrivals->continuations_left(k) > 0)
    policies::ExtendUniqueBlockHashes(r.block_hashes, r.id,
                                      (r.input_tokens + r.output_tokens) / block);
}

}  // namespace

void RunFrontend(World& w) {
  FrontendOutbox outbox(w);
  std::vector<policies::InstanceRole> roles;
  std::vector<Tokens> admissible;
  for (std::size_t i = 0; i < w.cluster.instances.size(); ++i) {
    roles.push_back(w.cluster.instances[i].role);
    admissible.push_back(AdmissibleTokens(w, static_cast<InstanceId>(i)));
  }
  policies::FrontendPolicy policy(
      policies::AdmissionLimits::For(roles, admissible, w.cluster.model.max_position_embeddings,
                                     w.cluster.model.name),
      *w.router);

  auto reject = [&](Request& r, std::string reason) {
    r.state = RequestState::kRejected;
    r.finished_s = sg4::Engine::get_clock();
    r.reason = std::move(reason);
    w.sink->OnFinished(r, r);
  };
  // Sends request `k`: admission checks, routing, the message to its prefill instance.
  auto send = [&](std::size_t k, Seconds arrival_s, Seconds frontend_s) {
    Request& r = w.requests[k];
    r.arrival_s = arrival_s;
    r.frontend_s = frontend_s;
    r.session = w.arrivals->session(k);
    SetBlockHashes(w, k);
    DeliverKvEvents(w);
    policies::FrontendDecision d = policy.Admit(r);
    // Reasons read "<class>: <detail>": the summary counts them by class.
    if (!d.dispatched()) return reject(r, std::move(d.reason));
    LookUpPooled(w, r);
    r.state = RequestState::kQueued;
    // The engine serves a copy of its own; the record comes back through the sink. The prefix
    // hashes move with it, unless a later turn of the session still reads them here.
    std::vector<policies::BlockHash> hashes;
    if (w.arrivals->continuations_left(k) == 0) hashes.swap(r.block_hashes);
    auto sent = std::make_shared<Request>(r);
    if (!hashes.empty()) sent->block_hashes = std::move(hashes);
    outbox.Send(d.prefill,
                {EngineMessage::Kind::kNewRequest, std::move(sent), policies::kNoInstance});
  };

  // A profile's frontend fit prices each request's way through the server's frontend (parsing
  // its body, hashing its blocks) before it is routed and handed over. The frontend takes one
  // request at a time in arrival order, as `duet serve`'s one network thread does: a burst
  // waits behind its own first requests. Without a fit, each is handed over on arrival.
  const models::StepProfile* profile = w.cluster.cost_model.profile.get();
  const models::FrontendFit* priced = profile && profile->frontend ? &*profile->frontend : nullptr;
  struct InFrontend {
    Seconds ready_s;  // its hand-over
    std::size_t index;
    Seconds arrival_s;
  };
  std::deque<InFrontend> in_frontend;  // in arrival order, so in hand-over order too
  Seconds frontend_free_s = 0;         // when the frontend is done with what it holds

  traces::Arrivals& arrivals = *w.arrivals;
  for (;;) {
    // A request whose dependency was rejected or failed is never sent.
    while (const auto dropped = arrivals.TakeDropped()) {
      Request& r = w.requests[dropped->index];
      r.arrival_s = sg4::Engine::get_clock();
      if (const auto parent = w.arrivals->parent(dropped->index)) ReleaseContext(w, *parent);
      const Request& cause = w.requests[dropped->cause];
      reject(r, std::string("dependency not completed: request ") + std::to_string(cause.id) +
                    " was " + policies::ToString(cause.state));
    }
    const Seconds now = sg4::Engine::get_clock();
    if (const auto due = arrivals.TakeDue(now)) {
      if (!priced) {
        send(due->index, due->arrival_s, 0);
      } else {
        frontend_free_s = std::max(frontend_free_s, due->arrival_s) +
                          priced->Predict(w.requests[due->index].input_tokens);
        in_frontend.push_back({frontend_free_s, due->index, due->arrival_s});
      }
      continue;
    }
    if (!in_frontend.empty() && in_frontend.front().ready_s <= now) {
      const InFrontend done = in_frontend.front();
      in_frontend.pop_front();
      send(done.index, done.arrival_s, done.ready_s - done.arrival_s);
      continue;
    }
    if (arrivals.Exhausted() && in_frontend.empty()) break;
    // The next time something is due, an arrival or a hand-over; infinity: none known yet.
    Seconds next = std::numeric_limits<Seconds>::infinity();
    if (!arrivals.Exhausted())
      if (const std::optional<Seconds> arrival = arrivals.NextArrival()) next = *arrival;
    if (!in_frontend.empty()) next = std::min(next, in_frontend.front().ready_s);
    if (!arrivals.dynamic()) {
      sg4::this_actor::sleep_until(next);  // a static trace always knows its next arrival
    } else {
      // Until the next known arrival, or a finish that may bring one sooner.
      std::unique_lock lock(*w.wake_mutex);
      w.frontend_sleeping = true;
      if (std::isfinite(next)) {
        w.wake->wait_until(lock, next);
      } else {
        w.wake->wait(lock);
      }
      w.frontend_sleeping = false;
    }
    ++w.events;
  }
  if (w.finished < arrivals.released()) {
    w.frontend_waiting = true;
    w.done_mailbox->get<int>();
    ++w.events;
  }
  for (std::size_t i = 0; i < w.engines.size(); ++i) {
    outbox.Send(static_cast<InstanceId>(i),
                {EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance});
  }
}

}  // namespace duet::sim
