// UcxKvTransport's pull throughput (bench/kv_transfer.sh): two transports in one process, the
// source's worker progressed by its own thread, the sink pulling one block of SIZE bytes per
// transfer, ITERS transfers one after another (after WARMUP). Prints "SIZE MiB/s" lines.
// Usage: duet_kv_transfer_bench TLS ITERS WARMUP SIZE...
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "backend/transport/ucx_kv_transport.h"

using namespace duet;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s TLS ITERS WARMUP SIZE...\n", argv[0]);
    return 2;
  }
  const std::string tls = argv[1];
  const int iters = std::atoi(argv[2]), warmup = std::atoi(argv[3]);
  for (int a = 4; a < argc; ++a) {
    const std::int64_t size = std::atoll(argv[a]);
    constexpr std::int64_t kBlocks = 4;
    std::vector<char> src(static_cast<std::size_t>(size * kBlocks), 1);
    std::vector<char> dst(static_cast<std::size_t>(size * kBlocks), 0);
    auto source = backend::UcxKvTransport::Create(0, {src.data(), size, kBlocks}, tls);
    auto sink = backend::UcxKvTransport::Create(1, {dst.data(), size, kBlocks}, tls);
    if (!source.ok() || !sink.ok()) {
      std::fprintf(stderr, "%s\n", (source.ok() ? sink.error() : source.error()).c_str());
      return 1;
    }
    if (Status s = (*sink)->Connect(0, (*source)->Descriptor()); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    std::atomic<bool> stop{false};
    std::thread progress([&] {
      while (!stop.load(std::memory_order_relaxed)) (*source)->Progress();
    });
    double seconds = 0;
    for (int i = 0; i < warmup + iters; ++i) {
      const std::vector<backend::BlockId> from = {static_cast<backend::BlockId>(i % kBlocks)};
      const std::vector<backend::BlockId> to = {static_cast<backend::BlockId>((i + 1) % kBlocks)};
      const auto start = std::chrono::steady_clock::now();
      const policies::TransferId id = (*sink)->Post({1, 0, 1, size, from, to});
      policies::TransferStatus status;
      while ((status = (*sink)->Poll(id)) == policies::TransferStatus::kInProgress) {
      }
      if (status != policies::TransferStatus::kDone) {
        std::fprintf(stderr, "transfer failed: %s\n", (*sink)->records().back().error.c_str());
        stop = true;
        progress.join();
        return 1;
      }
      if (i >= warmup) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    }
    stop = true;
    progress.join();
    std::printf("%lld %.1f\n", static_cast<long long>(size),
                static_cast<double>(size) * iters / seconds / (1 << 20));
  }
  return 0;
}
