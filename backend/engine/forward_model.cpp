// The host-side greedy default of ForwardModel (see forward_model.h).
#include "backend/engine/forward_model.h"

#include <new>

#include "kernels/cpu/sampling.h"

namespace duet::backend {

namespace {

class HeapKvMemory final : public KvMemory {
 public:
  static constexpr std::align_val_t kAlignment{4096};
  explicit HeapKvMemory(std::int64_t bytes)
      : data_(::operator new(static_cast<std::size_t>(bytes), kAlignment)) {}
  ~HeapKvMemory() override { ::operator delete(data_, kAlignment); }
  HeapKvMemory(const HeapKvMemory&) = delete;
  HeapKvMemory& operator=(const HeapKvMemory&) = delete;
  void* data() override { return data_; }

 private:
  void* data_;
};

}  // namespace

std::unique_ptr<KvMemory> AllocateHeapKvMemory(std::int64_t bytes) {
  return std::make_unique<HeapKvMemory>(bytes);
}

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
