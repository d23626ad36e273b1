// Duet's one error convention: Status / Result<T> for what can fail at run time (bad input,
// a missing file), DUET_CHECK for broken invariants (aborts with file and line, always on).
// Exceptions are used only at the edges (cli/main.cpp) and never cross these interfaces.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace duet {

class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& message() const {
    static const std::string kOk = "ok";
    return message_ ? *message_ : kOk;
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

// A value or an error message. Access to value() on an error is a broken invariant.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) {
      std::fprintf(stderr, "duet: Result constructed from an OK status without a value\n");
      std::abort();
    }
  }

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Status& status() const { return status_; }
  const std::string& error() const { return status_.message(); }

  T& value() & {
    CheckHasValue();
    return *value_;
  }
  const T& value() const& {
    CheckHasValue();
    return *value_;
  }
  T&& value() && {
    CheckHasValue();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckHasValue() const {
    if (!value_) {
      std::fprintf(stderr, "duet: value() on an error Result: %s\n", status_.message().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace duet

// Always-on invariant check: prints the condition, file and line, then aborts.
#define DUET_CHECK(cond)                                                                        \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "duet: invariant failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

#define DUET_CHECK_MSG(cond, msg)                                               \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "duet: invariant failed: %s (%s) at %s:%d\n", #cond, \
                   std::string(msg).c_str(), __FILE__, __LINE__);               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

// Propagates an error Status out of the calling function.
#define DUET_RETURN_IF_ERROR(expr) \
  do {                             \
    ::duet::Status _st = (expr);   \
    if (!_st.ok()) return _st;     \
  } while (0)
