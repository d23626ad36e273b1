// Router / load balancer of the frontend: picks the instance that prefills a request and, in
// PD mode, the one that decodes it. Callers depend on Router; MakeRouter builds the configured
// policy. Load is the router's own accounting of what it dispatched (as real routers do);
// prefix-cache state is read through a CacheView (in a real deployment, from KV events).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/request.h"

namespace duet::policies {

enum class RouterKind { kRoundRobin, kLeastLoaded, kPowerOfTwo, kPrefixAware };
// "round-robin", "least-loaded", "power-of-two", "prefix-aware".
Result<RouterKind> ParseRouterKind(const std::string& name);
const char* ToString(RouterKind kind);

// What an instance holds in its prefix cache for a request (tokens of its prompt).
class CacheView {
 public:
  virtual ~CacheView() = default;
  virtual Tokens CachedPrefixTokens(InstanceId instance, const Request& request) const = 0;
};

struct RouterConfig {
  RouterKind kind = RouterKind::kRoundRobin;
  std::uint64_t seed = 1;  // power-of-two sampling
};

// The router's accounting of one instance.
struct InstanceLoadCounters {
  std::int64_t outstanding_requests = 0;  // dispatched, not yet handed on or finished
  Tokens outstanding_prefill_tokens = 0;  // prompt tokens dispatched, not yet prefilled
};

struct RoutingDecision {
  InstanceId prefill = kNoInstance;  // colocated: the serving instance
  InstanceId decode = kNoInstance;   // PD only; colocated: same as prefill
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
};

// `prefill_side`: instances that prefill (colocated: all instances). `decode_side`: PD decode
// instances, empty in colocated mode. `cache` may be null except for kPrefixAware.
std::unique_ptr<Router> MakeRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                                   std::vector<InstanceId> decode_side, const CacheView* cache);

}  // namespace duet::policies
