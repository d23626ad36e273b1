// `duet calibrate`: time a backend's forward pass over a sweep of step shapes (prefill chunks
// of several sizes over several cached contexts, decode batches over several contexts, mixed
// steps), fit the simulator's step-cost model to the medians (models/step_profile.h), and write
// the profile: the measurements, the fit, and its error on shapes held out of the fit. With
// --measurements it fits step times another tool measured instead (scripts/, published data).
// With --transport it also times KV transfers between two instances' KV regions through each
// named transport and fits each as a link (latency plus bytes over bandwidth); with --tiers, a
// cluster file's KV tiers the same way (calibrate_tiers.h). A model with a
// tokenizer also has the server's frontend timed (a request's body to the engines' request) and
// fitted per request and prompt token (models::FrontendFit).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/calibrate/step_sweep.h"
#include "backend/model/llama_weights.h"
#include "backend/registry.h"
#include "backend/serve/api.h"
#include "backend/transport/kv_transport.h"
#include "backend/transport/kv_transport_registry.h"
#include "backend/transport/local_kv_transports.h"
#include "cli/calibrate_tiers.h"
#include "cli/commands.h"
#include "common/json_util.h"
#include "common/progress.h"
#include "deploy/deployment.h"
#include "models/step_fit.h"
#include "models/step_profile.h"
#include "policies/metrics.h"
#include "policies/step_log.h"
#include "traces/synthetic.h"

namespace duet::cli {
namespace {

namespace po = boost::program_options;
using backend::SweepLimits;
using models::StepShape;

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

void PrintFit(const models::StepFit& fit) {
  std::printf("tp %d: error on shapes held out of the fit (on the training shapes):\n", fit.tp);
  // pieces: "2", or "1|2@16" where a class is split at 16 rows.
  std::printf("  %-8s %9s %6s %9s %9s %9s\n", "class", "pieces", "shapes", "mean", "p90", "max");
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const models::FitError& h = fit.held_out[c];
    const models::FitError& t = fit.training[c];
    std::string pieces = std::to_string(fit.pieces[c].size());
    if (fit.split_rows[c] > 0) {
      char split[48];
      std::snprintf(split, sizeof split, "|%zu@%lld", fit.pieces_above[c].size(),
                    static_cast<long long>(fit.split_rows[c]));
      pieces += split;
    }
    std::printf("  %-8s %9s %6d %8.2f%% %8.2f%% %8.2f%%   (%d: mean %.2f%%, max %.2f%%)\n",
                models::ToString(static_cast<models::ShapeClass>(c)), pieces.c_str(), h.shapes,
                h.mean_pct, h.p90_pct, h.max_pct, t.shapes, t.mean_pct, t.max_pct);
  }
  std::printf(
      "  beyond the sweep: a fit without each class's largest quarter of shapes, on those of "
      "them beyond the rest:\n");
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const models::FitError& e = fit.extrapolation[c];
    std::printf("  %-8s %9s %6d %8.2f%% %8.2f%% %8.2f%%\n",
                models::ToString(static_cast<models::ShapeClass>(c)), "", e.shapes, e.mean_pct,
                e.p90_pct, e.max_pct);
  }
  if (fit.roofline_held_out[0].shapes == 0) return;
  std::printf("  the roofline on the same held-out shapes:\n");
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const models::FitError& r = fit.roofline_held_out[c];
    std::printf("  %-8s %9s %6d %8.2f%% %8.2f%% %8.2f%%\n",
                models::ToString(static_cast<models::ShapeClass>(c)), "", r.shapes, r.mean_pct,
                r.p90_pct, r.max_pct);
  }
}

// Times KV transfers of 1 to `max_blocks` blocks of `block_bytes` (TransferBlockCounts) from a
// prefill instance's KV region to a decode instance's through `options`' transport, as a PD
// `duet serve` in one process places them (the prefill side's memory from the transport's
// allocator, the decode side's on the heap): `repeats` passes over every size, at least
// kMinTransferPasses, each transfer from Post to the poll that sees it done. Then fits the link.
// A small transfer takes a microsecond or two on loopback, where one cache miss or preemption in
// a median of two can tip the fitted line over (no bandwidth to fit); the passes cost little
// beside the step shapes'.
// Each transfer moves the blocks after the previous one's, around a ring of at least 256 MiB a
// side, so that what it reads and writes is out of the CPU's caches, as the KV of a prefill
// step is by the time it is pulled (the step streamed the weights after writing the first
// layers' KV). Moving the same blocks again and again would time cache-to-cache copies below
// the cache's size and memory copies above it, which no latency plus bandwidth describes.
// Before the timed passes the whole ring moves once, untimed: over shared memory a puller's
// first read of each page of the peer's region page-faults (UCX maps the peer's segment into
// the puller), which a server pays once per page of its peer's KV pool.
constexpr int kMinTransferPasses = 9;

std::int64_t TransferRingBlocks(std::int64_t block_bytes, std::int64_t max_blocks) {
  constexpr std::int64_t kRingBytes = std::int64_t{256} << 20;
  return std::max(2 * max_blocks, (kRingBytes + block_bytes - 1) / block_bytes);
}

