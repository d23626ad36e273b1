// `duet plan`: the cheapest cluster that meets an SLO target on a trace, and the frontier of
// cost against the rate each cheapest cluster sustains. Candidates (plan/space.h) are simulated
// by `duet simulate` processes, several at once, in the order plan/search.h gives; each run's
// files stay in the results directory, so an interrupted search resumes where it stopped.

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "cli/sim_runner.h"
#include "common/json_util.h"
#include "common/progress.h"
#include "common/text.h"
#include "plan/bounds.h"
#include "plan/gpu_prices.h"
#include "plan/search.h"
#include "plan/space.h"
#include "policies/metrics.h"
#include "sim/cluster_spec.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace duet::cli {
namespace {

struct RunResult {
  bool met = false;
  double attainment = 0;
  bool stopped_early = false;
  nlohmann::json ttft_p99, tpot_p99;
};

Result<RunResult> ReadRun(const fs::path& dir, double attainment) {
  auto s = ReadJsonFile((dir / "summary.json").string());
  if (!s) return s.status();
  try {
    RunResult r;
    r.attainment = (*s)["goodput"]["attainment"].get<double>();
    r.stopped_early = (*s)["sim"].value("stopped_early", false);
    r.met = !r.stopped_early && r.attainment >= attainment - 1e-9;
    r.ttft_p99 = (*s)["ttft_ms"]["p99"];
    r.tpot_p99 = (*s)["tpot_ms"]["p99"];
    return r;
  } catch (const std::exception& e) {
    return Status::Error((dir / "summary.json").string() + ": not a duet summary: " + e.what());
  }
}

}  // namespace

