// The etcd client and worker registration against a real etcd (Debian's etcd-server, which
// scripts/setup.sh installs; each test starts its own on loopback ports, in a directory of its
// own): keys put, listed by prefix and deleted; a lease that lapses takes its keys; a worker's
// registration outlives a restart of etcd and leaves when it is destroyed; slot claims give each
// worker one slot whichever frontend asks; the gateway's answers, a worker's record and a slot
// claim are parsed with their bounds.
#include "backend/discovery/etcd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "backend/discovery/registration.h"

namespace duet::backend::discovery {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// An etcd of the test's own: one member on 127.0.0.1, its data in a temporary directory (kept
// across Restart, as a real restart keeps it).
class EtcdServer {
 public:
  EtcdServer()
      : dir_(std::filesystem::temp_directory_path() /
             ("duet-etcd-" + std::to_string(::getpid()) + "-" + std::to_string(FreePort()))),
        client_port_(FreePort()),
        peer_port_(FreePort()) {}
  ~EtcdServer() {
    Kill();
    std::filesystem::remove_all(dir_);
  }
  bool Start() {
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::string data = (dir_ / "data").string();
    const std::string cluster = "default=" + peer;
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1), ::dup2(null, 2);
      ::execlp("etcd", "etcd", "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
               "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
               "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(),
               nullptr);
      ::_exit(127);
    }
    EtcdClient probe(endpoint(), 0.5);
    for (int i = 0; i < 200; ++i) {
      if (probe.List("/").ok()) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  EtcdEndpoint endpoint() const { return {"127.0.0.1", client_port_}; }

 private:
  std::filesystem::path dir_;
  int client_port_, peer_port_;
  pid_t pid_ = -1;
};

class Etcd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::system("command -v etcd > /dev/null") != 0)
      GTEST_SKIP() << "no etcd here (Debian's etcd-server: scripts/setup.sh installs it)";
    ASSERT_TRUE(server_.Start()) << "etcd did not start";
  }
  EtcdServer server_;
};

TEST_F(Etcd, KeysArePutListedByPrefixAndDeleted) {
  EtcdClient etcd(server_.endpoint());
  ASSERT_TRUE(etcd.Put("/duet/workers/a", "one").ok());
  ASSERT_TRUE(etcd.Put("/duet/workers/b", std::string("t\0wo\xff", 5)).ok());
  ASSERT_TRUE(etcd.Put("/duet/workersX", "not under the prefix").ok());
  auto listed = etcd.List("/duet/workers/");
  ASSERT_TRUE(listed.ok()) << listed.error();
  ASSERT_EQ(listed->kvs.size(), 2u);
  EXPECT_EQ(listed->kvs[0].key, "/duet/workers/a");
  EXPECT_EQ(listed->kvs[0].value, "one");
  EXPECT_EQ(listed->kvs[1].value, std::string("t\0wo\xff", 5));
  EXPECT_GT(listed->revision, 0);
  ASSERT_TRUE(etcd.Delete("/duet/workers/a").ok());
  listed = etcd.List("/duet/workers/");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->kvs.size(), 1u);
}

TEST_F(Etcd, ALeaseThatLapsesTakesItsKeys) {
  EtcdClient etcd(server_.endpoint());
  auto lease = etcd.GrantLease(1);
  ASSERT_TRUE(lease.ok()) << lease.error();
  ASSERT_TRUE(etcd.Put("/duet/workers/leased", "x", *lease).ok());
  auto ttl = etcd.KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.error();
  EXPECT_GE(*ttl, 1);
  auto listed = etcd.List("/duet/workers/");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->kvs.size(), 1u);
  EXPECT_EQ(listed->kvs[0].lease, *lease);
  // Not renewed: gone within its TTL (and etcd's expiry check, every 500 ms).
  bool gone = false;
  for (int i = 0; i < 60 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = etcd.List("/duet/workers/")->kvs.empty();
  }
  EXPECT_TRUE(gone);
  ttl = etcd.KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.error();
  EXPECT_EQ(*ttl, 0);
}

