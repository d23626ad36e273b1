// The live frontend on real engine threads with the CPU test model: outputs equal the
// single-threaded LocalEngine's, aborts free their blocks at the next step, admission is bounded,
// a drain lets in-flight requests finish, stop tokens end requests, and prefix-aware routing
// sends a repeated prompt to the instance whose KV events say it holds the prefix.
#include "backend/frontend/frontend.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/engine/fault_injecting_model.h"
#include "backend/engine/local_engine.h"
#include "backend/engine/step_executor.h"
#include "backend/model/test_model.h"
#include "tests/live/live_test_util.h"

namespace duet::backend::serve {
namespace {

using policies::FinishReason;

// A step log's path in the temp directory, one per test process.
std::string StepLogPath(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          (stem + "_" + std::to_string(::getpid()) + ".jsonl"))
      .string();
}

// The file's text; the file is removed.
std::string ReadAndRemove(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return text;
}

TEST_F(Frontend, ConcurrentRequestsOnTwoInstancesEqualTheLocalEngine) {
  FrontendOptions options;
  options.router.kind = policies::RouterKind::kLeastLoaded;
  auto frontend = Start(2, options);
  std::vector<std::shared_ptr<Collector>> listeners;
  std::vector<GenerationRequest> local;
  std::vector<int> instance_used(2, 0);
  for (int i = 0; i < 8; ++i) {
    LiveRequest r{Prompt(10 + 9 * i, i), 6 + i, {}};
    local.push_back({r.prompt, r.max_tokens, {}});
    listeners.push_back(std::make_shared<Collector>());
    const Admission a = frontend->Submit(r, listeners.back());
    ASSERT_EQ(a.status, AdmitStatus::kAccepted) << a.message;
  }
  auto model = Model(256);
  LocalEngine engine(*model, {});
  const auto expected = engine.Generate(local);
  for (std::size_t i = 0; i < listeners.size(); ++i) {
    const auto info = listeners[i]->Wait();
    ASSERT_TRUE(info) << "request " << i << " did not finish";
    EXPECT_EQ(info->reason, FinishReason::kLength);
    EXPECT_EQ(info->prompt_tokens, static_cast<Tokens>(local[i].prompt.size()));
    EXPECT_EQ(info->completion_tokens, local[i].max_tokens);
    EXPECT_GE(info->queue_s, 0);
    ASSERT_TRUE(info->instance == 0 || info->instance == 1);
    ++instance_used[static_cast<std::size_t>(info->instance)];
    EXPECT_EQ(listeners[i]->tokens(), expected[i].tokens) << "request " << i;
  }
  EXPECT_GT(instance_used[0], 0);
  EXPECT_GT(instance_used[1], 0);
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
}

// A model that records each pass's thread and batch, passing it on.
class RecordingModel final : public ForwardModel {
 public:
  struct Pass {
    std::thread::id thread;
    std::vector<std::tuple<std::size_t, std::int64_t, std::vector<std::int32_t>>>
        rows;  // tokens, context, blocks
  };
  explicit RecordingModel(std::unique_ptr<ForwardModel> inner) : inner_(std::move(inner)) {}
  Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override {
    Record(batch);
    return inner_->Forward(batch, logits);
  }
  Status ForwardGreedy(std::span<const SequenceChunk> batch,
                       std::vector<std::int32_t>* tokens) override {
    Record(batch);
    return inner_->ForwardGreedy(batch, tokens);
  }
  const models::ModelSpec& config() const override { return inner_->config(); }
  std::int64_t num_blocks() const override { return inner_->num_blocks(); }
  std::int32_t block_tokens() const override { return inner_->block_tokens(); }
  models::Dtype kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  std::int64_t kv_cache_bytes() const override { return inner_->kv_cache_bytes(); }
  std::vector<Pass> passes() {
    std::lock_guard lock(mu_);
    return passes_;
  }

