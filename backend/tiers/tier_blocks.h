// The real KV tiers below an instance's KV region: the bytes of the blocks that the tier
// manager (policies/kv_tiers.h) says a tier holds, named by their chained prefix hash.
//
//   DramTierBlocks   host memory: one page-locked pool of fixed-size slots
//   FileTierBlocks   local SSD: one block file per block under a directory, written and read
//                    through mmap, checksummed, recovered at start
//   RedisTierBlocks  a remote store (redis-server through hiredis), keyed by layout and hash so
//                    that instances and restarts share blocks
//
// The tier manager decides what each tier holds and never exceeds its capacity; these hold the
// bytes and refuse what would break that (a put into a full pool). HostTierStorage
// (tier_storage.h) calls each from its one I/O thread: none is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/tiers/stored_block.h"
#include "common/status.h"
#include "policies/ports.h"

struct redisContext;

namespace duet::backend {

using policies::BlockHash;

// What a tier found at start that a server before this one left: blocks in its SSD directory,
// or in the remote store under this layout.
struct TierRecovery {
  std::vector<BlockHash> blocks;  // valid blocks, kept (the tier manager adopts them)
  std::int64_t partial = 0;       // SSD: writes a crash interrupted, removed
  std::int64_t corrupt = 0;  // SSD: truncated, corrupt or foreign headers, stray files: removed
  std::int64_t over_capacity = 0;  // beyond the configured capacity: removed
  std::string error;               // remote: why the store could not be looked at ("": it was)
};

struct TierBlocksCounters {
  std::int64_t puts = 0, gets = 0, drops = 0;
  std::int64_t put_errors = 0, get_errors = 0;
  // Blocks found missing, corrupt, truncated or foreign when read, and forgotten.
  std::int64_t lost = 0;
};

class TierBlocks {
 public:
  virtual ~TierBlocks() = default;
  virtual policies::TierKind kind() const = 0;
  std::int64_t block_bytes() const { return layout_.block_bytes; }
  const StoredBlockLayout& layout() const { return layout_; }

  // Stores `bytes` (block_bytes of them) as block `hash`. Storing a hash the tier holds already
  // rewrites it. An error leaves no block `hash` behind.
  virtual Status Put(BlockHash hash, std::span<const std::byte> bytes) = 0;
  // Copies block `hash` into `out` (block_bytes). An error (not held, corrupt, unreachable)
  // leaves `out`'s contents unspecified; a corrupt block is discarded and counted.
  virtual Status Get(BlockHash hash, std::span<std::byte> out) = 0;
  // Put and Get of several blocks, which a tier may have in flight together (the SSD tier over
  // io_uring); by default one after another. On an error some blocks may have been stored or
  // copied and others not: the first error is returned once none is in flight.
  virtual Status PutMany(std::span<const BlockHash> hashes,
                         std::span<const std::span<const std::byte>> blocks);
  virtual Status GetMany(std::span<const BlockHash> hashes,
                         std::span<const std::span<std::byte>> out);
  // Forgets block `hash` (no effect if not held).
  virtual void Drop(BlockHash hash) = 0;
  // Blocks held (for a remote store: those this process put and has not dropped).
  virtual std::int64_t held_blocks() const = 0;
  virtual std::int64_t capacity_blocks() const = 0;
  // Held within capacity, and what the tier keeps consistent with itself.
  virtual Status CheckInvariants() const;
  // What it found at start (none for host DRAM, which starts empty).
  const TierRecovery& recovery() const { return recovery_; }

  const TierBlocksCounters& counters() const { return counters_; }

 protected:
  explicit TierBlocks(StoredBlockLayout layout) : layout_(layout) {}
  // Room for a put: a block already held (`held`) is rewritten in place; another needs fewer
  // than capacity_blocks() held. The error is counted as a failed put.
  Status RoomFor(bool held);
  StoredBlockLayout layout_;
  TierBlocksCounters counters_;
  TierRecovery recovery_;
};

// Host DRAM: capacity_blocks slots of block_bytes in one anonymous mapping, locked in memory
// (mlock) when the process may lock that much; otherwise pageable (locked() says which).
class DramTierBlocks final : public TierBlocks {
 public:
  static Result<std::unique_ptr<DramTierBlocks>> Create(StoredBlockLayout layout,
                                                        std::int64_t capacity_blocks);
  ~DramTierBlocks() override;
  policies::TierKind kind() const override { return policies::TierKind::kDram; }
  Status Put(BlockHash hash, std::span<const std::byte> bytes) override;
  Status Get(BlockHash hash, std::span<std::byte> out) override;
  void Drop(BlockHash hash) override;
  std::int64_t held_blocks() const override { return static_cast<std::int64_t>(slots_.size()); }
  std::int64_t capacity_blocks() const override { return capacity_; }
  Status CheckInvariants() const override;
  bool locked() const { return locked_; }
  // The pool (for registration with a device or a network: one region).
  std::span<std::byte> pool() { return {base_, pool_bytes_}; }

