// The step executor over a ForwardModel (see step_executor.h).
#include "backend/engine/step_executor.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>

#include "kernels/cpu/sampling.h"
#include "models/step_profile.h"

namespace duet::backend {

Status WriteStepTimings(const std::vector<StepTiming>& timings, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  for (const StepTiming& t : timings) out << t.ToJson().dump() << "\n";
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

ModelStepExecutor::ModelStepExecutor(ForwardModel& model, const policies::Clock& clock,
                                     Options options)
    : model_(model), clock_(clock), options_(options) {
  if (options_.step_thread) thread_ = std::thread([this] { Loop(); });
}

ModelStepExecutor::~ModelStepExecutor() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

namespace {

bool Contains(std::span<const std::int32_t> ids, std::int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

Seconds ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void ModelStepExecutor::Submit(const policies::StepPlan& plan, policies::StepEvents&) {
  DUET_CHECK_MSG(plan.max_steps == 1 && plan.awaited_loads.empty(),
                 "a real executor runs single steps, none overlapped with tier loads");
  {
    std::lock_guard lock(mu_);
    DUET_CHECK_MSG(submitted_.size() + ran_.size() < 2, "the executor holds two steps at most");
    submitted_.push_back(&plan);
  }
  changed_.notify_all();
}

void ModelStepExecutor::Wait(policies::StepResult* result) {
  Ran ran;
  if (thread_.joinable()) {
    std::unique_lock lock(mu_);
    DUET_CHECK_MSG(!submitted_.empty() || !ran_.empty(), "no step was submitted");
    changed_.wait(lock, [&] { return !ran_.empty(); });
    ran = std::move(ran_.front());
    ran_.pop_front();
  } else {
    DUET_CHECK_MSG(!submitted_.empty(), "no step was submitted");
    const policies::StepPlan& plan = *submitted_.front();
    submitted_.pop_front();
    RunStep(plan, &ran);
  }
  *result = std::move(ran.result);
  if (ran.timed && (options_.record_timings || options_.keep_last)) {
    last_ = std::move(ran.timing);
    last_cpu_s_ = ran.cpu_s;
    if (options_.record_timings) timings_.push_back(last_);
  }
}

void ModelStepExecutor::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !submitted_.empty(); });
    if (stopping_) return;  // the engine waited for every step it submitted
    const policies::StepPlan& plan = *submitted_.front();
    lock.unlock();
    Ran ran;
    RunStep(plan, &ran);
    lock.lock();
    submitted_.pop_front();  // after running: the steps held stay counted
    ran_.push_back(std::move(ran));
    changed_.notify_all();
  }
}

void ModelStepExecutor::RunStep(const policies::StepPlan& plan, Ran* ran) {
  Run(plan, ran);
  previous_failed_ = !ran->result.status.ok();
  previous_.clear();
  for (const policies::SampledToken& t : ran->result.tokens) previous_[t.request] = t.token;
}

