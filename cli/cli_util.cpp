// Helpers the `duet` subcommands share: the error exit, argument parsing with --help, where
// bundled data is found, the trace flags (format, selection) of every command that replays
// a trace, and the printing of metric distributions.
#include <unistd.h>
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "common/text.h"
#include "deploy/deployment.h"
#include "models/model_spec.h"
#include "policies/router.h"
#include "traces/synthetic.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace duet::cli {

int Fail(const std::string& message, int code) {
  // One bounded, printable line whatever the message quotes (the sources cut their quotes
  // already; this is the last guard).
  std::fprintf(stderr, "duet: error: %s\n", Excerpt(message, 2000).c_str());
  return code;
}

namespace {

// Whether `option` takes an unsigned integer (which boost would wrap from a negative value).
bool TakesUnsigned(const po::options_description& opts, const std::string& option) {
  const po::option_description* d = opts.find_nothrow(option, false);
  if (!d) return false;
  const po::value_semantic* v = d->semantic().get();
  return dynamic_cast<const po::typed_value<std::uint64_t>*>(v) ||
         dynamic_cast<const po::typed_value<std::uint32_t>*>(v) ||
         dynamic_cast<const po::typed_value<unsigned long long>*>(v);
}

// boost's message for `e`. Its what() substitutes %placeholders% in a loop that never ends
// when the offending token itself holds one ("--x%canonical_option%" hung duet: found by
// fuzz/cli_args_fuzz.cpp), so with a '%' in the arguments the message comes from the same
// parse of a copy with every '%' made '?' (boost's parsing does not depend on '%').
std::string ErrorMessage(const po::error& e, int argc, char** argv,
                         const po::options_description& opts) {
  bool percent = false;
  for (int i = 0; i < argc; ++i) percent |= std::strchr(argv[i], '%') != nullptr;
  if (!percent) return e.what();
  std::vector<std::string> copies(argv, argv + argc);
  std::vector<char*> safe_argv;
  for (std::string& a : copies) {
    std::replace(a.begin(), a.end(), '%', '?');
    safe_argv.push_back(a.data());
  }
  safe_argv.push_back(nullptr);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, safe_argv.data()).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& again) {
    return again.what();
  }
  return "invalid command line";
}

}  // namespace

bool ParseArgs(int argc, char** argv, const po::options_description& opts, po::variables_map& vm,
               int* exit_code) {
  try {
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(opts).run();
    for (const po::option& o : parsed.options) {
      // Without a positional description boost keeps such tokens and store() drops them.
      if (o.string_key.empty() || o.position_key >= 0) {
        const std::string token = o.original_tokens.empty() ? "" : o.original_tokens.front();
        *exit_code =
            Fail(std::string(argv[0]) + ": unexpected argument '" + Excerpt(token) +
                     "' (every value follows its --option; see duet " + argv[0] + " --help)",
                 kExitUsage);
        return false;
      }
      // boost reads "-1" into an unsigned option as 2^64 - 1.
      for (const std::string& value : o.value) {
        const auto first = value.find_first_not_of(" \t");
        if (first != std::string::npos && value[first] == '-' &&
            TakesUnsigned(opts, o.string_key)) {
          *exit_code = Fail(
              "--" + o.string_key + " must be a non-negative integer, got '" + Excerpt(value) + "'",
              kExitUsage);
          return false;
        }
      }
    }
    po::store(parsed, vm);
    // --help before notify(), which would complain about missing required options.
    if (vm.count("help")) {
      std::cout << opts << "\n";
      *exit_code = kExitOk;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    *exit_code = Fail(std::string(argv[0]) + ": " + ErrorMessage(e, argc, argv, opts) +
                          " (see duet " + argv[0] + " --help)",
                      kExitUsage);
    return false;
  }
  return true;
}

std::string Locate(const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path bundled = fs::path(DUET_SOURCE_DIR) / path;
  return fs::exists(bundled) ? bundled.string() : path;
}

std::string FormatStat(const nlohmann::json& value) {
  if (!value.is_number()) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value.get<double>());
  return text;
}

void PrintDistribution(const char* label, const nlohmann::json& d) {
  std::printf("  %-14s mean %9s  p50 %9s  p90 %9s  p99 %9s  max %9s\n", label,
              FormatStat(d["mean"]).c_str(), FormatStat(d["p50"]).c_str(),
              FormatStat(d["p90"]).c_str(), FormatStat(d["p99"]).c_str(),
              FormatStat(d["max"]).c_str());
}