Result<models::LinkFit> TimeTransport(const std::string& name,
                                      const backend::KvTransportOptions& options,
                                      std::int64_t block_bytes, std::int64_t max_blocks,
                                      int repeats, bool progress) {
  const std::int64_t ring = TransferRingBlocks(block_bytes, max_blocks);
  const std::int64_t bytes = block_bytes * ring;
  const int passes = std::max(repeats, kMinTransferPasses);
  const backend::KvAllocator allocate = backend::KvTransportAllocator(options);
  std::unique_ptr<backend::KvMemory> src;
  if (allocate) {
    auto memory = allocate(bytes);
    if (!memory) return memory.status();
    src = std::move(*memory);
  } else {
    src = backend::AllocateHeapKvMemory(bytes);
  }
  const std::unique_ptr<backend::KvMemory> dst = backend::AllocateHeapKvMemory(bytes);
  std::memset(src->data(), 1, static_cast<std::size_t>(bytes));  // every page mapped
  std::memset(dst->data(), 0, static_cast<std::size_t>(bytes));
  auto transports = backend::LocalKvTransports::Create(
      {{src->data(), block_bytes, ring, src.get()}, {dst->data(), block_bytes, ring, dst.get()}},
      {policies::InstanceRole::kPrefill, policies::InstanceRole::kDecode}, options);
  if (!transports) return transports.status();
  policies::KvTransport& pull = (*transports)->transport(1);

  const std::vector<std::int64_t> counts = backend::TransferBlockCounts(max_blocks);
  std::vector<backend::BlockId> blocks(static_cast<std::size_t>(ring));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::int64_t next = 0;  // the ring's first block not moved lately
  // Moves the next `count` blocks of the ring; its time, or an error.
  auto move = [&](std::int64_t count) -> Result<Seconds> {
    if (next + count > ring) next = 0;
    const std::span<const backend::BlockId> moved(blocks.data() + next,
                                                  static_cast<std::size_t>(count));
    next += count;
    const std::int64_t moved_bytes = count * block_bytes;
    const auto start = std::chrono::steady_clock::now();
    const policies::TransferId id = pull.Post({1, 0, 1, moved_bytes, moved, moved});
    policies::TransferStatus status;
    while ((status = pull.Poll(id)) == policies::TransferStatus::kInProgress) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60))
        return Status::Error("--transport " + name + ": a transfer of " +
                             std::to_string(moved_bytes) + " bytes did not finish in 60 s");
    }
    if (status != policies::TransferStatus::kDone)
      return Status::Error("--transport " + name + ": a transfer of " +
                           std::to_string(moved_bytes) + " bytes failed");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (std::int64_t moved = 0; moved < ring; moved += max_blocks) {
    if (auto t = move(max_blocks); !t) return t.status();
  }
  std::vector<models::TransferMeasurement> ms(counts.size());
  for (int pass = 0; pass < passes; ++pass) {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      ms[i].bytes = counts[i] * block_bytes;
      auto t = move(counts[i]);
      if (!t) return t.status();
      ms[i].seconds.push_back(*t);
      if (progress)
        DrawProgress(static_cast<std::size_t>(pass) * counts.size() + i + 1,
                     counts.size() * static_cast<std::size_t>(passes),
                     name + ": pass " + std::to_string(pass + 1) + "/" + std::to_string(passes));
    }
  }
  auto link = models::FitLink(std::move(ms));
  if (!link) return Status::Error("--transport " + name + ": " + link.error());
  link->transport = name;
  link->path = (*transports)->path();
  return link;
}

void PrintLink(const models::LinkFit& link, const char* what = "transport") {
  std::printf(
      "%s %s (%s): latency %.1f us, bandwidth %.3f GB/s over %lld to %lld bytes\n"
      "  error on sizes held out of the fit: %d, mean %.2f%%, max %.2f%%   (%d: mean %.2f%%, "
      "max %.2f%%)\n",
      what, link.transport.c_str(), link.path.c_str(), link.latency * 1e6, link.bandwidth / 1e9,
      static_cast<long long>(link.measurements.front().bytes),
      static_cast<long long>(link.measurements.back().bytes), link.held_out.shapes,
      link.held_out.mean_pct, link.held_out.max_pct, link.training.shapes, link.training.mean_pct,
      link.training.max_pct);
}

