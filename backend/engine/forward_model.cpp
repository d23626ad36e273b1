// The host-side greedy default of ForwardModel (see forward_model.h).
#include "backend/engine/forward_model.h"

#include "kernels/cpu/sampling.h"

namespace duet::backend {

void ForwardModel::ForwardGreedy(std::span<const SequenceChunk> batch,
                                 std::vector<std::int32_t>* tokens) {
  std::vector<float> logits;
  Forward(batch, &logits);
  const std::int32_t vocab = config().vocab_size;
  const kernels::cpu::SamplingParams greedy;  // temperature 0
  for (std::size_t at = 0; at < logits.size(); at += static_cast<std::size_t>(vocab))
    tokens->push_back(kernels::cpu::Sample(logits.data() + at, vocab, greedy, 0));
}

}  // namespace duet::backend
