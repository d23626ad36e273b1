// The frontend-worker messages (see wire.h). Bodies are MessagePack maps written and read with
// nlohmann_json, the project's JSON library (a compact binary form of the same values, so no
// second codec to keep); fields are read with the shared JSON helpers and bounded here.
#include "backend/cluster/wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/json_util.h"

namespace duet::backend::cluster {

using nlohmann::json;
using policies::EngineMessage;
using policies::Request;

namespace {

constexpr char kMagic[4] = {'D', 'U', 'E', 'T'};
// Bounds of what a message may say (well past anything Duet serves, far below what would
// exhaust memory or overflow arithmetic).
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 26;
constexpr std::int64_t kMaxInstance = 1 << 16;
constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 31;
constexpr std::size_t kMaxStopTokens = 4096;
constexpr std::size_t kMaxStopStrings = 256;  // of kMaxReasonBytes each
constexpr std::size_t kMaxReasonBytes = 4096;
constexpr std::size_t kMaxDescriptorBytes = 1 << 20;
constexpr double kMaxSeconds = 1e12;

void PutU16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint32_t GetU32(std::string_view b, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}
std::uint16_t GetU16(std::string_view b, std::size_t at) {
  return static_cast<std::uint16_t>(static_cast<unsigned char>(b[at]) |
                                    static_cast<unsigned char>(b[at + 1]) << 8);
}

std::string Pack(const json& j) {
  const std::vector<std::uint8_t> bytes = json::to_msgpack(j);
  return {bytes.begin(), bytes.end()};
}

// Every message, both directions, is decoded here: the bytes are walked first (no recursion),
// so the decoder below never meets a nesting deeper than kMaxNestingDepth or a length past the
// body's end.
Result<json> Unpack(std::string_view body, const char* what,
                    std::size_t max_values = std::numeric_limits<std::size_t>::max()) {
  if (body.size() > kMaxFrameBodyBytes)
    return Status::Error(std::string(what) + ": body larger than the frame bound");
  if (Status s = CheckMessagePack(body, kMaxNestingDepth, max_values); !s.ok())
    return Status::Error(std::string(what) + ": " + s.message());
  json j =
      json::from_msgpack(body.begin(), body.end(), /*strict=*/true, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(std::string(what) + ": not a MessagePack value");
  if (!j.is_object()) return Status::Error(std::string(what) + ": not a map");
  return j;
}

// Field readers that return from the enclosing function on error.
#define DUET_WIRE_TRY(var, expr)                        \
  auto var##_result = (expr);                           \
  if (!var##_result.ok()) return var##_result.status(); \
  auto var = *var##_result

Result<double> TimeField(const json& j, const std::string& key, const std::string& where,
                         std::optional<double> fallback = std::nullopt) {
  return JsonNumberIn(j, key, -kMaxSeconds, kMaxSeconds, where, fallback);
}

Result<std::string> BinaryField(const json& j, const std::string& key, std::size_t max,
                                const std::string& where) {
  if (!JsonHas(j, key)) return std::string();
  const json& v = j.at(key);
  if (!v.is_binary()) return FieldError(where, key, "must be binary (got " + DescribeJson(v) + ")");
  if (v.get_binary().size() > max)
    return FieldError(where, key, "is longer than " + std::to_string(max) + " bytes");
  return std::string(v.get_binary().begin(), v.get_binary().end());
}

// A binary field of exactly `bytes` bytes (nonces, proofs).
Result<std::string> FixedBinary(const json& j, const std::string& key, std::size_t bytes,
                                const std::string& where) {
  if (!JsonHas(j, key)) return FieldError(where, key, "is missing");
  DUET_WIRE_TRY(v, BinaryField(j, key, bytes, where));
  if (v.size() != bytes)
    return FieldError(where, key, "must be " + std::to_string(bytes) + " bytes");
  return v;
}

Result<std::string> BoundedString(const json& j, const std::string& key, std::size_t max,
                                  const std::string& where) {
  DUET_WIRE_TRY(s, JsonStringOr(j, key, "", where));
  if (s.size() > max)
    return FieldError(where, key, "is longer than " + std::to_string(max) + " bytes");
  return s;
}

// An array field of at most `max` integers in [lo, hi] (an absent field is empty).
template <typename T>
Status IntArray(const json& j, const std::string& key, std::size_t max, std::int64_t lo,
                std::int64_t hi, const std::string& where, std::vector<T>* out) {
  out->clear();
  if (!JsonHas(j, key)) return Status::Ok();
  const json& v = j.at(key);
  if (!v.is_array())
    return FieldError(where, key, "must be an array (got " + DescribeJson(v) + ")");
  if (v.size() > max)
    return FieldError(where, key, "has more than " + std::to_string(max) + " elements");
  out->reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer() ||
        (e.is_number_unsigned() && e.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
        (!e.is_number_unsigned() && (e.get<std::int64_t>() < lo || e.get<std::int64_t>() > hi))) {
      return FieldError(where, key + "[" + std::to_string(i) + "]",
                        "must be an integer between " + std::to_string(lo) + " and " +
                            std::to_string(hi) + " (got " + DescribeJson(e) + ")");
    }
    out->push_back(static_cast<T>(e.get<std::int64_t>()));
  }
  return Status::Ok();
}

// Block hashes and seeds: the whole uint64 range.
Result<std::uint64_t> U64(const json& e, const std::string& where, const std::string& key) {
  if (e.is_number_unsigned()) return e.get<std::uint64_t>();
  if (e.is_number_integer() && e.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(e.get<std::int64_t>());
  return FieldError(where, key, "must be an unsigned 64-bit integer (got " + DescribeJson(e) + ")");
}

// One field of a message part: its key, its writer and its bounded reader. Each part (a
// request's spec, record, progress and sampling; a worker's load) lists its fields once, below;
// both directions walk that list, so a field cannot be written and forgotten on the way in, or
// the other way round.
template <typename T>
struct PartField {
  const char* key;
  std::function<void(const T&, json&)> write;
  // Reads the field from `j` (a map; the field may be absent) into `t`.
  std::function<Status(const json&, const std::string& where, T&)> read;
};

// An integer (or enum) member in [lo, hi]; absent: `fallback`, or an error when nullopt.
template <typename T, typename M>
PartField<T> Int(const char* key, M T::*m, std::int64_t lo, std::int64_t hi,
                 std::optional<std::int64_t> fallback) {
  return {key, [=](const T& t, json& j) { j[key] = static_cast<std::int64_t>(t.*m); },
          [=](const json& j, const std::string& where, T& t) -> Status {
            DUET_WIRE_TRY(v, JsonIntIn(j, key, lo, hi, where, fallback));
            t.*m = static_cast<M>(v);
            return Status::Ok();
          }};
}

// A time in seconds (or any number in ±kMaxSeconds).
template <typename T>
PartField<T> Time(const char* key, double T::*m, std::optional<double> fallback) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            DUET_WIRE_TRY(v, TimeField(j, key, where, fallback));
            t.*m = v;
            return Status::Ok();
          }};
}

// A duration in seconds, in [0, kMaxSeconds].
template <typename T>
PartField<T> Duration(const char* key, double T::*m, double fallback) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            DUET_WIRE_TRY(v, JsonNumberIn(j, key, 0, kMaxSeconds, where, fallback));
            t.*m = v;
            return Status::Ok();
          }};
}