 private:
  DramTierBlocks(StoredBlockLayout layout, std::int64_t capacity, std::byte* base,
                 std::size_t pool_bytes, bool locked);
  std::byte* Slot(std::int64_t slot) {
    return base_ + static_cast<std::size_t>(slot) * static_cast<std::size_t>(block_bytes());
  }
  std::int64_t capacity_;
  std::byte* base_;
  std::size_t pool_bytes_;
  bool locked_;
  std::unordered_map<BlockHash, std::int64_t> slots_;  // held block -> its slot
  std::vector<std::int64_t> free_;
};

// How the SSD tier moves its blocks' bytes: through memory mappings (the page cache), or
// O_DIRECT reads and writes submitted together through io_uring (past the page cache, a
// whole I/O's blocks in flight at once).
enum class FileIo { kMmap, kIoUring };

// Local SSD: block `hash` is the file <dir>/<16 hex digits>.kvb, a stored block (stored_block.h).
// A put writes <name>.partial and renames it into place, so a file under its final name was
// written whole; a get reads the file and checks it whole before copying. Both engines write
// the same files, so a directory one wrote the other serves. At most capacity_blocks files: the
// on-disk size is bounded by capacity_blocks * (block_bytes + 64). At start the directory is
// scanned: partial files are removed, and so is every file whose header (or size) is wrong;
// payload checksums are checked at every read.
class FileTierBlocks final : public TierBlocks {
 public:
  // With kIoUring, refused where the kernel has no io_uring or the directory's filesystem no
  // O_DIRECT.
  static Result<std::unique_ptr<FileTierBlocks>> Open(std::filesystem::path dir,
                                                      StoredBlockLayout layout,
                                                      std::int64_t capacity_blocks,
                                                      FileIo io = FileIo::kMmap);
  ~FileTierBlocks() override;
  policies::TierKind kind() const override { return policies::TierKind::kSsd; }
  Status Put(BlockHash hash, std::span<const std::byte> bytes) override;
  Status Get(BlockHash hash, std::span<std::byte> out) override;
  Status PutMany(std::span<const BlockHash> hashes,
                 std::span<const std::span<const std::byte>> blocks) override;
  Status GetMany(std::span<const BlockHash> hashes,
                 std::span<const std::span<std::byte>> out) override;
  void Drop(BlockHash hash) override;
  std::int64_t held_blocks() const override { return static_cast<std::int64_t>(held_.size()); }
  std::int64_t capacity_blocks() const override { return capacity_; }
  Status CheckInvariants() const override;
  std::filesystem::path PathOf(BlockHash hash) const;
  FileIo io() const { return ring_ ? FileIo::kIoUring : FileIo::kMmap; }

 private:
  struct Ring;  // io_uring and its aligned buffers
  FileTierBlocks(std::filesystem::path dir, StoredBlockLayout layout, std::int64_t capacity);
  void Scan();
  Status MapPut(BlockHash hash, std::span<const std::byte> bytes);
  Status MapGet(BlockHash hash, std::span<std::byte> out);
  // A stored block's file is gone or bad: removed, forgotten, counted; the error says why.
  Status Lost(BlockHash hash, const std::string& why);
  std::filesystem::path dir_;
  std::int64_t capacity_;
  std::unordered_set<BlockHash> held_;  // block files this tier wrote or recovered
  std::unique_ptr<Ring> ring_;          // kIoUring
};

struct RedisEndpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
  double connect_timeout_s = 0.5;
  double command_timeout_s = 2.0;
  // After a failed connection, I/Os fail at once for this long before the next attempt.
  double retry_after_s = 0.5;
};

// A remote store: block `hash` is the Redis string duet:kv:<layout fingerprint>:<hash> holding a
// stored block. Synchronous hiredis with connect and command timeouts: an unreachable or slow
// server fails the I/O (the tier manager's caller recomputes), never hangs it; the connection is
// made again on a later I/O. At start the store is scanned for this layout's keys, so that a
// restarted server (or another one that shares the store) serves what was put before it: up to
// the capacity they are held (sorted by hash, as SSD files are), the rest deleted. Their
// contents are checked when read, as every block's are.
class RedisTierBlocks final : public TierBlocks {
 public:
  // Connects and scans; a store that cannot be reached or scanned holds nothing yet
  // (recovery().error says why) and is tried again at the first I/O.
  static std::unique_ptr<RedisTierBlocks> Open(RedisEndpoint endpoint, StoredBlockLayout layout,
                                               std::int64_t capacity_blocks);
  RedisTierBlocks(RedisEndpoint endpoint, StoredBlockLayout layout, std::int64_t capacity_blocks);
  ~RedisTierBlocks() override;
  policies::TierKind kind() const override { return policies::TierKind::kRemote; }
  Status Put(BlockHash hash, std::span<const std::byte> bytes) override;
  Status Get(BlockHash hash, std::span<std::byte> out) override;
  void Drop(BlockHash hash) override;
  std::int64_t held_blocks() const override { return static_cast<std::int64_t>(held_.size()); }
  std::int64_t capacity_blocks() const override { return capacity_; }
  std::string KeyOf(BlockHash hash) const;
  bool connected() const { return context_ != nullptr; }

 private:
  Status Connect();
  void Disconnect();
  Status Scan();
  RedisEndpoint endpoint_;
  std::int64_t capacity_;
  redisContext* context_ = nullptr;
  double next_attempt_s_ = 0;  // steady clock
  std::unordered_set<BlockHash> held_;
};

}  // namespace duet::backend