void AddProgressOption(po::options_description& opts) {
  opts.add_options()("progress", po::value<std::string>()->default_value("auto"),
                     "progress bar: auto (on a terminal), always or never");
}

Result<bool> ProgressWanted(const po::variables_map& vm) {
  const std::string progress = vm["progress"].as<std::string>();
  if (progress != "auto" && progress != "always" && progress != "never")
    return Status::Error("--progress must be auto, always or never");
  return progress == "always" || (progress == "auto" && isatty(STDERR_FILENO));
}

void AddRouterOptions(po::options_description& opts, const char* default_router) {
  const policies::RouterConfig defaults;
  // clang-format off
  opts.add_options()
    ("router", po::value<std::string>()->default_value(default_router),
     "round-robin, least-loaded, power-of-two, prefix-aware, cache-aware or kv-aware")
    ("router-queue-weight", po::value<double>(),
     "kv-aware router: weight of the prefill work queued on an instance (tokens); default 0.25 "
     "with colocated instances, 0.1 in PD")
    ("router-prefill-weight", po::value<double>()->default_value(defaults.kv.prefill_weight),
     "kv-aware router: weight of the request's tokens an instance has not cached")
    ("router-decode-weight", po::value<double>()->default_value(defaults.kv.decode_weight),
     "kv-aware router: weight of decode load (prompt tokens of the requests an instance serves)")
    ("router-interference-weight",
     po::value<double>()->default_value(defaults.kv.interference_weight),
     "kv-aware router, colocated instances: weight of the tokens a request would compute times "
     "the requests its prefill would stall there")
    ("router-footprint-weight", po::value<double>()->default_value(defaults.kv.footprint_weight),
     "kv-aware router: weight of the prompt tokens routed to an instance lately (its cache's "
     "working set)")
    ("router-footprint-window", po::value<double>()->default_value(defaults.kv.footprint_window_s),
     "kv-aware router: seconds over which the footprint decays (by e)")
    ("router-temperature", po::value<double>()->default_value(defaults.kv.temperature),
     "kv-aware router: 0 takes the cheapest instance; > 0 samples, softer as it grows")
    ("router-load-guard", po::value<double>()->default_value(defaults.load_guard),
     "kv-aware and cache-aware routers: skip instances with more requests in flight than this "
     "many times the mean (plus one); 0: off");
  // clang-format on
}

void AddClosedLoopOptions(po::options_description& opts) {
  // clang-format off
  opts.add_options()
    ("concurrency", po::value<std::size_t>()->default_value(0),
     "closed loop: N virtual users, each sending the trace's next request once its previous "
     "one finished (arrival times are ignored); 0: open loop at the trace's times")
    ("think-time-ms", po::value<double>()->default_value(0),
     "closed loop: a user's pause between a reply and its next request")
    ("duration", po::value<double>(),
     "closed loop: send no request after this many seconds (default: until the trace runs out)");
  // clang-format on
}

Status ParseClosedLoopOptions(const po::variables_map& vm, traces::ClosedLoop* loop) {
  loop->users = vm["concurrency"].as<std::size_t>();
  const double think_ms = vm["think-time-ms"].as<double>();
  if (loop->users > 1'000'000) return Status::Error("--concurrency must be at most 1000000");
  if (loop->users == 0 && (!vm["think-time-ms"].defaulted() || vm.count("duration")))
    return Status::Error("--think-time-ms and --duration need a closed loop (--concurrency N)");
  if (loop->users > 0 && !vm["rate-scale"].defaulted())
    return Status::Error(
        "--rate-scale has no effect in a closed loop (--concurrency): users send when their "
        "previous request finished");
  // An hour bounds a think time, the trace horizon a duration: times stay finite.
  if (!(think_ms >= 0 && think_ms <= 3.6e6))
    return Status::Error("--think-time-ms must be in [0, 3600000]");
  loop->think_s = think_ms / 1e3;
  if (vm.count("duration")) {
    const double duration = vm["duration"].as<double>();
    if (!(duration > 0 && duration <= traces::kMaxArrivalS))
      return Status::Error("--duration must be in (0, 1e8] seconds");
    loop->duration_s = duration;
  }
  return Status::Ok();
}