TEST_F(Etcd, AWorkerRegistrationOutlivesARestartOfEtcdAndTakesItsClaimsWhenDestroyed) {
  EtcdClient etcd(server_.endpoint(), 0.5);
  EtcdWorkerDirectory directory(etcd);
  const WorkerRecord record{"decode", "10.1.2.3:4567", 42, 2};
  {
    WorkerRegistration registration(etcd, record);
    ASSERT_TRUE(registration.WaitRegistered(10));
    auto listing = directory.List();
    ASSERT_TRUE(listing.ok()) << listing.error();
    ASSERT_EQ(listing->workers.size(), 1u);
    EXPECT_EQ(listing->workers.begin()->first, "/duet/workers/10.1.2.3:4567");
    EXPECT_EQ(listing->workers.begin()->second.record.pid, 42);
    EXPECT_EQ(listing->workers.begin()->second.record.ttl_s, 2);
    EXPECT_NE(listing->workers.begin()->second.lease, 0);

    // etcd down for longer than the TTL, then back on the same data: the record is there
    // again (etcd renews leases when it starts; the registration puts it again if it lapsed).
    server_.Kill();
    EXPECT_FALSE(directory.List().ok());
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ASSERT_TRUE(server_.Start());
    bool back = false;
    for (int i = 0; i < 100 && !back; ++i) {
      auto now = directory.List();
      back = now.ok() && now->workers.size() == 1;
      if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(back);
    // It stays while renewed: longer than two TTLs.
    std::this_thread::sleep_for(std::chrono::seconds(5));
    EXPECT_EQ(directory.List()->workers.size(), 1u);
    // A frontend's slot claim for it, under its lease.
    const auto listed = directory.List()->workers.begin()->second;
    ASSERT_TRUE(directory.Claim(registration.key(), listed.lease, "decode", {1}).ok());
    EXPECT_EQ(directory.List()->slots.size(), 1u);
  }
  // Its lease revoked when destroyed: the record and the claim go at once.
  EXPECT_TRUE(directory.List()->workers.empty());
  EXPECT_TRUE(directory.List()->slots.empty());
}

// Two frontends claiming slots for the same workers at once get the same answer for each
// worker and never one slot for two workers; claims go with their worker's lease.
TEST_F(Etcd, SlotClaimsGiveEachWorkerOneSlotWhoeverAsksAndGoWithItsLease) {
  EtcdClient etcd(server_.endpoint(), 2.0);
  EtcdWorkerDirectory a(etcd), b(etcd);
  auto lease1 = etcd.GrantLease(2);
  auto lease2 = etcd.GrantLease(60);
  ASSERT_TRUE(lease1.ok() && lease2.ok());
  const std::string w1 = "/duet/workers/10.0.0.1:1", w2 = "/duet/workers/10.0.0.2:1";
  ASSERT_TRUE(etcd.Put(w1, EncodeWorkerRecord({"decode", "10.0.0.1:1", 1, 2}), *lease1).ok());
  ASSERT_TRUE(etcd.Put(w2, EncodeWorkerRecord({"decode", "10.0.0.2:1", 2, 60}), *lease2).ok());

  // Both frontends think slots 2 and 3 free; the first claim of each worker wins.
  std::optional<int> a1, b1, a2, b2;
  std::thread ta([&] {
    a1 = *a.Claim(w1, *lease1, "decode", {2, 3});
    a2 = *a.Claim(w2, *lease2, "decode", {2, 3});
  });
  std::thread tb([&] {
    b2 = *b.Claim(w2, *lease2, "decode", {2, 3});
    b1 = *b.Claim(w1, *lease1, "decode", {2, 3});
  });
  ta.join();
  tb.join();
  ASSERT_TRUE(a1 && b1 && a2 && b2);
  EXPECT_EQ(*a1, *b1);
  EXPECT_EQ(*a2, *b2);
  EXPECT_NE(*a1, *a2);
  auto listing = a.List();
  ASSERT_TRUE(listing.ok()) << listing.error();
  ASSERT_EQ(listing->slots.size(), 2u);
  EXPECT_EQ(listing->slots.at(*a1).worker, w1);
  EXPECT_EQ(listing->slots.at(*a1).role, "decode");
  EXPECT_EQ(listing->slots.at(*a2).worker, w2);
  // No slot left for a third worker among these two.
  auto none = a.Claim("/duet/workers/10.0.0.3:1", *lease2, "decode", {2, 3});
  ASSERT_TRUE(none.ok()) << none.error();
  EXPECT_FALSE(*none);

  // Worker 1's lease lapses: its record and its claim go, and its slot is free again.
  bool gone = false;
  for (int i = 0; i < 60 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto now = a.List();
    gone = now.ok() && !now->workers.count(w1) && !now->slots.count(*a1);
  }
  EXPECT_TRUE(gone);
  auto again = a.Claim("/duet/workers/10.0.0.3:1", *lease2, "decode", {2, 3});
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(*again, *a1);
}

TEST(EtcdAnswers, AreParsedWithTheirBounds) {
  EXPECT_EQ(*ParseGrantResponse(R"({"header":{},"ID":"7587","TTL":"5"})"), 7587);
  EXPECT_FALSE(ParseGrantResponse(R"({"header":{}})").ok());
  auto error = ParseGrantResponse(R"({"error":{"message":"etcdserver: too many requests"}})");
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.error().find("etcd says: etcdserver: too many requests"), std::string::npos);
  EXPECT_EQ(*ParseKeepAliveResponse(R"({"result":{"ID":"1","TTL":"4"}})"), 4);
  EXPECT_EQ(*ParseKeepAliveResponse(R"({"result":{"ID":"1"}})"), 0);  // expired: no TTL
  EXPECT_FALSE(ParseKeepAliveResponse(R"({"result":{"TTL":"four"}})").ok());
  auto range = ParseRangeResponse(
      R"({"header":{"revision":"9"},"kvs":[{"key":"YQ==","value":"Yg==","lease":"3"}]})");
  ASSERT_TRUE(range.ok()) << range.error();
  EXPECT_EQ(range->revision, 9);
  EXPECT_EQ(range->kvs[0].key, "a");
  EXPECT_EQ(range->kvs[0].value, "b");
  EXPECT_EQ(range->kvs[0].lease, 3);
  EXPECT_NE(ParseRangeResponse(R"({"kvs":[{"key":"not base64!"}]})").error().find("'key'"),
            std::string::npos);
  EXPECT_FALSE(ParseRangeResponse("[]").ok());
  EXPECT_FALSE(ParseRangeResponse("{").ok());
  EXPECT_TRUE(*ParseTxnResponse(R"({"header":{},"succeeded":true})"));
  EXPECT_FALSE(*ParseTxnResponse(R"({"header":{},"responses":[]})"));  // false is left out
  EXPECT_FALSE(ParseTxnResponse(R"({"succeeded":"yes"})").ok());
  auto claim = ParseSlotClaim(EncodeSlotClaim({"/duet/workers/10.0.0.1:2", "prefill"}));
  ASSERT_TRUE(claim.ok()) << claim.error();
  EXPECT_EQ(claim->worker, "/duet/workers/10.0.0.1:2");
  EXPECT_EQ(claim->role, "prefill");
  EXPECT_NE(ParseSlotClaim(R"({"worker":"/etc/passwd","role":"prefill"})").error().find("'worker'"),
            std::string::npos);
  EXPECT_NE(ParseSlotClaim(R"({"worker":"/duet/workers/a","role":"boss"})").error().find("'role'"),
            std::string::npos);
  EXPECT_EQ(*FromBase64(Base64(std::string("\0\1\2\3\xff", 5))), std::string("\0\1\2\3\xff", 5));
}

