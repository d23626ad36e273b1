#include "backend/tiers/tier_blocks.h"

#include "policies/kv_tiers.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace duet::backend {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Status CheckSize(const TierBlocks& t, std::size_t size) {
  if (size == static_cast<std::size_t>(t.block_bytes())) return Status::Ok();
  return Status::Error("a block of " + std::to_string(size) + " bytes, the tier's are " +
                       std::to_string(t.block_bytes()));
}

// An open file descriptor, closed on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// A mapping of a whole file, unmapped on every path out.
class Mapping {
 public:
  Mapping(int fd, std::size_t size, bool write)
      : size_(size),
        base_(::mmap(nullptr, size, write ? PROT_READ | PROT_WRITE : PROT_READ,
                     write ? MAP_SHARED : MAP_PRIVATE, fd, 0)) {}
  ~Mapping() {
    if (base_ != MAP_FAILED) ::munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  bool ok() const { return base_ != MAP_FAILED; }
  std::span<std::byte> bytes() { return {static_cast<std::byte*>(base_), size_}; }

 private:
  std::size_t size_;
  void* base_;
};

constexpr const char* kBlockSuffix = ".kvb";
constexpr const char* kPartialSuffix = ".partial";

// The hash a block file's name gives (16 lowercase hex digits then .kvb), or nothing.
std::optional<BlockHash> HashOfName(const std::string& name) {
  if (!name.ends_with(kBlockSuffix)) return {};
  return ParseHashHex(std::string_view(name).substr(0, name.size() - std::strlen(kBlockSuffix)));
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes every byte of `iov` to a blocking socket (its send timeout bounds each write).
Status WriteAll(int fd, std::span<iovec> iov) {
  while (!iov.empty()) {
    const ssize_t n = ::writev(fd, iov.data(), static_cast<int>(iov.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error(errno == EAGAIN || errno == EWOULDBLOCK ? "timed out"
                                                                   : std::strerror(errno));
    }
    auto left = static_cast<std::size_t>(n);
    while (!iov.empty() && left >= iov.front().iov_len) {
      left -= iov.front().iov_len;
      iov = iov.subspan(1);
    }
    if (!iov.empty()) {
      iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + left;
      iov.front().iov_len -= left;
    }
  }
  return Status::Ok();
}

timeval ToTimeval(double s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

}  // namespace

Status TierBlocks::CheckInvariants() const {
  if (held_blocks() > capacity_blocks())
    return Status::Error(std::string(policies::ToString(kind())) + " tier holds " +
                         std::to_string(held_blocks()) + " blocks, capacity " +
                         std::to_string(capacity_blocks()));
  return Status::Ok();
}

Status TierBlocks::RoomFor(bool held) {
  if (held || held_blocks() < capacity_blocks()) return Status::Ok();
  ++counters_.put_errors;
  return Status::Error(std::string(policies::ToString(kind())) +
                       " tier full: " + std::to_string(capacity_blocks()) + " blocks held");
}

Status TierBlocks::PutMany(std::span<const BlockHash> hashes,
                           std::span<const std::span<const std::byte>> blocks) {
  if (hashes.size() != blocks.size()) return Status::Error("PutMany: hashes and blocks differ");
  for (std::size_t i = 0; i < hashes.size(); ++i)
    if (Status s = Put(hashes[i], blocks[i]); !s.ok()) return s;
  return Status::Ok();
}

Status TierBlocks::GetMany(std::span<const BlockHash> hashes,
                           std::span<const std::span<std::byte>> out) {
  if (hashes.size() != out.size()) return Status::Error("GetMany: hashes and blocks differ");
  for (std::size_t i = 0; i < hashes.size(); ++i)
    if (Status s = Get(hashes[i], out[i]); !s.ok()) return s;
  return Status::Ok();
}

// ---- DRAM ----

Result<std::unique_ptr<DramTierBlocks>> DramTierBlocks::Create(StoredBlockLayout layout,
                                                               std::int64_t capacity_blocks) {
  if (layout.block_bytes <= 0 || capacity_blocks <= 0)
    return Status::Error("DRAM tier: block bytes and capacity must be positive");
  const std::size_t bytes =
      static_cast<std::size_t>(capacity_blocks) * static_cast<std::size_t>(layout.block_bytes);
  // Locking a pool near the host's memory in would push everything else out of it (or wake the
  // OOM killer): at most half of it is locked, and a pool beyond the host's memory is refused.
  const auto host_bytes = static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > host_bytes)
    return Status::Error("DRAM tier: " + std::to_string(bytes) + " bytes, more than this host's " +
                         std::to_string(host_bytes) + " bytes of memory");
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    return Status::Error(Errno("DRAM tier: cannot map " + std::to_string(bytes) + " bytes"));
  // Page-locked, as a pinned pool for DMA must be; a process whose RLIMIT_MEMLOCK is lower keeps
  // it pageable, which costs speed, not correctness.
  const bool locked = bytes <= host_bytes / 2 && ::mlock(base, bytes) == 0;
  return std::unique_ptr<DramTierBlocks>(
      new DramTierBlocks(layout, capacity_blocks, static_cast<std::byte*>(base), bytes, locked));
}

DramTierBlocks::DramTierBlocks(StoredBlockLayout layout, std::int64_t capacity, std::byte* base,
                               std::size_t pool_bytes, bool locked)
    : TierBlocks(layout),
      capacity_(capacity),
      base_(base),
      pool_bytes_(pool_bytes),
      locked_(locked) {
  free_.reserve(static_cast<std::size_t>(capacity));
  for (std::int64_t s = capacity - 1; s >= 0; --s) free_.push_back(s);
}

DramTierBlocks::~DramTierBlocks() {
  if (locked_) ::munlock(base_, pool_bytes_);
  ::munmap(base_, pool_bytes_);
}

Status DramTierBlocks::Put(BlockHash hash, std::span<const std::byte> bytes) {
  if (Status s = CheckSize(*this, bytes.size()); !s.ok()) return s;
  auto it = slots_.find(hash);
  if (it == slots_.end()) {
    if (Status room = RoomFor(false); !room.ok()) return room;
    it = slots_.emplace(hash, free_.back()).first;
    free_.pop_back();
  }
  std::memcpy(Slot(it->second), bytes.data(), bytes.size());
  ++counters_.puts;
  return Status::Ok();
}

Status DramTierBlocks::Get(BlockHash hash, std::span<std::byte> out) {
  if (Status s = CheckSize(*this, out.size()); !s.ok()) return s;
  const auto it = slots_.find(hash);
  if (it == slots_.end()) {
    ++counters_.get_errors;
    return Status::Error("DRAM tier holds no block " + HashHex(hash));
  }
  std::memcpy(out.data(), Slot(it->second), out.size());
  ++counters_.gets;
  return Status::Ok();
}

void DramTierBlocks::Drop(BlockHash hash) {
  const auto it = slots_.find(hash);
  if (it == slots_.end()) return;
  free_.push_back(it->second);
  slots_.erase(it);
  ++counters_.drops;
}

Status DramTierBlocks::CheckInvariants() const {
  if (Status s = TierBlocks::CheckInvariants(); !s.ok()) return s;
  if (static_cast<std::int64_t>(slots_.size() + free_.size()) != capacity_)
    return Status::Error("DRAM tier: " + std::to_string(slots_.size()) + " held and " +
                         std::to_string(free_.size()) + " free slots, capacity " +
                         std::to_string(capacity_));
  std::vector<bool> seen(static_cast<std::size_t>(capacity_), false);
  auto mark = [&](std::int64_t s) {
    if (s < 0 || s >= capacity_ || seen[static_cast<std::size_t>(s)]) return false;
    seen[static_cast<std::size_t>(s)] = true;
    return true;
  };
  for (const auto& [hash, slot] : slots_)
    if (!mark(slot)) return Status::Error("DRAM tier: slot " + std::to_string(slot) + " twice");
  for (const std::int64_t slot : free_)
    if (!mark(slot))
      return Status::Error("DRAM tier: free slot " + std::to_string(slot) + " twice");
  return Status::Ok();
}

// ---- SSD files ----

// O_DIRECT moves whole sectors: offsets, sizes and buffers aligned to this (a multiple of every
// logical block size in use).
constexpr std::size_t kDirectAlign = 4096;

struct FileTierBlocks::Ring {
  static constexpr unsigned kDepth = 64;  // I/Os in flight at most
  io_uring ring{};
  std::size_t span = 0;  // a block's buffer: header and payload, rounded up to kDirectAlign
  std::byte* buffers = nullptr;
  std::size_t buffer_count = 0;
  bool broken = false;  // the ring could not be made again (Run): every I/O fails
  ~Ring() {
    if (!broken) io_uring_queue_exit(&ring);
    std::free(buffers);
  }
  std::byte* Buffer(std::size_t i) { return buffers + i * span; }
  bool Reserve(std::size_t n) {
    if (n <= buffer_count) return true;
    void* grown = std::aligned_alloc(kDirectAlign, n * span);
    if (!grown) return false;
    std::free(buffers);
    buffers = static_cast<std::byte*>(grown);
    buffer_count = n;
    return true;
  }
  // Submits the `prepared` I/Os (of `n`, user_data their index) and waits for all of them: each
  // one's result (bytes moved, or -errno; -EIO for one not prepared or not submitted).
  std::vector<int> Run(std::size_t n, std::size_t prepared) {
    std::vector<int> results(n, -EIO);
    std::size_t submitted = 0, done = 0;
    auto reap = [&] {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring, &cqe) != 0) return false;
      if (cqe->user_data < n) results[cqe->user_data] = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      ++done;
      return true;
    };
    while (submitted < prepared) {
      const int r = io_uring_submit(&ring);
      if (r > 0) {
        submitted += static_cast<std::size_t>(r);
      } else if ((r == -EAGAIN || r == -EBUSY || r == -EINTR) && done < submitted) {
        if (!reap()) break;  // room for the rest once some have completed
      } else if (r != -EINTR) {
        break;
      }
    }
    while (done < submitted && reap()) {
    }
    if (submitted < prepared || done < submitted) {
      // What was left in the ring must never run later into buffers reused by then: a new ring.
      io_uring_queue_exit(&ring);
      ring = {};
      if (io_uring_queue_init(kDepth, &ring, 0) < 0) broken = true;
    }
    return results;
  }
};