 private:
  void Record(std::span<const SequenceChunk> batch) {
    Pass pass{std::this_thread::get_id(), {}};
    for (const SequenceChunk& c : batch)
      pass.rows.emplace_back(c.tokens.size(), c.context_before,
                             std::vector<std::int32_t>(c.block_table.begin(), c.block_table.end()));
    std::lock_guard lock(mu_);
    passes_.push_back(std::move(pass));
  }
  std::unique_ptr<ForwardModel> inner_;
  std::mutex mu_;
  std::vector<Pass> passes_;
};

// Each engine thread runs its model through a prefill, a decode step after it and a 16-row
// decode step before the frontend serves (WarmUp), on its own thread: the first request meets
// no cold step. The step log (below) and the replies (above) show none of it.
TEST_F(Frontend, EachEngineThreadWarmsItsModelUpBeforeServing) {
  std::vector<RecordingModel*> recorders;
  std::vector<std::unique_ptr<ForwardModel>> models;
  for (int i = 0; i < 2; ++i) {
    auto m = std::make_unique<RecordingModel>(Model(64));
    recorders.push_back(m.get());
    models.push_back(std::move(m));
  }
  const std::size_t prompt = WarmUpPrompt(*models[0]).size();
  ASSERT_GT(prompt, 16u);
  auto frontend = LiveFrontend::Start(std::move(models), {});
  ASSERT_TRUE(frontend.ok()) << frontend.error();
  for (RecordingModel* r : recorders) {
    const auto passes = r->passes();  // Start has returned: warmed, and nothing submitted
    ASSERT_EQ(passes.size(), 3u);
    EXPECT_NE(passes[0].thread, std::this_thread::get_id());
    ASSERT_EQ(passes[0].rows.size(), 1u);
    EXPECT_EQ(std::get<0>(passes[0].rows[0]), prompt);  // the prompt, from position 0
    EXPECT_EQ(std::get<1>(passes[0].rows[0]), 0);
    ASSERT_EQ(passes[1].rows.size(), 1u);
    EXPECT_EQ(std::get<0>(passes[1].rows[0]), 1u);  // one token after it
    EXPECT_EQ(std::get<1>(passes[1].rows[0]), static_cast<std::int64_t>(prompt));
    ASSERT_EQ(passes[2].rows.size(), 16u);  // 16 one-token sequences, a block each
    std::set<std::int32_t> blocks;
    for (const auto& [tokens, context, table] : passes[2].rows) {
      EXPECT_EQ(tokens, 1u);
      EXPECT_EQ(context, 1);
      ASSERT_EQ(table.size(), 1u);
      blocks.insert(table[0]);
    }
    EXPECT_EQ(blocks.size(), 16u);
    for (const auto& pass : passes) EXPECT_EQ(pass.thread, passes[0].thread);
  }
  // A request's passes run on the thread that warmed the model up.
  auto listener = std::make_shared<Collector>();
  ASSERT_EQ((*frontend)->Submit({Prompt(12, 3), 2, {}}, listener).status, AdmitStatus::kAccepted);
  const auto info = listener->Wait();
  ASSERT_TRUE(info);
  const auto passes = recorders[static_cast<std::size_t>(info->instance)]->passes();
  ASSERT_GT(passes.size(), 3u);
  EXPECT_EQ(passes.back().thread, passes[0].thread);
}

// Synchronous and asynchronous steps alike (the forward pass on the step thread: the line says
// "async").
TEST_F(Frontend, TheStepLogHasEveryStepOfEveryInstance) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string path = StepLogPath("duet_steps");
    auto log = StepLog::Open(path, StepLog::Mode::kTruncate);
    ASSERT_TRUE(log.ok()) << log.error();
    FrontendOptions options;
    options.router.kind = policies::RouterKind::kLeastLoaded;
    options.step_log = log->get();
    options.engine.async_steps = async;
    auto frontend = Start(2, options);
    // Distinct prompts (no prefix-cache hits): each instance prefills every prompt token it
    // serves and decodes every token but the first of each request.
    std::vector<std::shared_ptr<Collector>> listeners;
    for (int i = 0; i < 6; ++i) {
      listeners.push_back(std::make_shared<Collector>());
      ASSERT_EQ(frontend->Submit({Prompt(20 + 7 * i, 40 + i), 3 + i, {}}, listeners.back()).status,
                AdmitStatus::kAccepted);
    }
    std::vector<Tokens> prompt_tokens(2, 0), decode_rows(2, 0), streamed(2, 0);
    std::vector<int> served(2, 0);
    for (const auto& listener : listeners) {
      const auto info = listener->Wait();
      ASSERT_TRUE(info);
      ASSERT_TRUE(info->instance == 0 || info->instance == 1);
      const auto i = static_cast<std::size_t>(info->instance);
      prompt_tokens[i] += info->prompt_tokens;
      decode_rows[i] += info->completion_tokens - 1;
      streamed[i] += info->completion_tokens;
      ++served[i];
    }
    frontend.reset();  // the engine threads end: every step is written
    ASSERT_TRUE((*log)->Close().ok());

