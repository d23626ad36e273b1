// Tests for step profiles and the calibration fit: the fit recovers the costs that generated its
// data (one affine piece, and the roofline's two regimes), held-out error is measured on shapes the
// fit never saw, the fitted cost is monotone, profiles survive the round trip through JSON, and
// every malformed field is an error naming where.
#include "models/step_fit.h"

#include "backend/calibrate/step_sweep.h"
#include "models/step_profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "backend/cpu/cpu_model.h"
#include "backend/engine/fault_injecting_model.h"
#include "backend/model/llama_weights.h"
#include "backend/model/test_model.h"
#include "tests/model/temp_dir.h"

#include "tests/models/bundled_specs.h"

namespace duet::models {
namespace {

using json = nlohmann::json;

// A sweep like duet calibrate's: prefill chunks over cached contexts, decode batches over
// contexts, mixed steps.
std::vector<StepShape> Sweep() {
  std::vector<StepShape> shapes;
  for (Tokens n : {16, 64, 128, 256, 512, 1024, 2048, 4096})
    for (Tokens c : {0, 512, 4096}) {
      StepShape s;
      s.prefill = {{n, c}};
      shapes.push_back(s);
    }
  for (Tokens rows : {1, 2, 4, 8, 12, 16, 32, 64, 128, 256})
    for (Tokens c : {128, 1024, 8192}) {
      StepShape s;
      s.decode_tokens = rows;
      s.decode_context_tokens = rows * c;
      shapes.push_back(s);
    }
  for (Tokens n : {32, 256, 1024})
    for (Tokens rows : {4, 32, 128})
      for (Tokens c : {512, 2048}) {
        StepShape s;
        s.prefill = {{n, 256}, {n / 2, 0}};
        s.decode_tokens = rows;
        s.decode_context_tokens = rows * c;
        shapes.push_back(s);
      }
  return shapes;
}

std::vector<StepMeasurement> Measure(const StepCostModel& truth) {
  std::vector<StepMeasurement> out;
  for (const StepShape& s : Sweep()) out.push_back({s, {truth.StepTime(s)}, false});
  return out;
}

AffinePiece KnownPiece() {
  AffinePiece p;
  p.seconds_per = {2e-3, 1e-4, 3e-6, 1e-7, 2e-10, 4e-5, 2e-8};
  return p;
}

AffinePiece DecodePiece(double step, double per_row) {
  AffinePiece p;
  p.seconds_per = {step, 0, 0, 0, 0, per_row, 2e-8};
  return p;
}

constexpr auto kDecode = static_cast<std::size_t>(ShapeClass::kDecode);

// Decode steps as on the CPU backend: a GEMV whose cost grows fast with rows below 12, then a
// faster kernel (oneDNN) that is cheaper at 12 rows than the GEMV at 11. Concave in rows: no
// max-affine function of the columns fits it.
StepFit KernelChangeAt12() {
  StepFit truth;
  truth.pieces = {{{KnownPiece()}, {DecodePiece(2e-3, 1e-3)}, {KnownPiece()}}};
  truth.split_rows[kDecode] = 12;
  truth.pieces_above[kDecode] = {DecodePiece(8e-3, 2e-4)};
  return truth;
}

// A sweep of three passes over 8 shapes (quarters of 2) whose first pass ran 2% slower and whose
// third ran 15% faster in its second half, as on a shared machine whose speed moved: each stretch's
// median time over the shapes' medians says so, whatever the shapes' own times.
TEST(StepProfileTest, PassDeviationsAreEachStretchOverTheShapesMedians) {
  std::vector<StepMeasurement> ms;
  for (double base : {0.002, 0.03, 0.4, 1.7, 0.01, 0.2, 0.05, 3.0}) {
    StepMeasurement m;
    m.seconds = {base * 1.02, base, base * (ms.size() < 4 ? 1.0 : 0.85)};
    ms.push_back(m);
  }
  const std::vector<std::vector<double>> pct = PassDeviationsPct(ms, 4);
  ASSERT_EQ(pct.size(), 3u);
  for (std::size_t part = 0; part < 4; ++part) {
    EXPECT_NEAR(pct[0][part], 2, 1e-9) << part;
    EXPECT_NEAR(pct[1][part], 0, 1e-9) << part;
    EXPECT_NEAR(pct[2][part], part < 2 ? 0 : -15, 1e-9) << part;
  }
  // Not passes: too few measurements, measurements of one repeat, or of differing counts (read
  // from elsewhere).
  EXPECT_TRUE(PassDeviationsPct(ms, 9).empty());
  ms[1].seconds.pop_back();
  EXPECT_TRUE(PassDeviationsPct(ms, 4).empty());
  for (StepMeasurement& m : ms) m.seconds.resize(1);
  EXPECT_TRUE(PassDeviationsPct(ms, 4).empty());
  EXPECT_TRUE(PassDeviationsPct({}, 4).empty());
}

// A sweep timed on a machine 10% slower than the truth, and again, in another order, 10% faster:
// pooled, each shape's median is the truth's, which a fit recovers; sweeps of other shapes are
// not pooled.
TEST(StepProfileTest, PooledSweepsPriceTheMachineOverBothTimes) {
  StepFit truth;
  truth.pieces = {{{KnownPiece()}, {KnownPiece()}, {KnownPiece()}}};
  std::vector<StepMeasurement> before = Measure(FittedCostModel(truth)), after = before;
  for (StepMeasurement& m : before) {
    m.seconds = {1.1 * m.seconds[0], 1.12 * m.seconds[0], 1.08 * m.seconds[0]};
    m.held_out = true;
  }
  for (StepMeasurement& m : after)
    m.seconds = {0.9 * m.seconds[0], 0.88 * m.seconds[0], 0.92 * m.seconds[0]};
  std::reverse(after.begin(), after.end());
  std::vector<StepMeasurement> pooled = before;
  ASSERT_TRUE(PoolMeasurements(pooled, after, "after.json").ok());
  for (std::size_t i = 0; i < pooled.size(); ++i) {
    const Seconds t = FittedCostModel(truth).StepTime(pooled[i].shape);
    ASSERT_EQ(pooled[i].seconds.size(), 6u);
    EXPECT_DOUBLE_EQ(pooled[i].seconds[0], before[i].seconds[0]) << "its own times first";
    EXPECT_NEAR(pooled[i].seconds[5], 0.92 * t, 1e-12 * t) << "then the other's, of its shape";
    EXPECT_FALSE(pooled[i].held_out);
  }
  Result<StepFit> fit = FitSteps(pooled, 1, {.held_out_every = 4, .max_pieces = 1});
  ASSERT_TRUE(fit.ok()) << fit.error();
  for (const StepShape& shape : Sweep()) {
    const Seconds want = FittedCostModel(truth).StepTime(shape);
    EXPECT_NEAR(FittedCostModel(*fit).StepTime(shape), want, 1e-6 * want) << StepShapeToJson(shape);
  }
  // Not the same sweep: a shape missing, or one more.
  std::vector<StepMeasurement> fewer = after, into = before;
  fewer.pop_back();
  Status missing = PoolMeasurements(into, fewer, "after.json");
  EXPECT_NE(missing.message().find("after.json: 71 step shapes where these are 72: not the same "
                                   "sweep"),
            std::string::npos)
      << missing.message();
  fewer.push_back(fewer.front());
  fewer.front().shape.decode_context_tokens += 1;
  missing = PoolMeasurements(into, fewer, "after.json");
  EXPECT_NE(missing.message().find("after.json: no step shape {"), std::string::npos)
      << missing.message();
}

TEST(StepProfileTest, OnePieceIsRecoveredExactly) {
  StepFit truth;
  truth.pieces = {{{KnownPiece()}, {KnownPiece()}, {KnownPiece()}}};
  std::vector<StepMeasurement> ms = Measure(FittedCostModel(truth));
  Result<StepFit> fit = FitSteps(ms, 1, {.held_out_every = 4, .max_pieces = 1});
  ASSERT_TRUE(fit.ok()) << fit.error();
  // One piece per class, pricing every shape as the truth does, in the sweep and beyond it.
  for (const auto& pieces : fit->pieces) EXPECT_EQ(pieces.size(), 1u);
  std::vector<StepShape> shapes = Sweep();
  StepShape beyond;  // along what each class's sweep varies
  beyond.prefill = {{30000, 20000}};
  shapes.push_back(beyond);
  beyond.prefill = {{3000, 256}, {7, 0}};
  beyond.decode_tokens = 500;
  beyond.decode_context_tokens = 500 * 30000;
  shapes.push_back(beyond);
  beyond.prefill.clear();
  shapes.push_back(beyond);
  for (const StepShape& s : shapes) {
    const Seconds want = FittedCostModel(truth).StepTime(s);
    EXPECT_NEAR(FittedCostModel(*fit).StepTime(s), want, 1e-9 * want) << StepShapeToJson(s);
  }
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    EXPECT_GT(fit->held_out[c].shapes, 0) << ToString(static_cast<ShapeClass>(c));
    EXPECT_LT(fit->held_out[c].max_pct, 1e-4);
    // Fitted without its largest shapes, each class still prices them as the truth does.
    EXPECT_GT(fit->extrapolation[c].shapes, 0) << ToString(static_cast<ShapeClass>(c));
    EXPECT_LT(fit->extrapolation[c].max_pct, 1e-4) << ToString(static_cast<ShapeClass>(c));
  }
  // One in each whole run of four measurements of a class was held out, and only those: the
  // 4th, 7th, 10th, 13th, 20th, ... (the place moves back by one from one run to the next).
  std::array<int, kShapeClasses> seen{};
  for (const StepMeasurement& m : ms) {
    const int i = seen[static_cast<std::size_t>(ClassOf(FeaturesOf(m.shape)))]++;
    EXPECT_EQ(m.held_out, i == 3 || i == 6 || i == 9 || i == 12 || i == 19 || i == 22 || i == 25)
        << i;
  }
  EXPECT_EQ(seen, (std::array<int, kShapeClasses>{24, 30, 18}));
}

TEST(StepProfileTest, AKernelChangeIsASplitAtItsRowCount) {
  const StepFit truth = KernelChangeAt12();
  std::vector<StepMeasurement> ms = Measure(FittedCostModel(truth));
  Result<StepFit> split = FitSteps(ms, 1);
  Result<StepFit> unsplit = FitSteps(ms, 1, {.split_decode = false});
  ASSERT_TRUE(split.ok() && unsplit.ok());
  EXPECT_EQ(split->split_rows, (std::array<Tokens, kShapeClasses>{0, 12, 0}));
  EXPECT_LT(split->held_out[kDecode].max_pct, 1e-4);
  EXPECT_GT(unsplit->held_out[kDecode].max_pct, 10.0);
  // Both sides of the change, at contexts the sweep did not have.
  for (Tokens rows : {1, 11, 12, 100}) {
    StepShape s;
    s.decode_tokens = rows;
    s.decode_context_tokens = rows * 3000;
    const Seconds want = FittedCostModel(truth).StepTime(s);
    EXPECT_NEAR(FittedCostModel(*split).StepTime(s), want, 1e-9 * want) << rows;
  }
}

TEST(StepProfileTest, TwoDecodePiecesAreFoundInMeasuredSteps) {
  // Decode step medians (ms) of the bench model on the CPU backend, two threads, on the
  // development VM (duet calibrate, 2026-11-24): about the same for 1 and 2 rows (the GEMV reads
  // the weights once), then growing with rows. The alternation's starts once all collapsed to
  // one piece here (a piece left with nothing to fit), and one piece misses by over 15%.
  const double measured[][3] = {
      {1, 64, 6.55},    {1, 256, 6.77},   {1, 1024, 7.89},   {1, 2048, 9.86},   {2, 64, 7.04},
      {2, 256, 7.14},   {2, 1024, 8.97},  {2, 2048, 12.30},  {4, 64, 8.18},     {4, 256, 9.01},
      {4, 1024, 12.71}, {4, 2048, 19.63}, {8, 64, 14.53},    {8, 256, 16.02},   {8, 1024, 24.15},
      {8, 2048, 36.50}, {16, 64, 29.37},  {16, 256, 32.35},  {16, 1024, 54.15}, {16, 2048, 80.30},
      {32, 64, 57.81},  {32, 256, 52.16}, {32, 1024, 84.88}, {32, 2048, 141.34}};
  StepFit truth;
  truth.pieces = {{{KnownPiece()}, {KnownPiece()}, {KnownPiece()}}};
  std::vector<StepMeasurement> ms = Measure(FittedCostModel(truth));
  std::erase_if(ms, [](const StepMeasurement& m) {
    return ClassOf(FeaturesOf(m.shape)) == ShapeClass::kDecode;
  });
  for (const auto& [rows, context, ms_median] : measured) {
    StepShape s;
    s.decode_tokens = static_cast<Tokens>(rows);
    s.decode_context_tokens = static_cast<Tokens>(rows * context);
    ms.push_back({s, {ms_median * 1e-3}, false});
  }
  // (Every third held out: the training shapes on which the old starts all collapsed.)
  Result<StepFit> one =
      FitSteps(ms, 1, {.held_out_every = 3, .max_pieces = 1, .split_decode = false});
  Result<StepFit> two = FitSteps(ms, 1, {.held_out_every = 3, .split_decode = false});
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(two->pieces[kDecode].size(), 2u);
  EXPECT_GT(one->training[kDecode].max_pct, 15.0);
  EXPECT_LT(two->training[kDecode].mean_pct, 0.6 * one->training[kDecode].mean_pct);
}

TEST(StepProfileTest, ExtrapolationIsTheErrorOnTheLargestShapesOfAFitWithoutThem) {
  // Decode steps that turn compute-bound only at the sweep's largest batches (128 and 256 rows):
  // the fit of the whole sweep has seen both regimes and prices held-out shapes well; fitted
  // without each class's largest quarter, it has seen one, and misses the other.
  StepFit truth;
  AffinePiece compute = DecodePiece(0, 1e-4);
  truth.pieces = {{{KnownPiece()}, {DecodePiece(10e-3, 2e-5), compute}, {KnownPiece()}}};
  std::vector<StepMeasurement> ms = Measure(FittedCostModel(truth));
  Result<StepFit> fit = FitSteps(ms, 1, {.held_out_every = 4, .split_decode = false});
  ASSERT_TRUE(fit.ok()) << fit.error();
  EXPECT_LT(fit->held_out[kDecode].mean_pct, 2.0);
  // The largest quarter of 30 decode shapes: 7, those of 128 and 256 rows and the longest
  // 64-row one; of them, those beyond the rest's rows or context are priced.
  EXPECT_GE(fit->extrapolation[kDecode].shapes, 6);
  EXPECT_LE(fit->extrapolation[kDecode].shapes, 7);
  EXPECT_GT(fit->extrapolation[kDecode].max_pct, 30.0);
}

TEST(StepProfileTest, TheRooflinesTwoRegimesNeedTwoPieces) {
  // The roofline is max(memory, compute) + overhead: max-affine in the fit's columns. One piece
  // misses small prefills (memory-bound) or large ones (compute-bound); two fit it.
  RooflineOptions options;
  Result<HardwareSpec> gpu = LoadHardwareSpec("models/hardware/h100-sxm.json");
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const RooflineCostModel roofline(Model("llama-3.1-8b"), *gpu, options);
  std::vector<StepMeasurement> ms = Measure(roofline);

  Result<StepFit> one =
      FitSteps(ms, 1, {.held_out_every = 4, .max_pieces = 1, .split_decode = false});
  Result<StepFit> two = FitSteps(ms, 1);
  ASSERT_TRUE(one.ok() && two.ok());
  const auto prefill = static_cast<std::size_t>(ShapeClass::kPrefill);
  ASSERT_EQ(two->pieces[prefill].size(), 2u);
  EXPECT_GT(one->held_out[prefill].max_pct, 10.0);
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    EXPECT_LT(two->held_out[c].mean_pct, 1.0) << ToString(static_cast<ShapeClass>(c));
    EXPECT_LT(two->held_out[c].max_pct, 2.5) << ToString(static_cast<ShapeClass>(c));
  }
  // The compute-bound piece's intercept is the roofline's overhead: what a step costs beyond
  // its work.
  const auto& pieces = two->pieces[prefill];
  const double overhead = std::min(pieces[0].seconds_per[0], pieces[1].seconds_per[0]);
  EXPECT_NEAR(overhead, options.step_overhead, 0.1e-3);
}

