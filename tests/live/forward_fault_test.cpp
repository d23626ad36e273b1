// A forward pass that fails (FaultInjectingModel around the CPU test model) ends the requests of
// its step with an error and frees their KV blocks, and the engine goes on serving: through the
// single-threaded LocalEngine (prefill, chunked prefill and decode failures, before and after
// the model ran) and through the live frontend's engine threads; and the environment hook that
// `duet serve` and `duet worker` wrap their models with.
#include "backend/engine/fault_injecting_model.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "backend/engine/local_engine.h"
#include "tests/live/live_test_util.h"

namespace duet::backend::serve {
namespace {

using Fault = FaultInjectingModel::Fault;
using policies::FinishReason;
using policies::RequestState;

// Fails the passes whose numbers are in `passes` with `fault`.
FaultInjectingModel::Rule FailPasses(std::set<std::int64_t> passes, Fault fault) {
  return [passes, fault](std::int64_t pass, std::span<const SequenceChunk>) {
    return passes.contains(pass) ? fault : Fault::kNone;
  };
}

class ForwardFault : public Frontend {
 protected:
  // The outputs of `requests` on a model no fault touches.
  static std::vector<GenerationResult> Clean(const std::vector<GenerationRequest>& requests,
                                             LocalEngineOptions options = {}) {
    auto model = Model(64);
    LocalEngine engine(*model, std::move(options));
    return engine.Generate(requests);
  }
  static void ExpectFailedInTheForwardPass(const GenerationResult& r, const char* what) {
    EXPECT_EQ(r.record.state, RequestState::kFailed) << what;
    EXPECT_EQ(r.record.finish_reason, FinishReason::kError) << what;
    EXPECT_NE(r.record.reason.find("the forward pass failed: fault injection"), std::string::npos)
        << what << ": " << r.record.reason;
  }
  // Nothing held: no request in the scheduler, no block in use, no prefill work pending.
  static void ExpectNothingHeld(const LocalEngine& engine) {
    const Status invariants = engine.engine().CheckInvariants();
    EXPECT_TRUE(invariants.ok()) << invariants.message();
    EXPECT_EQ(engine.engine().blocks().kv_blocks_used(), 0);
    EXPECT_TRUE(engine.engine().scheduler().running().empty());
    EXPECT_TRUE(engine.engine().scheduler().waiting().empty());
    EXPECT_EQ(engine.engine().scheduler().pending_prefill_tokens(), 0);
  }
};

// The first step (the prefills of three requests) fails before the model ran: all three end
// with an error, their blocks are free, and none of their prompt blocks entered the prefix
// cache (they hold no KV): the same requests next are served from scratch, equal to a clean run.
TEST_F(ForwardFault, AFailedPrefillStepEndsItsRequestsAndTheNextAreServed) {
  const std::vector<GenerationRequest> requests = {
      {Prompt(40, 1), 5, {}}, {Prompt(33, 2), 4, {}}, {Prompt(50, 3), 6, {}}};
  const auto expected = Clean(requests);
  FaultInjectingModel model(Model(64), FailPasses({0}, Fault::kFailBefore));
  LocalEngine engine(model, {});
  const auto failed = engine.Generate(requests);
  ASSERT_EQ(failed.size(), 3u);
  for (const GenerationResult& r : failed) {
    ExpectFailedInTheForwardPass(r, "first step");
    EXPECT_TRUE(r.tokens.empty());
  }
  EXPECT_EQ(engine.engine().forward_failures(), 1);
  EXPECT_EQ(model.failures(), 1);
  ExpectNothingHeld(engine);

  const auto served = engine.Generate(requests);
  for (std::size_t i = 0; i < served.size(); ++i) {
    EXPECT_EQ(served[i].record.finish_reason, FinishReason::kLength) << i;
    EXPECT_EQ(served[i].record.cached_tokens, 0) << i;
    EXPECT_EQ(served[i].tokens, expected[i].tokens) << i;
  }
  EXPECT_EQ(engine.engine().forward_failures(), 1);
  ExpectNothingHeld(engine);
}

// A decode step fails after the model ran (its KV written, as a CUDA error seen at the stream's
// synchronization): the requests keep the tokens they had and end with an error; the prompt
// blocks their successful prefill registered stay cached and are correct KV, so the next turn
// of the same prompts hits the cache and equals a clean run. With asynchronous steps (the pass
// on the step thread) the step after the failed one, planned before it ended and needing its
// tokens, fails too, without running, and streams nothing.
TEST_F(ForwardFault, AFailedDecodeStepEndsItsRequestsWithTheTokensTheyHad) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::vector<GenerationRequest> requests = {{Prompt(40, 4), 8, {}},
                                                     {Prompt(36, 5), 8, {}}};
    const auto expected = Clean(requests);
    // Pass 0: both prefills (one token each); passes 1 and 2 decode; pass 3 fails.
    FaultInjectingModel model(Model(64), FailPasses({3}, Fault::kFailAfter));
    LocalEngine engine(model, {.scheduler = {}, .async_steps = async, .on_token = {}});
    const auto failed = engine.Generate(requests);
    for (std::size_t i = 0; i < failed.size(); ++i) {
      ExpectFailedInTheForwardPass(failed[i], "decode step");
      ASSERT_EQ(failed[i].tokens.size(), 3u) << i;
      EXPECT_TRUE(
          std::equal(failed[i].tokens.begin(), failed[i].tokens.end(), expected[i].tokens.begin()))
          << i;
    }
    const std::int64_t failures = async ? 2 : 1;
    EXPECT_EQ(engine.engine().forward_failures(), failures);
    EXPECT_EQ(model.failures(), 1);
    ExpectNothingHeld(engine);