// A float member in [lo, hi], carried as a double.
template <typename T>
PartField<T> Float(const char* key, float T::*m, double lo, double hi, double fallback) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            DUET_WIRE_TRY(v, JsonNumberIn(j, key, lo, hi, where, fallback));
            t.*m = static_cast<float>(v);
            return Status::Ok();
          }};
}

// A uint64 (ids, seeds): the whole range; absent is an error, or nullopt for an optional.
template <typename T>
PartField<T> U64Field(const char* key, std::uint64_t T::*m) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            if (!JsonHas(j, key)) return FieldError(where, key, "is missing");
            DUET_WIRE_TRY(v, U64(j.at(key), where, key));
            t.*m = v;
            return Status::Ok();
          }};
}
template <typename T>
PartField<T> OptionalU64(const char* key, std::optional<std::uint64_t> T::*m) {
  return {key,
          [=](const T& t, json& j) {
            if (t.*m) j[key] = *(t.*m);
          },
          [=](const json& j, const std::string& where, T& t) -> Status {
            if (!JsonHas(j, key)) return Status::Ok();
            DUET_WIRE_TRY(v, U64(j.at(key), where, key));
            t.*m = v;
            return Status::Ok();
          }};
}

template <typename T>
PartField<T> OptionalNumber(const char* key, std::optional<double> T::*m) {
  return {key,
          [=](const T& t, json& j) {
            if (t.*m) j[key] = *(t.*m);
          },
          [=](const json& j, const std::string& where, T& t) -> Status {
            if (!JsonHas(j, key)) return Status::Ok();
            DUET_WIRE_TRY(v, TimeField(j, key, where));
            t.*m = v;
            return Status::Ok();
          }};
}

// A list of at most `max` integers in [lo, hi] (std::vector or std::array: an array's list
// may be shorter, the rest is 0); absent: empty.
template <typename T, typename L>
PartField<T> IntList(const char* key, L T::*m, std::size_t max, std::int64_t lo, std::int64_t hi) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            using E = typename L::value_type;
            std::vector<E> v;
            if (Status s = IntArray(j, key, max, lo, hi, where, &v); !s.ok()) return s;
            if constexpr (std::is_same_v<L, std::vector<E>>) {
              t.*m = std::move(v);
            } else {
              (t.*m).fill(0);
              std::copy(v.begin(), v.end(), (t.*m).begin());
            }
            return Status::Ok();
          }};
}

// A list of at most `max` elements (`what`), each read by `element` (json, where, key) ->
// Result<E>; absent: empty.
template <typename T, typename E, typename ReadElement>
PartField<T> List(const char* key, std::vector<E> T::*m, std::size_t max, const char* what,
                  ReadElement element) {
  return {key, [=](const T& t, json& j) { j[key] = t.*m; },
          [=](const json& j, const std::string& where, T& t) -> Status {
            (t.*m).clear();
            if (!JsonHas(j, key)) return Status::Ok();
            const json& v = j.at(key);
            if (!v.is_array() || v.size() > max)
              return FieldError(where, key,
                                "must be an array of at most " + std::to_string(max) + " " + what);
            for (std::size_t i = 0; i < v.size(); ++i) {
              Result<E> e = element(v[i], where, std::string(key) + "[" + std::to_string(i) + "]");
              if (!e.ok()) return e.status();
              (t.*m).push_back(std::move(*e));
            }
            return Status::Ok();
          }};
}

template <typename T>
PartField<T> String(const char* key, std::string T::*m, std::size_t max) {
  return {key, [=](const T& t, json& j) { j[key] = (t.*m).substr(0, max); },
          [=](const json& j, const std::string& where, T& t) -> Status {
            DUET_WIRE_TRY(v, BoundedString(j, key, max, where));
            t.*m = std::move(v);
            return Status::Ok();
          }};
}

template <typename T>
json PartToJson(const T& t, const std::vector<PartField<T>>& fields) {
  json j = json::object();
  for (const PartField<T>& f : fields) f.write(t, j);
  return j;
}

