// The sweep of `duet calibrate` (see step_sweep.h).
#include "backend/calibrate/step_sweep.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>
#include <string>
#include <thread>

#include "models/step_profile.h"

namespace duet::backend {

using models::StepShape;

namespace {

// Powers of two from `lo` up to `hi` (and `hi` itself when it is not one).
std::vector<Tokens> Ladder(Tokens lo, Tokens hi, Tokens factor = 2) {
  std::vector<Tokens> out;
  for (Tokens v = lo; v <= hi; v *= factor) out.push_back(v);
  if (out.empty() || out.back() != hi) out.push_back(hi);
  return out;
}

}  // namespace

std::vector<StepShape> CalibrationShapes(const SweepLimits& l) {
  std::vector<StepShape> shapes;
  auto fits = [&](Tokens context, Tokens tokens) { return context + tokens <= l.positions; };
  std::vector<Tokens> contexts = {0};
  for (Tokens c : Ladder(std::min<Tokens>(256, l.max_context), l.max_context, 4))
    if (c > 0) contexts.push_back(c);
  // Prefill: one chunk of n tokens after c cached; then batches of equal fresh chunks, which
  // tell the per-chunk cost apart from the per-token one.
  for (Tokens n : Ladder(std::min<Tokens>(16, l.max_tokens), l.max_tokens))
    for (Tokens c : contexts)
      if (fits(c, n)) shapes.push_back({{{n, c}}, 0, 0, 1});
  for (Tokens chunks : {2, 4, 8})
    for (Tokens n : {Tokens{32}, std::max<Tokens>(1, l.max_tokens / 8)}) {
      if (n * chunks > l.max_tokens || !fits(0, n)) continue;
      StepShape s;
      s.prefill.assign(static_cast<std::size_t>(chunks), {n, 0});
      shapes.push_back(s);
    }
  // Decode: a batch of rows, each after `c` cached tokens; every row count up to 16, then
  // powers of two and halfway between. A step's time is not affine in its rows between powers
  // of two (on the CPU backend it rises by 1.3 to 2.8 ms a row from 4 to 8 rows), and a ladder
  // of powers of two alone left the counts between them to the fit's interpolation: live decode
  // steps of 4-7 and 8-15 rows, which real traffic runs most, ran 6% slower than it priced them
  // and single-row ones 6.5% faster (docs/validation.md). Backends also change kernels (the
  // CPU's matrix multiplies from a GEMV to oneDNN at 12 rows): the fit can split a class at a
  // measured row count (models/step_fit.h), and the closer the counts the closer the split to
  // the change.
  constexpr Tokens kEveryRowUpTo = 16;
  std::vector<Tokens> batches;
  for (Tokens rows = 1; rows <= std::min(kEveryRowUpTo, l.max_batch); ++rows)
    batches.push_back(rows);
  for (Tokens rows = 2 * kEveryRowUpTo; rows < l.max_batch; rows *= 2) {
    batches.push_back(rows * 3 / 4);
    batches.push_back(rows);
  }
  if (batches.back() < l.max_batch) {
    if (l.max_batch > 3 * batches.back() / 2 + 1) batches.push_back(3 * batches.back() / 2);
    batches.push_back(l.max_batch);
  }
  for (Tokens rows : batches)
    for (Tokens c : Ladder(std::min<Tokens>(64, l.max_context), l.max_context, 4))
      if (fits(c, 1)) shapes.push_back({{}, rows, rows * c, 1});
  // Mixed: a chunk after a short cached context beside a decode batch at a short and at the
  // longest context.
  const Tokens chunk_context = std::min<Tokens>(256, l.max_context);
  for (Tokens n : Ladder(16, std::max<Tokens>(16, l.max_tokens / 2), 4))
    for (Tokens rows : {Tokens{2}, Tokens{8}, l.max_batch})
      for (Tokens c : {l.max_context / 4, l.max_context})
        if (fits(chunk_context, n) && fits(c, 1))
          shapes.push_back({{{n, chunk_context}}, rows, rows * c, 1});
  // ... and several chunks beside a decode batch, which tell a chunk's cost apart.
  for (Tokens chunks : {2, 4})
    if (16 * chunks <= l.max_tokens) {
      StepShape s;
      s.prefill.assign(static_cast<std::size_t>(chunks), {16, 0});
      s.decode_tokens = 8;
      s.decode_context_tokens = 8 * (l.max_context / 4);
      shapes.push_back(s);
    }
  // The trace's own shapes, after the ladders' (a sweep without a trace is unchanged).
  for (Tokens prompt : l.trace_prompts) {
    const Tokens first = std::min(prompt, l.max_tokens);
    if (first > 0 && fits(0, first)) shapes.push_back({{{first, 0}}, 0, 0, 1});
    const Tokens last = prompt - first > 0 ? (prompt - 1) % l.max_tokens + 1 : 0;
    if (last > 0 && fits(prompt - last, last)) shapes.push_back({{{last, prompt - last}}, 0, 0, 1});
  }
  for (Tokens context : l.trace_contexts)
    for (Tokens rows : Ladder(1, l.max_batch, 4))
      if (context > 0 && fits(context, 1)) shapes.push_back({{}, rows, rows * context, 1});
  // Ladders clipped by small limits repeat shapes; time each once.
  std::vector<StepShape> unique;
  std::set<std::string> seen;
  for (const StepShape& s : shapes)
    if (seen.insert(models::StepShapeToJson(s).dump()).second) unique.push_back(s);
  return unique;
}

std::vector<std::int64_t> TransferBlockCounts(std::int64_t max_blocks) {
  std::vector<std::int64_t> counts;
  for (std::int64_t p = 1; p < max_blocks; p *= 2) {
    counts.push_back(p);
    if (p >= 2 && p + p / 2 < max_blocks) counts.push_back(p + p / 2);
  }
  counts.push_back(max_blocks);
  return counts;
}

std::int64_t BlocksFor(const StepShape& s, std::int32_t block_tokens) {
  auto blocks = [&](Tokens n) { return (n + block_tokens - 1) / block_tokens; };
  std::int64_t total = 0;
  for (const models::PrefillChunk& c : s.prefill) total += blocks(c.context + c.tokens);
  if (s.decode_tokens > 0)
    total += s.decode_tokens * blocks(s.decode_context_tokens / s.decode_tokens + 1);
  return total;
}

StepTimer::StepTimer(ForwardModel& model) : model_(model) {
  const auto vocab = static_cast<std::int32_t>(model.config().vocab_size);
  ids_.resize(1 << 16);
  for (std::size_t i = 0; i < ids_.size(); ++i)
    ids_[i] = static_cast<std::int32_t>((i * 7919 + 13) % static_cast<std::size_t>(vocab));
}

Seconds StepTimer::Time(const models::StepShape& s) {
  Build(s);
  const auto start = std::chrono::steady_clock::now();
  // A measurement of a failed pass would be no measurement: calibration stops there.
  const Status pass = model_.Forward(batch_, &logits_);
  DUET_CHECK_MSG(pass.ok(), "calibration forward pass: " + pass.message());
  const auto end = std::chrono::steady_clock::now();
  logits_.clear();
  return std::chrono::duration<double>(end - start).count();
}

Seconds StepTimer::TimeInARun(const models::StepShape& s) {
  Time(s);
  return Time(s);
}

std::vector<std::vector<Seconds>> StepTimer::TimeAfterIdle(const models::StepShape& shape,
                                                           std::span<const Seconds> spells,
                                                           int repeats) {
  std::vector<std::vector<Seconds>> extra(spells.size());
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < spells.size(); ++i) {
      const Seconds steady = TimeInARun(shape);
      std::this_thread::sleep_for(std::chrono::duration<double>(spells[i]));
      extra[i].push_back(Time(shape) - steady);
    }
  }
  return extra;
}

