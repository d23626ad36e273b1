// The frontend-worker messages (backend/cluster/wire.h): every message survives a round trip
// field for field; frame headers and bodies that are malformed, oversized or out of range are
// errors naming what is wrong.
#include "backend/cluster/wire.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tests/deploy/setting_samples.h"

namespace duet::backend::cluster {
namespace {

using policies::EngineMessage;
using policies::Request;

Request FullRequest() {
  Request r;
  r.id = 42;
  r.arrival_s = 1.5;
  r.frontend_s = 0.00025;
  r.input_tokens = 5;
  r.output_tokens = 9;
  r.block_hashes = {0xffffffffffffffffull, 7};
  r.prompt_ids = {1, 2, 3, 4, 5};
  r.output_ids = {77};
  r.sampling.temperature = 0.5f;
  r.sampling.top_p = 0.9f;
  r.sampling.top_k = 40;
  r.sampling.seed = 0xfedcba9876543210ull;
  r.sampling.stop_token_ids = {2, 99};
  r.sampling.stop_strings = {"\n\n", "THE END"};
  r.state = policies::RequestState::kTransferring;
  r.prefill_instance = 0;
  r.decode_instance = 3;
  r.router_score = -2.5;
  r.session = 17;
  r.prefill_target = 5;
  r.computed_tokens = 5;
  r.generated_tokens = 1;
  r.cached_tokens = 4;
  r.tier_hit_tokens = {1, 2, 0};
  r.loading_tokens = {0, 1, 2};
  r.offloaded_blocks = 3;
  r.preemptions = 2;
  r.kv_transfer_bytes = 123456;
  r.first_scheduled_s = 1.75;
  r.load_wait_s = 0.125;
  r.prefill_done_s = 2.0;
  r.kv_arrived_s = 2.0625;
  r.kv_pull_started_s = 2.125;
  r.kv_ready_s = 2.25;
  r.first_token_s = 2.5;
  r.second_token_s = 2.75;
  r.last_token_s = 3.0;
  r.finished_s = 3.5;
  r.finish_reason = policies::FinishReason::kStop;
  r.reason = "why";
  return r;
}

// A field added to a part of Request changes its size: give it a value in FullRequest, a
// comparison below, and a place in its part's field table (wire.cpp).
static_assert(sizeof(policies::RequestSpec) == 176 && sizeof(policies::SamplingParams) == 80,
              "RequestSpec or SamplingParams changed: does the wire carry every field?");
static_assert(sizeof(policies::RequestRecord) == 208,
              "RequestRecord changed: does the wire carry every field?");
static_assert(sizeof(policies::RequestProgress) == 72,
              "RequestProgress changed: does the wire carry every field?");

void ExpectSameRecord(const policies::RequestRecord& a, const policies::RequestRecord& b) {
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.prefill_instance, b.prefill_instance);
  EXPECT_EQ(a.decode_instance, b.decode_instance);
  EXPECT_EQ(a.router_score, b.router_score);
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
  EXPECT_EQ(a.cached_tokens, b.cached_tokens);
  EXPECT_EQ(a.tier_hit_tokens, b.tier_hit_tokens);
  EXPECT_EQ(a.preemptions, b.preemptions);
  EXPECT_EQ(a.kv_transfer_bytes, b.kv_transfer_bytes);
  EXPECT_EQ(a.first_scheduled_s, b.first_scheduled_s);
  EXPECT_EQ(a.load_wait_s, b.load_wait_s);
  EXPECT_EQ(a.prefill_done_s, b.prefill_done_s);
  EXPECT_EQ(a.kv_arrived_s, b.kv_arrived_s);
  EXPECT_EQ(a.kv_pull_started_s, b.kv_pull_started_s);
  EXPECT_EQ(a.kv_ready_s, b.kv_ready_s);
  EXPECT_EQ(a.first_token_s, b.first_token_s);
  EXPECT_EQ(a.second_token_s, b.second_token_s);
  EXPECT_EQ(a.last_token_s, b.last_token_s);
  EXPECT_EQ(a.finished_s, b.finished_s);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  EXPECT_EQ(a.reason, b.reason);
}

void ExpectSameRequest(const Request& a, const Request& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.arrival_s, b.arrival_s);
  EXPECT_EQ(a.frontend_s, b.frontend_s);
  EXPECT_EQ(a.input_tokens, b.input_tokens);
  EXPECT_EQ(a.output_tokens, b.output_tokens);
  EXPECT_EQ(a.block_hashes, b.block_hashes);
  EXPECT_EQ(a.prompt_ids, b.prompt_ids);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.stop_token_ids, b.sampling.stop_token_ids);
  EXPECT_EQ(a.sampling.stop_strings, b.sampling.stop_strings);
  EXPECT_EQ(a.session, b.session);
  ExpectSameRecord(a.record(), b.record());
  EXPECT_EQ(a.prefill_target, b.prefill_target);
  EXPECT_EQ(a.computed_tokens, b.computed_tokens);
  EXPECT_EQ(a.loading_tokens, b.loading_tokens);
  EXPECT_EQ(a.offloaded_blocks, b.offloaded_blocks);
  EXPECT_EQ(a.output_ids, b.output_ids);
}

