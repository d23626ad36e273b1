// The `duet` subcommands and what they share: the exit convention (0 success, 1 bad input files
// or a failed run, 2 a bad command line, 130 stopped by a signal; errors go to stderr as one
// "duet: error: ..." line), argument parsing, where bundled data is found, and the trace flags.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "policies/router.h"
#include "traces/arrivals.h"
#include "traces/trace.h"

namespace duet::sim {
struct SimOptions;
}  // namespace duet::sim
namespace duet::models {
struct ModelSpec;
struct HardwareSpec;
}  // namespace duet::models

namespace duet::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitSignal = 130;  // stopped by SIGINT or SIGTERM, as a shell reports it

int Fail(const std::string& message, int code = kExitError);

// Parses argv[1..] into `vm` (argv[0] is the command's name). False when the caller should
// return *exit_code at once: a usage error (reported) or --help (printed).
bool ParseArgs(int argc, char** argv, const boost::program_options::options_description& opts,
               boost::program_options::variables_map& vm, int* exit_code);

// Bundled data (models/, sim/clusters/, traces/bundled/) is found relative to the current
// directory first, then relative to the source tree the binary was built from.
std::string Locate(const std::string& path);
std::string DataDir();
// A model and a GPU named as a cluster file names them: a bundled name (models/specs/,
// models/hardware/), a .json path, or (a model) a Hugging Face model directory.
Result<models::ModelSpec> LoadModelRef(const std::string& ref);
Result<models::HardwareSpec> LoadGpuRef(const std::string& ref);

// --trace (required when default_trace is empty, unless `required` is false), --trace-format,
// --rate-scale, --length-scale, --limit, --window and --seed.
void AddTraceOptions(boost::program_options::options_description& opts,
                     const std::string& default_trace = "", bool required = true);
// Reads the trace those flags name and applies the selections. On error, *exit_code says
// whether it was the command line (kExitUsage) or the file (kExitError).
Result<traces::Trace> LoadTrace(const boost::program_options::variables_map& vm, int* exit_code);
// The format of the trace --trace names: --trace-format, else its file extension.
Result<traces::TraceFormat> TraceFormatOf(const boost::program_options::variables_map& vm);
// The selection flags given (--trace-format, --limit, --window, --length-scale), as arguments
// for a child command that reads the same trace (--trace, --rate-scale and --seed are the
// caller's).
std::vector<std::string> TraceSelectionArgs(const boost::program_options::variables_map& vm);

// One line of a printed summary: a METRICS.md distribution (mean, p50, p90, p99, max); null
// statistics (no request completed) print as n/a.
void PrintDistribution(const char* label, const nlohmann::json& distribution);
// The throughput line and the TTFT, TPOT, ITL and E2E lines of a METRICS.md summary.
void PrintThroughputAndLatencies(const nlohmann::json& summary);
// The goodput line of a summary, when an SLO was given.
void PrintGoodput(const nlohmann::json& summary);
// A statistic with two decimals, or "n/a" when it is null.
std::string FormatStat(const nlohmann::json& value);

// --progress auto|always|never: a progress bar on stderr, by default when it is a terminal.
void AddProgressOption(boost::program_options::options_description& opts);
Result<bool> ProgressWanted(const boost::program_options::variables_map& vm);

// --router NAME (default `default_router`) and the weights of the kv-aware router and the load
// guard (policies::RouterConfig), for the commands that route: simulate and serve.
void AddRouterOptions(boost::program_options::options_description& opts,
                      const char* default_router);
// Fills config's kind, kv weights and load guard; errors name the flag.
Status ParseRouterOptions(const boost::program_options::variables_map& vm,
                          policies::RouterConfig* config);

// --concurrency, --think-time-ms, --duration: a closed loop (simulate and replay); parsed with
// the trace options (--rate-scale is refused with it). Errors name the flag.
void AddClosedLoopOptions(boost::program_options::options_description& opts);
Status ParseClosedLoopOptions(const boost::program_options::variables_map& vm,
                              traces::ClosedLoop* loop);

// --jobs N and --ray HOST:PORT, for the commands that run many simulations (plan, sweep; the
// runner they make: cli/sim_runner.h). CheckRunnerOptions: --jobs at most the cores present
// without --ray, --ray a HOST:PORT; errors name the flag.
void AddRunnerOptions(boost::program_options::options_description& opts);
Status CheckRunnerOptions(const boost::program_options::variables_map& vm);

// --threads: 0 (all) up to the cores present; more would only start threads that wait.
Status CheckThreadsFlag(int threads);

int Simulate(int argc, char** argv);  // cli/simulate.cpp
int Plan(int argc, char** argv);      // cli/plan.cpp
int Sweep(int argc, char** argv);     // cli/sweep.cpp
// The command-line half of `duet simulate` (no file is read): the flags into `vm` and
// `options`. False when the caller should return *exit_code at once: --help printed (0) or a
// usage error reported (2). Also what fuzz/cli_args_fuzz.cpp exercises.
bool ParseSimulateArgs(int argc, char** argv, boost::program_options::variables_map& vm,
                       sim::SimOptions* options, int* exit_code);
int Replay(int argc, char** argv);  // cli/replay.cpp
int Serve(int argc, char** argv);   // cli/serve.cpp
int Worker(int argc, char** argv);  // cli/worker.cpp
// KV blocks per instance when --kv-blocks is 0 (serve and worker): room for 16 full-context
// sequences within a 4 GiB KV budget, and at least one full-context sequence.
std::int64_t DefaultKvBlocks(const models::ModelSpec& spec, std::int32_t block_tokens);
// A KV cache is allocated up front: one larger than this machine's memory is refused before
// the allocator fails (generate, calibrate; sized as fp32, the most a backend stores).
Status CheckKvCacheFits(const models::ModelSpec& config, std::int64_t num_blocks,
                        std::int32_t block_tokens);
int Calibrate(int argc, char** argv);      // cli/calibrate.cpp
int Validate(int argc, char** argv);       // cli/validate.cpp
int MakeTestModel(int argc, char** argv);  // cli/generate.cpp
int Generate(int argc, char** argv);       // cli/generate.cpp
int Model(int argc, char** argv);          // cli/model.cpp

}  // namespace duet::cli