std::vector<std::vector<std::vector<Seconds>>> StepTimer::TimeAfterSteps(
    std::span<const models::StepShape> shapes, int repeats) {
  std::vector<std::vector<std::vector<Seconds>>> extra(
      shapes.size(), std::vector<std::vector<Seconds>>(shapes.size()));
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Seconds steady = TimeInARun(shapes[i]);
      for (std::size_t j = 0; j < shapes.size(); ++j) {
        if (j == i) continue;
        // One pass of the other shape: what it leaves in the caches is the last pass's.
        Time(shapes[j]);
        extra[i][j].push_back(Time(shapes[i]) - steady);
      }
    }
  }
  return extra;
}

StepTimer::Beside StepTimer::TimeBeside(std::span<const models::StepShape> shapes,
                                        ForwardModel& neighbour, int repeats) {
  Beside out{std::vector<std::vector<std::vector<Seconds>>>(
                 shapes.size(), std::vector<std::vector<Seconds>>(shapes.size())),
             std::vector<std::vector<Seconds>>(shapes.size())};
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < shapes.size(); ++i) out.alone[i].push_back(TimeInARun(shapes[i]));
    for (std::size_t j = 0; j < shapes.size(); ++j) {
      const NeighbourLoop loop(neighbour, shapes[j]);
      for (std::size_t i = 0; i < shapes.size(); ++i)
        out.extra[i][j].push_back(TimeInARun(shapes[i]) - out.alone[i].back());
    }
  }
  return out;
}