// The host-time fit to the iterations of a live server's step log; prints it beside the mean
// of each phase.
Result<models::HostFit> FitHostSteps(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error("--host-steps: cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<models::HostSample> samples;
  std::vector<Seconds> wakes;
  std::array<double, models::kHostPhases> phase_sum{};
  double outside_sum = 0;
  DUET_RETURN_IF_ERROR(
      policies::ReadStepLog(text.str(), path, [&](const policies::StepLogLine& line) {
        if (const auto wake = line.RequestWakeS()) wakes.push_back(*wake);
        if (!line.host) return;
        const Seconds outside = line.HostSeconds();
        samples.push_back({line.host->counts, outside});
        outside_sum += outside;
        for (std::size_t p = 0; p < models::kHostPhases; ++p) phase_sum[p] += line.host->phase_s[p];
      }));
  if (samples.empty())
    return Status::Error("--host-steps: " + path +
                         ": no line has host phases (\"host\"): a step log of this duet's "
                         "`duet serve --step-log` has them");
  auto fit = models::FitHost(samples);
  if (!fit) return Status::Error("--host-steps: " + path + ": " + fit.error());
  if (!wakes.empty()) {
    fit->wakes = static_cast<int>(wakes.size());
    fit->wake_s = policies::Summarize(std::move(wakes)).p50;  // as validate's medians
  }
  const double n = static_cast<double>(samples.size());
  std::printf("host time: %zu iterations of %s, %.1f us outside the forward pass on average:\n ",
              samples.size(), path.c_str(), 1e6 * outside_sum / n);
  double phases = 0;
  for (std::size_t p = 0; p < models::kHostPhases; ++p) {
    const std::string_view name = models::kHostPhaseNames[p];
    std::printf(" %.*s %.1f,", static_cast<int>(name.size()), name.data(), 1e6 * phase_sum[p] / n);
    phases += phase_sum[p];
  }
  std::printf(" other %.1f us\n  fit (us): ", 1e6 * (outside_sum - phases) / n);
  for (std::size_t c = 0; c < models::kHostColumns; ++c)
    std::printf("%s%.2f per %.*s", c ? " + " : "", 1e6 * fit->seconds_per[c],
                static_cast<int>(models::kHostColumnNames[c].size()),
                models::kHostColumnNames[c].data());
  std::printf(
      "\n  error on iterations held out of the fit: %d, mean %.1f%%, p90 %.1f%%; their total "
      "%+.2f%%   (%d: mean %.1f%%)\n",
      fit->held_out.shapes, fit->held_out.mean_pct, fit->held_out.p90_pct, fit->held_out_total_pct,
      fit->training.shapes, fit->training.mean_pct);
  if (fit->wakes > 0)
    std::printf("  wake-up of the idle engine: %.1f us (median of %d)\n", 1e6 * fit->wake_s,
                fit->wakes);
  return fit;
}

// The server's frontend time (models::FrontendFit) on prompts of 1 token up to `longest` by
// factors of 4, and `also` (a trace's prompt lengths), each timed 200 times in passes over the
// lengths (as the steps are), then fitted and printed.
Result<models::FrontendFit> TimeFrontend(const backend::serve::ServedModel& model, Tokens longest,
                                         const std::vector<Tokens>& also, Tokens block_tokens) {
  std::set<Tokens> lengths(also.begin(), also.end());
  for (Tokens n = 1; n < longest; n *= 4) lengths.insert(n);
  lengths.insert(longest);
  std::erase_if(lengths, [&](Tokens n) { return n < 1 || n >= model.max_request_tokens; });
  std::vector<models::FrontendSample> samples;
  for (Tokens n : lengths) samples.push_back({n, {}});
  constexpr int kPasses = 20, kPerPass = 10;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (models::FrontendSample& s : samples) {
      auto times = backend::serve::TimeFrontendPath(model, s.prompt_tokens, block_tokens, kPerPass);
      if (!times)
        return Status::Error("a prompt of " + std::to_string(s.prompt_tokens) +
                             " tokens: " + times.error());
      s.seconds.insert(s.seconds.end(), times->begin(), times->end());
    }
  }
  auto fit = models::FitFrontend(samples);
  if (!fit) return fit.status();
  std::printf(
      "frontend (body to engine request): %.1f us + %.3f us a prompt token over %zu prompt "
      "lengths up to %lld tokens, error mean %.2f%%, max %.2f%%\n",
      fit->request_s * 1e6, fit->prompt_token_s * 1e6, samples.size(),
      static_cast<long long>(samples.back().prompt_tokens), fit->training.mean_pct,
      fit->training.max_pct);
  return fit;
}

Status WriteProfile(const models::StepProfile& profile, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << models::FormatStepProfile(profile);
    if (!out) return Status::Error(path + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::Error(path + ": cannot rename " + tmp + " into place");
  }
  return Status::Ok();
}

// --trace: the trace's prompt lengths (median, p90, p99, longest) and decode contexts (prompt and
// half the output: median, p90, p99) join the sweep (SweepLimits), --max-context defaults to its
// longest request (within the model's positions), and the profile's source names the trace and
// its selection, so that `duet validate` can tell a profile fitted to the traffic it validates.
// On error, *exit_code says whether it was the command line or the trace file.
Status SweepTheTrace(const po::variables_map& vm, SweepLimits& limits, nlohmann::json& source,
                     int* exit_code) {
  *exit_code = kExitUsage;
  auto format = TraceFormatOf(vm);
  if (!format) return Status::Error("--trace: " + format.error());
  // A synthetic spec's seed draws its lengths: another seed is other traffic of the same kind.
  const bool synthetic = *format == traces::TraceFormat::kSynthetic;
  for (const char* flag : {"rate-scale", synthetic ? nullptr : "seed"})
    if (flag && !vm[flag].defaulted())
      return Status::Error(std::string("--") + flag +
                           ": calibrate reads a trace's lengths, not its times or prompts");
  std::vector<std::string> selection = TraceSelectionArgs(vm);
  if (synthetic && !vm["seed"].defaulted()) {
    auto spec = traces::ReadSyntheticSpec(Locate(vm["trace"].as<std::string>()));
    if (!spec) {
      *exit_code = kExitError;
      return Status::Error("--trace: " + spec.error());
    }
    // The spec's own seed is the draw `duet validate` replays: not another selection.
    const std::uint64_t seed = vm["seed"].as<std::uint64_t>();
    if (seed != spec->seed) selection.insert(selection.end(), {"--seed", std::to_string(seed)});
  }
  auto trace = LoadTrace(vm, exit_code);
  if (!trace) return Status::Error("--trace: " + trace.error());
  if (trace->requests.empty()) return Status::Error("--trace: no requests to take lengths from");
  std::vector<Tokens> prompts, contexts;
  Tokens longest = 0;
  for (const traces::TraceRequest& r : trace->requests) {
    prompts.push_back(r.input_tokens);
    contexts.push_back(r.input_tokens + r.output_tokens / 2);
    longest = std::max(longest, r.input_tokens + r.output_tokens);
  }
  auto quantiles = [](std::vector<Tokens> v, std::initializer_list<double> qs) {
    std::sort(v.begin(), v.end());
    std::vector<Tokens> out;
    for (double q : qs) {
      const Tokens x = v[std::min(v.size() - 1, static_cast<std::size_t>(q * v.size()))];
      if (out.empty() || out.back() != x) out.push_back(x);
    }
    return out;
  };
  limits.trace_prompts = quantiles(prompts, {0.5, 0.9, 0.99, 1.0});
  limits.trace_contexts = quantiles(contexts, {0.5, 0.9, 0.99});
  if (vm["max-context"].defaulted())
    limits.max_context =
        std::clamp<Tokens>(longest, 64, std::max<Tokens>(64, limits.positions - limits.max_tokens));
  source["trace"] = {{"path", trace->source},
                     {"selection", selection},
                     {"requests", trace->requests.size()},
                     {"prompt_tokens", limits.trace_prompts},
                     {"decode_contexts", limits.trace_contexts}};
  return Status::Ok();
}

