// summary.json and requests.csv as METRICS.md defines them.
#include "policies/metrics.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace duet::policies {

double Round(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

nlohmann::json ToJson(const Distribution& d, bool none_completed) {
  if (none_completed && d.count == 0) {
    return {
        {"mean", nullptr}, {"p50", nullptr}, {"p90", nullptr}, {"p99", nullptr}, {"max", nullptr}};
  }
  return {{"mean", Round(d.mean, 3)},
          {"p50", Round(d.p50, 3)},
          {"p90", Round(d.p90, 3)},
          {"p99", Round(d.p99, 3)},
          {"max", Round(d.max, 3)}};
}

namespace {

// printf's "%.*f" (both round the exact binary value correctly), without its format parsing:
// requests.csv has a dozen of these per request.
std::string Fixed(double x, int digits) {
  char buf[64];
  const auto [end, error] =
      std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed, digits);
  if (error == std::errc() && std::isfinite(x)) return std::string(buf, end);
  char big[400];
  std::snprintf(big, sizeof big, "%.*f", digits, x);
  return big;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// The records of a CSV text (RFC 4180: a quoted field may hold commas, quotes doubled and line
// breaks), each a list of fields.
std::vector<std::vector<std::string>> CsvRecords(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record(1);
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') {
        record.back() += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        record.back() += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      record.emplace_back();
    } else if (c == '\n') {
      records.push_back(std::move(record));
      record.assign(1, "");
    } else if (c != '\r') {
      record.back() += c;
    }
  }
  if (record.size() > 1 || !record.front().empty()) records.push_back(std::move(record));
  return records;
}

double Ms(Seconds s) { return s * 1000.0; }
double TtftMs(const FinishedRequest& r) { return Ms(r.first_token_s - r.arrival_s); }
// Time to second token, as AIPerf defines it: the first token to the second.
double TtstMs(const FinishedRequest& r) { return Ms(r.second_token_s - r.first_token_s); }
double E2eMs(const FinishedRequest& r) { return Ms(r.finished_s - r.arrival_s); }
bool HasTpot(const FinishedRequest& r) { return r.output_tokens > 1; }
Tokens TierHitTokens(const FinishedRequest& r) {
  return r.tier_hit_tokens[0] + r.tier_hit_tokens[1] + r.tier_hit_tokens[2];
}
// TTFT = frontend + queue + load + prefill + transfer, for a request that produced its first
// token: frontend: arrival to the hand-over to the engines; queue: then to admission; load: waiting
// for its cached prefix to load from the lower tiers (what computation did not hide); prefill: the
// rest until the first token was sampled; transfer: PD, until the KV is usable on the decode
// instance.
struct TtftParts {
  double frontend_ms, queue_ms, load_ms, prefill_ms, transfer_ms;
};
TtftParts TtftBreakdown(const FinishedRequest& r) {
  return {Ms(r.frontend_s), Ms(r.first_scheduled_s - r.arrival_s - r.frontend_s), Ms(r.load_wait_s),
          Ms(r.prefill_done_s - r.first_scheduled_s - r.load_wait_s),
          Ms(r.first_token_s - r.prefill_done_s)};
}
const char* const kTierNames[kNumLowerTiers] = {"dram", "ssd", "remote"};

// Reasons read "<class>: <detail>"; the summary counts by class, requests.csv keeps the rest.
std::string ReasonClass(const std::string& reason) { return reason.substr(0, reason.find(": ")); }
double TpotMs(const FinishedRequest& r) {
  return (E2eMs(r) - TtftMs(r)) / static_cast<double>(r.output_tokens - 1);
}

}  // namespace

bool Slo::Met(const FinishedRequest& r) const {
  if (r.state != RequestState::kCompleted) return false;
  if (ttft_ms && TtftMs(r) > *ttft_ms) return false;
  if (tpot_ms && HasTpot(r) && TpotMs(r) > *tpot_ms) return false;
  if (e2e_ms && E2eMs(r) > *e2e_ms) return false;
  return true;
}

