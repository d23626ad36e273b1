// In-process single-instance serving on the calling thread (see local_engine.h).
#include "backend/engine/local_engine.h"

#include <memory>
#include <optional>
#include <string>

#include "policies/block_hash.h"

namespace duet::backend {

using policies::EngineMessage;
using policies::Request;

LocalEngine::LocalEngine(ForwardModel& model, LocalEngineOptions options)
    : model_(model),
      options_(std::move(options)),
      executor_(model, clock_, {.record_timings = true, .step_thread = options_.async_steps}) {
  policies::EngineConfig config;
  config.id = 0;
  config.role = policies::InstanceRole::kColocated;
  config.num_blocks = model.num_blocks();
  config.block_tokens = model.block_tokens();
  config.enable_prefix_caching = options_.enable_prefix_caching;
  config.async_steps = options_.async_steps;
  config.scheduler = options_.scheduler;
  engine_ = std::make_unique<policies::InstanceEngine>(
      config,
      policies::EnginePorts{&clock_, &inbox_, &outbox_, &executor_, &transport_, this, nullptr});
  const policies::InstanceRole role = policies::InstanceRole::kColocated;
  const Tokens admissible =
      options_.scheduler.AdmissibleTokens(model.num_blocks(), model.block_tokens());
  router_ = policies::MakeRouter({}, {0}, {}, nullptr);
  policy_.emplace(
      policies::AdmissionLimits::For({&role, 1}, {&admissible, 1},
                                     model.config().max_position_embeddings, model.config().name),
      *router_);
}

LocalEngine::~LocalEngine() = default;

std::vector<GenerationResult> LocalEngine::Generate(
    const std::vector<GenerationRequest>& requests) {
  std::vector<GenerationResult> results(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto r = std::make_shared<Request>();
    r->id = next_id_++;
    r->arrival_s = clock_.Now();
    r->input_tokens = static_cast<Tokens>(requests[i].prompt.size());
    r->output_tokens = requests[i].max_tokens;
    r->prompt_ids = requests[i].prompt;
    r->sampling = requests[i].sampling;
    r->block_hashes = policies::TokenBlockHashes(r->prompt_ids, model_.block_tokens());
    policies::FrontendDecision d = policy_->Admit(*r);
    if (!d.dispatched()) {
      r->state = policies::RequestState::kRejected;
      r->reason = std::move(d.reason);
      results[i].record = r->record();
      continue;
    }
    serving_.emplace(r->id, &results[i]);
    outbox_.Send(d.prefill,
                 {EngineMessage::Kind::kNewRequest, std::move(r), policies::kNoInstance});
  }
  // The engine owns the requests now: their tokens and records come back through the sink.
  // A step planned past the last request's end is still waited for (asynchronous steps).
  while (!serving_.empty() || engine_->steps_in_flight() > 0) {
    DUET_CHECK_MSG(engine_->RunOnce(), "local engine stalled with requests unfinished");
  }
  return results;
}

void LocalEngine::OnFinished(const policies::RequestSpec& spec,
                             const policies::RequestRecord& record) {
  metrics_.OnFinished(spec, record);
  router_->OnFinished(spec, record);
  auto it = serving_.find(spec.id);
  DUET_CHECK(it != serving_.end());
  it->second->record = record;
  serving_.erase(it);
}

void LocalEngine::OnToken(const policies::RequestSpec& spec, const policies::RequestRecord&,
                          std::int32_t token) {
  serving_.at(spec.id)->tokens.push_back(token);
  if (options_.on_token) options_.on_token(spec, token);
}

}  // namespace duet::backend