// Reads a part from the map `j` (absent fields take their defaults); a key no field names is
// an error, so a writer and a reader that disagree are found at once.
template <typename T>
Result<T> PartFromJson(const json& j, const std::vector<PartField<T>>& fields,
                       const std::string& where) {
  if (!j.is_object()) return Status::Error(where + ": must be a map");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (std::none_of(fields.begin(), fields.end(),
                     [&key](const PartField<T>& f) { return key == f.key; }))
      return FieldError(where, key, "is not a field of this message");
  }
  T t;
  for (const PartField<T>& f : fields) {
    if (Status s = f.read(j, where, t); !s.ok()) return s;
  }
  return t;
}

// A part nested in another under `key` (required).
template <typename T, typename M>
PartField<T> Nested(const char* key, M T::*m, const std::vector<PartField<M>>& fields) {
  return {key, [=, &fields](const T& t, json& j) { j[key] = PartToJson(t.*m, fields); },
          [=, &fields](const json& j, const std::string& where, T& t) -> Status {
            if (!JsonHas(j, key)) return FieldError(where, key, "is missing");
            DUET_WIRE_TRY(v, PartFromJson(j.at(key), fields, where + ": " + key));
            t.*m = std::move(v);
            return Status::Ok();
          }};
}

// A string of at most kMaxReasonBytes (stop strings).
Result<std::string> ShortString(const json& e, const std::string& where, const std::string& key) {
  if (!e.is_string() || e.get_ref<const std::string&>().size() > kMaxReasonBytes)
    return FieldError(where, key,
                      "must be a string of at most " + std::to_string(kMaxReasonBytes) + " bytes");
  return e.get<std::string>();
}

constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

const std::vector<PartField<policies::SamplingParams>>& SamplingFields() {
  using S = policies::SamplingParams;
  static const std::vector<PartField<S>> fields = {
      Float("temperature", &S::temperature, 0, 1e6, 0.0),
      Float("top_p", &S::top_p, 0, 1, 1.0),
      Int("top_k", &S::top_k, 0, kMaxInt32, 0),
      OptionalU64("seed", &S::seed),
      IntList("stop_token_ids", &S::stop_token_ids, kMaxStopTokens, 0, kMaxInt32),
      List("stop_strings", &S::stop_strings, kMaxStopStrings, "strings", ShortString),
  };
  return fields;
}

const std::vector<PartField<policies::RequestSpec>>& SpecFields() {
  using S = policies::RequestSpec;
  static const std::vector<PartField<S>> fields = {
      U64Field("id", &S::id),
      Time("arrival_s", &S::arrival_s, std::nullopt),
      Duration("frontend_s", &S::frontend_s, 0.0),
      Int("input_tokens", &S::input_tokens, 1, kMaxTokens, std::nullopt),
      Int("output_tokens", &S::output_tokens, 1, kMaxTokens, std::nullopt),
      List("block_hashes", &S::block_hashes, static_cast<std::size_t>(kMaxTokens), "hashes", U64),
      IntList("prompt_ids", &S::prompt_ids, static_cast<std::size_t>(kMaxTokens), 0, kMaxInt32),
      Nested("sampling", &S::sampling, SamplingFields()),
      Int("session", &S::session, -1, kMaxInt64, -1),
  };
  return fields;
}

const std::vector<PartField<policies::RequestRecord>>& RecordFields() {
  using R = policies::RequestRecord;
  static const std::vector<PartField<R>> fields = {
      Int("state", &R::state, 0, static_cast<int>(policies::RequestState::kFailed), std::nullopt),
      Int("prefill_instance", &R::prefill_instance, -1, kMaxInstance, -1),
      Int("decode_instance", &R::decode_instance, -1, kMaxInstance, -1),
      OptionalNumber("router_score", &R::router_score),
      Int("generated_tokens", &R::generated_tokens, 0, kMaxTokens, 0),
      Int("cached_tokens", &R::cached_tokens, 0, kMaxTokens, 0),
      IntList("tier_hit_tokens", &R::tier_hit_tokens, policies::kNumLowerTiers, 0, kMaxTokens),
      Int("preemptions", &R::preemptions, 0, 1 << 30, 0),
      Int("kv_transfer_bytes", &R::kv_transfer_bytes, 0, kMaxInt64, 0),
      Time("first_scheduled_s", &R::first_scheduled_s, -1.0),
      Duration("load_wait_s", &R::load_wait_s, 0.0),
      Time("prefill_done_s", &R::prefill_done_s, -1.0),
      Time("kv_arrived_s", &R::kv_arrived_s, -1.0),
      Time("kv_pull_started_s", &R::kv_pull_started_s, -1.0),
      Time("kv_ready_s", &R::kv_ready_s, -1.0),
      Time("first_token_s", &R::first_token_s, -1.0),
      Time("second_token_s", &R::second_token_s, -1.0),
      Time("last_token_s", &R::last_token_s, -1.0),
      Time("finished_s", &R::finished_s, -1.0),
      Int("finish_reason", &R::finish_reason, 0, static_cast<int>(policies::FinishReason::kError),
          0),
      String("reason", &R::reason, kMaxReasonBytes),
  };
  return fields;
}

const std::vector<PartField<policies::RequestProgress>>& ProgressFields() {
  using P = policies::RequestProgress;
  static const std::vector<PartField<P>> fields = {
      Int("prefill_target", &P::prefill_target, 0, 2 * kMaxTokens, 0),
      Int("computed_tokens", &P::computed_tokens, 0, 2 * kMaxTokens, 0),
      IntList("loading_tokens", &P::loading_tokens, policies::kNumLowerTiers, 0, kMaxTokens),
      Int("offloaded_blocks", &P::offloaded_blocks, 0, kMaxTokens, 0),
      IntList("output_ids", &P::output_ids, static_cast<std::size_t>(kMaxTokens), 0, kMaxInt32),
  };
  return fields;
}

