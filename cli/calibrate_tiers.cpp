// `duet calibrate --tiers` (see calibrate_tiers.h).
#include "cli/calibrate_tiers.h"

#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "backend/calibrate/step_sweep.h"
#include "backend/tiers/tier_storage.h"
#include "common/progress.h"
#include "models/step_fit.h"

namespace duet::cli {
namespace {

namespace fs = std::filesystem;
using policies::BlockHash;
using policies::TierKind;

constexpr std::int64_t kMostBytes = std::int64_t{256} << 20;
// The largest I/O timed is at least this: a tier's time per byte must show above the I/O
// thread's hand-over (tens of microseconds) for a bandwidth to be fitted, which a context of
// small blocks (the test model's 8 KiB) does not give.
constexpr std::int64_t kLeastLargestBytes = std::int64_t{4} << 20;

// A directory removed with what is in it when this goes.
struct ScratchDir {
  fs::path path;
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// What the tier moves the blocks through, for the profile's link `path`.
std::string Describe(TierKind kind, const deploy::TierSpec& spec, const fs::path& ssd_dir) {
  switch (kind) {
    case TierKind::kDram:
      return "host DRAM pool";
    case TierKind::kSsd:
      return "block files under " + ssd_dir.parent_path().string() + " (mmap)";
    case TierKind::kRemote:
      return "redis at " + spec.host + ":" + std::to_string(spec.port);
  }
  return "";
}

// Times one tier: a ring of `slots` blocks of the "GPU" region written into the tier once
// (untimed, filling it), then per pass and size the tier's oldest blocks read back into the
// region and as many new ones written, each I/O from Post to the poll that sees it done. A
// read finds what it reads out of the CPU's caches (written `slots` blocks before), as a prefix
// that comes back from a tier does.
Result<std::pair<models::LinkFit, models::LinkFit>> TimeTier(
    backend::HostTierStorage& storage, TierKind kind, std::int64_t block_bytes, std::int64_t slots,
    std::int64_t max_blocks, int repeats, bool progress) {
  const std::string name = policies::ToString(kind);
  std::deque<BlockHash> held;  // oldest first
  BlockHash next_hash = 1;
  std::int64_t next_slot = 0;  // the region's block the next write reads
  std::vector<policies::KvBlockManager::BlockId> gpu_blocks;
  // Posts `io` (its spans filled in by the caller) and waits for it, asleep (a poll loop would
  // take a core from the I/O thread it waits for); its time.
  auto run = [&](const policies::TierIo& io) -> Result<Seconds> {
    const auto start = std::chrono::steady_clock::now();
    const policies::TierIoId id = storage.Post(io);
    storage.Drain();
    const Seconds took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (storage.Poll(id) != policies::TransferStatus::kDone)
      return Status::Error("--tiers: a " + name + " I/O of " + std::to_string(io.bytes) +
                           " bytes failed: " + storage.last_error());
    return took;
  };
  auto slots_for = [&](std::int64_t count) {
    gpu_blocks.resize(static_cast<std::size_t>(count));
    for (auto& b : gpu_blocks) {
      b = next_slot;
      next_slot = (next_slot + 1) % slots;
    }
    return std::span<const policies::KvBlockManager::BlockId>(gpu_blocks);
  };
  // An I/O of `hashes` between the tier and the region's next blocks.
  auto io_of = [&](bool read, std::span<const BlockHash> hashes,
                   std::span<const BlockHash> evicted) {
    const auto count = static_cast<std::int64_t>(hashes.size());
    return policies::TierIo{.read = read,
                            .tier = kind,
                            .node = 0,
                            .instance = 0,
                            .blocks = count,
                            .bytes = count * block_bytes,
                            .hashes = hashes,
                            .gpu_blocks = slots_for(count),
                            .evicted = evicted};
  };
  // Writes `count` new blocks, evicting the oldest where the tier is full.
  auto write = [&](std::int64_t count) -> Result<Seconds> {
    std::vector<BlockHash> hashes(static_cast<std::size_t>(count)), evicted;
    for (BlockHash& h : hashes) h = next_hash++;
    while (static_cast<std::int64_t>(held.size() + hashes.size()) > slots) {
      evicted.push_back(held.front());
      held.pop_front();
    }
    auto t = run(io_of(false, hashes, evicted));
    held.insert(held.end(), hashes.begin(), hashes.end());
    return t;
  };
  // Reads the `count` oldest blocks back.
  auto read = [&](std::int64_t count) -> Result<Seconds> {
    const std::vector<BlockHash> hashes(held.begin(), held.begin() + count);
    return run(io_of(true, hashes, {}));
  };

  for (std::int64_t filled = 0; filled < slots; filled += max_blocks)
    if (auto t = write(std::min(max_blocks, slots - filled)); !t) return t.status();
  const std::vector<std::int64_t> counts = backend::TransferBlockCounts(max_blocks);
  std::vector<models::TransferMeasurement> reads(counts.size()), writes(counts.size());
  for (int pass = 0; pass < repeats; ++pass) {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      reads[i].bytes = writes[i].bytes = counts[i] * block_bytes;
      auto r = read(counts[i]);
      if (!r) return r.status();
      reads[i].seconds.push_back(*r);
      auto w = write(counts[i]);
      if (!w) return w.status();
      writes[i].seconds.push_back(*w);
      if (progress)
        DrawProgress(
            static_cast<std::size_t>(pass) * counts.size() + i + 1,
            counts.size() * static_cast<std::size_t>(repeats),
            name + " tier: pass " + std::to_string(pass + 1) + "/" + std::to_string(repeats));
    }
  }
  storage.Drain();
  // What it wrote goes: the remote store and the SSD directory are not the calibration's.
  if (backend::TierBlocks* blocks = storage.blocks(kind, 0))
    for (BlockHash h : held) blocks->Drop(h);
  auto read_fit = models::FitLink(std::move(reads));
  if (!read_fit) return Status::Error("--tiers: " + name + " reads: " + read_fit.error());
  auto write_fit = models::FitLink(std::move(writes));
  if (!write_fit) return Status::Error("--tiers: " + name + " writes: " + write_fit.error());
  read_fit->transport = deploy::TierLinkName(kind, true);
  write_fit->transport = deploy::TierLinkName(kind, false);
  return std::pair{std::move(*read_fit), std::move(*write_fit)};
}

}  // namespace

Result<std::vector<models::LinkFit>> TimeTiers(const deploy::TiersSpec& tiers,
                                               std::int64_t block_bytes, std::int64_t max_blocks,
                                               int repeats, bool progress) {
  std::vector<models::LinkFit> out;
  max_blocks = std::max(max_blocks, (kLeastLargestBytes + block_bytes - 1) / block_bytes);
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<TierKind>(k);
    const deploy::TierSpec& spec = tiers[kind];
    if (!spec.enabled) continue;
    // One tier at a time, of at most kMostBytes, holding blocks of a layout no server uses.
    const std::int64_t slots = std::min(spec.capacity_bytes, kMostBytes) / block_bytes;
    if (slots < 2 * max_blocks)
      return Status::Error("--tiers: the " + std::string(policies::ToString(kind)) +
                           " tier holds " + std::to_string(slots) + " blocks of " +
                           std::to_string(block_bytes) + " bytes, fewer than the " +
                           std::to_string(2 * max_blocks) +
                           " its timing needs (lower --max-context, or give it at least " +
                           std::to_string(2 * kLeastLargestBytes >> 20) + " MiB)");
    deploy::TiersSpec one;
    deploy::TierSpec& only = kind == TierKind::kDram  ? one.dram
                             : kind == TierKind::kSsd ? one.ssd
                                                      : one.remote;
    only = spec;
    only.capacity_bytes = slots * block_bytes;
    ScratchDir scratch;
    if (kind == TierKind::kSsd) {
      const fs::path under =
          spec.directory.empty() ? fs::temp_directory_path() : fs::path(spec.directory);
      scratch.path = under / ("duet-calibrate-" + std::to_string(::getpid()));
      only.directory = scratch.path.string();
    }
    const backend::StoredBlockLayout layout{
        .fingerprint = backend::LayoutFingerprint("duet calibrate --tiers"),
        .block_bytes = block_bytes};
    auto storage = backend::MakeHostTierStorage(one, layout, scratch.path);
    if (!storage) return Status::Error("--tiers: " + storage.error());
    std::vector<std::byte> region(static_cast<std::size_t>(slots * block_bytes));
    std::iota(reinterpret_cast<unsigned char*>(region.data()),
              reinterpret_cast<unsigned char*>(region.data() + region.size()),
              static_cast<unsigned char>(0));
    (*storage)->RegisterInstance(0, {region.data(), block_bytes, slots, nullptr});
    // Blocks of this layout a calibration that did not finish left in the store: not this
    // one's to count, gone.
    if (backend::TierBlocks* blocks = (*storage)->blocks(kind, 0))
      for (const policies::BlockHash h : std::vector(blocks->recovery().blocks)) blocks->Drop(h);
    auto fits = TimeTier(**storage, kind, block_bytes, slots, max_blocks, repeats, progress);
    if (!fits) return fits.status();
    fits->first.path = fits->second.path = Describe(kind, spec, scratch.path);
    out.push_back(std::move(fits->first));
    out.push_back(std::move(fits->second));
  }
  return out;
}

}  // namespace duet::cli