void ModelStepExecutor::Run(const policies::StepPlan& plan, Ran* ran) {
  policies::StepResult* result = &ran->result;
  // The step's phases on one clock, end to end: preparation, the forward pass, sampling (the
  // step log's phases must not overlap).
  const auto entered = std::chrono::steady_clock::now();
  // A tier write reads this instance's blocks on the storage's I/O thread: the step waits if it
  // writes KV into one of them (a block evicted to make room, written back just now, reused).
  if (options_.tiers) {
    written_.clear();
    const std::int64_t block = model_.block_tokens();
    for (std::size_t i = 0; i < plan.rows.size(); ++i) {
      const policies::StepRow& row = plan.rows[i];
      const std::span<const std::int32_t> table = plan.BlockTable(i);
      if (row.token_count == 0) continue;
      const auto first = static_cast<std::size_t>(row.position / block);
      const auto last = static_cast<std::size_t>((row.position + row.token_count - 1) / block);
      for (std::size_t b = first; b <= last && b < table.size(); ++b) written_.push_back(table[b]);
    }
    while (options_.tiers->ReadingGpu(options_.instance, written_))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  const std::int32_t vocab = model_.config().vocab_size;
  DUET_CHECK(plan.rows.size() == plan.prefills.size() + plan.decodes.size());
  const bool needs_previous = std::any_of(plan.rows.begin(), plan.rows.end(),
                                          [](const auto& row) { return row.previous_token; });
  if (needs_previous && previous_failed_) {
    result->status = Status::Error("the step before it failed");
    result->step_end_s.push_back(clock_.Now());
    return;
  }
  // The plan's token ids, or a copy of them with the previous step's tokens put in.
  if (needs_previous) token_ids_.assign(plan.token_ids.begin(), plan.token_ids.end());
  const std::span<const std::int32_t> token_ids =
      needs_previous ? std::span<const std::int32_t>(token_ids_) : plan.token_ids;
  chunks_.clear();
  sampled_.clear();
  for (std::size_t i = 0; i < plan.rows.size(); ++i) {
    const policies::StepRow& row = plan.rows[i];
    if (row.previous_token) {
      const auto it = previous_.find(row.request);
      DUET_CHECK_MSG(it != previous_.end(), "request " + std::to_string(row.request) +
                                                " got no token from the step before");
      token_ids_[row.tokens_from + row.token_count - 1] = it->second;
    }
    chunks_.push_back({token_ids.subspan(row.tokens_from, row.token_count), row.position,
                       plan.BlockTable(i),
                       row.sample ? SequenceChunk::Logits::kLast : SequenceChunk::Logits::kNone});
    if (row.sample) sampled_.push_back(&row);
  }
  const bool greedy =
      std::all_of(sampled_.begin(), sampled_.end(),
                  [](const policies::StepRow* row) { return row->temperature == 0.0f; });
  const auto t0 = std::chrono::steady_clock::now();
  result->prepare_s = std::chrono::duration<double>(t0 - entered).count();
  const Seconds cpu0 = ThreadCpuSeconds();
  Status pass;
  if (greedy) {
    // The model picks the tokens where its logits are (on a GPU: no logits cross PCIe).
    greedy_.clear();
    pass = model_.ForwardGreedy(chunks_, &greedy_);
    DUET_CHECK(!pass.ok() || greedy_.size() == sampled_.size());
  } else {
    logits_.clear();
    pass = model_.Forward(chunks_, &logits_);
    DUET_CHECK(!pass.ok() || logits_.size() == sampled_.size() * static_cast<std::size_t>(vocab));
  }
  const Seconds cpu1 = ThreadCpuSeconds();
  const auto t1 = std::chrono::steady_clock::now();
  if (!pass.ok()) {
    // No token: the engine ends the step's requests with this error. The timing of a failed
    // pass is no measurement of its shape, so none is kept.
    result->status = Status::Error("the forward pass failed: " + pass.message());
    result->step_end_s.push_back(clock_.Now());
    return;
  }
  for (std::size_t i = 0; i < sampled_.size(); ++i) {
    const policies::StepRow& row = *sampled_[i];
    // The random stream is the row's seed's, at the sampled token's position.
    const std::int32_t token =
        greedy ? greedy_[i]
               : kernels::cpu::Sample(
                     logits_.data() + i * static_cast<std::size_t>(vocab), vocab,
                     {row.temperature, row.top_k, row.top_p, kernels::cpu::SplitMix64(row.seed)},
                     static_cast<std::uint64_t>(row.position + row.token_count));
    result->tokens.push_back({row.request, token, Contains(plan.StopsOf(row), token)});
  }
  if (options_.record_timings || options_.keep_last) {
    ran->timing = {plan.RowsShape(), std::chrono::duration<double>(t1 - t0).count()};
    // Read inside the steady clock's readings: at most the pass's time (the min: the two
    // clocks' sources may tick at rates a hair apart).
    ran->cpu_s = std::min(cpu1 - cpu0, ran->timing.seconds);
    ran->timed = true;
  }
  result->step_end_s.push_back(clock_.Now());
  result->sample_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

}  // namespace duet::backend