TEST(StepProfileTest, FittedCostIsMonotoneAndEmptyStepsAreFree) {
  RooflineOptions options;
  Result<HardwareSpec> gpu = LoadHardwareSpec("models/hardware/h100-sxm.json");
  ASSERT_TRUE(gpu.ok());
  std::vector<StepMeasurement> ms =
      Measure(RooflineCostModel(Model("llama-3.1-8b"), *gpu, options));
  Result<StepFit> fit = FitSteps(ms, 1);
  ASSERT_TRUE(fit.ok());
  const FittedCostModel model(*fit);
  EXPECT_EQ(model.StepTime(StepShape{}), 0.0);
  Seconds last = 0;
  for (Tokens n = 1; n <= 16384; n *= 2) {
    StepShape s;
    s.prefill = {{n, 100}};
    s.decode_tokens = 3;
    s.decode_context_tokens = 3000;
    const Seconds t = model.StepTime(s);
    EXPECT_GE(t, last) << n;
    last = t;
    s.decode_context_tokens += 1000;
    EXPECT_GE(model.StepTime(s), t);
  }
}

// The simulator times a decode run in one call; each step's end must be the one that StepTime
// gives step by step, to the bit (runs are cut at any step boundary, outputs compared exactly):
// the bundled profile, and decode pieces whose maximum changes during a run.
TEST(StepProfileTest, DecodeRunsEndWhereTheirStepsDoBitForBit) {
  Result<StepProfile> profile = LoadStepProfile("sim/profiles/h100-sxm-llama-3.1-8b.json");
  ASSERT_TRUE(profile.ok()) << profile.error();
  std::vector<StepFit> fits = profile->fits;
  StepFit crossing;  // (fixed, per context token): the second leads past 1e6 tokens
  for (auto& pieces : crossing.pieces) pieces = {KnownPiece()};
  crossing.pieces[static_cast<std::size_t>(ShapeClass::kDecode)].clear();
  for (const auto& [fixed, per_token] : {std::pair{3e-3, 1e-9}, {1e-3, 3e-9}, {0.0, 1e-9}}) {
    AffinePiece p = KnownPiece();
    p.seconds_per[0] = fixed;
    p.seconds_per[kFitColumns - 1] = per_token;
    crossing.pieces[static_cast<std::size_t>(ShapeClass::kDecode)].push_back(p);
  }
  fits.push_back(crossing);
  for (const StepFit& fit : fits) {
    const FittedCostModel model(fit);
    std::set<std::size_t> leaders;
    for (Tokens rows : {1, 7, 64, 255}) {
      StepShape s;
      s.tp = fit.tp;
      s.decode_tokens = rows;
      s.decode_context_tokens = rows * 1000 + 3;
      std::vector<Seconds> run, stepwise;
      model.AppendDecodeRunEnds(s, 3000, 12.5, &run);
      model.StepCostModel::AppendDecodeRunEnds(s, 3000, 12.5, &stepwise);
      ASSERT_EQ(run.size(), 3000u);
      for (std::size_t i = 0; i < run.size(); ++i) {
        ASSERT_EQ(run[i], stepwise[i]) << "tp " << fit.tp << ", rows " << rows << ", step " << i;
        std::size_t leader = 0;
        MaxOfPieces(fit.pieces[static_cast<std::size_t>(ShapeClass::kDecode)],
                    FitColumns(FeaturesOf(s)), &leader);
        leaders.insert(leader);
        s.decode_context_tokens += s.decode_tokens;
      }
    }
    if (&fit == &fits.back()) {
      EXPECT_EQ(leaders, (std::set<std::size_t>{0, 1}));
    }
  }
}

