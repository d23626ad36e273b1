// The host-side greedy default of ForwardModel (see forward_model.h).
#include "backend/engine/forward_model.h"

#include <algorithm>
#include <new>
#include <numeric>
#include <vector>

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

Status WarmUp(ForwardModel& model, std::span<const std::int32_t> prompt) {
  if (prompt.empty()) return Status::Ok();
  const auto context = static_cast<std::int64_t>(prompt.size());
  std::vector<std::int32_t> table(
      static_cast<std::size_t>((context + 1 + model.block_tokens() - 1) / model.block_tokens()));
  std::iota(table.begin(), table.end(), 0);
  DUET_CHECK(static_cast<std::int64_t>(table.size()) <= model.num_blocks());
  std::vector<float> logits;
  const SequenceChunk prefill{prompt, 0, table, SequenceChunk::Logits::kLast};
  DUET_RETURN_IF_ERROR(model.Forward({&prefill, 1}, &logits));
  // One decode row after the prompt (the backends' small-batch path), then 16 rows (their
  // matrix-multiply path), each of a one-token sequence in a block of its own: no two rows
  // write or read the same KV.
  const SequenceChunk row{prompt.first(1), context, table, SequenceChunk::Logits::kLast};
  logits.clear();
  DUET_RETURN_IF_ERROR(model.Forward({&row, 1}, &logits));
  if (model.block_tokens() < 2) return Status::Ok();
  const std::int64_t rows = std::min<std::int64_t>(16, model.num_blocks());
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(rows));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<SequenceChunk> batch;
  for (const std::int32_t& b : blocks)
    batch.push_back({prompt.first(1), 1, {&b, 1}, SequenceChunk::Logits::kLast});
  logits.clear();
  return model.Forward(batch, &logits);
}

std::vector<std::int32_t> WarmUpPrompt(const ForwardModel& model) {
  const models::ModelSpec& config = model.config();
  std::int64_t tokens = std::min<std::int64_t>(512, config.max_position_embeddings - 1);
  tokens = std::min(tokens, model.num_blocks() * model.block_tokens() - 1);
  std::vector<std::int32_t> prompt;
  for (std::int64_t i = 0; i < tokens; ++i)
    prompt.push_back(static_cast<std::int32_t>((i * 7919) % config.vocab_size));
  return prompt;
}

Status ForwardModel::ForwardGreedy(std::span<const SequenceChunk> batch,
                                   std::vector<std::int32_t>* tokens) {
  std::vector<float> logits;
  DUET_RETURN_IF_ERROR(Forward(batch, &logits));
  const std::int32_t vocab = config().vocab_size;
  const kernels::cpu::SamplingParams greedy;  // temperature 0
  for (std::size_t at = 0; at < logits.size(); at += static_cast<std::size_t>(vocab))
    tokens->push_back(kernels::cpu::Sample(logits.data() + at, vocab, greedy, 0));
  return Status::Ok();
}

}  // namespace duet::backend