FileTierBlocks::~FileTierBlocks() = default;

Result<std::unique_ptr<FileTierBlocks>> FileTierBlocks::Open(std::filesystem::path dir,
                                                             StoredBlockLayout layout,
                                                             std::int64_t capacity_blocks,
                                                             FileIo io) {
  if (layout.block_bytes <= 0 || capacity_blocks <= 0)
    return Status::Error("SSD tier: block bytes and capacity must be positive");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec))
    return Status::Error("SSD tier: cannot use directory " + dir.string() +
                         (ec ? ": " + ec.message() : ""));
  if (::access(dir.c_str(), W_OK | R_OK | X_OK) != 0)
    return Status::Error(Errno("SSD tier: directory " + dir.string()));
  std::unique_ptr<FileTierBlocks> t(new FileTierBlocks(std::move(dir), layout, capacity_blocks));
  if (io == FileIo::kIoUring) {
    const std::filesystem::path probe = t->dir_ / ".o_direct_probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0)
      return Status::Error(Errno("SSD tier: io_uring reads and writes with O_DIRECT, which " +
                                 t->dir_.string() + " refuses"));
    ::close(fd);
    ::unlink(probe.c_str());
    auto ring = std::make_unique<Ring>();
    if (const int e = io_uring_queue_init(Ring::kDepth, &ring->ring, 0); e < 0)
      return Status::Error(std::string("SSD tier: io_uring: ") + std::strerror(-e));
    ring->span = (kStoredBlockHeaderBytes + static_cast<std::size_t>(layout.block_bytes) +
                  kDirectAlign - 1) /
                 kDirectAlign * kDirectAlign;
    t->ring_ = std::move(ring);
  }
  t->Scan();
  return t;
}