WireEngineMessage KvReady() {
  WireEngineMessage w;
  w.to = 3;
  w.message.kind = EngineMessage::Kind::kKvReady;
  w.message.from = 0;
  w.message.request_id = 42;
  w.message.blocks = {7, 8};
  w.message.lease_expires_s = 62.0;
  w.request = FullRequest();
  return w;
}

std::string Pack(const nlohmann::json& j) {
  const auto bytes = nlohmann::json::to_msgpack(j);
  return {bytes.begin(), bytes.end()};
}

nlohmann::json Unpack(const std::string& body) { return nlohmann::json::from_msgpack(body); }

TEST(Wire, AnEngineMessageWithItsRequestSurvivesTheRoundTrip) {
  const WireEngineMessage sent = KvReady();
  auto got = ParseEngine(EncodeEngine(sent));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ(got->to, 3);
  EXPECT_EQ(got->message.kind, EngineMessage::Kind::kKvReady);
  EXPECT_EQ(got->message.from, 0);
  EXPECT_EQ(got->message.request_id, 42u);
  EXPECT_EQ(got->message.blocks, sent.message.blocks);
  EXPECT_EQ(got->message.lease_expires_s, 62.0);
  EXPECT_EQ(got->message.request, nullptr);
  ASSERT_TRUE(got->request);
  ExpectSameRequest(*got->request, *sent.request);

  WireEngineMessage abort;
  abort.message.kind = EngineMessage::Kind::kAbort;
  abort.message.request_id = 9;
  got = ParseEngine(EncodeEngine(abort));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_FALSE(got->request);
  EXPECT_EQ(got->message.lease_expires_s, policies::kForever);
}

