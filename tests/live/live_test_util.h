// What the live frontend's tests share: a listener that collects one request's output, and a
// fixture that writes the CPU test model once and starts frontends over it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/cpu/cpu_model.h"
#include "backend/frontend/frontend.h"
#include "backend/model/test_model.h"

namespace duet::backend::serve {

// Collects what the frontend tells about one request; waits for the end.
class Collector final : public RequestListener {
 public:
  // Calls `on_token(count)` after each token (on the engine thread).
  std::function<void(int)> on_token;

  void OnToken(std::int32_t token) override {
    int count;
    {
      std::lock_guard lock(mu_);
      tokens_.push_back(token);
      count = static_cast<int>(tokens_.size());
    }
    if (on_token) on_token(count);
  }
  void OnFinished(const FinishInfo& info) override {
    std::lock_guard lock(mu_);
    EXPECT_FALSE(finished_) << "OnFinished twice";
    info_ = info;
    finished_ = true;
    cv_.notify_all();
  }
  // The final info, or nullopt after `timeout`.
  std::optional<FinishInfo> Wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return finished_; })) return std::nullopt;
    return info_;
  }
  std::vector<std::int32_t> tokens() {
    std::lock_guard lock(mu_);
    return tokens_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::int32_t> tokens_;
  FinishInfo info_;
  bool finished_ = false;
};

class Frontend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("duet_live_" + std::to_string(::getpid())))
               .string();
    ASSERT_TRUE(WriteTestModel(dir_, TestModelOptions{}).ok());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static std::unique_ptr<CpuModel> Model(std::int64_t num_blocks) {
    auto loaded = LoadModelDir(dir_);
    EXPECT_TRUE(loaded.ok()) << loaded.error();
    CpuModelOptions options;
    options.num_blocks = num_blocks;
    options.threads = 1;
    auto model = CpuModel::Create(std::move(*loaded), options);
    EXPECT_TRUE(model.ok()) << model.error();
    return std::move(*model);
  }
  static std::unique_ptr<LiveFrontend> Start(int instances, FrontendOptions options,
                                             std::int64_t num_blocks = 64) {
    std::vector<std::unique_ptr<ForwardModel>> models;
    for (int i = 0; i < instances; ++i) models.push_back(Model(num_blocks));
    auto f = LiveFrontend::Start(std::move(models), options);
    EXPECT_TRUE(f.ok()) << f.error();
    return std::move(*f);
  }
  static std::vector<std::int32_t> Prompt(int n, int seed) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + (seed * 131 + i * 17) % 500);
    return p;
  }
  // Waits until the frontend holds no KV blocks in use (engine threads publish after each
  // iteration, a moment after the listener heard of the end).
  static bool EventuallyNoBlocksUsed(const LiveFrontend& f) {
    for (int i = 0; i < 500; ++i) {
      if (f.Stats().load.kv_blocks_used == 0 && f.Stats().load.running == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  static inline std::string dir_;
};

}  // namespace duet::backend::serve
