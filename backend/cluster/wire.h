// The messages between the frontend of `duet serve` and its worker processes (`duet worker`),
// and their framing on a byte stream. A frame is a 12-byte header, "DUET", the protocol
// version (u16), the message kind (u16) and the body's length (u32), little-endian, then the
// body: one MessagePack map (nlohmann_json's codec). Bodies are bounded (kMaxFrameBodyBytes),
// their nesting and declared lengths checked before decoding (kMaxNestingDepth); every field
// is checked on the way in, so a malformed, oversized or out-of-range message is an error
// naming what is wrong, never a crash or a request the engine cannot hold.
//
// A link opens with a mutual challenge and response over a shared secret (link_auth.h): the
// worker's hello carries its nonce, the frontend's challenge its own nonce and its proof, the
// worker's proof answers; only then does the frontend welcome it.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/engine/engine_thread.h"
#include "common/status.h"
#include "common/units.h"
#include "deploy/engine_settings.h"
#include "policies/block_manager.h"
#include "policies/engine.h"
#include "policies/instance_load.h"
#include "policies/ports.h"
#include "policies/request.h"
#include "policies/scheduler.h"

namespace duet::backend::cluster {

// 2: the hello's nonce, the challenge and the proof (link authentication). 3: the welcome
// carries every engine setting (deploy::EngineSettings' codec). 4: a request travels as its
// spec, record and progress; events carry the record only.
inline constexpr std::uint16_t kWireVersion = 5;
inline constexpr std::size_t kFrameHeaderBytes = 12;
// A request descriptor of the longest prompt Duet admits (a few million token ids) fits.
inline constexpr std::uint32_t kMaxFrameBodyBytes = 64u << 20;
// Before a peer proved it holds the secret, its frames are at most this (a hello with the
// largest KV descriptor).
inline constexpr std::uint32_t kMaxHandshakeBodyBytes = (1u << 20) + 4096;
// Maps and arrays within maps and arrays: Duet's messages nest 4 deep; the decoder recurses
// once per level, so an unbounded depth would overflow the stack.
inline constexpr int kMaxNestingDepth = 32;
// Bytes of a nonce and of a proof (HMAC-SHA256).
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;

enum class MessageKind : std::uint16_t {
  kHello = 1,        // worker -> frontend: who it is, what it serves, where to pull its KV
  kWelcome = 2,      // frontend -> worker: its instance id, the engine settings, peers
  kPeer = 3,         // frontend -> worker: a prefill peer joined (decode workers connect to it)
  kEngine = 4,       // either way: an engine message (worker -> frontend: relay it to `to`)
  kEvents = 5,       // worker -> frontend: what one engine iteration produced, and the load
  kHeartbeat = 6,    // worker -> frontend: the load, when no iteration ran for a while
  kRefused = 7,      // worker -> frontend: it refused an engine message naming this request
  kChallenge = 8,    // frontend -> worker: its nonce and its proof of the secret
  kProof = 9,        // worker -> frontend: its proof of the secret
  kClockProbe = 10,  // worker -> frontend: a clock probe (clock_sync.h), and its clock's error
  kClockReply = 11,  // frontend -> worker: when the probe arrived and the reply left
};

struct FrameHeader {
  std::uint16_t version = kWireVersion;
  MessageKind kind = MessageKind::kHello;
  std::uint32_t body_bytes = 0;
};

std::string EncodeFrameHeader(MessageKind kind, std::uint32_t body_bytes);
// Checks the magic, the version, the kind and the length bound.
Result<FrameHeader> ParseFrameHeader(std::string_view bytes);

struct Hello {
  policies::InstanceRole role = policies::InstanceRole::kColocated;
  std::int64_t pid = 0;
  // The model it serves: the frontend checks every worker serves the same one.
  std::int64_t num_layers = 0;
  std::int64_t vocab_size = 0;
  std::int64_t block_tokens = 0;
  std::int64_t kv_bytes_per_token = 0;
  std::int64_t max_position_embeddings = 0;
  std::int64_t num_blocks = 0;
  std::string kv_descriptor;  // PD: where peers pull its KV from (a UCX descriptor); else empty
  std::string nonce;          // kNonceBytes from the worker's CSPRNG (link_auth.h)
};

// The frontend's answer to a hello: its nonce and its proof that it holds the secret.
struct Challenge {
  std::string nonce;  // kNonceBytes
  std::string proof;  // kProofBytes
};

struct Welcome {
  policies::InstanceId instance = 0;
  // Every engine setting of the deployment, in the cluster file's codec (deploy/).
  deploy::EngineSettings engine;
  bool publish_kv_events = false;  // the frontend's router reads this instance's prefix cache
  Seconds heartbeat_interval_s = 0.5;
};

// The worker's clock is its own steady clock plus an offset it measures (clock_sync.h): no time
// on the wire assumes one host's clock.
struct ClockProbe {
  std::int64_t sent_ns = 0;  // t0: the worker's steady clock
  // The worker's offset and its error now, from its earlier probes (for /health and
  // /metrics); nullopt before its first.
  std::optional<std::int64_t> offset_ns;
  std::optional<std::int64_t> error_ns;
};
struct ClockReply {
  std::int64_t probe_sent_ns = 0;  // the probe's t0, which the worker matches
  std::int64_t received_ns = 0;    // t1: the frontend's run clock
  std::int64_t sent_ns = 0;        // t2: the frontend's run clock
};

struct Peer {
  policies::InstanceId instance = 0;
  std::string kv_descriptor;
};

// An engine message with its request by value: kNewRequest and kKvReady carry the request (its
// spec, record and progress), the others only its id.
struct WireEngineMessage {
  policies::InstanceId to = policies::kNoInstance;  // worker -> frontend: the destination
  policies::EngineMessage message;                  // message.request is null
  std::optional<policies::Request> request;
};

// One engine event of a worker, in the order the engine raised it.
struct WireEvent {
  enum class Kind { kToken, kPrefillDone, kFinished, kTokenGaps, kPreempted, kKvEvents };
  Kind kind = Kind::kToken;
  policies::RequestId request_id = 0;
  std::int32_t token = 0;  // kToken
  // kPrefillDone, kFinished, kPreempted: the request's record then.
  std::optional<policies::RequestRecord> record;
  Seconds gap_s = 0;                              // kTokenGaps
  std::int64_t count = 0;                         // kTokenGaps
  std::vector<policies::KvCacheEvent> kv_events;  // kKvEvents
};

struct Events {
  std::vector<WireEvent> events;
  policies::InstanceLoad load;
};

// A worker could not take an engine message (a value it cannot hold, a request it holds
// already): the request it named ends with an error instead of the link.
struct Refusal {
  policies::RequestId request_id = 0;
  std::string reason;
};

std::string EncodeHello(const Hello& hello);
std::string EncodeWelcome(const Welcome& welcome);
std::string EncodePeer(const Peer& peer);
std::string EncodeEngine(const WireEngineMessage& message);
std::string EncodeEvents(const Events& events);
std::string EncodeHeartbeat(const policies::InstanceLoad& load);
std::string EncodeRefused(const Refusal& refusal);
std::string EncodeChallenge(const Challenge& challenge);
std::string EncodeProof(const std::string& proof);
std::string EncodeClockProbe(const ClockProbe& probe);
std::string EncodeClockReply(const ClockReply& reply);

Result<Hello> ParseHello(std::string_view body);
Result<Welcome> ParseWelcome(std::string_view body);
Result<Peer> ParsePeer(std::string_view body);
Result<WireEngineMessage> ParseEngine(std::string_view body);
Result<Events> ParseEvents(std::string_view body);
Result<policies::InstanceLoad> ParseHeartbeat(std::string_view body);
Result<Refusal> ParseRefused(std::string_view body);
// The request an engine message names, read even when the rest of it does not parse (to
// refuse that request); nullopt when the body has no readable request_id.
std::optional<policies::RequestId> EngineRequestId(std::string_view body);
Result<Challenge> ParseChallenge(std::string_view body);
Result<std::string> ParseProof(std::string_view body);  // the proof's bytes
Result<ClockProbe> ParseClockProbe(std::string_view body);
Result<ClockReply> ParseClockReply(std::string_view body);

// Whether `body` is one MessagePack value, nested at most `max_depth` deep, of at most
// `max_values` values in all (containers and what they hold), every length and element count
// within the bytes that follow it: checked iteratively before the recursive decoder sees it.
// An error names the offset and what is wrong.
Status CheckMessagePack(std::string_view body, int max_depth = kMaxNestingDepth,
                        std::size_t max_values = std::numeric_limits<std::size_t>::max());
// The values a handshake message (hello, challenge, proof) may hold: it is decoded before the
// peer proved anything, and a megabyte of empty arrays would decode into tens of megabytes.
inline constexpr std::size_t kMaxHandshakeValues = 256;

// The bounds of a load report (each field; the frontend checks them against the worker's
// hello too): a count of requests and of blocks, and a cumulative counter.
inline constexpr std::int64_t kMaxLoadRequests = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxLoadBlocks = std::int64_t{1} << 31;
inline constexpr std::int64_t kMaxLoadCounter = std::int64_t{1} << 48;

// A whole frame (header and body) of `kind`.
std::string Frame(MessageKind kind, const std::string& body);

}  // namespace duet::backend::cluster
