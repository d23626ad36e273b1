// Router / load balancer of the frontend: picks the instance that prefills a request and, in
// PD mode, the one that decodes it. Callers depend on Router; MakeRouter builds the configured
// policy. Load is the router's own accounting of what it dispatched (as real routers do);
// prefix-cache state is read through a CacheView (in a real deployment, from KV events, which
// may lag the caches).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/request.h"

namespace duet::policies {

enum class RouterKind {
  kRoundRobin,
  kLeastLoaded,
  kPowerOfTwo,
  kPrefixAware,
  kCacheAware,
  kKvAware
};
// "round-robin", "least-loaded", "power-of-two", "prefix-aware", "cache-aware", "kv-aware".
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

// The kv-aware router's cost of serving a request on a candidate instance, in tokens:
//   queue_weight        * prefill work queued there
// + prefill_weight      * (the request's prompt tokens that no cache tier there holds + the
//                          time to load what the lower tiers hold, at the prefill rate)
// + decode_weight       * (prompt tokens of the requests it serves now + this request's)
// + interference_weight * the tokens it would compute x the requests it serves now
// + footprint_weight    * prompt tokens routed there lately (decayed over footprint_window_s),
// the shape of Dynamo's and llm-d's KV-aware scorers, with terms of its own for decode stalls
// and for the cache. The decode and interference terms apply to colocated instances only.
// Queued prefill work is what the router charged at dispatch: each request's tokens that were
// not cached where it went. The decode term is the KV that the instance's decode steps read
// (PD: the decode side is chosen by it alone). A queue weight below the prefill weight keeps a
// request with the instance that holds its prefix while its queue is short, so prefixes are
// not copied across instances (which costs every later request's hits); the decode weight
// keeps hot prefixes from piling decode batches onto a few instances. On a colocated instance
// a request's prefill chunks stall every decode running there: the interference term charges
// that, so a prompt with much to compute goes where few requests would wait on it. The
// footprint estimates the working set an instance's cache must hold (what was routed there and
// will be asked for again): where no instance holds a request's prefix (a new conversation, a
// new prefix) the request goes where that working set is smallest, not merely where the queue
// is short, so caches fill evenly instead of one thrashing while another idles; its weight is
// small beside a held prefix (1,000 tokens of prefix weigh as much as a million of
// footprint). The defaults were chosen on the Mooncake conversation trace, a synthetic
// prefix-heavy one and a multi-turn one, at 1x and 4x their rates (docs/routing.md).
struct KvAwareWeights {
  // Unset: 0.25 where instances are colocated, whose queued prefill work also stalls their own
  // decode steps, and 0.1 in PD, where it only delays first tokens (docs/routing.md).
  std::optional<double> queue_weight;
  double QueueWeight(bool colocated) const { return queue_weight.value_or(colocated ? 0.25 : 0.1); }
  double prefill_weight = 1.0;
  double decode_weight = 0.1;
  double interference_weight = 0.05;
  double footprint_weight = 0.001;
  Seconds footprint_window_s = 60;  // the footprint's decay time constant, (0, 3600]
  // 0: the least cost wins (ties: longer reuse, then lower id). > 0: an instance is drawn with
  // probability proportional to exp(-c / temperature), c its cost scaled to [0, 1] over the
  // candidates (0: cheapest, 1: dearest), as Dynamo samples.
  double temperature = 0;
};

struct RouterConfig {
  RouterKind kind = RouterKind::kRoundRobin;
  std::uint64_t seed = 1;  // power-of-two and kv-aware (temperature > 0) sampling
  // cache-aware: the prefill rate (tokens/s) that turns queued and uncached tokens into time.
  // kv-aware: turns the time to load a prefix from the lower tiers into tokens (0: loads are
  // free to it).
  double prefill_tokens_per_s = 0;
  // cache-aware: reject at arrival a request whose best estimated TTFT exceeds this (ms).
  std::optional<double> reject_ttft_ms;
  KvAwareWeights kv;  // kv-aware
  // kv-aware and cache-aware, > 0: an instance serving more than load_guard times the mean
  // number of requests in flight on its side (plus one) is not a candidate, so that no
  // instance runs far above the mean however much of a prefix it holds. 0: off.
  double load_guard = 0;
};

// An error naming the field for a weight, temperature or guard that is negative or not
// finite, a load_guard in (0, 1] (it would exclude every instance), or kv-aware queue and
// decode weights that are both zero (no load term).
Status CheckRouterConfig(const RouterConfig& config);

// The router's accounting of one instance.
struct InstanceLoadCounters {
  std::int64_t outstanding_requests = 0;  // dispatched, not yet handed on or finished
  Tokens outstanding_prefill_tokens = 0;  // prompt tokens dispatched, not yet prefilled
  // Of those, the tokens the router expected to compute: each prompt less what the instance's
  // caches held for it at dispatch (cache-blind routers: the whole prompt).
  Tokens outstanding_prefill_work = 0;
  // Prompt tokens of the requests this instance serves (colocated) or decodes (PD), dispatched
  // and not finished: the KV its decode steps read, less the output so far.
  Tokens outstanding_kv_tokens = 0;
};

struct RoutingDecision {
  InstanceId prefill = kNoInstance;  // colocated: the serving instance
  InstanceId decode = kNoInstance;   // PD only; colocated: same as prefill
  std::string reject_reason;         // non-empty: rejected, no instance chosen or charged
  Seconds estimated_ttft_s = -1;     // cache-aware: the chosen instance's TTFT estimate
  // The policy's score of the chosen prefill instance (kv-aware: its cost in tokens;
  // cache-aware: estimated TTFT in ms; prefix-aware: its queued plus uncached tokens); absent
  // for policies that do not score (round-robin, least-loaded, power-of-two).
  std::optional<double> score;
};

class Router {
 public:
  virtual ~Router() = default;
  // Chooses instances for `request` and counts it as dispatched to them.
  virtual RoutingDecision Route(const Request& request) = 0;
  // Accounting callbacks from the request's progress (first token, final record), as the event
  // sink hears them.
  virtual void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) = 0;
  virtual void OnFinished(const RequestSpec& spec, const RequestRecord& record) = 0;
  virtual const InstanceLoadCounters& load(InstanceId instance) const = 0;
  // An instance went away (a live worker process died) or came back. Route skips instances
  // that are away; with none left on a side it rejects. Every instance starts available.
  virtual void SetAvailable(InstanceId instance, bool available) = 0;
};

// `prefill_side`: instances that prefill (colocated: all instances). `decode_side`: PD decode
// instances, empty in colocated mode. `cache` may be null except for kPrefixAware, kCacheAware
// and kKvAware; kCacheAware needs config.prefill_tokens_per_s > 0. `config` must pass
// CheckRouterConfig.
std::unique_ptr<Router> MakeRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                                   std::vector<InstanceId> decode_side, const CacheView* cache);

}  // namespace duet::policies
