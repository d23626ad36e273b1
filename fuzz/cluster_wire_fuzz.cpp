// Fuzz target: the messages between the frontend and its workers (backend/cluster/wire.h). The
// first byte picks the parser (frame header, or one message kind's body, the handshake's
// included), the rest is its input. Any input is parsed or rejected with an error, never a
// crash; what parses re-encodes to bytes that parse again.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "backend/cluster/wire.h"
#include "common/status.h"

using namespace duet::backend::cluster;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 11) {
    case 0:
      (void)ParseFrameHeader(body);
      break;
    case 1:
      if (auto m = ParseHello(body); m.ok()) DUET_CHECK(ParseHello(EncodeHello(*m)).ok());
      break;
    case 2:
      if (auto m = ParseWelcome(body); m.ok()) DUET_CHECK(ParseWelcome(EncodeWelcome(*m)).ok());
      break;
    case 3:
      if (auto m = ParsePeer(body); m.ok()) DUET_CHECK(ParsePeer(EncodePeer(*m)).ok());
      break;
    case 4:
      if (auto m = ParseEngine(body); m.ok()) DUET_CHECK(ParseEngine(EncodeEngine(*m)).ok());
      break;
    case 5:
      if (auto m = ParseEvents(body); m.ok()) DUET_CHECK(ParseEvents(EncodeEvents(*m)).ok());
      break;
    case 6:
      if (auto m = ParseHeartbeat(body); m.ok())
        DUET_CHECK(ParseHeartbeat(EncodeHeartbeat(*m)).ok());
      break;
    case 7:
      if (auto m = ParseChallenge(body); m.ok())
        DUET_CHECK(ParseChallenge(EncodeChallenge(*m)).ok());
      break;
    case 8:
      if (auto m = ParseProof(body); m.ok()) DUET_CHECK(ParseProof(EncodeProof(*m)).ok());
      break;
    case 9:
      if (auto m = ParseClockProbe(body); m.ok())
        DUET_CHECK(ParseClockProbe(EncodeClockProbe(*m)).ok());
      break;
    default:
      if (auto m = ParseClockReply(body); m.ok())
        DUET_CHECK(ParseClockReply(EncodeClockReply(*m)).ok());
      break;
  }
  return 0;
}