int Plan(int argc, char** argv) {
  po::variables_map vm;
  PlanFlags flags;
  int code = kExitOk;
  if (!ParsePlanArgs(argc, argv, vm, &flags, &code)) return code;
  const double attainment = flags.attainment;
  const std::vector<double>& rates = flags.rates;
  const bool exhaustive = flags.exhaustive;
  const fs::path out_dir = flags.out_dir;

  // The base cluster, and one per GPU type: with the model and that GPU, its steps priced so.
  const std::string base_path = Locate(vm["base"].as<std::string>());
  auto base_doc = ReadJsonFile(base_path);
  if (!base_doc) return Fail(base_doc.error());
  nlohmann::json base = *base_doc;
  if (!base.is_object() || !base.contains("nodes") || !base["nodes"].is_array() ||
      base["nodes"].empty() || !base["nodes"][0].is_object())
    return Fail(base_path + ": not a cluster file with nodes");
  sim::AbsolutizeClusterRefs(base, fs::absolute(base_path).parent_path().string());
  const std::string model = vm.count("model") ? vm["model"].as<std::string>() : "";
  const std::string data_dir = DataDir();
  std::map<std::string, nlohmann::json> bases;  // by GPU type, as candidates name it
  for (std::string& gpu : flags.space.gpus) {
    std::string pricing;
    // --model and --gpu paths are the command line's: relative to the current directory.
    nlohmann::json doc =
        plan::OnHardware(base, model, gpu, fs::current_path().string(), data_dir, &pricing);
    if (gpu.empty()) gpu = doc["nodes"][0].value("gpu", "");
    if (auto hardware = LoadGpuRef(doc["nodes"][0].value("gpu", "")); !hardware)
      return Fail("GPU type '" + gpu + "': " + hardware.error(), kExitUsage);
    if (!pricing.empty()) std::printf("duet plan: %s\n", pricing.c_str());
    bases[gpu] = std::move(doc);
  }
  if (flags.gpu_hour_cost) {
    for (const std::string& gpu : flags.space.gpus)
      flags.prices.gpu_hour[gpu] = *flags.gpu_hour_cost;
  } else {
    auto prices = plan::LoadGpuPrices(flags.space.gpus, data_dir, flags.gpu_prices);
    if (!prices) return Fail(prices.error(), kExitUsage);
    flags.prices.gpu_hour = *prices;
  }
  // Every type's candidates have the base's nodes of so many GPUs.
  flags.space.gpus_per_node = base["nodes"][0].value("gpus", 0);
  if (flags.space.gpus_per_node < 1) return Fail(base_path + ": nodes[0].gpus must be >= 1");

  auto trace = LoadTrace(vm, &code);
  if (!trace) return Fail(trace.error(), code);
  const std::size_t n_requests = trace->requests.size();
  if (n_requests == 0) return Fail("the trace has no requests");
  const auto allowed_misses =
      static_cast<std::size_t>(static_cast<double>(n_requests) -
                               std::ceil(attainment * static_cast<double>(n_requests) - 1e-9));

  // Candidates; a shape the cluster parser refuses (a model that does not fit at a TP degree,
  // a TP degree the step profile has no fit for) goes, with its reason.
  std::vector<plan::Candidate> all = plan::Enumerate(flags.space, flags.prices);
  std::vector<plan::Candidate> candidates;
  std::map<std::string, Result<sim::ClusterSpec>> probes;
  std::map<std::string, std::size_t> refused;
  // (GPU, TP, DP, budget) -> requests
  std::map<std::tuple<std::string, int, int, Tokens>, std::size_t> over_ttft;
  std::vector<Tokens> reusable;
  std::vector<bool> out_of_reach;
  for (const plan::Candidate& c : all) {
    const std::string shape = c.gpu + "/" + (c.pd ? "pd" : "colo") + std::to_string(c.prefill_tp) +
                              "x" + std::to_string(c.prefill_dp) + "/" +
                              std::to_string(c.decode_tp) + "x" + std::to_string(c.decode_dp) +
                              "/" + std::to_string(c.token_budget) +
                              (c.dram_gib > 0 ? "/dram" : "") + (c.ssd_tib > 0 ? "/ssd" : "");
    auto it = probes.find(shape);
    if (it == probes.end()) {
      it = probes
               .emplace(shape, sim::ParseClusterSpec(plan::ClusterDocument(bases.at(c.gpu), c),
                                                     base_path, data_dir))
               .first;
    }
    if (!it->second.ok()) {
      ++refused[it->second.error()];
      continue;
    }
    bool reach = true;
    if (flags.slo.ttft_ms && !exhaustive) {
      // The floors follow the first instance's cost model: its GPU, TP and DP degrees.
      const auto key = std::make_tuple(c.gpu, c.prefill_tp, c.prefill_dp, c.token_budget);
      auto ot = over_ttft.find(key);
      if (ot == over_ttft.end()) {
        const sim::ClusterSpec& spec = *it->second;
        if (reusable.empty()) reusable = plan::ReusableTokens(*trace, spec.engine.block_tokens);
        auto cost = sim::MakeStepCostModel(spec, 0);
        const auto floors =
            plan::PrefillFloors(*trace, reusable, *cost, c.token_budget, c.prefill_tp);
        ot = over_ttft.emplace(key, plan::CountAbove(floors, *flags.slo.ttft_ms / 1e3)).first;
      }
      reach = ot->second <= allowed_misses;
    }
    candidates.push_back(c);
    out_of_reach.push_back(!reach);
  }
  for (const auto& [reason, n] : refused)
    std::printf("duet plan: %zu candidates left out: %s\n", n, reason.c_str());
  if (candidates.empty()) return Fail("no candidate cluster is left to simulate");

  // The results directory: what this search is, so a resume with other inputs is refused.
  // Absolute: a Ray task runs in a directory of its own.
  std::vector<std::string> trace_args = {
      "--trace", fs::absolute(Locate(vm["trace"].as<std::string>())).lexically_normal().string()};
  for (const std::string& arg : TraceSelectionArgs(vm)) trace_args.push_back(arg);
  if (!vm["seed"].defaulted())
    trace_args.insert(trace_args.end(), {"--seed", std::to_string(vm["seed"].as<std::uint64_t>())});
  const double base_rate = vm["rate-scale"].as<double>();
  // The GPU types with their clusters (their cost models) and the prices; the first type's
  // cluster stands for the base.
  nlohmann::json gpus = nlohmann::json::array();
  for (const std::string& gpu : flags.space.gpus)
    gpus.push_back({{"gpu", gpu},
                    {"cost_model", bases.at(gpu).value("cost_model", nlohmann::json())},
                    {"gpu_hour_cost", flags.prices.gpu_hour.at(gpu)}});
  const nlohmann::json inputs = {{"trace", trace_args},
                                 {"rate_scale", base_rate},
                                 {"slo", vm["slo"].as<std::string>()},
                                 {"attainment", attainment},
                                 {"base", bases.at(flags.space.gpus[0])},
                                 {"gpus", gpus},
                                 {"dram_gib_cost", flags.prices.dram_gib_hour},
                                 {"ssd_tib_cost", flags.prices.ssd_tib_hour}};
  std::error_code ec;
  fs::create_directories(out_dir / "runs", ec);
  if (ec) return Fail(out_dir.string() + ": cannot create the results directory: " + ec.message());
  if (Status st =
          ClaimResultsDir(out_dir.string(), inputs,
                          "a search of other inputs (trace, SLO, attainment, base cluster, GPU "
                          "types or prices)");
      !st.ok())
    return Fail(st.message());

  // The search.
  plan::Search search(candidates.size(), rates.size(), out_of_reach, exhaustive);
  std::map<std::pair<std::size_t, std::size_t>, RunResult> results;
  auto run_dir = [&](const plan::Job& j) {
    return out_dir / "runs" / candidates[j.candidate].Key() /
           ("rate-" + ShortNumber(rates[j.rate]));
  };
  CatchStopSignals();
  auto made = MakeRunner(vm, (out_dir / "ray.log").string());
  if (!made) return Fail(made.error());
  std::unique_ptr<SimRunner> runner = std::move(*made);
  std::printf("duet plan: %zu candidates (%zu out of reach: %s), %zu rates, %d at once%s\n",
              candidates.size(),
              static_cast<std::size_t>(std::count(out_of_reach.begin(), out_of_reach.end(), true)),
              flags.slo.ttft_ms ? "prompts they cannot prefill within the TTFT SLO" : "no TTFT SLO",
              rates.size(), runner->slots(), exhaustive ? ", exhaustive" : "");
  std::fflush(stdout);
  auto id_of = [&](const plan::Job& j) {
    return static_cast<std::uint64_t>(j.candidate * rates.size() + j.rate);
  };
  std::vector<plan::Job> running;
  std::size_t simulated = 0, resumed = 0, cancelled = 0;
  const auto start = std::chrono::steady_clock::now();
  auto report = [&](const plan::Job& job, const RunResult& r) {
    results[{job.candidate, job.rate}] = r;
    search.Report(job, r.met);
    for (const plan::Job& o : search.Obsolete()) {
      search.Forget(o);
      if (std::erase(running, o) == 0) continue;
      runner->Cancel(id_of(o));
      fs::remove_all(run_dir(o), ec);
      ++cancelled;
    }
  };
  while (!search.Done()) {
    if (StopRequested())
      return Fail("stopped by a signal; the runs that finished are in " + out_dir.string() +
                      ": the same command resumes there",
                  kExitSignal);
    while (static_cast<int>(running.size()) < runner->slots()) {
      auto job = search.Next();
      if (!job) break;
      const fs::path dir = run_dir(*job);
      if (fs::exists(dir / "summary.json")) {
        auto r = ReadRun(dir, attainment);
        if (!r) return Fail(r.error());
        // An exhaustive search needs the whole run; an early stop says only "missed".
        if (!exhaustive || !r->stopped_early) {
          ++resumed;
          report(*job, *r);
          continue;
        }
      }
      fs::remove_all(dir, ec);
      fs::create_directories(dir, ec);
      const fs::path cluster_path = dir / "cluster.json";
      {
        const plan::Candidate& c = candidates[job->candidate];
        std::ofstream f(cluster_path);
        f << plan::ClusterDocument(bases.at(c.gpu), c).dump(2) << "\n";
        if (!f) return Fail(cluster_path.string() + ": write failed");
      }
      std::vector<std::string> args = {"--cluster", cluster_path.string()};
      args.insert(args.end(), trace_args.begin(), trace_args.end());
      args.insert(args.end(),
                  {"--rate-scale", ShortNumber(base_rate * rates[job->rate]), "--slo",
                   vm["slo"].as<std::string>(), "--out", dir.string(), "--progress", "never"});
      if (!exhaustive)
        args.insert(args.end(), {"--stop-below-attainment", ShortNumber(attainment)});
      if (Status st = runner->Start(id_of(*job), args); !st.ok()) return Fail(st.message());
      running.push_back(*job);
    }
    if (running.empty()) continue;  // Next() decided a rate; ask again
    auto finished = runner->Poll(0.05);
    if (!finished) return Fail(finished.error());
    if (*finished) {
      const plan::Job job{(*finished)->id / rates.size(), (*finished)->id % rates.size()};
      std::erase(running, job);
      const fs::path dir = run_dir(job);
      if ((*finished)->exit_status != 0)
        return Fail("simulating " + candidates[job.candidate].Key() + " failed (exit " +
                    std::to_string((*finished)->exit_status) + "); see " +
                    (dir / "log.txt").string());
      auto r = ReadRun(dir, attainment);
      if (!r) return Fail(r.error());
      ++simulated;
      report(job, *r);
    }
    if (flags.progress) {
      std::size_t level = 0;
      for (const plan::Job& r : running) level = std::max(level, r.rate);
      DrawProgress(simulated + resumed, simulated + resumed + running.size(),
                   std::to_string(simulated) + " simulated, " + std::to_string(resumed) +
                       " resumed; rate " + ShortNumber(rates[level]) + "x");
    }
  }
  if (flags.progress) std::fprintf(stderr, "\n");
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto winners = search.Winners();

  // Outputs: every simulated candidate, the frontier, the winner as a cluster file.
  std::ofstream csv(out_dir / "candidates.csv");
  csv << "key,layout,gpu,gpus,nodes,token_budget,dram_gib,ssd_tib,router,cost_per_hour,rate,"
         "attainment,met,stopped_early,ttft_p99_ms,tpot_p99_ms\n";
  auto stat = [](const nlohmann::json& v) {
    return v.is_number() ? ShortNumber(v.get<double>()) : "";
  };
  for (const auto& [key, r] : results) {
    const plan::Candidate& c = candidates[key.first];
    csv << c.Key() << ",\"" << c.Layout() << "\"," << c.gpu << "," << c.gpus << "," << c.nodes
        << "," << c.token_budget << "," << ShortNumber(c.dram_gib) << "," << ShortNumber(c.ssd_tib)
        << "," << policies::ToString(c.router) << "," << ShortNumber(c.cost_per_hour) << ","
        << ShortNumber(rates[key.second]) << "," << ShortNumber(r.attainment) << ","
        << (r.met ? 1 : 0) << "," << (r.stopped_early ? 1 : 0) << "," << stat(r.ttft_p99) << ","
        << stat(r.tpot_p99) << "\n";
  }
  std::ofstream frontier(out_dir / "frontier.csv");
  frontier << "rate,key,layout,gpu,gpus,cost_per_hour\n";
  nlohmann::json frontier_json = nlohmann::json::array();
  for (std::size_t r = 0; r < rates.size(); ++r) {
    if (!winners[r]) break;
    const plan::Candidate& c = candidates[*winners[r]];
    frontier << ShortNumber(rates[r]) << "," << c.Key() << ",\"" << c.Layout() << "\"," << c.gpu
             << "," << c.gpus << "," << ShortNumber(c.cost_per_hour) << "\n";
    frontier_json.push_back(
        {{"rate", rates[r]}, {"key", c.Key()}, {"gpu", c.gpu}, {"cost_per_hour", c.cost_per_hour}});
  }

  std::set<std::size_t> shown;
  int key_width = 48;  // keys naming their GPU are longer
  for (const auto& [key, r] : results) {
    shown.insert(key.first);
    key_width = std::max(key_width, static_cast<int>(candidates[key.first].Key().size()));
  }
  std::printf("\n%-*s %-10s %5s %9s  %s\n", key_width, "candidate", "GPU", "GPUs", "$/hour",
              "attainment by rate");
  for (std::size_t c : shown) {
    std::string line;
    for (std::size_t r = 0; r < rates.size(); ++r) {
      auto it = results.find({c, r});
      if (it == results.end()) continue;
      char buf[64];
      if (it->second.stopped_early) {
        std::snprintf(buf, sizeof buf, "  %sx missed (stopped early)",
                      ShortNumber(rates[r]).c_str());
      } else {
        std::snprintf(buf, sizeof buf, "  %sx %s %.2f%%", ShortNumber(rates[r]).c_str(),
                      it->second.met ? "met" : "missed", 100 * it->second.attainment);
      }
      line += buf;
    }
    std::printf("%-*s %-10s %5d %9.2f %s\n", key_width, candidates[c].Key().c_str(),
                plan::GpuKeyName(candidates[c].gpu).c_str(), candidates[c].gpus,
                candidates[c].cost_per_hour, line.c_str());
  }
  std::printf(
      "\nfrontier (the cheapest cluster meeting %.4g%% of requests within %s at each "
      "rate):\n",
      100 * attainment, vm["slo"].as<std::string>().c_str());
  for (std::size_t r = 0; r < rates.size(); ++r) {
    if (!winners[r]) {
      std::printf("  %6sx  no candidate within --max-gpus %d meets it\n",
                  ShortNumber(rates[r]).c_str(), flags.space.max_gpus);
      break;
    }
    const plan::Candidate& c = candidates[*winners[r]];
    std::printf("  %6sx  $%.2f/hour  %-40s %s\n", ShortNumber(rates[r]).c_str(), c.cost_per_hour,
                c.Layout().c_str(), c.Key().c_str());
  }
  nlohmann::json summary = {
      {"winner", nullptr},
      {"frontier", frontier_json},
      {"candidates", candidates.size()},
      {"out_of_reach", std::count(out_of_reach.begin(), out_of_reach.end(), true)},
      {"simulated", simulated},
      {"resumed", resumed},
      {"cancelled", cancelled},
      {"exhaustive", exhaustive},
      {"wall_s", std::round(wall_s * 1000) / 1000}};
  int exit_code = kExitOk;
  if (winners[0]) {
    const plan::Candidate& w = candidates[*winners[0]];
    const fs::path winner_path = out_dir / "winner.json";
    std::ofstream f(winner_path);
    f << plan::ClusterDocument(bases.at(w.gpu), w).dump(2) << "\n";
    if (!f) return Fail(winner_path.string() + ": write failed");
    summary["winner"] = {{"key", w.Key()},
                         {"layout", w.Layout()},
                         {"gpu", w.gpu},
                         {"gpus", w.gpus},
                         {"cost_per_hour", w.cost_per_hour},
                         {"cluster", winner_path.string()}};
    std::printf("\nwinner: %s, $%.2f/hour; its cluster file: %s\n", w.Layout().c_str(),
                w.cost_per_hour, winner_path.string().c_str());
    // The cheaper neighbours, as cluster files too: what a check simulates in full.
    nlohmann::json neighbours = nlohmann::json::array();
    fs::create_directories(out_dir / "neighbours", ec);
    for (std::size_t k : plan::CheaperNeighbours(candidates, *winners[0])) {
      const plan::Candidate& c = candidates[k];
      const fs::path path = out_dir / "neighbours" / (c.Key() + ".json");
      std::ofstream nf(path);
      nf << plan::ClusterDocument(bases.at(c.gpu), c).dump(2) << "\n";
      if (!nf) return Fail(path.string() + ": write failed");
      const plan::Outcome o = search.At(k, 0);
      const char* seen = o == plan::Outcome::kMet          ? "met"
                         : o == plan::Outcome::kMissed     ? "missed"
                         : o == plan::Outcome::kOutOfReach ? "out of reach"
                                                           : "not simulated";
      neighbours.push_back({{"key", c.Key()},
                            {"layout", c.Layout()},
                            {"gpu", c.gpu},
                            {"cost_per_hour", c.cost_per_hour},
                            {"search", seen},
                            {"cluster", path.string()}});
      std::printf("  cheaper neighbour %-44s $%.2f/hour: %s\n", c.Key().c_str(), c.cost_per_hour,
                  seen);
    }
    summary["neighbours"] = neighbours;
  } else {
    std::printf("\nno candidate meets the target at the trace's rate\n");
    exit_code = kExitError;
  }
  std::ofstream(out_dir / "plan.json") << summary.dump(2) << "\n";
  std::printf("search: %zu simulated, %zu resumed, %zu cancelled, in %.1f s; wrote %s\n", simulated,
              resumed, cancelled, wall_s, out_dir.string().c_str());
  return exit_code;
}

}  // namespace duet::cli