// The load a worker reports, each field required, with the most it may say.
const std::vector<PartField<policies::InstanceLoad>>& LoadFields() {
  using L = policies::InstanceLoad;
  static const std::vector<PartField<L>> fields = {
      Int("waiting", &L::waiting, 0, kMaxLoadRequests, std::nullopt),
      Int("running", &L::running, 0, kMaxLoadRequests, std::nullopt),
      Int("kv_used", &L::kv_blocks_used, 0, kMaxLoadBlocks, std::nullopt),
      Int("kv_free", &L::kv_blocks_free, 0, kMaxLoadBlocks, std::nullopt),
      Int("kv_total", &L::kv_blocks_total, 0, kMaxLoadBlocks, std::nullopt),
      Int("leases_held", &L::leases_held, 0, kMaxLoadRequests, std::nullopt),
      Int("leases_expired", &L::leases_expired, 0, kMaxLoadCounter, std::nullopt),
      Int("load_failures", &L::kv_load_failures, 0, kMaxLoadCounter, std::nullopt),
      Int("load_recomputes", &L::kv_load_recomputes, 0, kMaxLoadCounter, std::nullopt),
      Int("forward_failures", &L::forward_failures, 0, kMaxLoadCounter, std::nullopt),
  };
  return fields;
}

// What the parts of one request must agree on (each part's fields are bounded on their own).
Status CheckRequest(const Request& r, const std::string& where) {
  const auto size = [](const auto& v) { return static_cast<std::int64_t>(v.size()); };
  const std::int64_t sequence = r.input_tokens + r.output_tokens;
  auto at_most = [&](const char* part, const char* key, std::int64_t v, std::int64_t max,
                     const char* what) -> Status {
    if (v <= max) return Status::Ok();
    return FieldError(where + ": " + part, key,
                      "must be at most " + std::string(what) + " (" + std::to_string(max) +
                          "), got " + std::to_string(v));
  };
  for (Status s : {
           at_most("spec", "block_hashes", size(r.block_hashes), r.input_tokens, "input_tokens"),
           at_most("record", "generated_tokens", r.generated_tokens, r.output_tokens,
                   "output_tokens"),
           at_most("record", "cached_tokens", r.cached_tokens, r.input_tokens, "input_tokens"),
           at_most("record", "tier_hit_tokens",
                   r.tier_hit_tokens[0] + r.tier_hit_tokens[1] + r.tier_hit_tokens[2],
                   r.cached_tokens, "cached_tokens"),
           at_most("progress", "prefill_target", r.prefill_target, sequence,
                   "input_tokens + output_tokens"),
           at_most("progress", "computed_tokens", r.computed_tokens, sequence,
                   "input_tokens + output_tokens"),
           at_most("progress", "loading_tokens", r.LoadingTokens(), r.input_tokens, "input_tokens"),
           at_most("progress", "offloaded_blocks", r.offloaded_blocks, r.input_tokens,
                   "input_tokens"),
       }) {
    if (!s.ok()) return s;
  }
  if (size(r.prompt_ids) != r.input_tokens)
    return FieldError(where + ": spec", "prompt_ids",
                      "must hold input_tokens (" + std::to_string(r.input_tokens) + ") ids, not " +
                          std::to_string(r.prompt_ids.size()));
  if (size(r.output_ids) != r.generated_tokens)
    return FieldError(where + ": progress", "output_ids",
                      "must hold generated_tokens (" + std::to_string(r.generated_tokens) +
                          ") ids, not " + std::to_string(r.output_ids.size()));
  // Checked as the engine holds them (floats), not as they arrived.
  if (auto problem = policies::CheckSampling(r.sampling))
    return FieldError(where + ": spec: sampling", problem->field, problem->message);
  return Status::Ok();
}

// A request whole: what an engine serves it from (its spec), and, for a PD hand-over, where it
// stands (its record and progress).
json RequestToJson(const Request& r) {
  return {{"spec", PartToJson(r.spec(), SpecFields())},
          {"record", PartToJson(r.record(), RecordFields())},
          {"progress", PartToJson(r.progress(), ProgressFields())}};
}

Result<Request> RequestFromJson(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::Error(where + ": must be a map");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "spec" && it.key() != "record" && it.key() != "progress")
      return FieldError(where, it.key(), "is not a part of a request (spec, record, progress)");
  }
  Request r;
  for (const char* part : {"spec", "record", "progress"}) {
    if (!JsonHas(j, part)) return FieldError(where, part, "is missing");
  }
  DUET_WIRE_TRY(spec, PartFromJson(j.at("spec"), SpecFields(), where + ": spec"));
  r.spec() = std::move(spec);
  DUET_WIRE_TRY(record, PartFromJson(j.at("record"), RecordFields(), where + ": record"));
  r.record() = std::move(record);
  DUET_WIRE_TRY(progress, PartFromJson(j.at("progress"), ProgressFields(), where + ": progress"));
  r.progress() = std::move(progress);
  if (Status s = CheckRequest(r, where); !s.ok()) return s;
  return r;
}

bool KnownKind(std::uint16_t kind) {
  switch (static_cast<MessageKind>(kind)) {
    case MessageKind::kHello:
    case MessageKind::kWelcome:
    case MessageKind::kPeer:
    case MessageKind::kEngine:
    case MessageKind::kEvents:
    case MessageKind::kHeartbeat:
    case MessageKind::kRefused:
    case MessageKind::kChallenge:
    case MessageKind::kProof:
    case MessageKind::kClockProbe:
    case MessageKind::kClockReply:
      return true;
  }
  return false;
}

