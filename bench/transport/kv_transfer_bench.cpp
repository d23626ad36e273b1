// KV pull throughput (bench/kv_transfer.sh), one block of SIZE bytes per transfer, ITERS
// transfers one after another (after WARMUP).
// The source region is in memory UCX allocated (KvTransportAllocator), the destination on the
// heap, as `duet worker` and PD `duet serve` place a prefill and a decode instance's KV; each
// side has --blocks blocks (default 1, ucx_perftest's footprint). Two arrangements:
//   same-process: two UcxKvTransports in one process, the source's worker progressed by a thread
//     spinning on it;
//   two processes, as `duet worker` runs them: `source` (a prefill worker's WorkerKvTransport,
//     progressed by its thread asleep on the UCX wake-up descriptor) writes a "SIZE DESCRIPTOR"
//     line per size to DESCRIPTORS and serves until killed; `sink` (a decode worker's)
//     connects to those of its sizes and pulls.
// Prints "SIZE MiB/s" lines (same-process and sink).
// Usage: duet_kv_transfer_bench [--blocks N] TLS ITERS WARMUP SIZE...
//        duet_kv_transfer_bench [--blocks N] source TLS DESCRIPTORS SIZE...
//        duet_kv_transfer_bench [--blocks N] sink TLS DESCRIPTORS ITERS WARMUP SIZE...
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/transport/local_kv_transports.h"
#include "backend/transport/ucx_kv_transport.h"

using namespace duet;

namespace {

// Blocks per side (--blocks): 1 is ucx_perftest's footprint (one buffer a side); more cycle
// through more memory, as a KV cache does.
std::int64_t kBlocks = 1;

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Pulls block i % kBlocks into block (i + 1) % kBlocks, WARMUP then ITERS times, each polled
// until done before the next is posted; MiB/s over the ITERS (the time from the warm-up's end
// to the last one's, not a sum of per-transfer times: no clock read per transfer), or a
// negative number when a transfer failed.
double Pull(policies::KvTransport& sink, std::int64_t size, int iters, int warmup) {
  std::vector<backend::BlockId> from(1), to(1);
  std::chrono::steady_clock::time_point start;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) start = std::chrono::steady_clock::now();
    from[0] = static_cast<backend::BlockId>(i % kBlocks);
    to[0] = static_cast<backend::BlockId>((i + 1) % kBlocks);
    const policies::TransferId id = sink.Post({1, 0, 1, size, from, to});
    policies::TransferStatus status;
    while ((status = sink.Poll(id)) == policies::TransferStatus::kInProgress) {
    }
    if (status != policies::TransferStatus::kDone) return -1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(size) * iters / seconds / (1 << 20);
}

backend::KvTransportOptions Ucx(const std::string& tls) { return {"ucx", tls, {}}; }

// A source region of kBlocks blocks of `size` bytes in memory UCX allocated, filled with ones.
struct SourceRegion {
  std::unique_ptr<backend::KvMemory> memory;
  backend::KvRegion region;
  static Result<SourceRegion> Allocate(const std::string& tls, std::int64_t size) {
    auto memory = backend::KvTransportAllocator(Ucx(tls))(size * kBlocks);
    if (!memory.ok()) return memory.status();
    SourceRegion r;
    r.memory = std::move(*memory);
    std::memset(r.memory->data(), 1, static_cast<std::size_t>(size * kBlocks));
    r.region = {r.memory->data(), size, kBlocks, r.memory.get()};
    return r;
  }
};

// A destination region of kBlocks blocks of `size` bytes where a decode instance keeps its KV
// (the model's own heap memory), cleared.
std::unique_ptr<backend::KvMemory> Destination(std::int64_t size) {
  auto memory = backend::AllocateHeapKvMemory(size * kBlocks);
  std::memset(memory->data(), 0, static_cast<std::size_t>(size * kBlocks));
  return memory;
}

