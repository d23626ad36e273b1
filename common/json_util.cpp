// Implementation of the JSON field helpers: one wording for every "missing/bad field" error.
#include "common/json_util.h"

#include <fstream>
#include <sstream>

namespace duet {
namespace {

Status FieldError(const std::string& where, const std::string& key, const std::string& what) {
  return Status::Error(where + ": field '" + key + "' " + what);
}

}  // namespace

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Re-parse with exceptions only to recover the position for the message; the exception
    // never leaves this function.
    try {
      [[maybe_unused]] const auto reparsed = nlohmann::json::parse(buffer.str());
    } catch (const nlohmann::json::parse_error& e) {
      return Status::Error(path + ": invalid JSON: " + e.what());
    }
    return Status::Error(path + ": invalid JSON");
  }
  if (!doc.is_object()) return Status::Error(path + ": top level must be a JSON object");
  return doc;
}

Result<double> JsonNumber(const nlohmann::json& obj, const std::string& key,
                          const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return FieldError(where, key, "is missing");
  if (!it->is_number()) return FieldError(where, key, "must be a number");
  return it->get<double>();
}

Result<double> JsonNumberOr(const nlohmann::json& obj, const std::string& key, double fallback,
                            const std::string& where) {
  if (!obj.contains(key)) return fallback;
  return JsonNumber(obj, key, where);
}

Result<std::int64_t> JsonInt(const nlohmann::json& obj, const std::string& key,
                             const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return FieldError(where, key, "is missing");
  if (!it->is_number_integer()) return FieldError(where, key, "must be an integer");
  return it->get<std::int64_t>();
}

Result<std::int64_t> JsonIntOr(const nlohmann::json& obj, const std::string& key,
                               std::int64_t fallback, const std::string& where) {
  if (!obj.contains(key)) return fallback;
  return JsonInt(obj, key, where);
}

Result<std::string> JsonString(const nlohmann::json& obj, const std::string& key,
                               const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return FieldError(where, key, "is missing");
  if (!it->is_string()) return FieldError(where, key, "must be a string");
  return it->get<std::string>();
}

Result<std::string> JsonStringOr(const nlohmann::json& obj, const std::string& key,
                                 const std::string& fallback, const std::string& where) {
  if (!obj.contains(key)) return fallback;
  return JsonString(obj, key, where);
}

Result<bool> JsonBoolOr(const nlohmann::json& obj, const std::string& key, bool fallback,
                        const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_boolean()) return FieldError(where, key, "must be true or false");
  return it->get<bool>();
}

}  // namespace duet
