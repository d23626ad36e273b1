// Routing policies: round-robin, least outstanding work, power-of-two choices, and
// prefix-cache-aware (longest cached prefix balanced against queued prefill work).
#include "policies/router.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace duet::policies {

Result<RouterKind> ParseRouterKind(const std::string& name) {
  if (name == "round-robin") return RouterKind::kRoundRobin;
  if (name == "least-loaded") return RouterKind::kLeastLoaded;
  if (name == "power-of-two") return RouterKind::kPowerOfTwo;
  if (name == "prefix-aware") return RouterKind::kPrefixAware;
  if (name == "cache-aware") return RouterKind::kCacheAware;
  return Status::Error(
      "unknown router '" + name +
      "' (expected round-robin, least-loaded, power-of-two, prefix-aware or cache-aware)");
}

const char* ToString(RouterKind kind) {
  switch (kind) {
    case RouterKind::kRoundRobin:
      return "round-robin";
    case RouterKind::kLeastLoaded:
      return "least-loaded";
    case RouterKind::kPowerOfTwo:
      return "power-of-two";
    case RouterKind::kPrefixAware:
      return "prefix-aware";
    case RouterKind::kCacheAware:
      return "cache-aware";
  }
  return "unknown";
}

namespace {

// Shared accounting; subclasses choose instances. Work on the prefill side is measured in
// outstanding prompt tokens (what prefill costs); on the decode side in outstanding requests
// (output lengths are unknown to a router). Ties go to the lower instance id.
class AccountingRouter : public Router {
 public:
  AccountingRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                   std::vector<InstanceId> decode_side, const CacheView* cache)
      : config_(config),
        prefill_side_(std::move(prefill_side)),
        decode_side_(std::move(decode_side)),
        cache_(cache),
        rng_(config.seed) {
    DUET_CHECK(!prefill_side_.empty());
    InstanceId max_id = 0;
    for (InstanceId i : prefill_side_) max_id = std::max(max_id, i);
    for (InstanceId i : decode_side_) max_id = std::max(max_id, i);
    counters_.resize(static_cast<std::size_t>(max_id) + 1);
    available_.assign(counters_.size(), true);
    all_prefill_ = prefill_side_;
    all_decode_ = decode_side_;
  }

  void SetAvailable(InstanceId instance, bool available) override {
    available_.at(static_cast<std::size_t>(instance)) = available;
    auto keep = [&](const std::vector<InstanceId>& all, std::vector<InstanceId>* side) {
      side->clear();
      for (InstanceId i : all) {
        if (available_[static_cast<std::size_t>(i)]) side->push_back(i);
      }
    };
    keep(all_prefill_, &prefill_side_);
    keep(all_decode_, &decode_side_);
  }

  RoutingDecision Route(const Request& request) override {
    RoutingDecision d;
    if (prefill_side_.empty() || (!all_decode_.empty() && decode_side_.empty())) {
      d.reject_reason =
          prefill_side_.empty() ? "no prefill instance is up" : "no decode instance is up";
      return d;
    }
    d.prefill = PickPrefill(request, &d);
    if (d.prefill == kNoInstance) return d;  // rejected: nothing dispatched
    d.decode = all_decode_.empty() ? d.prefill : PickDecode(request);
    auto& p = counters_[static_cast<std::size_t>(d.prefill)];
    ++p.outstanding_requests;
    p.outstanding_prefill_tokens += request.input_tokens;
    if (d.decode != d.prefill) ++counters_[static_cast<std::size_t>(d.decode)].outstanding_requests;
    return d;
  }

  void OnPrefillDone(const Request& request) override {
    auto& p = counters_[static_cast<std::size_t>(request.prefill_instance)];
    p.outstanding_prefill_tokens -= request.input_tokens;
    // In PD mode the prefill instance is done with the request once it has prefilled it.
    if (request.decode_instance != request.prefill_instance) --p.outstanding_requests;
  }

  void OnFinished(const Request& request) override {
    if (request.prefill_instance == kNoInstance) return;  // rejected before routing
    auto& d = counters_[static_cast<std::size_t>(request.decode_instance)];
    --d.outstanding_requests;
    // Finished before its prefill completed (failed): undo the prefill-side share too.
    if (request.prefill_done_s < 0) {
      auto& p = counters_[static_cast<std::size_t>(request.prefill_instance)];
      p.outstanding_prefill_tokens -= request.input_tokens;
      if (request.decode_instance != request.prefill_instance) --p.outstanding_requests;
    }
  }

  const InstanceLoadCounters& load(InstanceId instance) const override {
    return counters_.at(static_cast<std::size_t>(instance));
  }

 protected:
  // May reject instead (returns kNoInstance with decision->reject_reason set).
  virtual InstanceId PickPrefill(const Request& request, RoutingDecision* decision) = 0;
  virtual InstanceId PickDecode(const Request& request) = 0;

  // Lexicographic load keys: smaller is less loaded.
  std::pair<Tokens, std::int64_t> PrefillKey(InstanceId i) const {
    const auto& c = counters_[static_cast<std::size_t>(i)];
    return {c.outstanding_prefill_tokens, c.outstanding_requests};
  }
  std::pair<std::int64_t, Tokens> DecodeKey(InstanceId i) const {
    const auto& c = counters_[static_cast<std::size_t>(i)];
    return {c.outstanding_requests, c.outstanding_prefill_tokens};
  }
  InstanceId LeastLoadedPrefill() const {
    InstanceId best = prefill_side_.front();
    for (InstanceId i : prefill_side_) {
      if (PrefillKey(i) < PrefillKey(best)) best = i;
    }
    return best;
  }
  InstanceId LeastLoadedDecode() const {
    InstanceId best = decode_side_.front();
    for (InstanceId i : decode_side_) {
      if (DecodeKey(i) < DecodeKey(best)) best = i;
    }
    return best;
  }
  // Two distinct candidates drawn uniformly; the less loaded wins (the first on a tie).
  template <typename Key>
  InstanceId PowerOfTwo(const std::vector<InstanceId>& side, Key key) {
    if (side.size() == 1) return side.front();
    const std::uint64_t n = side.size();
    const std::uint64_t a = rng_() % n;
    const std::uint64_t b = (a + 1 + rng_() % (n - 1)) % n;
    const InstanceId x = side[a], y = side[b];
    return key(y) < key(x) ? y : x;
  }