int SameProcess(const std::string& tls, int iters, int warmup, std::vector<std::int64_t> sizes) {
  for (const std::int64_t size : sizes) {
    auto src = SourceRegion::Allocate(tls, size);
    if (!src.ok()) {
      std::fprintf(stderr, "%s\n", src.error().c_str());
      return 1;
    }
    const auto dst = Destination(size);
    auto source = backend::UcxKvTransport::Create(0, src->region, tls);
    auto sink = backend::UcxKvTransport::Create(1, {dst->data(), size, kBlocks}, tls);
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
    const double rate = Pull(**sink, size, iters, warmup);
    stop = true;
    progress.join();
    if (rate < 0) {
      std::fprintf(stderr, "transfer failed: %s\n", (*sink)->records().back().error.c_str());
      return 1;
    }
    std::printf("%lld %.1f\n", static_cast<long long>(size), rate);
  }
  return 0;
}

int Source(const std::string& tls, const std::string& path, std::vector<std::int64_t> sizes) {
  std::vector<SourceRegion> regions;
  std::vector<std::unique_ptr<backend::WorkerKvTransport>> sources;
  std::ofstream out(path + ".tmp");
  for (const std::int64_t size : sizes) {
    auto region = SourceRegion::Allocate(tls, size);
    if (!region.ok()) {
      std::fprintf(stderr, "%s\n", region.error().c_str());
      return 1;
    }
    regions.push_back(std::move(*region));
    auto t = backend::WorkerKvTransport::Create(policies::InstanceRole::kPrefill,
                                                regions.back().region, Ucx(tls));
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.error().c_str());
      return 1;
    }
    (*t)->SetSelf(0);
    out << size << " " << Hex((*t)->descriptor()) << "\n";
    sources.push_back(std::move(*t));
  }
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());  // the sink sees all of it or nothing
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // served until killed
}

int Sink(const std::string& tls, const std::string& path, int iters, int warmup,
         std::vector<std::int64_t> sizes) {
  for (const std::int64_t size : sizes) {
    std::ifstream in(path);
    std::int64_t served = 0;
    std::string line;
    while (in >> served >> line && served != size) {
    }
    if (served != size) {
      std::fprintf(stderr, "%s: no descriptor for %lld bytes\n", path.c_str(),
                   static_cast<long long>(size));
      return 1;
    }
    const auto dst = Destination(size);
    auto sink = backend::WorkerKvTransport::Create(
        policies::InstanceRole::kDecode, backend::KvRegion{dst->data(), size, kBlocks}, Ucx(tls));
    if (!sink.ok()) {
      std::fprintf(stderr, "%s\n", sink.error().c_str());
      return 1;
    }
    (*sink)->SetSelf(1);
    (*sink)->SetPeer(0, Unhex(line));
    const double rate = Pull(**sink, size, iters, warmup);
    if (rate < 0) {
      std::fprintf(stderr, "transfer failed: %s\n", (*sink)->log()->records().back().error.c_str());
      return 1;
    }
    std::printf("%lld %.1f\n", static_cast<long long>(size), rate);
  }
  return 0;
}

std::vector<std::int64_t> Sizes(int argc, char** argv, int first) {
  std::vector<std::int64_t> sizes;
  for (int a = first; a < argc; ++a) sizes.push_back(std::atoll(argv[a]));
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "--blocks") {
    kBlocks = std::atoll(argv[2]);
    if (kBlocks < 1) {
      std::fprintf(stderr, "--blocks must be at least 1\n");
      return 2;
    }
    argc -= 2;
    argv += 2;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "source" && argc >= 5) return Source(argv[2], argv[3], Sizes(argc, argv, 4));
  if (mode == "sink" && argc >= 7)
    return Sink(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), Sizes(argc, argv, 6));
  if (mode != "source" && mode != "sink" && argc >= 5)
    return SameProcess(argv[1], std::atoi(argv[2]), std::atoi(argv[3]), Sizes(argc, argv, 4));
  std::fprintf(stderr,
               "usage: %s [--blocks N] TLS ITERS WARMUP SIZE...\n"
               "       %s [--blocks N] source TLS DESCRIPTORS SIZE...\n"
               "       %s [--blocks N] sink TLS DESCRIPTORS ITERS WARMUP SIZE...\n",
               argv[0], argv[0], argv[0]);
  return 2;
}
