// Every engine step of a live server as one JSON line, written as it happens (`duet serve
// --step-log`, `duet worker --step-log`, docs/serving.md): the step's shape and its forward
// pass's time as "seconds" (a line `duet calibrate --measurements` reads), the instance
// ("instance"), when the iteration that ran it began on the server's clock ("start_s"), how
// long that whole iteration took ("iteration_s": scheduling, the forward pass, sampling and
// handing the tokens on) and its host time by phase with the step's counts ("host":
// models/host_time.h). `duet validate` reads it to say where the simulator's error comes
// from; `duet calibrate --host-steps` fits host time to it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend/engine/step_executor.h"
#include "common/status.h"
#include "models/host_time.h"

namespace duet::backend {

// One line of a step log.
struct StepLogLine {
  policies::InstanceId instance = 0;
  Seconds start_s = 0;
  Seconds iteration_s = 0;
  StepTiming step;  // the shape and its forward pass's time
  // Its host time outside the forward pass by phase, and its counts (none in logs written
  // before the phases were measured).
  std::optional<models::HostStep> host;
  // Asynchronous steps ("async": true): the forward pass ran on the step thread while the
  // engine planned, applied and streamed, so it and the phases overlap the iteration instead
  // of adding up to at most it.
  bool async = false;
  // The iteration's host time outside its forward pass (a line with `host`): the iteration
  // less the pass, or, asynchronous, the phases' sum (the pass overlapped the iteration).
  Seconds HostSeconds() const;
};
// The line as the log holds it (its newline included).
std::string FormatStepLogLine(const StepLogLine& line);
// Calls `each` for every line of a step log, in order (blank lines skipped); stops at the first
// bad line with an error naming `where`:line and the field. One step's "seconds" is one
// number; unless the line is "async", it and the "host" phases add up to at most "iteration_s".
Status ReadStepLog(std::string_view text, const std::string& where,
                   const std::function<void(const StepLogLine&)>& each);

class StepLog {
 public:
  // kTruncate empties the file first. Either way each line is one write(2) to a file opened
  // with O_APPEND, so writers in several threads and processes share one file without mixing
  // their lines.
  enum class Mode { kTruncate, kAppend };
  static Result<std::unique_ptr<StepLog>> Open(const std::string& path, Mode mode);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Any thread. A failed write is remembered (Close reports it); the engine goes on.
  void Write(const StepLogLine& line);
  // Ok, or the first write that failed.
  Status Close();

 private:
  StepLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::atomic<int> write_errno_{0};
};

}  // namespace duet::backend