FileTierBlocks::FileTierBlocks(std::filesystem::path dir, StoredBlockLayout layout,
                               std::int64_t capacity)
    : TierBlocks(layout), dir_(std::move(dir)), capacity_(capacity) {}

std::filesystem::path FileTierBlocks::PathOf(BlockHash hash) const {
  return dir_ / (HashHex(hash) + kBlockSuffix);
}

void FileTierBlocks::Scan() {
  std::vector<std::pair<std::string, BlockHash>> valid;
  const std::size_t want = kStoredBlockHeaderBytes + static_cast<std::size_t>(block_bytes());
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    if (name.ends_with(kPartialSuffix)) {
      std::filesystem::remove(entry.path(), ec);
      ++recovery_.partial;
      continue;
    }
    const std::optional<BlockHash> hash = HashOfName(name);
    if (!hash) continue;  // not Duet's: left alone
    std::array<std::byte, kStoredBlockHeaderBytes> header{};
    Fd fd(::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC));
    const bool whole =
        fd.ok() && entry.file_size(ec) == want &&
        ::pread(fd.get(), header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()) &&
        CheckStoredBlockHeader(header, layout_, *hash).ok();
    if (whole) {
      valid.emplace_back(name, *hash);
    } else {
      std::filesystem::remove(entry.path(), ec);
      ++recovery_.corrupt;
    }
  }
  std::sort(valid.begin(), valid.end());
  for (const auto& [name, hash] : valid) {
    if (static_cast<std::int64_t>(held_.size()) >= capacity_) {
      std::filesystem::remove(dir_ / name, ec);
      ++recovery_.over_capacity;
      continue;
    }
    held_.insert(hash);
    recovery_.blocks.push_back(hash);
  }
}

