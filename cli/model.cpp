// `duet model`: what a model description says and what follows from it: parameters (active ones
// of a mixture of experts), weight bytes by part, KV bytes per token, and with --gpu the memory
// plan of one instance (weights and KV per GPU, KV capacity), as the simulator plans it.
#include <boost/program_options.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "common/units.h"
#include "deploy/engine_settings.h"
#include "models/model_spec.h"

namespace duet::cli {
namespace {

namespace po = boost::program_options;
using nlohmann::json;

json PartJson(const models::WeightPart& part) {
  return {{"parameters", part.params}, {"bytes", part.bytes}};
}

json ModelJson(const models::ModelSpec& m, std::optional<models::Dtype> kv_dtype) {
  const models::WeightBreakdown w = m.Weights();
  json doc = {{"model", m.name},
              {"parameters", w.Total().params},
              {"active_parameters", m.ActiveParamCount()},
              {"weight_bytes", w.Total().bytes},
              {"kv_bytes_per_token", m.KvBytesPerToken(kv_dtype)},
              {"layers", m.num_hidden_layers},
              {"dense_layers", m.DenseLayers()},
              {"weights",
               {{"embedding", PartJson(w.embedding)},
                {"lm_head", PartJson(w.lm_head)},
                {"attention", PartJson(w.attention)},
                {"dense_mlp", PartJson(w.dense_mlp)},
                {"routed_experts", PartJson(w.routed_experts)},
                {"shared_experts", PartJson(w.shared_experts)},
                {"router", PartJson(w.router)},
                {"norms", PartJson(w.norms)}}}};
  if (m.moe) {
    doc["experts"] = {{"routed", m.moe->experts},
                      {"per_token", m.moe->experts_per_token},
                      {"shared", m.moe->shared_experts},
                      {"moe_layers", m.moe->moe_layers}};
  }
  doc["attention"] = m.mla ? "mla" : "gqa";
  if (m.fp8) doc["quantization"] = "fp8";
  return doc;
}

}  // namespace

int Model(int argc, char** argv) {
  po::options_description opts(
      "duet model: a model's parameters, weight and KV bytes, and with --gpu the memory plan "
      "of one instance on that GPU");
  opts.add_options()("help,h", "show this help")(
      "model", po::value<std::string>()->required(),
      "a bundled model (models/specs/), a config.json, or a Hugging Face model directory")(
      "gpu", po::value<std::string>(), "a bundled GPU (models/hardware/) or a .json path")(
      "tp", po::value<int>()->default_value(1), "tensor-parallel GPUs per attention rank")(
      "dp", po::value<int>()->default_value(1), "attention data-parallel ranks")(
      "gpu-memory-utilization", po::value<double>()->default_value(0.9),
      "the fraction of HBM the engine may use")(
      "reserved-gib", po::value<double>()->default_value(2), "activation reserve per GPU (GiB)")(
      "block-tokens", po::value<std::int64_t>()->default_value(16), "tokens per KV block")(
      "kv-cache-dtype", po::value<std::string>()->default_value("auto"),
      "auto (the weights' dtype), bfloat16, float16 or float32")("json",
                                                                 "print JSON instead of text");
  po::variables_map vm;
  int code = kExitOk;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  auto model = LoadModelRef(vm["model"].as<std::string>());
  if (!model) return Fail(model.error());
  // The memory settings with a cluster file's bounds and spellings (its engine object's), each
  // error naming its flag.
  Result<deploy::EngineSettings> engine = deploy::EngineSettings{};
  const std::pair<const char*, json> flags[] = {
      {"gpu-memory-utilization",
       {{"gpu_memory_utilization", vm["gpu-memory-utilization"].as<double>()}}},
      {"reserved-gib", {{"reserved_gib", vm["reserved-gib"].as<double>()}}},
      {"block-tokens", {{"block_tokens", vm["block-tokens"].as<std::int64_t>()}}},
      {"kv-cache-dtype", {{"kv_cache_dtype", vm["kv-cache-dtype"].as<std::string>()}}}};
  for (const auto& [flag, setting] : flags) {
    engine = deploy::ParseEngineSettings(setting, std::string("--") + flag, *engine);
    if (!engine) return Fail(engine.error(), kExitUsage);
  }
  const std::optional<models::Dtype> kv_dtype = engine->memory.kv_cache_dtype;
  json doc = ModelJson(*model, kv_dtype);
  if (vm.count("gpu")) {
    auto gpu = LoadGpuRef(vm["gpu"].as<std::string>());
    if (!gpu) return Fail(gpu.error());
    models::MemoryOptions options = engine->memory;
    options.tp = vm["tp"].as<int>();
    options.dp = vm["dp"].as<int>();
    auto plan = models::PlanInstanceMemory(*model, *gpu, options);
    if (!plan) return Fail(plan.error());
    doc["plan"] = {{"gpu", gpu->name},
                   {"tp", options.tp},
                   {"dp", options.dp},
                   {"gpus", std::int64_t(options.tp) * options.dp},
                   {"weight_bytes_per_gpu", plan->weight_bytes_per_gpu},
                   {"reserved_bytes_per_gpu", plan->reserved_bytes_per_gpu},
                   {"kv_bytes_per_gpu", plan->kv_bytes_per_gpu},
                   {"kv_tokens", plan->kv_tokens},
                   {"kv_blocks", plan->kv_blocks}};
  }
  if (vm.count("json")) {
    std::printf("%s\n", doc.dump(1).c_str());
    return kExitOk;
  }
  std::printf("%s: %.2f B parameters (%.2f B active per token), %.2f GB of weights%s; %s\n",
              model->name.c_str(), double(model->ParamCount()) / 1e9,
              double(model->ActiveParamCount()) / 1e9, double(model->WeightBytes()) / kGB,
              model->fp8 ? " (fp8)" : "",
              model->moe ? (std::to_string(model->moe->experts_per_token) + " of " +
                            std::to_string(model->moe->experts) + " experts per token")
                               .c_str()
                         : "dense");
  std::printf("KV cache: %lld bytes per token (%s)\n",
              static_cast<long long>(model->KvBytesPerToken(kv_dtype)),
              model->mla ? "latent attention" : "grouped-query attention");
  if (doc.contains("plan")) {
    const json& p = doc["plan"];
    std::printf(
        "on %lld %s (tp %d, dp %d): %.2f GB of weights and %.2f GB of KV per GPU; %lld tokens "
        "of KV (%lld blocks)\n",
        p["gpus"].get<long long>(), p["gpu"].get<std::string>().c_str(), p["tp"].get<int>(),
        p["dp"].get<int>(), p["weight_bytes_per_gpu"].get<double>() / kGB,
        p["kv_bytes_per_gpu"].get<double>() / kGB, p["kv_tokens"].get<long long>(),
        p["kv_blocks"].get<long long>());
  }
  return kExitOk;
}

}  // namespace duet::cli
