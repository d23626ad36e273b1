// Implementation of the JSON field helpers: one wording for every "missing/bad field" error,
// and one rule for null (absent).
#include "common/json_util.h"

#include "common/text.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace duet {

Status ForEachJsonLine(
    std::string_view text, const std::string& where,
    const std::function<Status(const nlohmann::json& doc, const std::string& at)>& each) {
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string at = where + ":" + std::to_string(line_number);
    const nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return Status::Error(at + ": not valid JSON: " + Excerpt(line, 60));
    DUET_RETURN_IF_ERROR(each(doc, at));
  }
  return Status::Ok();
}

Status FieldError(const std::string& where, const std::string& key, const std::string& what) {
  return Status::Error(where + ": field '" + key + "' " + what);
}

std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size());
  if (value.is_object()) return "an object";
  // Scalars only (no recursion). MessagePack strings need not be UTF-8: replace bad bytes.
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr std::size_t kMaxChars = 80;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

bool JsonHas(const nlohmann::json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it != obj.end() && !it->is_null();
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::Error(path + ": is a directory, not a JSON file");
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Re-parse with exceptions only to recover the position for the message; the exception
    // (a parse error, or a number too large for a double) never leaves this function.
    try {
      [[maybe_unused]] const auto reparsed = nlohmann::json::parse(buffer.str());
    } catch (const nlohmann::json::exception& e) {
      return Status::Error(path + ": invalid JSON: " + Excerpt(e.what(), 200));
    }
    return Status::Error(path + ": invalid JSON");
  }
  if (!doc.is_object()) return Status::Error(path + ": top level must be a JSON object");
  return doc;
}

Result<double> JsonNumber(const nlohmann::json& obj, const std::string& key,
                          const std::string& where) {
  if (!JsonHas(obj, key)) return FieldError(where, key, "is missing");
  const nlohmann::json& value = obj.at(key);
  if (!value.is_number()) return FieldError(where, key, "must be a number");
  return value.get<double>();
}

Result<double> JsonNumberOr(const nlohmann::json& obj, const std::string& key, double fallback,
                            const std::string& where) {
  if (!JsonHas(obj, key)) return fallback;
  return JsonNumber(obj, key, where);
}

Result<std::int64_t> JsonInt(const nlohmann::json& obj, const std::string& key,
                             const std::string& where) {
  if (!JsonHas(obj, key)) return FieldError(where, key, "is missing");
  const nlohmann::json& value = obj.at(key);
  if (!value.is_number_integer()) return FieldError(where, key, "must be an integer");
  return value.get<std::int64_t>();
}

Result<std::int64_t> JsonIntOr(const nlohmann::json& obj, const std::string& key,
                               std::int64_t fallback, const std::string& where) {
  if (!JsonHas(obj, key)) return fallback;
  return JsonInt(obj, key, where);
}

Result<std::string> JsonString(const nlohmann::json& obj, const std::string& key,
                               const std::string& where) {
  if (!JsonHas(obj, key)) return FieldError(where, key, "is missing");
  const nlohmann::json& value = obj.at(key);
  if (!value.is_string()) return FieldError(where, key, "must be a string");
  return value.get<std::string>();
}

Result<std::string> JsonStringOr(const nlohmann::json& obj, const std::string& key,
                                 const std::string& fallback, const std::string& where) {
  if (!JsonHas(obj, key)) return fallback;
  return JsonString(obj, key, where);
}

Result<bool> JsonBoolOr(const nlohmann::json& obj, const std::string& key, bool fallback,
                        const std::string& where) {
  if (!JsonHas(obj, key)) return fallback;
  const nlohmann::json& value = obj.at(key);
  if (!value.is_boolean()) return FieldError(where, key, "must be true or false");
  return value.get<bool>();
}

Result<std::int64_t> JsonIntIn(const nlohmann::json& obj, const std::string& key, std::int64_t lo,
                               std::int64_t hi, const std::string& where,
                               std::optional<std::int64_t> fallback) {
  if (!JsonHas(obj, key)) {
    if (fallback) return *fallback;
    return FieldError(where, key, "is missing");
  }
  const nlohmann::json& value = obj.at(key);
  if (!value.is_number_integer()) {
    return FieldError(where, key, "must be an integer (got " + DescribeJson(value) + ")");
  }
  // nlohmann keeps non-negative integers unsigned: compare those as unsigned, so values above
  // INT64_MAX are out of range instead of wrapping to negative numbers.
  const bool in_range = value.is_number_unsigned()
                            ? hi >= 0 && value.get<std::uint64_t>() <= std::uint64_t(hi) &&
                                  std::int64_t(value.get<std::uint64_t>()) >= lo
                            : value.get<std::int64_t>() >= lo && value.get<std::int64_t>() <= hi;
  if (!in_range) {
    return FieldError(where, key,
                      "must be an integer between " + std::to_string(lo) + " and " +
                          std::to_string(hi) + " (got " + DescribeJson(value) + ")");
  }
  return value.get<std::int64_t>();
}

Result<double> JsonNumberIn(const nlohmann::json& obj, const std::string& key, double lo, double hi,
                            const std::string& where, std::optional<double> fallback) {
  if (!JsonHas(obj, key)) {
    if (fallback) return *fallback;
    return FieldError(where, key, "is missing");
  }
  const nlohmann::json& value = obj.at(key);
  if (!value.is_number()) {
    return FieldError(where, key, "must be a number (got " + DescribeJson(value) + ")");
  }
  const double v = value.get<double>();
  if (!(v >= lo && v <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "must be a number between %g and %g (got ", lo, hi);
    return FieldError(where, key, range + DescribeJson(value) + ")");
  }
  return v;
}

}  // namespace duet
