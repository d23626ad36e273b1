// The run of `duet simulate`: builds the world (world.h) from the cluster and the trace, starts
// the frontend actor and one actor per instance running the shared engine loop, and writes the
// outputs. SimGrid exceptions are caught here and turned into Status values.
#include "sim/simulation.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <utility>

#include "deploy/engine_settings.h"
#include "sim/world.h"

namespace duet::sim {

namespace {

policies::TierSetup TierSetupFor(const ClusterSpec& cluster) {
  std::vector<int> instance_node;
  for (const InstancePlacement& at : cluster.placements) instance_node.push_back(at.node);
  policies::TierSetup setup =
      deploy::TierSetupFor(cluster.tiers, cluster.engine.block_tokens * cluster.KvBytesPerToken(),
                           std::move(instance_node), static_cast<int>(cluster.nodes.size()));
  // Routing estimates: the slowest resource on each tier's path into a GPU (first node's).
  const NodeSpec& node = cluster.nodes.front();
  const TiersSpec& t = cluster.tiers;
  const double mem = t.dram.enabled ? t.dram.link.bandwidth : 200 * kGB;
  const double read_bw[3] = {std::min(node.pcie.bandwidth, mem),
                             std::min({t.ssd.read_bw, node.pcie.bandwidth, mem}),
                             std::min({t.remote.link.bandwidth, cluster.switch_link.bandwidth,
                                       node.nic.bandwidth, node.pcie.bandwidth})};
  for (int k = 0; k < policies::kNumLowerTiers; ++k)
    setup.tiers[static_cast<std::size_t>(k)].read_bandwidth = read_bw[k];
  return setup;
}

}  // namespace

namespace {

// The output files of a run: each is written to a hidden temporary file in the output
// directory, and all are renamed into place only once every one was written, so a run that
// fails leaves none of them (and no stale mix of old and new).
class OutputFiles {
 public:
  explicit OutputFiles(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~OutputFiles() {
    std::error_code ignored;
    for (const auto& [tmp, final_path] : files_) std::filesystem::remove(tmp, ignored);
  }
  // Where to write `name` (in the output directory, or a path elsewhere) for now.
  std::string Add(const std::string& name) { return AddPath(dir_ / name); }
  std::string AddPath(const std::filesystem::path& path) {
    std::string hidden = ".";  // appended, not `"." + ...`: GCC 12 warns falsely (-Wrestrict)
    hidden += path.filename().string();
    hidden += ".tmp";
    files_.emplace_back(path.parent_path() / hidden, path);
    return files_.back().first.string();
  }
  Status Commit() {
    std::error_code ec;
    for (const auto& [tmp, final_path] : files_) {
      if (std::filesystem::is_directory(final_path, ec))
        return Status::Error(final_path.string() + ": cannot write: is a directory");
    }
    for (std::size_t i = 0; i < files_.size(); ++i) {
      std::filesystem::rename(files_[i].first, files_[i].second, ec);
      if (ec) {
        const Status error =
            Status::Error(files_[i].second.string() + ": cannot write: " + ec.message());
        // Take back the ones already in place: all of the run's files or none.
        for (std::size_t j = 0; j < i; ++j) std::filesystem::remove(files_[j].second, ec);
        return error;
      }
    }
    files_.clear();
    return Status::Ok();
  }

 private:
  std::filesystem::path dir_;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> files_;
};

Result<SimReport> Simulate(const ClusterSpec& cluster, const traces::Trace& trace,
                           const SimOptions& options) {
  namespace fs = std::filesystem;
  const auto wall_start = std::chrono::steady_clock::now();

  const std::unique_ptr<sg4::Engine> engine = MakeEngine();

  World w(cluster, trace, options);
  w.platform = BuildPlatform(cluster);
  w.requests.resize(trace.requests.size());
  w.request_index.reserve(trace.requests.size());
  for (std::size_t k = 0; k < trace.requests.size(); ++k) {
    const auto& tr = trace.requests[k];
    Request& r = w.requests[k];
    r.id = tr.id;
    w.request_index.emplace(r.id, k);
    r.arrival_s = tr.arrival_s;
    r.input_tokens = tr.input_tokens;
    r.output_tokens = tr.output_tokens;
  }
  auto arrivals = traces::Arrivals::Create(trace, options.closed_loop);
  if (!arrivals) return arrivals.status();
  w.arrivals.emplace(std::move(*arrivals));
  if (options.stop_below_attainment > 0) {
    if (!options.slo.any() || options.closed_loop.users > 0 ||
        !(options.stop_below_attainment <= 1))
      return Status::Error(
          "stopping below an attainment needs one in (0, 1], an SLO and an open loop");
    // Met requests must reach ceil(a * N): the rest may miss.
    const auto n = static_cast<double>(trace.requests.size());
    w.allowed_misses =
        static_cast<std::size_t>(n - std::ceil(options.stop_below_attainment * n - 1e-9));
  }
  if (w.arrivals->dynamic()) {
    w.wake_mutex = sg4::Mutex::create();
    w.wake = sg4::ConditionVariable::create();
  }
  w.done_mailbox = sg4::Mailbox::by_name("frontend-done");
  w.sink = std::make_unique<SimSink>(w);
  w.cache_view = std::make_unique<EngineCacheView>(w);

  std::vector<InstanceId> prefill_side, decode_side;
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    const deploy::InstanceSpec& spec = cluster.instances[i];
    const InstancePlacement& at = cluster.placements[i];
    const auto id = static_cast<InstanceId>(i);
    (spec.role == policies::InstanceRole::kDecode ? decode_side : prefill_side).push_back(id);
    std::vector<sg4::Host*> hosts;
    for (const GpuRef& g : at.gpus)
      hosts.push_back(
          w.platform.gpus[static_cast<std::size_t>(g.node)][static_cast<std::size_t>(g.gpu)]);
    w.instances.push_back(
        {std::move(hosts),
         {cluster.engine.block_tokens * cluster.KvBytesPerToken(), at.memory.kv_blocks}});
    w.inboxes.push_back(std::make_unique<SimInbox>(w.instances.back().gpus.front(), spec.name));
    w.costs.push_back(MakeStepCostModel(cluster, i));
  }
  // Instances on one node share its machine: where a cost model prices a step beside another
  // instance's, each instance's steps meet its mates'.
  w.node_mates = NodeMates(cluster, w.costs);
  if (!options.timeline_path.empty()) w.timeline = std::make_unique<Timeline>();
  if (!options.step_log_path.empty()) w.step_log.emplace();
  if (cluster.tiers.any()) {
    w.storage =
        std::make_unique<SimTierStorage>(w.platform, w.instances, w.Starter(), w.timeline.get());
    w.tiers = std::make_unique<policies::TierManager>(TierSetupFor(cluster), w.storage.get());
  }
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    const deploy::InstanceSpec& spec = cluster.instances[i];
    w.ports.push_back(std::make_unique<SimPorts>(w, static_cast<InstanceId>(i)));
    policies::EngineConfig config =
        deploy::MakeEngineConfig(cluster.engine, static_cast<InstanceId>(i), spec.role);
    config.tp = spec.tp;
    config.scheduler.speculative = cluster.speculative.config;
    config.num_blocks = cluster.placements[i].memory.kv_blocks;
    config.kv_bytes_per_token = cluster.KvBytesPerToken();
    config.num_layers = cluster.model.num_hidden_layers;
    // The engine plans step by step here; SimPorts prices asynchronous steps' overlap.
    config.async_steps = false;
    config.publish_kv_events = options.router_staleness_s > 0 &&
                               cluster.engine.enable_prefix_caching &&
                               spec.role != policies::InstanceRole::kDecode;
    SimPorts* p = w.ports.back().get();
    w.engines.push_back(std::make_unique<policies::InstanceEngine>(
        config, policies::EnginePorts{p, p, p, p, &p->transport(), w.sink.get(), w.tiers.get()}));
  }
  if (options.router_staleness_s > 0) {
    w.stale_index = std::make_unique<policies::KvEventIndex>(
        static_cast<int>(cluster.instances.size()), cluster.engine.block_tokens);
  }
  if (cluster.engine.enable_prefix_caching) {
    std::int64_t pooled_blocks = 0;
    for (InstanceId i : prefill_side)
      pooled_blocks += cluster.placements[static_cast<std::size_t>(i)].memory.kv_blocks;
    w.pooled = std::make_unique<policies::PrefixLru>(pooled_blocks, cluster.engine.block_tokens);
  }
  policies::RouterConfig router = options.router;
  {
    // The cache-aware router's prefill rate: a full token budget of prompt on one instance.
    const Tokens chunk = cluster.engine.scheduler.max_num_batched_tokens;
    models::StepShape shape;
    shape.tp = cluster.instances[static_cast<std::size_t>(prefill_side.front())].tp;
    shape.prefill.push_back({chunk, 0});
    router.prefill_tokens_per_s =
        static_cast<double>(chunk) /
        w.costs[static_cast<std::size_t>(prefill_side.front())]->StepTime(shape);
    if (options.reject_over_slo) router.reject_ttft_ms = options.slo.ttft_ms;
  }
  w.router = policies::MakeRouter(router, prefill_side, decode_side, w.cache_view.get());

