// Fuzz target for the Hugging Face config.json parser of the model loader: bytes are parsed as
// JSON and read as a Llama-family config. A config that parses must satisfy the invariants the
// weight loader relies on, survive a round trip through ModelConfigToJson, and give finite
// rotary frequencies. Any crash, sanitizer report or broken invariant is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "backend/model/model_config.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json doc = nlohmann::json::parse(data, data + size, /*cb=*/nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  duet::Result<duet::backend::ModelConfig> config =
      duet::backend::ParseModelConfig(doc, "fuzz/config.json");
  if (!config.ok()) {
    DUET_CHECK(config.error().rfind("fuzz/config.json", 0) == 0);  // errors name the file
    return 0;
  }
  const duet::backend::ModelConfig& c = *config;
  DUET_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0);
  DUET_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0);
  DUET_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
  DUET_CHECK(c.vocab_size > 0 && c.max_position_embeddings > 0);
  DUET_CHECK(c.rms_norm_eps > 0 && c.rope_theta >= 1);
  DUET_CHECK(c.ParamCount() > 0);
  for (std::int64_t id : c.eos_token_ids) DUET_CHECK(id >= 0 && id < c.vocab_size);

  // What is written back parses to the same config.
  duet::Result<duet::backend::ModelConfig> again =
      duet::backend::ParseModelConfig(duet::backend::ModelConfigToJson(c), "fuzz/again.json");
  DUET_CHECK_MSG(again.ok(), again.ok() ? "" : again.error());
  DUET_CHECK(again->ParamCount() == c.ParamCount());
  DUET_CHECK(again->rope_scaling.type == c.rope_scaling.type);
  DUET_CHECK(again->eos_token_ids == c.eos_token_ids);
  DUET_CHECK(again->sliding_window == c.sliding_window);

  // Head dims beyond real models (a few hundred) only cost time here.
  if (c.head_dim <= 4096) {
    const std::vector<float> inv = c.RopeInvFrequencies();
    DUET_CHECK(inv.size() == std::size_t(c.head_dim / 2));
    for (float f : inv) DUET_CHECK(std::isfinite(f) && f >= 0 && f <= 1);
  }
  return 0;
}