Status ParseRouterOptions(const po::variables_map& vm, policies::RouterConfig* config) {
  auto kind = policies::ParseRouterKind(vm["router"].as<std::string>());
  if (!kind) return Status::Error("--router: " + kind.error());
  config->kind = *kind;
  if (vm.count("router-queue-weight"))
    config->kv.queue_weight = vm["router-queue-weight"].as<double>();
  config->kv.prefill_weight = vm["router-prefill-weight"].as<double>();
  config->kv.decode_weight = vm["router-decode-weight"].as<double>();
  config->kv.interference_weight = vm["router-interference-weight"].as<double>();
  config->kv.footprint_weight = vm["router-footprint-weight"].as<double>();
  config->kv.footprint_window_s = vm["router-footprint-window"].as<double>();
  config->kv.temperature = vm["router-temperature"].as<double>();
  config->load_guard = vm["router-load-guard"].as<double>();
  const Status st = policies::CheckRouterConfig(*config);
  if (!st.ok()) return Status::Error("--router-*: " + st.message());
  return Status::Ok();
}

void AddRunnerOptions(po::options_description& opts) {
  // clang-format off
  opts.add_options()
    ("jobs", po::value<int>()->default_value(0),
     "simulations at once (0: one per core present, or per CPU of the Ray cluster)")
    ("ray", po::value<std::string>(),
     "run the simulations as tasks on the Ray cluster whose head is at HOST:PORT (the duet "
     "binary and the trace at the same paths on its nodes)");
  // clang-format on
}

Status CheckRunnerOptions(const po::variables_map& vm) {
  const int jobs = vm["jobs"].as<int>();
  if (vm.count("ray")) {
    if (jobs < 0 || jobs > 100000)
      return Status::Error("--jobs must be between 0 (one per CPU) and 100000 with --ray");
    if (vm["ray"].as<std::string>().find(':') == std::string::npos)
      return Status::Error("--ray needs HOST:PORT, not '" + Excerpt(vm["ray"].as<std::string>()) +
                           "'");
    return Status::Ok();
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (jobs < 0 || jobs > cores)
    return Status::Error("--jobs must be between 0 (one per core) and the " +
                         std::to_string(cores) + " cores present");
  return Status::Ok();
}

Status CheckThreadsFlag(int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads < 0 || threads > cores)
    return Status::Error("--threads must be between 0 (all) and the " + std::to_string(cores) +
                         " cores present, got " + std::to_string(threads));
  return Status::Ok();
}

void PrintGoodput(const nlohmann::json& summary) {
  const auto& gp = summary["goodput"];
  if (gp["slo"]["ttft_ms"].get<double>() > 0 || gp["slo"]["tpot_ms"].get<double>() > 0 ||
      gp["slo"].contains("e2e_ms")) {
    std::printf("  goodput        %.3f req/s meet the SLO %s (attainment %.2f%%)\n",
                gp["requests_per_s"].get<double>(), gp["slo"].dump().c_str(),
                100 * gp["attainment"].get<double>());
  }
}

void PrintThroughputAndLatencies(const nlohmann::json& s) {
  const auto& tp = s["throughput"];
  std::printf("  throughput     %.3f req/s, %.1f output tok/s, %.1f total tok/s\n",
              tp["requests_per_s"].get<double>(), tp["output_tokens_per_s"].get<double>(),
              tp["total_tokens_per_s"].get<double>());
  PrintDistribution("TTFT ms", s["ttft_ms"]);
  PrintDistribution("TPOT ms", s["tpot_ms"]);
  PrintDistribution("ITL ms", s["itl_ms"]);
  PrintDistribution("E2E ms", s["e2e_ms"]);
}

std::string DataDir() {
  if (fs::exists("models/specs")) return ".";
  return DUET_SOURCE_DIR;
}

Result<models::ModelSpec> LoadModelRef(const std::string& ref) {
  return models::LoadModelSpec(
      deploy::ResolveRef(ref, "", DataDir() + "/models/specs", /*directories=*/true));
}

Result<models::HardwareSpec> LoadGpuRef(const std::string& ref) {
  return models::LoadHardwareSpec(deploy::ResolveRef(ref, "", DataDir() + "/models/hardware"));
}