// What a MessagePack type byte in 0xc0..0xdf introduces: the width of the length or count
// that follows it (0: none), the bytes of a fixed-size value, and what it holds.
enum class Holds : std::uint8_t { kNothing, kValue, kBytes, kExt, kArray, kMap };
struct TypeLayout {
  std::uint8_t length_bytes;
  std::uint8_t fixed_bytes;
  Holds holds;
};
// clang-format off
constexpr TypeLayout kTypeLayouts[32] = {
    {0, 0, Holds::kValue}, {0, 0, Holds::kNothing},               // nil, (never used)
    {0, 0, Holds::kValue}, {0, 0, Holds::kValue},                 // false, true
    {1, 0, Holds::kBytes}, {2, 0, Holds::kBytes}, {4, 0, Holds::kBytes},  // bin 8/16/32
    {1, 0, Holds::kExt}, {2, 0, Holds::kExt}, {4, 0, Holds::kExt},        // ext 8/16/32
    {0, 4, Holds::kValue}, {0, 8, Holds::kValue},                 // float 32/64
    {0, 1, Holds::kValue}, {0, 2, Holds::kValue}, {0, 4, Holds::kValue}, {0, 8, Holds::kValue},
    {0, 1, Holds::kValue}, {0, 2, Holds::kValue}, {0, 4, Holds::kValue}, {0, 8, Holds::kValue},
    {0, 2, Holds::kValue}, {0, 3, Holds::kValue}, {0, 5, Holds::kValue}, {0, 9, Holds::kValue},
    {0, 17, Holds::kValue},                                       // fixext 1/2/4/8/16 (+ type)
    {1, 0, Holds::kBytes}, {2, 0, Holds::kBytes}, {4, 0, Holds::kBytes},  // str 8/16/32
    {2, 0, Holds::kArray}, {4, 0, Holds::kArray},                 // array 16/32
    {2, 0, Holds::kMap}, {4, 0, Holds::kMap},                     // map 16/32
};
// clang-format on

// A big-endian unsigned integer of `width` bytes at `at`.
std::uint64_t BigEndian(std::string_view b, std::size_t at, int width) {
  std::uint64_t v = 0;
  for (int i = 0; i < width; ++i) v = v << 8 | static_cast<unsigned char>(b[at + i]);
  return v;
}

}  // namespace

Status CheckMessagePack(std::string_view body, int max_depth, std::size_t max_values) {
  // pending[d]: the values still to read in the container open at level d (level 0: the one
  // top-level value). A level is pushed per container, so the walk's own memory is bounded by
  // max_depth.
  std::vector<std::uint64_t> pending = {1};
  std::size_t at = 0;
  std::size_t values = 0;
  const std::size_t size = body.size();
  auto error = [&](const std::string& what) {
    return Status::Error("MessagePack at byte " + std::to_string(at) + ": " + what);
  };
  while (!pending.empty()) {
    if (pending.back() == 0) {
      pending.pop_back();
      continue;
    }
    --pending.back();
    if (at >= size) return error("the body ends inside a value");
    if (++values > max_values) return error("more than " + std::to_string(max_values) + " values");
    const auto type = static_cast<unsigned char>(body[at]);
    TypeLayout layout{0, 0, Holds::kValue};  // fixints
    std::uint64_t count = 0;                 // of a fixmap's pairs or a fixarray's values
    if (type >= 0x80 && type <= 0x8f) {
      layout.holds = Holds::kMap;
      count = type & 0x0f;
    } else if (type >= 0x90 && type <= 0x9f) {
      layout.holds = Holds::kArray;
      count = type & 0x0f;
    } else if (type >= 0xa0 && type <= 0xbf) {
      layout.fixed_bytes = type & 0x1f;  // fixstr
    } else if (type >= 0xc0 && type <= 0xdf) {
      layout = kTypeLayouts[type - 0xc0];
    }
    if (layout.holds == Holds::kNothing) return error("byte 0xc1 is not a MessagePack type");
    std::size_t header = 1 + layout.length_bytes + (layout.holds == Holds::kExt ? 1 : 0);
    if (size - at < header) return error("the body ends inside a value's header");
    if (layout.length_bytes > 0) count = BigEndian(body, at + 1, layout.length_bytes);
    at += header;
    const bool container = layout.holds == Holds::kMap || layout.holds == Holds::kArray;
    // Bytes of the value itself, or the values inside: every value takes a byte at least, so
    // a count past the bytes left is a lie the decoder would otherwise believe for as long as
    // it reads.
    const std::uint64_t payload = container                 ? 0
                                  : layout.length_bytes > 0 ? count
                                                            : layout.fixed_bytes;
    const std::uint64_t items = !container ? 0 : layout.holds == Holds::kMap ? 2 * count : count;
    if (payload > size - at)
      return error("a length of " + std::to_string(payload) + " bytes runs past the body's end");
    if (items > size - at)
      return error("a count of " + std::to_string(items) + " values runs past the body's end");
    at += static_cast<std::size_t>(payload);
    if (container) {
      if (static_cast<int>(pending.size()) > max_depth)
        return error("maps and arrays nested more than " + std::to_string(max_depth) + " deep");
      if (items > 0) pending.push_back(items);
    }
  }
  if (at != size) return error("bytes after the value");
  return Status::Ok();
}

std::string EncodeFrameHeader(MessageKind kind, std::uint32_t body_bytes) {
  std::string out(kMagic, sizeof kMagic);
  PutU16(out, kWireVersion);
  PutU16(out, static_cast<std::uint16_t>(kind));
  PutU32(out, body_bytes);
  return out;
}

