// Parsing of a cluster file's deployment part (see deployment.h).
#include "deploy/deployment.h"

#include <filesystem>

#include "common/json_util.h"

namespace duet::deploy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Status ParseInstances(const json& doc, const std::string& path, Deployment& d) {
  auto inst_it = doc.find("instances");
  if (inst_it == doc.end() || inst_it->is_null())
    return FieldError(path, "instances", "is missing");
  if (!inst_it->is_array() || inst_it->empty())
    return FieldError(path, "instances", "must be a non-empty array");
  int counters[3] = {0, 0, 0};
  for (std::size_t g = 0; g < inst_it->size(); ++g) {
    const json& group = (*inst_it)[g];
    const std::string where = path + ": instances[" + std::to_string(g) + "]";
    if (!group.is_object()) return Status::Error(where + ": must be an object");
    auto role_name = JsonString(group, "role", where);
    if (!role_name) return role_name.status();
    auto role = ParseInstanceRole(*role_name);
    if (!role) return FieldError(where, "role", role.error());
    auto count = JsonIntOr(group, "count", 1, where);
    auto tp = JsonIntOr(group, "tp", 1, where);
    auto dp = JsonIntIn(group, "dp", 1, 64, where, 1);
    auto node = JsonIntOr(group, "node", -1, where);
    if (!count) return count.status();
    if (!tp) return tp.status();
    if (!dp) return dp.status();
    if (!node) return node.status();
    if (*count < 1 || *count > 100000) return FieldError(where, "count", "must be >= 1");
    if (*tp < 1 || *tp > 64) return FieldError(where, "tp", "must be in [1, 64]");
    if (*tp * *dp > 64) {
      return FieldError(where, "dp",
                        "times tp must be at most 64 GPUs (got " + std::to_string(*tp) + " * " +
                            std::to_string(*dp) + ")");
    }
    if (static_cast<std::int64_t>(d.instances.size()) + *count > kMaxInstances)
      return FieldError(where, "count",
                        "makes more than " + std::to_string(kMaxInstances) + " instances in all");
    for (std::int64_t k = 0; k < *count; ++k) {
      InstanceSpec inst;
      inst.role = *role;
      inst.tp = static_cast<int>(*tp);
      inst.dp = static_cast<int>(*dp);
      inst.node = *node;
      inst.group = g;
      inst.index = k;
      const char prefix = *role == policies::InstanceRole::kPrefill  ? 'p'
                          : *role == policies::InstanceRole::kDecode ? 'd'
                                                                     : 'c';
      inst.name = prefix + std::to_string(counters[static_cast<int>(*role)]++);
      d.instances.push_back(std::move(inst));
    }
  }
  const int p = d.CountRole(policies::InstanceRole::kPrefill);
  const int dec = d.CountRole(policies::InstanceRole::kDecode);
  const int colo = d.CountRole(policies::InstanceRole::kColocated);
  if (colo > 0 && (p > 0 || dec > 0))
    return Status::Error(path + ": instances mix colocated and prefill/decode roles");
  if ((p > 0) != (dec > 0))
    return Status::Error(path + ": PD mode needs at least one prefill and one decode instance");
  return Status::Ok();
}

}  // namespace

std::string ResolveRef(const std::string& ref, const std::string& referrer,
                       const std::string& bundled_dir, bool directories) {
  const bool json_file = ref.size() > 5 && ref.compare(ref.size() - 5, 5, ".json") == 0;
  if (json_file || (directories && ref.find('/') != std::string::npos)) {
    const fs::path p(ref);
    return p.is_absolute() ? ref : (fs::path(referrer).parent_path() / p).string();
  }
  return (fs::path(bundled_dir) / (ref + ".json")).string();
}

Result<policies::InstanceRole> ParseInstanceRole(const std::string& name) {
  if (name == "prefill") return policies::InstanceRole::kPrefill;
  if (name == "decode") return policies::InstanceRole::kDecode;
  if (name == "colocated") return policies::InstanceRole::kColocated;
  return Status::Error("must be prefill, decode or colocated, got '" + name + "'");
}

bool Deployment::pd() const { return CountRole(policies::InstanceRole::kPrefill) > 0; }

int Deployment::CountRole(policies::InstanceRole role) const {
  int n = 0;
  for (const auto& i : instances) n += i.role == role;
  return n;
}

Result<Deployment> LoadDeployment(const std::string& path, const std::string& data_dir) {
  auto doc = ReadJsonFile(path);
  if (!doc) return doc.status();
  return ParseDeployment(*doc, path, data_dir);
}

