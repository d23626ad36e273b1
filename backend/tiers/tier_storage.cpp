#include "backend/tiers/tier_storage.h"

#include <chrono>

#include "common/status.h"
#include "policies/kv_tiers.h"

namespace duet::backend {

using policies::TierIo;
using policies::TierIoId;
using policies::TransferStatus;

HostTierStorage::HostTierStorage() : thread_([this] { Loop(); }) {}

HostTierStorage::~HostTierStorage() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HostTierStorage::RegisterInstance(policies::InstanceId instance, KvRegion region) {
  std::lock_guard lock(mu_);
  regions_[instance] = region;
}

void HostTierStorage::AddTier(policies::TierKind kind, int node,
                              std::unique_ptr<TierBlocks> blocks) {
  DUET_CHECK(blocks && blocks->kind() == kind);
  std::lock_guard lock(mu_);
  DUET_CHECK_MSG(
      staging_.empty() || staging_.size() == static_cast<std::size_t>(blocks->block_bytes()),
      "every tier of one storage holds blocks of one size");
  staging_.resize(static_cast<std::size_t>(blocks->block_bytes()));
  tiers_[{static_cast<int>(kind), node}] = std::move(blocks);
}

TierBlocks* HostTierStorage::blocks(policies::TierKind kind, int node) {
  const auto it = tiers_.find({static_cast<int>(kind), node});
  return it == tiers_.end() ? nullptr : it->second.get();
}

TierIoId HostTierStorage::Post(const TierIo& io) {
  Job job;
  job.hashes.assign(io.hashes.begin(), io.hashes.end());
  job.evicted.assign(io.evicted.begin(), io.evicted.end());
  job.gpu_blocks.assign(io.gpu_blocks.begin(), io.gpu_blocks.end());
  job.io = io;
  job.io.hashes = job.io.evicted = {};  // valid during Post only: the job's copies stand in
  job.io.gpu_blocks = {};
  std::lock_guard lock(mu_);
  job.id = next_++;
  const TierIoId id = job.id;
  queue_.push_back(std::move(job));
  wake_.notify_one();
  return id;
}

TransferStatus HostTierStorage::Poll(TierIoId id) {
  std::lock_guard lock(mu_);
  const auto it = finished_.find(id);
  if (it == finished_.end()) return TransferStatus::kInProgress;
  const TransferStatus s = it->second;
  finished_.erase(it);
  return s;
}

void HostTierStorage::Drain() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !running_job_; });
}

std::string HostTierStorage::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

TierIoCounters HostTierStorage::counters(policies::TierKind kind) const {
  std::lock_guard lock(mu_);
  return counters_[static_cast<std::size_t>(kind)];
}

Status HostTierStorage::CheckInvariants() const {
  std::lock_guard lock(mu_);
  for (const auto& [where, blocks] : tiers_)
    if (Status s = blocks->CheckInvariants(); !s.ok()) return s;
  return Status::Ok();
}

void HostTierStorage::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything posted has run
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_job_ = true;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    const Status s = Run(job);
    const double busy =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    running_job_ = false;
    TierIoCounters& c = counters_[static_cast<std::size_t>(job.io.tier)];
    ++c.ios;
    c.busy_s += busy;
    if (s.ok()) {
      (job.io.read ? c.read_blocks : c.written_blocks) +=
          static_cast<std::int64_t>(job.hashes.size());
      (job.io.read ? c.read_bytes : c.written_bytes) += job.io.bytes;
    } else {
      ++c.failed_ios;
      last_error_ = s.message();
    }
    finished_[job.id] = s.ok() ? TransferStatus::kDone : TransferStatus::kFailed;
    if (queue_.empty()) idle_.notify_all();
  }
}

std::span<std::byte> HostTierStorage::GpuBlock(policies::InstanceId instance,
                                               policies::KvBlockManager::BlockId b) {
  const auto it = regions_.find(instance);
  if (it == regions_.end() || b < 0 || b >= it->second.num_blocks) return {};
  const KvRegion& r = it->second;
  return {static_cast<std::byte*>(r.base) +
              static_cast<std::size_t>(b) * static_cast<std::size_t>(r.block_bytes),
          static_cast<std::size_t>(r.block_bytes)};
}