    const auto served = engine.Generate(requests);
    for (std::size_t i = 0; i < served.size(); ++i) {
      EXPECT_EQ(served[i].record.finish_reason, FinishReason::kLength) << i;
      EXPECT_GT(served[i].record.cached_tokens, 0) << i;
      EXPECT_EQ(served[i].tokens, expected[i].tokens) << i;
    }
    EXPECT_EQ(engine.engine().forward_failures(), failures);
    ExpectNothingHeld(engine);
  }
}

// A prompt prefilled in chunks: the second chunk's step fails. The request ends with an error
// and the scheduler forgets exactly the prefill work it still counted (none is left pending);
// a request beside it in that step fails with it, and a later one is served.
TEST_F(ForwardFault, AFailedChunkOfAChunkedPrefillLeavesNoPendingWork) {
  LocalEngineOptions options;
  options.scheduler.max_num_batched_tokens = 32;
  const std::vector<GenerationRequest> requests = {{Prompt(100, 6), 4, {}}};
  FaultInjectingModel model(Model(64), FailPasses({1}, Fault::kFailBefore));
  LocalEngine engine(model, options);
  const auto failed = engine.Generate(requests);
  ExpectFailedInTheForwardPass(failed[0], "second chunk");
  EXPECT_TRUE(failed[0].tokens.empty());
  ExpectNothingHeld(engine);

  const std::vector<GenerationRequest> next = {{Prompt(70, 7), 5, {}}};
  const auto served = engine.Generate(next);
  EXPECT_EQ(served[0].record.finish_reason, FinishReason::kLength);
  EXPECT_EQ(served[0].tokens, Clean(next, options)[0].tokens);
  ExpectNothingHeld(engine);
}

// Every pass fails for a while, then none: the engine ends each request of each failed step,
// never stalls, and serves normally once the passes succeed again.
TEST_F(ForwardFault, EveryStepFailingEndsEveryRequestThenServingResumes) {
  std::atomic<bool> failing{true};
  FaultInjectingModel model(Model(64), [&](std::int64_t, std::span<const SequenceChunk>) {
    return failing.load() ? Fault::kFailAfter : Fault::kNone;
  });
  LocalEngine engine(model, {});
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back({Prompt(20 + 7 * i, 10 + i), 3, {}});
  for (const GenerationResult& r : engine.Generate(requests))
    ExpectFailedInTheForwardPass(r, "while failing");
  ExpectNothingHeld(engine);
  failing = false;
  const auto served = engine.Generate(requests);
  const auto expected = Clean(requests);
  for (std::size_t i = 0; i < served.size(); ++i) {
    EXPECT_EQ(served[i].record.finish_reason, FinishReason::kLength) << i;
    EXPECT_EQ(served[i].tokens, expected[i].tokens) << i;
  }
  EXPECT_EQ(engine.engine().forward_failures(), model.failures());
  EXPECT_GE(model.failures(), 1);
  ExpectNothingHeld(engine);
}

