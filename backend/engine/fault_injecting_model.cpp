// The fault-injecting forward model and its environment hook (see fault_injecting_model.h).
#include "backend/engine/fault_injecting_model.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace duet::backend {

FaultInjectingModel::FaultInjectingModel(std::unique_ptr<ForwardModel> inner, Rule rule)
    : inner_(std::move(inner)), rule_(std::move(rule)) {
  DUET_CHECK(inner_ != nullptr);
}

FaultInjectingModel::Fault FaultInjectingModel::Next(std::span<const SequenceChunk> batch,
                                                     std::int64_t* pass) {
  *pass = passes_.fetch_add(1, std::memory_order_relaxed);
  return rule_ ? rule_(*pass, batch) : Fault::kNone;
}

Status FaultInjectingModel::Failed(std::int64_t pass, Fault fault) {
  failures_.fetch_add(1, std::memory_order_relaxed);
  return Status::Error("fault injection: forward pass " + std::to_string(pass) + " failed " +
                       (fault == Fault::kFailBefore ? "before it ran" : "after it ran"));
}

Status FaultInjectingModel::Forward(std::span<const SequenceChunk> batch,
                                    std::vector<float>* logits) {
  std::int64_t pass = 0;
  const Fault fault = Next(batch, &pass);
  if (fault == Fault::kFailBefore) return Failed(pass, fault);
  const std::size_t before = logits->size();
  DUET_RETURN_IF_ERROR(inner_->Forward(batch, logits));
  if (fault == Fault::kNone) return Status::Ok();
  logits->resize(before);
  return Failed(pass, fault);
}

Status FaultInjectingModel::ForwardGreedy(std::span<const SequenceChunk> batch,
                                          std::vector<std::int32_t>* tokens) {
  std::int64_t pass = 0;
  const Fault fault = Next(batch, &pass);
  if (fault == Fault::kFailBefore) return Failed(pass, fault);
  const std::size_t before = tokens->size();
  DUET_RETURN_IF_ERROR(inner_->ForwardGreedy(batch, tokens));
  if (fault == Fault::kNone) return Status::Ok();
  tokens->resize(before);
  return Failed(pass, fault);
}

std::unique_ptr<ForwardModel> InjectForwardFaultsFromEnvironment(
    std::unique_ptr<ForwardModel> model) {
  const char* value = std::getenv(kFailForwardWhileFileEnv);
  if (value == nullptr || *value == '\0') return model;
  const std::filesystem::path switch_file = value;
  return std::make_unique<FaultInjectingModel>(
      std::move(model), [switch_file](std::int64_t, std::span<const SequenceChunk>) {
        std::error_code error;  // a file that cannot be looked at counts as absent
        return std::filesystem::exists(switch_file, error) ? FaultInjectingModel::Fault::kFailAfter
                                                           : FaultInjectingModel::Fault::kNone;
      });
}

}  // namespace duet::backend
