// Google Benchmark timings of the CPU kernels: GEMV (decode) in GB/s of weights read, next to a
// read-only memory-bandwidth probe over 256 MB with the same thread count; GEMM (prefill) in
// GFLOP/s; each matmul kernel on decode batches of 1-32 rows (BM_SmallM, BM_DecodeMatMuls:
// where MatMul's crossovers come from); paged decode attention in GB/s of K/V read; and a full
// decode step of a synthetic ~110M-parameter bf16 Llama-style model. Run:
// build/bin/duet_kernels_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/kernels.h"

#if DUET_KERNELS_X86
#include <immintrin.h>
#endif

namespace {

using namespace duet::kernels::cpu;

constexpr std::int64_t kMiB = 1 << 20;
// Larger than this machine's last-level cache (105 MiB here) so that the data comes from DRAM.
constexpr std::int64_t kStreamBytes = 256 * kMiB;

ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// Cheap deterministic fill (mt19937 over hundreds of MB would dominate start-up).
std::uint64_t Next(std::uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return state >> 33;
}
float NextFloat(std::uint64_t& state) {
  return static_cast<float>(Next(state) % 2000001) / 1000000.0f - 1.0f;
}

// Owns the storage of a weight in a dtype.
struct OwnedWeight {
  std::vector<float> f32;
  std::vector<std::uint16_t> half;
  Weight view;
};

OwnedWeight MakeWeight(WeightDtype dtype, std::int64_t rows, std::int64_t cols,
                       std::uint64_t seed) {
  OwnedWeight w;
  const auto n = static_cast<std::size_t>(rows * cols);
  std::uint64_t state = seed;
  if (dtype == WeightDtype::kF32) {
    w.f32.resize(n);
    for (float& x : w.f32) x = NextFloat(state) * 0.05f;
    w.view = Weight{w.f32.data(), dtype, rows, cols};
  } else {
    w.half.resize(n);
    for (auto& x : w.half) {
      const float f = NextFloat(state) * 0.05f;
      x = dtype == WeightDtype::kBF16 ? F32ToBf16(f) : F32ToF16(f);
    }
    w.view = Weight{w.half.data(), dtype, rows, cols};
  }
  return w;
}

std::vector<float> RandomVector(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = NextFloat(seed);
  return v;
}

// Forces a benchmark's kernel (arg 3: none) for its lifetime.
class ScopedKernel {
 public:
  explicit ScopedKernel(std::int64_t arg)
      : saved_(ForceMatMulKernelForTesting(
            arg == 3 ? std::nullopt : std::optional(static_cast<MatMulKernel>(arg)))) {}
  ~ScopedKernel() { ForceMatMulKernelForTesting(saved_); }

