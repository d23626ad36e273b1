// Routing policies: round-robin, least outstanding work, power-of-two choices, prefix-cache-
// aware (longest cached prefix balanced against queued prefill work), cache-aware (estimated
// TTFT) and kv-aware (a weighted cost of prefill work and decode load, with a load guard).
#include "policies/router.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>
#include <utility>

namespace duet::policies {

Result<RouterKind> ParseRouterKind(const std::string& name) {
  if (name == "round-robin") return RouterKind::kRoundRobin;
  if (name == "least-loaded") return RouterKind::kLeastLoaded;
  if (name == "power-of-two") return RouterKind::kPowerOfTwo;
  if (name == "prefix-aware") return RouterKind::kPrefixAware;
  if (name == "cache-aware") return RouterKind::kCacheAware;
  if (name == "kv-aware") return RouterKind::kKvAware;
  return Status::Error("unknown router '" + name +
                       "' (expected round-robin, least-loaded, power-of-two, prefix-aware, "
                       "cache-aware or kv-aware)");
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
    case RouterKind::kKvAware:
      return "kv-aware";
  }
  return "unknown";
}

Status CheckRouterConfig(const RouterConfig& config) {
  auto check = [](double v, const char* name) -> Status {
    if (!std::isfinite(v) || v < 0)
      return Status::Error(std::string(name) + " must be a finite number >= 0, not " +
                           std::to_string(v));
    return Status::Ok();
  };
  if (config.kv.queue_weight)
    DUET_RETURN_IF_ERROR(check(*config.kv.queue_weight, "router queue weight"));
  DUET_RETURN_IF_ERROR(check(config.kv.prefill_weight, "router prefill weight"));
  DUET_RETURN_IF_ERROR(check(config.kv.decode_weight, "router decode weight"));
  DUET_RETURN_IF_ERROR(check(config.kv.interference_weight, "router interference weight"));
  DUET_RETURN_IF_ERROR(check(config.kv.footprint_weight, "router footprint weight"));
  if (!(config.kv.footprint_window_s > 0 && config.kv.footprint_window_s <= 3600))
    return Status::Error("router footprint window must be in (0, 3600] seconds, not " +
                         std::to_string(config.kv.footprint_window_s));
  DUET_RETURN_IF_ERROR(check(config.kv.temperature, "router temperature"));
  DUET_RETURN_IF_ERROR(check(config.load_guard, "router load guard"));
  DUET_RETURN_IF_ERROR(check(config.prefill_tokens_per_s, "router prefill rate"));
  if (config.load_guard > 0 && config.load_guard <= 1)
    return Status::Error(
        "router load guard must be 0 (off) or above 1 (a multiple of the mean "
        "load), not " +
        std::to_string(config.load_guard));
  if (config.kv.queue_weight == 0.0 && config.kv.decode_weight == 0)
    return Status::Error(
        "router queue and decode weights are both 0: no load to weigh, every request would go "
        "to the instance with the longest prefix");
  return Status::Ok();
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
      d.reject_reason = !prefill_side_.empty() ? "no decode instance is up"
                        : all_decode_.empty()  ? "no instance is up"  // colocated
                                               : "no prefill instance is up";
      return d;
    }
    const Pick pick = PickPrefill(request, &d);
    if (pick.instance == kNoInstance) return d;  // rejected: nothing dispatched
    d.prefill = pick.instance;
    d.score = pick.score;
    d.decode = all_decode_.empty() ? d.prefill : PickDecode(request);
    const Tokens work = pick.prefill_work >= 0 ? pick.prefill_work : request.input_tokens;
    auto& p = counters_[static_cast<std::size_t>(d.prefill)];
    ++p.outstanding_requests;
    p.outstanding_prefill_tokens += request.input_tokens;
    p.outstanding_prefill_work += work;
    auto& serving = counters_[static_cast<std::size_t>(d.decode)];
    serving.outstanding_kv_tokens += request.input_tokens;
    if (d.decode != d.prefill) ++serving.outstanding_requests;
    // Request ids are unique among requests in flight (the frontends number them).
    DUET_CHECK(prefill_work_.emplace(request.id, work).second);
    return d;
  }

  void OnPrefillDone(const RequestSpec& spec, const RequestRecord& record) override {
    auto& p = counters_[static_cast<std::size_t>(record.prefill_instance)];
    p.outstanding_prefill_tokens -= spec.input_tokens;
    p.outstanding_prefill_work -= TakePrefillWork(spec);
    // In PD mode the prefill instance is done with the request once it has prefilled it.
    if (record.decode_instance != record.prefill_instance) --p.outstanding_requests;
  }

  void OnFinished(const RequestSpec& spec, const RequestRecord& record) override {
    if (record.prefill_instance == kNoInstance) return;  // rejected before routing
    auto& d = counters_[static_cast<std::size_t>(record.decode_instance)];
    --d.outstanding_requests;
    d.outstanding_kv_tokens -= spec.input_tokens;
    // Finished before its prefill completed (failed): undo the prefill-side share too.
    if (record.prefill_done_s < 0) {
      auto& p = counters_[static_cast<std::size_t>(record.prefill_instance)];
      p.outstanding_prefill_tokens -= spec.input_tokens;
      p.outstanding_prefill_work -= TakePrefillWork(spec);
      if (record.decode_instance != record.prefill_instance) --p.outstanding_requests;
    }
    prefill_work_.erase(spec.id);
  }

  const InstanceLoadCounters& load(InstanceId instance) const override {
    return counters_.at(static_cast<std::size_t>(instance));
  }

 protected:
  struct Pick {
    InstanceId instance = kNoInstance;
    Tokens prefill_work = -1;  // tokens the instance will compute; < 0: the whole prompt
    std::optional<double> score;
  };
  // A choice of a policy that does not score: charged the whole prompt.
  static Pick Unscored(InstanceId instance) { return {instance, -1, std::nullopt}; }
  // May reject instead (returns kNoInstance with decision->reject_reason set).
  virtual Pick PickPrefill(const Request& request, RoutingDecision* decision) = 0;
  virtual InstanceId PickDecode(const Request& request) = 0;

  // The instances of `side` below the load guard (all of them with the guard off): those with
  // fewer requests in flight than load_guard times the side's mean plus one. The least loaded
  // instance always qualifies.
  const std::vector<InstanceId>& Guarded(const std::vector<InstanceId>& side) {
    if (config_.load_guard <= 0) return side;
    double sum = 0;
    for (InstanceId i : side) sum += static_cast<double>(Counters(i).outstanding_requests);
    const double limit = config_.load_guard * (sum / static_cast<double>(side.size()) + 1);
    guarded_.clear();
    for (InstanceId i : side) {
      if (static_cast<double>(Counters(i).outstanding_requests) < limit) guarded_.push_back(i);
    }
    return guarded_;
  }
  const InstanceLoadCounters& Counters(InstanceId i) const {
    return counters_[static_cast<std::size_t>(i)];
  }
  // A portable uniform draw in [0, 1): the top 53 bits of the engine's output.
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

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

 private:
  // The prefill work charged for a request, once: zero after its first call.
  Tokens TakePrefillWork(const RequestSpec& request) {
    auto it = prefill_work_.find(request.id);
    if (it == prefill_work_.end()) return 0;
    return std::exchange(it->second, 0);
  }
  std::unordered_map<RequestId, Tokens> prefill_work_;  // by request in flight
  std::vector<InstanceId> guarded_;                     // scratch for Guarded
};

class RoundRobinRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  Pick PickPrefill(const Request&, RoutingDecision*) override {
    return Unscored(prefill_side_[next_prefill_++ % prefill_side_.size()]);
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
  Pick PickPrefill(const Request&, RoutingDecision*) override {
    return Unscored(LeastLoadedPrefill());
  }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

class PowerOfTwoRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  Pick PickPrefill(const Request&, RoutingDecision*) override {
    return Unscored(PowerOfTwo(prefill_side_, [this](InstanceId i) { return PrefillKey(i); }));
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
  Pick PickPrefill(const Request& request, RoutingDecision*) override {
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
    return {best, request.input_tokens - best_cached, static_cast<double>(best_cost)};
  }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

// In the manner of Mooncake's conductor: for every prefill instance estimate the request's
// TTFT there as the queued prefill work (what the requests queued there compute after their
// cache hits), plus its own tokens that no tier there holds, at the prefill rate, plus the time
// to load what the lower tiers hold; choose the least among those under the load guard. It
// differs from prefix-aware where the tiers hold a prefix or where queued requests had hits
// (prefix-aware counts their whole prompts, and the GPU cache only). Ties go to
// the longer reuse, then the lower id. With reject_ttft_ms set, a request whose best estimate
// exceeds it is rejected at once (it could only miss its SLO and slow the others down).
class CacheAwareRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  Pick PickPrefill(const Request& request, RoutingDecision* decision) override {
    InstanceId best = kNoInstance;
    Seconds best_s = 0;
    Tokens best_reuse = 0;
    for (InstanceId i : Guarded(prefill_side_)) {
      const PrefixReuse reuse = cache_->Reuse(i, request);
      const Tokens uncached = request.input_tokens - reuse.gpu_tokens - reuse.tier_tokens;
      const Seconds est = static_cast<double>(Counters(i).outstanding_prefill_work + uncached) /
                              config_.prefill_tokens_per_s +
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
      return {};
    }
    return {best, request.input_tokens - best_reuse, best_s * 1e3};
  }
  InstanceId PickDecode(const Request&) override { return LeastLoadedDecode(); }
};

// Scores every candidate below the load guard by KvAwareWeights' cost and takes the cheapest
// (or samples by temperature). PD decode side: the least KV in flight among the guarded.
class KvAwareRouter final : public AccountingRouter {
 public:
  using AccountingRouter::AccountingRouter;