  RouterConfig config_;
  // The instances available now, of each side (what the policies choose among).
  std::vector<InstanceId> prefill_side_;
  std::vector<InstanceId> decode_side_;
  std::vector<InstanceId> all_prefill_, all_decode_;
  std::vector<bool> available_;
  const CacheView* cache_;
  std::mt19937_64 rng_;  // the engine's bit stream is specified by the standard: portable
  std::vector<InstanceLoadCounters> counters_;
};

class RoundRobinRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  InstanceId PickPrefill(const Request&, RoutingDecision*) override {
    return prefill_side_[next_prefill_++ % prefill_side_.size()];
  }
  InstanceId PickDecode(const Request&) override {
    return decode_side_[next_decode_++ % decode_side_.size()];
  }
  std::size_t next_prefill_ = 0, next_decode_ = 0;
};

class LeastLoadedRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  InstanceId PickPrefill(const Request&, RoutingDecision*) override { return LeastLoadedPrefill(); }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

class PowerOfTwoRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  InstanceId PickPrefill(const Request&, RoutingDecision*) override {
    return PowerOfTwo(prefill_side_, [this](InstanceId i) { return PrefillKey(i); });
  }
  InstanceId PickDecode(const Request&) override {
    return PowerOfTwo(decode_side_, [this](InstanceId i) { return DecodeKey(i); });
  }
};

// Chooses the prefill instance where the request's own uncached tokens plus the prefill work
// already queued there is least: a long cached prefix wins unless that instance is busier by
// more than the prefix saves. Decode side: least loaded (no prefix reuse there).
class PrefixAwareRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  InstanceId PickPrefill(const Request& request, RoutingDecision*) override {
    InstanceId best = kNoInstance;
    Tokens best_cost = 0, best_cached = 0;
    for (InstanceId i : prefill_side_) {
      const Tokens cached = cache_->CachedPrefixTokens(i, request);
      const Tokens cost = PrefillKey(i).first + (request.input_tokens - cached);
      if (best == kNoInstance || cost < best_cost || (cost == best_cost && cached > best_cached)) {
        best = i;
        best_cost = cost;
        best_cached = cached;
      }
    }
    return best;
  }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

// In the manner of Mooncake's conductor: for every prefill instance estimate the request's
// TTFT there as the queued prefill work, plus its own tokens that no tier holds, at the
// prefill rate, plus the time to load what the lower tiers hold; choose the least. Ties go to
// the longer reuse, then the lower id. With reject_ttft_ms set, a request whose best estimate
// exceeds it is rejected at once (it could only miss its SLO and slow the others down).
class CacheAwareRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  InstanceId PickPrefill(const Request& request, RoutingDecision* decision) override {
    InstanceId best = kNoInstance;
    Seconds best_s = 0;
    Tokens best_reuse = 0;
    for (InstanceId i : prefill_side_) {
      const PrefixReuse reuse = cache_->Reuse(i, request);
      const Tokens uncached = request.input_tokens - reuse.gpu_tokens - reuse.tier_tokens;
      const Seconds est =
          static_cast<double>(PrefillKey(i).first + uncached) / config_.prefill_tokens_per_s +
          reuse.load_s;
      const Tokens reused = reuse.gpu_tokens + reuse.tier_tokens;
      if (best == kNoInstance || est < best_s || (est == best_s && reused > best_reuse)) {
        best = i;
        best_s = est;
        best_reuse = reused;
      }
    }
    decision->estimated_ttft_s = best_s;
    if (config_.reject_ttft_ms && best_s * 1e3 > *config_.reject_ttft_ms) {
      decision->reject_reason =
          "estimated TTFT over the SLO: " + std::to_string(std::lround(best_s * 1e3)) +
          " ms exceeds the TTFT SLO of " + std::to_string(std::lround(*config_.reject_ttft_ms)) +
          " ms";
      return kNoInstance;
    }
    return best;
  }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

}  // namespace

std::unique_ptr<Router> MakeRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                                   std::vector<InstanceId> decode_side, const CacheView* cache) {
  switch (config.kind) {
    case RouterKind::kRoundRobin:
      return std::make_unique<RoundRobinRouter>(config, std::move(prefill_side),
                                                std::move(decode_side), cache);
    case RouterKind::kLeastLoaded:
      return std::make_unique<LeastLoadedRouter>(config, std::move(prefill_side),
                                                 std::move(decode_side), cache);
    case RouterKind::kPowerOfTwo:
      return std::make_unique<PowerOfTwoRouter>(config, std::move(prefill_side),
                                                std::move(decode_side), cache);
    case RouterKind::kPrefixAware:
      DUET_CHECK(cache != nullptr);
      return std::make_unique<PrefixAwareRouter>(config, std::move(prefill_side),
                                                 std::move(decode_side), cache);
    case RouterKind::kCacheAware:
      DUET_CHECK(cache != nullptr && config.prefill_tokens_per_s > 0);
      return std::make_unique<CacheAwareRouter>(config, std::move(prefill_side),
                                                std::move(decode_side), cache);
  }
  return nullptr;
}

}  // namespace duet::policies