  for (std::size_t i = 0; i < w.engines.size(); ++i) {
    sg4::Actor::create(cluster.instances[i].name, w.instances[i].gpus.front(), [&w, i] {
      w.engines[i]->Run();
      if (Status s = w.engines[i]->CheckInvariants(); !s.ok()) w.errors.push_back(s.message());
    });
  }
  sg4::Actor::create("frontend", w.platform.frontend, [&w] { RunFrontend(w); });
  try {
    engine->run();
  } catch (const std::exception& e) {
    return Status::Error(std::string("simulation failed: ") + e.what());
  }
  // The tier stores' end-of-run check reads every slot of tables of millions. Nothing changes
  // them any more, so it runs on a thread of its own (a second core, where there is one) while
  // the report and its files are made, and is waited for before the files are committed.
  std::future<Status> tiers_checked;
  if (w.tiers && !w.stopped_early) {
    tiers_checked = std::async([&w] { return w.tiers->CheckInvariants(/*expect_idle=*/true); });
  }
  const std::string broken = "simulation ended in a broken state: ";
  if (!w.errors.empty()) return Status::Error(broken + w.errors.front());

  SimReport report;
  // A closed loop that ran out of time sent only part of the trace.
  // A run stopped early counts what it never finished as failed.
  report.summary = w.metrics.Summary(
      w.stopped_early ? trace.requests.size() : w.arrivals->released(), options.slo);
  std::int64_t steps = 0;
  for (const auto& e : w.engines) steps += e->steps();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  report.summary["sim"] = {{"wall_s", std::round(wall_s * 1000) / 1000},
                           {"simulated_s", std::round(sg4::Engine::get_clock() * 1e6) / 1e6},
                           {"events", w.events},
                           {"engine_steps", steps},
                           {"stopped_early", w.stopped_early}};
  int gpus = 0;
  for (const InstancePlacement& at : cluster.placements) gpus += static_cast<int>(at.gpus.size());
  // The cluster is held for the whole simulated time, idle GPUs included.
  report.summary["gpu_hours"] = policies::Round(gpus * sg4::Engine::get_clock() / 3600.0, 6);
  report.summary["run"] = {{"cluster", cluster.name},
                           {"gpus", gpus},
                           {"closed_loop", traces::ToJson(options.closed_loop)},
                           {"model", cluster.model.name},
                           {"mode", cluster.pd() ? "pd" : "colocated"},
                           {"instances", cluster.instances.size()},
                           {"router", policies::ToString(options.router.kind)},
                           {"router_options",
                            {{"queue_weight", options.router.kv.QueueWeight(!cluster.pd())},
                             {"prefill_weight", options.router.kv.prefill_weight},
                             {"decode_weight", options.router.kv.decode_weight},
                             {"interference_weight", options.router.kv.interference_weight},
                             {"footprint_weight", options.router.kv.footprint_weight},
                             {"footprint_window_s", options.router.kv.footprint_window_s},
                             {"temperature", options.router.kv.temperature},
                             {"load_guard", options.router.load_guard},
                             {"staleness_ms", options.router_staleness_s * 1e3}}},
                           {"trace", trace.source},
                           {"seed", options.router.seed}};
  report.summary["prefix_cache"]["pooled_reference"] = {
      {"capacity_blocks", w.pooled ? w.pooled->num_blocks() : 0},
      {"lookup_tokens", w.pooled_lookup_tokens},
      {"hit_tokens", w.pooled_hit_tokens},
      {"hit_rate", w.pooled_lookup_tokens > 0
                       ? policies::Round(static_cast<double>(w.pooled_hit_tokens) /
                                             static_cast<double>(w.pooled_lookup_tokens),
                                         6)
                       : 0.0}};
  report.summary["tiers"] = TiersSummary(w);
  OutputFiles files(options.out_dir);
  DUET_RETURN_IF_ERROR(WriteLinksCsv(w, files.Add("links.csv")));
  std::vector<std::string> names;
  for (const auto& inst : cluster.instances) names.push_back(inst.name);
  DUET_RETURN_IF_ERROR(w.metrics.WriteRequestsCsv(files.Add("requests.csv"), names));
  if (w.timeline) {
    DUET_RETURN_IF_ERROR(
        w.timeline->Write(files.AddPath(options.timeline_path), names, w.requests));
  }
  if (w.step_log) {
    const std::string path = files.AddPath(options.step_log_path);
    std::ofstream log(path);
    log << *w.step_log;
    if (!log) return Status::Error(options.step_log_path + ": write failed");
  }
  const std::string summary_path = files.Add("summary.json");
  std::ofstream out(summary_path);
  out << report.summary.dump(2) << "\n";
  out.close();
  if (!out) return Status::Error(summary_path + ": write failed");
  if (tiers_checked.valid()) {
    if (Status s = tiers_checked.get(); !s.ok()) return Status::Error(broken + s.message());
  }
  DUET_RETURN_IF_ERROR(files.Commit());
  return report;
}

}  // namespace

