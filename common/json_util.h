// Helpers for reading JSON input files with errors that name the file and the field.
// Used by every JSON parser (models, clusters, synthetic trace specs, traces, the backend's
// files) so messages look alike. A field that is present but null counts as absent everywhere:
// config.json writers emit null for unset optional fields.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace duet {

// Reads and parses a JSON file; the error names the path and the parse position.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

// JSON lines: calls `each` with every non-blank line parsed and "<where>:<line number>", in
// order; stops at the first line that is not JSON ("<where>:N: not valid JSON: <excerpt>") or
// that `each` refuses, with that error.
Status ForEachJsonLine(
    std::string_view text, const std::string& where,
    const std::function<Status(const nlohmann::json& doc, const std::string& at)>& each);

// The one wording of a field error: "<where>: field '<key>' <what>".
Status FieldError(const std::string& where, const std::string& key, const std::string& what);

// A short, safe description of an untrusted value for a message: containers are named by type
// and size (dumping them would recurse as deep as the input nests), long scalars are cut.
std::string DescribeJson(const nlohmann::json& value);

// True when `obj` has `key` with a non-null value.
bool JsonHas(const nlohmann::json& obj, const std::string& key);

// Typed field access. `where` names the file (and object) for the message, e.g.
// "sim/clusters/x.json: nodes[0]". A missing (or null) required field, or a mistyped one, gives
// an error naming the field; the ...Or forms return `fallback` for a missing or null field.
Result<double> JsonNumber(const nlohmann::json& obj, const std::string& key,
                          const std::string& where);
Result<double> JsonNumberOr(const nlohmann::json& obj, const std::string& key, double fallback,
                            const std::string& where);
Result<std::int64_t> JsonInt(const nlohmann::json& obj, const std::string& key,
                             const std::string& where);
Result<std::int64_t> JsonIntOr(const nlohmann::json& obj, const std::string& key,
                               std::int64_t fallback, const std::string& where);
Result<std::string> JsonString(const nlohmann::json& obj, const std::string& key,
                               const std::string& where);
Result<std::string> JsonStringOr(const nlohmann::json& obj, const std::string& key,
                                 const std::string& fallback, const std::string& where);
Result<bool> JsonBoolOr(const nlohmann::json& obj, const std::string& key, bool fallback,
                        const std::string& where);

// An integer field in [lo, hi] ("must be an integer between lo and hi (got X)"); values beyond
// int64 are rejected, never wrapped. Missing or null: `fallback`, or an error when nullopt.
Result<std::int64_t> JsonIntIn(const nlohmann::json& obj, const std::string& key, std::int64_t lo,
                               std::int64_t hi, const std::string& where,
                               std::optional<std::int64_t> fallback = std::nullopt);

// A number field in [lo, hi] ("must be a number between lo and hi (got X)"); NaN and the
// infinities are out of range. Missing or null: `fallback`, or an error when nullopt.
Result<double> JsonNumberIn(const nlohmann::json& obj, const std::string& key, double lo, double hi,
                            const std::string& where,
                            std::optional<double> fallback = std::nullopt);

}  // namespace duet