TEST(StepProfileTest, FitNeedsEnoughMeasurementsAndAHeldOutShapePerClass) {
  StepFit truth;
  truth.pieces = {{{KnownPiece()}, {KnownPiece()}, {KnownPiece()}}};
  std::vector<StepMeasurement> ms = Measure(FittedCostModel(truth));
  StepShape mixed;
  mixed.prefill = {{10, 0}};
  mixed.decode_tokens = 2;
  // Three mixed measurements: none is the 4th of its class.
  std::erase_if(ms, [](const StepMeasurement& m) {
    return ClassOf(FeaturesOf(m.shape)) == ShapeClass::kMixed;
  });
  Result<StepFit> fit = FitSteps(ms, 1);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("tp 1: 0 mixed measurements to fit; need at least 8"),
            std::string::npos)
      << fit.error();
  for (int i = 0; i < 8; ++i) ms.push_back({mixed, {0.01}, false});
  ms.push_back({mixed, {0.01}, false});
  // Nine: eight to fit, one held out (the 4th of every four is held out: two of them).
  fit = FitSteps(ms, 1);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("tp 1: 7 mixed measurements to fit"), std::string::npos)
      << fit.error();
  for (int i = 0; i < 3; ++i) ms.push_back({mixed, {0.01}, false});
  fit = FitSteps(ms, 1, {.held_out_every = 13, .max_pieces = 1});
  EXPECT_NE(fit.error().find("12 mixed measurements leave none to hold out"), std::string::npos)
      << fit.error();
  // Measurements of another TP degree are not this fit's.
  fit = FitSteps(ms, 2);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("tp 2: 0 prefill measurements"), std::string::npos) << fit.error();
}

// KV transfers of the sweep's sizes (blocks of 192 KiB) taking `time(bytes)` each, twice.
std::vector<TransferMeasurement> Transfers(const std::function<double(double)>& time) {
  std::vector<TransferMeasurement> ms;
  for (std::int64_t blocks : backend::TransferBlockCounts(128)) {
    const Bytes bytes = blocks * 196608;
    ms.push_back({bytes, {time(double(bytes)), time(double(bytes))}, false});
  }
  return ms;
}

// Decode steps of 1 and 8 rows, prefills of 64, 256 and 1,024 tokens, each after each.
ShapePairFit SampleAfterStep() {
  return {{1, 8},
          {64, 256, 1024},
          {{0, 0.0001, 0.0005, 0.0006, 0.0067},
           {0, 0, 0, 0, 0.0061},
           {0.0003, 0.0013, 0, 0.0003, 0.0053},
           {0.0036, 0.0085, 0.0073, 0, 0.0118},
           {0.002, 0.003, 0.004, 0.005, 0}},
          3,
          {}};
}

StepProfile SampleProfile() {
  const StepFit truth = KernelChangeAt12();
  StepProfile p;
  p.device = "cpu";
  p.source = {{"tool", "test"}};
  p.model = Model("tiny-test");
  p.measurements = Measure(FittedCostModel(truth));
  for (StepMeasurement& m : p.measurements) m.seconds = {m.seconds[0], 1.1 * m.seconds[0]};
  Result<StepFit> fit = FitSteps(p.measurements, 1);
  EXPECT_TRUE(fit.ok());
  EXPECT_EQ(fit->split_rows[kDecode], 12);  // the round trip carries a split
  p.fits = {*fit};
  Result<LinkFit> link = FitLink(Transfers([](double b) { return 2e-5 + b / 12e9; }));
  EXPECT_TRUE(link.ok());
  link->transport = "loopback";
  link->path = "loopback";
  p.links = {*link};
  HostFit host;
  host.seconds_per = {2e-5, 3e-6, 1e-6, 4e-5, 0};
  host.steps = 400;
  host.held_out = {100, 12.5, 30, 80};
  host.held_out_total_pct = -1.5;
  host.wake_s = 2.5e-4;
  host.wakes = 37;
  p.host = host;
  p.frontend = FrontendFit{3e-5, 2e-8, 1200, {6, 1.5, 2, 3}};
  p.after_idle = AfterIdleFit{{0.01, 0.1, 1}, {0.002, 0.01, 0.02}, {0.001, 0.002, 0.008}, 3};
  p.after_step = SampleAfterStep();
  p.beside = SampleAfterStep();
  p.beside->extra_s[0][0] = 0.0009;  // beside its own shape on another instance
  p.beside->alone_s = {0.009, 0.012, 0.05, 0.2, 0.9};
  return p;
}

