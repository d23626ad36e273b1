// `duet replay` against a real `duet serve` process (two instances of the CPU test model on
// 127.0.0.1): a small synthetic trace with shared prefixes replays end to end, every request
// completes, the files pass the METRICS.md schema check for live runs, Duet's queue time and
// instances reach requests.csv, shared prefixes hit the server's prefix cache, and
// `duet simulate` of the same trace writes the same columns for the same requests; a session
// trace's turns carry their predecessors' replies to the server, whose cache hits on them as the
// simulator's do.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/common/metrics_schema.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

// A `duet serve` child process: started on an ephemeral port, its address read from the ready
// line it prints, stopped with SIGTERM (it drains, then must exit 0).
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args, const std::string& log_path) {
    int out[2];
    if (::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      const int err = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) ::dup2(err, STDERR_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      if (::chdir(SourceDir().c_str()) != 0) ::_exit(127);
      std::vector<std::string> argv_s = {DuetBinary(), "serve"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    stdout_ = out[0];
    // The ready line, within 60 s.
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && line.find('\n') == std::string::npos) {
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(stdout_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"((http://127\.0\.0\.1:\d+))"))) url_ = m[1];
  }
  ~ServeProcess() {
    if (pid_ > 0 && exit_code_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) ::close(stdout_);
  }
  const std::string& url() const { return url_; }
  // SIGTERM, then the exit status (-1 if it did not exit within 60 s: then killed).
  int Stop() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 600; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      ::usleep(100 * 1000);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  std::string url_;
  int exit_code_ = -1;
};

// 30 requests in about 2 s, prompts of 48..160 tokens in 32-token blocks of which the first
// 64 tokens come from one of two shared prefixes; 4..24 output tokens. All fit the test
// model's 256-token context.
constexpr const char* kTraceSpec = R"({
  "num_requests": 30, "seed": 3, "block_tokens": 32,
  "arrival": {"process": "poisson", "rate_per_s": 15},
  "input": {"dist": "uniform", "min": 48, "max": 160},
  "output": {"dist": "uniform", "min": 4, "max": 24},
  "prefix": {"groups": 2, "tokens": 64, "zipf": 1.0}
})";
constexpr int kRequests = 30;

// Serves the test model `model` (`duet serve` with `serve_args` added), replays `trace` against
// it, stops the server and checks the files: the directory they are in.
std::string ServeAndReplay(TempDir& tmp, const std::string& model, const std::string& trace,
                           const std::vector<std::string>& serve_args) {
  std::vector<std::string> args = {"--model", model, "--port", "0", "--threads", "1"};
  args.insert(args.end(), serve_args.begin(), serve_args.end());
  ServeProcess server(args, tmp.File("serve.log"));
  EXPECT_FALSE(server.url().empty()) << "duet serve did not start:\n"
                                     << ReadFile(tmp.File("serve.log"));
  const std::string live = tmp.File("live");
  const RunResult replay = RunDuet({"replay", "--endpoint", server.url(), "--trace", trace,
                                    "--vocab-size", "512", "--out", live, "--timeout", "120"});
  EXPECT_EQ(replay.exit_code, 0) << replay;
  EXPECT_EQ(server.Stop(), 0) << ReadFile(tmp.File("serve.log"));
  ExpectMetricsSchema(live, RunKind::kLive);
  return live;
}

// `trace` simulated on `instances` colocated instances of the test model `model`: the
// requests.csv rows.
Csv SimulateOnTheTestModel(TempDir& tmp, const std::string& model, const std::string& trace,
                           int instances) {
  nlohmann::json cluster = ReadJson(SourceDir() + "/tests/data/2colo-tiny-dram.json");
  cluster["model"] = model;
  cluster.erase("tiers");
  cluster["instances"][0]["count"] = instances;
  const std::string cluster_path = tmp.File("cluster.json");
  WriteJson(cluster_path, cluster);
  const std::string simulated = tmp.File("simulated");
  Simulate(simulated, {"--cluster", cluster_path, "--trace", trace});
  ExpectMetricsSchema(simulated, RunKind::kSimulated);
  return Csv::Read(simulated + "/requests.csv");
}

TEST(ServeReplay, ATraceReplaysEndToEndAndComparesColumnByColumnWithTheSimulator) {
  TempDir tmp;
  const std::string model = tmp.File("model");
  const RunResult made = RunDuet({"make-test-model", "--out", model});
  ASSERT_EQ(made.exit_code, 0) << made;
  const std::string trace = tmp.Write("trace.json", kTraceSpec);

  // Round-robin: both instances serve whatever the timing (least-loaded sends every request
  // to the first instance when each one finishes before the next arrives, as the test model's
  // do on an idle machine).
  const std::string live =
      ServeAndReplay(tmp, model, trace, {"--instances", "2", "--router", "round-robin"});
  const nlohmann::json s = ReadJson(live + "/summary.json");
  EXPECT_EQ(s["requests"]["total"], kRequests);
  EXPECT_EQ(s["requests"]["completed"], kRequests) << s.dump(2);
  EXPECT_EQ(s["replay"]["duet_fields_reported"], kRequests);
  // Equal hash ids gave equal token prefixes, which the server's prefix cache found.
  EXPECT_GT(s["prefix_cache"]["hit_tokens"].get<std::int64_t>(), 0);
  const Csv rows = Csv::Read(live + "/requests.csv");
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kRequests));
  std::set<std::string> instances;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows.Get(i, "status"), "completed") << i;
    EXPECT_FALSE(rows.Get(i, "queue_ms").empty()) << i;
    instances.insert(rows.Get(i, "prefill_instance"));
  }
  EXPECT_EQ(instances, (std::set<std::string>{"c0", "c1"}));

  // The same trace simulated on two colocated instances of the same model: the same columns,
  // the same requests with the same token counts.
  const Csv sim_rows = SimulateOnTheTestModel(tmp, model, trace, 2);
  const std::string live_csv = ReadFile(live + "/requests.csv");
  const std::string sim_csv = ReadFile(tmp.File("simulated") + "/requests.csv");
  ASSERT_NE(live_csv.find('\n'), std::string::npos);
  EXPECT_EQ(live_csv.substr(0, live_csv.find('\n')), sim_csv.substr(0, sim_csv.find('\n')));
  ASSERT_EQ(sim_rows.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (const char* column : {"request_id", "input_tokens", "output_tokens"})
      EXPECT_EQ(rows.Get(i, column), sim_rows.Get(i, column)) << column << " of row " << i;
  }
}