    const std::string text = ReadAndRemove(path);
    std::vector<Tokens> logged_prompt(2, 0), logged_rows(2, 0), logged_tokens(2, 0);
    std::vector<int> admitted(2, 0), finished(2, 0);
    std::vector<Seconds> free_from(2, 0);  // an instance's steps never overlap
    const Status read = policies::ReadStepLog(text, path, [&](const StepLogLine& line) {
      ASSERT_TRUE(line.instance == 0 || line.instance == 1);
      EXPECT_EQ(line.async, async);
      const auto i = static_cast<std::size_t>(line.instance);
      logged_prompt[i] += line.step.shape.PrefillTokens();
      logged_rows[i] += line.step.shape.decode_tokens;
      EXPECT_GE(line.start_s, free_from[i]);
      free_from[i] = line.start_s + line.iteration_s;
      // Every line has its host time by phase, and counts that add up to what was served, and
      // its forward pass's CPU time (which the reader bounds by the pass's time).
      EXPECT_TRUE(line.forward_cpu_s.has_value());
      ASSERT_TRUE(line.host);
      const models::HostCounts& c = line.host->counts;
      EXPECT_EQ(c.rows,
                static_cast<double>(line.step.shape.prefill.size() +
                                    static_cast<std::size_t>(line.step.shape.decode_tokens)));
      admitted[i] += static_cast<int>(c.admitted);
      finished[i] += static_cast<int>(c.finished);
      logged_tokens[i] += static_cast<Tokens>(c.tokens);
    });
    ASSERT_TRUE(read.ok()) << read.message();
    EXPECT_EQ(logged_prompt, prompt_tokens);
    EXPECT_EQ(logged_rows, decode_rows);
    EXPECT_EQ(admitted, served);
    EXPECT_EQ(finished, served);
    EXPECT_EQ(logged_tokens, streamed);
  }
}

// An idle engine thread that a request's message wakes logs its wake-up on the step it then
// runs: from the message's post (after the frontend's time) to the iteration's start (before the
// request's admission), so within the request's queueing less its frontend time. Steps that
// follow others at once carry none.
TEST_F(Frontend, AnIdleEnginesWakeUpIsLoggedOnTheStepItRan) {
  const std::string path = StepLogPath("duet_wake");
  auto log = StepLog::Open(path, StepLog::Mode::kTruncate);
  ASSERT_TRUE(log.ok()) << log.error();
  FrontendOptions options;
  options.step_log = log->get();
  auto frontend = Start(1, options);
  std::vector<FinishInfo> infos;
  for (int i = 0; i < 3; ++i) {
    // The engine has gone idle and blocks when the next request comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto listener = std::make_shared<Collector>();
    ASSERT_EQ(frontend->Submit({Prompt(12, 7 + i), 4, {}}, listener).status,
              AdmitStatus::kAccepted);
    const auto info = listener->Wait();
    ASSERT_TRUE(info);
    infos.push_back(*info);
  }
  frontend.reset();
  ASSERT_TRUE((*log)->Close().ok());
  const std::string text = ReadAndRemove(path);
  std::vector<StepLogLine> lines;
  const Status read =
      policies::ReadStepLog(text, path, [&](const StepLogLine& l) { lines.push_back(l); });
  ASSERT_TRUE(read.ok()) << read.message();
  // Each request's steps: its prefill, which the wake-up ran, then its decode steps.
  std::size_t request = 0;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    SCOPED_TRACE(k);
    if (lines[k].step.shape.prefill.empty()) {
      EXPECT_FALSE(lines[k].woke_s.has_value());
      continue;
    }
    ASSERT_LT(request, infos.size());
    ASSERT_TRUE(lines[k].woke_s.has_value());
    const FinishInfo& info = infos[request++];
    EXPECT_LE(*lines[k].woke_s, info.queue_s - info.frontend_s);
  }
  EXPECT_EQ(request, infos.size());
}

