// The real KV tiers: a stored block's format, host DRAM, block files on disk (corrupt, truncated,
// missing and partial files; recovery at start; no descriptor leaked) and a real redis-server on
// loopback (killed and restarted under the tier).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backend/tiers/stored_block.h"
#include "backend/tiers/tier_blocks.h"
#include "tests/model/temp_dir.h"
#include "tests/tiers/tier_test_util.h"

namespace duet::backend {
namespace {

namespace fs = std::filesystem;

constexpr StoredBlockLayout kLayout{.fingerprint = 0x1234abcd, .block_bytes = 4096};

TEST(StoredBlock, RoundTripsAndRefusesEveryDamage) {
  const std::vector<std::byte> payload = BlockBytes(kLayout.block_bytes, 7);
  std::vector<std::byte> stored(kStoredBlockHeaderBytes + payload.size());
  EncodeStoredBlockHeader(kLayout, 42, payload,
                          std::span<std::byte>(stored).first<kStoredBlockHeaderBytes>());
  std::memcpy(stored.data() + kStoredBlockHeaderBytes, payload.data(), payload.size());
  const auto ok = ParseStoredBlock(stored, kLayout, 42);
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_TRUE(std::equal(ok->begin(), ok->end(), payload.begin(), payload.end()));
  EXPECT_EQ(StoredBlockHash(stored), 42u);

  auto error_of = [&](std::vector<std::byte> s, StoredBlockLayout layout = kLayout,
                      BlockHash hash = 42) {
    const auto r = ParseStoredBlock(s, layout, hash);
    return r.ok() ? std::string("parsed") : r.error();
  };
  auto flipped = [&](std::size_t at) {
    std::vector<std::byte> s = stored;
    s[at] ^= std::byte{1};
    return s;
  };
  EXPECT_NE(error_of(flipped(kStoredBlockHeaderBytes + 100)).find("corrupt payload"),
            std::string::npos);
  EXPECT_NE(error_of(flipped(30)).find("corrupt header"), std::string::npos);
  EXPECT_NE(error_of(flipped(0)).find("bad magic"), std::string::npos);
  EXPECT_NE(error_of({stored.begin(), stored.end() - 1}).find("truncated"), std::string::npos);
  EXPECT_NE(error_of({stored.begin(), stored.begin() + 10}).find("truncated"), std::string::npos);
  std::vector<std::byte> longer = stored;
  longer.push_back(std::byte{0});
  EXPECT_NE(error_of(longer).find("trailing bytes"), std::string::npos);
  EXPECT_NE(error_of(stored, kLayout, 43).find("holds block"), std::string::npos);
  EXPECT_NE(error_of(stored, {.fingerprint = 99, .block_bytes = 4096}).find("another model"),
            std::string::npos);
  EXPECT_NE(error_of(stored, {.fingerprint = kLayout.fingerprint, .block_bytes = 2048})
                .find("payload of"),
            std::string::npos);
}

// The fuzz target's seeds (fuzz/corpus/tiers_stored_block, layout of its target): only the one
// named valid is served, so the corpus starts from both sides of every check.
TEST(StoredBlock, OnlyTheValidFuzzSeedIsServed) {
  constexpr StoredBlockLayout kFuzzLayout{.fingerprint = 0x5eed, .block_bytes = 64};
  int seeds = 0;
  for (const auto& e : fs::directory_iterator("fuzz/corpus/tiers_stored_block")) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                           text.size());
    const bool valid = e.path().filename() == "valid";
    EXPECT_EQ(ParseStoredBlock(bytes, kFuzzLayout, StoredBlockHash(bytes)).ok(), valid) << e.path();
    ++seeds;
  }
  EXPECT_GE(seeds, 5);
}

TEST(DramTierBlocks, HoldsWhatWasPutUntilDroppedAndRefusesPutsBeyondItsSlots) {
  auto dram = DramTierBlocks::Create(kLayout, 2);
  ASSERT_TRUE(dram.ok()) << dram.error();
  TierBlocks& t = **dram;
  ASSERT_TRUE(t.Put(1, BlockBytes(4096, 1)).ok());
  ASSERT_TRUE(t.Put(2, BlockBytes(4096, 2)).ok());
  const Status full = t.Put(3, BlockBytes(4096, 3));
  EXPECT_NE(full.message().find("full"), std::string::npos) << full.message();
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(t.Get(2, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 2));
  t.Drop(1);
  EXPECT_FALSE(t.Get(1, out).ok());
  ASSERT_TRUE(t.Put(3, BlockBytes(4096, 3)).ok()) << "the dropped block's slot is reused";
  ASSERT_TRUE(t.Get(3, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 3));
  ASSERT_TRUE(t.Get(2, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 2)) << "reusing a slot touched no other block";
  EXPECT_EQ(t.held_blocks(), 2);
  EXPECT_FALSE(t.Put(4, BlockBytes(100, 4)).ok()) << "a block of the wrong size";
  EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants().message();
}

