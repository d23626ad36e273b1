// Tests of the prompt builder `duet replay` sends (traces/prompt.h): exact lengths, equal block
// ids giving equal token prefixes and different ones different tokens, no sharing between
// requests without block ids, the token id range, the seed, and the real Mooncake trace.
#include "traces/prompt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tests/traces/test_util.h"

namespace duet::traces {
namespace {

TraceRequest Req(std::uint64_t id, Tokens input, std::vector<std::uint64_t> blocks) {
  TraceRequest r;
  r.id = id;
  r.input_tokens = input;
  r.output_tokens = 1;
  r.block_ids = std::move(blocks);
  return r;
}

std::vector<std::int32_t> Slice(const std::vector<std::int32_t>& v, std::size_t from,
                                std::size_t to) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from),
          v.begin() + static_cast<std::ptrdiff_t>(to)};
}

// Positions in [from, to) where a and b hold the same token.
std::size_t SamePositions(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b,
                          std::size_t from, std::size_t to) {
  std::size_t same = 0;
  for (std::size_t i = from; i < to; ++i) same += a.at(i) == b.at(i);
  return same;
}

// Two independent streams over a 31,984-id range agree at about 1 position in 32,000; this
// bound is far above chance and far below a shared block (512 of 512).
constexpr std::size_t kMaxChanceMatches = 8;

const PromptOptions kOptions;  // vocabulary 32000, seed 1

TEST(Prompt, LengthIsExactlyTheInputTokens) {
  for (Tokens input : {1, 2, 511, 512, 513, 1024, 6758}) {
    const std::size_t blocks = static_cast<std::size_t>((input + 511) / 512);
    std::vector<std::uint64_t> ids(blocks);
    for (std::size_t b = 0; b < blocks; ++b) ids[b] = 100 + b;
    EXPECT_EQ(BuildPrompt(Req(0, input, ids), 512, kOptions).size(),
              static_cast<std::size_t>(input))
        << input << " tokens with block ids";
    EXPECT_EQ(BuildPrompt(Req(0, input, {}), 512, kOptions).size(), static_cast<std::size_t>(input))
        << input << " tokens without block ids";
  }
  EXPECT_TRUE(BuildPrompt(Req(0, 0, {}), 512, kOptions).empty());
}

TEST(Prompt, EqualBlockIdPrefixesGiveEqualTokenPrefixes) {
  const auto a = BuildPrompt(Req(0, 2000, {0, 1, 2, 3}), 512, kOptions);
  const auto b = BuildPrompt(Req(1, 1100, {0, 1, 5}), 512, kOptions);
  EXPECT_EQ(Slice(a, 0, 1024), Slice(b, 0, 1024));
  // Block 2 of a (id 2) and of b (id 5, partial: 76 tokens) differ.
  EXPECT_LE(SamePositions(a, b, 1024, 1100), kMaxChanceMatches);
}

TEST(Prompt, DifferentFirstBlocksShareNothing) {
  const auto a = BuildPrompt(Req(0, 1024, {10, 11}), 512, kOptions);
  const auto b = BuildPrompt(Req(1, 1024, {12, 11}), 512, kOptions);
  EXPECT_LE(SamePositions(a, b, 0, 512), kMaxChanceMatches);
  // Same id in the second position but after another first block: still a different prefix
  // as a whole, though this block's own tokens are the same (the ids carry the chaining).
  EXPECT_EQ(Slice(a, 512, 1024), Slice(b, 512, 1024));
}

TEST(Prompt, PartialLastBlockIsAPrefixOfTheFullBlock) {
  const auto partial = BuildPrompt(Req(0, 100, {7}), 512, kOptions);
  const auto full = BuildPrompt(Req(1, 600, {7, 8}), 512, kOptions);
  EXPECT_EQ(partial, Slice(full, 0, 100));
}

TEST(Prompt, BlockSizeFollowsTheTrace) {
  // Synthetic traces may use other block sizes: block b covers [b*16, (b+1)*16).
  const auto a = BuildPrompt(Req(0, 40, {1, 2, 3}), 16, kOptions);
  const auto b = BuildPrompt(Req(1, 40, {1, 2, 4}), 16, kOptions);
  EXPECT_EQ(Slice(a, 0, 32), Slice(b, 0, 32));
  EXPECT_LE(SamePositions(a, b, 32, 40), 1u);
  EXPECT_NE(Slice(a, 32, 40), Slice(b, 32, 40));
}