// A matrix of reference shapes' extra times (models::ShapePairFit) from its timings
// ([shape][other][repeat]): the medians, each at least 0 (0 on the diagonal where `zero_diagonal`).
models::ShapePairFit PairFit(const backend::AfterStepShapes& shapes, int repeats,
                             const std::vector<std::vector<std::vector<Seconds>>>& timed,
                             bool zero_diagonal) {
  models::ShapePairFit fit{shapes.decode_rows, shapes.prefill_tokens, {}, repeats, {}};
  for (std::size_t i = 0; i < timed.size(); ++i) {
    fit.extra_s.emplace_back();
    for (std::size_t j = 0; j < timed.size(); ++j)
      fit.extra_s.back().push_back(
          zero_diagonal && i == j ? 0 : std::max(0.0, models::MedianOf(timed[i][j])));
  }
  return fit;
}

// `fit` as a table in ms after `heading` (a format with the decode context per row, a %lld), its
// diagonal "-" where it is 0 by definition, each row followed by its time alone where the fit has
// it.
void PrintPairs(const models::ShapePairFit& fit, Tokens decode_context, const char* heading,
                bool zero_diagonal) {
  std::vector<std::string> names;
  for (const Tokens rows : fit.decode_rows) names.push_back("d" + std::to_string(rows));
  for (const Tokens tokens : fit.prefill_tokens) names.push_back("p" + std::to_string(tokens));
  std::printf(heading, static_cast<long long>(decode_context));
  std::printf("\n       ");
  for (const std::string& name : names) std::printf("%8s", name.c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::printf("  %-5s", names[i].c_str());
    for (std::size_t j = 0; j < names.size(); ++j) {
      if (zero_diagonal && i == j)
        std::printf("%8s", "-");
      else
        std::printf("%+8.1f", 1e3 * fit.extra_s[i][j]);
    }
    if (!fit.alone_s.empty()) std::printf("  (alone %.1f)", 1e3 * fit.alone_s[i]);
    std::printf("\n");
  }
}

// Fits each TP degree's steps of `profile.measurements` into `profile.fits`, printing each fit,
// and with `gpu` the roofline's error on the same held-out shapes beside it.
Status FitStepsOf(models::StepProfile& profile, const std::optional<models::HardwareSpec>& gpu) {
  std::set<int> tps;
  for (const models::StepMeasurement& m : profile.measurements) tps.insert(m.shape.tp);
  for (int tp : tps) {
    auto fit = models::FitSteps(profile.measurements, tp);
    if (!fit) return fit.status();
    if (gpu) {
      models::RooflineOptions options;
      options.tp = tp;
      const models::RooflineCostModel roofline(profile.model, *gpu, options);
      fit->roofline_held_out = models::ErrorOf(roofline, profile.measurements, tp, true);
    }
    PrintFit(*fit);
    profile.fits.push_back(std::move(*fit));
  }
  return Status::Ok();
}

// --pool: `profile`'s step times pooled with those of the profile at `path`, the same sweep of
// the same model on the same device and threads timed at another time
// (models::PoolMeasurements), which it records (source.pooled_with) and prints with how much
// slower or faster that sweep ran, per class: a machine's drift between the two times.
Status PoolWith(models::StepProfile& profile, const std::string& path) {
  auto other = models::LoadStepProfile(path);
  if (!other) return Status::Error("--pool: " + other.error());
  if (other->device != profile.device)
    return Status::Error("--pool: " + path + " was measured on " + other->device + ", not on " +
                         profile.device);
  if (auto why = models::ArchitectureMismatch(other->model, profile.model))
    return Status::Error("--pool: " + path + " measured another model (" + *why + ")");
  const nlohmann::json theirs = other->SourceField("threads");
  const nlohmann::json ours = profile.SourceField("threads");
  if (!theirs.is_null() && !ours.is_null() && theirs != ours)
    return Status::Error("--pool: " + path + " was measured on " + theirs.dump() +
                         " threads, these on " + ours.dump());
  // Each class's shapes' medians, summed, in both sweeps.
  std::array<double, models::kShapeClasses> then{}, now{};
  for (const models::StepMeasurement& m : other->measurements)
    then[static_cast<std::size_t>(models::ClassOf(models::FeaturesOf(m.shape)))] += m.Median();
  for (const models::StepMeasurement& m : profile.measurements)
    now[static_cast<std::size_t>(models::ClassOf(models::FeaturesOf(m.shape)))] += m.Median();
  if (Status s =
          models::PoolMeasurements(profile.measurements, other->measurements, "--pool: " + path);
      !s.ok())
    return s;
  const nlohmann::json date = other->SourceField("date");
  profile.source["pooled_with"] = {
      {"path", path}, {"date", date}, {"command", other->SourceField("command")}};
  std::string took;
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    if (now[c] <= 0) continue;
    char part[64];
    std::snprintf(part, sizeof part, "%s%s %+.1f%%", took.empty() ? "" : ", ",
                  models::ToString(static_cast<models::ShapeClass>(c)),
                  100 * (then[c] / now[c] - 1));
    took += part;
  }
  std::printf(
      "pooled with %s (timed %s): its shapes took %s against these (summed medians); the fit "
      "prices each shape's median over both sweeps' times (the profile's source.pooled_with)\n",
      path.c_str(), date.is_string() ? date.get<std::string>().c_str() : "at an unknown time",
      took.c_str());
  return Status::Ok();
}

}  // namespace

