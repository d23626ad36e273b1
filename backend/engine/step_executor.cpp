// The step executor over a ForwardModel (see step_executor.h).
#include "backend/engine/step_executor.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "kernels/cpu/sampling.h"
#include "models/step_profile.h"

namespace duet::backend {

using policies::Request;

nlohmann::json StepTiming::ToJson() const {
  nlohmann::json line = models::StepShapeToJson(shape);
  line["seconds"] = seconds;
  return line;
}

Status WriteStepTimings(const std::vector<StepTiming>& timings, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  for (const StepTiming& t : timings) out << t.ToJson().dump() << "\n";
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

ModelStepExecutor::ModelStepExecutor(ForwardModel& model, const policies::Clock& clock,
                                     Options options)
    : model_(model), clock_(clock), options_(options) {}

namespace {

bool Contains(const std::vector<std::int32_t>& ids, std::int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The sampler settings of one request. A given seed alone decides the random stream, so equal
// requests with equal seeds give equal outputs; without one it comes from the request id.
kernels::cpu::SamplingParams SamplerFor(const Request& r) {
  const policies::SamplingParams& s = r.sampling;
  return {s.temperature, s.top_k, s.top_p, kernels::cpu::SplitMix64(s.seed ? *s.seed : r.id)};
}

}  // namespace

std::span<const std::int32_t> ModelStepExecutor::Ids(const Request& r, Tokens first, Tokens count) {
  DUET_CHECK(first >= 0 && count >= 0 && first + count <= r.SequenceTokens());
  DUET_CHECK(static_cast<Tokens>(r.prompt_ids.size()) == r.input_tokens &&
             static_cast<Tokens>(r.output_ids.size()) == r.generated_tokens);
  const auto n = static_cast<std::size_t>(count);
  if (first + count <= r.input_tokens)
    return std::span(r.prompt_ids).subspan(static_cast<std::size_t>(first), n);
  if (first >= r.input_tokens)
    return std::span(r.output_ids).subspan(static_cast<std::size_t>(first - r.input_tokens), n);
  std::vector<std::int32_t>& joined = joined_.emplace_back();
  joined.reserve(n);
  for (Tokens p = first; p < first + count; ++p) joined.push_back(r.TokenAt(p));
  return joined;
}

void ModelStepExecutor::Execute(const policies::StepPlan& plan, policies::StepEvents&,
                                policies::StepResult* result) {
  DUET_CHECK_MSG(plan.max_steps == 1 && plan.awaited_loads.empty(),
                 "a real executor runs single steps, none overlapped with tier loads");
  const Seconds entered = clock_.Now();
  // A tier write reads this instance's blocks on the storage's I/O thread; this step may write
  // into one of them (a block evicted to make room was written back from it just now).
  if (options_.tiers) {
    while (options_.tiers->ReadingGpu(options_.instance))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  const std::int32_t vocab = model_.config().vocab_size;
  chunks_.clear();
  joined_.clear();
  sampled_.clear();
  std::size_t entry = 0;
  for (const policies::PrefillItem& p : plan.prefills) {
    const Request* r = p.request;
    const bool last_chunk = p.context + p.tokens == r->prefill_target;
    chunks_.push_back({Ids(*r, p.context, p.tokens), p.context, plan.BlockTable(entry++),
                       last_chunk ? SequenceChunk::Logits::kLast : SequenceChunk::Logits::kNone});
    if (last_chunk) sampled_.push_back(r);
  }
  for (const Request* r : plan.decodes) {
    // The newest token (sampled by the previous step) is processed now.
    const Tokens position = r->SequenceTokens() - 1;
    chunks_.push_back(
        {Ids(*r, position, 1), position, plan.BlockTable(entry++), SequenceChunk::Logits::kLast});
    sampled_.push_back(r);
  }
  const bool greedy = std::all_of(sampled_.begin(), sampled_.end(),
                                  [](const Request* r) { return r->sampling.temperature == 0.0f; });
  const auto t0 = std::chrono::steady_clock::now();
  result->prepare_s = clock_.Now() - entered;
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
  const auto t1 = std::chrono::steady_clock::now();
  if (!pass.ok()) {
    // No token: the engine ends the step's requests with this error. The timing of a failed
    // pass is no measurement of its shape, so none is kept.
    result->status = Status::Error("the forward pass failed: " + pass.message());
    result->step_end_s.push_back(clock_.Now());
    return;
  }
  for (std::size_t i = 0; i < sampled_.size(); ++i) {
    const Request* r = sampled_[i];
    const std::int32_t token =
        greedy
            ? greedy_[i]
            : kernels::cpu::Sample(logits_.data() + i * static_cast<std::size_t>(vocab), vocab,
                                   SamplerFor(*r), static_cast<std::uint64_t>(r->SequenceTokens()));
    result->tokens.push_back({r->id, token, Contains(r->sampling.stop_token_ids, token)});
  }
  if (options_.record_timings || options_.keep_last) {
    last_ = {plan.Shape(), std::chrono::duration<double>(t1 - t0).count()};
    if (options_.record_timings) timings_.push_back(last_);
  }
  result->step_end_s.push_back(clock_.Now());
  result->sample_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

}  // namespace duet::backend