Result<Slo> ParseSlo(const std::string& text) {
  Slo slo;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      return Status::Error("--slo: '" + item + "' is not KEY=MILLISECONDS (keys: ttft, tpot, e2e)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    double ms = 0;
    std::size_t used = 0;
    try {
      ms = std::stod(value, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != value.size() || !std::isfinite(ms) || ms <= 0)
      return Status::Error("--slo: value of '" + key + "' must be a positive number of ms, got '" +
                           value + "'");
    std::optional<double>* slot = key == "ttft"   ? &slo.ttft_ms
                                  : key == "tpot" ? &slo.tpot_ms
                                  : key == "e2e"  ? &slo.e2e_ms
                                                  : nullptr;
    if (!slot) return Status::Error("--slo: unknown key '" + key + "' (keys: ttft, tpot, e2e)");
    if (slot->has_value()) return Status::Error("--slo: '" + key + "' given twice");
    *slot = ms;
  }
  if (!slo.any()) return Status::Error("--slo: no objective given (e.g. ttft=2000,tpot=100)");
  return slo;
}

namespace {

using Sample = WeightedSamples::Sample;

// The values at the 0-based ranks [rank, rank_end) (ascending) of the expanded multiset of
// [first, last), whose first element has rank `base`, into out[...]. Reorders the samples
// (a multi-rank quickselect: one partition serves every rank, and only the sides holding a
// rank are refined), so a few percentiles of millions of samples cost a few passes, not a sort.
template <typename It>
void SelectRanks(It first, It last, std::int64_t base, const std::int64_t* rank,
                 const std::int64_t* rank_end, double* out) {
  while (rank != rank_end) {
    if (last - first <= 32) {
      std::sort(first, last, [](const Sample& a, const Sample& b) { return a.value < b.value; });
      std::int64_t seen = base;
      for (It it = first; it != last && rank != rank_end; ++it) {
        seen += it->count;
        while (rank != rank_end && *rank < seen) {
          *out++ = it->value;
          ++rank;
        }
      }
      return;
    }
    const double a = first->value, b = first[(last - first) / 2].value, c = last[-1].value;
    const double pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    It mid1 = std::partition(first, last, [&](const Sample& x) { return x.value < pivot; });
    It mid2 = std::partition(mid1, last, [&](const Sample& x) { return !(pivot < x.value); });
    std::int64_t less = 0, equal = 0;
    for (It it = first; it != mid1; ++it) less += it->count;
    for (It it = mid1; it != mid2; ++it) equal += it->count;
    // Ranks below the pivot's run: recurse into the left part; at the pivot: done; above:
    // continue with the right part.
    const std::int64_t* split = std::lower_bound(rank, rank_end, base + less);
    if (split != rank) {
      const std::ptrdiff_t k = split - rank;
      SelectRanks(first, mid1, base, rank, split, out);
      rank = split;
      out += k;
    }
    while (rank != rank_end && *rank < base + less + equal) {
      *out++ = pivot;
      ++rank;
    }
    first = mid2;
    base += less + equal;
  }
}

}  // namespace

void WeightedSamples::Add(double value, std::int64_t count) {
  if (count <= 0) return;  // no sample: it must not move the max either
  // Counts are batch sizes; a larger one (never seen) takes several entries.
  while (count > 0) {
    const auto c = static_cast<std::int32_t>(
        std::min<std::int64_t>(count, std::numeric_limits<std::int32_t>::max()));
    samples_.push_back({value, c});
    count -= c;
    n_ += c;
    sum_ += value * static_cast<double>(c);
  }
  max_ = std::max(max_, value);
}

// Mean, percentiles (linear interpolation between order statistics) and max; the count, sum
// and max were accumulated as the samples arrived, in their order.
Distribution WeightedSamples::Summarize() {
  Distribution d;
  if (n_ == 0) return d;
  d.count = static_cast<std::size_t>(n_);
  d.mean = sum_ / static_cast<double>(n_);
  d.max = max_;
  const double ps[3] = {0.50, 0.90, 0.99};
  std::int64_t ranks[6];
  double fracs[3];
  for (int i = 0; i < 3; ++i) {
    const double pos = ps[i] * static_cast<double>(n_ - 1);
    const auto lo = static_cast<std::int64_t>(std::floor(pos));
    fracs[i] = pos - static_cast<double>(lo);
    ranks[2 * i] = lo;
    ranks[2 * i + 1] = std::min(lo + 1, n_ - 1);
  }
  std::int64_t sorted[6];
  std::copy(std::begin(ranks), std::end(ranks), sorted);
  std::sort(std::begin(sorted), std::end(sorted));
  double values[6];
  SelectRanks(samples_.begin(), samples_.end(), 0, sorted, sorted + 6, values);
  auto at = [&](std::int64_t k) {
    return values[std::lower_bound(std::begin(sorted), std::end(sorted), k) - sorted];
  };
  double* pct[3] = {&d.p50, &d.p90, &d.p99};
  for (int i = 0; i < 3; ++i) {
    const double lo = at(ranks[2 * i]);
    *pct[i] = fracs[i] == 0 ? lo : lo + (at(ranks[2 * i + 1]) - lo) * fracs[i];
  }
  return d;
}

Distribution SummarizeWeighted(std::vector<std::pair<double, std::int64_t>> samples) {
  WeightedSamples w;
  for (const auto& [v, c] : samples) w.Add(v, c);
  return w.Summarize();
}

Distribution Summarize(std::vector<double> values) {
  std::vector<std::pair<double, std::int64_t>> samples;
  samples.reserve(values.size());
  for (double v : values) samples.emplace_back(v, 1);
  return SummarizeWeighted(std::move(samples));
}

FinishedRequest FinishedRequest::Of(const RequestSpec& spec, const RequestRecord& record) {
  FinishedRequest f;
  static_cast<RequestRecord&>(f) = record;
  f.id = spec.id;
  f.arrival_s = spec.arrival_s;
  f.frontend_s = spec.frontend_s;
  f.input_tokens = spec.input_tokens;
  f.output_tokens =
      record.finish_reason == FinishReason::kStop ? record.generated_tokens : spec.output_tokens;
  f.session = spec.session;
  return f;
}

void MetricsCollector::OnFinished(const RequestSpec& spec, const RequestRecord& record) {
  records_.push_back(FinishedRequest::Of(spec, record));
}

void MetricsCollector::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  gaps_ms_.Add(Ms(gap_s), count);
}