// Each step's line carries its forward pass's CPU time: at least what the pass burned on its
// thread, and, with a busy thread on the same core, well short of the pass's time (the pass was
// preempted), which is what `duet validate` reads to tell a slow pass from a preempted one.
TEST_F(Frontend, AStepLogsItsPassesCpuTimeWhichPreemptionLeavesShortOfItsTime) {
  constexpr Seconds kBurn = 0.01;
  // This thread's first core, for it and the threads it starts (they inherit it): the engine
  // thread and a spinner that never sleeps; both undone when the test ends, however it ends.
  struct OneBusyCore {
    cpu_set_t before{};
    std::atomic<bool> spin{true};
    std::thread spinner;
    OneBusyCore() {
      EXPECT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
      cpu_set_t one;
      CPU_ZERO(&one);
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &before)) {
          CPU_SET(c, &one);
          break;
        }
      EXPECT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
      spinner = std::thread([this] {
        while (spin.load(std::memory_order_relaxed)) {
        }
      });
    }
    ~OneBusyCore() {
      spin = false;
      spinner.join();
      EXPECT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
    }
  } busy;
  const std::string path = StepLogPath("duet_cpu");
  auto log = StepLog::Open(path, StepLog::Mode::kTruncate);
  ASSERT_TRUE(log.ok()) << log.error();
  FrontendOptions options;
  options.step_log = log->get();
  std::vector<std::unique_ptr<ForwardModel>> models;
  // Each pass first spends kBurn of its thread's CPU time (the fault-injecting wrapper's rule
  // runs on that thread before the pass), then runs the real one.
  models.push_back(std::make_unique<FaultInjectingModel>(
      Model(64), [&](std::int64_t, std::span<const SequenceChunk>) {
        const Seconds until = ThreadCpuSeconds() + kBurn;
        while (ThreadCpuSeconds() < until) {
        }
        return FaultInjectingModel::Fault::kNone;
      }));
  auto frontend = LiveFrontend::Start(std::move(models), options);
  ASSERT_TRUE(frontend.ok()) << frontend.error();
  auto listener = std::make_shared<Collector>();
  ASSERT_EQ((*frontend)->Submit({Prompt(30, 5), 12, {}}, listener).status, AdmitStatus::kAccepted);
  ASSERT_TRUE(listener->Wait());
  frontend->reset();
  ASSERT_TRUE((*log)->Close().ok());
  std::vector<StepLogLine> lines;
  const Status read = policies::ReadStepLog(ReadAndRemove(path), path,
                                            [&](const StepLogLine& l) { lines.push_back(l); });
  ASSERT_TRUE(read.ok()) << read.message();
  ASSERT_EQ(lines.size(), 12u);  // the prefill and 11 decode steps
  Seconds cpu_s = 0, forward_s = 0;
  for (const StepLogLine& line : lines) {
    ASSERT_TRUE(line.forward_cpu_s.has_value());
    EXPECT_GE(*line.forward_cpu_s, kBurn);
    cpu_s += *line.forward_cpu_s;
    forward_s += line.step.seconds;
  }
  // Two threads that never sleep share the core about evenly: passes of 10 ms of CPU span
  // several of the scheduler's slices, and run about half of their time.
  EXPECT_LT(cpu_s, 0.8 * forward_s) << cpu_s << " s on a core of " << forward_s << " s";
}

TEST_F(Frontend, AbortEndsTheRequestAndFreesItsBlocks) {
  auto frontend = Start(1, {});
  auto listener = std::make_shared<Collector>();
  std::atomic<std::int64_t> id{-1};
  LiveFrontend* f = frontend.get();
  // Aborts from the engine thread as the third token streams out (a client going away then).
  listener->on_token = [&](int count) {
    if (count != 3) return;
    while (id.load() < 0) std::this_thread::yield();  // Submit has not returned yet
    f->Abort(static_cast<policies::RequestId>(id.load()));
  };
  const Admission a = frontend->Submit({Prompt(40, 1), 200, {}}, listener);
  ASSERT_EQ(a.status, AdmitStatus::kAccepted);
  id = static_cast<std::int64_t>(a.id);
  const auto info = listener->Wait();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->reason, FinishReason::kAbort);
  // The abort takes effect at the next step boundary: no token after the third.
  EXPECT_EQ(info->completion_tokens, 3);
  EXPECT_EQ(listener->tokens().size(), 3u);
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
  frontend->Abort(a.id);  // finished: no effect
  frontend->Abort(12345);
}