TEST(StepProfileTest, ProfilesSurviveTheRoundTrip) {
  const StepProfile p = SampleProfile();
  const json doc = StepProfileToJson(p);
  const std::string file = FormatStepProfile(p);
  EXPECT_EQ(json::parse(file), doc);
  // One line per measurement.
  std::size_t lines = 0;
  for (std::size_t at = file.find("\n  {\"decode_context_tokens\""); at != std::string::npos;
       at = file.find("\n  {\"decode_context_tokens\"", at + 1))
    ++lines;
  EXPECT_EQ(lines, p.measurements.size());
  std::size_t transfer_lines = 0;
  for (std::size_t at = file.find("\n    {\"bytes\""); at != std::string::npos;
       at = file.find("\n    {\"bytes\"", at + 1))
    ++transfer_lines;
  EXPECT_EQ(transfer_lines, p.links[0].measurements.size());
  Result<StepProfile> back = ParseStepProfile(json::parse(file), "p.json");
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(StepProfileToJson(*back), doc);
  ASSERT_NE(back->FitFor(1), nullptr);
  EXPECT_GT(back->FitFor(1)->extrapolation[kDecode].shapes, 0);
  EXPECT_EQ(back->FitFor(2), nullptr);
  EXPECT_EQ(back->measurements.size(), p.measurements.size());
  EXPECT_DOUBLE_EQ(back->measurements[3].Median(), 1.05 * p.measurements[3].seconds[0]);
  ASSERT_NE(back->LinkFor("loopback"), nullptr);
  EXPECT_EQ(back->LinkFor("ucx"), nullptr);
  EXPECT_NEAR(back->LinkFor("loopback")->Time(1 << 20), 2e-5 + (1 << 20) / 12e9, 1e-12);
  ASSERT_TRUE(back->host);
  EXPECT_EQ(back->host->seconds_per, p.host->seconds_per);
  EXPECT_EQ(back->host->wake_s, 2.5e-4);
  EXPECT_EQ(back->host->wakes, 37);
  EXPECT_DOUBLE_EQ(back->host->Predict({8, 1, 2, 8}), 2e-5 + 8 * 3e-6 + 1e-6 + 2 * 4e-5);
  ASSERT_TRUE(back->frontend);
  EXPECT_DOUBLE_EQ(back->frontend->Predict(1000), 3e-5 + 1000 * 2e-8);
  EXPECT_EQ(back->frontend->requests, 1200);
  ASSERT_TRUE(back->after_idle);
  EXPECT_EQ(back->after_idle->decode_s, p.after_idle->decode_s);
  EXPECT_EQ(back->after_idle->repeats, 3);
  ASSERT_TRUE(back->after_step);
  EXPECT_EQ(back->after_step->extra_s, p.after_step->extra_s);
  EXPECT_EQ(back->after_step->prefill_tokens, p.after_step->prefill_tokens);
  ASSERT_TRUE(back->beside);
  EXPECT_EQ(back->beside->extra_s, p.beside->extra_s);
  EXPECT_EQ(back->beside->alone_s, p.beside->alone_s);
  EXPECT_TRUE(back->after_step->alone_s.empty());
  EXPECT_FALSE(ArchitectureMismatch(back->model, Model("tiny-test")));
  EXPECT_EQ(ArchitectureMismatch(back->model, Model("llama-3.2-1b")).value_or(""),
            "num_hidden_layers: 2 vs 16");
  // Shapes alike but experts, latent attention or fp8 weights apart: still another model.
  ModelSpec fewer_experts = Model("qwen3-30b-a3b");
  fewer_experts.moe->experts_per_token = 4;
  EXPECT_EQ(ArchitectureMismatch(Model("qwen3-30b-a3b"), fewer_experts)
                .value_or("")
                .rfind("active parameters: ", 0),
            0u);
  ModelSpec bf16 = Model("deepseek-v3");
  bf16.fp8.reset();
  EXPECT_EQ(
      ArchitectureMismatch(Model("deepseek-v3"), bf16).value_or("").rfind("weight bytes: ", 0), 0u);
  EXPECT_FALSE(ArchitectureMismatch(Model("deepseek-v3"), Model("deepseek-v3")));
}

