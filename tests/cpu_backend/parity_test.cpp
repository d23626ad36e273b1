// The CPU backend against Hugging Face transformers on the project's test model (fp32
// weights): tokenization, logits at every position within 1e-3, greedy continuations token for
// token; and a prefix-cache hit and a chunked prefill give the logits of a cold, unchunked run.
// Fixture: tests/fixtures/test_model/hf_golden.json, made by scripts/make_model_fixtures.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_model.h"
#include "backend/engine/local_engine.h"
#include "backend/model/test_model.h"
#include "backend/tokenizer/tokenizer.h"

namespace duet::backend {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string text;
  std::vector<std::int32_t> ids;
  std::vector<std::vector<float>> logits;  // [position][vocab]
  std::vector<std::int32_t> greedy;
};

class Parity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("duet_parity_" + std::to_string(::getpid()))).string();
    TestModelOptions options;  // seed 1, F32: what the fixture script writes
    ASSERT_TRUE(WriteTestModel(dir_, options).ok());
    std::ifstream in("tests/fixtures/test_model/hf_golden.json");
    ASSERT_TRUE(in) << "missing fixture";
    const auto doc = nlohmann::json::parse(in);
    ASSERT_EQ(doc["model"]["seed"], 1);
    for (const auto& c : doc["cases"]) {
      cases_.push_back({c["text"], c["ids"], c["logits"], c["greedy"]});
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::unique_ptr<CpuModel> Model(std::int64_t num_blocks = 64,
                                         std::optional<models::Dtype> kv_dtype = {}) {
    auto loaded = LoadModelDir(dir_);
    EXPECT_TRUE(loaded.ok()) << loaded.error();
    CpuModelOptions options;
    options.num_blocks = num_blocks;
    options.threads = 2;
    options.kv_cache_dtype = kv_dtype;
    auto model = CpuModel::Create(std::move(*loaded), options);
    EXPECT_TRUE(model.ok()) << model.error();
    return std::move(*model);
  }
  static std::vector<std::int32_t> Table(std::int32_t first, std::int32_t n) {
    std::vector<std::int32_t> t;
    for (std::int32_t i = 0; i < n; ++i) t.push_back(first + i);
    return t;
  }
  // Logits of every position of `ids` in one cold, unchunked pass.
  static std::vector<float> Cold(CpuModel& model, const std::vector<std::int32_t>& ids) {
    const auto table = Table(0, static_cast<std::int32_t>(ids.size() / 16 + 1));
    std::vector<float> logits;
    const SequenceChunk chunk{ids, 0, table, SequenceChunk::Logits::kAll};
    EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
    return logits;
  }

  static inline std::string dir_;
  static inline std::vector<Case> cases_;
};