TEST(DramTierBlocks, APoolBeyondTheHostsMemoryIsRefused) {
  // 2^40 blocks of 4 KiB: 4 PiB.
  const auto huge = DramTierBlocks::Create(kLayout, std::int64_t{1} << 40);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().find("more than this host's"), std::string::npos) << huge.error();
}

// Each test of the SSD tier runs with both engines: mmap and O_DIRECT over io_uring.
class FileTier : public ::testing::TestWithParam<FileIo> {
 protected:
  void SetUp() override { fds_before_ = OpenFds(); }
  void TearDown() override {
    tier_.reset();
    EXPECT_EQ(OpenFds(), fds_before_) << "a file descriptor leaked";
  }
  FileTierBlocks& Open(std::int64_t capacity = 8, StoredBlockLayout layout = kLayout) {
    tier_.reset();
    auto t = FileTierBlocks::Open(dir_, layout, capacity, GetParam());
    EXPECT_TRUE(t.ok()) << t.error();
    tier_ = std::move(t.value());
    return *tier_;
  }
  TempDir temp_;
  fs::path dir_ = temp_.path();
  std::unique_ptr<FileTierBlocks> tier_;
  int fds_before_ = 0;
};

TEST_P(FileTier, ReadsBackWhatItWroteAsOneCheckedFilePerBlock) {
  FileTierBlocks& t = Open();
  for (BlockHash h = 1; h <= 5; ++h) ASSERT_TRUE(t.Put(h, BlockBytes(4096, h)).ok());
  std::vector<std::byte> out(4096);
  for (BlockHash h = 1; h <= 5; ++h) {
    ASSERT_TRUE(t.Get(h, out).ok());
    EXPECT_EQ(out, BlockBytes(4096, h));
  }
  EXPECT_EQ(fs::file_size(t.PathOf(3)), 4096 + kStoredBlockHeaderBytes);
  t.Drop(3);
  EXPECT_FALSE(fs::exists(t.PathOf(3)));
  EXPECT_EQ(t.held_blocks(), 4);
  EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants().message();
}

TEST_P(FileTier, ACorruptTruncatedOrMissingBlockFileIsAnErrorAndIsForgotten) {
  FileTierBlocks& t = Open();
  for (BlockHash h = 1; h <= 4; ++h) ASSERT_TRUE(t.Put(h, BlockBytes(4096, h)).ok());
  FlipByte(t.PathOf(1), kStoredBlockHeaderBytes + 1000);
  fs::resize_file(t.PathOf(2), 3000);
  fs::remove(t.PathOf(3));
  std::vector<std::byte> out(4096);
  const Status corrupt = t.Get(1, out);
  EXPECT_NE(corrupt.message().find("corrupt payload"), std::string::npos) << corrupt.message();
  const Status truncated = t.Get(2, out);
  EXPECT_NE(truncated.message().find("truncated"), std::string::npos) << truncated.message();
  const Status missing = t.Get(3, out);
  EXPECT_NE(missing.message().find("missing"), std::string::npos) << missing.message();
  EXPECT_EQ(t.counters().lost, 3);
  EXPECT_EQ(t.held_blocks(), 1);
  EXPECT_FALSE(fs::exists(t.PathOf(1))) << "a corrupt file is removed, never served again";
  ASSERT_TRUE(t.Get(4, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 4));
  // A lost block can be written again.
  ASSERT_TRUE(t.Put(1, BlockBytes(4096, 1)).ok());
  ASSERT_TRUE(t.Get(1, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 1));
  EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants().message();
}

