// Tests of the server-sent events parser (backend/replay/sse.h): the format's rules (line ends,
// comments, fields, multi-line data, events without data, a byte-order mark), and the same
// events whatever the segmentation: every split point, byte by byte, CRLF pairs cut in two.
#include "backend/replay/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace duet::backend::replay {
namespace {

// Parses `stream` fed in pieces of the given sizes (the rest in one last piece).
std::vector<SseEvent> Parse(std::string_view stream, const std::vector<std::size_t>& pieces = {}) {
  SseParser parser;
  std::vector<SseEvent> events;
  std::size_t at = 0;
  for (std::size_t n : pieces) {
    const Status s = parser.Feed(stream.substr(at, n), events);
    EXPECT_TRUE(s.ok()) << s.message();
    at += n;
  }
  const Status s = parser.Feed(stream.substr(at), events);
  EXPECT_TRUE(s.ok()) << s.message();
  return events;
}

std::vector<std::string> Data(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& e : events) out.push_back(e.data);
  return out;
}

// A vLLM-like completion stream with every kind of line end, comments and the [DONE] sentinel.
const std::string kStream =
    ": ping\r\n"
    "data: {\"choices\":[{\"text\":\" a\"}]}\n\n"
    "data: {\"choices\":[{\"text\":\" b\"}]}\r\n\r\n"
    "data: {\"choices\":[{\"text\":\" c\"}]}\r\r"
    ":\n"
    "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\r\n\r\n"
    "data: [DONE]\n\n";
const std::vector<std::string> kStreamData = {
    "{\"choices\":[{\"text\":\" a\"}]}", "{\"choices\":[{\"text\":\" b\"}]}",
    "{\"choices\":[{\"text\":\" c\"}]}", "{\"choices\":[],\"usage\":{\"completion_tokens\":3}}",
    "[DONE]"};

TEST(Sse, ParsesAWholeStream) { EXPECT_EQ(Data(Parse(kStream)), kStreamData); }

TEST(Sse, EverySplitPointGivesTheSameEvents) {
  for (std::size_t cut = 0; cut <= kStream.size(); ++cut)
    EXPECT_EQ(Data(Parse(kStream, {cut})), kStreamData) << "cut at byte " << cut;
  for (std::size_t a = 1; a < kStream.size(); a += 7) {
    for (std::size_t b = 1; a + b < kStream.size(); b += 5)
      EXPECT_EQ(Data(Parse(kStream, {a, b})), kStreamData) << "cuts at " << a << ", " << a + b;
  }
}

TEST(Sse, ByteByByte) {
  EXPECT_EQ(Data(Parse(kStream, std::vector<std::size_t>(kStream.size(), 1))), kStreamData);
}

TEST(Sse, SeveralEventsInOnePieceAndEventsCompleteOnlyAtTheBlankLine) {
  SseParser parser;
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.Feed("data: 1\n\ndata: 2\n\ndata: 3\n", events).ok());
  EXPECT_EQ(Data(events), (std::vector<std::string>{"1", "2"}));
  EXPECT_TRUE(parser.pending());
  ASSERT_TRUE(parser.Feed("\n", events).ok());
  EXPECT_EQ(Data(events), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_FALSE(parser.pending());
}

TEST(Sse, CrlfCutBetweenCrAndLfIsOneLineEnd) {
  // "\r" alone ends a line; the "\n" arriving next must not end another (which, after a data
  // line, would dispatch the event early).
  SseParser parser;
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.Feed("data: a\r", events).ok());
  ASSERT_TRUE(parser.Feed("\ndata: b\r", events).ok());
  EXPECT_TRUE(events.empty()) << "dispatched before the blank line: " << events.front().data;
  ASSERT_TRUE(parser.Feed("\n\r", events).ok());
  EXPECT_EQ(Data(events), (std::vector<std::string>{"a\nb"}));
  ASSERT_TRUE(parser.Feed("\n", events).ok());
  EXPECT_EQ(events.size(), 1u);
}

TEST(Sse, FieldRules) {
  const auto events = Parse(
      "event: completion\n"
      "id: 42\n"
      "retry: 1000\n"
      "unknown: x\n"
      "data:no space\n"
      "data:  two spaces\n"
      "data\n"
      "\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "completion");
  EXPECT_EQ(events[0].id, "42");
  // One leading space is dropped, no more; "data" without a colon is an empty data line.
  EXPECT_EQ(events[0].data, "no space\n two spaces\n");
}

TEST(Sse, EventsWithoutDataAreNotDispatchedAndTypesReset) {
  const auto events = Parse("event: ping\n\n: comment\n\ndata: x\n\n\n\ndata:\n\n");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, "");  // the "ping" type went with its data-less event
  EXPECT_EQ(events[0].data, "x");
  EXPECT_EQ(events[1].data, "");  // "data:" with nothing after it is an empty event
}

TEST(Sse, ByteOrderMarkOnlyAtTheStart) {
  const std::string bom = "\xEF\xBB\xBF";
  EXPECT_EQ(Data(Parse(bom + "data: x\n\n")), (std::vector<std::string>{"x"}));
  EXPECT_EQ(Data(Parse(bom + "data: x\n\n", {1, 1})), (std::vector<std::string>{"x"}));
  // Not a mark after all: the bytes are kept (here they make an unknown field).
  EXPECT_EQ(Data(Parse("\xEF"
                       "data: x\n\ndata: y\n\n")),
            (std::vector<std::string>{"y"}));
  // A second mark is content.
  EXPECT_EQ(Data(Parse("data: " + bom + "x\n\n")), (std::vector<std::string>{bom + "x"}));
}

TEST(Sse, CutShortStreamLeavesPendingBytes) {
  SseParser parser;
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.Feed("data: {\"choices\":[{\"te", events).ok());
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(parser.pending());
}

TEST(Sse, OversizedEventIsAnErrorThatSticks) {
  SseParser parser(64);
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.Feed("data: " + std::string(40, 'a') + "\n", events).ok());
  const Status s = parser.Feed("data: " + std::string(40, 'b') + "\n\n", events);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("longer than 64 bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(events.empty());
  EXPECT_FALSE(parser.Feed("data: c\n\n", events).ok());
  // Under the limit, line after line, nothing is wrong.
  SseParser fine(64);
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(fine.Feed("data: " + std::string(40, 'a') + "\n\n", events).ok());
  EXPECT_EQ(events.size(), 100u);
}

}  // namespace
}  // namespace duet::backend::replay
