// `duet replay`: replay a request trace against a live OpenAI-compatible server (Duet's
// `duet serve`, vLLM, SGLang) open loop at the trace's arrival times, and write the same
// summary.json and requests.csv as `duet simulate` (METRICS.md), so that a simulated and a live
// run of one trace compare column by column.

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/replay/client.h"
#include "cli/commands.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace duet::cli {
namespace {

// Checks before the run get this long at most, whatever --timeout says.
constexpr Seconds kPreflightTimeoutS = 30;
// Reasons printed per status; summary.json has them all.
constexpr std::size_t kReasonsShown = 8;

void PrintReasons(const char* what, const nlohmann::json& reasons) {
  std::vector<std::pair<std::int64_t, std::string>> sorted;
  for (const auto& [reason, n] : reasons.items())
    sorted.emplace_back(n.get<std::int64_t>(), reason);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; i < sorted.size() && i < kReasonsShown; ++i)
    std::printf("    %s %lld: %s\n", what, static_cast<long long>(sorted[i].first),
                sorted[i].second.c_str());
  if (sorted.size() > kReasonsShown)
    std::printf("    ... and %zu more %s reasons in summary.json\n", sorted.size() - kReasonsShown,
                what);
}

void PrintSummary(const nlohmann::json& s, const std::string& out_dir) {
  const auto& req = s["requests"];
  const auto& run = s["run"];
  const auto& replay = s["replay"];
  std::printf("duet replay: %s (model %s)\n", replay["endpoint"].get<std::string>().c_str(),
              replay["model"].get<std::string>().c_str());
  std::printf("  trace          %s (rate scale %g)\n", run["trace"].get<std::string>().c_str(),
              run["rate_scale"].get<double>());
  std::printf("  requests       %d total, %d completed, %d rejected, %d failed%s\n",
              req["total"].get<int>(), req["completed"].get<int>(), req["rejected"].get<int>(),
              req["failed"].get<int>(), replay["interrupted"].get<bool>() ? " (interrupted)" : "");
  PrintReasons("rejected", req["rejected_reasons"]);
  PrintReasons("failed", req["failed_reasons"]);
  std::printf(
      "  duration       %.1f s of traffic in %.2f s wall; %lld in flight at most, send lag p99 "
      "%.2f ms, max %.2f ms\n",
      s["duration_s"].get<double>(), replay["wall_s"].get<double>(),
      static_cast<long long>(replay["max_in_flight"].get<std::int64_t>()),
      replay["send_lag_ms"]["p99"].get<double>(), replay["send_lag_ms"]["max"].get<double>());
  PrintThroughputAndLatencies(s);
  if (replay["duet_fields_reported"].get<std::int64_t>() > 0) {
    PrintDistribution("queue ms", s["queue_ms"]);
  } else {
    std::printf("  queue ms       not reported by this server\n");
  }
  const auto& pc = s["prefix_cache"];
  if (replay["cached_tokens_reported"].get<std::int64_t>() > 0) {
    std::printf("  prefix cache   hit rate %.2f%% (%lld of %lld prompt tokens)\n",
                100 * pc["hit_rate"].get<double>(),
                static_cast<long long>(pc["hit_tokens"].get<std::int64_t>()),
                static_cast<long long>(pc["lookup_tokens"].get<std::int64_t>()));
  } else {
    std::printf("  prefix cache   not reported by this server (usage.prompt_tokens_details)\n");
  }
  PrintGoodput(s);
  std::printf("  wrote          %s, %s\n", (fs::path(out_dir) / "summary.json").string().c_str(),
              (fs::path(out_dir) / "requests.csv").string().c_str());
}

}  // namespace