// A conversation replayed live: each turn's prompt carries the previous turn's prompt and the
// reply's very tokens, so the server's prefix cache holds the reply's full blocks (the engine
// caches output at completion) and a turn hits more than its predecessor's prompt. The
// simulator, which caches a continued request's output the same way, finds the same hits.
TEST(ServeReplay, ASessionsTurnsHitTheirPredecessorsReplyLiveAndSimulated) {
  TempDir tmp;
  const std::string model = tmp.File("model");
  const RunResult made = RunDuet({"make-test-model", "--out", model});
  ASSERT_EQ(made.exit_code, 0) << made;
  // Prompts of 70, 70 + 40 + 12 = 122 and 122 + 20 + 9 = 151 tokens.
  const std::string trace = tmp.Write("session.jsonl", R"(
{"timestamp": 0, "input_length": 70, "output_length": 40, "hash_ids": [1], "session_id": "a"}
{"input_length": 12, "output_length": 20, "session_id": "a", "delay": 50}
{"input_length": 9, "output_length": 10, "session_id": "a", "delay": 50}
)");
  const std::string live = ServeAndReplay(tmp, model, trace, {"--instances", "1"});
  const Csv rows = Csv::Read(live + "/requests.csv");
  ASSERT_EQ(rows.size(), 3u);
  const std::vector<double> inputs = {70, 122, 151};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows.Get(i, "status"), "completed") << i;
    EXPECT_EQ(rows.Number(i, "input_tokens"), inputs[i]) << i;
  }
  // More than the predecessor's whole prompt: blocks of its reply were hits.
  EXPECT_GT(rows.Number(1, "cached_tokens"), 70);
  EXPECT_GT(rows.Number(2, "cached_tokens"), 122);

  const Csv sim_rows = SimulateOnTheTestModel(tmp, model, trace, 1);
  ASSERT_EQ(sim_rows.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    for (const char* column : {"input_tokens", "output_tokens", "cached_tokens", "session"})
      EXPECT_EQ(rows.Get(i, column), sim_rows.Get(i, column)) << column << " of row " << i;
  }
}

// A prefix forced out of the KV cache and served back from the host DRAM tier: the server
// reports the tokens each tier gave (the reply's duet.tier_hit_tokens), and the live summary
// counts them by tier as the simulator's does, which `duet validate` compares.
TEST(ServeReplay, TierHitsReachTheLiveSummaryByTier) {
  TempDir tmp;
  const std::string model = tmp.File("model");
  const RunResult made = RunDuet({"make-test-model", "--out", model});
  ASSERT_EQ(made.exit_code, 0) << made;
  nlohmann::json cluster = ReadJson(SourceDir() + "/tests/data/2colo-tiny-dram.json");
  cluster["model"] = model;
  cluster["instances"][0]["count"] = 1;
  cluster["engine"]["overlap_tier_loads"] = false;  // what the live server runs
  const std::string cluster_path = tmp.File("cluster.json");
  WriteJson(cluster_path, cluster);
  // 12 blocks of 16 tokens: the second prompt takes blocks the first one's prefix held, and the
  // third asks for that prefix again.
  const std::string trace = tmp.Write("trace.jsonl", R"(
{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [1]}
{"timestamp": 300, "input_length": 100, "output_length": 4, "hash_ids": [2]}
{"timestamp": 600, "input_length": 100, "output_length": 4, "hash_ids": [1]}
)");
  const std::string live = ServeAndReplay(
      tmp, model, trace, {"--cluster", cluster_path, "--workers", "thread", "--kv-blocks", "12"});
  const nlohmann::json s = ReadJson(live + "/summary.json");
  ASSERT_EQ(s["requests"]["completed"], 3) << s.dump(2);
  const Csv rows = Csv::Read(live + "/requests.csv");
  EXPECT_EQ(rows.Number(0, "cached_tokens"), 0);
  EXPECT_GT(rows.Number(2, "dram_hit_tokens"), 0);
  EXPECT_EQ(rows.Number(2, "gpu_hit_tokens") + rows.Number(2, "dram_hit_tokens"),
            rows.Number(2, "cached_tokens"));
  const nlohmann::json& by_tier = s["prefix_cache"]["by_tier"];
  EXPECT_EQ(by_tier["dram"]["hit_tokens"].get<double>(),
            rows.Number(1, "dram_hit_tokens") + rows.Number(2, "dram_hit_tokens"));
  EXPECT_EQ(by_tier["ssd"]["hit_tokens"], 0);
  EXPECT_GT(by_tier["dram"]["hit_rate"].get<double>(), 0);
}

}  // namespace
}  // namespace duet::e2e