TEST_F(Parity, TokenizerMatchesTransformers) {
  auto tok = Tokenizer::Load(dir_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.error();
  for (const Case& c : cases_) EXPECT_EQ(tok->Encode(c.text, /*add_bos=*/true), c.ids) << c.text;
}

TEST_F(Parity, LogitsMatchTransformersWithin1e3) {
  auto model = Model();
  const int vocab = model->config().vocab_size;
  for (const Case& c : cases_) {
    const auto logits = Cold(*model, c.ids);
    ASSERT_EQ(logits.size(), c.ids.size() * static_cast<std::size_t>(vocab));
    double max_diff = 0;
    for (std::size_t t = 0; t < c.ids.size(); ++t) {
      ASSERT_EQ(c.logits[t].size(), static_cast<std::size_t>(vocab));
      for (int v = 0; v < vocab; ++v) {
        max_diff = std::max<double>(max_diff, std::fabs(logits[t * vocab + v] - c.logits[t][v]));
      }
    }
    EXPECT_LT(max_diff, 1e-3) << c.text;
  }
}

// A bf16 KV cache (what a bf16 checkpoint gets) on the fp32 model: keys and values rounded to
// bf16 move the logits by under 1e-3 here (the fp32 cache's tolerance, with room to spare
// kept at 2e-3), visibly more than the fp32 cache does, and greedy decoding is unchanged.
TEST_F(Parity, Bf16CacheKeepsLogitsCloseAndGreedyContinuationsEqual) {
  auto model = Model(64, models::Dtype::kBF16);
  auto fp32 = Model(64);
  ASSERT_EQ(model->kv_cache_dtype(), models::Dtype::kBF16);
  ASSERT_EQ(fp32->kv_cache_dtype(), models::Dtype::kF32);
  ASSERT_EQ(model->kv_cache_bytes(), fp32->kv_cache_bytes() / 2);
  const int vocab = model->config().vocab_size;
  auto max_diff = [&](const std::vector<float>& logits, const Case& c) {
    double diff = 0;
    for (std::size_t t = 0; t < c.ids.size(); ++t) {
      for (int v = 0; v < vocab; ++v) {
        diff = std::max<double>(diff, std::fabs(logits[t * vocab + v] - c.logits[t][v]));
      }
    }
    return diff;
  };
  for (const Case& c : cases_) {
    const double bf16_diff = max_diff(Cold(*model, c.ids), c);
    EXPECT_LT(bf16_diff, 2e-3) << c.text;
    EXPECT_GT(bf16_diff, 2 * max_diff(Cold(*fp32, c.ids), c)) << c.text;
  }
  LocalEngine engine(*model, {});
  for (const Case& c : cases_) {
    const auto results = engine.Generate({{c.ids, static_cast<Tokens>(c.greedy.size()), {}}});
    EXPECT_EQ(results[0].tokens, c.greedy) << c.text;
  }
}

// The block-major region is the handoff unit of PD disaggregation: a prompt prefilled on one
// model and its blocks' bytes copied into other block ids of a second model let the second
// decode exactly as the first would.
TEST_F(Parity, KvRegionBlocksCopiedToAnotherModelDecodeTheSame) {
  for (const std::optional<models::Dtype> kv_dtype :
       {std::optional<models::Dtype>(), std::optional(models::Dtype::kBF16)}) {
    auto prefill = Model(64, kv_dtype);
    auto decode = Model(64, kv_dtype);
    const auto& ids = cases_.back().ids;
    const auto blocks = static_cast<std::int32_t>(ids.size() / 16 + 1);
    const auto source = Table(3, blocks);
    const auto target = Table(40, blocks);
    std::vector<float> ignored;
    const SequenceChunk prompt{ids, 0, source, SequenceChunk::Logits::kNone};
    EXPECT_TRUE(prefill->Forward({&prompt, 1}, &ignored).ok());
    const std::optional<KvRegion> from = prefill->kv_region();
    const std::optional<KvRegion> to = decode->kv_region();
    ASSERT_TRUE(from && to);
    ASSERT_EQ(from->block_bytes, to->block_bytes);
    for (std::int32_t b = 0; b < blocks; ++b) {
      std::memcpy(static_cast<char*>(to->base) + target[b] * to->block_bytes,
                  static_cast<const char*>(from->base) + source[b] * from->block_bytes,
                  static_cast<std::size_t>(from->block_bytes));
    }
    const std::int32_t next = cases_.back().greedy[0];
    const auto context = static_cast<std::int64_t>(ids.size());
    std::vector<float> here, there;
    const SequenceChunk step_here{{&next, 1}, context, source, SequenceChunk::Logits::kLast};
    const SequenceChunk step_there{{&next, 1}, context, target, SequenceChunk::Logits::kLast};
    EXPECT_TRUE(prefill->Forward({&step_here, 1}, &here).ok());
    EXPECT_TRUE(decode->Forward({&step_there, 1}, &there).ok());
    ASSERT_EQ(here.size(), there.size());
    EXPECT_EQ(std::memcmp(here.data(), there.data(), here.size() * sizeof(float)), 0);
    // Without the copy the decode model attends over zeros: the test can tell.
    auto empty = Model(64, kv_dtype);
    std::vector<float> cold;
    EXPECT_TRUE(empty->Forward({&step_there, 1}, &cold).ok());
    EXPECT_NE(std::memcmp(cold.data(), here.data(), here.size() * sizeof(float)), 0);
  }
}

TEST_F(Parity, GreedyContinuationsMatchTransformersTokenForToken) {
  auto model = Model();
  LocalEngine engine(*model, {});
  for (const Case& c : cases_) {
    const auto results = engine.Generate({{c.ids, static_cast<Tokens>(c.greedy.size()), {}}});
    EXPECT_EQ(results[0].tokens, c.greedy) << c.text;
  }
}

TEST_F(Parity, ChunkedPrefillGivesTheColdLogits) {
  auto model = Model();
  const auto& ids = cases_.back().ids;  // the longest prompt
  ASSERT_GT(ids.size(), 40u);
  const auto cold = Cold(*model, ids);
  const auto table = Table(10, static_cast<std::int32_t>(ids.size() / 16 + 1));  // other blocks
  std::vector<float> chunked;
  std::size_t at = 0;
  for (std::size_t len : {7u, 20u, 999u}) {
    len = std::min(len, ids.size() - at);
    const SequenceChunk c{std::span(ids).subspan(at, len), static_cast<std::int64_t>(at), table,
                          SequenceChunk::Logits::kAll};
    EXPECT_TRUE(model->Forward({&c, 1}, &chunked).ok());
    at += len;
  }
  ASSERT_EQ(chunked.size(), cold.size());
  for (std::size_t i = 0; i < cold.size(); ++i) ASSERT_NEAR(chunked[i], cold[i], 1e-4) << i;
}

TEST_F(Parity, PrefixCacheHitGivesTheColdLogits) {
  auto model = Model();
  const auto& ids = cases_.back().ids;
  const auto cold = Cold(*model, ids);  // fills blocks 0.. with the prompt's KV
  // A second sequence shares the first two full blocks and computes only the rest, attending
  // over the reused KV, as the engine does after a prefix-cache hit.
  const std::int64_t cached = 32;
  std::vector<std::int32_t> table = {0, 1};
  for (std::int32_t b = 40; table.size() * 16 < ids.size() + 16; ++b) table.push_back(b);
  std::vector<float> warm;
  const SequenceChunk c{std::span(ids).subspan(cached), cached, table, SequenceChunk::Logits::kAll};
  EXPECT_TRUE(model->Forward({&c, 1}, &warm).ok());
  const int vocab = model->config().vocab_size;
  ASSERT_EQ(warm.size(), (ids.size() - cached) * vocab);
  for (std::size_t i = 0; i < warm.size(); ++i)
    ASSERT_NEAR(warm[i], cold[cached * vocab + i], 1e-4) << i;
}

TEST_F(Parity, EngineReusesPrefixAndChunksWithoutChangingTheOutput) {
  auto model = Model();
  const Case& c = cases_.back();
  LocalEngine engine(*model, {});
  const auto first = engine.Generate({{c.ids, 8, {}}});
  const auto second = engine.Generate({{c.ids, 8, {}}});  // same prompt: its full blocks are cached
  EXPECT_EQ(first[0].record.cached_tokens, 0);
  EXPECT_EQ(second[0].record.cached_tokens, static_cast<Tokens>((c.ids.size() - 1) / 16 * 16));
  EXPECT_EQ(second[0].tokens, first[0].tokens);
  EXPECT_EQ(first[0].tokens, std::vector<std::int32_t>(c.greedy.begin(), c.greedy.begin() + 8));

  auto chunk_model = Model();
  LocalEngineOptions small;
  small.scheduler.max_num_batched_tokens = 9;  // every prefill runs in chunks
  LocalEngine chunked(*chunk_model, small);
  const auto third = chunked.Generate({{c.ids, 8, {}}});
  EXPECT_EQ(third[0].tokens, first[0].tokens);
  EXPECT_GT(chunked.timings().size(), c.ids.size() / 9);  // many prefill steps were run
  EXPECT_TRUE(chunked.engine().CheckInvariants().ok());
}

TEST_F(Parity, BatchedRequestsMatchSingleRuns) {
  auto model = Model(128);
  LocalEngine engine(*model, {});
  std::vector<GenerationRequest> batch;
  for (const Case& c : cases_) batch.push_back({c.ids, static_cast<Tokens>(c.greedy.size()), {}});
  const auto results = engine.Generate(batch);
  for (std::size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(results[i].tokens, cases_[i].greedy);
  // Steps mixed several requests: the recorded shapes say so.
  bool mixed = false;
  for (const auto& t : engine.timings()) mixed |= t.shape.decode_tokens > 1;
  EXPECT_TRUE(mixed);
}

// With KV for one request's whole sequence at most, a batch preempts: a preempted request is
// recomputed from its prompt and the tokens it generated so far (one prefill over both, which
// the engine keeps apart: the spec's prompt ids and its progress's output ids), and goes on
// with the tokens it gets alone.
TEST_F(Parity, PreemptedRequestsGoOnWithTheTokensTheyGetAlone) {
  std::int64_t most_blocks = 0;
  for (const Case& c : cases_) {
    const auto tokens = static_cast<std::int64_t>(c.ids.size() + c.greedy.size());
    most_blocks = std::max(most_blocks, (tokens + 15) / 16);
  }
  auto model = Model(most_blocks + 1);
  LocalEngine engine(*model, {});
  std::vector<GenerationRequest> batch;  // every case twice
  for (int copy = 0; copy < 2; ++copy) {
    for (const Case& c : cases_) batch.push_back({c.ids, static_cast<Tokens>(c.greedy.size()), {}});
  }
  const auto results = engine.Generate(batch);
  EXPECT_GT(engine.metrics().preemptions(), 0);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(results[i].record.state, policies::RequestState::kCompleted) << i;
    EXPECT_EQ(results[i].tokens, cases_[i % cases_.size()].greedy) << i;
  }
  EXPECT_TRUE(engine.engine().CheckInvariants().ok());
}

TEST_F(Parity, StopTokenEndsTheRequestAndStepTimingsAreRecorded) {
  auto model = Model();
  const Case& c = cases_.front();
  LocalEngine engine(*model, {});
  GenerationRequest request{c.ids, 16, {}};
  request.sampling.stop_token_ids = {c.greedy[3]};  // the fourth greedy token ends it
  const auto r = engine.Generate({request});
  const auto stop = std::find(c.greedy.begin(), c.greedy.end(), c.greedy[3]);
  EXPECT_EQ(r[0].tokens, std::vector<std::int32_t>(c.greedy.begin(), stop + 1));
  EXPECT_EQ(r[0].record.state, policies::RequestState::kCompleted);
  EXPECT_EQ(r[0].record.finish_reason, policies::FinishReason::kStop);
  EXPECT_EQ(r[0].record.generated_tokens, static_cast<Tokens>(r[0].tokens.size()));
  ASSERT_FALSE(engine.timings().empty());
  EXPECT_EQ(engine.timings()[0].shape.PrefillTokens(), static_cast<Tokens>(c.ids.size()));
  for (const auto& t : engine.timings()) EXPECT_GT(t.seconds, 0);
  const auto json = engine.timings()[1].ToJson();
  EXPECT_EQ(json["decode_tokens"], 1);
  EXPECT_EQ(json["decode_context_tokens"], static_cast<Tokens>(c.ids.size()));
}

TEST_F(Parity, OversizedRequestIsRejectedNotHung) {
  auto model = Model(4);  // 64 tokens of KV
  LocalEngine engine(*model, {});
  const auto r = engine.Generate({{cases_.back().ids, 100, {}}});
  EXPECT_EQ(r[0].record.state, policies::RequestState::kRejected);
  EXPECT_FALSE(r[0].record.reason.empty());
}

}  // namespace
}  // namespace duet::backend
