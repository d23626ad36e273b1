// A framed message connection between the frontend and a worker process (wire.h frames) over a
// TCP socket: a reader thread hands each frame to a handler, a writer thread sends what
// Send queued, so a sender never blocks on a slow peer. Plain POSIX sockets: each direction has
// a thread blocked in read or write on the same descriptor, which Asio's synchronous socket
// object does not allow from two threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cluster/wire.h"
#include "common/status.h"
#include "common/units.h"

namespace duet::backend::cluster {

// A listening TCP socket; it and the connections it accepts are close-on-exec (a process
// this one starts must not hold them).
class Listener {
 public:
  // host: an IPv4 address ("127.0.0.1"); port 0: any free port.
  static Result<std::unique_ptr<Listener>> Open(const std::string& host, int port);
  ~Listener();
  int port() const { return port_; }
  // Waits up to `timeout_s` for a connection; returns its descriptor, or -1 on timeout or after
  // Close().
  int Accept(Seconds timeout_s);
  void Close();  // any thread: Accept returns -1 from now on

 private:
  Listener(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
  int stop_fd_ = -1;
};

// "host:port" with an IPv4 host and a port in min_port..65535; an error names what is wrong.
struct HostPort {
  std::string host;
  int port = 0;
};
Result<HostPort> ParseHostPort(const std::string& address, int min_port = 1);

// Connects to "host:port", retrying until `timeout_s` passed (the frontend may still be
// starting). Returns the connected descriptor.
Result<int> ConnectTo(const std::string& address, Seconds timeout_s);

// The address of this host that the kernel would send from to "host:port" (nothing is sent).
Result<std::string> SourceAddressToward(const std::string& address);
// The network device holding IPv4 address `ipv4` ("lo", "eth0", ...); an error when none does.
Result<std::string> DeviceOfAddress(const std::string& ipv4);

// Blocking frame I/O on a descriptor, for the handshake before a Connection takes it over.
Status WriteFrame(int fd, MessageKind kind, const std::string& body);
struct ReadFrameResult {
  FrameHeader header;
  std::string body;
};
// Waits up to `timeout_s` for a whole frame of at most `max_body_bytes` (less than the frame
// bound before the peer authenticated: its header alone would otherwise have this side
// allocate 64 MiB). An error names what was wrong (the peer closed, a malformed header or
// length, a timeout).
Result<ReadFrameResult> ReadFrame(int fd, Seconds timeout_s,
                                  std::uint32_t max_body_bytes = kMaxFrameBodyBytes);

class Connection {
 public:
  using FrameHandler = std::function<void(const FrameHeader&, std::string body)>;
  using CloseHandler = std::function<void(const std::string& why)>;

  // Takes `fd` (connected). After Start(), `on_frame` runs on the reader thread for each frame,
  // in order; `on_close` runs once on the reader thread when the connection ends (the peer
  // closed, a read failed, a frame header was malformed, Close() was called), after the last
  // on_frame. Neither may destroy the connection.
  Connection(int fd, FrameHandler on_frame, CloseHandler on_close);
  // Close() and join both threads.
  ~Connection();
  void Start();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Any thread; never blocks. Dropped once the connection is closed. A peer that leaves more
  // than kMaxQueuedBytes unread is cut off (it is not reading).
  void Send(MessageKind kind, const std::string& body);
  // Any thread: shuts the socket down; the reader thread then calls on_close.
  void Close();
  bool closed() const;
  // Waits up to `timeout_s` for everything queued to be written (or the connection to close).
  void WaitSent(Seconds timeout_s);

  static constexpr std::size_t kMaxQueuedBytes = std::size_t{1} << 30;

 private:
  void ReadLoop();
  void WriteLoop();

  int fd_;
  FrameHandler on_frame_;
  CloseHandler on_close_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::size_t queued_bytes_ = 0;
  bool writing_ = false;  // the writer holds a frame it took from the queue
  bool closed_ = false;
  std::thread reader_, writer_;
};

}  // namespace duet::backend::cluster
