// Fork-join ThreadPool (see thread_pool.h). The caller publishes a job and wakes the workers;
// every participant claims chunk indices with a CAS on claim_, which carries the job id so a
// worker that wakes up late cannot claim work of a job that has moved on; the caller returns
// once done_chunks_ says every chunk has finished.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#include "common/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace duet::kernels::cpu {
namespace {

// Set on pool workers and on a caller while it runs a job: a ParallelFor from such a thread
// runs inline instead of waiting for itself.
thread_local bool tls_inside_job = false;

// About 20-100 us of polling (pause is 10-140 cycles depending on the core): long enough to
// bridge the gaps between the kernels of one decode step, short enough not to hog a core
// shared with other work.
constexpr int kSpinIterations = 2000;

constexpr std::uint32_t kInitialGeneration = 0;
// The chunk index of a claim_ that no participant may take (larger than any chunk count).
constexpr std::uint64_t kClosed = 0xFFFFFFFFu;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  DUET_CHECK(threads >= 0);
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_ = threads;
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1);
    workers_sleep_.Notify();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(std::uint32_t job_id) {
  for (;;) {
    std::uint64_t claim = claim_.load(std::memory_order_acquire);
    if (static_cast<std::uint32_t>(claim >> 32) != job_id) return;
    const RangeFn* fn = job_fn_.load(std::memory_order_relaxed);
    const std::int64_t n = job_n_.load(std::memory_order_relaxed);
    const std::int64_t chunk = job_chunk_.load(std::memory_order_relaxed);
    const std::uint32_t chunks = job_chunks_.load(std::memory_order_relaxed);
    // Pairs with the release fence in ParallelFor: if any of these loads saw the next job's
    // parameters, the CAS below sees that job's closing of claim_ and fails.
    std::atomic_thread_fence(std::memory_order_acquire);
    const auto index = static_cast<std::uint32_t>(claim);
    if (index >= chunks) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      continue;
    }
    const std::int64_t begin = static_cast<std::int64_t>(index) * chunk;
    (*fn)(begin, std::min(n, begin + chunk));
    if (done_chunks_.fetch_add(1) + 1 == chunks) caller_sleep_.Notify();
  }
}

void ThreadPool::WorkerLoop() {
  tls_inside_job = true;
  // Not a load of generation_: a destructor or job may already have bumped it before this
  // thread got to run, and that bump must not be missed.
  std::uint32_t seen = kInitialGeneration;
  for (;;) {
    std::uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIterations && now == seen; ++i) {
      CpuRelax();
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      workers_sleep_.WaitUntil([&] { return generation_.load() != seen; });
      now = generation_.load();
    }
    seen = now;
    if (stop_.load(std::memory_order_relaxed)) return;
    RunChunks(seen);
  }
}

void ThreadPool::ParallelFor(std::int64_t n, const RangeFn& fn, std::int64_t min_chunk) {
  DUET_CHECK(n >= 0 && min_chunk >= 1);
  if (n == 0) return;
  // Four chunks per thread balance load without making chunks so small that the shared
  // counter or lost streaming locality starts to cost.
  const std::int64_t target_chunks = static_cast<std::int64_t>(threads_) * 4;
  const std::int64_t chunk = std::max(min_chunk, (n + target_chunks - 1) / target_chunks);
  if (workers_.empty() || chunk >= n || tls_inside_job) {
    fn(0, n);
    return;
  }
  const auto chunks = static_cast<std::uint32_t>((n + chunk - 1) / chunk);

  std::lock_guard<std::mutex> lock(call_mutex_);
  const std::uint32_t job_id = generation_.load(std::memory_order_relaxed) + 1;
  // Close the previous job's claims before overwriting its parameters. Without this a
  // participant that had read the previous job's claim_ (all chunks taken) but not yet its
  // parameters could read this job's chunk count, find the old claim still open, claim it by
  // CAS and run a chunk of this job early and once more, counting it in done_chunks_ twice or
  // before the reset below: the caller then hung, or returned while a chunk still ran.
  claim_.store((static_cast<std::uint64_t>(job_id) << 32) | kClosed, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  job_fn_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_chunk_.store(chunk, std::memory_order_relaxed);
  job_chunks_.store(chunks, std::memory_order_relaxed);
  done_chunks_.store(0, std::memory_order_relaxed);
  claim_.store(static_cast<std::uint64_t>(job_id) << 32, std::memory_order_release);
  generation_.store(job_id);
  workers_sleep_.Notify();

  tls_inside_job = true;
  RunChunks(job_id);
  tls_inside_job = false;

  // Other participants may still be running the chunks they claimed.
  std::uint32_t done = done_chunks_.load(std::memory_order_acquire);
  for (int i = 0; i < kSpinIterations && done != chunks; ++i) {
    CpuRelax();
    done = done_chunks_.load(std::memory_order_acquire);
  }
  if (done != chunks) caller_sleep_.WaitUntil([&] { return done_chunks_.load() == chunks; });
}

void ParallelFor(ThreadPool* pool, std::int64_t n, const RangeFn& fn, std::int64_t min_chunk) {
  DUET_CHECK(n >= 0);
  if (n == 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->ParallelFor(n, fn, min_chunk);
}

}  // namespace duet::kernels::cpu