TEST(Wire, EventsHelloWelcomeAndPeerSurviveTheRoundTrip) {
  Events events;
  events.load = {1, 2, 3, 4, 10, 5, 6, 7, 8, 11};
  WireEvent token;
  token.kind = WireEvent::Kind::kToken;
  token.request_id = 42;
  token.token = 77;
  WireEvent finished;
  finished.kind = WireEvent::Kind::kFinished;
  finished.request_id = 42;
  finished.record = FullRequest().record();
  WireEvent gaps;
  gaps.kind = WireEvent::Kind::kTokenGaps;
  gaps.gap_s = 0.25;
  gaps.count = 3;
  WireEvent kv;
  kv.kind = WireEvent::Kind::kKvEvents;
  kv.kv_events = {{0xffffffffffffffffull, true}, {5, false}};
  events.events = {token, finished, gaps, kv};
  auto got = ParseEvents(EncodeEvents(events));
  ASSERT_TRUE(got.ok()) << got.error();
  ASSERT_EQ(got->events.size(), 4u);
  EXPECT_EQ(got->load, events.load);  // every field
  EXPECT_EQ(got->events[0].token, 77);
  ASSERT_TRUE(got->events[1].record);
  ExpectSameRecord(*got->events[1].record, *finished.record);
  EXPECT_EQ(got->events[2].gap_s, 0.25);
  EXPECT_EQ(got->events[2].count, 3);
  ASSERT_EQ(got->events[3].kv_events.size(), 2u);
  EXPECT_EQ(got->events[3].kv_events[0].hash, 0xffffffffffffffffull);
  EXPECT_TRUE(got->events[3].kv_events[0].stored);
  EXPECT_FALSE(got->events[3].kv_events[1].stored);

  Hello hello{policies::InstanceRole::kDecode, 1234, 2, 300, 16, 512, 256, 99, "\x00\x01ucx",
              std::string(kNonceBytes, 'n')};
  auto h = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->role, policies::InstanceRole::kDecode);
  EXPECT_EQ(h->pid, 1234);
  EXPECT_EQ(h->num_blocks, 99);
  EXPECT_EQ(h->kv_descriptor, hello.kv_descriptor);
  EXPECT_EQ(h->nonce, hello.nonce);

  Welcome welcome;
  welcome.instance = 4;
  welcome.heartbeat_interval_s = 0.25;
  welcome.publish_kv_events = true;
  auto w = ParseWelcome(EncodeWelcome(welcome));
  ASSERT_TRUE(w.ok()) << w.error();
  EXPECT_EQ(w->instance, 4);
  EXPECT_EQ(w->heartbeat_interval_s, 0.25);
  EXPECT_TRUE(w->publish_kv_events);

  // The clock's messages carry any steady time (a host's monotonic clock may read anything),
  // and a probe its offset and error together or neither.
  ClockProbe probe{std::numeric_limits<std::int64_t>::min(), -7, 3};
  auto pr = ParseClockProbe(EncodeClockProbe(probe));
  ASSERT_TRUE(pr.ok()) << pr.error();
  EXPECT_EQ(pr->sent_ns, probe.sent_ns);
  EXPECT_EQ(pr->offset_ns, std::optional<std::int64_t>(-7));
  EXPECT_EQ(pr->error_ns, std::optional<std::int64_t>(3));
  pr = ParseClockProbe(EncodeClockProbe({5, std::nullopt, std::nullopt}));
  ASSERT_TRUE(pr.ok()) << pr.error();
  EXPECT_FALSE(pr->offset_ns);
  EXPECT_NE(ParseClockProbe(Pack({{"sent_ns", 1}, {"offset_ns", 2}})).error().find("error_ns"),
            std::string::npos);
  EXPECT_FALSE(ParseClockProbe(Pack({{"sent_ns", 1}, {"offset_ns", 2}, {"error_ns", -1}})).ok());
  const ClockReply reply{std::numeric_limits<std::int64_t>::max(), -10, 20};
  auto rr = ParseClockReply(EncodeClockReply(reply));
  ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(rr->probe_sent_ns, reply.probe_sent_ns);
  EXPECT_EQ(rr->received_ns, -10);
  EXPECT_EQ(rr->sent_ns, 20);
  // A reply sent before its probe arrived is no reply.
  EXPECT_FALSE(ParseClockReply(EncodeClockReply({0, 20, 10})).ok());

  auto p = ParsePeer(EncodePeer({2, "desc"}));
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->instance, 2);
  EXPECT_EQ(p->kv_descriptor, "desc");
  auto load = ParseHeartbeat(EncodeHeartbeat(events.load));
  ASSERT_TRUE(load.ok()) << load.error();
  EXPECT_EQ(*load, events.load);
}

TEST(Wire, FrameHeadersAreCheckedBeforeAnyBodyIsRead) {
  const std::string good = EncodeFrameHeader(MessageKind::kEvents, 100);
  auto h = ParseFrameHeader(good);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->kind, MessageKind::kEvents);
  EXPECT_EQ(h->body_bytes, 100u);
  EXPECT_EQ(Frame(MessageKind::kPeer, "ab").size(), kFrameHeaderBytes + 2);

  auto error = [](std::string bytes) {
    auto r = ParseFrameHeader(bytes);
    return r.ok() ? std::string("parsed") : r.error();
  };
  EXPECT_NE(error("GET / HTTP/1.1\r\n").find("12"), std::string::npos);
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_NE(error(bad).find("magic"), std::string::npos);
  bad = good;
  bad[4] = static_cast<char>(kWireVersion + 1);
  EXPECT_NE(error(bad).find("version " + std::to_string(kWireVersion + 1) + ", this build speaks " +
                            std::to_string(kWireVersion)),
            std::string::npos);
  bad = good;
  bad[6] = 99;
  EXPECT_NE(error(bad).find("unknown message kind 99"), std::string::npos);
  EXPECT_NE(error(EncodeFrameHeader(MessageKind::kEvents, kMaxFrameBodyBytes + 1)).find("allowed"),
            std::string::npos);
}

