// The deployment description (deploy/): the engine settings' one codec, field by field, and
// the cluster file's deployment part as the simulator and `duet serve` both read it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "deploy/deployment.h"
#include "deploy/engine_settings.h"
#include "sim/cluster_spec.h"
#include "tests/deploy/setting_samples.h"

namespace duet::deploy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(EngineSettings, EverySettingHasASample) {
  std::set<std::string> sampled;
  for (const auto& s : testing::SettingSamples()) sampled.insert(s.key);
  const std::vector<std::string> keys = EngineSettingKeys();
  EXPECT_EQ(sampled, std::set<std::string>(keys.begin(), keys.end()));
}

TEST(EngineSettings, EverySettingIsReadIntoItsMemberAndWrittenBack) {
  const EngineSettings defaults;
  for (const auto& sample : testing::SettingSamples()) {
    SCOPED_TRACE(sample.key);
    ASSERT_FALSE(sample.arrived(defaults)) << "the sample is the default";
    auto parsed = ParseEngineSettings({{sample.key, sample.value}}, "engine");
    ASSERT_TRUE(parsed.ok()) << parsed.error();
    EXPECT_TRUE(sample.arrived(*parsed));
    const json written = EngineSettingsToJson(*parsed);
    EXPECT_EQ(written.at(sample.key), sample.value);
    auto again = ParseEngineSettings(written, "engine");
    ASSERT_TRUE(again.ok()) << again.error();
    EXPECT_TRUE(sample.arrived(*again));
    EXPECT_EQ(EngineSettingsToJson(*again), written);
  }
}

TEST(EngineSettings, AbsentAndNullKeepTheBase) {
  EngineSettings base;
  base.scheduler.watermark = 0.3;
  auto parsed = ParseEngineSettings({{"watermark", nullptr}, {"max_num_seqs", 9}}, "e", base);
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_EQ(parsed->scheduler.watermark, 0.3);
  EXPECT_EQ(parsed->scheduler.max_num_seqs, 9);
}

TEST(EngineSettings, OutOfBoundsUnknownAndMistypedSettingsNameTheField) {
  const std::vector<std::pair<json, std::vector<std::string>>> bad = {
      {{{"watermark", 1.0}}, {"x.json: engine", "'watermark'", "[0, 1)"}},
      {{{"watermark", -0.1}}, {"'watermark'"}},
      {{{"block_tokens", 0}}, {"'block_tokens'"}},
      {{{"block_tokens", (1 << 16) + 1}}, {"'block_tokens'", "65536"}},
      {{{"max_num_batched_tokens", (std::int64_t{1} << 30) + 1}}, {"'max_num_batched_tokens'"}},
      {{{"max_num_seqs", 0}}, {"'max_num_seqs'"}},
      {{{"gpu_memory_utilization", 0}}, {"'gpu_memory_utilization'", "(0, 1]"}},
      {{{"reserved_gib", -1}}, {"'reserved_gib'"}},
      {{{"kv_cache_dtype", "int4"}}, {"'kv_cache_dtype'", "int4"}},
      {{{"kv_lease_s", 0}}, {"'kv_lease_s'"}},
      {{{"kv_load_failure_policy", "retry"}}, {"'kv_load_failure_policy'", "retry"}},
      {{{"enable_prefix_caching", 1}}, {"'enable_prefix_caching'"}},
      {{{"watermrk", 0.1}}, {"unknown setting \"watermrk\"", "watermark"}},
      {json::array(), {"must be an object"}},
  };
  for (const auto& [doc, words] : bad) {
    SCOPED_TRACE(doc.dump());
    auto parsed = ParseEngineSettings(doc, "x.json: engine");
    ASSERT_FALSE(parsed.ok());
    for (const std::string& w : words)
      EXPECT_NE(parsed.error().find(w), std::string::npos) << parsed.error();
  }
}

TEST(EngineSettings, TheEngineConfigTakesEverySettingTheEngineLoopReads) {
  EngineSettings s;
  s.block_tokens = 8;
  s.scheduler.watermark = 0.6;
  s.scheduler.overlap_tier_loads = false;
  s.enable_prefix_caching = false;
  s.coalesce_decode_steps = false;
  s.async_steps = true;
  s.kv_lease_s = 3;
  s.kv_load_failure_policy = policies::KvLoadFailurePolicy::kRecompute;
  const policies::EngineConfig c = MakeEngineConfig(s, 5, policies::InstanceRole::kDecode);
  EXPECT_EQ(c.id, 5);
  EXPECT_EQ(c.role, policies::InstanceRole::kDecode);
  EXPECT_EQ(c.block_tokens, 8);
  EXPECT_EQ(c.scheduler.watermark, 0.6);
  EXPECT_FALSE(c.scheduler.overlap_tier_loads);
  EXPECT_FALSE(c.enable_prefix_caching);
  EXPECT_FALSE(c.coalesce_decode_steps);
  EXPECT_TRUE(c.async_steps);
  EXPECT_EQ(c.kv_lease_s, 3);
  EXPECT_EQ(c.kv_load_failure_policy, policies::KvLoadFailurePolicy::kRecompute);
}

