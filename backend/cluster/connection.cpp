// Framed TCP connections between the frontend and its workers (see connection.h).
#include "backend/cluster/connection.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace duet::backend::cluster {

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Waits for `fd` to become readable up to `deadline`; false on timeout.
bool WaitReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the read report it
  }
}

// Reads exactly `n` bytes; false when the peer closed or a read failed (`why` says which).
bool ReadAll(
    int fd, char* out, std::size_t n, std::string* why,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
  std::size_t got = 0;
  while (got < n) {
    if (deadline != std::chrono::steady_clock::time_point::max() && !WaitReadable(fd, deadline)) {
      *why = "timed out waiting for the peer";
      return false;
    }
    const ssize_t r = ::read(fd, out + got, n - got);
    if (r == 0) {
      *why = got == 0 ? "the peer closed the connection" : "the peer closed mid-frame";
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      *why = Errno("read");
      return false;
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Reads one frame; `deadline` bounds the wait (max: none).
Result<ReadFrameResult> ReadOneFrame(int fd, std::chrono::steady_clock::time_point deadline,
                                     std::uint32_t max_body_bytes = kMaxFrameBodyBytes) {
  std::string header(kFrameHeaderBytes, '\0');
  std::string why;
  if (!ReadAll(fd, header.data(), header.size(), &why, deadline)) return Status::Error(why);
  Result<FrameHeader> h = ParseFrameHeader(header);
  if (!h.ok()) return h.status();
  if (h->body_bytes > max_body_bytes) {
    return Status::Error("a frame body of " + std::to_string(h->body_bytes) +
                         " bytes, more than the " + std::to_string(max_body_bytes) +
                         " allowed here");
  }
  ReadFrameResult frame{*h, std::string(h->body_bytes, '\0')};
  if (!ReadAll(fd, frame.body.data(), frame.body.size(), &why, deadline)) return Status::Error(why);
  return frame;
}

}  // namespace

Result<std::unique_ptr<Listener>> Listener::Open(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return Status::Error("'" + host + "' is not an IPv4 address");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(Errno("socket"));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    const std::string error = Errno("listening on " + host + ":" + std::to_string(port));
    ::close(fd);
    return Status::Error(error);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<Listener> l(new Listener(fd, ntohs(addr.sin_port)));
  l->stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (l->stop_fd_ < 0) return Status::Error(Errno("eventfd"));
  return l;
}

Listener::~Listener() {
  ::close(fd_);
  ::close(stop_fd_);
}

int Listener::Accept(Seconds timeout_s) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  const int ms = timeout_s > 1e6 ? -1 : static_cast<int>(timeout_s * 1000);
  if (::poll(fds, 2, ms) <= 0 || (fds[1].revents & POLLIN)) return -1;
  const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) NoDelay(fd);
  return fd;
}

void Listener::Close() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(stop_fd_, &one, sizeof one);
}

Result<HostPort> ParseHostPort(const std::string& address, int min_port) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos) return Status::Error("'" + address + "' is not host:port");
  HostPort out;
  out.host = address.substr(0, colon);
  const std::string range = std::to_string(min_port) + "..65535";
  try {
    std::size_t used = 0;
    out.port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || out.port < min_port || out.port > 65535)
      throw std::out_of_range("");
  } catch (const std::exception&) {
    return Status::Error("'" + address + "': the port must be in " + range);
  }
  in_addr parsed{};
  if (::inet_pton(AF_INET, out.host.c_str(), &parsed) != 1)
    return Status::Error("'" + out.host + "' is not an IPv4 address");
  return out;
}

namespace {

// "host:port" as a socket address (the port in 1..65535).
Result<sockaddr_in> ParseAddress(const std::string& address) {
  auto parsed = ParseHostPort(address);
  if (!parsed.ok()) return parsed.status();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(parsed->port));
  ::inet_pton(AF_INET, parsed->host.c_str(), &addr.sin_addr);
  return addr;
}

}  // namespace

