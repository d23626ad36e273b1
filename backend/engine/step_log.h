// A live server's step log, written as its steps happen (`duet serve --step-log`, `duet worker
// --step-log`): the lines of policies/step_log.h, each one write to a file several writers
// share.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/status.h"
#include "policies/step_log.h"

namespace duet::backend {

using policies::StepLogLine;

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