Result<FrameHeader> ParseFrameHeader(std::string_view bytes) {
  if (bytes.size() != kFrameHeaderBytes)
    return Status::Error("frame header: " + std::to_string(bytes.size()) + " bytes, not 12");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return Status::Error("frame header: no DUET magic (not a Duet worker connection?)");
  FrameHeader h;
  h.version = GetU16(bytes, 4);
  if (h.version != kWireVersion) {
    return Status::Error("frame header: protocol version " + std::to_string(h.version) +
                         ", this build speaks " + std::to_string(kWireVersion));
  }
  const std::uint16_t kind = GetU16(bytes, 6);
  if (!KnownKind(kind))
    return Status::Error("frame header: unknown message kind " + std::to_string(kind));
  h.kind = static_cast<MessageKind>(kind);
  h.body_bytes = GetU32(bytes, 8);
  if (h.body_bytes > kMaxFrameBodyBytes) {
    return Status::Error("frame header: a body of " + std::to_string(h.body_bytes) +
                         " bytes, more than the " + std::to_string(kMaxFrameBodyBytes) +
                         " allowed");
  }
  return h;
}

std::string Frame(MessageKind kind, const std::string& body) {
  DUET_CHECK(body.size() <= kMaxFrameBodyBytes);
  return EncodeFrameHeader(kind, static_cast<std::uint32_t>(body.size())) + body;
}

std::string EncodeHello(const Hello& h) {
  return Pack({{"role", static_cast<int>(h.role)},
               {"pid", h.pid},
               {"num_layers", h.num_layers},
               {"vocab_size", h.vocab_size},
               {"block_tokens", h.block_tokens},
               {"kv_bytes_per_token", h.kv_bytes_per_token},
               {"max_position_embeddings", h.max_position_embeddings},
               {"num_blocks", h.num_blocks},
               {"kv", json::binary({h.kv_descriptor.begin(), h.kv_descriptor.end()})},
               {"nonce", json::binary({h.nonce.begin(), h.nonce.end()})}});
}

Result<Hello> ParseHello(std::string_view body) {
  const std::string where = "hello";
  DUET_WIRE_TRY(j, Unpack(body, "hello", kMaxHandshakeValues));
  Hello h;
  DUET_WIRE_TRY(role, JsonIntIn(j, "role", 0, 2, where));
  h.role = static_cast<policies::InstanceRole>(role);
  DUET_WIRE_TRY(pid, JsonIntIn(j, "pid", 0, std::numeric_limits<std::int32_t>::max(), where));
  h.pid = pid;
  DUET_WIRE_TRY(layers, JsonIntIn(j, "num_layers", 1, 1 << 16, where));
  h.num_layers = layers;
  DUET_WIRE_TRY(vocab, JsonIntIn(j, "vocab_size", 1, std::int64_t{1} << 31, where));
  h.vocab_size = vocab;
  DUET_WIRE_TRY(block_tokens, JsonIntIn(j, "block_tokens", 1, deploy::kMaxBlockTokens, where));
  h.block_tokens = block_tokens;
  DUET_WIRE_TRY(kv_bytes, JsonIntIn(j, "kv_bytes_per_token", 0, std::int64_t{1} << 40, where));
  h.kv_bytes_per_token = kv_bytes;
  DUET_WIRE_TRY(context, JsonIntIn(j, "max_position_embeddings", 0, kMaxTokens, where));
  h.max_position_embeddings = context;
  DUET_WIRE_TRY(blocks, JsonIntIn(j, "num_blocks", 1, kMaxBlocks, where));
  h.num_blocks = blocks;
  DUET_WIRE_TRY(kv, BinaryField(j, "kv", kMaxDescriptorBytes, where));
  h.kv_descriptor = std::move(kv);
  DUET_WIRE_TRY(nonce, FixedBinary(j, "nonce", kNonceBytes, where));
  h.nonce = std::move(nonce);
  return h;
}

std::string EncodeChallenge(const Challenge& c) {
  return Pack({{"nonce", json::binary({c.nonce.begin(), c.nonce.end()})},
               {"proof", json::binary({c.proof.begin(), c.proof.end()})}});
}

Result<Challenge> ParseChallenge(std::string_view body) {
  DUET_WIRE_TRY(j, Unpack(body, "challenge", kMaxHandshakeValues));
  Challenge c;
  DUET_WIRE_TRY(nonce, FixedBinary(j, "nonce", kNonceBytes, "challenge"));
  c.nonce = std::move(nonce);
  DUET_WIRE_TRY(proof, FixedBinary(j, "proof", kProofBytes, "challenge"));
  c.proof = std::move(proof);
  return c;
}

std::string EncodeProof(const std::string& proof) {
  return Pack({{"proof", json::binary({proof.begin(), proof.end()})}});
}

Result<std::string> ParseProof(std::string_view body) {
  DUET_WIRE_TRY(j, Unpack(body, "proof", kMaxHandshakeValues));
  return FixedBinary(j, "proof", kProofBytes, "proof");
}

std::string EncodeWelcome(const Welcome& w) {
  return Pack({{"instance", w.instance},
               {"heartbeat_interval_s", w.heartbeat_interval_s},
               {"publish_kv_events", w.publish_kv_events},
               {"engine", deploy::EngineSettingsToJson(w.engine)}});
}

Result<Welcome> ParseWelcome(std::string_view body) {
  const std::string where = "welcome";
  DUET_WIRE_TRY(j, Unpack(body, "welcome"));
  Welcome w;
  DUET_WIRE_TRY(instance, JsonIntIn(j, "instance", 0, kMaxInstance, where));
  w.instance = static_cast<policies::InstanceId>(instance);
  DUET_WIRE_TRY(heartbeat, JsonNumberIn(j, "heartbeat_interval_s", 1e-3, 3600, where));
  w.heartbeat_interval_s = heartbeat;
  DUET_WIRE_TRY(publish, JsonBoolOr(j, "publish_kv_events", false, where));
  w.publish_kv_events = publish;
  if (!JsonHas(j, "engine")) return FieldError(where, "engine", "is missing");
  DUET_WIRE_TRY(engine, deploy::ParseEngineSettings(j["engine"], where + ": engine"));
  w.engine = engine;
  return w;
}