void MetricsCollector::OnPreempted(const RequestSpec&, const RequestRecord&, InstanceId) {
  ++preemptions_;
}

nlohmann::json MetricsCollector::Summary(std::size_t total_requests, const Slo& slo) const {
  std::size_t completed = 0, rejected = 0, failed = 0, met = 0;
  std::map<std::string, std::int64_t> rejected_reasons, failed_reasons;
  std::vector<double> ttft, ttst, tpot, e2e, queue, transfer_ms;
  std::array<std::vector<double>, KvTransferParts::kNames.size()> transfer_parts;
  // Per session: output tokens of its completed requests, first arrival, last finish.
  struct SessionSpan {
    Tokens output_tokens = 0;
    Seconds first_arrival_s = std::numeric_limits<double>::infinity(), last_finish_s = 0;
  };
  std::map<std::int64_t, SessionSpan> sessions;
  std::vector<double> part_frontend, part_queue, part_load, part_prefill, part_transfer;
  Tokens lookup = 0, hit = 0, output_tokens = 0, total_tokens = 0;
  std::array<Tokens, kNumLowerTiers> tier_hit{};
  Bytes transfer_bytes = 0;
  Seconds first_arrival = 0, last_finish = 0;
  bool any_arrival = false;
  for (const FinishedRequest& r : records_) {
    if (!any_arrival || r.arrival_s < first_arrival) first_arrival = r.arrival_s;
    any_arrival = true;
    // Admitted requests looked the prompt up in the prefix cache. A live run knows that every
    // completed request was admitted, but not when unless the server reports its queue time.
    if (r.first_scheduled_s >= 0 || r.state == RequestState::kCompleted) {
      lookup += r.input_tokens;
      hit += r.cached_tokens;
      for (int k = 0; k < kNumLowerTiers; ++k)
        tier_hit[static_cast<std::size_t>(k)] += r.tier_hit_tokens[static_cast<std::size_t>(k)];
    }
    if (r.first_scheduled_s >= 0) queue.push_back(Ms(r.first_scheduled_s - r.arrival_s));
    if (r.kv_ready_s >= 0) {
      transfer_ms.push_back(Ms(r.kv_ready_s - r.prefill_done_s));
      transfer_bytes += r.kv_transfer_bytes;
      if (const auto parts = KvTransferBreakdown(r)) {
        const auto seconds = parts->InOrder();
        for (std::size_t k = 0; k < seconds.size(); ++k)
          transfer_parts[k].push_back(Ms(seconds[k]));
      }
    }
    switch (r.state) {
      case RequestState::kCompleted:
        ++completed;
        ttft.push_back(TtftMs(r));
        if (r.second_token_s >= 0) ttst.push_back(TtstMs(r));
        if (r.session >= 0) {
          SessionSpan& span = sessions[r.session];
          span.output_tokens += r.output_tokens;
          span.first_arrival_s = std::min(span.first_arrival_s, r.arrival_s);
          span.last_finish_s = std::max(span.last_finish_s, r.finished_s);
        }
        if (r.first_scheduled_s >= 0 && r.prefill_done_s >= 0) {
          const TtftParts parts = TtftBreakdown(r);
          part_frontend.push_back(parts.frontend_ms);
          part_queue.push_back(parts.queue_ms);
          part_load.push_back(parts.load_ms);
          part_prefill.push_back(parts.prefill_ms);
          part_transfer.push_back(parts.transfer_ms);
        }
        e2e.push_back(E2eMs(r));
        if (HasTpot(r)) tpot.push_back(TpotMs(r));
        output_tokens += r.output_tokens;
        total_tokens += r.input_tokens + r.output_tokens;
        last_finish = std::max(last_finish, r.finished_s);
        if (slo.any() && slo.Met(r)) ++met;
        break;
      case RequestState::kRejected:
        ++rejected;
        ++rejected_reasons[ReasonClass(r.reason)];
        break;
      default:
        ++failed;
        ++failed_reasons[ReasonClass(r.reason)];
        break;
    }
  }
  // Requests that never reached a final record (e.g. a run cut short) count as failed.
  if (total_requests > records_.size()) {
    const auto missing = static_cast<std::int64_t>(total_requests - records_.size());
    failed += static_cast<std::size_t>(missing);
    failed_reasons["never finished"] += missing;
  }
  const double duration_s = completed ? last_finish - first_arrival : 0.0;
  auto per_s = [&](double x) { return duration_s > 0 ? x / duration_s : 0.0; };
  const Distribution transfer = Summarize(transfer_ms);

  nlohmann::json s;
  s["schema"] = "duet.summary/1";
  s["requests"] = {{"total", total_requests},
                   {"completed", completed},
                   {"rejected", rejected},
                   {"failed", failed},
                   {"rejected_reasons", rejected_reasons},
                   {"failed_reasons", failed_reasons},
                   {"preemptions", preemptions_}};
  // With no completed request there is no latency: distributions are null, not 0.
  const bool none = completed == 0;
  const nlohmann::json transfer_json = ToJson(transfer, none);
  s["duration_s"] = Round(duration_s, 6);
  s["ttft_ms"] = ToJson(Summarize(ttft), none);
  s["ttst_ms"] = ToJson(Summarize(ttst), none);
  s["tpot_ms"] = ToJson(Summarize(tpot), none);
  s["itl_ms"] = ToJson(gaps_ms_.Summarize(), none);
  s["e2e_ms"] = ToJson(Summarize(e2e), none);
  s["queue_ms"] = ToJson(Summarize(queue), none);
  s["throughput"] = {{"requests_per_s", Round(per_s(static_cast<double>(completed)), 6)},
                     {"output_tokens_per_s", Round(per_s(static_cast<double>(output_tokens)), 3)},
                     {"total_tokens_per_s", Round(per_s(static_cast<double>(total_tokens)), 3)}};
  nlohmann::json slo_json = {{"ttft_ms", slo.ttft_ms.value_or(0)},
                             {"tpot_ms", slo.tpot_ms.value_or(0)}};
  if (slo.e2e_ms) slo_json["e2e_ms"] = *slo.e2e_ms;
  s["goodput"] = {
      {"slo", slo_json},
      {"requests_per_s", Round(per_s(static_cast<double>(met)), 6)},
      {"attainment", total_requests
                         ? Round(static_cast<double>(met) / static_cast<double>(total_requests), 6)
                         : 0.0}};
  s["ttft_breakdown_ms"] = {{"frontend", ToJson(Summarize(part_frontend), none)},
                            {"queue", ToJson(Summarize(part_queue), none)},
                            {"load", ToJson(Summarize(part_load), none)},
                            {"prefill", ToJson(Summarize(part_prefill), none)},
                            {"transfer", ToJson(Summarize(part_transfer), none)}};
  auto rate = [&](Tokens t) {
    return Round(lookup ? static_cast<double>(t) / static_cast<double>(lookup) : 0.0, 6);
  };
  const Tokens gpu_hit = hit - tier_hit[0] - tier_hit[1] - tier_hit[2];
  nlohmann::json by_tier = {{"gpu", {{"hit_tokens", gpu_hit}, {"hit_rate", rate(gpu_hit)}}}};
  for (int k = 0; k < kNumLowerTiers; ++k) {
    const Tokens t = tier_hit[static_cast<std::size_t>(k)];
    by_tier[kTierNames[k]] = {{"hit_tokens", t}, {"hit_rate", rate(t)}};
  }
  s["prefix_cache"] = {{"lookup_tokens", lookup},
                       {"hit_tokens", hit},
                       {"hit_rate", rate(hit)},
                       {"by_tier", by_tier}};
  std::vector<double> session_rates;
  for (const auto& [id, span] : sessions) {
    const Seconds span_s = span.last_finish_s - span.first_arrival_s;
    if (span_s > 0) session_rates.push_back(static_cast<double>(span.output_tokens) / span_s);
  }
  s["sessions"] = {
      {"count", session_rates.size()},
      {"output_tokens_per_s", ToJson(Summarize(session_rates), session_rates.empty())}};
  s["kv_transfer"] = {{"transfers", transfer.count},
                      {"bytes", transfer_bytes},
                      {"time_ms", nlohmann::json::object()}};
  // Its parts (KvTransferBreakdown), over the transfers whose parts were stamped.
  for (std::size_t k = 0; k < transfer_parts.size(); ++k) {
    const nlohmann::json part_json = ToJson(Summarize(transfer_parts[k]), none);
    for (const char* stat : {"mean", "p50", "p99"})
      s["kv_transfer"]["parts_ms"][KvTransferParts::kNames[k]][stat] = part_json[stat];
  }
  for (const char* stat : {"mean", "p50", "p99"})
    s["kv_transfer"]["time_ms"][stat] = transfer_json[stat];
  return s;
}

