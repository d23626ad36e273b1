// What one serving instance holds, as of its engine's last iteration: the one snapshot its
// engine makes (InstanceEngine::CurrentLoad), an engine thread publishes to the frontend, a worker
// process reports in its load messages, and the frontend sums for /metrics and /health.
#pragma once

#include <cstdint>

namespace duet::policies {

struct InstanceLoad {
  std::int64_t waiting = 0;  // queued for a (first or recomputing) prefill
  std::int64_t running = 0;  // holding KV blocks
  std::int64_t kv_blocks_used = 0;
  std::int64_t kv_blocks_free = 0;  // free plus evictable cached blocks
  std::int64_t kv_blocks_total = 0;
  // PD: KV held by a prefill instance for a pull, and leases that ended unreleased (blocks
  // freed); failed pulls, of which the decode instance recomputed some.
  std::int64_t leases_held = 0;
  std::int64_t leases_expired = 0;
  std::int64_t kv_load_failures = 0;
  std::int64_t kv_load_recomputes = 0;
  // Steps that failed (each ended its requests with an error).
  std::int64_t forward_failures = 0;

  // Field by field: the sum over instances, or a restarted worker's counters carried over.
  InstanceLoad& operator+=(const InstanceLoad& other) {
    waiting += other.waiting;
    running += other.running;
    kv_blocks_used += other.kv_blocks_used;
    kv_blocks_free += other.kv_blocks_free;
    kv_blocks_total += other.kv_blocks_total;
    leases_held += other.leases_held;
    leases_expired += other.leases_expired;
    kv_load_failures += other.kv_load_failures;
    kv_load_recomputes += other.kv_load_recomputes;
    forward_failures += other.forward_failures;
    return *this;
  }
  // Only the cumulative counters: what a replaced worker's successor adds to its own.
  InstanceLoad Counters() const {
    InstanceLoad c;
    c.leases_expired = leases_expired;
    c.kv_load_failures = kv_load_failures;
    c.kv_load_recomputes = kv_load_recomputes;
    c.forward_failures = forward_failures;
    return c;
  }
  bool operator==(const InstanceLoad&) const = default;
};

}  // namespace duet::policies