 private:
  struct Candidate {
    InstanceId instance;
    double cost;
    Tokens reused;    // prompt tokens its caches hold (all tiers)
    Tokens uncached;  // prompt tokens it would compute
  };

  Pick PickPrefill(const Request& request, RoutingDecision*) override {
    const bool colocated = all_decode_.empty();
    const KvAwareWeights& w = config_.kv;
    candidates_.clear();
    for (InstanceId i : Guarded(prefill_side_)) {
      const InstanceLoadCounters& c = Counters(i);
      const PrefixReuse reuse = cache_->Reuse(i, request);
      const Tokens reused = reuse.gpu_tokens + reuse.tier_tokens;
      const Tokens uncached = request.input_tokens - reused;
      const double queued = static_cast<double>(c.outstanding_prefill_work);
      const double prefill =
          static_cast<double>(uncached) + reuse.load_s * config_.prefill_tokens_per_s;
      const double decode =
          colocated ? static_cast<double>(c.outstanding_kv_tokens + request.input_tokens) : 0.0;
      const double interference =
          colocated ? static_cast<double>(uncached) * static_cast<double>(c.outstanding_requests)
                    : 0.0;
      candidates_.push_back({i,
                             w.QueueWeight(colocated) * queued + w.prefill_weight * prefill +
                                 w.decode_weight * decode + w.interference_weight * interference +
                                 w.footprint_weight * Footprint(i, request.arrival_s),
                             reused, uncached});
    }
    const Candidate& c = w.temperature > 0 ? Sample() : Cheapest();
    footprint_[static_cast<std::size_t>(c.instance)] += static_cast<double>(request.input_tokens);
    return {c.instance, c.uncached, c.cost};
  }

  // Prompt tokens routed to instance i, each decayed by exp(-age / footprint_window_s), as of
  // `now` (request arrivals: they do not go backwards).
  double Footprint(InstanceId i, Seconds now) {
    const auto k = static_cast<std::size_t>(i);
    if (footprint_.size() <= k) {
      footprint_.resize(k + 1, 0.0);
      footprint_as_of_s_.resize(k + 1, now);
    }
    if (now > footprint_as_of_s_[k]) {
      footprint_[k] *= std::exp(-(now - footprint_as_of_s_[k]) / config_.kv.footprint_window_s);
      footprint_as_of_s_[k] = now;
    }
    return footprint_[k];
  }

  InstanceId PickDecode(const Request&) override {
    InstanceId best = kNoInstance;
    for (InstanceId i : Guarded(decode_side_)) {
      if (best == kNoInstance || DecodeLoad(i) < DecodeLoad(best)) best = i;
    }
    return best;
  }
  std::pair<Tokens, std::int64_t> DecodeLoad(InstanceId i) const {
    return {Counters(i).outstanding_kv_tokens, Counters(i).outstanding_requests};
  }

  const Candidate& Cheapest() const {
    const Candidate* best = &candidates_.front();
    for (const Candidate& c : candidates_) {
      if (c.cost < best->cost || (c.cost == best->cost && c.reused > best->reused)) best = &c;
    }
    return *best;
  }

  const Candidate& Sample() {
    double lo = candidates_.front().cost, hi = lo;
    for (const Candidate& c : candidates_) {
      lo = std::min(lo, c.cost);
      hi = std::max(hi, c.cost);
    }
    const double span = hi > lo ? hi - lo : 1.0;
    weights_.clear();
    double total = 0;
    for (const Candidate& c : candidates_) {
      weights_.push_back(std::exp(-(c.cost - lo) / span / config_.kv.temperature));
      total += weights_.back();
    }
    double x = Uniform() * total;
    for (std::size_t k = 0; k < candidates_.size(); ++k) {
      x -= weights_[k];
      if (x < 0) return candidates_[k];
    }
    return Cheapest();  // rounding left x >= 0: the cheapest carries the most weight
  }

  std::vector<Candidate> candidates_;  // scratch, per request
  std::vector<double> weights_;
  std::vector<double> footprint_, footprint_as_of_s_;  // per instance id
};

}  // namespace

std::unique_ptr<Router> MakeRouter(const RouterConfig& config, std::vector<InstanceId> prefill_side,
                                   std::vector<InstanceId> decode_side, const CacheView* cache) {
  DUET_CHECK_MSG(CheckRouterConfig(config).ok(), CheckRouterConfig(config).message());
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
    case RouterKind::kKvAware:
      DUET_CHECK(cache != nullptr);
      return std::make_unique<KvAwareRouter>(config, std::move(prefill_side),
                                             std::move(decode_side), cache);
  }
  return nullptr;
}

}  // namespace duet::policies
