// A small fork-join pool for the CPU kernels: persistent workers, the calling thread takes part,
// and a ParallelFor call allocates nothing. Workers spin briefly before sleeping so that the
// back-to-back kernel calls of a decode step do not pay a futex wake-up each.
#pragma once

#include <atomic>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace duet::kernels::cpu {

using RangeFn = std::function<void(std::int64_t begin, std::int64_t end)>;

// A callable other than a RangeFn itself. Such callables (lambdas) are handed to the pool by
// reference: a std::function holding a std::reference_wrapper fits its small buffer, whereas
// converting a lambda that captures more than two references by value allocates.
template <typename Fn>
concept RangeCallable = std::invocable<Fn&, std::int64_t, std::int64_t> &&
    !std::same_as<std::remove_cvref_t<Fn>, RangeFn>;

// Sleeping until a condition on atomics holds, without lost wake-ups, and with no lock or
// syscall on the waking side while nobody sleeps. The waker makes the change with a seq_cst
// store or RMW before calling Notify, and ready() reads it with seq_cst loads: then either the
// sleeper sees the change or Notify sees the sleeper.
class SleepSlot {
 public:
  template <typename Ready>
  void WaitUntil(Ready ready) {
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1);
    cv_.wait(lock, ready);
    sleepers_.fetch_sub(1);
  }
  void Notify() {
    if (sleepers_.load() == 0) return;
    // Taking the lock orders this after a sleeper's check-then-wait: the sleeper has either not
    // checked yet (and will see the change) or is waiting (and gets the notification).
    { std::lock_guard<std::mutex> lock(mutex_); }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

class ThreadPool {
 public:
  // `threads` counts every participant including the caller (threads - 1 workers are
  // started); 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n) and returns once all are done.
  // Chunks hold at least min_chunk items (except the last) and are handed out dynamically, so
  // a thread slowed down by other processes takes fewer. fn must not throw. Calls from inside
  // fn (nested) and calls while another thread's call is running are safe: a nested call runs
  // inline on the calling thread, concurrent external calls take turns.
  void ParallelFor(std::int64_t n, const RangeFn& fn, std::int64_t min_chunk = 1);
  template <RangeCallable Fn>
  void ParallelFor(std::int64_t n, Fn&& fn, std::int64_t min_chunk = 1) {
    ParallelFor(n, RangeFn(std::ref(fn)), min_chunk);
  }

 private:
  void WorkerLoop();
  // Claims and runs chunks of job `job_id` until none is left or a newer job replaced it.
  void RunChunks(std::uint32_t job_id);

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time

  // The job: written by the caller after it closes claim_ to the previous job (so that no
  // late participant can claim with an old value) and before it publishes claim_ (release). A
  // worker reads them after loading claim_ (acquire) and uses them only if its claim (a CAS on
  // claim_) succeeds; a fence between the reads and the CAS makes the CAS fail whenever a read
  // saw the next job's values.
  std::atomic<const RangeFn*> job_fn_{nullptr};
  std::atomic<std::int64_t> job_n_{0};
  std::atomic<std::int64_t> job_chunk_{1};
  std::atomic<std::uint32_t> job_chunks_{0};
  // (job id << 32) | index of the next unclaimed chunk.
  std::atomic<std::uint64_t> claim_{0};
  // Chunks of the current job finished; the caller returns when it reaches job_chunks_. A
  // worker that wakes late therefore never delays the caller.
  std::atomic<std::uint32_t> done_chunks_{0};
  // The latest job id; workers sleep on it.
  std::atomic<std::uint32_t> generation_{0};  // starts at kInitialGeneration
  SleepSlot workers_sleep_;                   // workers waiting for generation_ to change
  SleepSlot caller_sleep_;                    // the caller waiting for done_chunks_
  std::atomic<bool> stop_{false};
};

// fn(0, n) on the calling thread when pool is null, else pool->ParallelFor.
void ParallelFor(ThreadPool* pool, std::int64_t n, const RangeFn& fn, std::int64_t min_chunk = 1);
template <RangeCallable Fn>
void ParallelFor(ThreadPool* pool, std::int64_t n, Fn&& fn, std::int64_t min_chunk = 1) {
  ParallelFor(pool, n, RangeFn(std::ref(fn)), min_chunk);
}

}  // namespace duet::kernels::cpu