Status MetricsCollector::WriteRequestsCsv(const std::string& path,
                                          const std::vector<std::string>& instance_names) const {
  std::vector<const FinishedRequest*> rows;
  rows.reserve(records_.size());
  for (const FinishedRequest& r : records_) rows.push_back(&r);
  std::sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->id < b->id; });
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  out << "request_id,arrival_s,input_tokens,output_tokens,cached_tokens,prefill_instance,"
         "decode_instance,queue_ms,ttft_ms,tpot_ms,e2e_ms,kv_transfer_ms,status,reason,"
         "gpu_hit_tokens,dram_hit_tokens,ssd_hit_tokens,remote_hit_tokens,ttft_queue_ms,"
         "ttft_load_ms,ttft_prefill_ms,ttft_transfer_ms,router_score,ttst_ms,session,"
         "ttft_frontend_ms";
  for (const char* part : KvTransferParts::kNames) out << ",kv_" << part << "_ms";
  out << '\n';
  auto name = [&](InstanceId i) {
    return i == kNoInstance ? std::string()
                            : CsvField(instance_names.at(static_cast<std::size_t>(i)));
  };
  for (const FinishedRequest* r : rows) {
    const bool done = r->state == RequestState::kCompleted;
    out << r->id << ',' << Fixed(r->arrival_s, 6) << ',' << r->input_tokens << ','
        << r->output_tokens << ',' << r->cached_tokens << ',' << name(r->prefill_instance) << ','
        << name(r->decode_instance) << ','
        << (r->first_scheduled_s >= 0 ? Fixed(Ms(r->first_scheduled_s - r->arrival_s), 3) : "")
        << ',' << (done ? Fixed(TtftMs(*r), 3) : "") << ','
        << (done && HasTpot(*r) ? Fixed(TpotMs(*r), 3) : "") << ','
        << (done ? Fixed(E2eMs(*r), 3) : "") << ','
        << (r->kv_ready_s >= 0 ? Fixed(Ms(r->kv_ready_s - r->prefill_done_s), 3) : "") << ','
        << ToString(r->state) << ',' << CsvField(r->reason) << ','
        << r->cached_tokens - TierHitTokens(*r);
    for (Tokens t : r->tier_hit_tokens) out << ',' << t;
    std::optional<TtftParts> parts;
    if (done && r->first_scheduled_s >= 0 && r->prefill_done_s >= 0) parts = TtftBreakdown(*r);
    if (parts) {
      out << ',' << Fixed(parts->queue_ms, 3) << ',' << Fixed(parts->load_ms, 3) << ','
          << Fixed(parts->prefill_ms, 3) << ',' << Fixed(parts->transfer_ms, 3);
    } else {
      out << ",,,,";
    }
    out << ',' << (r->router_score ? Fixed(*r->router_score, 3) : "") << ','
        << (done && r->second_token_s >= 0 ? Fixed(TtstMs(*r), 3) : "") << ','
        << (r->session >= 0 ? std::to_string(r->session) : "") << ','
        << (parts ? Fixed(parts->frontend_ms, 3) : "");
    const auto kv = KvTransferBreakdown(*r);
    for (std::size_t k = 0; k < KvTransferParts::kNames.size(); ++k)
      out << ',' << (kv ? Fixed(Ms(kv->InOrder()[k]), 3) : "");
    out << '\n';
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

Result<std::vector<RequestsCsvRow>> ParseRequestsCsvColumns(
    const std::string& text, const std::string& source, const std::vector<std::string>& columns) {
  const auto records = CsvRecords(text);
  if (records.empty()) return Status::Error(source + ": empty");
  const auto& header = records.front();
  const auto at = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  const std::size_t status_at = at("status");
  if (status_at == header.size())
    return Status::Error(source + ": the header has no status column");
  std::vector<std::size_t> value_at;
  for (const std::string& column : columns) {
    value_at.push_back(at(column));
    if (value_at.back() == header.size())
      return Status::Error(source + ": the header has no " + column + " column");
  }
  std::vector<RequestsCsvRow> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const auto& fields = records[r];
    if (fields.size() != header.size())
      return Status::Error(source + ": record " + std::to_string(r + 1) + " has " +
                           std::to_string(fields.size()) + " fields, the header " +
                           std::to_string(header.size()));
    if (fields[status_at] != "completed") continue;
    RequestsCsvRow& row = rows.emplace_back();
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const std::string& field = fields[value_at[c]];
      if (field.empty()) {
        row.emplace_back();
        continue;
      }
      char* end = nullptr;
      const double v = std::strtod(field.c_str(), &end);
      if (end != field.c_str() + field.size() || !std::isfinite(v))
        return Status::Error(source + ": record " + std::to_string(r + 1) + ": " + columns[c] +
                             " '" + field + "' is not a number");
      row.emplace_back(v);
    }
  }
  return rows;
}

Result<std::vector<double>> ParseRequestsCsvColumn(const std::string& text,
                                                   const std::string& source,
                                                   const std::string& column) {
  auto rows = ParseRequestsCsvColumns(text, source, {column});
  if (!rows) return rows.status();
  std::vector<double> values;
  for (const RequestsCsvRow& row : *rows)
    if (row[0]) values.push_back(*row[0]);
  return values;
}

}  // namespace duet::policies
