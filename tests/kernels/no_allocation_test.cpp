// Once warm (thread-local scratch sized), the kernels and the pool do not allocate per call:
// this file replaces the global operator new of the test binary with a counting one and checks
// that a decode-shaped sequence of calls, repeated, allocates nothing. (fp32 and bf16 products
// of kLibraryMinRows rows or more go to oneDNN, which allocates its execution arguments per
// call: work large enough that that is noise.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t bytes) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace duet::kernels::cpu {
namespace {

TEST(NoAllocation, DecodeShapedKernelCallsAllocateNothingOnceWarm) {
  // The kernels run on a one-thread pool so that the warm-up certainly sizes the (only)
  // thread's scratch: with more threads, a worker that took no chunk during the warm-up (a
  // busy machine) grows its own scratch once, later, which is not a per-call allocation.
  // The two-thread pool's own fork-join path is checked below.
  ThreadPool pool(1);
  const testing::TestWeight w = testing::MakeWeight(WeightDtype::kBF16, 96, 64, 1);
  const testing::TestWeight gamma = testing::MakeWeight(WeightDtype::kBF16, 1, 64, 2);
  const testing::TestWeight bias = testing::MakeWeight(WeightDtype::kBF16, 1, 96, 3);
  const Weight bias_view = bias.view();
  // fp16 weights, which oneDNN does not take: Duet's GEMM from kGemmMinRows rows.
  const testing::TestWeight w16 = testing::MakeWeight(WeightDtype::kF16, 96, 64, 6);
  const std::int64_t rows = std::max(kLibraryMinRows, kGemmMinRows);
  const std::vector<float> x = testing::RandomFloats(static_cast<std::size_t>(64 * rows), 4);
  std::vector<float> y(static_cast<std::size_t>(96 * rows)), h(64);
  std::vector<float> k_cache(40 * 16 * 2 * 16), v_cache(k_cache.size());
  const PagedKvLayer layer{k_cache.data(), v_cache.data(), 16, 2, 16, 40};
  std::vector<std::int32_t> table(40);
  for (int i = 0; i < 40; ++i) table[i] = 39 - i;
  const std::vector<float> inv_freq(8, 0.01f);
  const std::int32_t positions[] = {600};
  std::vector<float> q(4 * 16), kv(2 * 16, 0.5f), out(4 * 16);
  const std::vector<float> logits = testing::RandomFloats(1000, 5);

  auto step = [&] {
    std::int64_t sink = 0;
    pool.ParallelFor(100, [&](std::int64_t b, std::int64_t e) { sink += e - b; });
    RmsNorm(h.data(), x.data(), 1, 64, gamma.view(), 1e-5f, &pool);
    MatMul(y.data(), h.data(), 1, w.view(), &bias_view, &pool);                    // GEMV
    MatMul(y.data(), x.data(), kLibraryMinRows - 1, w.view(), &bias_view, &pool);  // GEMV
    MatMul(y.data(), x.data(), kGemmMinRows, w16.view(), nullptr, &pool);          // GEMM
    Rope(q.data(), 4, kv.data(), 2, 16, positions, inv_freq.data(), 1.0f, &pool);
    WriteKv(layer, table, 600, 1, kv.data(), kv.data());
    PagedAttention(out.data(), q.data(), 1, 4, layer, table, 600, 0.25f, &pool);
    SwiGlu(y.data(), y.data(), y.data(), 1, 96, &pool);
    Sample(logits.data(), 1000, SamplingParams{0.7f, 40, 0.9f, 1}, 3);
    return sink;
  };
  step();  // warm-up: thread-local scratch grows here
  step();
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 20; ++i) step();
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);

  ThreadPool pool2(2);
  std::atomic<std::int64_t> total{0};
  auto fork_join = [&] {
    pool2.ParallelFor(1000, [&](std::int64_t b, std::int64_t e) { total.fetch_add(e - b); });
  };
  fork_join();
  g_counting = true;
  for (int i = 0; i < 100; ++i) fork_join();
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(total.load(), 101 * 1000);

  // The counter itself works.
  g_counting = true;
  void* volatile probe = ::operator new(16);
  ::operator delete(probe);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 1);
}

}  // namespace
}  // namespace duet::kernels::cpu