TEST_P(FileTier, ReopenedKeepsValidBlocksAndRemovesPartialCorruptForeignAndExcessFiles) {
  {
    FileTierBlocks& t = Open();
    for (BlockHash h = 1; h <= 6; ++h) ASSERT_TRUE(t.Put(h, BlockBytes(4096, h)).ok());
    FlipByte(t.PathOf(5), 20);  // a header field
    fs::resize_file(t.PathOf(6), 100);
  }
  // A write a crash interrupted, a file of another model's layout, and a file that is not Duet's.
  std::ofstream(dir_ / (HashHex(7) + ".kvb.partial")) << "half a block";
  {
    auto other = FileTierBlocks::Open(dir_ / "other", {.fingerprint = 5, .block_bytes = 4096}, 4);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE((*other)->Put(8, BlockBytes(4096, 8)).ok());
    fs::rename((*other)->PathOf(8), dir_ / (HashHex(8) + ".kvb"));
  }
  std::ofstream(dir_ / "README") << "not a block";

  FileTierBlocks& t = Open(/*capacity=*/3);
  const TierRecovery& r = t.recovery();
  EXPECT_EQ(r.partial, 1);
  EXPECT_EQ(r.corrupt, 3) << "the damaged header, the truncated file and the foreign layout";
  EXPECT_EQ(r.over_capacity, 1) << "four valid blocks, room for three";
  EXPECT_EQ(r.blocks, (std::vector<BlockHash>{1, 2, 3}));
  EXPECT_TRUE(fs::exists(dir_ / "README")) << "a file that is not Duet's is left alone";
  EXPECT_FALSE(fs::exists(t.PathOf(4)));
  std::vector<std::byte> out(4096);
  for (BlockHash h = 1; h <= 3; ++h) {
    ASSERT_TRUE(t.Get(h, out).ok());
    EXPECT_EQ(out, BlockBytes(4096, h));
  }
  EXPECT_FALSE(t.Put(9, BlockBytes(4096, 9)).ok()) << "full: the on-disk size stays bounded";
  EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants().message();
}

// An I/O's blocks go and come back together, more of them than the ring holds in flight; files
// one engine wrote, the other serves.
TEST_P(FileTier, ManyBlocksAtOnceAndFilesTheOtherEngineWrote) {
  FileTierBlocks& t = Open(/*capacity=*/200);
  EXPECT_EQ(t.io(), GetParam());
  std::vector<BlockHash> hashes;
  std::vector<std::vector<std::byte>> bytes;
  for (BlockHash h = 1; h <= 150; ++h) {
    hashes.push_back(h);
    bytes.push_back(BlockBytes(4096, h));
  }
  const std::vector<std::span<const std::byte>> in(bytes.begin(), bytes.end());
  ASSERT_TRUE(t.PutMany(hashes, in).ok());
  std::vector<std::vector<std::byte>> back(150, std::vector<std::byte>(4096));
  const std::vector<std::span<std::byte>> out(back.begin(), back.end());
  ASSERT_TRUE(t.GetMany(hashes, out).ok());
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(t.counters().puts, 150);
  EXPECT_EQ(t.counters().gets, 150);
  // A damaged block among them: the others are served, it is lost and the error says which.
  FlipByte(t.PathOf(70), kStoredBlockHeaderBytes + 5);
  const Status one_bad = t.GetMany(hashes, out);
  EXPECT_NE(one_bad.message().find(HashHex(70)), std::string::npos) << one_bad.message();
  EXPECT_EQ(t.held_blocks(), 149);
  tier_.reset();
  auto other = FileTierBlocks::Open(dir_, kLayout, 200,
                                    GetParam() == FileIo::kMmap ? FileIo::kIoUring : FileIo::kMmap);
  ASSERT_TRUE(other.ok()) << other.error();
  EXPECT_EQ((*other)->recovery().blocks.size(), 149u);
  std::vector<std::byte> one(4096);
  ASSERT_TRUE((*other)->Get(150, one).ok());
  EXPECT_EQ(one, bytes[149]);
  // More than it has room for at once: refused whole, nothing written.
  std::vector<BlockHash> too_many;
  for (BlockHash h = 1000; h < 1052; ++h) too_many.push_back(h);
  const std::vector<std::span<const std::byte>> same(52, std::span<const std::byte>(one));
  EXPECT_FALSE((*other)->PutMany(too_many, same).ok());
  EXPECT_TRUE((*other)->CheckInvariants().ok()) << (*other)->CheckInvariants().message();
}

INSTANTIATE_TEST_SUITE_P(Engines, FileTier, ::testing::Values(FileIo::kMmap, FileIo::kIoUring),
                         [](const auto& info) {
                           return info.param == FileIo::kMmap ? "mmap" : "io_uring";
                         });

TEST(FileTierOpen, RefusesADirectoryItCannotUse) {
  TempDir temp;
  const fs::path file = temp.Write("a-file", "x");
  const auto t = FileTierBlocks::Open(file / "sub", kLayout, 4);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().find(file.string()), std::string::npos) << t.error();
}