NeighbourLoop::NeighbourLoop(ForwardModel& model, const models::StepShape& shape)
    : thread_([this, &model, shape] {
        StepTimer timer(model);
        started_ = true;
        while (!stop_) timer.Time(shape);
      }) {
  while (!started_) std::this_thread::yield();
}

NeighbourLoop::~NeighbourLoop() {
  stop_ = true;
  thread_.join();
}

AfterStepShapes AfterStepShapesFor(const SweepLimits& limits) {
  AfterStepShapes out;
  out.decode_context = std::min<Tokens>(256, limits.max_context);
  for (const Tokens rows : {Tokens{1}, std::min<Tokens>(8, limits.max_batch)})
    if (out.decode_rows.empty() || rows > out.decode_rows.back()) out.decode_rows.push_back(rows);
  for (const Tokens tokens : {Tokens{64}, Tokens{256}, Tokens{1024}}) {
    const Tokens t = std::min(tokens, limits.max_tokens);
    if (out.prefill_tokens.empty() || t > out.prefill_tokens.back())
      out.prefill_tokens.push_back(t);
  }
  for (const Tokens rows : out.decode_rows)
    out.shapes.push_back({{}, rows, rows * out.decode_context});
  for (const Tokens tokens : out.prefill_tokens) out.shapes.push_back({{{tokens, 0}}, 0, 0});
  return out;
}

AfterIdleShapes AfterIdleShapesFor(const SweepLimits& limits) {
  return {{{{std::min<Tokens>(256, limits.max_tokens), 0}}, 0, 0},
          {{}, 1, std::min<Tokens>(256, limits.max_context)}};
}

void StepTimer::Build(const models::StepShape& s) {
  const std::int32_t bt = model_.block_tokens();
  batch_.clear();
  tables_.clear();
  tables_.reserve(s.prefill.size() + static_cast<std::size_t>(s.decode_tokens));
  tokens_.clear();
  Tokens total = s.PrefillTokens() + s.decode_tokens;
  tokens_.reserve(static_cast<std::size_t>(total));
  std::int32_t next_block = 0;
  auto add = [&](Tokens n, Tokens context) {
    const auto blocks = static_cast<std::int32_t>((context + n + bt - 1) / bt);
    std::vector<std::int32_t>& table = tables_.emplace_back(static_cast<std::size_t>(blocks));
    std::iota(table.begin(), table.end(), next_block);
    next_block += blocks;
    const std::size_t at = tokens_.size();
    for (Tokens i = 0; i < n; ++i)
      tokens_.push_back(ids_[(at + static_cast<std::size_t>(i)) % ids_.size()]);
    batch_.push_back({{tokens_.data() + at, static_cast<std::size_t>(n)},
                      context,
                      table,
                      SequenceChunk::Logits::kLast});
  };
  for (const models::PrefillChunk& c : s.prefill) add(c.tokens, c.context);
  for (Tokens r = 0; r < s.decode_tokens; ++r) add(1, s.decode_context_tokens / s.decode_tokens);
}

}  // namespace duet::backend
