// The live servers' step log: lines from several threads and several writers on one file land
// whole and read back as written, `duet calibrate --measurements` reads the same file, bad
// lines are named, and a write that fails is reported when the log closes.
#include "backend/engine/step_log.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "models/step_profile.h"
#include "tests/model/temp_dir.h"

namespace duet::backend {
namespace {

using policies::FormatStepLogLine;
using policies::ReadStepLog;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Line k of writer w: a decode step of k + 1 rows, or a prefill chunk on every third line.
StepLogLine LineOf(int w, int k) {
  StepLogLine line;
  line.instance = w;
  line.start_s = k * 0.25;
  line.step.seconds = 1e-3 * (k + 1);
  line.iteration_s = line.step.seconds + 1e-4;
  if (k % 3 == 0) {
    line.step.shape.prefill = {{16 + k, 32 * w}};
  } else {
    line.step.shape.decode_tokens = k + 1;
    line.step.shape.decode_context_tokens = 100 * (k + 1);
  }
  if (k % 2 == 0) {  // and lines without host phases, as servers before them wrote
    models::HostStep host;
    for (std::size_t p = 0; p < models::kHostPhases; ++p)
      host.phase_s[p] = 1e-6 * static_cast<double>(p + 1) / (k + 1);
    host.counts = {static_cast<double>(k % 7), 1, static_cast<double>(w), 3};
    line.host = host;
  }
  if (k % 5 == 0) line.woke_s = 1e-5 * (w + 1);  // a message woke the idle engine before it
  if (k % 4 != 3) line.forward_cpu_s = line.step.seconds * (0.5 + 0.1 * (k % 5));
  return line;
}

TEST(StepLogTest, ConcurrentWritersLandWholeLinesThatReadBackAsWritten) {
  TempDir dir;
  const std::string path = dir.File("steps.jsonl");
  dir.Write("steps.jsonl", "left from an earlier run\n");
  auto first = StepLog::Open(path, StepLog::Mode::kTruncate);  // a server: empties it
  ASSERT_TRUE(first.ok()) << first.error();
  auto second = StepLog::Open(path, StepLog::Mode::kAppend);  // a worker process's own
  ASSERT_TRUE(second.ok()) << second.error();
  constexpr int kWriters = 4, kLines = 500;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    StepLog* log = (w % 2 == 0 ? *first : *second).get();
    threads.emplace_back([log, w] {
      for (int k = 0; k < kLines; ++k) log->Write(LineOf(w, k));
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE((*first)->Close().ok());
  ASSERT_TRUE((*second)->Close().ok());

  const std::string text = ReadFile(path);
  std::vector<int> next(kWriters, 0);  // each writer's lines stay in its order
  const Status read = ReadStepLog(text, path, [&](const StepLogLine& line) {
    ASSERT_LT(line.instance, kWriters);  // (ReadStepLog refuses a negative one)
    const StepLogLine want = LineOf(line.instance, next[line.instance]++);
    EXPECT_EQ(line.start_s, want.start_s);
    EXPECT_EQ(line.iteration_s, want.iteration_s);
    EXPECT_EQ(line.step.seconds, want.step.seconds);
    EXPECT_EQ(models::StepShapeToJson(line.step.shape), models::StepShapeToJson(want.step.shape));
    ASSERT_EQ(line.host.has_value(), want.host.has_value());
    if (want.host) {
      EXPECT_EQ(models::HostStepToJson(*line.host), models::HostStepToJson(*want.host));
    }
    EXPECT_EQ(line.woke_s, want.woke_s);
    EXPECT_EQ(line.forward_cpu_s, want.forward_cpu_s);
  });
  ASSERT_TRUE(read.ok()) << read.message();
  EXPECT_EQ(next, std::vector<int>(kWriters, kLines));

  // The same file is a measurements file: `duet calibrate --measurements` fits it.
  auto measurements = models::ParseStepMeasurements(text, path);
  ASSERT_TRUE(measurements.ok()) << measurements.error();
  EXPECT_EQ(measurements->size(), std::size_t{kWriters * kLines});
}

TEST(StepLogTest, BadLinesAreNamedWithTheirLineAndField) {
  const std::string good = FormatStepLogLine(LineOf(0, 1));
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {good + "{not json\n", "log:2: not valid JSON"},
      {R"({"decode_tokens": 2, "decode_context_tokens": 9, "seconds": [0.1, 0.2],)"
       R"( "instance": 0, "start_s": 0, "iteration_s": 1})",
       "log:1: field 'seconds' must be one number"},
      {R"({"decode_tokens": 2, "decode_context_tokens": 9, "seconds": 0.1, "start_s": 0,)"
       R"( "iteration_s": 1})",
       "log:1: field 'instance' is missing"},
      {R"({"decode_tokens": 2, "decode_context_tokens": 9, "seconds": 0.1, "instance": 0,)"
       R"( "start_s": 0, "iteration_s": 0.05})",
       "log:1: field 'iteration_s'"},
      {R"({"decode_tokens": 0, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1})",
       "log:1: a step with no tokens"},
      {R"({"decode_tokens": 1, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "host": {"schedule_s": 0.1}})",
       "log:1: host: field 'allocate_s' is missing"},
      {R"({"decode_tokens": 1, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "host": {"schedule_s": 0.1, "allocate_s": 0, "prepare_s": 0, "sample_s": 0,)"
       R"( "apply_s": 0, "stream_s": 0, "rows": -1, "admitted": 0, "finished": 0, "tokens": 1}})",
       "log:1: host: field 'rows'"},
      // The phases are parts of the iteration: with the forward pass, no more than it.
      {R"({"decode_tokens": 1, "seconds": 0.5, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "host": {"schedule_s": 0.2, "allocate_s": 0.1, "prepare_s": 0.1, "sample_s": 0.1,)"
       R"( "apply_s": 0.1, "stream_s": 0, "rows": 1, "admitted": 0, "finished": 0, "tokens": 1}})",
       "log:1: field 'host' phases and \"seconds\" add up to more than \"iteration_s\""},
      {R"({"decode_tokens": 2, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "woke_s": -0.001})",
       "log:1: field 'woke_s'"},
      // A thread's CPU time within the pass: neither negative nor more than the pass.
      {R"({"decode_tokens": 2, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "forward_cpu_s": -0.001})",
       "log:1: field 'forward_cpu_s'"},
      {R"({"decode_tokens": 2, "seconds": 0.1, "instance": 0, "start_s": 0, "iteration_s": 1,)"
       R"( "forward_cpu_s": 0.11})",
       "log:1: field 'forward_cpu_s'"},
  };
  for (const Case& c : cases) {
    int lines = 0;
    const Status read = ReadStepLog(c.text, "log", [&](const StepLogLine&) { ++lines; });
    ASSERT_FALSE(read.ok()) << c.text;
    EXPECT_NE(read.message().find(c.message), std::string::npos) << read.message();
  }
  int lines = 0;
  EXPECT_TRUE(ReadStepLog(good + "\n" + good, "log", [&](const StepLogLine&) { ++lines; }).ok());
  EXPECT_EQ(lines, 2);
  EXPECT_NE(ReadStepLog(R"({"decode_tokens": 2, "seconds": 0.1, "instance": 0, "start_s": 0,)"
                        R"( "iteration_s": 1, "async": 1})",
                        "log", [](const StepLogLine&) {})
                .message()
                .find("log:1: field 'async'"),
            std::string::npos);
}

// Asynchronous steps: the forward pass ran on the step thread while the engine's iteration
// went on, so the line's phases and "seconds" may add up to more than its iteration (and the
// pass may outlast it); the line says so and reads back as written.
TEST(StepLogTest, AsyncLinesMayOverlapTheirIteration) {
  StepLogLine line = LineOf(0, 2);
  line.async = true;
  line.iteration_s = line.step.seconds / 2;
  line.host->phase_s[0] = line.step.seconds;
  const std::string text = FormatStepLogLine(line);
  std::vector<StepLogLine> read;
  const Status ok = ReadStepLog(text, "log", [&](const StepLogLine& l) { read.push_back(l); });
  ASSERT_TRUE(ok.ok()) << ok.message();
  ASSERT_EQ(read.size(), 1u);
  EXPECT_TRUE(read[0].async);
  EXPECT_EQ(read[0].iteration_s, line.iteration_s);
  EXPECT_EQ(models::HostStepToJson(*read[0].host), models::HostStepToJson(*line.host));
  // The same line without the flag is refused: synchronous phases sit inside their iteration.
  line.async = false;
  EXPECT_FALSE(ReadStepLog(FormatStepLogLine(line), "log", [](const StepLogLine&) {}).ok());
  EXPECT_EQ(FormatStepLogLine(LineOf(0, 2)).find("async"), std::string::npos);
}

TEST(StepLogTest, AFailedWriteIsReportedWhenTheLogCloses) {
  // Every write to /dev/full fails (ENOSPC): the engine goes on, Close says so.
  auto log = StepLog::Open("/dev/full", StepLog::Mode::kAppend);
  ASSERT_TRUE(log.ok()) << log.error();
  (*log)->Write(LineOf(0, 0));
  const Status closed = (*log)->Close();
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.message().find("/dev/full: writing the step log"), std::string::npos)
      << closed.message();

  TempDir dir;
  auto missing = StepLog::Open(dir.File("no/such/dir/steps.jsonl"), StepLog::Mode::kTruncate);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("no/such/dir/steps.jsonl: cannot open"), std::string::npos)
      << missing.error();
}

}  // namespace
}  // namespace duet::backend