int Replay(int argc, char** argv) {
  po::options_description opts(
      "duet replay: replay a request trace against a live OpenAI-compatible server\n"
      "(POST ENDPOINT/v1/completions, streamed); writes summary.json and requests.csv as\n"
      "`duet simulate` does. --seed also seeds the prompts' token ids");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("endpoint", po::value<std::string>()->required(),
     "the server, http://HOST[:PORT][/PATH] (a trailing /v1 is dropped)")
    ("model", po::value<std::string>(),
     "the model name to send (default: the first id of GET ENDPOINT/v1/models)")
    ("api-key", po::value<std::string>(),
     "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY when set)")
    ("vocab-size", po::value<std::int32_t>()->default_value(32000),
     "prompt token ids are drawn from [16, N): at most the model's vocabulary size")
    ("timeout", po::value<double>()->default_value(600),
     "seconds a request may take from its send to the end of its reply")
    ("slo", po::value<std::string>(), "service-level objectives in ms, e.g. ttft=2000,tpot=100")
    ("out", po::value<std::string>()->default_value("out"), "output directory");
  // clang-format on
  AddClosedLoopOptions(opts);
  AddProgressOption(opts);
  AddTraceOptions(opts);
  po::variables_map vm;
  int code = kExitOk;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;

  backend::replay::ReplayOptions options;
  auto endpoint = backend::replay::ParseEndpoint(vm["endpoint"].as<std::string>());
  if (!endpoint) return Fail("--endpoint: " + endpoint.error(), kExitUsage);
  options.endpoint = *endpoint;
  options.prompt.vocab_size = vm["vocab-size"].as<std::int32_t>();
  options.prompt.seed = vm["seed"].as<std::uint64_t>();
  if (Status s = traces::CheckPromptOptions(options.prompt); !s.ok())
    return Fail("--vocab-size: " + s.message(), kExitUsage);
  options.timeout_s = vm["timeout"].as<double>();
  if (!(options.timeout_s > 0 && options.timeout_s <= backend::replay::kMaxTimeoutS))
    return Fail("--timeout must be in (0, 1e6] seconds", kExitUsage);
  if (vm.count("api-key")) {
    options.api_key = vm["api-key"].as<std::string>();
  } else if (const char* key = std::getenv("OPENAI_API_KEY")) {
    options.api_key = key;
  }
  policies::Slo slo;
  if (vm.count("slo")) {
    auto parsed = policies::ParseSlo(vm["slo"].as<std::string>());
    if (!parsed) return Fail(parsed.error(), kExitUsage);
    slo = *parsed;
  }
  if (Status s = ParseClosedLoopOptions(vm, &options.closed_loop); !s.ok())
    return Fail(s.message(), kExitUsage);
  auto progress = ProgressWanted(vm);
  if (!progress) return Fail(progress.error(), kExitUsage);
  options.progress = *progress;
  const std::string out_dir = vm["out"].as<std::string>();

  auto trace = LoadTrace(vm, &code);
  if (!trace) return Fail(trace.error(), code);
  // A closed loop over a trace whose requests follow others is refused before anything runs.
  if (auto arrivals = traces::Arrivals::Create(*trace, options.closed_loop); !arrivals)
    return Fail(arrivals.error(), kExitUsage);

  // The server must answer before anything is written.
  const Seconds preflight_s = std::min(options.timeout_s, kPreflightTimeoutS);
  if (vm.count("model")) {
    options.model = vm["model"].as<std::string>();
    if (options.model.empty()) return Fail("--model must not be empty", kExitUsage);
    if (Status s = backend::replay::CheckReachable(options.endpoint, preflight_s); !s.ok())
      return Fail(s.message());
  } else {
    auto model = backend::replay::QueryFirstModel(options.endpoint, options.api_key, preflight_s);
    if (!model) return Fail(model.error());
    options.model = *model;
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Fail(out_dir + ": cannot create output directory: " + ec.message());

  policies::MetricsCollector metrics;
  auto report = backend::replay::RunReplay(*trace, options, metrics);
  if (!report) return Fail(report.error());

  // Every request sent has a record, and so has every one an interruption left unsent; a closed
  // loop that ran out of time sent part of the trace.
  nlohmann::json summary = metrics.Summary(metrics.finished(), slo);
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [kind, n] : report->errors) errors[kind] = n;
  summary["replay"] = {{"endpoint", options.endpoint.url},
                       {"model", options.model},
                       {"wall_s", policies::Round(report->wall_s, 3)},
                       {"timeout_s", options.timeout_s},
                       {"sent", report->sent},
                       {"max_in_flight", report->max_in_flight},
                       {"send_lag_ms", policies::ToJson(report->send_lag_ms)},
                       {"errors", errors},
                       {"cached_tokens_reported", report->cached_tokens_reported},
                       {"duet_fields_reported", report->duet_fields_reported},
                       {"prompt_tokens_mismatched", report->prompt_tokens_mismatched},
                       {"interrupted", report->interrupted}};
  summary["run"] = {{"trace", trace->source},
                    {"rate_scale", vm["rate-scale"].as<double>()},
                    {"length_scale", vm["length-scale"].as<double>()},
                    {"limit", vm["limit"].as<std::size_t>()},
                    {"closed_loop", traces::ToJson(options.closed_loop)},
                    {"window", vm.count("window") ? vm["window"].as<std::string>() : ""},
                    {"seed", options.prompt.seed},
                    {"vocab_size", options.prompt.vocab_size}};

  // Duet's server names no instances; its instances are colocated, named as the simulator
  // names colocated instances (c0, c1, ...).
  std::vector<std::string> names;
  for (int i = 0; i < report->instances_seen; ++i) names.push_back("c" + std::to_string(i));
  const std::string csv_path = (fs::path(out_dir) / "requests.csv").string();
  if (Status s = metrics.WriteRequestsCsv(csv_path, names); !s.ok()) return Fail(s.message());
  const std::string summary_path = (fs::path(out_dir) / "summary.json").string();
  std::ofstream out(summary_path);
  out << summary.dump(2) << "\n";
  out.flush();
  if (!out) return Fail(summary_path + ": write failed");
  PrintSummary(summary, out_dir);
  if (report->interrupted)
    return Fail("the replay was interrupted; " + out_dir + " holds the requests it finished");
  return kExitOk;
}

}  // namespace duet::cli
