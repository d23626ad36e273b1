// The KV transport contract, as a parameterized suite that every transport's tests instantiate
// with their transports (tests/transport: loopback, UCX, the fault-injecting wrapper and the
// simulated transport; tests/gpu: CUDA IPC over device memory): the named blocks move into the
// named blocks and nothing else changes; transfers in flight together finish independently;
// ids stay distinct; a transfer that names unknown instances or blocks outside a region, or
// gives fewer destination than source blocks, fails and moves nothing; each finished transfer
// leaves a record. The simulated transport moves time, not bytes: for it every check but the
// bytes' holds.
//
// The tests are in kv_transport_contract_test.cpp, compiled once into each test binary that
// instantiates the suite (gtest's abstract parameterized tests).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/transport/kv_transport.h"

namespace duet::backend::contract {

using policies::KvTransferRequest;
using policies::TransferId;
using policies::TransferStatus;

constexpr policies::InstanceId kPrefill = 0, kDecode = 1;

// Where a region's bytes live: the heap (no allocator), or memory from `allocate`, which the
// test writes and reads through `write` and `read` (null: memcpy; device memory needs copies).
struct RegionMemory {
  KvAllocator allocate = nullptr;
  using Copier = std::function<void(void* to, const void* from, std::size_t n)>;
  Copier write, read;
};

// Byte i of a region made with `seed`.
inline unsigned char PatternByte(std::size_t i, unsigned seed) {
  return static_cast<unsigned char>((i * 131 + seed * 7 + i / 4096) & 0xff);
}

// A KV region: num_blocks blocks of block_bytes, byte i PatternByte(i, seed).
struct Region {
  RegionMemory where;
  std::vector<unsigned char> heap;
  std::unique_ptr<KvMemory> memory;
  KvRegion region;
  Region(std::int64_t block_bytes, std::int64_t num_blocks, unsigned seed,
         RegionMemory memory_from = {})
      : where(std::move(memory_from)) {
    const auto size = static_cast<std::size_t>(block_bytes * num_blocks);
    std::vector<unsigned char> bytes(size);
    for (std::size_t i = 0; i < size; ++i) bytes[i] = PatternByte(i, seed);
    void* base = nullptr;
    if (where.allocate) {
      auto m = where.allocate(block_bytes * num_blocks);
      EXPECT_TRUE(m.ok()) << m.error();
      if (m.ok()) memory = std::move(*m);
      base = memory ? memory->data() : nullptr;
      if (base) (where.write ? where.write : Copy)(base, bytes.data(), size);
    } else {
      heap = std::move(bytes);
      base = heap.data();
    }
    region = {base, block_bytes, num_blocks, memory.get()};
  }
  std::int64_t size() const { return region.block_bytes * region.num_blocks; }
  // What the region holds now.
  std::vector<unsigned char> Bytes() const {
    std::vector<unsigned char> out(static_cast<std::size_t>(size()));
    if (region.base) (where.read ? where.read : Copy)(out.data(), region.base, out.size());
    return out;
  }
  bool operator==(const Region& other) const { return Bytes() == other.Bytes(); }

 private:
  static void Copy(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
};

// One transport under test: where to post (the destination side's transport) and how to let
// the source side make progress.
struct Harness {
  std::vector<std::shared_ptr<void>> keep_alive;  // what else it needs (after `owned` goes)
  std::vector<std::unique_ptr<policies::KvTransport>> owned;
  policies::KvTransport* transport = nullptr;
  const KvTransferLog* log = nullptr;
  std::function<void()> progress_source = [] {};
};

// The harness of a source and a sink of one transport that connect by the source's descriptor
// (PeerKvTransport): pulls go through the sink, the source is progressed, and the sink goes
// before the source. Null, with the failure added, where either was not made or they did not
// connect.
template <class T>
std::unique_ptr<Harness> ConnectedPair(Result<std::unique_ptr<T>> source,
                                       Result<std::unique_ptr<T>> sink) {
  if (!source.ok() || !sink.ok()) {
    ADD_FAILURE() << (source.ok() ? sink.error() : source.error());
    return nullptr;
  }
  if (Status s = (*sink)->Connect(kPrefill, (*source)->Descriptor()); !s.ok()) {
    ADD_FAILURE() << s.message();
    return nullptr;
  }
  auto h = std::make_unique<Harness>();
  T* source_ptr = source->get();
  h->progress_source = [source_ptr] { source_ptr->Progress(); };
  h->transport = sink->get();
  h->log = sink->get();
  h->owned.push_back(std::move(*sink));  // destroyed before the source
  h->owned.push_back(std::move(*source));
  return h;
}

using Factory = std::function<std::unique_ptr<Harness>(Region& src, Region& dst)>;

struct Named {
  std::string name;
  Factory make;
  RegionMemory memory = {};  // where both regions live (default: the heap)
  // Why it cannot run here (the test skips saying so); null or empty: it can.
  std::function<std::string()> unavailable = nullptr;
  bool moves_bytes = true;  // false: the simulated transport (the regions are its layouts)
};
// gtest names a failing instance by this.
inline void PrintTo(const Named& named, std::ostream* os) { *os << named.name; }

class KvTransportContract : public ::testing::TestWithParam<Named> {
 protected:
  static constexpr std::int64_t kBlockBytes = 4096;
  // Made in SetUp, once the transport is known to run here.
  std::optional<Region> src_, dst_;
  std::optional<Region> dst_before_;  // dst_'s initial contents

  void SetUp() override {
    if (GetParam().unavailable) {
      if (const std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
    }
    src_.emplace(kBlockBytes, 24, 1, GetParam().memory);
    dst_.emplace(kBlockBytes, 40, 2, GetParam().memory);
    dst_before_.emplace(kBlockBytes, 40, 2);
  }

  // Polls until the transfer finishes, letting the source progress; bounded (10 s).
  TransferStatus Wait(Harness& h, TransferId id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      h.progress_source();
      const TransferStatus s = h.transport->Poll(id);
      if (s != TransferStatus::kInProgress) return s;
    }
    ADD_FAILURE() << "transfer " << id << " did not finish in 10 s";
    return TransferStatus::kInProgress;
  }

  // Every destination block is what it was, except block dst[i], which holds source block
  // src[i].
  void ExpectMoved(const std::vector<BlockId>& src, const std::vector<BlockId>& dst) {
    if (!GetParam().moves_bytes) return;
    const std::vector<unsigned char> now = dst_->Bytes(), before = dst_before_->Bytes(),
                                     from_src = src_->Bytes();
    std::vector<int> from(static_cast<std::size_t>(dst_->region.num_blocks), -1);
    for (std::size_t i = 0; i < src.size(); ++i) from[static_cast<std::size_t>(dst[i])] = src[i];
    for (std::int64_t b = 0; b < dst_->region.num_blocks; ++b) {
      const int f = from[static_cast<std::size_t>(b)];
      const unsigned char* want =
          f >= 0 ? from_src.data() + f * kBlockBytes : before.data() + b * kBlockBytes;
      EXPECT_EQ(std::memcmp(now.data() + b * kBlockBytes, want, kBlockBytes), 0)
          << "destination block " << b;
    }
  }

  KvTransferRequest Transfer(const std::vector<BlockId>& src, const std::vector<BlockId>& dst,
                             policies::RequestId request = 7) {
    return {request, kPrefill, kDecode, static_cast<Bytes>(src.size()) * kBlockBytes, src, dst};
  }
};

}  // namespace duet::backend::contract