// Every bundled cluster file: the simulator's spec holds exactly the deployment `duet serve`
// reads from it.
TEST(Deployment, TheSimulatorAndServeReadTheSameDeployment) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(DUET_SOURCE_DIR) / "sim" / "clusters")) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    auto spec = sim::LoadClusterSpec(path, DUET_SOURCE_DIR);
    auto deployment = LoadDeployment(path, DUET_SOURCE_DIR);
    ASSERT_TRUE(spec.ok()) << spec.error();
    ASSERT_TRUE(deployment.ok()) << deployment.error();
    EXPECT_EQ(spec->name, deployment->name);
    EXPECT_EQ(spec->model.name, deployment->model.name);
    EXPECT_EQ(spec->router, deployment->router);
    EXPECT_EQ(EngineSettingsToJson(spec->engine), EngineSettingsToJson(deployment->engine));
    ASSERT_EQ(spec->instances.size(), deployment->instances.size());
    ASSERT_EQ(spec->placements.size(), spec->instances.size());
    for (std::size_t i = 0; i < spec->instances.size(); ++i) {
      EXPECT_EQ(spec->instances[i].name, deployment->instances[i].name);
      EXPECT_EQ(spec->instances[i].role, deployment->instances[i].role);
      EXPECT_EQ(spec->instances[i].tp, deployment->instances[i].tp);
    }
    for (int k = 0; k < policies::kNumLowerTiers; ++k) {
      const auto kind = static_cast<policies::TierKind>(k);
      EXPECT_EQ(spec->tiers[kind].enabled, deployment->tiers[kind].enabled);
      EXPECT_EQ(spec->tiers[kind].capacity_bytes, deployment->tiers[kind].capacity_bytes);
    }
  }
  EXPECT_GE(files, 4);
}

// The live fields of "tiers": where the SSD tier's files go and the remote store's endpoint.
TEST(Deployment, TiersNameTheSsdDirectoryAndTheRedisEndpoint) {
  std::ifstream in(fs::path(DUET_SOURCE_DIR) / "sim" / "clusters" / "h100-8p8d-llama8b.json");
  json doc = json::parse(in);
  doc["tiers"] = {
      {"ssd",
       {{"capacity_gib", 2},
        {"read_GBps", 3},
        {"write_GBps", 1},
        {"directory", "/var/cache/duet"},
        {"io", "io_uring"}}},
      {"remote", {{"capacity_gib", 4}, {"bandwidth_GBps", 5}, {"endpoint", "10.0.0.7:7000"}}}};
  auto d = ParseDeployment(doc, "c.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_FALSE(d->tiers.dram.enabled);
  EXPECT_EQ(d->tiers.ssd.directory, "/var/cache/duet");
  EXPECT_TRUE(d->tiers.ssd.io_uring);
  EXPECT_EQ(d->tiers.remote.host, "10.0.0.7");
  EXPECT_EQ(d->tiers.remote.port, 7000);
  const policies::TierSetup setup = TierSetupFor(d->tiers, 1 << 20, std::vector<int>{0, 0}, 1);
  EXPECT_EQ(setup.tiers[1].capacity_bytes, 2 * (std::int64_t{1} << 30));
  EXPECT_EQ(setup.tiers[1].read_bandwidth, 3e9);
  EXPECT_EQ(setup.tiers[2].read_bandwidth, 5e9);
  json aio = doc;
  aio["tiers"]["ssd"]["io"] = "aio";
  auto no_aio = ParseDeployment(aio, "c.json", DUET_SOURCE_DIR);
  ASSERT_FALSE(no_aio.ok());
  EXPECT_NE(
      no_aio.error().find("c.json: tiers.ssd: field 'io' must be 'mmap' or 'io_uring', got 'aio'"),
      std::string::npos)
      << no_aio.error();
  for (const char* bad : {"nohost", ":80", "h:0", "h:65536", "h:8x"}) {
    doc["tiers"]["remote"]["endpoint"] = bad;
    auto refused = ParseDeployment(doc, "c.json", DUET_SOURCE_DIR);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().find("c.json: tiers.remote: field 'endpoint'"), std::string::npos)
        << refused.error();
  }
}

// A deployment error is the same message from both parsers.
TEST(Deployment, ADeploymentErrorReadsTheSameFromBoth) {
  const fs::path dir = fs::temp_directory_path() / ("duet_deploy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(fs::path(DUET_SOURCE_DIR) / "sim" / "clusters" / "h100-8p8d-llama8b.json");
  const json good = json::parse(in);
  const std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
      {"watermark", [](json& c) { c["engine"]["watermark"] = 1.5; }},
      {"role", [](json& c) { c["instances"][0]["role"] = "both"; }},
      {"mixed",
       [](json& c) {
         c["instances"].push_back({{"role", "colocated"}});
       }},
      {"unknown", [](json& c) { c["engine"]["max_seqs"] = 4; }},
      {"router", [](json& c) { c["router"] = "random-ish"; }},
      {"tier", [](json& c) { c["tiers"]["tape"] = json::object(); }},
      {"endpoint",
       [](json& c) {
         c["tiers"]["remote"] = {
             {"capacity_gib", 1}, {"bandwidth_GBps", 1}, {"endpoint", "localhost:99999"}};
       }},
      {"tiny tier",
       [](json& c) {
         c["tiers"]["dram"] = {{"capacity_gib", 1e-9}};
       }},
  };
  for (const auto& [name, edit] : edits) {
    SCOPED_TRACE(name);
    json doc = good;
    edit(doc);
    const std::string path = (dir / (name + ".json")).string();
    std::ofstream(path) << doc.dump();
    auto spec = sim::LoadClusterSpec(path, DUET_SOURCE_DIR);
    auto deployment = LoadDeployment(path, DUET_SOURCE_DIR);
    ASSERT_FALSE(spec.ok());
    ASSERT_FALSE(deployment.ok());
    EXPECT_EQ(spec.error(), deployment.error());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace duet::deploy
