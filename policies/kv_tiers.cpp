// KV tiers below GPU memory: placement, lookup, loads and the I/O they post (see kv_tiers.h).
#include "policies/kv_tiers.h"

#include <algorithm>

namespace duet::policies {

const char* ToString(TierKind kind) {
  switch (kind) {
    case TierKind::kDram:
      return "dram";
    case TierKind::kSsd:
      return "ssd";
    case TierKind::kRemote:
      return "remote";
  }
  return "unknown";
}

Result<TierPlacement> ParseTierPlacement(const std::string& name) {
  if (name == "write-through") return TierPlacement::kWriteThrough;
  if (name == "write-back") return TierPlacement::kWriteBack;
  return Status::Error("placement must be 'write-through' or 'write-back', got '" + name + "'");
}

const char* ToString(TierPlacement placement) {
  return placement == TierPlacement::kWriteThrough ? "write-through" : "write-back";
}

namespace {

// Loops over a request's block hashes look each up in stores of up to millions of blocks, a
// cache miss per block. They prefetch ahead.
constexpr std::size_t kAhead = 8;

void PrefetchAhead(const KvTierStore* s, std::span<const BlockHash> hashes, std::size_t i) {
  if (s != nullptr && i + kAhead < hashes.size()) s->Prefetch(hashes[i + kAhead]);
}

}  // namespace

TierManager::TierManager(TierSetup setup, TierStorage* storage)
    : setup_(std::move(setup)), storage_(storage) {
  DUET_CHECK(storage_ != nullptr && setup_.block_bytes > 0);
  for (int k = 0; k < kNumLowerTiers; ++k) {
    const TierConfig& t = setup_.tiers[static_cast<std::size_t>(k)];
    if (!t.enabled) continue;
    const int copies = static_cast<TierKind>(k) == TierKind::kRemote ? 1 : setup_.num_nodes;
    for (int n = 0; n < copies; ++n) {
      stores_[static_cast<std::size_t>(k)].push_back(
          std::make_unique<KvTierStore>(t.capacity_bytes / setup_.block_bytes, t.eviction));
    }
  }
}

KvTierStore* TierManager::Store(TierKind kind, int node) {
  auto& v = stores_[static_cast<std::size_t>(kind)];
  if (v.empty()) return nullptr;
  return kind == TierKind::kRemote ? v[0].get() : v[static_cast<std::size_t>(node)].get();
}

const KvTierStore* TierManager::store(TierKind kind, int node) const {
  return const_cast<TierManager*>(this)->Store(kind, node);
}

int TierManager::NodeOf(InstanceId instance) const {
  return setup_.instance_node.at(static_cast<std::size_t>(instance));
}

int TierManager::Below(int kind) const {
  for (int k = kind + 1; k < kNumLowerTiers; ++k) {
    if (setup_.tiers[static_cast<std::size_t>(k)].enabled) return k;
  }
  return -1;
}

void TierManager::Progress(InstanceId instance) {
  const Guard guard(lock_.get());
  ProgressLocked(instance);
}

void TierManager::ProgressLocked(InstanceId instance) {
  if (static_cast<std::size_t>(instance) >= pending_writes_.size()) return;
  auto& pending = pending_writes_[static_cast<std::size_t>(instance)];
  for (std::size_t i = 0; i < pending.size();) {
    PendingWrite& w = pending[i];
    const TransferStatus status = storage_->Poll(w.io);
    if (status == TransferStatus::kInProgress) {
      ++i;
      continue;
    }
    ++changes_;
    if (status == TransferStatus::kDone) {
      w.store->EndWrite(w.write);
      counters_[static_cast<std::size_t>(w.tier)].written_blocks +=
          static_cast<std::int64_t>(w.hashes.size());
    } else {
      w.store->AbortWrite(w.write, w.hashes);
    }
    // Order does not matter: swap-remove.
    pending[i] = std::move(pending.back());
    pending.pop_back();
    --num_pending_writes_;
  }
}

void TierManager::ProgressLoad(Load& load) {
  for (Load::Part& part : load.parts) {
    if (part.done) continue;
    const TransferStatus s = storage_->Poll(part.io);
    if (s == TransferStatus::kInProgress) continue;
    part.done = true;
    load.failed |= s == TransferStatus::kFailed;
    for (std::size_t k = 0; k < part.hashes.size(); ++k) {
      PrefetchAhead(part.store, part.hashes, k);
      part.store->Unpin(part.hashes[k]);
    }
    // A read that failed found the tier without those blocks (a corrupt or missing file, a
    // store that restarted empty): they are forgotten, so that lookups stop finding them and
    // the next computation of them writes them again. The storage drops what it may still hold
    // of them with the tier's next write.
    if (s == TransferStatus::kFailed) {
      ++changes_;
      std::vector<BlockHash>& forgotten = forgotten_[part.store];
      for (const BlockHash h : part.hashes)
        if (part.store->Discard(h)) forgotten.push_back(h);
    }
  }
}

bool TierManager::LoadFinished(LoadId id) {
  const Guard guard(lock_.get());
  auto it = std::find_if(loads_.begin(), loads_.end(), [&](const Load& l) { return l.id == id; });
  if (it == loads_.end()) return true;  // ids are never reused: released after it finished
  ProgressLoad(*it);
  return std::all_of(it->parts.begin(), it->parts.end(),
                     [](const Load::Part& p) { return p.done; });
}

TierHits TierManager::Lookup(InstanceId instance, std::span<const BlockHash> hashes,
                             std::int64_t first, std::int64_t max_blocks) const {
  const Guard guard(lock_.get());
  TierHits hits;
  if (!setup_.any()) return hits;
  const int node = NodeOf(instance);
  const auto end = std::min<std::int64_t>(static_cast<std::int64_t>(hashes.size()),
                                          first + std::max<std::int64_t>(0, max_blocks));
  if (first < 0 || first >= end) return hits;
  if (static_cast<std::size_t>(node) >= last_lookup_.size()) last_lookup_.resize(node + 1u);
  LastLookup& last = last_lookup_[static_cast<std::size_t>(node)];
  if (last.changes == changes_ && last.first == first && last.end == end &&
      std::equal(last.read.begin(), last.read.end(), hashes.begin() + first))
    return last.hits;
  const KvTierStore* s[kNumLowerTiers];
  for (int k = 0; k < kNumLowerTiers; ++k) s[k] = store(static_cast<TierKind>(k), node);
  for (std::int64_t i = first; i < end; ++i) {
    for (const KvTierStore* t : s) PrefetchAhead(t, hashes, static_cast<std::size_t>(i));
    const BlockHash h = hashes[static_cast<std::size_t>(i)];
    int found = -1;
    for (int k = 0; k < kNumLowerTiers && found < 0; ++k) {
      if (s[k] && s[k]->Contains(h)) found = k;
    }
    if (found < 0) break;
    ++hits.blocks[static_cast<std::size_t>(found)];
  }
  // What decided the result: the hits and the first block no tier holds.
  const std::int64_t read = std::min(end, first + hits.total() + 1) - first;
  last.changes = changes_;
  last.first = first;
  last.end = end;
  last.read.assign(hashes.begin() + first, hashes.begin() + first + read);
  last.hits = hits;
  return hits;
}

LoadId TierManager::BeginLoad(InstanceId instance, std::span<const BlockHash> hashes,
                              std::int64_t first, const TierHits& hits,
                              std::span<const KvBlockManager::BlockId> gpu_blocks) {
  const Guard guard(lock_.get());
  const int node = NodeOf(instance);
  Load load;
  load.id = next_load_++;
  std::array<std::vector<BlockHash>, kNumLowerTiers> per_tier;
  std::array<std::vector<KvBlockManager::BlockId>, kNumLowerTiers> per_tier_gpu;
  const std::int64_t end = first + hits.total();
  DUET_CHECK(end <= static_cast<std::int64_t>(hashes.size()));
  DUET_CHECK(gpu_blocks.empty() || static_cast<std::int64_t>(gpu_blocks.size()) == hits.total());
  for (std::int64_t i = first; i < end; ++i) {
    for (int k = 0; k < kNumLowerTiers; ++k)
      PrefetchAhead(store(static_cast<TierKind>(k), node), hashes, static_cast<std::size_t>(i));
    const BlockHash h = hashes[static_cast<std::size_t>(i)];
    int k = 0;
    for (; k < kNumLowerTiers; ++k) {
      KvTierStore* s = Store(static_cast<TierKind>(k), node);
      if (s && s->PinForRead(h)) {
        per_tier[static_cast<std::size_t>(k)].push_back(h);
        if (!gpu_blocks.empty())
          per_tier_gpu[static_cast<std::size_t>(k)].push_back(
              gpu_blocks[static_cast<std::size_t>(i - first)]);
        break;
      }
    }
    DUET_CHECK_MSG(k < kNumLowerTiers, "BeginLoad of a block that Lookup did not find");
  }
  for (int k = 0; k < kNumLowerTiers; ++k) {
    auto& v = per_tier[static_cast<std::size_t>(k)];
    DUET_CHECK(static_cast<std::int64_t>(v.size()) == hits.blocks[static_cast<std::size_t>(k)]);
    if (v.empty()) continue;
    const auto kind = static_cast<TierKind>(k);
    TierIo io;
    io.read = true;
    io.tier = kind;
    io.node = node;
    io.instance = instance;
    io.blocks = static_cast<std::int64_t>(v.size());
    io.bytes = io.blocks * setup_.block_bytes;
    io.hashes = v;
    io.gpu_blocks = per_tier_gpu[static_cast<std::size_t>(k)];
    TierCounters& c = counters_[static_cast<std::size_t>(k)];
    c.read_blocks += io.blocks;
    c.read_bytes += io.bytes;
    ++c.read_ios;
    load.parts.push_back({storage_->Post(io), Store(kind, node), std::move(v), false});
  }
  const LoadId id = load.id;
  loads_.push_back(std::move(load));
  return id;
}

TransferStatus TierManager::PollLoad(LoadId id) {
  const Guard guard(lock_.get());
  auto it = std::find_if(loads_.begin(), loads_.end(), [&](const Load& l) { return l.id == id; });
  DUET_CHECK(it != loads_.end());
  ProgressLoad(*it);
  if (!std::all_of(it->parts.begin(), it->parts.end(), [](const Load::Part& p) { return p.done; }))
    return TransferStatus::kInProgress;
  const bool failed = it->failed;
  loads_.erase(it);
  return failed ? TransferStatus::kFailed : TransferStatus::kDone;
}

Seconds TierManager::EstimateLoadSeconds(const TierHits& hits) const {
  Seconds s = 0;
  for (int k = 0; k < kNumLowerTiers; ++k) {
    const std::int64_t n = hits.blocks[static_cast<std::size_t>(k)];
    if (n == 0) continue;
    const BytesPerSecond bw = setup_.tiers[static_cast<std::size_t>(k)].read_bandwidth;
    s += bw > 0 ? static_cast<double>(n * setup_.block_bytes) / bw : 0.0;
  }
  return s;
}

void TierManager::Write(int kind, int node, InstanceId instance, int from,
                        std::span<const BlockHash> hashes, InstanceId owner,
                        std::span<const KvBlockManager::BlockId> gpu_blocks) {
  DUET_CHECK(gpu_blocks.empty() || gpu_blocks.size() == hashes.size());
  const auto tier = static_cast<TierKind>(kind);
  KvTierStore* s = Store(tier, node);
  TierCounters& c = counters_[static_cast<std::size_t>(kind)];
  ++changes_;
  // Locals, not members reused across calls: Post may let other engines run before it returns
  // (in simulation it is a simcall, and other actors run meanwhile), and they call Write too.
  std::vector<BlockHash> accepted, evicted;
  const KvTierStore::WriteStart started = s->BeginWrite(hashes, &accepted, &evicted);
  c.dropped_writes += started.no_room;
  const int below = Below(kind);
  auto placement_below = [&] { return setup_.tiers[static_cast<std::size_t>(below)].placement; };
  // Write-back below: what this tier evicted moves down, posted before the write that takes its
  // room (real storage drops the evicted bytes when that write runs, after the I/Os posted
  // before it).
  if (!evicted.empty() && below >= 0 && placement_below() == TierPlacement::kWriteBack)
    Write(below, node, kNoInstance, kind, evicted, owner);
  if (!accepted.empty()) {
    TierIo io;
    io.read = false;
    io.tier = tier;
    io.node = node;
    io.instance = instance;
    io.from = static_cast<TierKind>(std::max(0, from));
    io.blocks = static_cast<std::int64_t>(accepted.size());
    io.bytes = io.blocks * setup_.block_bytes;
    io.hashes = accepted;
    io.evicted = evicted;
    std::vector<BlockHash> dropped;  // evicted, and what failed reads made the tier forget
    if (auto f = forgotten_.find(s); f != forgotten_.end()) {
      dropped = evicted;
      dropped.insert(dropped.end(), f->second.begin(), f->second.end());
      forgotten_.erase(f);
      io.evicted = dropped;
    }
    // The GPU blocks of the accepted hashes: they are `hashes` in order, less those skipped.
    std::vector<KvBlockManager::BlockId> sources;
    if (!gpu_blocks.empty()) {
      sources.reserve(accepted.size());
      for (std::size_t i = 0, j = 0; i < hashes.size() && j < accepted.size(); ++i)
        if (hashes[i] == accepted[j]) sources.push_back(gpu_blocks[i]), ++j;
      DUET_CHECK(sources.size() == accepted.size());
      io.gpu_blocks = sources;
    }
    c.write_blocks += io.blocks;
    c.write_bytes += io.bytes;
    ++c.write_ios;
    const TierIoId id = storage_->Post(io);
    // Write-through below: the same blocks stream on from this tier at once.
    if (below >= 0 && placement_below() == TierPlacement::kWriteThrough)
      Write(below, node, kNoInstance, kind, accepted, owner);
    if (static_cast<std::size_t>(owner) >= pending_writes_.size())
      pending_writes_.resize(static_cast<std::size_t>(owner) + 1);
    pending_writes_[static_cast<std::size_t>(owner)].push_back(
        {id, s, started.id, tier, owner, instance != kNoInstance, std::move(accepted),
         std::move(sources)});
    ++num_pending_writes_;
  }
}

void TierManager::OnComputed(InstanceId instance, std::span<const BlockHash> hashes,
                             std::span<const KvBlockManager::BlockId> gpu_blocks) {
  const Guard guard(lock_.get());
  const int first = Below(-1);
  if (first < 0 || hashes.empty()) return;
  if (setup_.tiers[static_cast<std::size_t>(first)].placement != TierPlacement::kWriteThrough)
    return;
  Write(first, NodeOf(instance), instance, -1, hashes, instance, gpu_blocks);
}

void TierManager::OnGpuEvicted(InstanceId instance, std::span<const BlockHash> hashes,
                               std::span<const KvBlockManager::BlockId> gpu_blocks) {
  const Guard guard(lock_.get());
  const int first = Below(-1);
  if (first < 0 || hashes.empty()) return;
  if (setup_.tiers[static_cast<std::size_t>(first)].placement != TierPlacement::kWriteBack) return;
  Write(first, NodeOf(instance), instance, -1, hashes, instance, gpu_blocks);
}

std::int64_t TierManager::Prefetch(InstanceId instance, std::span<const BlockHash> hashes,
                                   std::int64_t first) {
  const Guard guard(lock_.get());
  if (!setup_.prefetch_to_dram || !enabled(TierKind::kDram)) return 0;
  const int node = NodeOf(instance);
  const KvTierStore* dram = Store(TierKind::kDram, node);
  const KvTierStore* ssd = Store(TierKind::kSsd, node);
  const KvTierStore* remote = Store(TierKind::kRemote, node);
  std::vector<BlockHash> from_ssd, from_remote;
  for (auto i = static_cast<std::size_t>(std::max<std::int64_t>(0, first)); i < hashes.size();
       ++i) {
    for (const KvTierStore* t : {dram, ssd, remote}) PrefetchAhead(t, hashes, i);
    const BlockHash h = hashes[i];
    if (dram->Contains(h)) continue;
    if (ssd && ssd->Contains(h)) {
      from_ssd.push_back(h);
    } else if (remote && remote->Contains(h)) {
      from_remote.push_back(h);
    } else {
      break;  // the prefix ends here
    }
  }
  const std::int64_t before = counters_[0].write_blocks;
  if (!from_ssd.empty())
    Write(0, node, kNoInstance, static_cast<int>(TierKind::kSsd), from_ssd, instance);
  if (!from_remote.empty())
    Write(0, node, kNoInstance, static_cast<int>(TierKind::kRemote), from_remote, instance);
  const std::int64_t started = counters_[0].write_blocks - before;
  counters_[0].prefetch_blocks += started;
  return started;
}

bool TierManager::ReadingGpu(InstanceId instance, std::span<const KvBlockManager::BlockId> blocks) {
  const Guard guard(lock_.get());
  ProgressLocked(instance);
  if (static_cast<std::size_t>(instance) >= pending_writes_.size()) return false;
  for (const PendingWrite& w : pending_writes_[static_cast<std::size_t>(instance)]) {
    if (!w.from_gpu) continue;
    for (const KvBlockManager::BlockId b : w.gpu_blocks)
      if (std::find(blocks.begin(), blocks.end(), b) != blocks.end()) return true;
  }
  return false;
}

void TierManager::Adopt(TierKind kind, int node, std::span<const BlockHash> hashes) {
  const Guard guard(lock_.get());
  KvTierStore* s = Store(kind, node);
  DUET_CHECK(s != nullptr);
  // One at a time, each readable before the next: the last ones stay if not all fit.
  std::vector<BlockHash> started, evicted;
  for (const BlockHash& h : hashes) {
    const KvTierStore::WriteStart w = s->BeginWrite(std::span(&h, 1), &started, &evicted);
    if (w.id != 0) s->EndWrite(w.id);
  }
  // What did not fit goes from the storage with the tier's next write.
  std::vector<BlockHash>& forgotten = forgotten_[s];
  forgotten.insert(forgotten.end(), evicted.begin(), evicted.end());
  ++changes_;
}

TierCounters TierManager::counters(TierKind kind) const {
  const Guard guard(lock_.get());
  return counters_[static_cast<int>(kind)];
}

bool TierManager::HasPendingWrites(InstanceId instance) const {
  const Guard guard(lock_.get());
  return static_cast<std::size_t>(instance) < pending_writes_.size() &&
         !pending_writes_[static_cast<std::size_t>(instance)].empty();
}

std::int64_t TierManager::evictions(TierKind kind) const {
  const Guard guard(lock_.get());
  std::int64_t n = 0;
  for (const auto& s : stores_[static_cast<std::size_t>(kind)]) n += s->evictions();
  return n;
}

std::int64_t TierManager::peak_used_blocks(TierKind kind) const {
  const Guard guard(lock_.get());
  std::int64_t n = 0;
  for (const auto& s : stores_[static_cast<std::size_t>(kind)])
    n = std::max(n, s->peak_used_blocks());
  return n;
}

Status TierManager::CheckInvariants(bool expect_idle) const {
  const Guard guard(lock_.get());
  for (int k = 0; k < kNumLowerTiers; ++k) {
    for (std::size_t n = 0; n < stores_[static_cast<std::size_t>(k)].size(); ++n) {
      const KvTierStore& s = *stores_[static_cast<std::size_t>(k)][n];
      const std::string where =
          std::string(ToString(static_cast<TierKind>(k))) + " tier of node " + std::to_string(n);
      if (Status st = s.CheckInvariants(); !st.ok())
        return Status::Error(where + ": " + st.message());
      if (expect_idle && (s.writing_blocks() != 0 || s.pinned_blocks() != 0))
        return Status::Error(where + ": " + std::to_string(s.writing_blocks()) +
                             " blocks still being written and " +
                             std::to_string(s.pinned_blocks()) + " still pinned at the end");
    }
  }
  if (expect_idle && !idle())
    return Status::Error(std::to_string(num_pending_writes_) + " tier writes and " +
                         std::to_string(loads_.size()) + " loads still in flight at the end");
  return Status::Ok();
}

}  // namespace duet::policies
