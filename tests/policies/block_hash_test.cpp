// Chained engine-block hashes from trace prefix ids.
#include "policies/block_hash.h"

#include <gtest/gtest.h>

#include <set>

namespace duet::policies {
namespace {

TEST(EngineBlockHashes, MapsTraceBlocksOntoFullEngineBlocks) {
  const std::vector<std::uint64_t> ids = {5, 6, 7};
  // 512-token trace blocks, 16-token engine blocks; 1000 tokens -> 62 full engine blocks.
  const auto h = EngineBlockHashes(ids, 512, 1000, 16);
  EXPECT_EQ(h.size(), 62u);
  // No repeats inside one prompt: offsets inside a trace block tell blocks apart.
  std::set<BlockHash> unique(h.begin(), h.end());
  EXPECT_EQ(unique.size(), h.size());
}

TEST(EngineBlockHashes, EqualPrefixesEqualHashesUntilTheFirstDifference) {
  const auto a = EngineBlockHashes(std::vector<std::uint64_t>{1, 2, 3}, 512, 1536, 16);
  const auto b = EngineBlockHashes(std::vector<std::uint64_t>{1, 2, 9}, 512, 1536, 16);
  ASSERT_EQ(a.size(), 96u);
  for (std::size_t j = 0; j < 64; ++j) EXPECT_EQ(a[j], b[j]) << j;
  for (std::size_t j = 64; j < 96; ++j) EXPECT_NE(a[j], b[j]) << j;
}

TEST(EngineBlockHashes, ChainingMakesPositionMatter) {
  // The same id at a different position (different parent) is different content.
  const auto a = EngineBlockHashes(std::vector<std::uint64_t>{1, 2}, 512, 1024, 16);
  const auto b = EngineBlockHashes(std::vector<std::uint64_t>{3, 2}, 512, 1024, 16);
  for (std::size_t j = 32; j < 64; ++j) EXPECT_NE(a[j], b[j]);
}

TEST(EngineBlockHashes, NoIdsOrShortIdsLimitTheHashes) {
  EXPECT_TRUE(EngineBlockHashes({}, 512, 4096, 16).empty());
  // Ids cover only the first 512 tokens of a 4096-token prompt.
  EXPECT_EQ(EngineBlockHashes(std::vector<std::uint64_t>{4}, 512, 4096, 16).size(), 32u);
}

TEST(EngineBlockHashes, EngineBlocksThatStraddleTraceBlocks) {
  // 24-token engine blocks over 512-token trace blocks: block 21 covers tokens 504..527.
  const auto a = EngineBlockHashes(std::vector<std::uint64_t>{1, 2}, 512, 1024, 24);
  const auto b = EngineBlockHashes(std::vector<std::uint64_t>{1, 3}, 512, 1024, 24);
  ASSERT_EQ(a.size(), 42u);
  EXPECT_EQ(a[20], b[20]);
  EXPECT_NE(a[21], b[21]);  // depends on the second trace block too
}

TEST(TokenBlockHashes, ChainsOverTokenContent) {
  std::vector<std::int32_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) a[i] = b[i] = i;
  b[20] = 999;  // second block differs
  const auto ha = TokenBlockHashes(a, 16), hb = TokenBlockHashes(b, 16);
  ASSERT_EQ(ha.size(), 2u);  // 40 tokens: two full 16-token blocks
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_EQ(TokenBlockHashes(std::vector<std::int32_t>(a.begin(), a.begin() + 32), 16), ha);
}

// The incremental form equals the definition (division per block) for block sizes that divide,
// do not divide, and exceed each other.
TEST(EngineBlockHashes, EqualsTheDefinitionForAnyBlockSizes) {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const std::vector<std::uint64_t> ids = {7, 3, 99, 12, 5, 8, 1000, 4, 4, 17, 23, 42};
  for (Tokens trace_block : {1, 3, 16, 64, 512}) {
    for (Tokens engine_block : {1, 5, 16, 64, 100, 512, 1000}) {
      const Tokens input = static_cast<Tokens>(ids.size()) * trace_block - 1;
      std::vector<BlockHash> expected;
      BlockHash parent = 0x6475657400000000ULL;
      const Tokens covered = std::min<Tokens>(input, static_cast<Tokens>(ids.size()) * trace_block);
      for (Tokens j = 0; j < covered / engine_block; ++j) {
        const Tokens first = j * engine_block, last = first + engine_block - 1;
        std::uint64_t content =
            mix(0x7472616365ULL ^ static_cast<std::uint64_t>(first % trace_block));
        for (Tokens t = first / trace_block; t <= last / trace_block; ++t)
          content = mix(content ^ ids[static_cast<std::size_t>(t)]);
        const BlockHash h = mix(parent ^ content);
        expected.push_back(h);
        parent = h;
      }
      EXPECT_EQ(EngineBlockHashes(ids, trace_block, input, engine_block), expected)
          << "trace block " << trace_block << ", engine block " << engine_block;
    }
  }
}

}  // namespace
}  // namespace duet::policies
