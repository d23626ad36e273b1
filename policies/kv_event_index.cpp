// The KV-event-fed prefix cache view (see kv_event_index.h).
#include "policies/kv_event_index.h"

namespace duet::policies {

KvEventIndex::KvEventIndex(int num_instances, Tokens block_tokens) : block_tokens_(block_tokens) {
  DUET_CHECK(num_instances > 0 && block_tokens > 0);
  cached_.reserve(static_cast<std::size_t>(num_instances));
  for (int i = 0; i < num_instances; ++i) cached_.emplace_back(kInitialEntries);
}

void KvEventIndex::Apply(InstanceId instance, std::span<const KvCacheEvent> events) {
  auto& set = cached_.at(static_cast<std::size_t>(instance));
  for (const KvCacheEvent& e : events) {
    if (e.stored) {
      set.InsertGrowing(e.hash, 0);
    } else {
      set.Erase(e.hash);
    }
  }
}

Tokens KvEventIndex::CachedPrefixTokens(InstanceId instance, const Request& request) const {
  const auto& set = cached_.at(static_cast<std::size_t>(instance));
  Tokens tokens = 0;
  for (BlockHash h : request.block_hashes) {
    if (set.Find(h) == BlockHashIndex::kAbsent) break;
    tokens += block_tokens_;
  }
  return tokens;
}

std::size_t KvEventIndex::blocks(InstanceId instance) const {
  return cached_.at(static_cast<std::size_t>(instance)).size();
}

}  // namespace duet::policies