 private:
  std::optional<MatMulKernel> saved_;
};

// ---------------------------------------------------------------------------------------------
// Memory-bandwidth probe: a read-only sum, vectorised and with independent accumulators so that
// it is limited by memory, not by add latency.

// Each call reads four sub-ranges side by side with software prefetch 2 KiB ahead, exactly the
// access pattern of the GEMV (several concurrent streams per core get more out of the memory
// system than a single one), so that the two are compared on equal terms.
#if DUET_KERNELS_X86
DUET_TARGET_AVX2 float SumAvx2(const float* x, std::int64_t n) {
  const std::int64_t quarter = n / 4 / 16 * 16;
  const float* p[4] = {x, x + quarter, x + 2 * quarter, x + 3 * quarter};
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < quarter; i += 16) {
    for (int s = 0; s < 4; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(p[s] + i) + 2048, _MM_HINT_T0);
      acc[s][0] = _mm256_add_ps(acc[s][0], _mm256_loadu_ps(p[s] + i));
      acc[s][1] = _mm256_add_ps(acc[s][1], _mm256_loadu_ps(p[s] + i + 8));
    }
  }
  __m256 total = _mm256_setzero_ps();
  for (auto& a : acc) total = _mm256_add_ps(total, _mm256_add_ps(a[0], a[1]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float s = 0;
  for (float l : lanes) s += l;
  for (std::int64_t i = 4 * quarter; i < n; ++i) s += x[i];
  return s;
}
#endif

float SumBaseline(const float* x, std::int64_t n) {
  float partial[16] = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += x[i + j];
  }
  float s = 0;
  for (float p : partial) s += p;
  for (; i < n; ++i) s += x[i];
  return s;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const std::int64_t n = kStreamBytes / 4;
  std::vector<float> buffer(static_cast<std::size_t>(n), 1.0f);
  ThreadPool& pool = Pool(threads);
  constexpr std::int64_t kBlock = 16384;  // floats (64 KiB) per work unit
  const std::int64_t blocks = n / kBlock;
  for (auto _ : state) {
    std::atomic<double> total{0.0};
    pool.ParallelFor(blocks, [&](std::int64_t b0, std::int64_t b1) {
      const float* start = buffer.data() + b0 * kBlock;
      const std::int64_t count = (b1 - b0) * kBlock;
#if DUET_KERNELS_X86
      const float s = ActiveIsa() == Isa::kAvx2 ? SumAvx2(start, count) : SumBaseline(start, count);
#else
      const float s = SumBaseline(start, count);
#endif
      double expected = total.load();
      while (!total.compare_exchange_weak(expected, expected + s)) {
      }
    });
    benchmark::DoNotOptimize(total.load());
  }
  state.SetBytesProcessed(state.iterations() * kStreamBytes);
  state.SetLabel(std::to_string(threads) + " threads, 256 MiB read-only");
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// The fixed cost of one ParallelFor: fork, a trivial chunk per participant, join.
void BM_ParallelForOverhead(benchmark::State& state) {
  ThreadPool& pool = Pool(static_cast<int>(state.range(0)));
  std::atomic<std::int64_t> sink{0};
  for (auto _ : state) {
    pool.ParallelFor(64,
                     [&](std::int64_t begin, std::int64_t end) { sink.fetch_add(end - begin); });
  }
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_ParallelForOverhead)->Arg(2)->UseRealTime()->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------
// GEMV, M = 1. Args: dtype, N (out), K (in), threads, dram. With dram = 1 the benchmark cycles
// through enough copies of the matrix (>= 256 MiB) that every call streams W from DRAM, as a
// decode step over a model larger than the cache does; dram = 0 reuses one matrix (cache-hot
// when it fits in the last-level cache).

void BM_Gemv(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const std::int64_t n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const bool dram = state.range(4) != 0;
  const std::int64_t matrix_bytes = n * k * static_cast<std::int64_t>(WeightDtypeBytes(dtype));
  const std::int64_t copies =
      dram ? std::max<std::int64_t>(1, (kStreamBytes + matrix_bytes - 1) / matrix_bytes) : 1;
  std::vector<OwnedWeight> weights;
  for (std::int64_t c = 0; c < copies; ++c) weights.push_back(MakeWeight(dtype, n, k, 17 + c));
  const std::vector<float> x = RandomVector(k, 3);
  std::vector<float> y(static_cast<std::size_t>(n));
  ThreadPool& pool = Pool(threads);
  std::int64_t next = 0;
  for (auto _ : state) {
    MatMul(y.data(), x.data(), 1, weights[next].view, nullptr, &pool);
    benchmark::ClobberMemory();
    next = (next + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * matrix_bytes);
  state.SetLabel(std::string(WeightDtypeName(dtype)) + " " + std::to_string(n) + "x" +
                 std::to_string(k) + ", " + std::to_string(threads) + " threads, " +
                 (dram ? "from DRAM" : "one matrix (cache-hot if it fits)"));
}

void GemvArgs(benchmark::internal::Benchmark* b) {
  const std::int64_t shapes[][2] = {{768, 3072}, {3072, 768}, {4096, 4096}};
  for (int dram : {1, 0}) {
    for (int dtype : {static_cast<int>(WeightDtype::kBF16), static_cast<int>(WeightDtype::kF32)}) {
      for (const auto& s : shapes) {
        for (int threads : {1, 2}) b->Args({dtype, s[0], s[1], threads, dram});
      }
    }
  }
  b->Args({static_cast<int>(WeightDtype::kF16), 4096, 4096, 2, 1});
}
BENCHMARK(BM_Gemv)->Apply(GemvArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------
// GEMM. Args: dtype, N, K, threads, M, library (1: MatMul as configured: the GEMV below
// kLibraryMinRows rows, oneDNN from there; 0: Duet's own GEMM, the yardstick oneDNN replaced).

void BM_Gemm(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const std::int64_t n = state.range(1), k = state.range(2), m = state.range(4);
  const int threads = static_cast<int>(state.range(3));
  const bool library = state.range(5) != 0;
  const bool saved = SetGemmLibraryForTesting(library);
  const ScopedKernel kernel(library ? 3 : static_cast<int>(MatMulKernel::kGemm));
  const OwnedWeight w = MakeWeight(dtype, n, k, 5);
  const std::vector<float> x = RandomVector(m * k, 6);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  ThreadPool& pool = Pool(threads);
  for (auto _ : state) {
    MatMul(y.data(), x.data(), m, w.view, nullptr, &pool);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(WeightDtypeName(dtype)) + " M=" + std::to_string(m) + " " +
                 std::to_string(n) + "x" + std::to_string(k) + ", " + std::to_string(threads) +
                 " threads, " + ToString(MatMulKernelFor(m, dtype)));
  SetGemmLibraryForTesting(saved);
}

void GemmArgs(benchmark::internal::Benchmark* b) {
  for (int dtype : {static_cast<int>(WeightDtype::kBF16), static_cast<int>(WeightDtype::kF32)}) {
    for (const auto& s : {std::pair<int, int>{768, 3072}, {3072, 768}, {4096, 4096}}) {
      for (int threads : {1, 2}) {
        for (int library : {0, 1}) b->Args({dtype, s.first, s.second, threads, 128, library});
      }
    }
  }
  // Where oneDNN starts to pay: decode-batch and small-chunk row counts.
  for (int m : {2, 4, 8, 16, 32, 64, 512}) {
    for (int library : {0, 1}) {
      b->Args({static_cast<int>(WeightDtype::kBF16), 2304, 768, 2, m, library});
    }
  }
}
BENCHMARK(BM_Gemm)->Apply(GemmArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// Small M (decode batches): each kernel MatMul can run, forced, on the bench model's shapes.
// Args: dtype, N, K, M, kernel (0: the GEMV, 1: Duet's GEMM, 2: oneDNN, 3: MatMul's own
// choice), threads. Cycles through >= 256 MiB of copies of W (made once per shape and kept), so
// W comes from DRAM as in a decode step of a model larger than the cache.

const std::vector<OwnedWeight>& DramCopies(WeightDtype dtype, std::int64_t n, std::int64_t k) {
  static std::map<std::tuple<WeightDtype, std::int64_t, std::int64_t>, std::vector<OwnedWeight>>
      cache;
  std::vector<OwnedWeight>& copies = cache[{dtype, n, k}];
  if (copies.empty()) {
    const std::int64_t bytes = n * k * static_cast<std::int64_t>(WeightDtypeBytes(dtype));
    const std::int64_t count = std::max<std::int64_t>(1, (kStreamBytes + bytes - 1) / bytes);
    for (std::int64_t c = 0; c < count; ++c) copies.push_back(MakeWeight(dtype, n, k, 31 + c));
  }
  return copies;
}

void BM_SmallM(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const std::int64_t n = state.range(1), k = state.range(2), m = state.range(3);
  const ScopedKernel kernel(state.range(4));
  const int threads = static_cast<int>(state.range(5));
  const std::vector<OwnedWeight>& weights = DramCopies(dtype, n, k);
  const std::vector<float> x = RandomVector(m * k, 3);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  ThreadPool& pool = Pool(threads);
  std::size_t next = 0;
  for (auto _ : state) {
    MatMul(y.data(), x.data(), m, weights[next].view, nullptr, &pool);
    benchmark::ClobberMemory();
    next = (next + 1) % weights.size();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(weights[0].view.bytes()));
  state.SetLabel(std::string(WeightDtypeName(dtype)) + " M=" + std::to_string(m) + " " +
                 std::to_string(n) + "x" + std::to_string(k) + ", " + std::to_string(threads) +
                 " threads, " + ToString(MatMulKernelFor(m, dtype)));
}

// One family per shape (Google Benchmark warns about families of more than 100).
template <std::int64_t N, std::int64_t K>
void SmallMArgs(benchmark::internal::Benchmark* b) {
  for (std::int64_t m = 1; m <= 32; ++m) {
    for (int kernel : {0, 1, 2})
      b->Args({static_cast<int>(WeightDtype::kBF16), N, K, m, kernel, 2});
  }
}
BENCHMARK(BM_SmallM)->Apply(SmallMArgs<768, 768>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SmallM)->Apply(SmallMArgs<256, 768>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SmallM)->Apply(SmallMArgs<2048, 768>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SmallM)->Apply(SmallMArgs<768, 2048>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SmallM)->Apply(SmallMArgs<32000, 768>)->UseRealTime()->Unit(benchmark::kMicrosecond);

// fp32 weights (twice the bytes; Duet's GEMM uses them in place) and fp16 ones (which oneDNN
// does not take), on the most frequent shape.
void SmallMDtypeArgs(benchmark::internal::Benchmark* b) {
  for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kF16}) {
    for (std::int64_t m : {1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32}) {
      for (int kernel : {0, 1, 2}) {
        if (dtype == WeightDtype::kF32 || kernel != 2) {
          b->Args({static_cast<int>(dtype), 2048, 768, m, kernel, 2});
        }
      }
    }
  }
}
BENCHMARK(BM_SmallM)->Apply(SmallMDtypeArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// The matrix multiplies of one decode step of M sequences on the bench model (bench preset:
// hidden 768, 12 layers, 12 heads / 4 KV heads of 64, intermediate 2048, vocabulary 32000,
// bf16): q, k, v, o, gate, up, down per layer and the lm_head, every weight its own (~200 MB,
// more than the last-level cache, so read from DRAM as in a real step). Args: M, kernel (as
// BM_SmallM), threads.
struct DecodeMatMuls {
  std::vector<OwnedWeight> weights;  // per layer q, k, v, o, gate, up, down; then lm_head
  DecodeMatMuls() {
    std::uint64_t seed = 500;
    const std::int64_t shapes[][2] = {{768, 768},  {256, 768},  {256, 768}, {768, 768},
                                      {2048, 768}, {2048, 768}, {768, 2048}};
    for (int layer = 0; layer < 12; ++layer) {
      for (const auto& s : shapes)
        weights.push_back(MakeWeight(WeightDtype::kBF16, s[0], s[1], ++seed));
    }
    weights.push_back(MakeWeight(WeightDtype::kBF16, 32000, 768, ++seed));
  }
};

void BM_DecodeMatMuls(benchmark::State& state) {
  static DecodeMatMuls model;
  const std::int64_t m = state.range(0);
  const ScopedKernel kernel(state.range(1));
  ThreadPool& pool = Pool(static_cast<int>(state.range(2)));
  const std::vector<float> x = RandomVector(m * 2048, 3);
  std::vector<float> y(static_cast<std::size_t>(m * 32000));
  std::int64_t bytes = 0;
  for (const OwnedWeight& w : model.weights) bytes += static_cast<std::int64_t>(w.view.bytes());
  for (auto _ : state) {
    for (const OwnedWeight& w : model.weights) {
      MatMul(y.data(), x.data(), m, w.view, nullptr, &pool);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel("M=" + std::to_string(m) + ", " + std::to_string(state.range(2)) + " threads, " +
                 (state.range(1) == 3 ? "auto, " : "") +
                 ToString(MatMulKernelFor(m, WeightDtype::kBF16)));
}

void DecodeMatMulArgs(benchmark::internal::Benchmark* b) {
  for (std::int64_t m = 1; m <= 32; m += m < 16 ? 1 : 8) {
    for (int kernel : {3, 0, 1, 2}) b->Args({m, kernel, 2});
  }
}
BENCHMARK(BM_DecodeMatMuls)->Apply(DecodeMatMulArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// Paged decode attention (n_tokens = 1), Llama-3-8B layer shape: 32 heads, 8 KV heads,
// head_dim 128, 16-token blocks, shuffled block table. Args: context, threads, dram: with
// dram = 1 it cycles through enough sequences that their K/V (>= 256 MiB) come from DRAM,
// with 0 it rereads one sequence (32 MiB at 4k: cache-resident here).

void BM_PagedDecodeAttention(benchmark::State& state) {
  const std::int64_t context = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const bool dram = state.range(2) != 0;
  const std::int64_t heads = 32, kv_heads = 8, head_dim = 128, block_tokens = 16;
  const std::int64_t seq_bytes = 2 * context * kv_heads * head_dim * 4;
  const std::int64_t sequences = dram ? std::max<std::int64_t>(1, kStreamBytes / seq_bytes) : 1;
  const std::int64_t blocks_per_seq = (context + block_tokens - 1) / block_tokens;
  const std::int64_t num_blocks = sequences * blocks_per_seq;
  const auto floats = static_cast<std::size_t>(num_blocks * block_tokens * kv_heads * head_dim);
  std::vector<float> k_cache = RandomVector(static_cast<std::int64_t>(floats), 7);
  std::vector<float> v_cache = RandomVector(static_cast<std::int64_t>(floats), 8);
  const PagedKvLayer layer{k_cache.data(),
                           v_cache.data(),
                           static_cast<std::int32_t>(block_tokens),
                           static_cast<std::int32_t>(kv_heads),
                           static_cast<std::int32_t>(head_dim),
                           num_blocks};
  std::vector<std::int32_t> all(static_cast<std::size_t>(num_blocks));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(9));
  const std::vector<float> q = RandomVector(heads * head_dim, 10);
  std::vector<float> out(q.size());
  ThreadPool& pool = Pool(threads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::int64_t next = 0;
  for (auto _ : state) {
    const std::span<const std::int32_t> table(all.data() + next * blocks_per_seq,
                                              static_cast<std::size_t>(blocks_per_seq));
    PagedAttention(out.data(), q.data(), 1, heads, layer, table, context - 1, scale, &pool);
    benchmark::ClobberMemory();
    next = (next + 1) % sequences;
  }
  state.SetBytesProcessed(state.iterations() * seq_bytes);
  state.SetLabel("ctx " + std::to_string(context) + ", 32/8 heads x 128, " +
                 std::to_string(threads) + " threads, " +
                 (dram ? "K/V from DRAM" : "one sequence (cache-hot)"));
}
BENCHMARK(BM_PagedDecodeAttention)
    ->Args({1024, 1, 1})
    ->Args({1024, 2, 1})
    ->Args({4096, 1, 1})
    ->Args({4096, 2, 1})
    ->Args({4096, 1, 0})
    ->Args({4096, 2, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------
// One decode step of a synthetic Llama-style bf16 model: hidden 768, 12 layers, 12 heads / 4 KV
// heads of 64, intermediate 2048, vocabulary 32000 with an untied lm_head: 85M layer + 24.6M
// embedding + 24.6M lm_head parameters; a step reads ~220 MB of weights (all but the embedding).
// Context 256. Reports the weight bytes read per second against the bandwidth probe above.

struct TinyLlama {
  static constexpr std::int64_t kHidden = 768, kLayers = 12, kHeads = 12, kKvHeads = 4,
                                kHeadDim = 64, kInter = 2048, kVocab = 32000, kBlock = 16,
                                kContext = 256;
  struct Layer {
    OwnedWeight q, k, v, o, gate, up, down, norm1, norm2;
    std::vector<float> k_cache, v_cache;
  };
  std::vector<Layer> layers;
  OwnedWeight embed, lm_head, final_norm;
  std::vector<float> inv_freq;
  std::vector<std::int32_t> table;
  std::int64_t weight_bytes_per_step = 0;

  TinyLlama() {
    std::uint64_t seed = 100;
    auto make = [&](std::int64_t rows, std::int64_t cols) {
      OwnedWeight w = MakeWeight(WeightDtype::kBF16, rows, cols, ++seed);
      return w;
    };
    const std::int64_t blocks = kContext / kBlock + 1;
    for (std::int64_t l = 0; l < kLayers; ++l) {
      Layer layer;
      layer.q = make(kHeads * kHeadDim, kHidden);
      layer.k = make(kKvHeads * kHeadDim, kHidden);
      layer.v = make(kKvHeads * kHeadDim, kHidden);
      layer.o = make(kHidden, kHeads * kHeadDim);
      layer.gate = make(kInter, kHidden);
      layer.up = make(kInter, kHidden);
      layer.down = make(kHidden, kInter);
      layer.norm1 = make(1, kHidden);
      layer.norm2 = make(1, kHidden);
      layer.k_cache = RandomVector(blocks * kBlock * kKvHeads * kHeadDim, ++seed);
      layer.v_cache = RandomVector(blocks * kBlock * kKvHeads * kHeadDim, ++seed);
      for (const OwnedWeight* w : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up,
                                   &layer.down, &layer.norm1, &layer.norm2}) {
        weight_bytes_per_step += static_cast<std::int64_t>(w->view.bytes());
      }
      layers.push_back(std::move(layer));
    }
    embed = make(kVocab, kHidden);
    lm_head = make(kVocab, kHidden);
    final_norm = make(1, kHidden);
    weight_bytes_per_step +=
        static_cast<std::int64_t>(lm_head.view.bytes() + final_norm.view.bytes());
    for (std::int64_t i = 0; i < kHeadDim / 2; ++i) {
      inv_freq.push_back(static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / kHeadDim)));
    }
    table.resize(static_cast<std::size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
  }

  std::int32_t Step(std::int32_t token, std::int64_t position, ThreadPool* pool) {
    std::vector<float> x(kHidden), h(kHidden), q(kHeads * kHeadDim), k(kKvHeads * kHeadDim),
        v(kKvHeads * kHeadDim), attn(kHeads * kHeadDim), gate(kInter), up(kInter), logits(kVocab);
    const std::int32_t ids[] = {token};
    const std::int32_t positions[] = {static_cast<std::int32_t>(position)};
    Embedding(x.data(), ids, embed.view);
    for (Layer& layer : layers) {
      RmsNorm(h.data(), x.data(), 1, kHidden, layer.norm1.view, 1e-5f, pool);
      MatMul(q.data(), h.data(), 1, layer.q.view, nullptr, pool);
      MatMul(k.data(), h.data(), 1, layer.k.view, nullptr, pool);
      MatMul(v.data(), h.data(), 1, layer.v.view, nullptr, pool);
      Rope(q.data(), kHeads, k.data(), kKvHeads, kHeadDim, positions, inv_freq.data(), 1.0f, pool);
      const PagedKvLayer kv{layer.k_cache.data(),
                            layer.v_cache.data(),
                            kBlock,
                            kKvHeads,
                            kHeadDim,
                            static_cast<std::int64_t>(table.size())};
      WriteKv(kv, table, position, 1, k.data(), v.data());
      PagedAttention(attn.data(), q.data(), 1, kHeads, kv, table, position, 0.125f, pool);
      MatMul(h.data(), attn.data(), 1, layer.o.view, nullptr, pool);
      for (std::int64_t i = 0; i < kHidden; ++i) x[i] += h[i];
      RmsNorm(h.data(), x.data(), 1, kHidden, layer.norm2.view, 1e-5f, pool);
      MatMul(gate.data(), h.data(), 1, layer.gate.view, nullptr, pool);
      MatMul(up.data(), h.data(), 1, layer.up.view, nullptr, pool);
      SwiGlu(gate.data(), gate.data(), up.data(), 1, kInter, pool);
      MatMul(h.data(), gate.data(), 1, layer.down.view, nullptr, pool);
      for (std::int64_t i = 0; i < kHidden; ++i) x[i] += h[i];
    }
    RmsNorm(h.data(), x.data(), 1, kHidden, final_norm.view, 1e-5f, pool);
    MatMul(logits.data(), h.data(), 1, lm_head.view, nullptr, pool);
    return Sample(logits.data(), kVocab, SamplingParams{}, 0);
  }
};

void BM_DecodeStepBf16Model(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static TinyLlama model;
  ThreadPool& pool = Pool(threads);
  std::int32_t token = 1;
  for (auto _ : state) {
    token = model.Step(token, TinyLlama::kContext - 1, &pool);
    benchmark::DoNotOptimize(token);
  }
  state.SetBytesProcessed(state.iterations() * model.weight_bytes_per_step);
  state.counters["tokens/s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("~110M params bf16, " + std::to_string(model.weight_bytes_per_step / kMiB) +
                 " MiB weights/step, ctx 256, " + std::to_string(threads) + " threads");
}
BENCHMARK(BM_DecodeStepBf16Model)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernels_isa", IsaName(ActiveIsa()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