namespace {

// A model reference as "model" and "draft_model" give it: a bundled name, a config.json path
// relative to the file, or a Hugging Face model directory.
Result<models::ModelSpec> LoadModelRef(const std::string& ref, const std::string& path,
                                       const std::string& data_dir) {
  return models::LoadModelSpec(ResolveRef(ref, path,
                                          (fs::path(data_dir) / "models" / "specs").string(),
                                          /*directories=*/true));
}

Result<SpeculativeSpec> ParseSpeculative(const json& doc, const std::string& path,
                                         const std::string& data_dir, const Deployment& d) {
  SpeculativeSpec spec;
  auto it = doc.find("speculative");
  if (it == doc.end() || it->is_null()) return spec;
  const std::string where = path + ": speculative";
  if (!it->is_object()) return Status::Error(where + ": must be an object");
  const json& s = *it;
  constexpr std::int64_t kMaxDraftTokens = 16;
  auto k = JsonIntIn(s, "num_speculative_tokens", 1, kMaxDraftTokens, where);
  if (!k) return k.status();
  spec.config.tokens = static_cast<int>(*k);
  if (JsonHas(s, "acceptance_rates") == JsonHas(s, "acceptance_rate"))
    return Status::Error(where + ": give one of 'acceptance_rate' and 'acceptance_rates'");
  if (JsonHas(s, "acceptance_rate")) {
    auto rate = JsonNumberIn(s, "acceptance_rate", 0, 1, where);
    if (!rate) return rate.status();
    spec.config.acceptance.assign(static_cast<std::size_t>(*k), *rate);
  } else {
    const json& rates = s.at("acceptance_rates");
    if (!rates.is_array() || rates.size() != static_cast<std::size_t>(*k))
      return FieldError(where, "acceptance_rates",
                        "must be an array of num_speculative_tokens (" + std::to_string(*k) +
                            ") numbers (got " + DescribeJson(rates) + ")");
    for (std::size_t i = 0; i < rates.size(); ++i) {
      const json& rate = rates[i];
      if (!rate.is_number() || !(rate.get<double>() >= 0 && rate.get<double>() <= 1))
        return FieldError(where, "acceptance_rates[" + std::to_string(i) + "]",
                          "must be a number between 0 and 1 (got " + DescribeJson(rate) + ")");
      spec.config.acceptance.push_back(rate.get<double>());
    }
  }
  auto method = JsonString(s, "method", where);
  if (!method) return method.status();
  if (*method == "mtp") {
    if (d.model.mtp_layers == 0)
      return FieldError(where, "method",
                        "is mtp but " + d.model.name +
                            " has no multi-token-prediction layers (num_nextn_predict_layers)");
    if (JsonHas(s, "draft_model"))
      return FieldError(where, "draft_model", "is for method draft only");
    spec.drafter = models::Drafter{d.model.MtpDrafter(), true};
  } else if (*method == "draft") {
    auto ref = JsonString(s, "draft_model", where);
    if (!ref) return ref.status();
    auto draft = LoadModelRef(*ref, path, data_dir);
    if (!draft) return Status::Error(where + ": field 'draft_model': " + draft.error());
    spec.drafter = models::Drafter{*draft, false};
  } else {
    return FieldError(where, "method",
                      "must be mtp or draft (got " + DescribeJson(s.at("method")) + ")");
  }
  // Every decode row takes 1 + k of the step's tokens.
  if (d.engine.scheduler.max_num_batched_tokens < 1 + *k)
    return Status::Error(where + ": num_speculative_tokens " + std::to_string(*k) +
                         " leaves no room in engine.max_num_batched_tokens (" +
                         std::to_string(d.engine.scheduler.max_num_batched_tokens) +
                         ") for a decode row's 1 + k tokens");
  return spec;
}

}  // namespace

Result<FittedProfile> LoadFittedProfile(const json& doc, const std::string& path,
                                        const std::string& data_dir) {
  const auto cost = doc.find("cost_model");
  if (cost == doc.end() || !cost->is_object() || cost->value("kind", "") != "fitted")
    return FittedProfile{};
  const auto ref = cost->find("profile");
  if (ref == cost->end() || !ref->is_string()) return FittedProfile{};
  FittedProfile fitted;
  fitted.path =
      ResolveRef(ref->get<std::string>(), path, (fs::path(data_dir) / "sim" / "profiles").string());
  auto loaded = models::LoadStepProfile(fitted.path);
  if (!loaded) return Status::Error(path + ": cost_model: field 'profile': " + loaded.error());
  fitted.profile = std::make_shared<const models::StepProfile>(std::move(*loaded));
  return fitted;
}

Result<Deployment> ParseDeployment(const json& doc, const std::string& path,
                                   const std::string& data_dir) {
  if (!doc.is_object()) return Status::Error(path + ": must be a JSON object");
  Deployment d;
  d.path = path;
  auto name = JsonStringOr(doc, "name", fs::path(path).stem().string(), path);
  if (!name) return name.status();
  d.name = *name;
  if (auto it = doc.find("router"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError(path, "router", "must be a string");
    auto kind = policies::ParseRouterKind(it->get<std::string>());
    if (!kind) return FieldError(path, "router", kind.error());
    d.router = *kind;
  }
  auto model_ref = JsonString(doc, "model", path);
  if (!model_ref) return model_ref.status();
  auto model = LoadModelRef(*model_ref, path, data_dir);
  if (!model) return Status::Error(path + ": field 'model': " + model.error());
  d.model = *model;
  if (auto it = doc.find("engine"); it != doc.end() && !it->is_null()) {
    auto engine = ParseEngineSettings(*it, path + ": engine");
    if (!engine) return engine.status();
    d.engine = *engine;
  }
  DUET_RETURN_IF_ERROR(ParseInstances(doc, path, d));
  // Fitted tiers read the fitted cost model's profile.
  if (TiersWantFits(doc)) {
    auto fitted = LoadFittedProfile(doc, path, data_dir);
    if (!fitted) return fitted.status();
    d.fitted_profile = std::move(*fitted);
  }
  const TierFits fits{d.fitted_profile.profile.get(), d.fitted_profile.path};
  auto tiers = ParseTiers(doc, path, d.engine.block_tokens * d.KvBytesPerToken(),
                          d.engine.enable_prefix_caching, fits);
  if (!tiers) return tiers.status();
  d.tiers = *tiers;
  auto speculative = ParseSpeculative(doc, path, data_dir, d);
  if (!speculative) return speculative.status();
  d.speculative = *speculative;
  return d;
}

}  // namespace duet::deploy