void AddTraceOptions(po::options_description& opts, const std::string& default_trace,
                     bool required) {
  auto* trace = po::value<std::string>();
  if (!default_trace.empty()) {
    trace->default_value(default_trace);
  } else if (required) {
    trace->required();
  }
  // clang-format off
  opts.add_options()
    ("trace", trace, "trace file: Mooncake JSONL, Azure CSV, or a synthetic spec (JSON)")
    ("trace-format", po::value<std::string>()->default_value(""),
     "mooncake, azure or synthetic (default: from the file extension)")
    ("rate-scale", po::value<double>()->default_value(1.0),
     "multiply the trace's arrival rate by this factor")
    ("length-scale", po::value<double>()->default_value(1.0),
     "multiply every prompt and output length (and the tokens a prefix block covers) by this "
     "factor, e.g. 0.0625 to replay a trace of 12k-token prompts on a small backend; for "
     "Mooncake's 512-token blocks a multiple of 1/512")
    ("limit", po::value<std::size_t>()->default_value(0), "replay only the first N requests (0: all)")
    ("window", po::value<std::string>(),
     "replay only requests arriving in [START, END) seconds of the trace, e.g. 600:1200; "
     "arrivals are shifted so the window starts at 0 (applied before --rate-scale)")
    ("seed", po::value<std::uint64_t>()->default_value(1),
     "random seed (router sampling; overrides a synthetic spec's seed when given)");
  // clang-format on
}

namespace {

Result<traces::TraceFormat> FormatFor(const std::string& path, const std::string& flag) {
  if (!flag.empty()) {
    auto format = traces::ParseTraceFormat(flag);
    if (!format) return Status::Error("--trace-format: " + format.error());
    return format;
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".jsonl") return traces::TraceFormat::kMooncake;
  if (ext == ".csv") return traces::TraceFormat::kAzure;
  if (ext == ".json") return traces::TraceFormat::kSynthetic;
  return Status::Error(path +
                       ": cannot tell the trace format from the extension; give --trace-format");
}

}  // namespace

Result<traces::TraceFormat> TraceFormatOf(const po::variables_map& vm) {
  return FormatFor(Locate(vm["trace"].as<std::string>()), vm["trace-format"].as<std::string>());
}

Result<traces::Trace> LoadTrace(const po::variables_map& vm, int* exit_code) {
  *exit_code = kExitError;
  const std::string trace_path = Locate(vm["trace"].as<std::string>());
  auto format = FormatFor(trace_path, vm["trace-format"].as<std::string>());
  if (!format) {
    *exit_code = kExitUsage;
    return format.status();
  }
  Result<traces::Trace> trace = Status::Error("unread");
  if (*format == traces::TraceFormat::kSynthetic && !vm["seed"].defaulted()) {
    auto spec = traces::ReadSyntheticSpec(trace_path);
    if (!spec) return spec.status();
    spec->seed = vm["seed"].as<std::uint64_t>();
    trace = traces::GenerateSynthetic(*spec);
    if (trace) trace->source = trace_path;
  } else {
    trace = traces::ReadTrace(trace_path, *format);
  }
  if (!trace) return trace;
  *exit_code = kExitUsage;
  if (vm.count("window")) {
    const std::string w = vm["window"].as<std::string>();
    double start_s = 0, end_s = 0;
    char tail = 0;
    if (std::sscanf(w.c_str(), "%lf:%lf%c", &start_s, &end_s, &tail) != 2)
      return Status::Error("--window: '" + w + "' is not START:END in seconds");
    if (Status s = traces::KeepWindow(*trace, start_s, end_s); !s.ok())
      return Status::Error("--window: " + s.message());
  }
  if (Status s = traces::ScaleLengths(*trace, vm["length-scale"].as<double>()); !s.ok())
    return Status::Error("--length-scale: " + s.message());
  if (Status s = traces::ScaleRate(*trace, vm["rate-scale"].as<double>()); !s.ok())
    return Status::Error("--rate-scale: " + s.message());
  traces::KeepFirst(*trace, vm["limit"].as<std::size_t>());
  *exit_code = kExitOk;
  return trace;
}

std::vector<std::string> TraceSelectionArgs(const po::variables_map& vm) {
  std::vector<std::string> args;
  if (!vm["trace-format"].as<std::string>().empty())
    args.insert(args.end(), {"--trace-format", vm["trace-format"].as<std::string>()});
  if (vm["limit"].as<std::size_t>() > 0)
    args.insert(args.end(), {"--limit", std::to_string(vm["limit"].as<std::size_t>())});
  if (vm.count("window")) args.insert(args.end(), {"--window", vm["window"].as<std::string>()});
  if (!vm["length-scale"].defaulted())
    args.insert(args.end(), {"--length-scale", ShortNumber(vm["length-scale"].as<double>())});
  return args;
}

}  // namespace duet::cli
