// The SimGrid ports of one instance: its inbox, clock, outbox and step executor (SimPorts), and
// the router's view of the instances' caches (EngineCacheView). See world.h.
#include <algorithm>
#include <cmath>
#include <utility>

#include "sim/world.h"

namespace duet::sim {

void SimInbox::Send(const EngineMessage& message, std::uint64_t bytes) {
  // Starting a communication is a simcall, where the sender yields and the receiver may run:
  // the inbox is changed before it.
  if (entries_.empty() && waiting_ && doorbell_) {
    // The receiver waits on the doorbell: this send matches its receive and wakes it on arrival.
    entries_.push_back({std::exchange(doorbell_, nullptr), message, true});
    // SimGrid needs a non-null payload to tell a send from a receive.
    static int token = 0;
    doorbell_mailbox_->put_init(&token, bytes)->detach();
    return;
  }
  sg4::CommPtr comm =
      sg4::Comm::sendto_init()->set_payload_size(bytes)->set_source(sg4::this_actor::get_host());
  Entry& entry = entries_.emplace_back(Entry{comm, message, false});
  comm->set_destination(host_);  // starts it; the entry stays (TryReceive takes started ones)
  entry.started = true;
}

bool SimInbox::TryReceive(EngineMessage* message) {
  // A test of a communication whose sender has not returned from starting it would start it
  // again; one that the sender is starting has not arrived anyway.
  if (entries_.empty() || !entries_.front().started || !entries_.front().comm->test()) return false;
  *message = std::move(entries_.front().message);
  // Taken in order: a message is there once it and every one before it arrived.
  last_delivered_s_ = std::max(last_delivered_s_, entries_.front().comm->get_finish_time());
  message->delivered_s = last_delivered_s_;
  entries_.pop_front();
  return true;
}

const sg4::CommPtr& SimInbox::Waitable() {
  // Posting the receive is a simcall, during which a sender may run and find no doorbell yet.
  // The oldest message may be one whose sender has not returned from starting it: the start
  // was handled before this actor's wait can be, since the sender yielded first.
  if (entries_.empty() && !doorbell_) doorbell_ = doorbell_mailbox_->get_async(&doorbell_payload_);
  return entries_.empty() ? doorbell_ : entries_.front().comm;
}

SimPorts::SimPorts(World& world, InstanceId id)
    : world_(world),
      id_(id),
      async_(world.cluster.engine.async_steps),
      inbox_(*world.inboxes[static_cast<std::size_t>(id)]),
      transport_(world.instances, world.Starter(), world.timeline.get()) {}

bool SimPorts::TryReceive(EngineMessage* message) { return inbox_.TryReceive(message); }

ssize_t SimPorts::WaitAny(double timeout) {
  waitables_.clear();
  waitables_.push_back(inbox_.Waitable());
  transport_.AppendWaitables(&waitables_);
  if (world_.storage) world_.storage->AppendWaitables(&waitables_);
  inbox_.set_waiting(true);
  const ssize_t woken = sg4::Comm::wait_any_for(waitables_, timeout);
  inbox_.set_waiting(false);
  ++world_.events;
  return woken;
}

ssize_t SimPorts::WaitFor(Seconds deadline) {
  return WaitAny(std::isinf(deadline) ? -1.0 : std::max(0.0, deadline - Now()));
}

void SimPorts::WaitUntil(Seconds deadline) {
  // The engine waits here only when idle. A message that wakes it (the inbox is the first
  // waitable) has it iterate after its wake-up, as a live engine thread does: what is handed
  // over meanwhile joins the step.
  woke_s_.reset();
  if (WaitFor(deadline) != 0) return;
  const Seconds wake_s = world_.costs[static_cast<std::size_t>(id_)]->WakeTime();
  if (wake_s > 0) {
    sg4::this_actor::sleep_for(wake_s);
    ++world_.events;
  }
  woke_s_ = wake_s;
}

void SimPorts::Send(InstanceId to, const EngineMessage& message) {
  world_.CountRoute(world_.instances[static_cast<std::size_t>(id_)].gpus.front(),
                    world_.instances[static_cast<std::size_t>(to)].gpus.front(),
                    kControlMessageBytes);
  world_.inboxes[static_cast<std::size_t>(to)]->Send(message, kControlMessageBytes);
}

void SimPorts::Execute(const policies::StepPlan& plan, policies::StepEvents& events,
                       policies::StepResult* result) {
  const Seconds start_s = Now();
  ExecuteSteps(plan, events, result);
  last_step_end_s_ = result->step_end_s.back();
  if (!world_.timeline && !world_.step_log) return;
  const auto& cost = *world_.costs[static_cast<std::size_t>(id_)];
  models::StepShape shape = plan.Shape();
  Seconds step_start_s = start_s;
  Seconds after_s = after_s_;  // the first step's
  for (std::size_t s = 0; s < result->step_end_s.size(); ++s) {
    const Seconds end_s = result->step_end_s[s];
    if (world_.timeline)
      world_.timeline->Add(Timeline::Step{id_, step_start_s, end_s, shape.PrefillTokens(),
                                          shape.decode_tokens,
                                          static_cast<std::int32_t>(plan.prefills.size()),
                                          static_cast<std::int32_t>(plan.decodes.size())});
    // The step as a live server logs it: the iteration from its start to its end, the forward
    // pass as priced (a decode run's steps each one token further into their contexts).
    if (world_.step_log) {
      const Seconds forward_s = cost.StepTime(shape) + std::exchange(after_s, 0) +
                                (s < beside_s_.size() ? beside_s_[s] : 0);
      // (At least the pass, which rounding in its end may undercut.)
      const Seconds iteration_s =
          async_ ? end_s - step_start_s : std::max(end_s - step_start_s, forward_s);
      const policies::StepLogLine line{id_,
                                       step_start_s,
                                       iteration_s,
                                       {shape, forward_s},
                                       {},
                                       async_,
                                       std::exchange(woke_s_, std::nullopt),
                                       std::nullopt};  // no thread: no CPU time
      *world_.step_log += policies::FormatStepLogLine(line);
    }
    shape.decode_context_tokens += shape.decode_tokens;
    step_start_s = end_s;
  }
}

namespace {

// The host counts (models/host_time.h) of step `step` (from 0) of `steps` of a plan, as the
// simulator knows them: a request ends when its output is complete (no stop tokens here), and
// only the first step admits.
models::HostCounts PlannedHostCounts(const policies::StepPlan& plan, int step, int steps) {
  models::HostCounts c;
  c.rows = static_cast<double>(plan.prefills.size() + plan.decodes.size());
  c.admitted = step == 0 ? static_cast<double>(plan.admitted.size()) : 0;
  for (const policies::PrefillItem& p : plan.prefills) {
    if (!p.ends_prefill) continue;
    ++c.tokens;
    if (p.remaining_output <= 1) ++c.finished;
  }
  c.tokens += static_cast<double>(plan.decodes.size());
  if (step == steps - 1) {
    for (const policies::DecodeItem& d : plan.decodes) {
      if (d.remaining_output <= steps) ++c.finished;
    }
  }
  return c;
}

// How long a step lasts with its host time (none where the cost model does not price it): a
// synchronous loop adds it; an asynchronous one hides it behind the forward pass of a step that
// follows another at once.
Seconds WithHostTime(Seconds forward_s, Seconds host_s, bool host, bool follows) {
  return !host ? forward_s : follows ? std::max(forward_s, host_s) : forward_s + host_s;
}

}  // namespace

void SimPorts::MoveExpertTraffic(const models::StepCostModel::AllToAll& a2a, double times) {
  const std::vector<sg4::Host*>& gpus = world_.instances[static_cast<std::size_t>(id_)].gpus;
  const std::size_t nodes =
      static_cast<std::size_t>(world_.cluster.placements[static_cast<std::size_t>(id_)].nodes);
  const std::size_t per_node = gpus.size() / nodes;  // node-major (InstancePlacement)
  const auto bytes = [times](double b) {
    return static_cast<std::uint64_t>(std::llround(b * times));
  };
  const std::uint64_t inter = bytes(a2a.inter_node_bytes_per_gpu);
  const std::uint64_t intra = bytes(a2a.bytes_per_gpu - a2a.inter_node_bytes_per_gpu);
  // Each GPU sends its share within its node to the next GPU there and its share for other
  // nodes to its counterpart on the next node: every GPU's NVLink and NIC carry what the
  // pairwise exchange puts on them, and the switch all that crosses nodes.
  comms_.clear();
  for (std::size_t g = 0; g < gpus.size(); ++g) {
    const std::size_t node = g / per_node, local = g % per_node;
    if (intra > 0)
      comms_.push_back(
          world_.Transfer(gpus[g], gpus[node * per_node + (local + 1) % per_node], intra));
    if (inter > 0)
      comms_.push_back(
          world_.Transfer(gpus[g], gpus[(node + 1) % nodes * per_node + local], inter));
  }
  sg4::Comm::wait_all(comms_);
  ++world_.events;
}

void SimPorts::ExecuteSteps(const policies::StepPlan& plan, policies::StepEvents& events,
                            policies::StepResult* result) {
  const auto& cost = *world_.costs[static_cast<std::size_t>(id_)];
  const Seconds start = Now();
  std::vector<Seconds>* step_end_s = &result->step_end_s;
  models::StepShape shape = plan.Shape();
  // The expert-parallel all-to-all of an instance on several GPUs moves over the network after
  // each step's computation (the same every step of a decode run: it depends on the rows only).
  const models::StepCostModel::AllToAll a2a =
      world_.instances[static_cast<std::size_t>(id_)].gpus.size() > 1
          ? cost.ExpertTraffic(shape)
          : models::StepCostModel::AllToAll{};
  // A synchronous loop's host time outside the forward pass is on the critical path: each step
  // lasts its forward pass and its host time, where the cost model prices it. Asynchronous
  // steps plan, apply and stream while the step before runs: a step that follows another at
  // once lasts the longer of its forward pass and its host time; one after an idle spell waits
  // for its host time first.
  const bool host = cost.PricesHost();
  const bool follows = async_ && start == last_step_end_s_;
  // After an idle spell (since the last step, or the start), or right after a step of another
  // kind, the first step's pass runs longer, where the cost model prices it.
  after_s_ = cost.AfterWhatRanBefore(shape, start - std::max<Seconds>(0, last_step_end_s_),
                                     last_shape_ ? &*last_shape_ : nullptr)
                 .seconds;
  last_shape_ = shape;  // (a copy into the last one's storage: no allocation once it holds)
  beside_s_.clear();
  const bool mates = !world_.node_mates[static_cast<std::size_t>(id_)].empty();
  if (plan.max_steps <= 1) {
    const Seconds host_s = host ? cost.HostTime(PlannedHostCounts(plan, 0, 1)) : 0;
    const Seconds step_s =
        WithHostTime(cost.StepTime(shape) + after_s_ - a2a.seconds, host_s, host, follows);
    if (mates) {
      step_end_s->push_back(start + step_s);
      StartBeside(start, shape, step_end_s);
      SleepUntilEnd(*step_end_s);
      running_ends_ = nullptr;
    } else {
      sg4::this_actor::sleep_for(step_s);
      ++world_.events;
      step_end_s->push_back(Now());
    }
    if (a2a.bytes_per_gpu > 0) {
      MoveExpertTraffic(a2a, 1);
      step_end_s->back() = Now();
    }
    if (!plan.awaited_loads.empty()) FinishOverlappedLoads(plan, start, events, result);
    return;
  }
  cost.AppendDecodeRunEnds(shape, plan.max_steps, start + after_s_, step_end_s);
  // Computation only: the run's all-to-alls move after it (below).
  for (std::size_t s = 0; s < step_end_s->size(); ++s)
    (*step_end_s)[s] -= static_cast<double>(s + 1) * a2a.seconds;
  if (host) {
    // The steps of a run differ only in the last one's finished requests.
    const Seconds each = cost.HostTime(PlannedHostCounts(plan, 0, plan.max_steps));
    const Seconds last = cost.HostTime(PlannedHostCounts(plan, plan.max_steps - 1, plan.max_steps));
    if (!async_) {
      for (std::size_t s = 0; s < step_end_s->size(); ++s)
        (*step_end_s)[s] += static_cast<double>(s + 1) * each;
      step_end_s->back() += last - each;
    } else {
      Seconds forward_end = start, end = start;
      for (std::size_t s = 0; s < step_end_s->size(); ++s) {
        const Seconds forward_s = (*step_end_s)[s] - forward_end;
        const Seconds host_s = s + 1 == step_end_s->size() ? last : each;
        forward_end = (*step_end_s)[s];
        end += WithHostTime(forward_s, host_s, true, s > 0 || follows);
        (*step_end_s)[s] = end;
      }
    }
  }
  if (mates) StartBeside(start, shape, step_end_s);
  // The run's end, unless the mates' steps move it (StartBeside) while it runs.
  Seconds until = step_end_s->back();
  ssize_t woken = WaitAny(until - start);
  while (woken < 0 && step_end_s->back() != until) {
    until = step_end_s->back();
    woken = WaitAny(until - Now());
  }
  if (woken >= 0) {
    // New work arrived: finish the step in progress and stop at its boundary.
    const auto boundary = std::lower_bound(step_end_s->begin(), step_end_s->end(), Now());
    step_end_s->erase(boundary + 1, step_end_s->end());
    SleepUntilEnd(*step_end_s);
  }
  running_ends_ = nullptr;
  if (a2a.bytes_per_gpu <= 0) return;
  // The steps' all-to-alls as one exchange after their computation: uncontended, each step
  // ends as late as it would alone; contended, each shares the slowdown equally.
  const double steps = static_cast<double>(step_end_s->size());
  const Seconds computed = step_end_s->back();
  MoveExpertTraffic(a2a, steps);
  const Seconds per_step = (Now() - computed) / steps;
  for (std::size_t s = 0; s < step_end_s->size(); ++s)
    (*step_end_s)[s] += static_cast<double>(s + 1) * per_step;
}

namespace {

// Moves the ends of the steps ending at `ends` (back to back from `start`) for the time
// [from, to) in which another instance's steps run beside them: a step that takes `alone`
// seconds alone, and `full` more beside another all its length, progresses at
// alone / (alone + full) of its pace while the other runs (a step inside the window takes
// `full` more, one that the window cuts in part of it), each step starting when the one before
// it ends. `beside` holds and gains each step's delay (its time alone is its length less it).
void AddBeside(Seconds full, Seconds start, std::vector<Seconds>& ends,
               std::vector<Seconds>& beside, Seconds from, Seconds to) {
  if (full <= 0 || to <= from) return;
  beside.resize(std::max(beside.size(), ends.size()), 0);
  Seconds step_start = start;  // as it was
  Seconds t = start;           // as moved
  for (std::size_t s = 0; s < ends.size(); ++s) {
    const Seconds was_start = step_start, length = ends[s] - step_start;  // before this window
    step_start = ends[s];
    Seconds end = t + length;
    if (length > 0 && t < to && end > from) {
      // Until the window, and after it, at its pace so far; in it, at the pace of its time
      // alone (its length less what earlier windows added to it) beside the other's.
      const Seconds alone = length - beside[s];
      const double pace = alone / (alone + full);
      const Seconds at = std::max(t, from);
      const Seconds left = length - (at - t);  // at its pace so far, at the window's start
      end = left <= (to - at) * pace ? at + left / pace : to + (left - (to - at) * pace);
    } else if (t == was_start) {
      t = step_start;  // neither it nor any step before it moved
      continue;
    }
    beside[s] += end - (t + length);
    ends[s] = end;
    t = end;
  }
}

}  // namespace

void SimPorts::StartBeside(Seconds start, const models::StepShape& shape,
                           std::vector<Seconds>* ends) {
  const models::StepCostModel& cost = *world_.costs[static_cast<std::size_t>(id_)];
  priced_beside_until_.assign(world_.ports.size(), -1);  // these steps: beside nothing yet
  for (const InstanceId m : world_.node_mates[static_cast<std::size_t>(id_)]) {
    SimPorts& mate = *world_.ports[static_cast<std::size_t>(m)];
    if (!mate.running_ends_ || mate.running_ends_->empty() || mate.running_ends_->back() <= start)
      continue;
    // This plan's steps beside the mate's as they stand; the mate's beside these as moved, from
    // where they were priced beside this instance's before (a decode run cut short at new work,
    // continued by this plan); this plan's again beside what that added to the mate's.
    const models::StepShape& theirs = *mate.last_shape_;
    const Seconds mate_end = mate.running_ends_->back();
    const Seconds mine = cost.Beside(shape, theirs);
    AddBeside(mine, start, *ends, beside_s_, mate.running_start_, mate_end);
    Seconds& mate_priced = mate.priced_beside_until_[static_cast<std::size_t>(id_)];
    AddBeside(world_.costs[static_cast<std::size_t>(m)]->Beside(theirs, shape), mate.running_start_,
              *mate.running_ends_, mate.beside_s_, std::max(start, mate_priced), ends->back());
    mate_priced = std::max(mate_priced, ends->back());
    AddBeside(mine, start, *ends, beside_s_, mate_end, mate.running_ends_->back());
    priced_beside_until_[static_cast<std::size_t>(m)] = mate.running_ends_->back();
  }
  running_start_ = start;
  running_ends_ = ends;
}

void SimPorts::SleepUntilEnd(const std::vector<Seconds>& ends) {
  for (Seconds until = -1; ends.back() != until && Now() < ends.back();) {
    until = ends.back();
    sg4::this_actor::sleep_until(until);
    ++world_.events;
  }
}

void SimPorts::FinishOverlappedLoads(const policies::StepPlan& plan, Seconds step_start_s,
                                     policies::StepEvents& events, policies::StepResult* result) {
  policies::TierManager& tiers = *world_.tiers;
  for (const policies::AwaitedLoad& a : plan.awaited_loads) {
    if (!tiers.LoadFinished(a.load)) result->delayed_by_loads.push_back(a.request);
  }
  if (result->delayed_by_loads.empty()) return;  // they hid behind the computation
  auto loading = [&] {
    return std::any_of(plan.awaited_loads.begin(), plan.awaited_loads.end(),
                       [&](const policies::AwaitedLoad& a) { return !tiers.LoadFinished(a.load); });
  };
  // What else ends meanwhile is taken as between steps (it only queues work), and must be: a
  // finished transfer or message left untaken would end every wait at once.
  events.TakeEvents();
  while (loading()) {
    WaitFor(policies::kForever);
    events.TakeEvents();
  }
  // The last layer's KV has just arrived: that layer's share of the step remains.
  const Seconds step_end = result->step_end_s.back();
  const Seconds end = Now() + (step_end - step_start_s) / plan.num_layers;
  while (Now() < end) {
    WaitFor(end);
    events.TakeEvents();
  }
  result->load_wait_s = end - step_end;
  result->step_end_s.back() = end;
}
Tokens EngineCacheView::CachedPrefixTokens(InstanceId instance, const Request& request) const {
  if (world_.stale_index) return world_.stale_index->CachedPrefixTokens(instance, request);
  const auto& blocks = world_.engines[static_cast<std::size_t>(instance)]->blocks();
  return blocks.BlocksToTokens(blocks.CachedPrefixBlocks(request.block_hashes));
}

policies::PrefixReuse EngineCacheView::Reuse(InstanceId instance, const Request& request) const {
  policies::PrefixReuse reuse;
  reuse.gpu_tokens = CachedPrefixTokens(instance, request);
  if (!world_.tiers) return reuse;
  const Tokens block = world_.cluster.engine.block_tokens;
  // As at admission: at least one prompt token is computed.
  const std::int64_t gpu_blocks = reuse.gpu_tokens / block;
  const policies::TierHits hits = world_.tiers->Lookup(
      instance, request.block_hashes, gpu_blocks, (request.input_tokens - 1) / block - gpu_blocks);
  reuse.tier_tokens = hits.total() * block;
  reuse.load_s = world_.tiers->EstimateLoadSeconds(hits);
  return reuse;
}

}  // namespace duet::sim