Status FileTierBlocks::Put(BlockHash hash, std::span<const std::byte> bytes) {
  if (!ring_) return MapPut(hash, bytes);
  return PutMany({&hash, 1}, {&bytes, 1});
}

Status FileTierBlocks::Get(BlockHash hash, std::span<std::byte> out) {
  if (!ring_) return MapGet(hash, out);
  return GetMany({&hash, 1}, {&out, 1});
}

Status FileTierBlocks::Lost(BlockHash hash, const std::string& why) {
  const std::filesystem::path path = PathOf(hash);
  ::unlink(path.c_str());
  held_.erase(hash);
  ++counters_.lost;
  ++counters_.get_errors;
  return Status::Error("SSD tier: block file " + path.string() + ": " + why);
}

Status FileTierBlocks::PutMany(std::span<const BlockHash> hashes,
                               std::span<const std::span<const std::byte>> blocks) {
  if (!ring_) return TierBlocks::PutMany(hashes, blocks);
  if (hashes.size() != blocks.size()) return Status::Error("PutMany: hashes and blocks differ");
  if (ring_->broken) {
    ++counters_.put_errors;
    return Status::Error("SSD tier: io_uring could not be set up again after a failed submit");
  }
  std::size_t fresh = 0;
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    if (Status s = CheckSize(*this, blocks[i].size()); !s.ok()) return s;
    fresh += !held_.contains(hashes[i]) &&
             std::find(hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(i),
                       hashes[i]) == hashes.begin() + static_cast<std::ptrdiff_t>(i);
  }
  if (static_cast<std::int64_t>(held_.size() + fresh) > capacity_) {
    ++counters_.put_errors;
    return Status::Error("ssd tier full: " + std::to_string(capacity_) + " blocks held");
  }
  const std::size_t want = kStoredBlockHeaderBytes + static_cast<std::size_t>(block_bytes());
  Status first = Status::Ok();
  auto fail = [&](Status s) {
    ++counters_.put_errors;
    if (first.ok()) first = std::move(s);
  };
  for (std::size_t start = 0; start < hashes.size(); start += Ring::kDepth) {
    const std::size_t n = std::min<std::size_t>(Ring::kDepth, hashes.size() - start);
    if (!ring_->Reserve(n)) return Status::Error("SSD tier: no memory for I/O buffers");
    std::vector<int> fds(n, -1);
    std::size_t prepared = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const BlockHash hash = hashes[start + i];
      std::byte* buf = ring_->Buffer(i);
      EncodeStoredBlockHeader(
          layout_, hash, blocks[start + i],
          std::span<std::byte, kStoredBlockHeaderBytes>(buf, kStoredBlockHeaderBytes));
      std::memcpy(buf + kStoredBlockHeaderBytes, blocks[start + i].data(),
                  blocks[start + i].size());
      std::memset(buf + want, 0, ring_->span - want);
      const std::string partial = PathOf(hash).string() + kPartialSuffix;
      fds[i] = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
      if (fds[i] < 0) continue;
      ++prepared;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      io_uring_prep_write(sqe, fds[i], buf, static_cast<unsigned>(ring_->span), 0);
      sqe->user_data = i;
    }
    const std::vector<int> results = ring_->Run(n, prepared);
    for (std::size_t i = 0; i < n; ++i) {
      const BlockHash hash = hashes[start + i];
      const std::filesystem::path path = PathOf(hash);
      const std::string partial = path.string() + kPartialSuffix;
      if (fds[i] < 0) {
        fail(Status::Error(Errno("SSD tier: cannot create " + partial)));
        continue;
      }
      Status written = Status::Ok();
      if (results[i] != static_cast<int>(ring_->span)) {
        written = Status::Error("SSD tier: writing " + partial + ": " +
                                (results[i] < 0 ? std::strerror(-results[i]) : "short write"));
      } else if (::ftruncate(fds[i], static_cast<off_t>(want)) != 0) {
        written = Status::Error(Errno("SSD tier: cannot size " + partial));
      }
      ::close(fds[i]);
      if (written.ok() && ::rename(partial.c_str(), path.c_str()) != 0)
        written = Status::Error(Errno("SSD tier: cannot rename " + partial));
      if (!written.ok()) {
        ::unlink(partial.c_str());
        fail(std::move(written));
        continue;
      }
      held_.insert(hash);
      ++counters_.puts;
    }
  }
  return first;
}

