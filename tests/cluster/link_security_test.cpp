// The worker link as a trust boundary (issue 40): MessagePack bodies nested past the bound or
// declaring more than they hold are refused by every parser before the recursive decoder runs;
// load reports past their bounds are refused; the link's proofs bind the secret, both nonces
// and the side that made them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/cluster/link_auth.h"
#include "backend/cluster/wire.h"

namespace duet::backend::cluster {
namespace {

std::string Pack(const nlohmann::json& j) {
  const auto bytes = nlohmann::json::to_msgpack(j);
  return {bytes.begin(), bytes.end()};
}

// The body of finding 3: one array inside the next, `depth` deep.
std::string Nested(std::size_t depth) { return std::string(depth, '\x91') + '\x01'; }

const std::vector<std::pair<const char*, std::function<Status(std::string_view)>>>& Parsers() {
  static const std::vector<std::pair<const char*, std::function<Status(std::string_view)>>> all = {
      {"hello", [](std::string_view b) { return ParseHello(b).status(); }},
      {"welcome", [](std::string_view b) { return ParseWelcome(b).status(); }},
      {"peer", [](std::string_view b) { return ParsePeer(b).status(); }},
      {"engine message", [](std::string_view b) { return ParseEngine(b).status(); }},
      {"events", [](std::string_view b) { return ParseEvents(b).status(); }},
      {"heartbeat", [](std::string_view b) { return ParseHeartbeat(b).status(); }},
      {"challenge", [](std::string_view b) { return ParseChallenge(b).status(); }},
      {"proof", [](std::string_view b) { return ParseProof(b).status(); }},
  };
  return all;
}

TEST(LinkSecurity, EveryParserRefusesADeeplyNestedBodyWithoutRecursing) {
  // A million levels overflowed the decoder's stack (a segfault of duet serve); within a map
  // field too, and just past the bound.
  const std::string million = Nested(1'000'000);
  const std::string in_map = "\x81\xa4load" + Nested(kMaxNestingDepth);
  for (const auto& [name, parse] : Parsers()) {
    for (const std::string& body : {million, in_map}) {
      const Status s = parse(body);
      ASSERT_FALSE(s.ok()) << name;
      EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("nested more than 32 deep"), std::string::npos) << s.message();
    }
  }
}

TEST(LinkSecurity, TheWalkAcceptsWhatTheEncodersWriteAndRefusesLies) {
  EXPECT_TRUE(CheckMessagePack(Nested(kMaxNestingDepth)).ok());
  EXPECT_FALSE(CheckMessagePack(Nested(kMaxNestingDepth + 1)).ok());
  EXPECT_TRUE(
      CheckMessagePack(EncodeHeartbeat(policies::InstanceLoad{1, 2, 3, 4, 9, 5, 6, 7, 8})).ok());
  EXPECT_TRUE(CheckMessagePack(Pack({{"a", {1.5, "x", nullptr, true, -7, 1u << 31}},
                                     {"b", nlohmann::json::binary({1, 2, 3})}}))
                  .ok());
  auto error = [](const std::string& body) { return CheckMessagePack(body).message(); };
  // An array32 of 4 billion values, a str32 of 4 GB, a map16 of 65535 pairs: in a few bytes.
  EXPECT_NE(error(std::string("\xdd\xff\xff\xff\xff\x01", 6)).find("count of 4294967295"),
            std::string::npos);
  EXPECT_NE(error(std::string("\xdb\xff\xff\xff\xff"
                              "abc",
                              8))
                .find("runs past the body's end"),
            std::string::npos);
  EXPECT_NE(error(std::string("\xde\xff\xff\x01\x02", 5)).find("count of 131070"),
            std::string::npos);
  EXPECT_NE(error(std::string("\x92\x91\x01", 3)).find("ends inside a value"), std::string::npos);
  EXPECT_NE(error(std::string("\x01\x02", 2)).find("bytes after the value"), std::string::npos);
  EXPECT_NE(error(std::string("\xc1", 1)).find("0xc1"), std::string::npos);
  // Before the handshake's proof: a hello of a thousand empty arrays (each a heap allocation
  // when decoded) is refused by its count.
  EXPECT_TRUE(CheckMessagePack(std::string("\x93\x90\x90\x90", 4), kMaxNestingDepth, 4).ok());
  EXPECT_FALSE(CheckMessagePack(std::string("\x93\x90\x90\x90", 4), kMaxNestingDepth, 3).ok());
  const std::string arrays = std::string("\xdc\x03\xe8", 3) + std::string(1000, '\x90');
  EXPECT_TRUE(CheckMessagePack(arrays).ok());
  EXPECT_NE(ParseHello("\x81\xa4role" + arrays).error().find("more than 256 values"),
            std::string::npos);
  EXPECT_NE(error(std::string("\xcb\x00", 2)).find("runs past"), std::string::npos);
  EXPECT_NE(error(std::string("\xc6\x00", 2)).find("inside a value's header"), std::string::npos);
}

TEST(LinkSecurity, LoadReportsAreBoundedFieldByField) {
  const policies::InstanceLoad good{1, 2, 3, 4, 9, 5, 6, 7, 8, 10};
  ASSERT_TRUE(ParseHeartbeat(EncodeHeartbeat(good)).ok());
  // Finding 15: running 2^63-1 reached /metrics.
  for (const char* key :
       {"waiting", "running", "kv_used", "kv_free", "kv_total", "leases_held", "leases_expired",
        "load_failures", "load_recomputes", "forward_failures"}) {
    nlohmann::json load = nlohmann::json::from_msgpack(EncodeHeartbeat(good))["load"];
    load[key] = std::numeric_limits<std::int64_t>::max();
    const auto got = ParseHeartbeat(Pack({{"load", load}}));
    ASSERT_FALSE(got.ok()) << key;
    EXPECT_NE(got.error().find(std::string("'") + key + "'"), std::string::npos) << got.error();
    const auto events = ParseEvents(Pack({{"load", load}, {"events", nlohmann::json::array()}}));
    EXPECT_FALSE(events.ok()) << key;
  }
  const policies::InstanceLoad most{
      kMaxLoadRequests, kMaxLoadRequests, kMaxLoadBlocks,  kMaxLoadBlocks,  kMaxLoadBlocks,
      kMaxLoadRequests, kMaxLoadCounter,  kMaxLoadCounter, kMaxLoadCounter, kMaxLoadCounter};
  EXPECT_TRUE(ParseHeartbeat(EncodeHeartbeat(most)).ok());
}

TEST(LinkSecurity, HelloChallengeAndProofCarryExactNoncesAndProofs) {
  Hello hello{policies::InstanceRole::kPrefill, 7, 2, 300, 16, 512, 256, 20, "d",
              std::string(kNonceBytes, 'n')};
  ASSERT_TRUE(ParseHello(EncodeHello(hello)).ok());
  hello.nonce = "short";
  EXPECT_NE(ParseHello(EncodeHello(hello)).error().find("'nonce'"), std::string::npos);
  nlohmann::json no_nonce = nlohmann::json::from_msgpack(EncodeHello(hello));
  no_nonce.erase("nonce");
  EXPECT_NE(ParseHello(Pack(no_nonce)).error().find("'nonce' is missing"), std::string::npos);

  const Challenge c{std::string(kNonceBytes, 'f'), std::string(kProofBytes, 'p')};
  auto got = ParseChallenge(EncodeChallenge(c));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got->nonce, c.nonce);
  EXPECT_EQ(got->proof, c.proof);
  auto proof = ParseProof(EncodeProof(c.proof));
  ASSERT_TRUE(proof.ok()) << proof.error();
  EXPECT_EQ(*proof, c.proof);
  EXPECT_FALSE(ParseProof(EncodeProof("x")).ok());
  // The handshake frames are known kinds; the version is the new one.
  EXPECT_TRUE(ParseFrameHeader(EncodeFrameHeader(MessageKind::kChallenge, 1)).ok());
  EXPECT_TRUE(ParseFrameHeader(EncodeFrameHeader(MessageKind::kProof, 1)).ok());
  std::string v1 = EncodeFrameHeader(MessageKind::kHello, 1);
  v1[4] = 1;
  EXPECT_NE(ParseFrameHeader(v1).error().find("protocol version 1"), std::string::npos);
}