TEST(StepProfileTest, MalformedProfilesAreErrorsNamingTheField) {
  const json good = StepProfileToJson(SampleProfile());
  struct Case {
    std::function<void(json&)> change;
    const char* expected;
  };
  const Case cases[] = {
      {[](json& j) { j["format"] = "other"; },
       "p.json: field 'format' must be 'duet-step-profile'"},
      {[](json& j) { j["version"] = 2; }, "field 'version'"},
      {[](json& j) { j.erase("model"); }, "field 'model' is missing"},
      {[](json& j) { j["model"]["hidden_size"] = -1; }, "p.json: model"},
      {[](json& j) { j["device"] = ""; }, "field 'device'"},
      {[](json& j) { j["source"] = 3; }, "field 'source' must be an object"},
      {[](json& j) { j["fits"] = json::array(); }, "field 'fits'"},
      {[](json& j) { j["fits"].push_back(j["fits"][0]); }, "fits[1]: a second fit for tp 1"},
      {[](json& j) { j["fits"][0]["tp"] = 0; }, "fits[0]: field 'tp'"},
      {[](json& j) { j["fits"][0]["pieces"] = json::array(); }, "fits[0]: field 'pieces'"},
      {[](json& j) { j["fits"][0]["pieces"].erase("mixed"); },
       "fits[0]: pieces.mixed: must be an array of 1 or 2 pieces"},
      {[](json& j) { j["fits"][0]["pieces"]["warm"] = json::array(); }, "unknown class 'warm'"},
      {[](json& j) { j["fits"][0]["pieces"]["decode"] = json::array(); }, "pieces.decode"},
      {[](json& j) { j["fits"][0]["pieces"]["prefill"][0]["step"] = -1e-3; },
       "pieces.prefill[0]: field 'step'"},
      {[](json& j) { j["fits"][0]["pieces"]["prefill"][0]["step"] = 1e300; },
       "pieces.prefill[0]: field 'step'"},
      {[](json& j) { j["fits"][0]["pieces"]["mixed"][0]["warp"] = 1; }, "unknown column 'warp'"},
      {[](json& j) { j["fits"][0]["split"] = 12; }, "fits[0]: field 'split' must be an object"},
      {[](json& j) { j["fits"][0]["split"]["warm"] = j["fits"][0]["split"]["decode"]; },
       "fits[0]: split: unknown class 'warm'"},
      {[](json& j) { j["fits"][0]["split"]["decode"]["rows"] = 1; },
       "fits[0]: split.decode: field 'rows'"},
      {[](json& j) { j["fits"][0]["split"]["decode"]["rows"] = 1e12; },
       "fits[0]: split.decode: field 'rows'"},
      {[](json& j) { j["fits"][0]["split"]["decode"].erase("pieces"); },
       "split.decode.pieces: must be an array of 1 or 2 pieces"},
      {[](json& j) { j["fits"][0]["split"]["decode"]["pieces"][0]["step"] = -1; },
       "split.decode.pieces[0]: field 'step'"},
      {[](json& j) { j["fits"][0]["held_out_error"]["decode"]["mean_pct"] = "x"; },
       "held_out_error.decode: field 'mean_pct'"},
      {[](json& j) { j["measurements"] = 5; }, "field 'measurements'"},
      {[](json& j) {
         j["measurements"][2]["prefill"] = {{0, 5}};
       },
       "measurements[2]: field 'prefill[0]' must be [tokens, context]"},
      {[](json& j) {
         j["measurements"][2]["prefill"] = {{5, -1}};
       },
       "field 'prefill[0]'"},
      {[](json& j) {
         j["measurements"][2]["prefill"] = {{5, 1, 2}};
       },
       "field 'prefill[0]'"},
      {[](json& j) {
         j["measurements"][2]["prefill"] = {{std::uint64_t(1) << 63, 0}};
       },
       "field 'prefill[0]'"},
      {[](json& j) { j["measurements"][30]["decode_tokens"] = -4; }, "field 'decode_tokens'"},
      {[](json& j) { j["measurements"][2]["tp"] = 65; }, "measurements[2]: field 'tp'"},
      {[](json& j) { j["measurements"][2]["seconds"] = json::array(); }, "field 'seconds'"},
      {[](json& j) {
         j["measurements"][2]["seconds"] = {0.1, 0};
       },
       "field 'seconds'"},
      {[](json& j) { j["measurements"][2]["seconds"] = 1e9; }, "field 'seconds'"},
      {[](json& j) { j["measurements"][2]["seconds"] = 1e-12; }, "field 'seconds'"},
      {[](json& j) { j["measurements"][2]["seconds"] = "fast"; }, "field 'seconds'"},
      {[](json& j) {
         j["measurements"][2]["prefill"] = json::array();
         j["measurements"][2]["decode_tokens"] = 0;
       },
       "measurements[2]: a step with no tokens"},
      {[](json& j) { j["links"] = json::object(); }, "field 'links' must be an array"},
      {[](json& j) { j["links"][0]["transport"] = ""; }, "links[0]: field 'transport'"},
      {[](json& j) { j["links"].push_back(j["links"][0]); },
       "links[1]: a second link for transport 'loopback'"},
      {[](json& j) { j["links"][0]["bandwidth_GBps"] = 0; }, "links[0]: field 'bandwidth_GBps'"},
      {[](json& j) { j["links"][0]["bandwidth_GBps"] = 1e300; },
       "links[0]: field 'bandwidth_GBps'"},
      {[](json& j) { j["links"][0]["latency_us"] = -1; }, "links[0]: field 'latency_us'"},
      {[](json& j) { j["links"][0].erase("latency_us"); }, "links[0]: field 'latency_us'"},
      {[](json& j) { j["links"][0]["measurements"][1]["bytes"] = 0; },
       "links[0]: measurements[1]: field 'bytes'"},
      {[](json& j) { j["links"][0]["measurements"][1]["seconds"] = json::array(); },
       "links[0]: measurements[1]: field 'seconds'"},
      {[](json& j) { j["links"][0]["held_out_error"]["max_pct"] = "x"; },
       "links[0]: held_out_error: field 'max_pct'"},
      {[](json& j) { j["host"] = 1; }, "p.json: host: must be an object"},
      {[](json& j) { j["host"].erase("seconds_per"); }, "host: field 'seconds_per'"},
      {[](json& j) { j["host"]["seconds_per"]["row"] = -1e-6; }, "host: seconds_per: field 'row'"},
      {[](json& j) { j["host"]["seconds_per"].erase("token"); },
       "host: seconds_per: field 'token' is missing"},
      {[](json& j) { j["host"]["steps"] = -1; }, "host: field 'steps'"},
      {[](json& j) { j["host"]["held_out_error"]["mean_pct"] = -1; },
       "host: held_out_error: field 'mean_pct'"},
      {[](json& j) { j["frontend"] = json::array(); }, "p.json: frontend: must be an object"},
      {[](json& j) { j["frontend"]["prompt_token_s"] = -1e-9; },
       "frontend: field 'prompt_token_s'"},
      {[](json& j) { j["frontend"].erase("request_s"); }, "frontend: field 'request_s'"},
      {[](json& j) { j["frontend"]["request_s"] = 1e9; }, "frontend: field 'request_s'"},
      {[](json& j) { j["frontend"]["requests"] = 0.5; }, "frontend: field 'requests'"},
      {[](json& j) { j["frontend"]["training_error"]["max_pct"] = "x"; },
       "frontend: training_error: field 'max_pct'"},
      {[](json& j) { j["after_idle"] = 1; }, "p.json: after_idle: must be an object"},
      {[](json& j) {
         j["after_idle"]["idle_s"] = {0.1, 0.01, 1};
       },
       "after_idle: field 'idle_s' must be ascending"},
      {[](json& j) { j["after_idle"]["idle_s"][0] = 1e-4; },
       "after_idle: field 'idle_s' must hold seconds in [0.001, 3600]"},
      {[](json& j) { j["after_idle"]["decode_s"][1] = -1e-3; },
       "after_idle: field 'decode_s' must hold seconds in [0, 3600]"},
      {[](json& j) { j["after_idle"]["prefill_s"] = json::array(); }, "field 'prefill_s'"},
      {[](json& j) { j["after_idle"]["prefill_s"].push_back(0.03); },
       "after_idle: prefill_s and decode_s must have a time for each of idle_s"},
      {[](json& j) { j["after_idle"].erase("repeats"); }, "after_idle: field 'repeats'"},
      {[](json& j) { j["after_step"] = "x"; }, "p.json: after_step: must be an object"},
      {[](json& j) {
         j["after_step"]["decode_rows"] = {8, 1};
       },
       "after_step: field 'decode_rows' must be ascending"},
      {[](json& j) { j["after_step"]["prefill_tokens"][0] = 0; },
       "after_step: field 'prefill_tokens' must hold whole numbers in [1, "},
      {[](json& j) { j["after_step"]["prefill_tokens"] = json::array(); },
       "after_step: field 'prefill_tokens' must be an array of 1 to 16 sizes"},
      {[](json& j) { j["after_step"]["extra_s"][1][0] = -1e-3; },
       "after_step: field 'extra_s' must be 5 rows of 5 times in [0, 3600]"},
      {[](json& j) { j["after_step"]["extra_s"][2][2] = 1e-3; }, "0 on the diagonal"},
      {[](json& j) { j["after_step"]["extra_s"][4].erase(0); }, "field 'extra_s' must be 5 rows"},
      {[](json& j) { j["after_step"]["prefill_tokens"].push_back(4096); },
       "field 'extra_s' must be 6 rows of 6 times"},
      {[](json& j) { j["after_step"].erase("repeats"); }, "after_step: field 'repeats'"},
      {[](json& j) { j["beside"]["extra_s"][0][1] = "x"; },
       "p.json: beside: field 'extra_s' must be 5 rows of 5 times in [0, 3600] (one per shape in "
       "decode_rows, then prefill_tokens)"},
      {[](json& j) { j["beside"].erase("alone_s"); },
       "p.json: beside: field 'alone_s' must be 5 times in [1e-9, 3600] (one per shape in "
       "decode_rows, then prefill_tokens)"},
      {[](json& j) { j["beside"]["alone_s"][4] = 0; }, "beside: field 'alone_s' must be 5 times"},
      {[](json& j) { j["beside"]["alone_s"].erase(0); }, "beside: field 'alone_s' must be 5 times"},
      // A share beyond 100 times the time alone: no machine slows a step so.
      {[](json& j) { j["beside"]["alone_s"][0] = 1e-5; },
       "beside: field 'extra_s' must be at most 100 times the shape's alone_s in each row"},
  };
  for (const Case& c : cases) {
    json doc = good;
    c.change(doc);
    Result<StepProfile> r = ParseStepProfile(doc, "p.json");
    ASSERT_FALSE(r.ok()) << c.expected;
    EXPECT_NE(r.error().find(c.expected), std::string::npos) << r.error();
  }
  EXPECT_FALSE(ParseStepProfile(json::array(), "p.json").ok());
}

TEST(StepProfileTest, MeasurementLinesNameTheirLine) {
  Result<std::vector<StepMeasurement>> ms = ParseStepMeasurements(
      "{\"prefill\": [[128, 0]], \"seconds\": 0.5}\n\n"
      "{\"decode_tokens\": 4, \"decode_context_tokens\": 400, \"seconds\": [0.01, 0.03, 0.02]}\n",
      "m.jsonl");
  ASSERT_TRUE(ms.ok()) << ms.error();
  ASSERT_EQ(ms->size(), 2u);
  EXPECT_EQ((*ms)[1].Median(), 0.02);
  EXPECT_EQ((*ms)[0].shape.prefill[0].tokens, 128);

  auto error = [](const char* text) {
    auto r = ParseStepMeasurements(text, "m.jsonl");
    return r.ok() ? std::string("parsed") : r.error();
  };
  EXPECT_EQ(error("{\"decode_tokens\": 1, \"seconds\": 1}\n{oops\n"),
            "m.jsonl:2: not valid JSON: {oops");
  EXPECT_NE(error("\n\n{\"decode_tokens\": 1}\n").find("m.jsonl:3: field 'seconds' is missing"),
            std::string::npos);
}

TEST(LinkFitTest, LatencyAndBandwidthAreRecoveredExactly) {
  Result<LinkFit> link = FitLink(Transfers([](double b) { return 2e-5 + b / 12e9; }));
  ASSERT_TRUE(link.ok()) << link.error();
  EXPECT_NEAR(link->latency, 2e-5, 1e-12);
  EXPECT_NEAR(link->bandwidth / 12e9, 1, 1e-9);
  EXPECT_LT(link->held_out.max_pct, 1e-6);
  // One in four sizes held out, never the smallest or the largest (no extrapolation).
  ASSERT_EQ(link->measurements.size(), 14u);
  EXPECT_EQ(link->held_out.shapes, 3);
  EXPECT_EQ(link->training.shapes, 11);
  EXPECT_FALSE(link->measurements.front().held_out);
  EXPECT_FALSE(link->measurements.back().held_out);
  EXPECT_TRUE(link->measurements[3].held_out);
}

TEST(LinkFitTest, RelativeErrorIsWhatTheFitMinimises) {
  // The smallest transfers take twice the line's time: a fit of absolute error would follow
  // the large transfers and miss the small ones by half; in relative terms no size may be off
  // by more than the doubling splits between them.
  auto time = [](double b) { return (b < 1e6 ? 2 : 1) * (1e-6 + b / 10e9); };
  Result<LinkFit> link = FitLink(Transfers(time));
  ASSERT_TRUE(link.ok()) << link.error();
  for (const TransferMeasurement& m : link->measurements) {
    EXPECT_LT(std::abs(link->Time(m.bytes) / m.Median() - 1), 0.5) << m.bytes;
  }
  // A line that crosses below the origin: no latency, the bandwidth alone.
  link = FitLink(Transfers([](double b) { return b / 10e9 - 2e-6; }));
  ASSERT_TRUE(link.ok()) << link.error();
  EXPECT_EQ(link->latency, 0);
  EXPECT_LT(link->training.max_pct, 11);
}

