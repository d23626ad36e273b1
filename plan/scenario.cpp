#include "plan/scenario.h"

#include <cctype>
#include <set>

#include "common/text.h"
#include "policies/metrics.h"
#include "policies/router.h"

namespace duet::plan {
namespace {

// "(a) PD + offload" -> "a-pd-offload": a directory name.
std::string Slug(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

}  // namespace

Result<Scenario> ParseScenario(const nlohmann::json& doc_value, const std::string& path) {
  const nlohmann::json* doc = &doc_value;
  Scenario s;
  auto error = [&](const std::string& field, const std::string& what) {
    return Status::Error(path + ": field '" + field + "' " + what);
  };
  // A string field of `j` (whose fields are named `prefix` + key in errors).
  auto text = [&](const nlohmann::json& j, const std::string& prefix, const std::string& key,
                  bool required, std::string* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null())
      return required ? error(prefix + key, "is missing") : Status::Ok();
    if (!it->is_string() || it->get<std::string>().empty())
      return error(prefix + key, "must be a non-empty string");
    *out = it->get<std::string>();
    return Status::Ok();
  };
  if (!doc->is_object()) return Status::Error(path + ": not a JSON object");
  DUET_RETURN_IF_ERROR(text(*doc, "", "name", false, &s.name));
  DUET_RETURN_IF_ERROR(text(*doc, "", "trace", true, &s.trace));
  DUET_RETURN_IF_ERROR(text(*doc, "", "trace_format", false, &s.trace_format));
  DUET_RETURN_IF_ERROR(text(*doc, "", "router", false, &s.router));
  DUET_RETURN_IF_ERROR(text(*doc, "", "slo", false, &s.slo));
  if (!s.router.empty() && !policies::ParseRouterKind(s.router))
    return error("router", policies::ParseRouterKind(s.router).error());
  if (!s.slo.empty() && !policies::ParseSlo(s.slo))
    return error("slo", policies::ParseSlo(s.slo).error());
  auto rates = doc->find("rate_scales");
  if (rates == doc->end() || !rates->is_array() || rates->empty() || rates->size() > 1000)
    return error("rate_scales", "must be an array of 1 to 1000 numbers");
  for (const auto& r : *rates) {
    if (!r.is_number() || !(r.get<double>() > 0 && r.get<double>() <= 1000))
      return error("rate_scales", "holds " + r.dump() + ", not a number in (0, 1000]");
    s.rate_scales.push_back(r.get<double>());
  }
  auto setups = doc->find("setups");
  if (setups == doc->end() || !setups->is_array() || setups->empty() || setups->size() > 10000)
    return error("setups", "must be an array of 1 to 10000 setups");
  std::set<std::string> slugs;
  for (std::size_t k = 0; k < setups->size(); ++k) {
    const nlohmann::json& j = (*setups)[k];
    const std::string where = "setups[" + std::to_string(k) + "]";
    if (!j.is_object()) return error(where, "must be an object");
    Setup setup;
    DUET_RETURN_IF_ERROR(text(j, where + ".", "name", true, &setup.name));
    DUET_RETURN_IF_ERROR(text(j, where + ".", "cluster", true, &setup.cluster));
    DUET_RETURN_IF_ERROR(text(j, where + ".", "router", false, &setup.router));
    if (!setup.router.empty() && !policies::ParseRouterKind(setup.router))
      return error(where + ".router", policies::ParseRouterKind(setup.router).error());
    if (setup.name.find_first_of("\"\n\r") != std::string::npos)
      return error(where + ".name", "may not hold quotes or line breaks (it is a CSV cell)");
    if (auto patch = j.find("patch"); patch != j.end() && !patch->is_null()) {
      if (!patch->is_array() || patch->size() > 1000)
        return error(where + ".patch", "must be an array of at most 1000 JSON Patch operations");
      for (const auto& op : *patch) {
        if (!op.is_object() || !op.contains("op") || !op["op"].is_string() ||
            !op.contains("path") || !op["path"].is_string())
          return error(where + ".patch",
                       "holds " + Excerpt(op.dump()) + ", not an operation with op and path");
      }
      setup.patch = *patch;
    }
    setup.slug = Slug(setup.name);
    if (setup.slug.empty()) return error(where + ".name", "needs a letter or digit");
    if (!slugs.insert(setup.slug).second)
      return error(where + ".name", "'" + setup.name + "' names the same directory as another");
    s.setups.push_back(setup);
  }
  return s;
}

}  // namespace duet::plan