std::string EncodePeer(const Peer& p) {
  return Pack({{"instance", p.instance},
               {"kv", json::binary({p.kv_descriptor.begin(), p.kv_descriptor.end()})}});
}

Result<Peer> ParsePeer(std::string_view body) {
  const std::string where = "peer";
  DUET_WIRE_TRY(j, Unpack(body, "peer"));
  Peer p;
  DUET_WIRE_TRY(instance, JsonIntIn(j, "instance", 0, kMaxInstance, where));
  p.instance = static_cast<policies::InstanceId>(instance);
  DUET_WIRE_TRY(kv, BinaryField(j, "kv", kMaxDescriptorBytes, where));
  p.kv_descriptor = std::move(kv);
  return p;
}

std::string EncodeEngine(const WireEngineMessage& w) {
  const EngineMessage& m = w.message;
  json j = {{"to", w.to},
            {"kind", static_cast<int>(m.kind)},
            {"from", m.from},
            {"request_id", m.request_id}};
  if (!m.blocks.empty()) j["blocks"] = m.blocks;
  if (std::isfinite(m.lease_expires_s)) j["lease_expires_s"] = m.lease_expires_s;
  if (w.request) j["request"] = RequestToJson(*w.request);
  return Pack(j);
}

Result<WireEngineMessage> ParseEngine(std::string_view body) {
  const std::string where = "engine message";
  DUET_WIRE_TRY(j, Unpack(body, "engine message"));
  WireEngineMessage w;
  DUET_WIRE_TRY(to, JsonIntIn(j, "to", -1, kMaxInstance, where));
  w.to = static_cast<policies::InstanceId>(to);
  DUET_WIRE_TRY(kind,
                JsonIntIn(j, "kind", 0, static_cast<int>(EngineMessage::Kind::kAbort), where));
  EngineMessage& m = w.message;
  m.kind = static_cast<EngineMessage::Kind>(kind);
  DUET_WIRE_TRY(from, JsonIntIn(j, "from", -1, kMaxInstance, where));
  m.from = static_cast<policies::InstanceId>(from);
  if (!JsonHas(j, "request_id")) return FieldError(where, "request_id", "is missing");
  DUET_WIRE_TRY(id, U64(j.at("request_id"), where, "request_id"));
  m.request_id = id;
  if (Status s = IntArray(j, "blocks", static_cast<std::size_t>(kMaxTokens), 0,
                          std::numeric_limits<std::int32_t>::max(), where, &m.blocks);
      !s.ok())
    return s;
  DUET_WIRE_TRY(lease, TimeField(j, "lease_expires_s", where, policies::kForever));
  m.lease_expires_s = lease;
  const bool carries_request =
      m.kind == EngineMessage::Kind::kNewRequest || m.kind == EngineMessage::Kind::kKvReady;
  if (carries_request != JsonHas(j, "request")) {
    return FieldError(where, "request",
                      carries_request ? "is missing (new requests and KV-ready carry one)"
                                      : "is only for new requests and KV-ready");
  }
  if (carries_request) {
    DUET_WIRE_TRY(r, RequestFromJson(j.at("request"), where + ": request"));
    if (r.id != m.request_id)
      return FieldError(
          where, "request",
          "names request " + std::to_string(r.id) + ", not " + std::to_string(m.request_id));
    w.request = std::move(r);
  }
  if (m.kind == EngineMessage::Kind::kKvReady && m.blocks.empty())
    return FieldError(where, "blocks", "must name the blocks holding the KV");
  return w;
}

std::string EncodeEvents(const Events& events) {
  json list = json::array();
  for (const WireEvent& e : events.events) {
    json j = {{"kind", static_cast<int>(e.kind)}, {"request_id", e.request_id}};
    switch (e.kind) {
      case WireEvent::Kind::kToken:
        j["token"] = e.token;
        break;
      case WireEvent::Kind::kTokenGaps:
        j["gap_s"] = e.gap_s;
        j["count"] = e.count;
        break;
      case WireEvent::Kind::kKvEvents: {
        json kv = json::array();
        for (const policies::KvCacheEvent& k : e.kv_events) kv.push_back({k.hash, k.stored});
        j["kv"] = std::move(kv);
        break;
      }
      default:
        break;
    }
    if (e.record) j["record"] = PartToJson(*e.record, RecordFields());
    list.push_back(std::move(j));
  }
  return Pack({{"events", std::move(list)}, {"load", PartToJson(events.load, LoadFields())}});
}