Status HostTierStorage::Run(const Job& job) {
  const TierIo& io = job.io;
  const std::string what =
      std::string(io.read ? "read from " : "write into ") + policies::ToString(io.tier) + " tier";
  // The remote store belongs to no node: one store, registered at node 0.
  TierBlocks* tier = blocks(io.tier, io.tier == policies::TierKind::kRemote ? 0 : io.node);
  if (!tier) return Status::Error(what + ": no such tier on node " + std::to_string(io.node));
  if (static_cast<std::int64_t>(job.hashes.size()) != io.blocks)
    return Status::Error(what + ": " + std::to_string(job.hashes.size()) + " hashes for " +
                         std::to_string(io.blocks) + " blocks");
  const bool gpu_side = io.read || io.instance != policies::kNoInstance;
  if (gpu_side && job.gpu_blocks.size() != job.hashes.size())
    return Status::Error(what + ": " + std::to_string(job.gpu_blocks.size()) + " GPU blocks for " +
                         std::to_string(job.hashes.size()) + " hashes");
  TierBlocks* source = nullptr;
  if (!gpu_side) {
    source = blocks(io.from, io.from == policies::TierKind::kRemote ? 0 : io.node);
    if (!source) return Status::Error(what + ": no source tier " + policies::ToString(io.from));
  }
  // The instance's blocks an I/O to or from the GPU side names, all of them (a tier may have
  // them in flight together).
  std::vector<std::span<std::byte>> gpu;
  if (gpu_side) {
    for (const auto b : job.gpu_blocks) {
      gpu.push_back(GpuBlock(io.instance, b));
      if (gpu.back().empty())
        return Status::Error(what + ": instance " + std::to_string(io.instance) + " has no block " +
                             std::to_string(b));
    }
  }
  if (io.read) return tier->GetMany(job.hashes, gpu);
  // A write: the evicted blocks' room first (every I/O posted before this one has run).
  for (const BlockHash h : job.evicted) tier->Drop(h);
  Status s = Status::Ok();
  if (gpu_side) {
    const std::vector<std::span<const std::byte>> blocks(gpu.begin(), gpu.end());
    s = tier->PutMany(job.hashes, blocks);
  } else {
    for (std::size_t i = 0; i < job.hashes.size() && s.ok(); ++i) {
      s = source->Get(job.hashes[i], staging_);
      if (s.ok()) s = tier->Put(job.hashes[i], staging_);
    }
  }
  if (!s.ok())
    for (const BlockHash h : job.hashes) tier->Drop(h);
  return s;
}

Result<std::unique_ptr<HostTierStorage>> MakeHostTierStorage(
    const deploy::TiersSpec& tiers, StoredBlockLayout layout,
    const std::filesystem::path& default_ssd_dir) {
  auto storage = std::make_unique<HostTierStorage>();
  auto blocks_of = [&](const deploy::TierSpec& t) { return t.capacity_bytes / layout.block_bytes; };
  if (tiers.dram.enabled) {
    auto dram = DramTierBlocks::Create(layout, blocks_of(tiers.dram));
    if (!dram) return Status::Error("tiers.dram: " + dram.error());
    storage->AddTier(policies::TierKind::kDram, 0, std::move(dram.value()));
  }
  if (tiers.ssd.enabled) {
    const std::filesystem::path dir =
        tiers.ssd.directory.empty() ? default_ssd_dir : std::filesystem::path(tiers.ssd.directory);
    auto ssd = FileTierBlocks::Open(dir, layout, blocks_of(tiers.ssd),
                                    tiers.ssd.io_uring ? FileIo::kIoUring : FileIo::kMmap);
    if (!ssd) return Status::Error("tiers.ssd: " + ssd.error());
    storage->AddTier(policies::TierKind::kSsd, 0, std::move(ssd.value()));
  }
  if (tiers.remote.enabled) {
    RedisEndpoint endpoint;
    endpoint.host = tiers.remote.host;
    endpoint.port = tiers.remote.port;
    storage->AddTier(policies::TierKind::kRemote, 0,
                     RedisTierBlocks::Open(endpoint, layout, blocks_of(tiers.remote)));
  }
  return storage;
}

}  // namespace duet::backend
