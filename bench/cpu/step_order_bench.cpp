// What a CPU forward pass's time owes to what the engine did just before it (issue 44,
// docs/validation.md): `duet calibrate` times each shape in a run of itself and a step after idle
// spells, while a PD decode worker's steps follow decode steps, a prefill worker's often an idle
// spell, and a colocated server's decode steps prefill-carrying ones. Each target shape is timed
// right after a preceding one (untimed) or after IDLE_MS asleep, the cases interleaved round by
// round so that the machine's drift falls on all of them alike; prints each case's median and
// quartiles and its median over the steady case's (the shape after itself).
// Usage: duet_step_order_bench MODEL_DIR [ROUNDS] [THREADS] [IDLE_MS]
//        (defaults: 15 rounds, 1 thread, 50 ms)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "backend/calibrate/step_sweep.h"
#include "backend/model/llama_weights.h"
#include "backend/registry.h"

using namespace duet;

namespace {

struct Shape {
  const char* name;
  models::StepShape shape;
};

// What runs before the timed pass: another shape (untimed), or nothing for `idle_ms`.
struct Before {
  const char* name;
  const models::StepShape* shape;  // null: asleep
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [ROUNDS] [THREADS] [IDLE_MS]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int idle_ms = argc > 4 ? std::atoi(argv[4]) : 50;
  if (rounds < 3 || threads < 1 || idle_ms < 0) {
    std::fprintf(stderr, "ROUNDS >= 3, THREADS >= 1, IDLE_MS >= 0\n");
    return 2;
  }
  auto model = backend::LoadModelDir(argv[1]);
  if (!model) {
    std::fprintf(stderr, "%s\n", model.error().c_str());
    return 1;
  }
  const std::vector<Shape> targets = {
      {"decode 1x256", {{}, 1, 256}},
      {"decode 8x256", {{}, 8, 8 * 256}},
      {"prefill 64", {{{64, 0}}, 0, 0}},
      {"prefill 256", {{{256, 0}}, 0, 0}},
  };
  const models::StepShape big_prefill{{{1024, 0}}, 0, 0};
  backend::ModelPlacement placement;
  placement.cpu_threads = threads;
  for (const Shape& s : targets)
    placement.num_blocks =
        std::max(placement.num_blocks, backend::BlocksFor(s.shape, placement.block_tokens));
  placement.num_blocks =
      std::max(placement.num_blocks, backend::BlocksFor(big_prefill, placement.block_tokens));
  auto forward = backend::CreateForwardModel(std::move(*model), placement);
  if (!forward) {
    std::fprintf(stderr, "%s\n", forward.error().c_str());
    return 1;
  }
  backend::StepTimer timer(**forward);

  // Per target: after itself (the steady case), after each other kind, after a long prefill,
  // after an idle spell.
  struct Case {
    const Shape* target;
    Before before;
    std::vector<double> ms;
  };
  std::vector<Case> cases;
  for (const Shape& t : targets) {
    cases.push_back({&t, {"itself", &t.shape}, {}});
    for (const Shape& other : targets)
      if (&other != &t) cases.push_back({&t, {other.name, &other.shape}, {}});
    cases.push_back({&t, {"prefill 1024", &big_prefill}, {}});
    cases.push_back({&t, {"idle", nullptr}, {}});
  }
  for (Case& c : cases) timer.Time(c.target->shape);  // untimed: caches, page faults
  for (int round = 0; round < rounds; ++round) {
    for (Case& c : cases) {
      // Two passes of the same kind before: a run of them, as an engine's steps come.
      for (int i = 0; i < 2; ++i) {
        if (c.before.shape)
          timer.Time(*c.before.shape);
        else
          std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
      }
      c.ms.push_back(1e3 * timer.Time(c.target->shape));
    }
  }
  std::printf("# %d rounds, %d thread(s), idle %d ms; ms: median [p25-p75], median over steady\n",
              rounds, threads, idle_ms);
  double steady = 0;
  for (const Case& c : cases) {
    const double median = Quantile(c.ms, 0.5);
    if (c.before.shape == &c.target->shape) steady = median;
    std::printf("%-13s after %-13s %8.2f [%.2f-%.2f] x%.3f\n", c.target->name, c.before.name,
                median, Quantile(c.ms, 0.25), Quantile(c.ms, 0.75), median / steady);
  }
  return 0;
}
