// Short, safe descriptions of untrusted JSON values for error messages. Dumping a value
// verbatim is unsafe for input that is nested millions deep (dump recurses) or megabytes
// long, so containers are named by type and long scalars are cut.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace duet::backend {

inline std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size());
  if (value.is_object()) return "an object";
  std::string text = value.dump();  // scalars: no recursion; parsed strings are valid UTF-8
  constexpr std::size_t kMaxChars = 80;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

}  // namespace duet::backend
