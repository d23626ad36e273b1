// Helpers of the tier tests: block contents, open descriptors, damaged files, and a real
// redis-server of the test's own on a loopback port (Debian's, installed by scripts/setup.sh).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/tiers/tier_blocks.h"

namespace duet::backend {

// block_bytes bytes that differ for every seed and offset.
inline std::vector<std::byte> BlockBytes(std::int64_t bytes, std::uint64_t seed) {
  std::vector<std::byte> out(static_cast<std::size_t>(bytes));
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return out;
}

inline int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

inline void FlipByte(const std::filesystem::path& file, std::size_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 1));
}

// A redis-server child process on 127.0.0.1, without persistence (a restart comes back empty).
class RedisServer {
 public:
  RedisServer() : port_(FreePort()) {}
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it (again, on the same port) and waits until it answers; false with error() if not.
  bool Start() {
    Kill();
    const std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // its start-up banner is not the test's
      ::dup2(null, 1), ::dup2(null, 2);
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--loglevel", "warning", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      if (Command("PING") == "PONG") return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "redis-server exited at start (status " + std::to_string(status) +
                 "): is it installed? scripts/setup.sh installs it";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    error_ = "redis-server did not answer on port " + port;
    return false;
  }
  // SIGKILL: no goodbye to its clients.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // One command's reply as text ("" if none): a status, a string or an integer.
  std::string Command(const std::string& command) const {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, {1, 0});
    std::string out;
    if (c && !c->err) {
      auto* r = static_cast<redisReply*>(redisCommand(c, command.c_str()));
      if (r) {
        if (r->type == REDIS_REPLY_INTEGER)
          out = std::to_string(r->integer);
        else if (r->str)
          out.assign(r->str, r->len);
        freeReplyObject(r);
      }
    }
    if (c) redisFree(c);
    return out;
  }
  RedisEndpoint endpoint() const {
    RedisEndpoint e;
    e.port = port_;
    return e;
  }
  const std::string& error() const { return error_; }

 private:
  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  int port_;
  pid_t pid_ = -1;
  std::string error_;
};

}  // namespace duet::backend
