// A router's view of the instances' GPU prefix caches built from the KV events they publish
// (EventSink::OnKvEvents), as a router in another thread or process sees them: as of each
// instance's last published iteration. Not thread-safe: the caller serializes.
#pragma once

#include <span>
#include <vector>

#include "policies/block_manager.h"
#include "policies/hash_index.h"
#include "policies/router.h"

namespace duet::policies {

class KvEventIndex final : public CacheView {
 public:
  KvEventIndex(int num_instances, Tokens block_tokens);

  // The cache of `instance` changed so, in this order.
  void Apply(InstanceId instance, std::span<const KvCacheEvent> events);
  // Tokens of the request's leading full blocks that the instance holds.
  Tokens CachedPrefixTokens(InstanceId instance, const Request& request) const override;
  std::size_t blocks(InstanceId instance) const;

 private:
  static constexpr std::int64_t kInitialEntries = 1024;  // each grows by doubling
  std::vector<BlockHashIndex> cached_;                   // per instance: the hashes (values unused)
  Tokens block_tokens_;
};

}  // namespace duet::policies