Result<SimReport> RunSimulation(const ClusterSpec& cluster, const traces::Trace& trace,
                                const SimOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool existed = fs::exists(options.out_dir, ec);
  fs::create_directories(options.out_dir, ec);
  if (ec)
    return Status::Error(options.out_dir + ": cannot create output directory: " + ec.message());
  // Fail now, not after a long run, when the directory cannot take the files.
  const fs::path probe = fs::path(options.out_dir) / ".duet-write-test.tmp";
  if (!std::ofstream(probe)) {
    if (!existed) fs::remove(options.out_dir, ec);
    return Status::Error(options.out_dir + ": cannot write into the output directory");
  }
  fs::remove(probe, ec);
  for (const auto& [path, what] : {std::pair{options.timeline_path, "the timeline"},
                                   std::pair{options.step_log_path, "the step log"}}) {
    if (path.empty()) continue;
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    const fs::path file_probe = dir / ".duet-write-test.tmp";
    if (fs::is_directory(path, ec) || !std::ofstream(file_probe)) {
      if (!existed) fs::remove(options.out_dir, ec);
      return Status::Error(path + ": cannot write " + what + " there");
    }
    fs::remove(file_probe, ec);
  }
  Result<SimReport> report = Simulate(cluster, trace, options);
  // A failed run leaves nothing behind: not even the directory it created (if still empty).
  if (!report.ok() && !existed) fs::remove(options.out_dir, ec);
  return report;
}

}  // namespace duet::sim