TEST(LinkSecurity, ProofsBindTheSecretTheSideAndBothNonces) {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  const std::string hello = "hello body with the worker's nonce";
  const std::string nonce(kNonceBytes, 'f');
  const std::string worker = LinkProof(secret, ProofSide::kWorker, hello, nonce);
  EXPECT_EQ(worker.size(), kProofBytes);
  EXPECT_TRUE(ConstantTimeEquals(worker, LinkProof(secret, ProofSide::kWorker, hello, nonce)));
  EXPECT_FALSE(ConstantTimeEquals(worker, LinkProof(secret, ProofSide::kFrontend, hello, nonce)));
  EXPECT_FALSE(
      ConstantTimeEquals(worker, LinkProof(secret + "x", ProofSide::kWorker, hello, nonce)));
  EXPECT_FALSE(
      ConstantTimeEquals(worker, LinkProof(secret, ProofSide::kWorker, hello + "x", nonce)));
  EXPECT_FALSE(ConstantTimeEquals(
      worker, LinkProof(secret, ProofSide::kWorker, hello, std::string(32, 'g'))));
  EXPECT_FALSE(ConstantTimeEquals(worker, worker.substr(1)));
}

TEST(LinkSecurity, SecretsComeFromAFileOrTheEnvironmentAndAreLongEnough) {
  auto generated = GenerateWorkerSecret();
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(generated->size(), 64u);
  EXPECT_NE(*generated, *GenerateWorkerSecret());
  const std::string path = testing::TempDir() + "/duet_link_secret";
  { std::ofstream(path) << "a secret of enough bytes\n"; }
  ::unsetenv(kWorkerSecretEnv);
  auto from_file = LoadWorkerSecret(path);
  ASSERT_TRUE(from_file.ok()) << from_file.error();
  EXPECT_EQ(*from_file, "a secret of enough bytes");
  EXPECT_EQ(*LoadWorkerSecret(""), "");
  ::setenv(kWorkerSecretEnv, "from the environment, long", 1);
  EXPECT_EQ(*LoadWorkerSecret(""), "from the environment, long");
  EXPECT_EQ(*LoadWorkerSecret(path), "a secret of enough bytes");  // the file wins
  ::setenv(kWorkerSecretEnv, "short", 1);
  EXPECT_NE(LoadWorkerSecret("").error().find("at least 16"), std::string::npos);
  ::unsetenv(kWorkerSecretEnv);
  EXPECT_FALSE(LoadWorkerSecret(path + ".missing").ok());
}

}  // namespace
}  // namespace duet::backend::cluster