Status FileTierBlocks::GetMany(std::span<const BlockHash> hashes,
                               std::span<const std::span<std::byte>> out) {
  if (!ring_) return TierBlocks::GetMany(hashes, out);
  if (hashes.size() != out.size()) return Status::Error("GetMany: hashes and blocks differ");
  if (ring_->broken) {
    ++counters_.get_errors;
    return Status::Error("SSD tier: io_uring could not be set up again after a failed submit");
  }
  const std::size_t want = kStoredBlockHeaderBytes + static_cast<std::size_t>(block_bytes());
  Status first = Status::Ok();
  auto fail = [&](Status s) {
    if (first.ok()) first = std::move(s);
  };
  for (std::size_t start = 0; start < hashes.size(); start += Ring::kDepth) {
    const std::size_t n = std::min<std::size_t>(Ring::kDepth, hashes.size() - start);
    if (!ring_->Reserve(n)) return Status::Error("SSD tier: no memory for I/O buffers");
    std::vector<int> fds(n, -1);
    std::size_t prepared = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const BlockHash hash = hashes[start + i];
      if (Status s = CheckSize(*this, out[start + i].size()); !s.ok()) {
        fail(std::move(s));
        continue;
      }
      if (!held_.contains(hash)) {
        ++counters_.get_errors;
        fail(Status::Error("SSD tier holds no block " + HashHex(hash)));
        continue;
      }
      const int fd = ::open(PathOf(hash).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (fd < 0) {
        fail(Lost(hash, errno == ENOENT ? "missing" : std::strerror(errno)));
        continue;
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != want) {
        const std::string why =
            (static_cast<std::size_t>(st.st_size) < want ? "truncated: " : "trailing bytes: ") +
            std::to_string(st.st_size) + " bytes, expected " + std::to_string(want);
        ::close(fd);
        fail(Lost(hash, why));
        continue;
      }
      fds[i] = fd;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      io_uring_prep_read(sqe, fd, ring_->Buffer(i), static_cast<unsigned>(ring_->span), 0);
      sqe->user_data = i;
      ++prepared;
    }
    const std::vector<int> results = ring_->Run(n, prepared);
    for (std::size_t i = 0; i < n; ++i) {
      if (fds[i] < 0) continue;
      ::close(fds[i]);
      const BlockHash hash = hashes[start + i];
      if (results[i] != static_cast<int>(want)) {
        fail(Lost(hash, results[i] < 0 ? std::strerror(-results[i]) : "short read"));
        continue;
      }
      const Result<std::span<const std::byte>> payload =
          ParseStoredBlock({ring_->Buffer(i), want}, layout_, hash);
      if (!payload.ok()) {
        fail(Lost(hash, payload.error()));
        continue;
      }
      std::memcpy(out[start + i].data(), payload->data(), out[start + i].size());
      ++counters_.gets;
    }
  }
  return first;
}

Status FileTierBlocks::MapPut(BlockHash hash, std::span<const std::byte> bytes) {
  if (Status s = CheckSize(*this, bytes.size()); !s.ok()) return s;
  auto fail = [&](Status s) {
    ++counters_.put_errors;
    return s;
  };
  if (Status room = RoomFor(held_.contains(hash)); !room.ok()) return room;
  const std::filesystem::path path = PathOf(hash);
  const std::filesystem::path partial = path.string() + kPartialSuffix;
  const std::size_t size = kStoredBlockHeaderBytes + bytes.size();
  {
    Fd fd(::open(partial.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.ok()) return fail(Status::Error(Errno("SSD tier: cannot create " + partial.string())));
    Status written = Status::Ok();
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      written = Status::Error(Errno("SSD tier: cannot size " + partial.string()));
    } else {
      Mapping map(fd.get(), size, /*write=*/true);
      if (!map.ok()) {
        written = Status::Error(Errno("SSD tier: cannot map " + partial.string()));
      } else {
        std::span<std::byte> out = map.bytes();
        EncodeStoredBlockHeader(layout_, hash, bytes, out.first<kStoredBlockHeaderBytes>());
        std::memcpy(out.data() + kStoredBlockHeaderBytes, bytes.data(), bytes.size());
      }
    }
    if (!written.ok()) {
      ::unlink(partial.c_str());
      return fail(written);
    }
  }
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    Status s = Status::Error(Errno("SSD tier: cannot rename " + partial.string()));
    ::unlink(partial.c_str());
    return fail(s);
  }
  held_.insert(hash);
  ++counters_.puts;
  return Status::Ok();
}