TEST_F(Frontend, AdmissionIsBoundedAndInvalidRequestsAreRefused) {
  FrontendOptions options;
  options.max_pending_requests = 2;
  auto frontend = Start(1, options, 8);  // 128 tokens of KV, ~127 admissible
  auto a = std::make_shared<Collector>(), b = std::make_shared<Collector>();
  const Admission first = frontend->Submit({Prompt(8, 1), 100, {}}, a);
  const Admission second = frontend->Submit({Prompt(8, 2), 100, {}}, b);
  ASSERT_EQ(first.status, AdmitStatus::kAccepted);
  ASSERT_EQ(second.status, AdmitStatus::kAccepted);
  const Admission third = frontend->Submit({Prompt(8, 3), 4, {}}, std::make_shared<Collector>());
  EXPECT_EQ(third.status, AdmitStatus::kQueueFull) << third.message;
  EXPECT_EQ(frontend->Submit({{}, 4, {}}, std::make_shared<Collector>()).status,
            AdmitStatus::kInvalid);
  EXPECT_EQ(frontend->Submit({Prompt(4, 1), 0, {}}, std::make_shared<Collector>()).status,
            AdmitStatus::kInvalid);
  EXPECT_EQ(frontend->Submit({{1, 2, 100000}, 4, {}}, std::make_shared<Collector>()).status,
            AdmitStatus::kInvalid);
  const Admission too_long =
      frontend->Submit({Prompt(100, 4), 100, {}}, std::make_shared<Collector>());
  EXPECT_EQ(too_long.status, AdmitStatus::kTooLong);
  EXPECT_NE(too_long.message.find("200"), std::string::npos) << too_long.message;
  frontend->Abort(first.id);
  frontend->Abort(second.id);
  ASSERT_TRUE(a->Wait());
  ASSERT_TRUE(b->Wait());
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
  // Room again.
  auto c = std::make_shared<Collector>();
  const Admission again = frontend->Submit({Prompt(8, 3), 4, {}}, c);
  ASSERT_EQ(again.status, AdmitStatus::kAccepted) << again.message;
  ASSERT_TRUE(c->Wait());
}

TEST_F(Frontend, DrainLetsInFlightRequestsFinishThenRefuses) {
  auto frontend = Start(1, {});
  std::vector<std::shared_ptr<Collector>> listeners;
  for (int i = 0; i < 4; ++i) {
    listeners.push_back(std::make_shared<Collector>());
    ASSERT_EQ(frontend->Submit({Prompt(20, i), 12, {}}, listeners.back()).status,
              AdmitStatus::kAccepted);
  }
  EXPECT_EQ(frontend->Drain(60), 0);
  for (auto& l : listeners) {
    const auto info = l->Wait(std::chrono::seconds(0));
    ASSERT_TRUE(info) << "Drain returned before a request finished";
    EXPECT_EQ(info->reason, FinishReason::kLength);
    EXPECT_EQ(l->tokens().size(), 12u);
  }
  EXPECT_EQ(frontend->Submit({Prompt(4, 1), 2, {}}, std::make_shared<Collector>()).status,
            AdmitStatus::kDraining);
}

TEST_F(Frontend, DrainTimeoutAbortsWhatIsLeft) {
  // Sixteen long requests: the tiny model can finish one in a few milliseconds, not all of
  // them in the moment between the submits and the drain.
  auto frontend = Start(1, {});
  std::vector<std::shared_ptr<Collector>> listeners;
  for (std::int32_t i = 0; i < 16; ++i) {
    listeners.push_back(std::make_shared<Collector>());
    const Admission a = frontend->Submit({Prompt(20, i), 230, {}}, listeners.back());
    ASSERT_EQ(a.status, AdmitStatus::kAccepted) << a.message;
  }
  const std::int64_t aborted = frontend->Drain(0);
  EXPECT_GE(aborted, 1);
  // Drain returns once every listener has heard: each request either ran to its end or was
  // aborted short of it, and the aborted ones are the ones Drain counted.
  std::int64_t heard_aborted = 0;
  for (const auto& l : listeners) {
    const auto info = l->Wait(std::chrono::seconds(0));
    ASSERT_TRUE(info);
    if (info->reason == FinishReason::kAbort) {
      ++heard_aborted;
      EXPECT_LT(info->completion_tokens, 230);
    } else {
      EXPECT_EQ(info->reason, FinishReason::kLength);
      EXPECT_EQ(info->completion_tokens, 230);
    }
  }
  EXPECT_EQ(heard_aborted, aborted);
}

