// The step executor over a ForwardModel (see step_executor.h).
#include "backend/engine/step_executor.h"

#include <algorithm>
#include <fstream>

namespace duet::backend {

using policies::Request;

nlohmann::json StepTiming::ToJson() const {
  nlohmann::json prefill = nlohmann::json::array();
  for (const auto& c : shape.prefill) prefill.push_back({c.tokens, c.context});
  return {{"prefill", prefill},
          {"decode_tokens", shape.decode_tokens},
          {"decode_context_tokens", shape.decode_context_tokens},
          {"tp", shape.tp},
          {"seconds", seconds}};
}

Status WriteStepTimings(const std::vector<StepTiming>& timings, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  for (const StepTiming& t : timings) out << t.ToJson().dump() << "\n";
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

ModelStepExecutor::ModelStepExecutor(ForwardModel& model, Options options)
    : model_(model), options_(std::move(options)), start_(std::chrono::steady_clock::now()) {}

Seconds ModelStepExecutor::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {
bool Contains(const std::vector<std::int32_t>& ids, std::int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}
}  // namespace

void ModelStepExecutor::Execute(const policies::StepPlan& plan, int tp, int max_steps,
                                std::vector<Seconds>* step_end_s) {
  DUET_CHECK(plan.blocks != nullptr);
  const std::int32_t vocab = model_.config().vocab_size;
  for (int step = 0; step < max_steps; ++step) {
    if (step > 0 && options_.work_arrived && options_.work_arrived()) break;
    const auto t0 = std::chrono::steady_clock::now();
    chunks_.clear();
    sampled_.clear();
    for (const policies::PrefillItem& p : plan.prefills) {
      Request* r = p.request;
      DUET_CHECK(static_cast<Tokens>(r->token_ids.size()) >= p.context + p.tokens);
      const bool last_chunk = p.context + p.tokens == r->prefill_target;
      chunks_.push_back(
          {std::span(r->token_ids)
               .subspan(static_cast<std::size_t>(p.context), static_cast<std::size_t>(p.tokens)),
           p.context, plan.blocks->Table(r->id),
           last_chunk ? SequenceChunk::Logits::kLast : SequenceChunk::Logits::kNone});
      if (last_chunk) sampled_.push_back(r);
    }
    for (Request* r : plan.decodes) {
      // Step `step` of a run processes the newest token; earlier steps of the run appended it.
      const auto position = static_cast<std::int64_t>(r->token_ids.size()) - 1;
      chunks_.push_back({std::span(r->token_ids).subspan(static_cast<std::size_t>(position), 1),
                         position, plan.blocks->Table(r->id), SequenceChunk::Logits::kLast});
      sampled_.push_back(r);
    }
    bool stopped = false;
    const bool greedy = options_.sampling.temperature == 0.0f;
    if (greedy) {
      // The model picks the tokens where its logits are (on a GPU: no logits cross PCIe).
      greedy_.clear();
      model_.ForwardGreedy(chunks_, &greedy_);
      DUET_CHECK(greedy_.size() == sampled_.size());
    } else {
      logits_.clear();
      model_.Forward(chunks_, &logits_);
      DUET_CHECK(logits_.size() == sampled_.size() * static_cast<std::size_t>(vocab));
    }
    for (std::size_t i = 0; i < sampled_.size(); ++i) {
      Request* r = sampled_[i];
      kernels::cpu::SamplingParams params = options_.sampling;
      params.seed = kernels::cpu::SplitMix64(params.seed ^ r->id);
      const std::int32_t token =
          greedy ? greedy_[i]
                 : kernels::cpu::Sample(logits_.data() + i * static_cast<std::size_t>(vocab), vocab,
                                        params, static_cast<std::uint64_t>(r->token_ids.size()));
      r->token_ids.push_back(token);
      if (Contains(options_.stop_token_ids, token)) {
        // The request ends with this token: the engine completes it when it counts it.
        r->output_tokens = static_cast<Tokens>(r->token_ids.size()) - r->input_tokens;
        stopped = true;
      }
      if (options_.on_token) options_.on_token(*r, token);
    }
    const auto t1 = std::chrono::steady_clock::now();
    timings_.push_back({plan.Shape(tp, step), std::chrono::duration<double>(t1 - t0).count()});
    step_end_s->push_back(Now());
    if (stopped) break;  // the batch changes: end the run at this boundary
  }
}

}  // namespace duet::backend