Status FileTierBlocks::MapGet(BlockHash hash, std::span<std::byte> out) {
  if (Status s = CheckSize(*this, out.size()); !s.ok()) return s;
  const std::filesystem::path path = PathOf(hash);
  auto lost = [&](const std::string& why) { return Lost(hash, why); };
  if (!held_.contains(hash)) {
    ++counters_.get_errors;
    return Status::Error("SSD tier holds no block " + HashHex(hash));
  }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return lost(errno == ENOENT ? "missing" : std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return lost(std::strerror(errno));
  const std::size_t want = kStoredBlockHeaderBytes + out.size();
  if (static_cast<std::size_t>(st.st_size) != want)
    return lost((static_cast<std::size_t>(st.st_size) < want ? "truncated: " : "trailing bytes: ") +
                std::to_string(st.st_size) + " bytes, expected " + std::to_string(want));
  Mapping map(fd.get(), want, /*write=*/false);
  if (!map.ok()) return lost(std::strerror(errno));
  const Result<std::span<const std::byte>> payload = ParseStoredBlock(map.bytes(), layout_, hash);
  if (!payload.ok()) return lost(payload.error());
  std::memcpy(out.data(), payload->data(), out.size());
  ++counters_.gets;
  return Status::Ok();
}

void FileTierBlocks::Drop(BlockHash hash) {
  if (held_.erase(hash) == 0) return;
  ::unlink(PathOf(hash).c_str());
  ++counters_.drops;
}

Status FileTierBlocks::CheckInvariants() const {
  if (Status s = TierBlocks::CheckInvariants(); !s.ok()) return s;
  std::error_code ec;
  std::int64_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(kPartialSuffix))
      return Status::Error("SSD tier: a partial file outside a write: " + name);
    if (const auto hash = HashOfName(name)) {
      ++files;
      if (!held_.contains(*hash)) return Status::Error("SSD tier: a block file not held: " + name);
    }
  }
  if (files > static_cast<std::int64_t>(held_.size()))
    return Status::Error("SSD tier: " + std::to_string(files) + " block files, " +
                         std::to_string(held_.size()) + " held");
  return Status::Ok();
}

// ---- Redis ----

RedisTierBlocks::RedisTierBlocks(RedisEndpoint endpoint, StoredBlockLayout layout,
                                 std::int64_t capacity_blocks)
    : TierBlocks(layout), endpoint_(std::move(endpoint)), capacity_(capacity_blocks) {}

RedisTierBlocks::~RedisTierBlocks() { Disconnect(); }

std::unique_ptr<RedisTierBlocks> RedisTierBlocks::Open(RedisEndpoint endpoint,
                                                       StoredBlockLayout layout,
                                                       std::int64_t capacity_blocks) {
  auto blocks = std::make_unique<RedisTierBlocks>(std::move(endpoint), layout, capacity_blocks);
  if (Status s = blocks->Scan(); !s.ok()) blocks->recovery_.error = s.message();
  return blocks;
}

std::string RedisTierBlocks::KeyOf(BlockHash hash) const {
  return "duet:kv:" + HashHex(layout_.fingerprint) + ":" + HashHex(hash);
}

void RedisTierBlocks::Disconnect() {
  if (context_) redisFree(context_);
  context_ = nullptr;
}

Status RedisTierBlocks::Connect() {
  if (context_) return Status::Ok();
  const std::string where = endpoint_.host + ":" + std::to_string(endpoint_.port);
  if (SteadySeconds() < next_attempt_s_)
    return Status::Error("remote tier: redis at " + where + " unreachable (retrying shortly)");
  context_ = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                     ToTimeval(endpoint_.connect_timeout_s));
  std::string error;
  if (!context_) {
    error = "out of memory";
  } else if (context_->err) {
    error = context_->errstr;
  } else if (redisSetTimeout(context_, ToTimeval(endpoint_.command_timeout_s)) != REDIS_OK) {
    error = "cannot set the command timeout";
  }
  if (error.empty()) return Status::Ok();
  Disconnect();
  next_attempt_s_ = SteadySeconds() + endpoint_.retry_after_s;
  return Status::Error("remote tier: cannot reach redis at " + where + ": " + error);
}

