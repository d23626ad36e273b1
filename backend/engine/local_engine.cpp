// In-process single-instance serving on the CPU (see local_engine.h).
#include "backend/engine/local_engine.h"

#include <algorithm>
#include <cmath>

#include "policies/block_hash.h"

namespace duet::backend {

using policies::EngineMessage;
using policies::Request;

// Ports of a lone colocated instance: messages come only from Generate on the same thread,
// and nothing moves KV to another instance.
struct LocalEngine::Ports final : policies::Inbox, policies::Outbox, policies::KvTransport {
  std::deque<EngineMessage> inbox;
  bool TryReceive(EngineMessage* m) override {
    if (inbox.empty()) return false;
    *m = inbox.front();
    inbox.pop_front();
    return true;
  }
  void WaitUntil(Seconds) override {}
  void Send(policies::InstanceId, const EngineMessage&) override {
    DUET_CHECK_MSG(false, "a colocated local instance sends no messages");
  }
  policies::TransferId Post(const policies::KvTransferRequest&) override {
    DUET_CHECK_MSG(false, "a colocated local instance moves no KV");
    return 0;
  }
  policies::TransferStatus Poll(policies::TransferId) override {
    return policies::TransferStatus::kFailed;
  }
};

namespace {

ModelStepExecutor::Options ExecutorOptions(const LocalEngineOptions& o) {
  ModelStepExecutor::Options e;
  e.sampling = o.sampling;
  e.stop_token_ids = o.stop_token_ids;
  e.on_token = o.on_token;
  return e;
}

}  // namespace

LocalEngine::LocalEngine(ForwardModel& model, LocalEngineOptions options)
    : model_(model),
      options_(std::move(options)),
      ports_(std::make_unique<Ports>()),
      executor_(model, ExecutorOptions(options_)) {
  policies::EngineConfig config;
  config.id = 0;
  config.role = policies::InstanceRole::kColocated;
  config.num_blocks = model.num_blocks();
  config.block_tokens = model.block_tokens();
  config.enable_prefix_caching = options_.enable_prefix_caching;
  config.scheduler = options_.scheduler;
  engine_ = std::make_unique<policies::InstanceEngine>(
      config, policies::EnginePorts{&executor_, ports_.get(), ports_.get(), &executor_,
                                    ports_.get(), &metrics_});
}

LocalEngine::~LocalEngine() = default;

std::vector<GenerationResult> LocalEngine::Generate(
    const std::vector<GenerationRequest>& requests) {
  std::deque<Request> live;
  const std::size_t finished_before = metrics_.finished();
  const Tokens capacity =
      (model_.num_blocks() -
       static_cast<std::int64_t>(
           std::ceil(options_.scheduler.watermark * static_cast<double>(model_.num_blocks())))) *
      model_.block_tokens();
  std::vector<GenerationResult> results(requests.size());
  std::size_t rejected = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& r = live.emplace_back();
    r.id = next_id_++;
    r.arrival_s = executor_.Now();
    r.input_tokens = static_cast<Tokens>(requests[i].prompt.size());
    r.output_tokens = requests[i].max_tokens;
    r.token_ids = requests[i].prompt;
    r.prefill_instance = r.decode_instance = 0;
    if (r.input_tokens < 1 || r.output_tokens < 1 || r.input_tokens + r.output_tokens > capacity) {
      r.state = policies::RequestState::kRejected;
      r.reason = "needs " + std::to_string(r.input_tokens + r.output_tokens) +
                 " KV tokens; this instance admits at most " + std::to_string(capacity);
      results[i].record = r;
      ++rejected;
      continue;
    }
    r.block_hashes = policies::TokenBlockHashes(r.token_ids, model_.block_tokens());
    ports_->inbox.push_back({EngineMessage::Kind::kNewRequest, &r, policies::kNoInstance});
  }
  while (metrics_.finished() - finished_before < requests.size() - rejected) {
    DUET_CHECK_MSG(engine_->RunOnce(), "local engine stalled with requests unfinished");
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& r = live[i];
    if (r.state == policies::RequestState::kRejected) continue;
    results[i].tokens.assign(r.token_ids.begin() + r.input_tokens, r.token_ids.end());
    results[i].record = r;
    results[i].record.block_hashes = {};
  }
  return results;
}

}  // namespace duet::backend