TEST_F(Frontend, StopTokenEndsTheRequest) {
  auto frontend = Start(1, {});
  auto probe = std::make_shared<Collector>();
  ASSERT_EQ(frontend->Submit({Prompt(30, 7), 8, {}}, probe).status, AdmitStatus::kAccepted);
  ASSERT_TRUE(probe->Wait());
  const auto greedy = probe->tokens();
  ASSERT_EQ(greedy.size(), 8u);
  auto l = std::make_shared<Collector>();
  LiveRequest r{Prompt(30, 7), 8, {}};
  r.sampling.stop_token_ids = {greedy[4]};
  ASSERT_EQ(frontend->Submit(r, l).status, AdmitStatus::kAccepted);
  const auto info = l->Wait();
  ASSERT_TRUE(info);
  const auto first_stop = std::find(greedy.begin(), greedy.end(), greedy[4]) - greedy.begin();
  EXPECT_EQ(info->reason, FinishReason::kStop);
  EXPECT_EQ(info->completion_tokens, first_stop + 1);
  EXPECT_EQ(l->tokens(),
            std::vector<std::int32_t>(greedy.begin(), greedy.begin() + first_stop + 1));
}

// Asynchronous steps on real engine threads: concurrent greedy streams, each stopping at a
// different step, get the synchronous LocalEngine's tokens, and nothing past their stop.
TEST_F(Frontend, AsynchronousStepsStreamTheSynchronousTokensAndStopWhereTheyDo) {
  std::vector<GenerationRequest> local;
  for (int i = 0; i < 6; ++i) local.push_back({Prompt(12 + 7 * i, 40 + i), 12, {}});
  auto model = Model(256);
  LocalEngine greedy_engine(*model, {});
  const auto greedy = greedy_engine.Generate(local);
  // Request i stops at its token i + 1 (request 5 runs to its length).
  for (int i = 0; i < 5; ++i)
    local[static_cast<std::size_t>(i)].sampling.stop_token_ids = {
        greedy[static_cast<std::size_t>(i)].tokens[static_cast<std::size_t>(i + 1)]};
  auto sync_model = Model(256);
  LocalEngine sync_engine(*sync_model, {});
  const auto expected = sync_engine.Generate(local);
  auto async_model = Model(256);
  LocalEngine async_local(*async_model, {.scheduler = {}, .async_steps = true, .on_token = {}});
  const auto local_async = async_local.Generate(local);

  FrontendOptions options;
  options.engine.async_steps = true;
  auto frontend = Start(2, options);
  std::vector<std::shared_ptr<Collector>> listeners;
  for (const GenerationRequest& g : local) {
    listeners.push_back(std::make_shared<Collector>());
    LiveRequest r{g.prompt, g.max_tokens, {}};
    r.sampling = g.sampling;
    ASSERT_EQ(frontend->Submit(r, listeners.back()).status, AdmitStatus::kAccepted);
  }
  for (std::size_t i = 0; i < listeners.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const auto info = listeners[i]->Wait();
    ASSERT_TRUE(info);
    EXPECT_EQ(local_async[i].tokens, expected[i].tokens);
    EXPECT_EQ(listeners[i]->tokens(), expected[i].tokens);
    EXPECT_EQ(info->completion_tokens, static_cast<Tokens>(expected[i].tokens.size()));
    EXPECT_EQ(info->reason, i < 5 ? FinishReason::kStop : FinishReason::kLength);
  }
  EXPECT_TRUE(EventuallyNoBlocksUsed(*frontend));
}

TEST_F(Frontend, PrefixAndKvAwareRoutingFollowTheKvEvents) {
  for (const auto kind : {policies::RouterKind::kPrefixAware, policies::RouterKind::kKvAware}) {
    SCOPED_TRACE(policies::ToString(kind));
    FrontendOptions options;
    options.router.kind = kind;
    auto frontend = Start(3, options);
    const auto prompt = Prompt(70, 9);  // 4 full blocks
    auto first = std::make_shared<Collector>();
    ASSERT_EQ(frontend->Submit({prompt, 4, {}}, first).status, AdmitStatus::kAccepted);
    const auto info1 = first->Wait();
    ASSERT_TRUE(info1);
    EXPECT_EQ(info1->cached_tokens, 0);
    // The engine publishes its KV events after the iteration that ended the request.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int i = 0; i < 3; ++i) {
      auto again = std::make_shared<Collector>();
      ASSERT_EQ(frontend->Submit({prompt, 4, {}}, again).status, AdmitStatus::kAccepted);
      const auto info = again->Wait();
      ASSERT_TRUE(info);
      EXPECT_EQ(info->instance, info1->instance) << "repeat " << i;
      EXPECT_EQ(info->cached_tokens, 64) << "repeat " << i;
    }
  }
}

}  // namespace
}  // namespace duet::backend::serve