TEST(LinkFitTest, TooFewSizesOrFlatTimesAreErrors) {
  std::vector<TransferMeasurement> ms = Transfers([](double b) { return b / 1e10; });
  ms.resize(4);
  Result<LinkFit> link = FitLink(ms);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.error().find("at least 5 transfer sizes (got 4)"), std::string::npos)
      << link.error();
  link = FitLink(Transfers([](double) { return 1e-3; }));
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.error().find("do not grow with size"), std::string::npos) << link.error();
}

TEST(FrontendFitTest, ALineIsRecoveredAndItsCoefficientsStayNonNegative) {
  std::vector<FrontendSample> samples;
  for (Tokens n : {1, 4, 16, 64, 256, 1024, 3000})
    samples.push_back({n, {9e-6 + 3e-8 * n, 10e-6 + 3e-8 * n, 11e-6 + 3e-8 * n}});
  Result<FrontendFit> fit = FitFrontend(samples);
  ASSERT_TRUE(fit.ok()) << fit.error();
  EXPECT_NEAR(fit->request_s, 10e-6, 1e-12);
  EXPECT_NEAR(fit->prompt_token_s, 3e-8, 1e-14);
  EXPECT_EQ(fit->requests, 21);
  EXPECT_EQ(fit->training.shapes, 7);
  EXPECT_LT(fit->training.max_pct, 1e-6);
  // Times that fall with the prompt (noise): a constant, not a negative cost a token.
  samples = {{1, {2e-5}}, {100, {1.5e-5}}, {1000, {1e-5}}};
  fit = FitFrontend(samples);
  ASSERT_TRUE(fit.ok()) << fit.error();
  EXPECT_EQ(fit->prompt_token_s, 0);
  EXPECT_GT(fit->request_s, 1e-5);
  EXPECT_LT(fit->request_s, 2e-5);
  // One length is no line.
  fit = FitFrontend({{16, {1e-5}}});
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("at least 2 prompt lengths"), std::string::npos) << fit.error();
}

// Iterations like a server's: batches of 1 to 32 rows, some admitting or finishing requests.
std::vector<HostSample> HostIterations(const std::function<double(const HostCounts&)>& t) {
  std::vector<HostSample> out;
  for (int i = 0; i < 200; ++i) {
    HostCounts c;
    c.rows = 1 + (i * 7) % 32;
    c.admitted = i % 5 == 0 ? 1 + i % 3 : 0;
    c.finished = i % 4 == 1 ? 1 : 0;
    c.tokens = c.rows - (i % 6 == 0 ? 1 : 0);
    out.push_back({c, t(c)});
  }
  return out;
}

TEST(HostFitTest, CoefficientsAreRecoveredAndTheHeldOutTotalIsMeasured) {
  auto truth = [](const HostCounts& c) {
    return 20e-6 + 3e-6 * c.rows + 15e-6 * c.admitted + 40e-6 * c.finished + 1e-6 * c.tokens;
  };
  Result<HostFit> fit = FitHost(HostIterations(truth));
  ASSERT_TRUE(fit.ok()) << fit.error();
  const std::array<double, kHostColumns> want = {20e-6, 3e-6, 15e-6, 40e-6, 1e-6};
  for (std::size_t c = 0; c < kHostColumns; ++c)
    EXPECT_NEAR(fit->seconds_per[c], want[c], 1e-12) << kHostColumnNames[c];
  EXPECT_EQ(fit->steps, 200);
  EXPECT_EQ(fit->held_out.shapes, 50);  // one in four
  EXPECT_LT(fit->held_out.max_pct, 1e-6);
  EXPECT_NEAR(fit->held_out_total_pct, 0, 1e-6);

  // Noise that only the held-out iterations see shows in their error, which the fit never saw:
  // every fourth iteration (the held-out ones among them) twice as slow.
  std::vector<HostSample> noisy = HostIterations(truth);
  for (std::size_t i = 0; i < noisy.size(); ++i) {
    if (HostSample& s = noisy[i]; (i + i / 4) % 4 == 3) s.seconds *= 2;
  }
  fit = FitHost(noisy);
  ASSERT_TRUE(fit.ok()) << fit.error();
  EXPECT_NEAR(fit->held_out_total_pct, -50, 1e-6);
  EXPECT_NEAR(fit->held_out.mean_pct, 50, 1e-6);
  EXPECT_LT(fit->training.max_pct, 1e-6);
}

TEST(HostFitTest, CoefficientsStayNonNegative) {
  // Time that falls with rows: no non-negative fit follows it; the fit is the best without.
  Result<HostFit> fit =
      FitHost(HostIterations([](const HostCounts& c) { return 100e-6 - 2e-6 * c.rows; }));
  ASSERT_TRUE(fit.ok()) << fit.error();
  for (double v : fit->seconds_per) EXPECT_GE(v, 0);
  EXPECT_EQ(fit->seconds_per[1], 0);  // per row
}

TEST(HostFitTest, TooFewOrTimelessIterationsAreErrors) {
  std::vector<HostSample> few = HostIterations([](const HostCounts&) { return 1e-4; });
  few.resize(19);
  Result<HostFit> fit = FitHost(few);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("at least 20 iterations (got 19)"), std::string::npos) << fit.error();
  fit = FitHost(HostIterations([](const HostCounts&) { return 0.0; }));
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.error().find("no time outside their forward passes"), std::string::npos)
      << fit.error();
}

// A step after an idle spell: nothing below kIdleGap, a line from nothing at none to the first
// spell's time, linear in the spell's logarithm between spells, the longest's beyond it; a mixed
// step as a prefill; a fitted cost model adds it to a step of a profile that has it.
TEST(AfterIdleFitTest, InterpolatesInTheSpellsLogarithm) {
  const AfterIdleFit fit{{0.01, 0.1, 1}, {0.002, 0.01, 0.02}, {0.001, 0.002, 0.008}, 3};
  EXPECT_EQ(fit.Extra(ShapeClass::kDecode, 0.0009), 0);
  EXPECT_DOUBLE_EQ(fit.Extra(ShapeClass::kDecode, 0.005), 0.0005);
  EXPECT_DOUBLE_EQ(fit.Extra(ShapeClass::kDecode, 0.1), 0.002);
  EXPECT_NEAR(fit.Extra(ShapeClass::kDecode, std::sqrt(0.1)), 0.005, 1e-12);  // halfway
  EXPECT_NEAR(fit.Extra(ShapeClass::kPrefill, std::sqrt(0.001)), 0.006, 1e-12);
  EXPECT_EQ(fit.Extra(ShapeClass::kMixed, 0.1), fit.Extra(ShapeClass::kPrefill, 0.1));
  EXPECT_EQ(fit.Extra(ShapeClass::kDecode, 3600), 0.008);
  const StepProfile p = SampleProfile();
  const FittedCostModel priced(p.fits[0], std::nullopt, fit), plain(p.fits[0]);
  const StepShape decode{{}, 2, 512}, prefill{{{64, 0}}, 0, 0}, empty{};
  EXPECT_DOUBLE_EQ(priced.AfterIdle(decode, 0.1), 0.002);
  EXPECT_DOUBLE_EQ(priced.AfterIdle(prefill, 1), 0.02);
  EXPECT_EQ(priced.AfterIdle(empty, 1), 0);
  EXPECT_EQ(plain.AfterIdle(decode, 1), 0);
  EXPECT_EQ(priced.StepTime(decode), plain.StepTime(decode));
}

