// Throughput of one real KV tier (backend/tiers/) through HostTierStorage, as the tier manager
// drives it: BLOCKS blocks of BLOCK_BYTES written from an instance's KV region into the tier,
// PER_IO blocks per I/O posted back to back, then read back into another region. Prints
// "write MB/s read MB/s" (10^6 bytes per second); bench/tier_storage.sh puts each beside its
// yardstick (memcpy, fio, redis-benchmark).
//
// Usage: duet_tier_storage_bench TIER BLOCK_BYTES BLOCKS PER_IO [PHASE] [WHERE]
//   TIER   dram | ssd | ssd-io_uring | remote | memcpy (the yardstick of dram: the same bytes,
//          one memcpy each)
//   PHASE  both (default) | write | read (ssd: a read in a later process, after the page cache
//          was dropped; the tier recovers the files at start)
//   WHERE  ssd: the directory; remote: the redis port on 127.0.0.1
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/tiers/tier_storage.h"

using namespace duet;
using namespace duet::backend;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "duet_tier_storage_bench: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5)
    return Fail("usage: TIER BLOCK_BYTES BLOCKS PER_IO [both|write|read] [DIR or redis PORT]");
  const std::string tier = argv[1];
  const std::int64_t block_bytes = std::atoll(argv[2]);
  const std::int64_t blocks = std::atoll(argv[3]);
  const std::int64_t per_io = std::atoll(argv[4]);
  const std::string phase = argc > 5 ? argv[5] : "both";
  const std::string where = argc > 6 ? argv[6] : "";
  if (block_bytes <= 0 || blocks <= 0 || per_io <= 0) return Fail("sizes must be positive");
  const StoredBlockLayout layout{.fingerprint = 1, .block_bytes = block_bytes};

  // The source and destination KV regions, touched once so that no page fault is timed.
  const auto bytes = static_cast<std::size_t>(block_bytes * blocks);
  std::vector<std::byte> src(bytes), dst(bytes);
  for (std::size_t i = 0; i < bytes; i += 4096) src[i] = static_cast<std::byte>(i >> 12);
  std::memset(dst.data(), 1, bytes);

  if (tier == "memcpy") {
    auto pool = DramTierBlocks::Create(layout, blocks);  // the DRAM tier's own memory
    if (!pool.ok()) return Fail(pool.error());
    std::byte* p = (*pool)->pool().data();
    std::memset(p, 1, bytes);
    double t = Now();
    for (std::int64_t b = 0; b < blocks; ++b)
      std::memcpy(p + b * block_bytes, src.data() + b * block_bytes, block_bytes);
    const double write_s = Now() - t;
    t = Now();
    for (std::int64_t b = 0; b < blocks; ++b)
      std::memcpy(dst.data() + b * block_bytes, p + b * block_bytes, block_bytes);
    const double read_s = Now() - t;
    std::printf("%.0f %.0f\n", static_cast<double>(bytes) / write_s / 1e6,
                static_cast<double>(bytes) / read_s / 1e6);
    return 0;
  }

  HostTierStorage storage;
  policies::TierKind kind;
  if (tier == "dram") {
    kind = policies::TierKind::kDram;
    auto t = DramTierBlocks::Create(layout, blocks);
    if (!t.ok()) return Fail(t.error());
    storage.AddTier(kind, 0, std::move(t.value()));
  } else if (tier == "ssd" || tier == "ssd-io_uring") {
    kind = policies::TierKind::kSsd;
    auto t = FileTierBlocks::Open(where, layout, blocks,
                                  tier == "ssd" ? FileIo::kMmap : FileIo::kIoUring);
    if (!t.ok()) return Fail(t.error());
    storage.AddTier(kind, 0, std::move(t.value()));
  } else if (tier == "remote") {
    kind = policies::TierKind::kRemote;
    RedisEndpoint e;
    e.port = std::atoi(where.c_str());
    storage.AddTier(kind, 0, std::make_unique<RedisTierBlocks>(e, layout, blocks));
  } else {
    return Fail("unknown tier " + tier);
  }
  storage.RegisterInstance(0, KvRegion{src.data(), block_bytes, blocks, nullptr});
  storage.RegisterInstance(1, KvRegion{dst.data(), block_bytes, blocks, nullptr});

  // Runs every I/O of one direction, PER_IO blocks each, posted back to back; seconds.
  auto run = [&](bool read) {
    std::vector<policies::TierIoId> ids;
    const double t = Now();
    for (std::int64_t first = 0; first < blocks; first += per_io) {
      const std::int64_t n = std::min(per_io, blocks - first);
      std::vector<BlockHash> hashes;
      std::vector<policies::KvBlockManager::BlockId> gpu;
      for (std::int64_t b = first; b < first + n; ++b) {
        hashes.push_back(static_cast<BlockHash>(b + 1));
        gpu.push_back(static_cast<policies::KvBlockManager::BlockId>(b));
      }
      policies::TierIo io;
      io.read = read;
      io.tier = kind;
      io.node = 0;
      io.instance = read ? 1 : 0;
      io.blocks = n;
      io.bytes = n * block_bytes;
      io.hashes = hashes;
      io.gpu_blocks = gpu;
      ids.push_back(storage.Post(io));
    }
    storage.Drain();
    const double s = Now() - t;
    for (const auto id : ids)
      if (storage.Poll(id) != policies::TransferStatus::kDone) {
        std::fprintf(stderr, "duet_tier_storage_bench: an I/O failed: %s\n",
                     storage.last_error().c_str());
        std::exit(1);
      }
    return s;
  };
  const double write_s = phase == "read" ? 0 : run(false);
  const double read_s = phase == "write" ? 0 : run(true);
  if (phase != "write" && std::memcmp(src.data(), dst.data(), bytes) != 0)
    return Fail("the blocks read back differ from those written");
  auto rate = [&](double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e6 : 0.0; };
  std::printf("%.0f %.0f\n", rate(write_s), rate(read_s));
  return 0;
}