TEST(Wire, MalformedBodiesAreErrorsNamingTheField) {
  auto engine_error = [](const nlohmann::json& j) {
    auto r = ParseEngine(Pack(j));
    return r.ok() ? std::string("parsed") : r.error();
  };
  const nlohmann::json good = Unpack(EncodeEngine(KvReady()));
  ASSERT_EQ(engine_error(good), "parsed");

  EXPECT_NE(ParseEngine("\xc1").error().find("0xc1 is not a MessagePack type"), std::string::npos);
  EXPECT_NE(ParseEngine(Pack(nlohmann::json::array({1}))).error().find("not a map"),
            std::string::npos);
  struct Case {
    std::function<void(nlohmann::json&)> change;
    const char* expected;
  };
  const Case cases[] = {
      {[](auto& j) { j.erase("request_id"); }, "'request_id' is missing"},
      {[](auto& j) { j["kind"] = 9; }, "'kind'"},
      {[](auto& j) { j["to"] = -2; }, "'to'"},
      {[](auto& j) { j.erase("request"); }, "'request' is missing"},
      {[](auto& j) { j["blocks"] = nlohmann::json::array(); }, "'blocks'"},
      {[](auto& j) {
         j["blocks"] = {1, -1};
       },
       "'blocks[1]'"},
      {[](auto& j) { j["request"]["spec"]["id"] = 7; }, "names request 7"},
      {[](auto& j) { j["request"]["spec"]["input_tokens"] = 0; }, "'input_tokens'"},
      {[](auto& j) { j["request"]["record"]["generated_tokens"] = 10; }, "'generated_tokens'"},
      {[](auto& j) {
         j["request"]["spec"]["prompt_ids"] = {1, 2};
       },
       "'prompt_ids' must hold input_tokens (5) ids"},
      {[](auto& j) {
         j["request"]["progress"]["output_ids"] = {1, 2};
       },
       "'output_ids' must hold generated_tokens (1) ids"},
      {[](auto& j) { j["request"]["spec"]["prompt_ids"][0] = -3; }, "'prompt_ids[0]'"},
      {[](auto& j) { j["request"]["spec"]["prompt_ids"][0] = std::string("\xb6\xb6"); },
       "'prompt_ids[0]'"},
      {[](auto& j) { j["request"]["spec"]["block_hashes"] = {1, 2, 3, 4, 5, 6}; },
       "'block_hashes'"},
      {[](auto& j) { j["request"]["spec"]["sampling"]["top_p"] = 0; }, "'top_p'"},
      {[](auto& j) { j["request"]["spec"]["sampling"]["temperature"] = "hot"; }, "'temperature'"},
      {[](auto& j) { j["request"]["record"]["first_token_s"] = 1e300; }, "'first_token_s'"},
      {[](auto& j) { j["request"]["spec"]["frontend_s"] = -0.5; }, "'frontend_s'"},
      {[](auto& j) { j["request"]["record"]["load_wait_s"] = -1; }, "'load_wait_s'"},
      {[](auto& j) { j["request"]["record"]["reason"] = std::string(5000, 'x'); }, "'reason'"},
      {[](auto& j) { j["request"]["record"]["state"] = 99; }, "'state'"},
      {[](auto& j) { j["request"]["record"]["cached_tokens"] = 6; }, "'cached_tokens'"},
      {[](auto& j) { j["request"]["progress"]["computed_tokens"] = 15; }, "'computed_tokens'"},
      // A key no field names: a writer and a reader that disagree are found at once.
      {[](auto& j) { j["request"]["record"]["tokens"] = 1; },
       "request: record: field 'tokens' is not a field"},
      {[](auto& j) { j["request"].erase("progress"); }, "'progress' is missing"},
      {[](auto& j) { j["request"]["spec"].erase("sampling"); }, "'sampling' is missing"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.change(j);
    EXPECT_NE(engine_error(j).find(c.expected), std::string::npos)
        << c.expected << ": " << engine_error(j);
  }
  // A request where none belongs.
  nlohmann::json abort = good;
  abort["kind"] = static_cast<int>(EngineMessage::Kind::kAbort);
  EXPECT_NE(engine_error(abort).find("only for new requests"), std::string::npos);

  // Events: a finished event without its state, a token id out of range, a kv pair malformed.
  auto events_error = [](const nlohmann::json& j) {
    auto r = ParseEvents(Pack(j));
    return r.ok() ? std::string("parsed") : r.error();
  };
  const nlohmann::json load = Unpack(EncodeHeartbeat({}))["load"];
  EXPECT_NE(events_error({{"load", load}, {"events", {{{"kind", 2}, {"request_id", 1}}}}})
                .find("'record' is missing"),
            std::string::npos);
  EXPECT_NE(
      events_error({{"load", load}, {"events", {{{"kind", 0}, {"request_id", 1}, {"token", -1}}}}})
          .find("'token'"),
      std::string::npos);
  EXPECT_NE(events_error(
                {{"load", load}, {"events", {{{"kind", 5}, {"request_id", 0}, {"kv", {{1, 2}}}}}}})
                .find("[hash, stored]"),
            std::string::npos);
  EXPECT_NE(events_error({{"events", nlohmann::json::array()}}).find("'load' is missing"),
            std::string::npos);
  // A hello with a negative block count; a welcome whose lease is not positive.
  nlohmann::json hello = Unpack(EncodeHello({policies::InstanceRole::kPrefill, 1, 2, 300, 16, 512,
                                             256, 20, "d", std::string(kNonceBytes, 'n')}));
  ASSERT_TRUE(ParseHello(Pack(hello)).ok());
  hello["num_blocks"] = -1;
  EXPECT_NE(ParseHello(Pack(hello)).error().find("'num_blocks'"), std::string::npos);
  nlohmann::json welcome = Unpack(EncodeWelcome({}));
  welcome["engine"]["kv_lease_s"] = 0;
  EXPECT_NE(ParseWelcome(Pack(welcome)).error().find("welcome: engine: field 'kv_lease_s'"),
            std::string::npos);
  welcome.erase("engine");
  EXPECT_NE(ParseWelcome(Pack(welcome)).error().find("'engine' is missing"), std::string::npos);
}

// Issue 41: every engine setting a cluster file gives reaches a worker process, through the
// same codec, with the same bounds (a watermark of 0.6 used to pass the file and fail here).
TEST(Wire, EveryEngineSettingArrivesWithTheWelcome) {
  for (const auto& sample : deploy::testing::SettingSamples()) {
    SCOPED_TRACE(sample.key);
    auto settings = deploy::ParseEngineSettings({{sample.key, sample.value}}, "engine");
    ASSERT_TRUE(settings.ok()) << settings.error();
    Welcome welcome;
    welcome.engine = *settings;
    auto w = ParseWelcome(EncodeWelcome(welcome));
    ASSERT_TRUE(w.ok()) << w.error();
    EXPECT_TRUE(sample.arrived(w->engine));
    EXPECT_EQ(deploy::EngineSettingsToJson(w->engine), deploy::EngineSettingsToJson(*settings));
  }
}

// Finding 2 of issue 40: a top_p that is positive as a double but 0 as the engine's float used
// to pass the parser, and the worker holding it would trip the sampler's invariant.
TEST(Wire, SamplingValuesAreCheckedAsTheEngineHoldsThem) {
  const nlohmann::json good = Unpack(EncodeEngine(KvReady()));
  auto with_sampling = [&](const char* key, double value) {
    nlohmann::json j = good;
    j["request"]["spec"]["sampling"][key] = value;
    return ParseEngine(Pack(j));
  };
  for (double tiny : {1e-300, 5e-324, 1e-46}) {
    auto parsed = with_sampling("top_p", tiny);
    ASSERT_FALSE(parsed.ok()) << tiny;
    EXPECT_NE(parsed.error().find("'top_p'"), std::string::npos) << parsed.error();
    EXPECT_NE(parsed.error().find("32-bit float"), std::string::npos) << parsed.error();
  }
  // A subnormal float is still positive: valid.
  ASSERT_TRUE(with_sampling("top_p", 1e-40).ok());
  EXPECT_GT(with_sampling("top_p", 1e-40)->request->sampling.top_p, 0.0f);
  // Temperatures that round to 0 are greedy, and valid.
  ASSERT_TRUE(with_sampling("temperature", 1e-300).ok());
  EXPECT_EQ(with_sampling("temperature", 1e-300)->request->sampling.temperature, 0.0f);
}

TEST(Wire, ARefusalNamesTheRequestOfAMessageThatDoesNotParse) {
  const Refusal refusal{0xfedcba9876543210ull, "request 1: 'top_p' must be in (0, 1]"};
  auto parsed = ParseRefused(EncodeRefused(refusal));
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_EQ(parsed->request_id, refusal.request_id);
  EXPECT_EQ(parsed->reason, refusal.reason);
  EXPECT_FALSE(ParseRefused(Pack({{"reason", "x"}})).ok());
  // The request id of an engine message whose request is broken, for the refusal.
  nlohmann::json broken = Unpack(EncodeEngine(KvReady()));
  broken["request"]["sampling"]["top_p"] = 1e-300;
  ASSERT_FALSE(ParseEngine(Pack(broken)).ok());
  EXPECT_EQ(EngineRequestId(Pack(broken)), std::optional<policies::RequestId>(42));
  EXPECT_EQ(EngineRequestId("\xc1"), std::nullopt);
  EXPECT_EQ(EngineRequestId(Pack({{"request_id", -1}})), std::nullopt);
}

// The fuzz seeds that hold valid messages parse in this version of the wire: a change to the
// format must update them (fuzz/corpus/cluster_wire), or the fuzzer starts from rejections.
TEST(Wire, TheSeedsOfValidMessagesParse) {
  auto seed = [](const char* name) {
    std::ifstream in(std::string(DUET_SOURCE_DIR) + "/fuzz/corpus/cluster_wire/" + name,
                     std::ios::binary);
    EXPECT_TRUE(in) << name;
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return bytes.empty() ? bytes : bytes.substr(1);  // the first byte picks the parser
  };
  auto engine = ParseEngine(seed("engine_kv_ready"));
  ASSERT_TRUE(engine.ok()) << engine.error();
  ASSERT_TRUE(engine->request);
  EXPECT_EQ(engine->request->output_ids.size(), 1u);
  auto events = ParseEvents(seed("events"));
  ASSERT_TRUE(events.ok()) << events.error();
  auto ok = [](const auto& parsed) { return parsed.ok() ? std::string("ok") : parsed.error(); };
  EXPECT_EQ(ok(ParseHello(seed("hello_v2"))), "ok");  // "hello": a version 1 hello, refused
  EXPECT_EQ(ok(ParseWelcome(seed("welcome"))), "ok");
  EXPECT_EQ(ok(ParsePeer(seed("peer"))), "ok");
  EXPECT_EQ(ok(ParseHeartbeat(seed("heartbeat"))), "ok");
  EXPECT_EQ(ok(ParseChallenge(seed("challenge"))), "ok");
  EXPECT_EQ(ok(ParseProof(seed("proof"))), "ok");
  EXPECT_EQ(ok(ParseClockProbe(seed("clock_probe"))), "ok");
  EXPECT_EQ(ok(ParseClockReply(seed("clock_reply"))), "ok");
  auto header = ParseFrameHeader(seed("frame_header"));
  ASSERT_TRUE(header.ok()) << header.error();
}

}  // namespace
}  // namespace duet::backend::cluster