TEST(EtcdUrls, NameAHostAndAPort) {
  auto e = ParseEtcdUrl("etcd://127.0.0.1:2379");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 2379);
  EXPECT_TRUE(ParseEtcdUrl("etcd://etcd-0.local:2379").ok());
  for (const char* bad : {"http://h:1", "etcd://h", "etcd://:1", "etcd://h:0", "etcd://h:70000",
                          "etcd://h:1x", "etcd://h/x:1"})
    EXPECT_FALSE(ParseEtcdUrl(bad).ok()) << bad;
}

TEST(WorkerRecords, AreCheckedFieldByField) {
  const WorkerRecord r{"prefill", "10.0.0.2:9001", 7, 3};
  auto back = ParseWorkerRecord(EncodeWorkerRecord(r));
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->address, r.address);
  EXPECT_EQ(back->role, "prefill");
  for (const char* bad :
       {R"({"role":"router","address":"1.2.3.4:5","pid":1,"ttl_s":3})",
        R"({"role":"decode","address":"host:5","pid":1,"ttl_s":3})",
        R"({"role":"decode","address":"1.2.3.4:99999","pid":1,"ttl_s":3})",
        R"({"role":"decode","address":"1.2.3.4:5","pid":-1,"ttl_s":3})",
        R"({"role":"decode","address":"1.2.3.4:5","pid":1,"ttl_s":0})", "[]", "{"})
    EXPECT_FALSE(ParseWorkerRecord(bad).ok()) << bad;
}

}  // namespace
}  // namespace duet::backend::discovery