Result<Events> ParseEvents(std::string_view body) {
  const std::string where = "events";
  DUET_WIRE_TRY(j, Unpack(body, "events"));
  Events out;
  if (!JsonHas(j, "load")) return FieldError(where, "load", "is missing");
  DUET_WIRE_TRY(load, PartFromJson(j.at("load"), LoadFields(), where + ": load"));
  out.load = load;
  if (!JsonHas(j, "events") || !j.at("events").is_array())
    return FieldError(where, "events", "must be an array");
  for (std::size_t i = 0; i < j.at("events").size(); ++i) {
    const json& e = j.at("events")[i];
    const std::string ew = where + "[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::Error(ew + ": must be a map");
    WireEvent w;
    DUET_WIRE_TRY(kind, JsonIntIn(e, "kind", 0, static_cast<int>(WireEvent::Kind::kKvEvents), ew));
    w.kind = static_cast<WireEvent::Kind>(kind);
    if (!JsonHas(e, "request_id")) return FieldError(ew, "request_id", "is missing");
    DUET_WIRE_TRY(id, U64(e.at("request_id"), ew, "request_id"));
    w.request_id = id;
    switch (w.kind) {
      case WireEvent::Kind::kToken: {
        DUET_WIRE_TRY(token,
                      JsonIntIn(e, "token", 0, std::numeric_limits<std::int32_t>::max(), ew));
        w.token = static_cast<std::int32_t>(token);
        break;
      }
      case WireEvent::Kind::kTokenGaps: {
        DUET_WIRE_TRY(gap, JsonNumberIn(e, "gap_s", 0, kMaxSeconds, ew));
        w.gap_s = gap;
        DUET_WIRE_TRY(count, JsonIntIn(e, "count", 1, kMaxTokens, ew));
        w.count = count;
        break;
      }
      case WireEvent::Kind::kKvEvents: {
        if (!JsonHas(e, "kv") || !e.at("kv").is_array())
          return FieldError(ew, "kv", "must be an array");
        for (const json& k : e.at("kv")) {
          if (!k.is_array() || k.size() != 2 || !k[1].is_boolean())
            return FieldError(ew, "kv", "must hold [hash, stored] pairs");
          DUET_WIRE_TRY(hash, U64(k[0], ew, "kv"));
          w.kv_events.push_back({hash, k[1].get<bool>()});
        }
        break;
      }
      default:
        break;
    }
    const bool needs_record = w.kind == WireEvent::Kind::kPrefillDone ||
                              w.kind == WireEvent::Kind::kFinished ||
                              w.kind == WireEvent::Kind::kPreempted;
    if (needs_record) {
      if (!JsonHas(e, "record")) return FieldError(ew, "record", "is missing");
      DUET_WIRE_TRY(record, PartFromJson(e.at("record"), RecordFields(), ew + ": record"));
      w.record = std::move(record);
    }
    out.events.push_back(std::move(w));
  }
  return out;
}

std::string EncodeHeartbeat(const policies::InstanceLoad& load) {
  return Pack({{"load", PartToJson(load, LoadFields())}});
}

Result<policies::InstanceLoad> ParseHeartbeat(std::string_view body) {
  DUET_WIRE_TRY(j, Unpack(body, "heartbeat"));
  if (!JsonHas(j, "load")) return FieldError("heartbeat", "load", "is missing");
  return PartFromJson(j.at("load"), LoadFields(), "heartbeat: load");
}

// A clock's reading in nanoseconds may be any int64: a host's steady clock reads anything.
constexpr std::int64_t kAnyNsMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kAnyNsMax = std::numeric_limits<std::int64_t>::max();

std::string EncodeClockProbe(const ClockProbe& p) {
  json j = {{"sent_ns", p.sent_ns}};
  if (p.offset_ns) j["offset_ns"] = *p.offset_ns;
  if (p.error_ns) j["error_ns"] = *p.error_ns;
  return Pack(j);
}

Result<ClockProbe> ParseClockProbe(std::string_view body) {
  const std::string where = "clock probe";
  DUET_WIRE_TRY(j, Unpack(body, where.c_str()));
  ClockProbe p;
  DUET_WIRE_TRY(sent, JsonIntIn(j, "sent_ns", kAnyNsMin, kAnyNsMax, where));
  p.sent_ns = sent;
  if (JsonHas(j, "offset_ns") != JsonHas(j, "error_ns"))
    return FieldError(where, "offset_ns", "and error_ns come together or not at all");
  if (JsonHas(j, "offset_ns")) {
    DUET_WIRE_TRY(offset, JsonIntIn(j, "offset_ns", kAnyNsMin, kAnyNsMax, where));
    DUET_WIRE_TRY(error, JsonIntIn(j, "error_ns", 0, kAnyNsMax, where));
    p.offset_ns = offset;
    p.error_ns = error;
  }
  return p;
}

std::string EncodeClockReply(const ClockReply& r) {
  return Pack(
      {{"probe_sent_ns", r.probe_sent_ns}, {"received_ns", r.received_ns}, {"sent_ns", r.sent_ns}});
}

Result<ClockReply> ParseClockReply(std::string_view body) {
  const std::string where = "clock reply";
  DUET_WIRE_TRY(j, Unpack(body, where.c_str()));
  ClockReply r;
  DUET_WIRE_TRY(probe, JsonIntIn(j, "probe_sent_ns", kAnyNsMin, kAnyNsMax, where));
  r.probe_sent_ns = probe;
  DUET_WIRE_TRY(received, JsonIntIn(j, "received_ns", kAnyNsMin, kAnyNsMax, where));
  r.received_ns = received;
  DUET_WIRE_TRY(sent, JsonIntIn(j, "sent_ns", r.received_ns, kAnyNsMax, where));
  r.sent_ns = sent;
  return r;
}

std::string EncodeRefused(const Refusal& refusal) {
  return Pack(
      {{"request_id", refusal.request_id}, {"reason", refusal.reason.substr(0, kMaxReasonBytes)}});
}

Result<Refusal> ParseRefused(std::string_view body) {
  const std::string where = "refusal";
  DUET_WIRE_TRY(j, Unpack(body, "refusal"));
  Refusal r;
  if (!JsonHas(j, "request_id")) return FieldError(where, "request_id", "is missing");
  DUET_WIRE_TRY(id, U64(j.at("request_id"), where, "request_id"));
  r.request_id = id;
  DUET_WIRE_TRY(reason, BoundedString(j, "reason", kMaxReasonBytes, where));
  r.reason = std::move(reason);
  return r;
}

std::optional<policies::RequestId> EngineRequestId(std::string_view body) {
  auto j = Unpack(body, "engine message");
  if (!j.ok() || !JsonHas(*j, "request_id")) return std::nullopt;
  auto id = U64(j->at("request_id"), "engine message", "request_id");
  if (!id.ok()) return std::nullopt;
  return *id;
}

}  // namespace duet::backend::cluster
