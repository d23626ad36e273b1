// OneDnnMatMul and the attention products (see onednn_gemm.h). Each thread keeps its own
// primitives, created on first use: for a Linear slice one per (dtype, K, slice width, output
// stride) with M given at run time, so prompts of any length reuse it; for attention one per
// (product, dtype, head_dim) with every other dimension given at run time.
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

using dims = dnnl::memory::dims;
constexpr dnnl::memory::dim kRunTime = DNNL_RUNTIME_DIM_VAL;
constexpr auto kF32 = dnnl::memory::data_type::f32;

// Output columns per work item: wide enough for the library's blocking, narrow enough that a
// 768-wide projection still gives three items per thread of a two-thread pool.
constexpr std::int64_t kSliceColumns = 256;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::data_type LibraryType(WeightDtype dtype) {
  return dtype == WeightDtype::kBF16 ? dnnl::memory::data_type::bf16 : kF32;
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

// Which product a primitive computes: a Linear slice (MatMul) or one of attention's two.
enum class Kind { kLinear, kScores, kValues };

struct Key {
  Kind kind;
  WeightDtype dtype;
  std::int64_t k;     // reduction width; attention: head_dim
  std::int64_t cols;  // Linear: slice width and output row stride; attention: 0
  std::int64_t ldc;
  bool operator<(const Key& o) const {
    return std::tie(kind, dtype, k, cols, ldc) < std::tie(o.kind, o.dtype, o.k, o.cols, o.ldc);
  }
};

dnnl::matmul::primitive_desc Describe(const Key& key) {
  const auto type = LibraryType(key.dtype);
  dnnl::memory::desc src, weights, dst;
  switch (key.kind) {
    case Kind::kLinear:  // in [M][k] x (W slice [cols][k])^T -> out [M][cols], row stride ldc
      src = {dims{kRunTime, key.k}, type, dims{key.k, 1}};
      weights = {dims{key.k, key.cols}, type, dims{1, key.k}};
      dst = {dims{kRunTime, key.cols}, kF32, dims{key.ldc, 1}};
      break;
    case Kind::kScores:  // queries [m][d] x (keys [n][d])^T -> [m][n]
      src = {dims{kRunTime, key.k}, type, dims{key.k, 1}};
      weights = {dims{key.k, kRunTime}, type, dims{1, key.k}};
      dst = {dims{kRunTime, kRunTime}, kF32, dims{kRunTime, 1}};
      break;
    case Kind::kValues:  // probs [m][n] x values [n][d] -> [m][d]
      src = {dims{kRunTime, kRunTime}, type, dims{kRunTime, 1}};
      weights = {dims{kRunTime, key.k}, type, dims{key.k, 1}};
      dst = {dims{kRunTime, key.k}, kF32, dims{key.k, 1}};
      break;
  }
  // oneDNN's primitive cache hands every thread the same implementation for the same shape,
  // and Debian's build shares one scratchpad per primitive (no concurrent execution): each
  // thread passes its own scratchpad instead.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, Engine());
}

struct Prepared {
  dnnl::matmul primitive;
  std::size_t scratchpad_bytes = 0;
};

// This thread's primitive for the key (created on first use).
const Prepared& Primitive(const Key& key) {
  thread_local std::map<Key, Prepared> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto pd = Describe(key);
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

// A rows x cols matrix of `type` at `data`, rows `ld` elements apart.
dnnl::memory Matrix(std::int64_t rows, std::int64_t cols, std::int64_t ld,
                    dnnl::memory::data_type type, const void* data) {
  return dnnl::memory({dims{rows, cols}, type, dims{ld, 1}}, Engine(), const_cast<void*>(data));
}

// The transpose of a row-major rows x cols matrix, seen as cols x rows.
dnnl::memory Transposed(std::int64_t rows, std::int64_t cols, dnnl::memory::data_type type,
                        const void* data) {
  return dnnl::memory({dims{cols, rows}, type, dims{1, cols}}, Engine(), const_cast<void*>(data));
}

// This thread's stream (a CPU stream runs primitives inline; one per thread, made once).
dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// Runs the key's primitive on this thread: dst = src x weights.
void Run(const Key& key, const dnnl::memory& src, const dnnl::memory& weights,
         const dnnl::memory& dst) {
  PinLibraryToThisThread();
  const Prepared& p = Primitive(key);
  const dnnl::memory scratchpad({dims{static_cast<dnnl::memory::dim>(p.scratchpad_bytes)},
                                 dnnl::memory::data_type::u8, dims{1}},
                                Engine(), Scratchpad(p.scratchpad_bytes));
  p.primitive.execute(Stream(), {{DNNL_ARG_SRC, src},
                                 {DNNL_ARG_WEIGHTS, weights},
                                 {DNNL_ARG_DST, dst},
                                 {DNNL_ARG_SCRATCHPAD, scratchpad}});
  Stream().wait();
}

bool Probe(WeightDtype dtype) {
  if (dtype == WeightDtype::kF16) return false;  // f16 inputs would need their own rounding
  try {
    PinLibraryToThisThread();
    // A reference implementation is far slower than Duet's own kernels.
    for (Kind kind : {Kind::kLinear, Kind::kScores, Kind::kValues}) {
      const auto pd = Describe({kind, dtype, 64, kind == Kind::kLinear ? 64 : 0, 64});
      if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return false;
    }
    return true;
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
  const auto type = LibraryType(w.dtype);
  ParallelFor(pool, slices, [&](std::int64_t s0, std::int64_t s1) {
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int64_t n0 = s * kSliceColumns;
      const std::int64_t cols = std::min(kSliceColumns, n_out - n0);
      const char* slice =
          static_cast<const char*>(w.data) + static_cast<std::size_t>(n0 * k) * weight_bytes;
      Run({Kind::kLinear, w.dtype, k, cols, n_out}, Matrix(m, k, k, type, src),
          Transposed(cols, k, type, slice), Matrix(m, cols, n_out, kF32, out + n0));
    }
  });
}

void OneDnnAttentionScores(float* scores, const void* queries, std::int64_t m, const void* keys,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype) {
  DUET_CHECK(OneDnnSupports(dtype));
  const auto type = LibraryType(dtype);
  Run({Kind::kScores, dtype, head_dim, 0, 0}, Matrix(m, head_dim, head_dim, type, queries),
      Transposed(n, head_dim, type, keys), Matrix(m, n, n, kF32, scores));
}

void OneDnnAttentionValues(float* out, const void* probs, std::int64_t m, const void* values,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype) {
  DUET_CHECK(OneDnnSupports(dtype));
  const auto type = LibraryType(dtype);
  Run({Kind::kValues, dtype, head_dim, 0, 0}, Matrix(m, n, n, type, probs),
      Matrix(n, head_dim, head_dim, type, values), Matrix(m, head_dim, head_dim, kF32, out));
}

}  // namespace duet::kernels::cpu