Result<int> ConnectTo(const std::string& address, Seconds timeout_s) {
  auto parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  sockaddr_in addr = *parsed;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  std::string last;
  do {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Error(Errno("socket"));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      NoDelay(fd);
      return fd;
    }
    last = Errno("connecting to " + address);
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return Status::Error(last);
}

Result<std::string> SourceAddressToward(const std::string& address) {
  auto parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  sockaddr_in addr = *parsed;
  // A datagram socket's connect sends nothing: the kernel only picks the route and the source.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(Errno("socket"));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string error = Errno("no route to " + address);
    ::close(fd);
    return Status::Error(error);
  }
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const int got = ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  ::close(fd);
  if (got != 0) return Status::Error(Errno("getsockname"));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return std::string(text);
}

Result<std::string> DeviceOfAddress(const std::string& ipv4) {
  in_addr want{};
  if (::inet_pton(AF_INET, ipv4.c_str(), &want) != 1)
    return Status::Error("'" + ipv4 + "' is not an IPv4 address");
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return Status::Error(Errno("getifaddrs"));
  std::string device;
  for (const ifaddrs* a = all; a != nullptr && device.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr)
      device = a->ifa_name;
  }
  ::freeifaddrs(all);
  if (device.empty()) return Status::Error(ipv4 + " is the address of no network device here");
  return device;
}

Status WriteFrame(int fd, MessageKind kind, const std::string& body) {
  const std::string frame = Frame(kind, body);
  if (!WriteAll(fd, frame.data(), frame.size())) return Status::Error(Errno("write"));
  return Status::Ok();
}

Result<ReadFrameResult> ReadFrame(int fd, Seconds timeout_s, std::uint32_t max_body_bytes) {
  return ReadOneFrame(fd,
                      std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s)),
                      max_body_bytes);
}

Connection::Connection(int fd, FrameHandler on_frame, CloseHandler on_close)
    : fd_(fd), on_frame_(std::move(on_frame)), on_close_(std::move(on_close)) {}

void Connection::Start() {
  DUET_CHECK(!reader_.joinable());
  reader_ = std::thread([this] { ReadLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
}

Connection::~Connection() {
  Close();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  ::close(fd_);
}

void Connection::WaitSent(Seconds timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return closed_ || (queue_.empty() && !writing_); });
}

void Connection::Send(MessageKind kind, const std::string& body) {
  std::string frame = Frame(kind, body);
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (queued_bytes_ + frame.size() > kMaxQueuedBytes) {
      closed_ = true;
      ::shutdown(fd_, SHUT_RDWR);
    } else {
      queued_bytes_ += frame.size();
      queue_.push_back(std::move(frame));
    }
  }
  cv_.notify_all();
}

void Connection::Close() {
  {
    std::lock_guard lock(mu_);
    if (!closed_) {
      closed_ = true;
      ::shutdown(fd_, SHUT_RDWR);
    }
  }
  cv_.notify_all();
}

bool Connection::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

void Connection::ReadLoop() {
  std::string why;
  while (true) {
    Result<ReadFrameResult> frame = ReadOneFrame(fd_, std::chrono::steady_clock::time_point::max());
    if (!frame.ok()) {
      why = frame.error();
      break;
    }
    on_frame_(frame->header, std::move(frame->body));
  }
  if (closed()) why = "closed: " + why;
  Close();
  on_close_(why);
}

void Connection::WriteLoop() {
  while (true) {
    std::string frame;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (closed_) return;
      frame = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= frame.size();
      writing_ = true;
    }
    const bool ok = WriteAll(fd_, frame.data(), frame.size());
    {
      std::lock_guard lock(mu_);
      writing_ = false;
    }
    cv_.notify_all();
    if (!ok) {
      Close();
      return;
    }
  }
}

}  // namespace duet::backend::cluster