// On the live frontend's engine threads: while the switch is on, the requests of every step end
// with an error (FinishInfo says why), the blocks are freed and the frontend counts the failed
// steps; once it is off, the next request is served as the LocalEngine serves it.
TEST_F(ForwardFault, TheLiveFrontendEndsTheStepsRequestsAndKeepsServing) {
  auto failing = std::make_shared<std::atomic<bool>>(false);  // off while the model warms up
  std::vector<std::unique_ptr<ForwardModel>> models;
  auto wrapped = std::make_unique<FaultInjectingModel>(
      Model(64), [failing](std::int64_t, std::span<const SequenceChunk>) {
        return failing->load() ? Fault::kFailBefore : Fault::kNone;
      });
  FaultInjectingModel* model = wrapped.get();
  models.push_back(std::move(wrapped));
  auto started = LiveFrontend::Start(std::move(models), {});
  ASSERT_TRUE(started.ok()) << started.error();
  auto& frontend = *started;
  EXPECT_EQ(model->failures(), 0);
  EXPECT_EQ(frontend->Stats().load.forward_failures, 0);

  failing->store(true);
  std::vector<std::shared_ptr<Collector>> listeners;
  for (int i = 0; i < 3; ++i) {
    listeners.push_back(std::make_shared<Collector>());
    const Admission a = frontend->Submit({Prompt(30 + i, 20 + i), 6, {}}, listeners.back());
    ASSERT_EQ(a.status, AdmitStatus::kAccepted) << a.message;
  }
  for (const auto& l : listeners) {
    const auto info = l->Wait();
    ASSERT_TRUE(info) << "a request of a failed step did not end";
    EXPECT_EQ(info->reason, FinishReason::kError);
    EXPECT_NE(info->message.find("the forward pass failed"), std::string::npos) << info->message;
    EXPECT_TRUE(l->tokens().empty());
  }
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
  EXPECT_GE(model->failures(), 1);
  // Published after the iteration whose step failed, a moment after the listeners heard.
  for (int i = 0; i < 500 && frontend->Stats().load.forward_failures < model->failures(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(frontend->Stats().load.forward_failures, model->failures());

  failing->store(false);
  const std::vector<std::int32_t> prompt = Prompt(45, 30);
  auto next = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit({prompt, 7, {}}, next).status, AdmitStatus::kAccepted);
  const auto info = next->Wait();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->reason, FinishReason::kLength);
  EXPECT_EQ(next->tokens(), Clean({{prompt, 7, {}}})[0].tokens);
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
}

// The hook of `duet serve` and `duet worker`: no variable, no wrapper; with one, passes fail
// exactly while the file it names exists.
TEST_F(ForwardFault, TheEnvironmentHookFailsPassesWhileItsFileExists) {
  ::unsetenv(kFailForwardWhileFileEnv);
  auto plain = Model(64);
  ForwardModel* const raw = plain.get();
  EXPECT_EQ(InjectForwardFaultsFromEnvironment(std::move(plain)).get(), raw);

  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("duet_forward_fault_switch_" + std::to_string(::getpid()));
  std::filesystem::remove(file);
  ASSERT_EQ(::setenv(kFailForwardWhileFileEnv, file.c_str(), 1), 0);
  auto model = InjectForwardFaultsFromEnvironment(Model(64));
  ::unsetenv(kFailForwardWhileFileEnv);
  ASSERT_NE(dynamic_cast<FaultInjectingModel*>(model.get()), nullptr);

  const std::vector<std::int32_t> prompt = Prompt(20, 40);
  const std::vector<std::int32_t> table = {0, 1};
  const SequenceChunk chunk{prompt, 0, table, SequenceChunk::Logits::kLast};
  std::vector<std::int32_t> tokens;
  EXPECT_TRUE(model->ForwardGreedy({&chunk, 1}, &tokens).ok());
  EXPECT_EQ(tokens.size(), 1u);
  std::ofstream(file).put('1');
  tokens.clear();
  const Status failed = model->ForwardGreedy({&chunk, 1}, &tokens);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("fault injection"), std::string::npos) << failed.message();
  EXPECT_TRUE(tokens.empty());  // what the model appended is taken back
  std::vector<float> logits;
  EXPECT_FALSE(model->Forward({&chunk, 1}, &logits).ok());
  EXPECT_TRUE(logits.empty());
  std::filesystem::remove(file);
  EXPECT_TRUE(model->Forward({&chunk, 1}, &logits).ok());
  EXPECT_EQ(logits.size(), static_cast<std::size_t>(model->config().vocab_size));
}

}  // namespace
}  // namespace duet::backend::serve