// A step right after another: each stands as the reference shape of its class nearest in the
// logarithm of its rows (decode) or new tokens (a prefill, a mixed step), nothing after itself
// or for an empty step; a fitted cost model adds it to a step of a profile that has it.
TEST(ShapePairFitTest, PricesAStepByTheNearestReferenceShapes) {
  const ShapePairFit fit = SampleAfterStep();
  const StepShape d1{{}, 1, 300}, d3{{}, 3, 900}, d2{{}, 2, 512}, p40{{{40, 0}}, 0, 0},
      p200{{{150, 0}, {50, 100}}, 0, 0}, p5000{{{5000, 0}}, 0, 0}, mixed{{{700, 0}}, 4, 1000},
      empty{};
  EXPECT_EQ(fit.Nearest(d1), 0u);
  EXPECT_EQ(fit.Nearest(d2), 0u);  // 2 rows: nearer 1 than 8 in the logarithm
  EXPECT_EQ(fit.Nearest(d3), 1u);  // 3 rows: nearer 8
  EXPECT_EQ(fit.Nearest(p40), 2u);
  EXPECT_EQ(fit.Nearest(p200), 3u);  // 200 new tokens in two chunks
  EXPECT_EQ(fit.Nearest(p5000), 4u);
  EXPECT_EQ(fit.Nearest(mixed), 4u);  // by its 700 new tokens: nearer 1,024 than 256
  EXPECT_FALSE(fit.Nearest(empty));
  EXPECT_EQ(fit.Extra(d1, p5000), 0.0067);
  EXPECT_EQ(fit.Extra(p200, d3), 0.0085);
  EXPECT_EQ(fit.Extra(d1, d2), 0);  // the same reference shape
  EXPECT_EQ(fit.Extra(empty, p40), 0);
  EXPECT_EQ(fit.Extra(p40, empty), 0);
  const StepProfile p = SampleProfile();
  const FittedCostModel priced(p.fits[0], std::nullopt, std::nullopt, fit), plain(p.fits[0]);
  EXPECT_EQ(priced.AfterStep(p40, mixed), 0.0053);
  EXPECT_EQ(plain.AfterStep(p40, mixed), 0);
  EXPECT_EQ(priced.AfterIdle(p40, 1), 0);
  EXPECT_EQ(priced.StepTime(d1), plain.StepTime(d1));
}

// Beside another instance's step: the same reference shapes, a step beside its own shape
// priced too, each extra as a share of the reference shape's time alone, interpolated between
// the sizes around the step's and its neighbour's in the logarithm of the size (the end one's
// beyond either end), times the step's own price alone; a fitted cost model of a profile that
// has it prices it, one without does not.
TEST(ShapePairFitTest, PricesAStepBesideAnotherInstancesByItsShareBetweenTheSizes) {
  const StepProfile p = SampleProfile();
  const FittedCostModel priced(p.fits[0], std::nullopt, std::nullopt, std::nullopt, p.beside),
      plain(p.fits[0], std::nullopt, std::nullopt, p.after_step);
  const StepShape d1{{}, 1, 300}, d2{{}, 2, 512}, d16{{}, 16, 4096}, p40{{{40, 0}}, 0, 0},
      p512{{{400, 0}, {112, 300}}, 0, 0}, p5000{{{5000, 0}}, 0, 0}, mixed{{{512, 0}}, 4, 1000},
      empty{};
  EXPECT_TRUE(priced.PricesBeside());
  EXPECT_FALSE(plain.PricesBeside());
  // share[i][j]: the reference shapes' (alone 9, 12, 50, 200 and 900 ms).
  const std::vector<Seconds>& alone = p.beside->alone_s;
  auto share = [&](std::size_t i, std::size_t j) { return p.beside->extra_s[i][j] / alone[i]; };
  auto expect = [&](const StepShape& shape, const StepShape& other, double want_share) {
    EXPECT_NEAR(priced.Beside(shape, other), want_share * priced.StepTime(shape), 1e-15)
        << shape.decode_tokens << " " << shape.PrefillTokens();
  };
  expect(d1, d1, share(0, 0));     // on the reference sizes: theirs
  expect(d1, p5000, share(0, 4));  // beyond the largest prefill: its
  expect(d16, p40, share(1, 2));   // and the largest decode and the smallest prefill: theirs
  expect(p5000, d1, share(4, 0));  // 5,000 tokens: 1,024's share of its own time
  // 2 rows: a third of the way from 1 to 8 in the logarithm.
  expect(d2, d1, 2.0 / 3 * share(0, 0) + 1.0 / 3 * share(1, 0));
  expect(d1, d2, 2.0 / 3 * share(0, 0) + 1.0 / 3 * share(0, 1));
  // 512 new tokens in two chunks (and a mixed step by its): halfway from 256 to 1,024.
  expect(p512, d1, 0.5 * share(3, 0) + 0.5 * share(4, 0));
  expect(mixed, d1, 0.5 * share(3, 0) + 0.5 * share(4, 0));
  // Both between sizes: the four around them.
  expect(p512, d2,
         0.5 * (2.0 / 3 * share(3, 0) + 1.0 / 3 * share(3, 1)) +
             0.5 * (2.0 / 3 * share(4, 0) + 1.0 / 3 * share(4, 1)));
  EXPECT_EQ(priced.Beside(empty, d1), 0);
  EXPECT_EQ(priced.Beside(d1, empty), 0);
  EXPECT_EQ(priced.AfterStep(d1, p5000), 0);
  EXPECT_EQ(plain.Beside(d1, p5000), 0);
  // The profile's after_step keeps its diagonal at 0: a step after its own shape is a run.
  json doc = StepProfileToJson(p);
  doc["after_step"]["extra_s"][0][0] = 0.0009;
  EXPECT_FALSE(ParseStepProfile(doc, "p.json").ok());
}

// The medians after each spell made non-decreasing by pooling the adjacent ones that are not,
// each at least 0.
TEST(AfterIdleFitTest, ALongerSpellCostsAtLeastAShorterOne) {
  auto expect = [](const std::vector<Seconds>& medians, const std::vector<Seconds>& want) {
    std::vector<std::vector<Seconds>> extras;  // each median timed once, and around it twice
    for (const Seconds m : medians) extras.push_back({m + 1e-3, m, m - 1e-3});
    const std::vector<Seconds> got = FitAfterIdle(extras);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  };
  expect({0.002, 0.0, 0.009, 0.019}, {0.001, 0.001, 0.009, 0.019});
  expect({0.004, 0.003, 0.002, 0.01}, {0.003, 0.003, 0.003, 0.01});
  expect({-0.001, 0.001, 0.001}, {0, 0.001, 0.001});
  expect({0.001, 0.002}, {0.001, 0.002});
  expect({}, {});
}

// The test model on one CPU thread, with 8 KV blocks, written into `dir`; null (and the test
// failed) where it cannot be made.
std::unique_ptr<backend::ForwardModel> OneThreadTestModel(const backend::TempDir& dir) {
  if (Status s = backend::WriteTestModel(dir.path(), {}); !s.ok()) {
    ADD_FAILURE() << s.message();
    return nullptr;
  }
  auto loaded = backend::LoadModelDir(dir.path());
  if (!loaded.ok()) {
    ADD_FAILURE() << loaded.error();
    return nullptr;
  }
  backend::CpuModelOptions options;
  options.num_blocks = 8;
  options.threads = 1;
  auto cpu = backend::CpuModel::Create(std::move(*loaded), options);
  if (!cpu.ok()) {
    ADD_FAILURE() << cpu.error();
    return nullptr;
  }
  return std::move(*cpu);
}

// What a pass takes after an idle spell beyond its time in a run: here a model that sleeps
// 30 ms before a pass that comes 50 ms or more after the one before it.
TEST(CalibrationSweepTest, APassAfterAnIdleSpellIsTimedAgainstItselfInARun) {
  backend::TempDir dir;
  std::unique_ptr<backend::ForwardModel> cpu = OneThreadTestModel(dir);
  ASSERT_TRUE(cpu);
  std::chrono::steady_clock::time_point last{};
  backend::FaultInjectingModel model(std::move(cpu),
                                     [&](std::int64_t, std::span<const backend::SequenceChunk>) {
                                       const auto now = std::chrono::steady_clock::now();
                                       if (now - last >= std::chrono::milliseconds(50))
                                         std::this_thread::sleep_for(std::chrono::milliseconds(30));
                                       last = std::chrono::steady_clock::now();
                                       return backend::FaultInjectingModel::Fault::kNone;
                                     });
  backend::StepTimer timer(model);
  const std::array<Seconds, 2> spells = {0.01, 0.1};
  const std::vector<Seconds> extra = FitAfterIdle(timer.TimeAfterIdle({{}, 1, 16}, spells, 3));
  ASSERT_EQ(extra.size(), 2u);
  EXPECT_LT(extra[0], 0.01);
  EXPECT_GT(extra[1], 0.025);
  EXPECT_LT(extra[1], 0.06);
}

