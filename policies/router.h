// Router / load balancer of the frontend: picks the instance that prefills a request and, in
// PD mode, the one that decodes it. Callers depend on Router; MakeRouter builds the configured
// policy. Load is the router's own accounting of what it dispatched (as real routers do);
// prefix-cache state is read through a CacheView (in a real deployment, from KV events).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/request.h"

namespace duet::policies {

enum class RouterKind { kRoundRobin, kLeastLoaded, kPowerOfTwo, kPrefixAware, kCacheAware };
// "round-robin", "least-loaded", "power-of-two", "prefix-aware", "cache-aware".
Result<RouterKind> ParseRouterKind(const std::string& name);
const char* ToString(RouterKind kind);

// What an instance could reuse of a request's prompt: its GPU prefix cache, then the blocks
// after that which the lower tiers it sees (node DRAM and SSD, remote store) hold.
struct PrefixReuse {
  Tokens gpu_tokens = 0;
  Tokens tier_tokens = 0;
  Seconds load_s = 0;  // estimated time to load tier_tokens into the GPU on idle paths
};

// What an instance holds in its prefix cache for a request (tokens of its prompt).
class CacheView {
 public:
  virtual ~CacheView() = default;
  virtual Tokens CachedPrefixTokens(InstanceId instance, const Request& request) const = 0;
  virtual PrefixReuse Reuse(InstanceId instance, const Request& request) const {
    return {CachedPrefixTokens(instance, request), 0, 0};
  }
};

struct RouterConfig {
  RouterKind kind = RouterKind::kRoundRobin;
  std::uint64_t seed = 1;  // power-of-two sampling
  // cache-aware: the prefill rate (tokens/s) that turns queued and uncached tokens into time.
  double prefill_tokens_per_s = 0;
  // cache-aware: reject at arrival a request whose best estimated TTFT exceeds this (ms).
  std::optional<double> reject_ttft_ms;
};

// The router's accounting of one instance.
struct InstanceLoadCounters {
  std::int64_t outstanding_requests = 0;  // dispatched, not yet handed on or finished
  Tokens outstanding_prefill_tokens = 0;  // prompt tokens dispatched, not yet prefilled
};

struct RoutingDecision {
  InstanceId prefill = kNoInstance;  // colocated: the serving instance
  InstanceId decode = kNoInstance;   // PD only; colocated: same as prefill
  std::string reject_reason;         // non-empty: rejected, no instance chosen or charged
  Seconds estimated_ttft_s = -1;     // cache-aware: the chosen instance's TTFT estimate
};

class Router {
 public:
  virtual ~Router() = default;
  // Chooses instances for `request` and counts it as dispatched to them.
  virtual RoutingDecision Route(const Request& request) = 0;
  // Accounting callbacks from the request's progress (first token, final record).
  virtual void OnPrefillDone(const Request& request) = 0;
  virtual void OnFinished(const Request& request) = 0;
  virtual const InstanceLoadCounters& load(InstanceId instance) const = 0;
  // An instance went away (a live worker process died) or came back. Route skips instances
  // that are away; with none left on a side it rejects. Every instance starts available.
  virtual void SetAvailable(InstanceId instance, bool available) = 0;
};

// `prefill_side`: instances that prefill (colocated: all instances). `decode_side`: PD decode
// instances, empty in colocated mode. `cache` may be null except for kPrefixAware and
// kCacheAware; kCacheAware needs config.prefill_tokens_per_s > 0.
std::unique_ptr<Router> MakeRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                                   std::vector<InstanceId> decode_side, const CacheView* cache);

}  // namespace duet::policies