int Calibrate(int argc, char** argv) {
  po::options_description opts(
      "duet calibrate: measure a backend's step times and fit the simulator's cost model");
  const std::string transport_help =
      "also time KV transfers between two instances through these transports (of this build's: " +
      backend::KvTransportNames() +
      "; comma-separated) and fit each as a link, up to --max-context tokens a transfer";
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("model", po::value<std::string>(),
     "Hugging Face model directory; with --measurements also a model spec file or the name of "
     "a bundled one (models/specs/); required unless --profile")
    ("out", po::value<std::string>()->required(), "the profile to write (JSON)")
    ("device", po::value<std::string>()->default_value("cpu"),
     "cpu or cuda; with --measurements, the name of the device that measured them")
    ("threads", po::value<int>()->default_value(0), "CPU threads (0: all)")
    ("repeats", po::value<int>()->default_value(5),
     "timed runs of each shape, in passes over every shape after an untimed one")
    ("max-tokens", po::value<std::int64_t>()->default_value(1024),
     "largest prefill chunk (default: at most a quarter of the model's context)")
    ("max-context", po::value<std::int64_t>()->default_value(2048),
     "largest cached context of a sequence (default: at most half the model's context; with "
     "--trace, its longest request)")
    ("max-batch", po::value<std::int64_t>()->default_value(32), "largest decode batch")
    ("measurements", po::value<std::string>(),
     "fit these step times (JSON lines: a step shape and \"seconds\") instead of measuring")
    ("source", po::value<std::string>(),
     "with --measurements: a JSON file describing where they come from, kept in the profile")
    ("host-steps", po::value<std::string>(),
     "also fit the engine's host time outside the forward pass to this step log of a live "
     "server (duet serve --step-log), which the simulator then prices on every step")
    ("profile", po::value<std::string>(),
     "with --host-steps: add the host-time fit to this profile, its step fits and links kept, "
     "instead of measuring steps; with --pool: refit its steps pooled, its other parts kept")
    ("pool", po::value<std::string>(),
     "also fit the step times of this profile: the same sweep on the same model, device and "
     "threads timed at another time (e.g. before a validation's live runs, this one after), each "
     "shape's times pooled, so that the fit prices the machine over both times")
    ("roofline", po::value<std::string>(),
     "also report the roofline cost model's error on the held-out shapes, for this GPU "
     "(a name under models/hardware/ or a .json file; default efficiencies)")
    ("transport", po::value<std::string>(),
     transport_help.c_str())
    ("tiers", po::value<std::string>(),
     "also time the KV tiers this cluster file's \"tiers\" configure (DRAM, SSD directory, "
     "redis endpoint) on this host, reads and writes of up to --max-context tokens, and fit "
     "each as a link (a tier that says \"fitted\": true takes them)")
    ("beside", po::bool_switch(),
     "also time the reference shapes of after_step while a second copy of the model runs each "
     "of them over and over on its own --threads cores, as instances that share this machine "
     "run (--device cpu, --threads at most half the cores): the simulator slows a step that "
     "overlaps another's on its node by what each took beyond its time alone (the profile's "
     "beside)")
    ("ucx-tls", po::value<std::string>()->default_value(""),
     "with --transport ucx: the UCX transports (UCX_TLS: tcp, posix,cma, ...; empty: UCX's "
     "choice, as duet serve's --ucx-tls)");
  // clang-format on
  AddProgressOption(opts);
  // With --trace: the sweep also times the shapes of the trace's prompt lengths and contexts,
  // and --max-context defaults to its longest request.
  AddTraceOptions(opts, "", /*required=*/false);
  po::variables_map vm;
  int code = kExitOk;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  auto progress = ProgressWanted(vm);
  if (!progress) return Fail(progress.error(), kExitUsage);
  const std::string out_path = vm["out"].as<std::string>();
  const std::string device = vm["device"].as<std::string>();
  std::string command = "duet calibrate";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];

  models::StepProfile profile;
  profile.source = {{"tool", "duet calibrate"}, {"command", command}, {"date", UtcNow()}};

  if (vm.count("profile")) {
    if (!vm.count("host-steps") && !vm.count("pool"))
      return Fail("--profile goes with --host-steps or --pool", kExitUsage);
    for (const char* other :
         {"model", "measurements", "transport", "tiers", "roofline", "source", "trace"})
      if (vm.count(other))
        return Fail(std::string("--profile keeps the profile's steps: not with --") + other,
                    kExitUsage);
    if (vm["beside"].as<bool>())
      return Fail("--profile keeps the profile's steps: not with --beside", kExitUsage);
    auto loaded = models::LoadStepProfile(vm["profile"].as<std::string>());
    if (!loaded) return Fail("--profile: " + loaded.error());
    if (vm.count("host-steps")) {
      auto host = FitHostSteps(vm["host-steps"].as<std::string>());
      if (!host) return Fail(host.error());
      loaded->host = std::move(*host);
      loaded->source["host_steps"] = {{"command", command}, {"date", UtcNow()}};
    }
    if (vm.count("pool")) {
      if (Status s = PoolWith(*loaded, vm["pool"].as<std::string>()); !s.ok())
        return Fail(s.message());
      loaded->fits.clear();
      if (Status s = FitStepsOf(*loaded, std::nullopt); !s.ok()) return Fail(s.message());
    }
    if (Status s = WriteProfile(*loaded, out_path); !s.ok()) return Fail(s.message());
    std::printf("wrote %s\n", out_path.c_str());
    return kExitOk;
  }
  if (!vm.count("model")) return Fail("the option '--model' is required", kExitUsage);
  if (!vm["ucx-tls"].defaulted() &&
      (!vm.count("transport") ||
       vm["transport"].as<std::string>().find("ucx") == std::string::npos))
    return Fail("--ucx-tls goes with --transport ucx", kExitUsage);
  if (vm.count("measurements")) {
    for (const char* timed : {"transport", "tiers"})
      if (vm.count(timed))
        return Fail(std::string("--") + timed + " times this machine's " + timed +
                        ": not with --measurements",
                    kExitUsage);
    if (vm.count("trace"))
      return Fail("--trace chooses the shapes to measure: not with --measurements", kExitUsage);
    if (vm["beside"].as<bool>())
      return Fail("--beside times this machine's steps: not with --measurements", kExitUsage);
    if (device.empty() || device.size() > 200)
      return Fail("--device: name the device that measured the steps (1 to 200 characters)",
                  kExitUsage);
    auto spec = LoadModelRef(vm["model"].as<std::string>());
    if (!spec) return Fail("--model: " + spec.error());
    profile.model = std::move(*spec);
    profile.device = device;
    const std::string path = vm["measurements"].as<std::string>();
    std::ifstream in(path);
    if (!in) return Fail("--measurements: cannot open " + path);
    std::stringstream text;
    text << in.rdbuf();
    auto ms = models::ParseStepMeasurements(text.str(), path);
    if (!ms) return Fail(ms.error());
    profile.measurements = std::move(*ms);
    if (vm.count("source")) {
      auto source = ReadJsonFile(vm["source"].as<std::string>());
      if (!source) return Fail("--source: " + source.error());
      if (!source->is_object())
        return Fail("--source: " + vm["source"].as<std::string>() + ": must be a JSON object");
      profile.source["measured_by"] = *source;
    }
  } else {
    if (vm.count("source")) return Fail("--source goes with --measurements", kExitUsage);
    std::vector<std::pair<std::string, backend::KvTransportOptions>> transports;
    if (vm.count("transport")) {
      if (device != "cpu")
        return Fail("--transport: only KV in host memory (--device cpu) is timed yet", kExitUsage);
      std::stringstream names(vm["transport"].as<std::string>());
      for (std::string name; std::getline(names, name, ',');) {
        auto transport =
            backend::ChooseKvTransport("--transport", name, {.processes = false, .device = device});
        if (!transport) return Fail(transport.error(), kExitUsage);
        for (const auto& [seen, options] : transports)
          if (seen == name) return Fail("--transport: " + name + " named twice", kExitUsage);
        transports.push_back({name, {name, vm["ucx-tls"].as<std::string>(), {}}});
      }
      if (transports.empty()) return Fail("--transport: name a transport", kExitUsage);
    }
    if (device != "cpu" && device != "cuda")
      return Fail("--device must be cpu or cuda", kExitUsage);
    const int threads = vm["threads"].as<int>();
    if (Status s = CheckThreadsFlag(threads); !s.ok()) return Fail(s.message(), kExitUsage);
    const bool beside = vm["beside"].as<bool>();
    if (beside && (device != "cpu" || threads < 1 ||
                   2 * threads > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))))
      return Fail(
          "--beside: give --device cpu and --threads N, N at most half of this machine's " +
              std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) +
              " cores (each instance its own, as duet serve --threads N runs two instances)",
          kExitUsage);
    const int repeats = vm["repeats"].as<int>();
    if (repeats < 1 || repeats > 1000) return Fail("--repeats must be in [1, 1000]", kExitUsage);
    SweepLimits limits;
    limits.max_tokens = vm["max-tokens"].as<std::int64_t>();
    limits.max_context = vm["max-context"].as<std::int64_t>();
    limits.max_batch = vm["max-batch"].as<std::int64_t>();
    if (limits.max_tokens < 16 || limits.max_tokens > 65536)
      return Fail("--max-tokens must be in [16, 65536]", kExitUsage);
    if (limits.max_context < 64 || limits.max_context > (1 << 20))
      return Fail("--max-context must be in [64, 1048576]", kExitUsage);
    if (limits.max_batch < 8 || limits.max_batch > 1024)
      return Fail("--max-batch must be in [8, 1024]", kExitUsage);

    const std::string model_dir = vm["model"].as<std::string>();
    auto model = backend::LoadModelDir(model_dir);
    if (!model) return Fail(model.error());
    // What the server would serve it as (the frontend's time is timed on it); none without a
    // tokenizer.
    auto served = backend::serve::MakeServedModel(*model, model_dir);
    limits.positions = model->config.max_position_embeddings;
    // Defaults shrink to a short model's context; limits given explicitly must fit in it.
    if (vm["max-tokens"].defaulted())
      limits.max_tokens = std::max<Tokens>(16, std::min(limits.max_tokens, limits.positions / 4));
    if (vm["max-context"].defaulted())
      limits.max_context = std::max<Tokens>(64, std::min(limits.max_context, limits.positions / 2));
    if (limits.max_tokens + limits.max_context > limits.positions)
      return Fail("--max-tokens " + std::to_string(limits.max_tokens) + " after --max-context " +
                      std::to_string(limits.max_context) + " exceeds " + model_dir +
                      "'s context of " + std::to_string(limits.positions) +
                      " tokens (max_position_embeddings)",
                  kExitUsage);
    if (vm.count("trace")) {
      int trace_code = kExitOk;
      if (Status s = SweepTheTrace(vm, limits, profile.source, &trace_code); !s.ok())
        return Fail(s.message(), trace_code);
    } else {
      for (const char* flag :
           {"trace-format", "length-scale", "limit", "window", "rate-scale", "seed"})
        if (vm.count(flag) && !vm[flag].defaulted())
          return Fail(std::string("--") + flag + " goes with --trace", kExitUsage);
    }
    profile.model = model->config;
    const std::vector<StepShape> shapes = backend::CalibrationShapes(limits);

    backend::ModelPlacement placement;
    placement.device = device;
    placement.cpu_threads = threads;
    placement.num_blocks = 0;
    const backend::AfterIdleShapes idle_shapes = backend::AfterIdleShapesFor(limits);
    for (const StepShape& s : shapes)
      placement.num_blocks =
          std::max(placement.num_blocks, backend::BlocksFor(s, placement.block_tokens));
    const backend::AfterStepShapes step_shapes = backend::AfterStepShapesFor(limits);
    for (const StepShape* s : {&idle_shapes.prefill, &idle_shapes.decode})
      placement.num_blocks =
          std::max(placement.num_blocks, backend::BlocksFor(*s, placement.block_tokens));
    for (const StepShape& s : step_shapes.shapes)
      placement.num_blocks =
          std::max(placement.num_blocks, backend::BlocksFor(s, placement.block_tokens));
    if (Status s = CheckKvCacheFits(model->config, placement.num_blocks, placement.block_tokens);
        !s.ok())
      return Fail("--max-batch " + std::to_string(limits.max_batch) + " x --max-context " +
                      std::to_string(limits.max_context) + ": " + s.message(),
                  kExitUsage);
    auto forward = backend::CreateForwardModel(std::move(*model), placement);
    if (!forward) return Fail("--device " + device + ": " + forward.error());

    const int used_threads =
        threads > 0 ? threads : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    profile.device = device;
    profile.source["device"] = device == "cpu" ? CpuName() : "cuda device 0";
    if (device == "cpu") profile.source["threads"] = used_threads;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    profile.source["host"] = host;
    profile.source["repeats"] = repeats;

    backend::StepTimer timer(**forward);
    const auto start = std::chrono::steady_clock::now();
    // The repeats are passes over every shape, not runs of one shape back to back: a machine
    // whose speed drifts during the sweep (10-20% within minutes on a shared VM, see
    // docs/validation.md) then spreads the drift over every shape's repeats, where the median
    // absorbs it, instead of biasing the shapes timed while it was slow. Each shape is timed in
    // a run of its own kind (StepTimer::TimeInARun), not after whichever shape the fixed order
    // put before it; the untimed pass before it also leaves caches, page faults and lazy
    // initialisation behind.
    const std::size_t runs = shapes.size() * static_cast<std::size_t>(repeats);
    profile.measurements.resize(shapes.size());
    for (int pass = 1; pass <= repeats; ++pass) {
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        models::StepMeasurement& m = profile.measurements[i];
        m.shape = shapes[i];
        m.seconds.push_back(timer.TimeInARun(m.shape));
        if (*progress) {
          const std::size_t done = static_cast<std::size_t>(pass - 1) * shapes.size() + i + 1;
          DrawProgress(done, runs,
                       "pass " + std::to_string(pass) + "/" + std::to_string(repeats) + ", " +
                           std::to_string(i + 1) + "/" + std::to_string(shapes.size()) +
                           " step shapes");
        }
      }
    }
    std::printf("duet calibrate: %zu step shapes x %d repeats on %s in %.1f s\n", shapes.size(),
                repeats, device.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    // The machine's own noise during the sweep, stated beside the fit it moves: each pass in
    // quarters (stretches of a few seconds to minutes).
    if (const auto passes = models::PassDeviationsPct(profile.measurements, 4); !passes.empty()) {
      nlohmann::json pct = nlohmann::json::array();
      double lo = 0, hi = 0;
      for (const std::vector<double>& pass : passes) {
        nlohmann::json& quarters = pct.emplace_back(nlohmann::json::array());
        for (double p : pass) {
          quarters.push_back(std::round(p * 10) / 10);
          lo = std::min(lo, p);
          hi = std::max(hi, p);
        }
      }
      profile.source["passes_pct"] = pct;
      std::printf(
          "passes: in quarters of each pass, the shapes took %+.1f%% to %+.1f%% of their medians "
          "(the machine's speed moving during the sweep; the fit prices the medians; each "
          "quarter: the profile's source.passes_pct)\n",
          lo, hi);
    }
    // A step after an idle spell, which the simulator adds to a step of an instance that sat idle
    // (models::AfterIdleFit).
    {
      models::AfterIdleFit& idle = profile.after_idle.emplace();
      idle.idle_s.assign(backend::kIdleSpells.begin(), backend::kIdleSpells.end());
      idle.prefill_s = models::FitAfterIdle(
          timer.TimeAfterIdle(idle_shapes.prefill, backend::kIdleSpells, repeats));
      idle.decode_s = models::FitAfterIdle(
          timer.TimeAfterIdle(idle_shapes.decode, backend::kIdleSpells, repeats));
      idle.repeats = repeats;
      auto spells = [&](const std::vector<Seconds>& extra) {
        std::string text;
        for (std::size_t i = 0; i < extra.size(); ++i) {
          char part[64];
          std::snprintf(part, sizeof part, "%s+%.1f ms after %g ms", i ? ", " : "", 1e3 * extra[i],
                        1e3 * idle.idle_s[i]);
          text += part;
        }
        return text;
      };
      std::printf(
          "after idle: a prefill of %lld tokens took %s; a one-row decode step at %lld tokens of "
          "context %s (beyond each in a run of itself; the simulator adds them to a step after an "
          "idle spell: the profile's after_idle)\n",
          static_cast<long long>(idle_shapes.prefill.PrefillTokens()),
          spells(idle.prefill_s).c_str(),
          static_cast<long long>(idle_shapes.decode.decode_context_tokens),
          spells(idle.decode_s).c_str());
    }
    // A step right after another kind, which the simulator adds to a step that follows one
    // (models::ShapePairFit): the medians, each at least 0.
    profile.after_step =
        PairFit(step_shapes, repeats, timer.TimeAfterSteps(step_shapes.shapes, repeats), true);
    PrintPairs(*profile.after_step, step_shapes.decode_context,
               "after another step: ms beyond each in a run of itself (rows: the step, d: decode "
               "rows at %lld tokens of context each, p: prefill tokens; columns: the step before "
               "it; the simulator adds them to a step after another: the profile's after_step)",
               true);
    if (beside) {
      // And beside another instance's step, on a second copy of the model.
      auto copy = backend::LoadModelDir(model_dir);
      if (!copy) return Fail(copy.error());
      auto neighbour = backend::CreateForwardModel(std::move(*copy), placement);
      if (!neighbour) return Fail("--beside: " + neighbour.error());
      const backend::StepTimer::Beside timed =
          timer.TimeBeside(step_shapes.shapes, **neighbour, repeats);
      profile.beside = PairFit(step_shapes, repeats, timed.extra, false);
      for (const std::vector<Seconds>& alone : timed.alone)
        profile.beside->alone_s.push_back(models::MedianOf(alone));
      PrintPairs(*profile.beside, step_shapes.decode_context,
                 "beside another instance: ms beyond each alone (rows: the step, d: decode rows at "
                 "%lld tokens of context each, p: prefill tokens; columns: the step the other "
                 "instance ran over and over; the simulator prices a step beside another on its "
                 "node by these as shares of the time alone, interpolated between the sizes: the "
                 "profile's beside)",
                 false);
    }
    if (served) {
      auto frontend =
          TimeFrontend(**served, limits.max_context, limits.trace_prompts, placement.block_tokens);
      if (!frontend) return Fail("timing the frontend: " + frontend.error());
      profile.frontend = *frontend;
    } else {
      std::printf("frontend not timed: %s\n", served.error().c_str());
    }

    // Transfers of up to the longest cached context the sweep covers, in the model's blocks.
    const std::optional<backend::KvRegion> region = (*forward)->kv_region();
    for (const auto& [name, options] : transports) {
      if (!region) return Fail("--transport: the model on " + device + " has no KV region");
      const std::int64_t max_blocks =
          (limits.max_context + placement.block_tokens - 1) / placement.block_tokens;
      // Two rings (a side each) beside the sweep's KV cache, which stays allocated.
      const std::int64_t ring = TransferRingBlocks(region->block_bytes, max_blocks);
      if (Status s = CheckKvCacheFits(profile.model, placement.num_blocks + 2 * ring,
                                      placement.block_tokens);
          !s.ok())
        return Fail("--transport with --max-context " + std::to_string(limits.max_context) + ": " +
                        s.message(),
                    kExitUsage);
      auto link = TimeTransport(name, options, region->block_bytes, max_blocks, repeats, *progress);
      if (!link) return Fail(link.error());
      PrintLink(*link);
      profile.links.push_back(std::move(*link));
    }
    if (vm.count("tiers")) {
      if (!region) return Fail("--tiers: the model on " + device + " has no KV region");
      const std::string path = vm["tiers"].as<std::string>();
      auto doc = ReadJsonFile(path);
      if (!doc) return Fail("--tiers: " + doc.error());
      auto tiers = deploy::ParseTiers(*doc, path, region->block_bytes, /*prefix_caching=*/true,
                                      {.timing = true});
      if (!tiers) return Fail("--tiers: " + tiers.error());
      if (!tiers->any()) return Fail("--tiers: " + path + " configures no tiers", kExitUsage);
      const std::int64_t max_blocks =
          (limits.max_context + placement.block_tokens - 1) / placement.block_tokens;
      auto fits = TimeTiers(*tiers, region->block_bytes, max_blocks, repeats, *progress);
      if (!fits) return Fail(fits.error());
      for (models::LinkFit& fit : *fits) {
        PrintLink(fit, "tier");
        profile.links.push_back(std::move(fit));
      }
    }
  }

  std::optional<models::HardwareSpec> gpu;
  if (vm.count("roofline")) {
    auto hw = LoadGpuRef(vm["roofline"].as<std::string>());
    if (!hw) return Fail("--roofline: " + hw.error());
    gpu = *hw;
  }
  if (profile.measurements.empty())
    return Fail(vm["measurements"].as<std::string>() + ": no measurements");
  if (vm.count("pool")) {
    if (Status s = PoolWith(profile, vm["pool"].as<std::string>()); !s.ok())
      return Fail(s.message());
  }
  if (Status s = FitStepsOf(profile, gpu); !s.ok()) return Fail(s.message());
  if (vm.count("host-steps")) {
    auto host = FitHostSteps(vm["host-steps"].as<std::string>());
    if (!host) return Fail(host.error());
    profile.host = std::move(*host);
  }
  if (Status s = WriteProfile(profile, out_path); !s.ok()) return Fail(s.message());
  std::printf("wrote %s\n", out_path.c_str());
  return kExitOk;
}

}  // namespace duet::cli