TEST(RedisTier, BlocksAreSharedByTiersOfOneLayoutAndSurviveNothingWrong) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisTierBlocks a(server.endpoint(), kLayout, 16), b(server.endpoint(), kLayout, 16);
  for (BlockHash h = 1; h <= 4; ++h) ASSERT_TRUE(a.Put(h, BlockBytes(4096, h)).ok());
  std::vector<std::byte> out(4096);
  for (BlockHash h = 1; h <= 4; ++h) {
    const Status s = b.Get(h, out);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(out, BlockBytes(4096, h)) << "another instance (or a restart) reads it";
  }
  RedisTierBlocks foreign(server.endpoint(), {.fingerprint = 1, .block_bytes = 4096}, 16);
  EXPECT_FALSE(foreign.Get(1, out).ok()) << "another layout's keys are other keys";
  // A value damaged in the store is refused and deleted.
  server.Command("SETRANGE " + a.KeyOf(2) + " 200 garbage");
  const Status corrupt = b.Get(2, out);
  EXPECT_NE(corrupt.message().find("corrupt payload"), std::string::npos) << corrupt.message();
  EXPECT_EQ(server.Command("EXISTS " + a.KeyOf(2)), "0");
  // A value of another size (another writer, another format) is refused and deleted, and the
  // connection stays in step: the next read is right.
  server.Command("SET " + a.KeyOf(4) + " short");
  const Status other = b.Get(4, out);
  EXPECT_NE(other.message().find("shorter than the 64-byte header"), std::string::npos)
      << other.message();
  EXPECT_EQ(server.Command("EXISTS " + a.KeyOf(4)), "0");
  server.Command("SET " + a.KeyOf(4) + " \"\"");  // and another, two bytes
  EXPECT_NE(b.Get(4, out).message().find("shorter than the 64-byte header"), std::string::npos);
  ASSERT_TRUE(b.Get(1, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 1));
  a.Drop(3);
  EXPECT_FALSE(b.Get(3, out).ok());
  EXPECT_EQ(a.held_blocks(), 3);
}

TEST(RedisTier, AKilledServerFailsIOsQuicklyAndARestartedOneIsUsedAgain) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisEndpoint endpoint = server.endpoint();
  endpoint.retry_after_s = 0.2;
  RedisTierBlocks t(endpoint, kLayout, 16);
  ASSERT_TRUE(t.Put(1, BlockBytes(4096, 1)).ok());
  server.Kill();
  std::vector<std::byte> out(4096);
  const auto start = std::chrono::steady_clock::now();
  const Status lost = t.Get(1, out);
  EXPECT_FALSE(lost.ok());
  EXPECT_FALSE(t.Put(2, BlockBytes(4096, 2)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3))
      << "an unreachable store fails within its timeouts";
  EXPECT_FALSE(t.connected());
  ASSERT_TRUE(server.Start()) << server.error();  // same port, empty: no persistence
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Status gone = t.Get(1, out);
  EXPECT_NE(gone.message().find("holds no block"), std::string::npos) << gone.message();
  ASSERT_TRUE(t.Put(2, BlockBytes(4096, 2)).ok()) << "the tier connects again";
  ASSERT_TRUE(t.Get(2, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 2));
}

// A tier opened on a store that holds this layout's blocks (a server before it put them) holds
// them, up to its capacity; the rest are deleted, another layout's keys and other keys left.
TEST(RedisTier, OpenedOnAStoreHoldsTheBlocksPutBeforeItUpToItsCapacity) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  {
    RedisTierBlocks before(server.endpoint(), kLayout, 16);
    for (BlockHash h : {5, 1, 9, 3}) ASSERT_TRUE(before.Put(h, BlockBytes(4096, h)).ok());
    RedisTierBlocks foreign(server.endpoint(), {.fingerprint = 1, .block_bytes = 4096}, 16);
    ASSERT_TRUE(foreign.Put(7, BlockBytes(4096, 7)).ok());
  }
  server.Command("SET unrelated value");
  auto t = RedisTierBlocks::Open(server.endpoint(), kLayout, 3);
  const TierRecovery& r = t->recovery();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.blocks, (std::vector<BlockHash>{1, 3, 5}));
  EXPECT_EQ(r.over_capacity, 1);
  EXPECT_EQ(t->held_blocks(), 3);
  EXPECT_EQ(server.Command("EXISTS " + t->KeyOf(9)), "0");
  EXPECT_EQ(server.Command("EXISTS unrelated"), "1");
  EXPECT_EQ(server.Command("DBSIZE"), "5");  // 3 held, the foreign block, the other key
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(t->Get(5, out).ok());
  EXPECT_EQ(out, BlockBytes(4096, 5));
  // Dropped as any held block: deleted from the store.
  t->Drop(1);
  EXPECT_EQ(server.Command("EXISTS " + t->KeyOf(1)), "0");

  // An unreachable store: nothing held, the reason kept, and the tier works once it is up.
  server.Kill();
  RedisEndpoint endpoint = server.endpoint();
  endpoint.retry_after_s = 0.1;
  const auto down = RedisTierBlocks::Open(endpoint, kLayout, 3);
  EXPECT_NE(down->recovery().error.find("cannot reach redis"), std::string::npos)
      << down->recovery().error;
  EXPECT_EQ(down->held_blocks(), 0);
}

}  // namespace
}  // namespace duet::backend