// What a pass takes right after a pass of another shape beyond its time in a run: here a
// model that sleeps 20 ms before a pass that follows a 16-token prefill of another shape.
TEST(CalibrationSweepTest, APassAfterAnotherShapeIsTimedAgainstItselfInARun) {
  backend::TempDir dir;
  std::unique_ptr<backend::ForwardModel> cpu = OneThreadTestModel(dir);
  ASSERT_TRUE(cpu);
  // A pass's shape as the model sees it: its rows, and whether it prefills 16 tokens.
  std::pair<std::size_t, bool> last{};
  backend::FaultInjectingModel model(
      std::move(cpu), [&](std::int64_t, std::span<const backend::SequenceChunk> batch) {
        const std::pair<std::size_t, bool> now{batch.size(), batch[0].tokens.size() == 16};
        if (last.second && now != last) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        last = now;
        return backend::FaultInjectingModel::Fault::kNone;
      });
  backend::StepTimer timer(model);
  const std::vector<StepShape> shapes = {{{}, 1, 16}, {{}, 2, 32}, {{{16, 0}}, 0, 0}};
  const auto extra = timer.TimeAfterSteps(shapes, 3);
  ASSERT_EQ(extra.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(extra[i].size(), 3u);
    for (std::size_t j = 0; j < 3; ++j) {
      ASSERT_EQ(extra[i][j].size(), i == j ? 0u : 3u) << i << " " << j;
      if (i == j) continue;
      const Seconds median = MedianOf(extra[i][j]);
      if (j == 2) {
        EXPECT_GT(median, 0.015) << i;
        EXPECT_LT(median, 0.05) << i;
      } else {
        EXPECT_LT(median, 0.01) << i << " " << j;
      }
    }
  }
}

// A shape timed in a run of its kind: an untimed pass of the same shape, then the timed one, so
// that the time is not the previous shape's aftermath. Here the first of each pair sleeps
// 200 ms before the model runs: the times returned are the second passes'.
TEST(CalibrationSweepTest, AShapeIsTimedRightAfterAnUntimedPassOfItself) {
  backend::TempDir dir;
  std::unique_ptr<backend::ForwardModel> cpu = OneThreadTestModel(dir);
  ASSERT_TRUE(cpu);
  std::vector<std::size_t> rows;  // each pass's chunks, in order
  backend::FaultInjectingModel model(
      std::move(cpu), [&](std::int64_t pass, std::span<const backend::SequenceChunk> batch) {
        rows.push_back(batch.size());
        if (pass % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return backend::FaultInjectingModel::Fault::kNone;
      });
  backend::StepTimer timer(model);
  const StepShape prefill{{{32, 0}}, 0, 0}, decode{{}, 3, 3 * 16};
  for (const StepShape* s : {&prefill, &decode, &prefill})
    EXPECT_LT(timer.TimeInARun(*s), 0.1) << "the untimed pass was timed";
  EXPECT_EQ(rows, (std::vector<std::size_t>{1, 1, 3, 3, 1, 1}));
}

TEST(CalibrationSweepTest, TransferSizesArePowersOfTwoAndHalfwayUpToTheLargest) {
  EXPECT_EQ(backend::TransferBlockCounts(128),
            (std::vector<std::int64_t>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}));
  EXPECT_EQ(backend::TransferBlockCounts(6), (std::vector<std::int64_t>{1, 2, 3, 4, 6}));
  EXPECT_EQ(backend::TransferBlockCounts(5), (std::vector<std::int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(backend::TransferBlockCounts(1), (std::vector<std::int64_t>{1}));
}

// What the fit holds out of duet calibrate's sweep spans it: decode shapes at every batch size
// band and every context (holding out every 4th of a sweep with 4 contexts per batch held out the
// longest context only), and the batches around the CPU's kernel change are measured.
TEST(CalibrationSweepTest, HeldOutShapesSpanTheSweep) {
  backend::SweepLimits limits;
  limits.positions = 8192;
  std::vector<StepMeasurement> ms;
  for (const StepShape& s : backend::CalibrationShapes(limits)) ms.push_back({s, {1e-3}, false});
  ASSERT_TRUE(FitSteps(ms, 1).ok());
  std::set<Tokens> batches, contexts, held_contexts;
  for (const StepMeasurement& m : ms) {
    if (ClassOf(FeaturesOf(m.shape)) != ShapeClass::kDecode) continue;
    batches.insert(m.shape.decode_tokens);
    const Tokens context = m.shape.decode_context_tokens / m.shape.decode_tokens;
    contexts.insert(context);
    if (m.held_out) held_contexts.insert(context);
  }
  // Every row count up to 16 (kernels run some faster than their neighbours), then the ladder.
  std::set<Tokens> want = {24, 32};
  for (Tokens rows = 1; rows <= 16; ++rows) want.insert(rows);
  EXPECT_EQ(batches, want);
  EXPECT_EQ(contexts.size(), 4u);
  EXPECT_EQ(held_contexts, contexts);
}

TEST(CalibrationSweepTest, CoversEveryClassWithinTheModelsPositions) {
  for (Tokens positions : {Tokens{256}, Tokens{8192}}) {
    backend::SweepLimits limits;
    limits.positions = positions;
    limits.max_tokens = std::min<Tokens>(1024, positions / 4);
    limits.max_context = std::min<Tokens>(2048, positions / 2);
    const std::vector<StepShape> shapes = backend::CalibrationShapes(limits);
    std::array<int, kShapeClasses> per_class{};
    std::set<std::string> seen;
    Tokens largest_chunk = 0, largest_batch = 0;
    for (const StepShape& s : shapes) {
      EXPECT_TRUE(seen.insert(StepShapeToJson(s).dump()).second) << "twice: " << StepShapeToJson(s);
      ++per_class[static_cast<std::size_t>(ClassOf(FeaturesOf(s)))];
      for (const PrefillChunk& c : s.prefill) {
        EXPECT_LE(c.context + c.tokens, positions);
        largest_chunk = std::max(largest_chunk, c.tokens);
      }
      if (s.decode_tokens > 0) {
        EXPECT_LE(s.decode_context_tokens / s.decode_tokens + 1, positions);
      }
      largest_batch = std::max(largest_batch, s.decode_tokens);
    }
    // Enough of every class to hold some out and fit the rest.
    for (int n : per_class) EXPECT_GE(n, 8) << positions;
    EXPECT_EQ(largest_chunk, limits.max_tokens);
    EXPECT_EQ(largest_batch, limits.max_batch);
  }
  StepShape s;
  s.prefill = {{10, 20}, {16, 0}};
  s.decode_tokens = 3;
  s.decode_context_tokens = 3 * 40;
  EXPECT_EQ(backend::BlocksFor(s, 16), 2 + 1 + 3 * 3);  // 30 -> 2, 16 -> 1, 3 x 41 -> 3 each
}

// A trace's prompt lengths and decode contexts add the shapes the engine runs for them, after the
// ladders, which stay as they were (and so does every profile calibrated without a trace).
TEST(CalibrationSweepTest, ATracesLengthsAddItsOwnShapesAfterTheLadders) {
  backend::SweepLimits limits;
  limits.positions = 8192;
  limits.max_tokens = 1024;
  limits.max_context = 3072;
  limits.max_batch = 16;
  const std::vector<StepShape> ladders = backend::CalibrationShapes(limits);
  limits.trace_prompts = {700, 2724};
  limits.trace_contexts = {1500};
  const std::vector<StepShape> traced = backend::CalibrationShapes(limits);
  ASSERT_GT(traced.size(), ladders.size());
  for (std::size_t i = 0; i < ladders.size(); ++i)
    EXPECT_EQ(StepShapeToJson(traced[i]), StepShapeToJson(ladders[i])) << i;
  std::set<std::string> added;
  for (std::size_t i = ladders.size(); i < traced.size(); ++i)
    added.insert(StepShapeToJson(traced[i]).dump());
  // 700 tokens: one chunk. 2,724: chunks of 1,024, 1,024 and 676 after 2,048 cached.
  // Context 1,500: decode batches of 1, 4 and 16 rows.
  std::set<std::string> expected;
  for (const StepShape& e : std::vector<StepShape>{{{{700, 0}}, 0, 0, 1},
                                                   {{{676, 2048}}, 0, 0, 1},
                                                   {{}, 1, 1500, 1},
                                                   {{}, 4, 4 * 1500, 1},
                                                   {{}, 16, 16 * 1500, 1}})
    expected.insert(StepShapeToJson(e).dump());
  // A first chunk of 1,024 is already on the ladder: timed once.
  EXPECT_EQ(added, expected);
}

}  // namespace
}  // namespace duet::models
