// The KV transport contract's tests (kv_transport_contract.h says what they check); the files
// that instantiate the suite give the transports.
#include "tests/transport/kv_transport_contract.h"

#include <set>
#include <vector>

namespace duet::backend::contract {

TEST_P(KvTransportContract, MovesTheNamedBlocksAndNothingElse) {
  auto h = GetParam().make(*src_, *dst_);
  ASSERT_NE(h, nullptr);
  // Runs of consecutive blocks on both sides, and blocks out of order.
  const std::vector<BlockId> src = {3, 4, 5, 9, 1, 2, 23};
  const std::vector<BlockId> dst = {10, 11, 12, 20, 0, 1, 39, 5};  // one more: room to grow
  const TransferId id = h->transport->Post(Transfer(src, dst));
  ASSERT_EQ(Wait(*h, id), TransferStatus::kDone);
  ExpectMoved(src, dst);
  ASSERT_EQ(h->log->records().size(), 1u);
  const KvTransferRecord& r = h->log->records()[0];
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.request, 7);
  EXPECT_EQ(r.src, kPrefill);
  EXPECT_EQ(r.dst, kDecode);
  EXPECT_EQ(r.bytes, 7 * kBlockBytes);
  EXPECT_FALSE(r.path.empty());
}

TEST_P(KvTransportContract, TransfersInFlightTogetherFinishIndependently) {
  auto h = GetParam().make(*src_, *dst_);
  ASSERT_NE(h, nullptr);
  std::vector<TransferId> ids;
  std::vector<BlockId> all_src, all_dst;
  for (BlockId i = 0; i < 8; ++i) {
    const std::vector<BlockId> src = {BlockId(2 * i), BlockId(2 * i + 1)};
    const std::vector<BlockId> dst = {BlockId(39 - 2 * i), BlockId(38 - 2 * i)};
    ids.push_back(h->transport->Post(Transfer(src, dst, 100 + i)));
    all_src.insert(all_src.end(), src.begin(), src.end());
    all_dst.insert(all_dst.end(), dst.begin(), dst.end());
  }
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    EXPECT_EQ(Wait(*h, *it), TransferStatus::kDone);
  }
  ExpectMoved(all_src, all_dst);
  EXPECT_EQ(h->log->records().size(), 8u);
}

// A transport may reuse what a finished transfer held (UCX reuses its slot), never its id:
// transfers posted while others come and go keep distinct ids and finish as themselves.
TEST_P(KvTransportContract, IdsStayDistinctAsTransfersComeAndGo) {
  auto h = GetParam().make(*src_, *dst_);
  ASSERT_NE(h, nullptr);
  const std::vector<std::vector<BlockId>> src = {{0, 1}, {2}, {3, 4}, {5}, {6, 7}};
  const std::vector<std::vector<BlockId>> dst = {{30, 31}, {32}, {33, 34}, {35}, {36, 37}};
  TransferId previous = h->transport->Post(Transfer(src[0], dst[0], 200));
  std::set<TransferId> ids = {previous};
  for (std::size_t i = 1; i < src.size(); ++i) {
    // One in flight (the previous) while the next is posted, then the previous finishes.
    const TransferId id = h->transport->Post(Transfer(src[i], dst[i], 200 + i));
    EXPECT_TRUE(ids.insert(id).second) << "id " << id << " given twice";
    EXPECT_EQ(Wait(*h, previous), TransferStatus::kDone);
    previous = id;
  }
  EXPECT_EQ(Wait(*h, previous), TransferStatus::kDone);
  std::vector<BlockId> all_src, all_dst;
  for (std::size_t i = 0; i < src.size(); ++i) {
    all_src.insert(all_src.end(), src[i].begin(), src[i].end());
    all_dst.insert(all_dst.end(), dst[i].begin(), dst[i].end());
  }
  ExpectMoved(all_src, all_dst);
  ASSERT_EQ(h->log->records().size(), src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    const KvTransferRecord& r = h->log->records()[i];
    EXPECT_EQ(r.request, static_cast<policies::RequestId>(200 + i)) << "record " << i;
    EXPECT_EQ(r.bytes, static_cast<std::int64_t>(src[i].size()) * kBlockBytes) << "record " << i;
  }
}

TEST_P(KvTransportContract, BadTransfersFailAndMoveNothing) {
  auto h = GetParam().make(*src_, *dst_);
  ASSERT_NE(h, nullptr);
  // The block lists live here: a request's spans must outlive its Post.
  struct Bad {
    std::vector<BlockId> src, dst;
    policies::InstanceId src_instance = kPrefill;
    Bytes extra_bytes = 0;
  };
  const std::vector<Bad> bad = {
      {{0, 24}, {0, 1}},        // source block past the region
      {{0, 1}, {0, 40}},        // destination block past the region
      {{0, -1}, {0, 1}},        // negative id
      {{0, 1, 2}, {0, 1}},      // fewer destination blocks
      {{0}, {0}, 5},            // unknown source instance
      {{0}, {0}, kPrefill, 1},  // more bytes than the source blocks hold
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    KvTransferRequest t = Transfer(bad[i].src, bad[i].dst);
    t.src = bad[i].src_instance;
    t.bytes += bad[i].extra_bytes;
    EXPECT_EQ(Wait(*h, h->transport->Post(t)), TransferStatus::kFailed) << "case " << i;
  }
  ExpectMoved({}, {});
  ASSERT_EQ(h->log->records().size(), bad.size());
  for (const KvTransferRecord& r : h->log->records()) {
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.error.empty());
    EXPECT_EQ(r.bytes, 0);
  }
}

}  // namespace duet::backend::contract
