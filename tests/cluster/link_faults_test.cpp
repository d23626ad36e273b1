// The worker link's fault wrapper (backend/cluster/link_faults.h): what its file may say, and
// that it corrupts or silences exactly the frames it names, once, on its instance only. The
// frontend's side of these faults is driven end to end by
// tests/serve/python/test_workers.py::test_a_worker_link_fault_moves_its_requests.
#include "backend/cluster/link_faults.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

namespace duet::backend::cluster {
namespace {

TEST(LinkFaults, TheFileSaysInstanceFaultAndFrame) {
  auto f = ParseLinkFault("1 corrupt 3\n", "f");
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->instance, 1);
  EXPECT_EQ(f->kind, LinkFault::Kind::kCorrupt);
  EXPECT_EQ(f->nth_events, 3);
  f = ParseLinkFault("0 silence 1", "f");
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->kind, LinkFault::Kind::kSilence);
  for (const char* bad : {"", "1 corrupt", "1 drop 3", "1 corrupt 0", "-1 corrupt 3",
                          "1 corrupt 3 4", "x corrupt 3"}) {
    auto parsed = ParseLinkFault(bad, "FILE");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.error().find("FILE: must read \"INSTANCE FAULT N\""), std::string::npos)
        << parsed.error();
  }
}

struct Sent {
  std::vector<std::pair<MessageKind, std::string>> frames;
  FaultInjectingLink::Send sender() {
    return [this](MessageKind kind, const std::string& body) { frames.emplace_back(kind, body); };
  }
};

// The fault a file of this test's own asks for, read as `duet worker` reads it (through the
// environment); the file is removed when the fault fires.
LinkFault Armed(const char* text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("duet_link_fault_" + std::to_string(::getpid()) + "_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::ofstream(path) << text;
  ::setenv(kWorkerLinkFaultEnv, path.c_str(), 1);
  auto fault = LinkFaultFromEnvironment();
  ::unsetenv(kWorkerLinkFaultEnv);
  EXPECT_TRUE(fault.ok() && *fault) << (fault.ok() ? "none" : fault.error());
  return fault.ok() && *fault ? **fault : LinkFault{};
}

TEST(LinkFaults, TheHookIsOffUnsetAndAnErrorForAFileItCannotRead) {
  ::unsetenv(kWorkerLinkFaultEnv);
  auto none = LinkFaultFromEnvironment();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  ::setenv(kWorkerLinkFaultEnv, "/nonexistent/duet-link-fault", 1);
  auto missing = LinkFaultFromEnvironment();
  ::unsetenv(kWorkerLinkFaultEnv);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("/nonexistent/duet-link-fault: cannot read"), std::string::npos)
      << missing.error();
}

TEST(LinkFaults, CorruptSpoilsTheNthEventsFrameOnceAndRemovesTheFile) {
  Sent sent;
  const LinkFault fault = Armed("1 corrupt 2");
  FaultInjectingLink link(sent.sender(), fault);
  link.SetInstance(1);
  const std::string body = EncodeHeartbeat({});
  for (int i = 0; i < 4; ++i) {
    link(MessageKind::kHeartbeat, body);  // other kinds are not counted
    link(MessageKind::kEvents, body);
  }
  ASSERT_EQ(sent.frames.size(), 8u);
  for (std::size_t i = 0; i < sent.frames.size(); ++i) {
    const bool spoiled = i == 3;  // the second events frame
    EXPECT_EQ(sent.frames[i].second == body, !spoiled) << i;
    EXPECT_EQ(sent.frames[i].second.size(), body.size()) << i;
  }
  EXPECT_FALSE(ParseEvents(sent.frames[3].second).ok());
  EXPECT_FALSE(std::filesystem::exists(fault.path));
}

TEST(LinkFaults, SilenceStopsEverythingFromTheNthEventsFrameOn) {
  Sent sent;
  const LinkFault fault = Armed("0 silence 2");
  FaultInjectingLink link(sent.sender(), fault);
  link.SetInstance(0);
  link(MessageKind::kEvents, "a");
  link(MessageKind::kHeartbeat, "b");
  link(MessageKind::kEvents, "c");  // the second: silence from here
  link(MessageKind::kHeartbeat, "d");
  link(MessageKind::kEngine, "e");
  ASSERT_EQ(sent.frames.size(), 2u);
  EXPECT_EQ(sent.frames[1].second, "b");
  EXPECT_FALSE(std::filesystem::exists(fault.path));
}

TEST(LinkFaults, AnotherInstanceAndNoFaultSendEverything) {
  for (bool other : {true, false}) {
    Sent sent;
    std::optional<LinkFault> fault;
    if (other) fault = *ParseLinkFault("1 silence 1", "f");
    FaultInjectingLink link(sent.sender(), fault);
    link.SetInstance(2);
    for (int i = 0; i < 3; ++i) link(MessageKind::kEvents, "x");
    EXPECT_EQ(sent.frames.size(), 3u) << other;
  }
}

}  // namespace
}  // namespace duet::backend::cluster
