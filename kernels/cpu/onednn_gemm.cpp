// OneDnnMatMul (see onednn_gemm.h): one oneDNN matmul primitive per (dtype, K, slice width,
// output stride) and thread, with M given at run time so that prompts of any length reuse it.
#include "kernels/cpu/onednn_gemm.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "common/status.h"

// libgomp's, which Debian's oneDNN runs on. Declared here rather than through <omp.h>, which
// clang (the sanitizer builds) only has with its own OpenMP runtime installed.
extern "C" void omp_set_num_threads(int threads);

namespace duet::kernels::cpu {
namespace {

// Output columns per work item: wide enough for the library's blocking (256 measured as fast as
// the whole matrix on one thread), narrow enough that a 768-wide projection still gives three
// items per thread of a two-thread pool.
constexpr std::int64_t kSliceColumns = 256;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::data_type LibraryType(WeightDtype dtype) {
  return dtype == WeightDtype::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// oneDNN sizes its work for omp_get_max_threads() of the calling thread: one, so that a
// primitive runs inline on the pool thread that executes it.
void PinLibraryToThisThread() {
  thread_local bool pinned = false;
  if (!pinned) {
    omp_set_num_threads(1);
    pinned = true;
  }
}

// in [M][k] (row-major) x W slice [cols][k] (row-major, i.e. k x cols with strides {1, k}) ->
// out [M][cols] with row stride ldc. M is a run-time dimension.
dnnl::matmul::primitive_desc Describe(WeightDtype dtype, std::int64_t k, std::int64_t cols,
                                      std::int64_t ldc) {
  using dims = dnnl::memory::dims;
  const auto type = LibraryType(dtype);
  const dnnl::memory::desc src(dims{DNNL_RUNTIME_DIM_VAL, k}, type, dims{k, 1});
  const dnnl::memory::desc weights(dims{k, cols}, type, dims{1, k});
  const dnnl::memory::desc dst(dims{DNNL_RUNTIME_DIM_VAL, cols}, dnnl::memory::data_type::f32,
                               dims{ldc, 1});
  // oneDNN's primitive cache hands every thread the same implementation for the same shape,
  // and Debian's build shares one scratchpad per primitive (no concurrent execution): each
  // thread passes its own scratchpad instead.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, Engine());
}

struct Key {
  WeightDtype dtype;
  std::int64_t k, cols, ldc;
  bool operator<(const Key& o) const {
    return std::tie(dtype, k, cols, ldc) < std::tie(o.dtype, o.k, o.cols, o.ldc);
  }
};

struct Prepared {
  dnnl::matmul primitive;
  std::size_t scratchpad_bytes = 0;
};

// This thread's primitive for the key (created on first use).
const Prepared& Primitive(const Key& key) {
  thread_local std::map<Key, Prepared> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto pd = Describe(key.dtype, key.k, key.cols, key.ldc);
    it = cache.emplace(key, Prepared{dnnl::matmul(pd), pd.scratchpad_desc().get_size()}).first;
  }
  return it->second;
}

// This thread's scratchpad, at least `bytes` long.
void* Scratchpad(std::size_t bytes) {
  thread_local std::vector<std::uint8_t> scratchpad;
  if (scratchpad.size() < bytes) scratchpad.resize(bytes);
  return scratchpad.data();
}

bool Probe(WeightDtype dtype) {
  if (dtype == WeightDtype::kF16) return false;  // f16 inputs would need their own rounding
  try {
    PinLibraryToThisThread();
    const auto pd = Describe(dtype, 64, 64, 64);
    // A reference implementation is far slower than Duet's own kernels.
    return std::strncmp(pd.impl_info_str(), "ref", 3) != 0;
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace

bool OneDnnSupports(WeightDtype dtype) {
  static std::once_flag once;
  static bool supported[3] = {false, false, false};
  std::call_once(once, [] {
    for (WeightDtype d : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
      supported[static_cast<int>(d)] = Probe(d);
    }
  });
  return supported[static_cast<int>(dtype)];
}

void OneDnnMatMul(float* out, const float* in, std::int64_t m, const Weight& w, ThreadPool* pool) {
  DUET_CHECK(OneDnnSupports(w.dtype));
  const std::int64_t k = w.cols, n_out = w.rows;
  const void* src = in;
  if (w.dtype == WeightDtype::kBF16) {
    // The caller's buffer: inside the lambda, a thread_local would name each worker's own.
    thread_local std::vector<std::uint16_t> rounded_storage;
    rounded_storage.resize(static_cast<std::size_t>(m * k));
    std::uint16_t* rounded = rounded_storage.data();
    ParallelFor(
        pool, m,
        [&](std::int64_t r0, std::int64_t r1) {
          ConvertFromF32(in + r0 * k, (r1 - r0) * k, WeightDtype::kBF16, rounded + r0 * k);
        },
        /*min_chunk=*/8);
    src = rounded;
  }
  const std::int64_t slices = (n_out + kSliceColumns - 1) / kSliceColumns;
  const std::size_t weight_bytes = WeightDtypeBytes(w.dtype);
  ParallelFor(pool, slices, [&](std::int64_t s0, std::int64_t s1) {
    PinLibraryToThisThread();
    using dims = dnnl::memory::dims;
    const auto type = LibraryType(w.dtype);
    dnnl::stream stream(Engine());
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int64_t n0 = s * kSliceColumns;
      const std::int64_t cols = std::min(kSliceColumns, n_out - n0);
      const dnnl::memory src_mem({dims{m, k}, type, dims{k, 1}}, Engine(), const_cast<void*>(src));
      const dnnl::memory weights_mem(
          {dims{k, cols}, type, dims{1, k}}, Engine(),
          const_cast<char*>(static_cast<const char*>(w.data) +
                            static_cast<std::size_t>(n0 * k) * weight_bytes));
      const dnnl::memory dst_mem({dims{m, cols}, dnnl::memory::data_type::f32, dims{n_out, 1}},
                                 Engine(), out + n0);
      const Prepared& p = Primitive({w.dtype, k, cols, n_out});
      const dnnl::memory scratchpad_mem({dims{static_cast<dnnl::memory::dim>(p.scratchpad_bytes)},
                                         dnnl::memory::data_type::u8, dims{1}},
                                        Engine(), Scratchpad(p.scratchpad_bytes));
      p.primitive.execute(stream, {{DNNL_ARG_SRC, src_mem},
                                   {DNNL_ARG_WEIGHTS, weights_mem},
                                   {DNNL_ARG_DST, dst_mem},
                                   {DNNL_ARG_SCRATCHPAD, scratchpad_mem}});
    }
    stream.wait();
  });
}

}  // namespace duet::kernels::cpu