TEST(Prompt, RequestsWithoutBlockIdsShareNothing) {
  const auto a = BuildPrompt(Req(0, 3000, {}), 512, kOptions);
  const auto b = BuildPrompt(Req(1, 3000, {}), 512, kOptions);
  EXPECT_LE(SamePositions(a, b, 0, 3000), kMaxChanceMatches);
  // A request id equal to a block id does not reproduce that block's tokens.
  const auto block = BuildPrompt(Req(9, 512, {5}), 512, kOptions);
  const auto unique = BuildPrompt(Req(5, 512, {}), 512, kOptions);
  EXPECT_LE(SamePositions(block, unique, 0, 512), kMaxChanceMatches);
}

TEST(Prompt, DeterministicAndSeeded) {
  const TraceRequest r = Req(3, 700, {4, 9});
  EXPECT_EQ(BuildPrompt(r, 512, kOptions), BuildPrompt(r, 512, kOptions));
  PromptOptions other = kOptions;
  other.seed = 2;
  const auto a = BuildPrompt(r, 512, kOptions);
  const auto b = BuildPrompt(r, 512, other);
  EXPECT_LE(SamePositions(a, b, 0, 700), kMaxChanceMatches);
  const auto c = BuildPrompt(Req(3, 700, {}), 512, kOptions);
  const auto d = BuildPrompt(Req(3, 700, {}), 512, other);
  EXPECT_LE(SamePositions(c, d, 0, 700), kMaxChanceMatches);
}

TEST(Prompt, TokenIdsStayInTheVocabularyAboveTheReservedIds) {
  PromptOptions small;
  small.vocab_size = 20;
  const auto tokens = BuildPrompt(Req(0, 2000, {1, 2, 3, 4}), 512, small);
  const std::set<std::int32_t> seen(tokens.begin(), tokens.end());
  EXPECT_EQ(seen, (std::set<std::int32_t>{16, 17, 18, 19}));
  const auto big = BuildPrompt(Req(0, 20000, {}), 512, kOptions);
  EXPECT_GE(*std::min_element(big.begin(), big.end()), kFirstPromptTokenId);
  EXPECT_LT(*std::max_element(big.begin(), big.end()), kOptions.vocab_size);
  // 20,000 draws over 31,984 ids: the spread shows the whole range is used.
  EXPECT_LT(*std::min_element(big.begin(), big.end()), 16 + 100);
  EXPECT_GT(*std::max_element(big.begin(), big.end()), 32000 - 100);
}

TEST(Prompt, VocabularyMustExceedTheReservedIds) {
  PromptOptions o;
  o.vocab_size = kFirstPromptTokenId;
  const Status s = CheckPromptOptions(o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(testing::ContainsAll(s.message(), {"greater than 16", "got 16"}));
  o.vocab_size = kFirstPromptTokenId + 1;
  EXPECT_TRUE(CheckPromptOptions(o).ok());
}

TEST(Prompt, RealMooncakeTraceSharesWhatItsHashIdsShare) {
  auto trace = ReadMooncake(testing::MooncakePath());
  ASSERT_TRUE(trace.ok()) << trace.error();
  // The first two requests of the conversation trace share hash id 0 and nothing after it.
  const TraceRequest& a = trace->requests.at(0);
  const TraceRequest& b = trace->requests.at(1);
  ASSERT_EQ(a.block_ids.at(0), b.block_ids.at(0));
  ASSERT_NE(a.block_ids.at(1), b.block_ids.at(1));
  const auto pa = BuildPrompt(a, trace->block_tokens, kOptions);
  const auto pb = BuildPrompt(b, trace->block_tokens, kOptions);
  EXPECT_EQ(pa.size(), static_cast<std::size_t>(a.input_tokens));
  EXPECT_EQ(pb.size(), static_cast<std::size_t>(b.input_tokens));
  EXPECT_EQ(Slice(pa, 0, 512), Slice(pb, 0, 512));
  EXPECT_LE(SamePositions(pa, pb, 512, 1024), kMaxChanceMatches);
}

}  // namespace
}  // namespace duet::traces
