// The KV cache tiers below GPU memory and the policy that moves blocks between them: host DRAM
// per node, local SSD per node, and a remote store shared by the cluster (each optional). An
// instance sees its GPU (the block manager), its node's DRAM and SSD, and the remote store.
//
// Placement, per tier, relative to the tier above it (GPU for the first one):
//   write-through: a block is written here as soon as it reaches the tier above (for the first
//                  tier: when its prefill computed it);
//   write-back:    a block is written here when the tier above evicts it.
// Lookups find a prompt's next blocks in the fastest tier holding each; loads pin them until
// read. Every byte moves through the TierStorage port (post, then poll), so offload and
// promotion traffic shares the links and disks that the world below models.
//
// The manager decides and tracks; it reads no clock. In simulation every engine calls it from
// its own actor, one at a time; the live server's engine threads share it (ShareAcrossThreads).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "policies/kv_tier_store.h"
#include "policies/ports.h"
#include "policies/request.h"

namespace duet::policies {

const char* ToString(TierKind kind);  // "dram", "ssd", "remote"

enum class TierPlacement { kWriteThrough, kWriteBack };
// "write-through" or "write-back".
Result<TierPlacement> ParseTierPlacement(const std::string& name);
const char* ToString(TierPlacement placement);

struct TierConfig {
  bool enabled = false;
  Bytes capacity_bytes = 0;  // per node (DRAM, SSD) or for the whole cluster (remote)
  TierPlacement placement = TierPlacement::kWriteThrough;
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // Bandwidth a load from this tier into one GPU gets when alone (for routing estimates).
  BytesPerSecond read_bandwidth = 0;
};

struct TierSetup {
  std::array<TierConfig, kNumLowerTiers> tiers;  // indexed by TierKind
  Bytes block_bytes = 0;                         // one engine block of KV, all TP shards
  std::vector<int> instance_node;                // node of each instance
  int num_nodes = 0;
  // Promote a queued request's prefix blocks found only in the SSD or the remote store into
  // its node's DRAM while it waits, so that its load comes from DRAM.
  bool prefetch_to_dram = true;
  bool any() const { return tiers[0].enabled || tiers[1].enabled || tiers[2].enabled; }
};

// Where the prompt's next blocks (after the GPU hit) are found below the GPU.
struct TierHits {
  std::array<std::int64_t, kNumLowerTiers> blocks{};  // per tier
  std::int64_t total() const { return blocks[0] + blocks[1] + blocks[2]; }
};

struct TierCounters {
  std::int64_t write_blocks = 0;    // writes started
  std::int64_t written_blocks = 0;  // writes finished (became readable)
  std::int64_t dropped_writes = 0;  // no room: full of blocks being written or read
  std::int64_t read_blocks = 0;
  Bytes write_bytes = 0, read_bytes = 0;
  std::int64_t write_ios = 0, read_ios = 0;
  std::int64_t prefetch_blocks = 0;  // DRAM: writes that promoted a queued request's prefix
};

class TierManager {
 public:
  TierManager(TierSetup setup, TierStorage* storage);

  const TierSetup& setup() const { return setup_; }
  bool enabled(TierKind kind) const { return setup_.tiers[static_cast<int>(kind)].enabled; }

  // Finishes the writes that `instance` posted whose I/O completed (their blocks become
  // readable). Each engine calls it before looking anything up.
  void Progress(InstanceId instance);

  // The blocks of `hashes` from `first` on (at most `max_blocks`) that `instance` can load,
  // each from the fastest tier holding it; stops at the first block no tier holds.
  TierHits Lookup(InstanceId instance, std::span<const BlockHash> hashes, std::int64_t first,
                  std::int64_t max_blocks) const;
  // Starts loading those blocks into the instance's GPU: pins them, posts one read per tier.
  // `hits` must be what Lookup returned just now. `gpu_blocks`: the instance's blocks that
  // receive them (one per block of hits, in order; empty where the storage needs none).
  LoadId BeginLoad(InstanceId instance, std::span<const BlockHash> hashes, std::int64_t first,
                   const TierHits& hits, std::span<const KvBlockManager::BlockId> gpu_blocks = {});
  // kDone once every read finished (the blocks are unpinned), kFailed if one failed; the id
  // is released then.
  TransferStatus PollLoad(LoadId id);
  // Whether every read of the load has finished (polling those that had not; their blocks are
  // unpinned), or PollLoad has released it already. Call it from the owner. Keeps the id.
  bool LoadFinished(LoadId id);
  // Estimated seconds to load `hits` into one GPU when the paths are idle.
  Seconds EstimateLoadSeconds(const TierHits& hits) const;

