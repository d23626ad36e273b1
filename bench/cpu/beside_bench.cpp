// What a CPU forward pass loses to another instance's passes on the machine's other cores
// (issue 44, docs/validation.md): `duet calibrate --beside` times its reference shapes beside a
// neighbour prefilling one chunk at no context, while a live 1P1D prefill worker runs chunks of
// several prompts that attend over their cached contexts. Each target shape is timed in a run
// alone and beside a second copy of the model running each neighbour shape over and over
// (backend::NeighbourLoop, a thread of this process, as calibrate's), and beside some of them run
// by a process of its own (as a live prefill worker is beside its decode worker), the cases
// interleaved round by round so that the machine's drift falls on all of them alike; prints each
// case's median and quartiles and its median over alone's.
// Usage: duet_beside_bench MODEL_DIR [ROUNDS] [THREADS]   (defaults: 9 rounds, 1 thread each)
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/calibrate/step_sweep.h"
#include "backend/model/llama_weights.h"
#include "backend/registry.h"

using namespace duet;

namespace {

struct Shape {
  std::string name;
  models::StepShape shape;
  bool process = false;  // a neighbour run by a process of its own
};

// A neighbour in a process of its own: a child forked while this process runs no other thread,
// running `shape` over and over on its copy of `model` (the pages it writes its own) until
// killed, or until this process dies. Returns once it has run one pass.
class ProcessNeighbour {
 public:
  ProcessNeighbour(backend::ForwardModel& model, const models::StepShape& shape) {
    int ready[2];
    if (pipe(ready) != 0 || (pid_ = fork()) < 0) {
      std::perror("starting the neighbour process");
      std::exit(1);
    }
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(ready[0]);
      backend::StepTimer timer(model);
      timer.Time(shape);
      const char one = 1;
      if (write(ready[1], &one, 1) != 1) _exit(1);
      for (;;) timer.Time(shape);
    }
    close(ready[1]);
    char one = 0;
    if (read(ready[0], &one, 1) != 1) {
      std::fprintf(stderr, "the neighbour process ended before its first pass\n");
      std::exit(1);
    }
    close(ready[0]);
  }
  ~ProcessNeighbour() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  ProcessNeighbour(const ProcessNeighbour&) = delete;
  ProcessNeighbour& operator=(const ProcessNeighbour&) = delete;

 private:
  pid_t pid_ = -1;
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// `chunks` prefill chunks of `tokens` each after `context` cached tokens.
models::StepShape Prefill(int chunks, Tokens tokens, Tokens context) {
  models::StepShape s;
  for (int i = 0; i < chunks; ++i) s.prefill.push_back({tokens, context});
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [ROUNDS] [THREADS]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 9;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  if (rounds < 3 || threads < 1) {
    std::fprintf(stderr, "ROUNDS >= 3, THREADS >= 1\n");
    return 2;
  }
  const std::vector<Shape> targets = {{"decode 1x256", {{}, 1, 256}},
                                      {"decode 8x256", {{}, 8, 8 * 256}},
                                      {"prefill 256", Prefill(1, 256, 0)}};
  const std::vector<Shape> neighbours = {
      {"prefill 1024", Prefill(1, 1024, 0)},
      {"prefill 1024 after 1024", Prefill(1, 1024, 1024)},
      {"4 x prefill 256", Prefill(4, 256, 0)},
      {"4 x prefill 256 after 768", Prefill(4, 256, 768)},
      {"decode 8x256", {{}, 8, 8 * 256}},
      {"prefill 1024 (process)", Prefill(1, 1024, 0), true},
      {"4 x prefill 256 (process)", Prefill(4, 256, 0), true},
      {"decode 8x256 (process)", {{}, 8, 8 * 256}, true},
  };
  backend::ModelPlacement placement;
  placement.cpu_threads = threads;
  for (const auto* list : {&targets, &neighbours})
    for (const Shape& s : *list)
      placement.num_blocks =
          std::max(placement.num_blocks, backend::BlocksFor(s.shape, placement.block_tokens));
  std::unique_ptr<backend::ForwardModel> models[2];
  for (auto& m : models) {
    auto model = backend::LoadModelDir(argv[1]);
    if (!model) {
      std::fprintf(stderr, "%s\n", model.error().c_str());
      return 1;
    }
    auto forward = backend::CreateForwardModel(std::move(*model), placement);
    if (!forward) {
      std::fprintf(stderr, "%s\n", forward.error().c_str());
      return 1;
    }
    m = std::move(*forward);
  }
  backend::StepTimer timer(*models[0]);
  // [neighbour + 1][target]: alone first; each a median of 5 passes in a run, per round.
  std::vector<std::vector<std::vector<double>>> ms(
      neighbours.size() + 1, std::vector<std::vector<double>>(targets.size()));
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t n = 0; n <= neighbours.size(); ++n) {
      std::optional<backend::NeighbourLoop> loop;
      std::optional<ProcessNeighbour> process;
      if (n > 0 && neighbours[n - 1].process)
        process.emplace(*models[1], neighbours[n - 1].shape);
      else if (n > 0)
        loop.emplace(*models[1], neighbours[n - 1].shape);
      for (std::size_t t = 0; t < targets.size(); ++t) {
        std::vector<double> passes;
        for (int i = 0; i < 5; ++i) passes.push_back(1e3 * timer.TimeInARun(targets[t].shape));
        ms[n][t].push_back(Quantile(passes, 0.5));
      }
    }
  }
  std::printf("# %d rounds, %d thread(s) each; ms: median [p25-p75], median over alone\n", rounds,
              threads);
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const double alone = Quantile(ms[0][t], 0.5);
    for (std::size_t n = 0; n <= neighbours.size(); ++n) {
      const double median = Quantile(ms[n][t], 0.5);
      std::printf("%-13s beside %-28s %8.2f [%.2f-%.2f] x%.3f\n", targets[t].name.c_str(),
                  n == 0 ? "nothing" : neighbours[n - 1].name.c_str(), median,
                  Quantile(ms[n][t], 0.25), Quantile(ms[n][t], 0.75), median / alone);
    }
  }
  return 0;
}
