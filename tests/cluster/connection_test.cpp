// Framed connections between the frontend and its workers over real loopback TCP sockets:
// frames arrive whole and in order, a peer that closes or sends a malformed header ends the
// connection with the reason, and connecting where nobody listens fails after its timeout.
#include "backend/cluster/connection.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <future>
#include <mutex>

namespace duet::backend::cluster {
namespace {

// What one side of a connection received.
struct Received {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<MessageKind, std::string>> frames;
  std::string closed_why;
  bool closed = false;

  Connection::FrameHandler OnFrame() {
    return [this](const FrameHeader& h, std::string body) {
      std::lock_guard lock(mu);
      frames.emplace_back(h.kind, std::move(body));
      cv.notify_all();
    };
  }
  Connection::CloseHandler OnClose() {
    return [this](const std::string& why) {
      std::lock_guard lock(mu);
      closed = true;
      closed_why = why;
      cv.notify_all();
    };
  }
  bool WaitFrames(std::size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return frames.size() >= n; });
  }
  bool WaitClosed() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return closed; });
  }
};

// A connected pair of descriptors: (client, server).
std::pair<int, int> Pair(Listener& listener) {
  auto client = std::async(std::launch::async, [&] {
    return ConnectTo("127.0.0.1:" + std::to_string(listener.port()), 10.0);
  });
  const int server = listener.Accept(10.0);
  auto fd = client.get();
  EXPECT_TRUE(fd.ok()) << fd.error();
  EXPECT_GE(server, 0);
  return {*fd, server};
}

TEST(Connection, FramesArriveWholeAndInOrderBothWays) {
  auto listener = Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.error();
  auto [a_fd, b_fd] = Pair(**listener);
  Received at_a, at_b;
  Connection a(a_fd, at_a.OnFrame(), at_a.OnClose());
  Connection b(b_fd, at_b.OnFrame(), at_b.OnClose());
  a.Start();
  b.Start();
  const std::string big(3 << 20, 'x');  // larger than a socket buffer
  for (int i = 0; i < 100; ++i) a.Send(MessageKind::kEvents, std::to_string(i));
  a.Send(MessageKind::kEngine, big);
  b.Send(MessageKind::kPeer, "back");
  ASSERT_TRUE(at_b.WaitFrames(101));
  ASSERT_TRUE(at_a.WaitFrames(1));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(at_b.frames[static_cast<std::size_t>(i)].second, std::to_string(i));
    EXPECT_EQ(at_b.frames[static_cast<std::size_t>(i)].first, MessageKind::kEvents);
  }
  EXPECT_EQ(at_b.frames[100].second, big);
  EXPECT_EQ(at_a.frames[0].second, "back");
  a.WaitSent(10.0);

  // One side closes: the other hears of it once, with the reason.
  a.Close();
  ASSERT_TRUE(at_b.WaitClosed());
  EXPECT_EQ(at_b.closed_why, "the peer closed the connection");
  ASSERT_TRUE(at_a.WaitClosed());
  EXPECT_TRUE(b.closed());
  b.Send(MessageKind::kEvents, "dropped");  // no effect once closed
}

TEST(Connection, AMalformedHeaderEndsTheConnectionWithTheReason) {
  auto listener = Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.error();
  auto [raw, fd] = Pair(**listener);
  Received got;
  Connection c(fd, got.OnFrame(), got.OnClose());
  c.Start();
  const std::string garbage = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::write(raw, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  ASSERT_TRUE(got.WaitClosed());
  EXPECT_NE(got.closed_why.find("no DUET magic"), std::string::npos) << got.closed_why;
  EXPECT_TRUE(got.frames.empty());
  ::close(raw);
}

TEST(Connection, BlockingHandshakeFramesAndTheirTimeout) {
  auto listener = Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.error();
  auto [a, b] = Pair(**listener);
  ASSERT_TRUE(WriteFrame(a, MessageKind::kHello, "hi").ok());
  auto frame = ReadFrame(b, 10.0);
  ASSERT_TRUE(frame.ok()) << frame.error();
  EXPECT_EQ(frame->header.kind, MessageKind::kHello);
  EXPECT_EQ(frame->body, "hi");
  auto none = ReadFrame(b, 0.05);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().find("timed out"), std::string::npos);
  ::close(a);
  auto closed = ReadFrame(b, 10.0);
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.error().find("closed"), std::string::npos);
  ::close(b);
}

TEST(Connection, ConnectingFailsClearly) {
  auto listener = Listener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const int port = (*listener)->port();
  listener->reset();  // nobody listens there now
  auto refused = ConnectTo("127.0.0.1:" + std::to_string(port), 0.2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("connecting to 127.0.0.1:"), std::string::npos);
  const std::pair<const char*, const char*> bad[] = {
      {"localhost", "'localhost' is not host:port"},
      {"127.0.0.1:x", "'127.0.0.1:x': the port must be in 1..65535"},
      {"127.0.0.1:70000", "'127.0.0.1:70000': the port must be in 1..65535"},
      {"example.com:80", "'example.com' is not an IPv4 address"}};
  for (const auto& [address, error] : bad) {
    auto r = ConnectTo(address, 0.1);
    ASSERT_FALSE(r.ok()) << address;
    EXPECT_EQ(r.error(), error);
  }
  EXPECT_FALSE(Listener::Open("not-an-address", 0).ok());
}

}  // namespace
}  // namespace duet::backend::cluster