  // `instance` computed these full blocks (write-through from the GPU). `gpu_blocks`: the
  // instance's blocks holding them (one per hash; empty where the storage needs none).
  void OnComputed(InstanceId instance, std::span<const BlockHash> hashes,
                  std::span<const KvBlockManager::BlockId> gpu_blocks = {});
  // `instance`'s GPU cache evicted these blocks (write-back from the GPU), held until now by
  // `gpu_blocks` as OnComputed's.
  void OnGpuEvicted(InstanceId instance, std::span<const BlockHash> hashes,
                    std::span<const KvBlockManager::BlockId> gpu_blocks = {});
  // A request queued on `instance` will need `hashes` from block `first` on: copies those that
  // only the SSD or the remote store holds into the node's DRAM (when prefetch_to_dram).
  // Returns the blocks it started to copy.
  std::int64_t Prefetch(InstanceId instance, std::span<const BlockHash> hashes, std::int64_t first);

  // Writes that `instance` posted (its OnComputed / OnGpuEvicted calls and what they set off)
  // and have not finished. Each posting engine polls its own I/O and stays up until it is done.
  bool HasPendingWrites(InstanceId instance) const;
  // Whether a write still running reads one of `blocks` of `instance`'s GPU blocks (after
  // finishing those that ended, as Progress does). Real storage reads the blocks while the
  // engine runs on: a step that writes into one of them (a block evicted and written back just
  // now, reused) waits until this is false; other steps run on.
  bool ReadingGpu(InstanceId instance, std::span<const KvBlockManager::BlockId> blocks);

  // Blocks that tier `kind` on `node` holds already (what its storage found at start): readable
  // at once, as if written now. Those beyond its room evict as a write would.
  void Adopt(TierKind kind, int node, std::span<const BlockHash> hashes);

  // From now on every public call may come from any thread (the live server's engine threads
  // share one manager, as the simulator's instances do): each takes a lock. The simulator's
  // instances run one at a time and take none.
  void ShareAcrossThreads() { lock_ = std::make_unique<std::mutex>(); }

  // No I/O in flight, no pins, every store consistent and within capacity.
  Status CheckInvariants(bool expect_idle) const;
  bool idle() const { return num_pending_writes_ == 0 && loads_.empty(); }

  const KvTierStore* store(TierKind kind, int node) const;
  TierCounters counters(TierKind kind) const;
  std::int64_t evictions(TierKind kind) const;
  std::int64_t peak_used_blocks(TierKind kind) const;  // the most any one store held

 private:
  struct PendingWrite {
    TierIoId io;
    KvTierStore* store;
    KvTierStore::WriteId write;
    TierKind tier;
    InstanceId owner;
    bool from_gpu;  // reads the owner's GPU blocks
    std::vector<BlockHash> hashes;
    std::vector<KvBlockManager::BlockId> gpu_blocks;  // from_gpu: the blocks it reads
  };
  // Locks the manager for one public call when it is shared across threads.
  class Guard {
   public:
    explicit Guard(std::mutex* m) : m_(m) {
      if (m_) m_->lock();
    }
    ~Guard() {
      if (m_) m_->unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    std::mutex* m_;
  };
  void ProgressLocked(InstanceId instance);
  // The last lookup on each node, with the hashes it read. A router asks for one request's
  // blocks on every candidate instance in turn, mostly from the same first block, and a node's
  // stores change only when a write starts or ends (changes_ counts those).
  struct LastLookup {
    std::uint64_t changes = ~std::uint64_t{0};
    std::int64_t first = -1, end = -1;
    std::vector<BlockHash> read;  // hashes[first, first + read.size())
    TierHits hits;
  };
  struct Load {
    LoadId id;
    struct Part {
      TierIoId io;
      KvTierStore* store;
      std::vector<BlockHash> hashes;
      bool done;
    };
    std::vector<Part> parts;
    bool failed = false;
  };

  KvTierStore* Store(TierKind kind, int node);
  int NodeOf(InstanceId instance) const;
  // Polls the reads of `load` not yet finished; unpins the blocks of those that did.
  void ProgressLoad(Load& load);
  // The enabled tier below `kind` (or the first tier for kind == -1), or -1.
  int Below(int kind) const;
  // Writes `hashes` into tier `kind` on `node` from `source` (an instance's GPU, or the tier
  // `from`), then follows write-through placement downwards and write-back for evictions.
  // `owner` is the engine whose call set this off.
  void Write(int kind, int node, InstanceId instance, int from, std::span<const BlockHash> hashes,
             InstanceId owner, std::span<const KvBlockManager::BlockId> gpu_blocks = {});

  TierSetup setup_;
  TierStorage* storage_;
  // [kind][node]; the remote store is one store at node index 0.
  std::array<std::vector<std::unique_ptr<KvTierStore>>, kNumLowerTiers> stores_;
  std::array<TierCounters, kNumLowerTiers> counters_{};
  std::vector<std::vector<PendingWrite>> pending_writes_;  // by owner instance
  std::size_t num_pending_writes_ = 0;
  std::vector<Load> loads_;
  LoadId next_load_ = 1;
  std::uint64_t changes_ = 0;
  mutable std::vector<LastLookup> last_lookup_;  // by node
  std::unique_ptr<std::mutex> lock_;             // null: one thread at a time
  // Blocks each store forgot after a failed read, until its next write tells the storage.
  std::unordered_map<const KvTierStore*, std::vector<BlockHash>> forgotten_;
};

}  // namespace duet::policies
