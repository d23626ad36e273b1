// A live server's step log file (see step_log.h).
#include "backend/engine/step_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace duet::backend {

Result<std::unique_ptr<StepLog>> StepLog::Open(const std::string& path, Mode mode) {
  // Appending either way: another writer may share the file once it is emptied.
  const int flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND | (mode == Mode::kTruncate ? O_TRUNC : 0);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
  return std::unique_ptr<StepLog>(new StepLog(path, fd));
}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::Write(const StepLogLine& line) {
  const std::string text = FormatStepLogLine(line);
  // One write: with O_APPEND the line lands whole at the end of the file.
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    int expected = 0;
    write_errno_.compare_exchange_strong(expected, n < 0 ? errno : EIO);
  }
}

Status StepLog::Close() {
  int error = write_errno_.load();
  if (fd_ >= 0 && ::close(fd_) != 0 && error == 0) error = errno;
  fd_ = -1;
  if (error != 0) return Status::Error(path_ + ": writing the step log: " + std::strerror(error));
  return Status::Ok();
}

}  // namespace duet::backend
