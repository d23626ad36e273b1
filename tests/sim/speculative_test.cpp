// Speculative decoding in `duet simulate`: the drafts each step keeps shorten decoding as many
// times over as the acceptance rate says; DeepSeek-V3 with its multi-token-prediction layer
// decodes the Mooncake trace faster; and the cluster files that cannot run it are refused with
// the field named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/cluster_spec.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

// Llama-3.1-8B on one H100, colocated, priced by the roofline; Llama-3.2-1B drafts `k` tokens.
nlohmann::json LlamaWithDrafts(double acceptance, int k) {
  nlohmann::json doc = ReadJson(SourceDir() + "/sim/clusters/h100-16colo-llama8b.json");
  doc["nodes"][0]["count"] = 1;
  doc["instances"] = {{{"role", "colocated"}, {"count", 1}, {"tp", 1}}};
  doc["cost_model"] = {{"kind", "roofline"}};
  doc["speculative"] = {{"method", "draft"},
                        {"draft_model", "llama-3.2-1b"},
                        {"num_speculative_tokens", k},
                        {"acceptance_rate", acceptance}};
  return doc;
}

TEST(Speculative, AcceptedDraftsShortenDecoding) {
  TempDir tmp;
  WriteFile(tmp.File("one.jsonl"),
            R"({"timestamp": 0, "input_length": 1000, "output_length": 9, "hash_ids": [1, 2]})"
            "\n");
  auto decode_ms = [&](const std::string& name, double acceptance) {
    WriteJson(tmp.File(name + ".json"), LlamaWithDrafts(acceptance, 3));
    Simulate(tmp.File(name),
             {"--cluster", tmp.File(name + ".json"), "--trace", tmp.File("one.jsonl")});
    const Csv csv = Csv::Read(tmp.File(name) + "/requests.csv");
    EXPECT_EQ(csv.Get(0, "status"), "completed");
    EXPECT_EQ(csv.Number(0, "output_tokens"), 9);
    return csv.Number(0, "e2e_ms") - csv.Number(0, "ttft_ms");
  };
  // Every draft kept: 8 tokens after the first in two steps of 4; none kept: eight steps. The
  // steps are memory-bound, so about equally long.
  const double all = decode_ms("all", 1.0), none = decode_ms("none", 0.0);
  std::printf("decoding 8 tokens: %.2f ms keeping every draft, %.2f ms keeping none\n", all, none);
  EXPECT_NEAR(none / all, 4.0, 0.4);
}

TEST(Speculative, MtpDecodesDeepSeekFaster) {
  TempDir tmp;
  const std::string bundled = SourceDir() + "/sim/clusters/h200-3p1d-deepseek-v3.json";
  nlohmann::json doc = ReadJson(bundled);
  // DeepSeek-V3's report: the second token is accepted 85-90% of the time.
  doc["speculative"] = {
      {"method", "mtp"}, {"num_speculative_tokens", 1}, {"acceptance_rate", 0.85}};
  WriteJson(tmp.File("mtp.json"), doc);
  auto tpot = [&](const std::string& cluster, const std::string& out) {
    Simulate(out, {"--cluster", cluster, "--trace", MooncakeTracePath(), "--limit", "2000"});
    const nlohmann::json s = ReadJson(out + "/summary.json");
    EXPECT_EQ(s["requests"]["completed"].get<int>(), 2000);
    return s["tpot_ms"]["mean"].get<double>();
  };
  const double plain = tpot(bundled, tmp.File("plain")),
               mtp = tpot(tmp.File("mtp.json"), tmp.File("mtp"));
  std::printf("mean TPOT of DeepSeek-V3: %.2f ms, %.2f ms with MTP\n", plain, mtp);
  // 1.85 tokens a step for a dearer step: well below the plain TPOT, above half of it.
  EXPECT_LT(mtp, 0.8 * plain);
  EXPECT_GT(mtp, plain / 1.85);
}

TEST(Speculative, ClusterFilesThatCannotRunItAreRefused) {
  struct Case {
    const char* what;
    nlohmann::json speculative;
    std::vector<std::string> error;
  };
  const std::vector<Case> cases = {
      {"mtp on a model without such layers",
       {{"method", "mtp"}, {"num_speculative_tokens", 1}, {"acceptance_rate", 0.8}},
       {"speculative", "'method'", "llama-3.1-8b", "num_nextn_predict_layers"}},
      {"rates of another length",
       {{"method", "draft"},
        {"draft_model", "llama-3.2-1b"},
        {"num_speculative_tokens", 3},
        {"acceptance_rates", {0.9, 0.8}}},
       {"'acceptance_rates'", "num_speculative_tokens (3)"}},
      {"a rate above 1",
       {{"method", "draft"},
        {"draft_model", "llama-3.2-1b"},
        {"num_speculative_tokens", 2},
        {"acceptance_rates", {0.9, 1.5}}},
       {"'acceptance_rates[1]'", "between 0 and 1", "1.5"}},
      {"both forms of the rate",
       {{"method", "draft"},
        {"draft_model", "llama-3.2-1b"},
        {"num_speculative_tokens", 1},
        {"acceptance_rate", 0.5},
        {"acceptance_rates", {0.5}}},
       {"one of 'acceptance_rate' and 'acceptance_rates'"}},
      {"an unknown draft model",
       {{"method", "draft"},
        {"draft_model", "no-such-model"},
        {"num_speculative_tokens", 1},
        {"acceptance_rate", 0.5}},
       {"'draft_model'", "no-such-model"}},
      {"an unknown method",
       {{"method", "medusa"}, {"num_speculative_tokens", 1}, {"acceptance_rate", 0.5}},
       {"'method'", "mtp or draft", "medusa"}},
      {"too many drafts",
       {{"method", "draft"},
        {"draft_model", "llama-3.2-1b"},
        {"num_speculative_tokens", 17},
        {"acceptance_rate", 0.5}},
       {"'num_speculative_tokens'", "17"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json doc = LlamaWithDrafts(0.5, 1);
    doc["speculative"] = c.speculative;
    auto spec = sim::ParseClusterSpec(doc, "c.json", SourceDir());
    ASSERT_FALSE(spec.ok());
    for (const std::string& part : c.error)
      EXPECT_NE(spec.error().find(part), std::string::npos) << part << " in " << spec.error();
  }
  // A profile measured without drafts cannot price verify steps.
  nlohmann::json fitted = LlamaWithDrafts(0.5, 1);
  fitted["cost_model"] = {{"kind", "fitted"}, {"profile", "h100-sxm-llama-3.1-8b"}};
  auto spec = sim::ParseClusterSpec(fitted, "c.json", SourceDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find("without speculative decoding"), std::string::npos) << spec.error();
  // Nor can a token budget smaller than one decode row's 1 + k tokens.
  nlohmann::json small = LlamaWithDrafts(0.5, 4);
  small["engine"]["max_num_batched_tokens"] = 4;
  spec = sim::ParseClusterSpec(small, "c.json", SourceDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find("max_num_batched_tokens"), std::string::npos) << spec.error();
}

}  // namespace
}  // namespace duet::e2e