namespace {
// A reply, freed on every path out.
struct Reply {
  explicit Reply(void* r) : reply(static_cast<redisReply*>(r)) {}
  ~Reply() {
    if (reply) freeReplyObject(reply);
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  redisReply* reply;
};
}  // namespace

Status RedisTierBlocks::Put(BlockHash hash, std::span<const std::byte> bytes) {
  if (Status s = CheckSize(*this, bytes.size()); !s.ok()) return s;
  auto fail = [&](Status s) {
    ++counters_.put_errors;
    return s;
  };
  if (Status room = RoomFor(held_.contains(hash)); !room.ok()) return room;
  if (Status s = Connect(); !s.ok()) return fail(s);
  // The SET goes onto the socket from the block itself. hiredis would format it into a buffer
  // it allocates per command: for a block of megabytes that is a fresh mapping and its page
  // faults each time, which made a put 3-4 times slower than redis-benchmark's SET. The reply
  // is read by hiredis.
  std::array<std::byte, kStoredBlockHeaderBytes> header{};
  EncodeStoredBlockHeader(layout_, hash, bytes, header);
  const std::string key = KeyOf(hash);
  const std::string prefix = "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key +
                             "\r\n$" + std::to_string(header.size() + bytes.size()) + "\r\n";
  static constexpr char kEnd[] = "\r\n";
  iovec iov[] = {{const_cast<char*>(prefix.data()), prefix.size()},
                 {header.data(), header.size()},
                 {const_cast<std::byte*>(bytes.data()), bytes.size()},
                 {const_cast<char*>(kEnd), 2}};
  if (Status s = WriteAll(context_->fd, iov); !s.ok()) {
    Disconnect();
    return fail(Status::Error("remote tier: SET failed: " + s.message()));
  }
  void* reply = nullptr;
  const int got = redisGetReply(context_, &reply);
  Reply r(reply);
  if (got != REDIS_OK || !r.reply) {
    Status s = Status::Error(std::string("remote tier: SET failed: ") + context_->errstr);
    Disconnect();
    return fail(s);
  }
  if (r.reply->type == REDIS_REPLY_ERROR)
    return fail(Status::Error(std::string("remote tier: SET refused: ") + r.reply->str));
  held_.insert(hash);
  ++counters_.puts;
  return Status::Ok();
}

Status RedisTierBlocks::Get(BlockHash hash, std::span<std::byte> out) {
  if (Status s = CheckSize(*this, out.size()); !s.ok()) return s;
  auto fail = [&](Status s) {
    ++counters_.get_errors;
    return s;
  };
  if (Status s = Connect(); !s.ok()) return fail(s);
  // The GET and its reply go over the socket directly, the value's payload read into `out`
  // itself: hiredis would read a reply of megabytes into a buffer it allocates for each (a
  // fresh mapping and its page faults), as it would format a SET. Every reply before this one
  // was read whole, so nothing of this one waits in hiredis's buffer.
  const int fd = context_->fd;
  auto broken = [&](const std::string& why) {
    Disconnect();
    return fail(Status::Error("remote tier: GET failed: " + why));
  };
  const std::string key = KeyOf(hash);
  const std::string command =
      "*2\r\n$3\r\nGET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n";
  iovec iov[] = {{const_cast<char*>(command.data()), command.size()}};
  if (Status s = WriteAll(fd, iov); !s.ok()) return broken(s.message());
  // The reply's first line: "$<bytes>", "$-1" (no such key) or "-<error>".
  std::array<char, 128> head{};
  std::size_t have = 0, line = 0;
  for (;;) {
    const char* end = static_cast<const char*>(std::memchr(head.data(), '\n', have));
    if (end) {
      line = static_cast<std::size_t>(end - head.data()) + 1;
      break;
    }
    if (have == head.size()) return broken("a reply line longer than " + std::to_string(have));
    const ssize_t n = ::recv(fd, head.data() + have, head.size() - have, 0);
    if (n <= 0) return broken(n == 0 ? "the server closed the connection" : Errno("recv"));
    have += static_cast<std::size_t>(n);
  }
  const std::string first(head.data(), line >= 2 ? line - 2 : 0);
  if (first == "$-1") {
    // Gone from the server (restarted empty, or evicted by its own maxmemory policy).
    if (held_.erase(hash)) ++counters_.lost;
    return fail(Status::Error("remote tier: redis holds no block " + HashHex(hash)));
  }
  if (!first.empty() && first[0] == '-')
    return fail(Status::Error("remote tier: GET refused: " + first.substr(1)));
  char* digits_end = nullptr;
  const long long value =
      first.size() > 1 && first[0] == '$' ? std::strtoll(first.c_str() + 1, &digits_end, 10) : -1;
  // Redis holds no string longer than 512 MiB (proto-max-bulk-len): a longer length is not a
  // reply to read, whatever sent it.
  constexpr long long kLongestValue = 512LL << 20;
  if (value < 0 || value > kLongestValue || !digits_end || *digits_end != '\0')
    return broken("not a string reply: " + first.substr(0, 40));
  // The value, then its "\r\n": what arrived with the line first, the rest from the socket.
  const std::size_t want = kStoredBlockHeaderBytes + out.size();
  std::array<std::byte, kStoredBlockHeaderBytes> header{};
  const bool sized = static_cast<std::size_t>(value) == want;
  std::vector<std::byte> other;  // a value of another size, read to keep the connection in step
  if (!sized) other.resize(static_cast<std::size_t>(value));
  std::array<char, 2> crlf{};
  const std::array<std::span<std::byte>, 3> parts = {
      sized ? std::span<std::byte>(header) : std::span<std::byte>(other),
      sized ? out : std::span<std::byte>(), std::as_writable_bytes(std::span<char>(crlf))};
  std::size_t extra = line;  // the next byte of `head` not yet placed
  for (const std::span<std::byte> part : parts) {
    const std::size_t take = std::min(part.size(), have - extra);
    if (take > 0) std::memcpy(part.data(), head.data() + extra, take);
    extra += take;
    std::size_t filled = take;
    while (filled < part.size()) {
      const ssize_t n = ::recv(fd, part.data() + filled, part.size() - filled, 0);
      if (n <= 0) return broken(n == 0 ? "the server closed the connection" : Errno("recv"));
      filled += static_cast<std::size_t>(n);
    }
  }
  if (crlf[0] != '\r' || crlf[1] != '\n' || extra != have)
    return broken("a value not followed by its line end");
  Status checked = sized ? CheckStoredBlockHeader(header, layout_, hash)
                         : ParseStoredBlock(other, layout_, hash).status();
  if (checked.ok() && sized) checked = CheckStoredPayload(header, out);
  if (!checked.ok()) {
    // Never served again, by this process or another: whoever put it.
    held_.erase(hash);
    Reply del(redisCommand(context_, "DEL %b", key.data(), key.size()));
    if (!del.reply) Disconnect();
    ++counters_.lost;
    return fail(Status::Error("remote tier: " + key + ": " + checked.message()));
  }
  ++counters_.gets;
  return Status::Ok();
}

Status RedisTierBlocks::Scan() {
  if (Status s = Connect(); !s.ok()) return s;
  const std::string prefix = "duet:kv:" + HashHex(layout_.fingerprint) + ":";
  const std::string pattern = prefix + "*";
  std::vector<BlockHash> found;
  // SCAN ends when its cursor comes back to 0; bounded all the same, against a store that never
  // says so.
  std::string cursor = "0";
  for (int calls = 0; calls < 1'000'000; ++calls) {
    Reply r(redisCommand(context_, "SCAN %s MATCH %b COUNT 1000", cursor.c_str(), pattern.data(),
                         pattern.size()));
    if (!r.reply) {
      Status s = Status::Error(std::string("remote tier: SCAN failed: ") + context_->errstr);
      Disconnect();
      return s;
    }
    if (r.reply->type != REDIS_REPLY_ARRAY || r.reply->elements != 2 ||
        r.reply->element[0]->type != REDIS_REPLY_STRING ||
        r.reply->element[1]->type != REDIS_REPLY_ARRAY)
      return Status::Error("remote tier: SCAN: not a [cursor, keys] reply");
    const redisReply* keys = r.reply->element[1];
    for (std::size_t k = 0; k < keys->elements; ++k) {
      if (keys->element[k]->type != REDIS_REPLY_STRING) continue;
      const std::string_view key(keys->element[k]->str, keys->element[k]->len);
      if (!key.starts_with(prefix)) continue;
      if (auto hash = ParseHashHex(key.substr(prefix.size()))) found.push_back(*hash);
    }
    cursor.assign(r.reply->element[0]->str, r.reply->element[0]->len);
    if (cursor == "0") break;
  }
  // A key SCAN returned twice (the keyspace rehashed meanwhile) counts once.
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  for (BlockHash hash : found) {
    if (static_cast<std::int64_t>(held_.size()) < capacity_) {
      held_.insert(hash);
      recovery_.blocks.push_back(hash);
      continue;
    }
    const std::string key = KeyOf(hash);
    Reply del(redisCommand(context_, "DEL %b", key.data(), key.size()));
    if (!del.reply) {
      Disconnect();
      return Status::Error("remote tier: DEL of a block over the capacity failed");
    }
    ++recovery_.over_capacity;
  }
  return Status::Ok();
}

void RedisTierBlocks::Drop(BlockHash hash) {
  if (held_.erase(hash) == 0) return;
  ++counters_.drops;
  if (!Connect().ok()) return;  // the server's own eviction or a restart will drop it
  const std::string key = KeyOf(hash);
  Reply r(redisCommand(context_, "DEL %b", key.data(), key.size()));
  if (!r.reply) Disconnect();
}

}  // namespace duet::backend
