// ThreadPool: every index visited exactly once, sums equal the serial sum, 1 thread and
// "hardware" sizes, tiny and empty ranges, min_chunk, nested calls running inline, concurrent
// external callers, and many back-to-back calls (the decode pattern).
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

namespace duet::kernels::cpu {
namespace {

// Sum of f(i) over [0, n) through the pool, with an exact (integer) combination.
std::int64_t PoolSum(ThreadPool& pool, std::int64_t n, std::int64_t min_chunk = 1) {
  std::atomic<std::int64_t> total{0};
  pool.ParallelFor(
      n,
      [&](std::int64_t begin, std::int64_t end) {
        std::int64_t local = 0;
        for (std::int64_t i = begin; i < end; ++i) local += (i * 7919) % 1000003;
        total.fetch_add(local);
      },
      min_chunk);
  return total.load();
}

std::int64_t SerialSum(std::int64_t n) {
  std::int64_t s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += (i * 7919) % 1000003;
  return s;
}

TEST(ThreadPool, SumOverAMillionItemsEqualsSerial) {
  for (int threads : {1, 2, 3, 0}) {
    ThreadPool pool(threads);
    EXPECT_EQ(PoolSum(pool, 1000000), SerialSum(1000000)) << threads;
  }
}

TEST(ThreadPool, ZeroMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  ThreadPool one(1);
  EXPECT_EQ(one.threads(), 1);
}

TEST(ThreadPool, VisitsEveryIndexExactlyOnceInDisjointChunks) {
  ThreadPool pool(4);
  for (std::int64_t n : {1, 2, 3, 7, 16, 17, 1000, 12345}) {
    std::vector<int> visits(static_cast<std::size_t>(n), 0);
    std::atomic<int> calls{0};
    pool.ParallelFor(n, [&](std::int64_t begin, std::int64_t end) {
      ASSERT_LT(begin, end);
      calls.fetch_add(1);
      for (std::int64_t i = begin; i < end; ++i) ++visits[i];  // chunks are disjoint
    });
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i], 1) << "n=" << n << " i=" << i;
    EXPECT_LE(calls.load(), 16) << n;  // about four chunks per thread
  }
}

TEST(ThreadPool, EmptyRangeCallsNothing) {
  ThreadPool pool(2);
  bool called = false;
  pool.ParallelFor(0, [&](std::int64_t, std::int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPool, MinChunkIsHonoured) {
  ThreadPool pool(4);
  std::atomic<int> small_chunks{0};
  pool.ParallelFor(
      1000,
      [&](std::int64_t begin, std::int64_t end) {
        if (end - begin < 300 && end != 1000) small_chunks.fetch_add(1);
      },
      300);
  EXPECT_EQ(small_chunks.load(), 0);
  EXPECT_EQ(PoolSum(pool, 1000, 300), SerialSum(1000));
}

TEST(ThreadPool, NestedCallsRunInlineWithoutDeadlock) {
  ThreadPool pool(3);
  std::atomic<std::int64_t> total{0};
  pool.ParallelFor(8, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) total.fetch_add(PoolSum(pool, 1000));
  });
  EXPECT_EQ(total.load(), 8 * SerialSum(1000));
}

TEST(ThreadPool, ConcurrentExternalCallersTakeTurns) {
  ThreadPool pool(3);
  std::vector<std::int64_t> results(4, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < 50; ++r) results[c] += PoolSum(pool, 10000 + c);
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(results[c], 50 * SerialSum(10000 + c)) << c;
}

TEST(ThreadPool, ManySmallBackToBackCalls) {
  ThreadPool pool(2);
  std::int64_t total = 0;
  for (int r = 0; r < 20000; ++r) total += PoolSum(pool, 64);
  EXPECT_EQ(total, 20000 * SerialSum(64));
}

// Back-to-back jobs whose chunk counts differ (many, then 2). A worker that had read the claim
// of a finished job just as the next one was published used to take a chunk of the new job with
// the old claim: that chunk ran twice and the caller hung or returned early (2 of 10 runs of
// 300,000 jobs on a 2-core machine). A pool with more threads than cores makes such late
// workers likely; every item must run exactly once per job.
TEST(ThreadPool, BackToBackJobsOfDifferentChunkCountsRunEveryItemOnce) {
  ThreadPool pool(static_cast<int>(std::thread::hardware_concurrency()) + 1);
  std::vector<std::atomic<int>> runs(64);
  int bad_jobs = 0;
  for (int job = 0; job < 1000000; ++job) {
    const std::int64_t n = job % 2 == 0 ? 64 : 8;
    for (std::int64_t i = 0; i < n; ++i) runs[i].store(0, std::memory_order_relaxed);
    pool.ParallelFor(
        n,
        [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) runs[i].fetch_add(1);
        },
        /*min_chunk=*/job % 2 == 0 ? 1 : 4);
    for (std::int64_t i = 0; i < n; ++i) {
      if (runs[i].load() != 1) {
        ++bad_jobs;
        break;
      }
    }
  }
  EXPECT_EQ(bad_jobs, 0);
}

TEST(ThreadPool, FreeFunctionRunsInlineWithoutAPool) {
  std::int64_t begin_seen = -1, end_seen = -1;
  ParallelFor(nullptr, 10, [&](std::int64_t begin, std::int64_t end) {
    begin_seen = begin;
    end_seen = end;
  });
  EXPECT_EQ(begin_seen, 0);
  EXPECT_EQ(end_seen, 10);
}

TEST(ThreadPool, DestroysCleanlyWhileIdleOrRightAfterWork) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    if (i % 2 == 0) {
      EXPECT_EQ(PoolSum(pool, 5000), SerialSum(5000));
    }
  }
}

}  // namespace
}  // namespace duet::kernels::cpu
