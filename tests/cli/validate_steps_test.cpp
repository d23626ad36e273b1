// `duet validate`'s step attribution (cli/validate_steps.h) from step logs written here by hand:
// the live steps split by whether another instance's iterations ran beside theirs, and their
// passes' time on a core; and the profile priced at the machine's speed per kind of step, with
// the reference shapes that read it.
#include "cli/validate_steps.h"

#include <gtest/gtest.h>

#include <string>

#include "cli/validate_report.h"
#include "policies/step_log.h"
#include "tests/sim/e2e_util.h"

namespace duet::cli {
namespace {

using nlohmann::json;

// A step of `instance` from `start_s` for `iteration_s`, its forward pass half of it: a prefill
// chunk of 100 tokens (rows 0) or `rows` decode rows at 200 tokens of context each.
policies::StepLogLine Step(int instance, Seconds start_s, Seconds iteration_s, int rows) {
  policies::StepLogLine line;
  line.instance = instance;
  line.start_s = start_s;
  line.iteration_s = iteration_s;
  if (rows == 0) line.step.shape.prefill.push_back({100, 0});
  line.step.shape.decode_tokens = rows;
  line.step.shape.decode_context_tokens = 200 * rows;
  line.step.seconds = iteration_s / 2;
  return line;
}

// `lines` as one run's step log (in `tmp`), attributed.
Result<json> AttributeLines(const std::vector<policies::StepLogLine>& lines,
                            const sim::ClusterSpec& cluster, e2e::TempDir& tmp) {
  std::string text;
  for (const policies::StepLogLine& line : lines) text += policies::FormatStepLogLine(line);
  const std::string log = tmp.File("steps.jsonl");
  e2e::WriteFile(log, text);
  return AttributeSteps({log}, cluster, json::object());
}

TEST(ValidateStepsTest, SplitsTheLiveStepsByWhetherAnotherInstancesRanBeside) {
  auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // Run 1, written out of order as two processes append to one log. The prefill instance (0)
  // runs [0, 10] and [16, 26] ms; the decode instance (1) [2, 6] (4 rows: all of it beside
  // prefill), [6, 16] (1 row: 4 of its 10 ms beside, so alone) and [30, 34] (4 rows, alone). The
  // first prefill step has 8 of its 10 ms beside decode steps, the second none.
  const std::vector<policies::StepLogLine> run1 = {
      Step(1, 0.002, 0.004, 4), Step(0, 0, 0.010, 0), Step(1, 0.006, 0.010, 1),
      Step(0, 0.016, 0.010, 0), Step(1, 0.030, 0.004, 4)};
  // Run 2 has only a decode step, [2, 6] ms on its own clock: alone, though run 1's first
  // prefill step ran over the same times on its.
  const std::vector<policies::StepLogLine> run2 = {Step(1, 0.002, 0.004, 1)};
  e2e::TempDir tmp;
  std::vector<std::string> logs;
  for (const auto* run : {&run1, &run2}) {
    std::string text;
    for (const policies::StepLogLine& line : *run) text += policies::FormatStepLogLine(line);
    logs.push_back(tmp.File("steps-" + std::to_string(logs.size()) + ".jsonl"));
    e2e::WriteFile(logs.back(), text);
  }
  auto steps = AttributeSteps(logs, *cluster, json::object());
  ASSERT_TRUE(steps.ok()) << steps.error();
  const json& split = (*steps)["beside_other_instances"];
  // Each part's forward passes and their price, recomputed from the lines it should hold.
  auto expect = [&](const json& part, const std::vector<policies::StepLogLine>& lines) {
    double forward_s = 0, priced_s = 0;
    for (const policies::StepLogLine& l : lines) {
      forward_s += l.step.seconds;
      priced_s += sim::MakeStepCostModel(*cluster, static_cast<std::size_t>(l.instance))
                      ->StepTime(l.step.shape);
    }
    EXPECT_EQ(part["steps"].get<std::size_t>(), lines.size()) << part;
    EXPECT_NEAR(part["forward_s"].get<double>(), forward_s, 1e-12) << part;
    EXPECT_NEAR(part["error_pct"].get<double>(), 100 * (priced_s / forward_s - 1), 1e-9) << part;
  };
  expect(split["prefill"]["alone"], {run1[3]});
  expect(split["prefill"]["beside"], {run1[1]});
  EXPECT_NEAR(split["prefill"]["beside"]["overlap_share"].get<double>(), 0.8, 1e-9);
  expect(split["decode"]["alone"], {run1[2], run1[4], run2[0]});
  expect(split["decode"]["beside"], {run1[0]});
  EXPECT_NEAR(split["decode"]["beside"]["overlap_share"].get<double>(), 1, 1e-9);
  // By batch rows: the 1-row steps all ran alone; of the 4-row ones, one each way.
  const json& bands = (*steps)["decode_by_rows"];
  ASSERT_EQ(bands.size(), 2u) << bands;
  expect(bands[0]["alone"], {run1[2], run2[0]});
  EXPECT_EQ(bands[0]["beside"]["steps"], 0);
  EXPECT_TRUE(bands[0]["beside"]["error_pct"].is_null()) << "no steps, no error";
  expect(bands[1]["alone"], {run1[4]});
  expect(bands[1]["beside"], {run1[0]});
  const std::string text = BesideOthersText(*steps);
  EXPECT_NE(text.find("decode alone " + PercentText(split["decode"]["alone"]["error_pct"]) +
                      " (3 steps), beside " + PercentText(split["decode"]["beside"]["error_pct"]) +
                      " (1 steps, 100% of their iterations overlapped)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("decode by batch rows, alone / beside: 1 " +
                      PercentText(bands[0]["alone"]["error_pct"]) + " / n/a, 4-7 "),
            std::string::npos)
      << text;
}

// With a profile that prices a step beside another instance's on its node, each live step is
// priced with it in proportion to the overlap of their iterations, as the simulator prices it;
// the same instances on two nodes are not.
TEST(ValidateStepsTest, PricesTheLiveStepsBesideTheirNodesOtherInstances) {
  auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // 1 ms a step; a decode step 4 ms slower all its length beside a prefill, a prefill 2 ms beside
  // a decode step, nothing for a decode step beside another (the reference shapes: decode 1 row,
  // prefill 64 tokens).
  models::StepProfile profile;
  profile.fits.emplace_back();
  for (auto& pieces : profile.fits[0].pieces) pieces = {models::AffinePiece{{1e-3}}};
  profile.beside = models::ShapePairFit{{1}, {64}, {{0, 0.004}, {0.002, 0}}, 1, {1e-3, 1e-3}};
  cluster->cost_model.profile = std::make_shared<const models::StepProfile>(profile);
  // As in the split above: the prefill instance (0) [0, 10] and [16, 26] ms; the decode
  // instance (1) [2, 6], [6, 16] and [30, 34].
  const std::vector<policies::StepLogLine> lines = {
      Step(1, 0.002, 0.004, 4), Step(0, 0, 0.010, 0), Step(1, 0.006, 0.010, 1),
      Step(0, 0.016, 0.010, 0), Step(1, 0.030, 0.004, 4)};
  e2e::TempDir tmp;
  // Apart, on the two nodes of the file: nothing beside.
  auto apart = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(apart.ok()) << apart.error();
  EXPECT_FALSE(apart->contains("beside_s")) << *apart;
  // On one node, at alone / (alone + full) of its pace beside the other (1 ms alone): the first
  // prefill 8 of its 10 ms beside decode steps (8 * 2/3 ms, capped at the 2 ms it takes beside
  // them all its length), the second none; the decode steps all 4 ms of the first and 4 of the
  // second's 10 ms (4 * 4/5 ms each), none of the last.
  cluster->placements[1].node = 0;
  auto together = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(together.ok()) << together.error();
  const json& classes = (*together)["classes"];
  const double prefill = 0.002, decode = 2 * 0.004 * 0.004 / 0.005;
  EXPECT_NEAR(classes["prefill"]["beside_s"].get<double>(), prefill, 1e-12) << classes;
  EXPECT_NEAR(classes["prefill"]["priced_s"].get<double>(), 2e-3 + prefill, 1e-12);
  EXPECT_NEAR(classes["decode"]["beside_s"].get<double>(), decode, 1e-12) << classes;
  EXPECT_NEAR((*together)["beside_s"].get<double>(), prefill + decode, 1e-12);
  EXPECT_NEAR(AddedBeyondShape(*together), prefill + decode, 1e-12);
  // A step priced 1 ms with 2 ms of overlap: 2 * 2/3 ms, under the cap.
  const std::vector<policies::StepLogLine> short_overlap = {Step(0, 0, 0.010, 0),
                                                            Step(1, 0.009, 0.004, 1)};
  auto partly = AttributeLines(short_overlap, *cluster, tmp);
  ASSERT_TRUE(partly.ok()) << partly.error();
  EXPECT_NEAR((*partly)["classes"]["prefill"]["beside_s"].get<double>(), 0.001 * 2 / 3, 1e-12);
  EXPECT_NEAR((*partly)["classes"]["decode"]["beside_s"].get<double>(), 0.001 * 4 / 5, 1e-12);
}

TEST(ValidateStepsTest, OneInstanceHasNoSplit) {
  // The 1P1D test cluster with one colocated instance in its place.
  json doc = e2e::ReadJson(std::string(DUET_SOURCE_DIR) + "/tests/data/1p1d-tiny.json");
  doc["instances"] = json::parse(R"([{"role": "colocated", "count": 1, "tp": 1, "node": 0}])");
  auto cluster = sim::ParseClusterSpec(doc, "one-instance.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  e2e::TempDir tmp;
  const std::string log = tmp.File("steps.jsonl");
  e2e::WriteFile(log, policies::FormatStepLogLine(Step(0, 0, 0.01, 2)));
  auto steps = AttributeSteps({log}, *cluster, json::object());
  ASSERT_TRUE(steps.ok()) << steps.error();
  EXPECT_FALSE(steps->contains("beside_other_instances")) << *steps;
  EXPECT_FALSE((*steps)["decode_by_rows"][0].contains("beside")) << *steps;
  EXPECT_EQ(BesideOthersText(*steps), "");
}

// A class's error against its median step's: ten one-row decode steps of one shape, nine at one
// time and one at three times it, have the median step's error and a tail of 20% (12 times the
// time where the median step's speed gives 10); the same steps all 10% slower than another shape
// have no tail.
TEST(ValidateStepsTest, TellsATailOfSlowStepsFromAShiftOfAll) {
  auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  e2e::TempDir tmp;
  auto attribute = [&](const std::vector<Seconds>& seconds) {
    std::string text;
    for (std::size_t i = 0; i < seconds.size(); ++i) {
      policies::StepLogLine line = Step(1, 0.1 * static_cast<double>(i), 0.05, 1);
      line.step.seconds = seconds[i];
      text += policies::FormatStepLogLine(line);
    }
    const std::string log = tmp.File("steps.jsonl");
    e2e::WriteFile(log, text);
    auto steps = AttributeSteps({log}, *cluster, json::object());
    EXPECT_TRUE(steps.ok()) << steps.error();
    return steps.ok() ? (*steps)["classes"]["decode"] : json();
  };
  const Seconds priced =
      sim::MakeStepCostModel(*cluster, 1)->StepTime(Step(1, 0, 0.05, 1).step.shape);
  std::vector<Seconds> seconds(10, 0.01);
  seconds[4] = 0.03;
  const json tail = attribute(seconds);
  EXPECT_NEAR(tail["median_step_error_pct"].get<double>(), 100 * (priced / 0.01 - 1), 1e-9);
  EXPECT_NEAR(tail["error_pct"].get<double>(), 100 * (10 * priced / 0.12 - 1), 1e-9);
  EXPECT_NEAR(tail["tail_pct"].get<double>(), 20, 1e-9) << tail;
  const json shift = attribute(std::vector<Seconds>(10, 0.011));
  EXPECT_NEAR(shift["error_pct"].get<double>(), 100 * (priced / 0.011 - 1), 1e-9);
  EXPECT_NEAR(shift["tail_pct"].get<double>(), 0, 1e-9) << shift;
}

// Each class's steps by what their instance ran just before them: an idle spell (a gap of
// kIdleGap or more since its previous iteration ended, or none before it in the run) or a step
// of a class; and prefill steps by their new tokens.
TEST(ValidateStepsTest, SplitsEachClassByWhatItsInstanceRanBefore) {
  auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // Instance 0 prefills [0, 10], [10.5, 20.5] (0.5 ms after the first: busy) and [30, 40] ms
  // (9.5 ms after: idle); instance 1 decodes [2, 6], [6, 16] and [30, 34], and prefills 300
  // tokens [34.2, 40]. The instances' lines interleave, as two processes append to one log.
  std::vector<policies::StepLogLine> lines = {Step(0, 0, 0.010, 0),      Step(1, 0.002, 0.004, 4),
                                              Step(1, 0.006, 0.010, 1),  Step(0, 0.0105, 0.010, 0),
                                              Step(0, 0.030, 0.010, 0),  Step(1, 0.030, 0.004, 2),
                                              Step(1, 0.0342, 0.0058, 0)};
  lines[6].step.shape.prefill = {{300, 0}};
  e2e::TempDir tmp;
  auto steps = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(steps.ok()) << steps.error();
  auto expect = [&](const json& part, const std::vector<std::size_t>& which) {
    double forward_s = 0, priced_s = 0;
    for (std::size_t i : which) {
      forward_s += lines[i].step.seconds;
      priced_s += sim::MakeStepCostModel(*cluster, static_cast<std::size_t>(lines[i].instance))
                      ->StepTime(lines[i].step.shape);
    }
    EXPECT_EQ(part["steps"].get<std::size_t>(), which.size()) << part;
    EXPECT_NEAR(part["forward_s"].get<double>(), forward_s, 1e-12) << part;
    EXPECT_NEAR(part["error_pct"].get<double>(), 100 * (priced_s / forward_s - 1), 1e-9) << part;
  };
  const json& prefill = (*steps)["classes"]["prefill"]["after"];
  const json& decode = (*steps)["classes"]["decode"]["after"];
  EXPECT_EQ(prefill.size(), 3u) << prefill;
  expect(prefill["idle"], {0, 4});
  expect(prefill["prefill"], {3});
  expect(prefill["decode"], {6});
  EXPECT_EQ(decode.size(), 2u) << decode;
  expect(decode["idle"], {1, 5});
  expect(decode["decode"], {2});
  EXPECT_TRUE((*steps)["classes"]["mixed"]["after"].empty());
  // Prefill by new tokens: 100 (64-127) four times, 300 (256-511) once.
  const json& bands = (*steps)["prefill_by_tokens"];
  ASSERT_EQ(bands.size(), 2u) << bands;
  EXPECT_EQ(bands[0]["tokens_from"], 64);
  EXPECT_EQ(bands[0]["tokens_to"], 127);
  expect(bands[0], {0, 3, 4});
  EXPECT_EQ(bands[1]["tokens_from"], 256);
  expect(bands[1], {6});
  const std::string words = AfterText(*steps);
  EXPECT_NE(words.find("decode after decode " + PercentText(decode["decode"]["error_pct"]) +
                       " (1 steps), after idle " + PercentText(decode["idle"]["error_pct"]) +
                       " (2 steps)"),
            std::string::npos)
      << words;
  EXPECT_NE(words.find("; prefill after decode"), std::string::npos) << words;

  // A profile that prices a step after an idle spell (1 ms a step, and an extra from nothing at
  // none to 1 ms after 10 ms and 10 ms after 1 s of decode): the steps after an idle spell of
  // their instance, since its last step ended or the run's clock began, are priced with it.
  models::StepProfile profile;
  profile.fits.emplace_back();
  for (auto& pieces : profile.fits[0].pieces) pieces = {models::AffinePiece{{1e-3}}};
  profile.after_idle = models::AfterIdleFit{{0.01, 1}, {0.002, 0.02}, {0.001, 0.01}, 1};
  cluster->cost_model.profile = std::make_shared<const models::StepProfile>(profile);
  steps = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(steps.ok()) << steps.error();
  const json& idle = (*steps)["classes"]["decode"]["after"]["idle"];
  // Lines 1 (2 ms after the clock began) and 5 (14 ms after line 2 ended).
  const double priced = 2e-3 + profile.after_idle->Extra(models::ShapeClass::kDecode, 0.002) +
                        profile.after_idle->Extra(models::ShapeClass::kDecode, 0.014);
  EXPECT_NEAR(idle["priced_s"].get<double>(), priced, 1e-12) << idle;
  EXPECT_NEAR(idle["after_idle_s"].get<double>(), priced - 2e-3, 1e-12) << idle;
  EXPECT_NEAR((*steps)["classes"]["decode"]["after"]["decode"]["priced_s"].get<double>(), 1e-3,
              1e-12);
}

// Lines with their passes' CPU time: each sum gets the share of its passes' time on a core and
// the price against that time, over the steps whose line has it (a line without, as older
// servers wrote, counts in the rest only).
TEST(ValidateStepsTest, PricesThePassesAgainstTheirTimeOnACore) {
  auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::vector<policies::StepLogLine> lines = {Step(0, 0, 0.010, 0), Step(1, 0.002, 0.004, 4),
                                              Step(1, 0.006, 0.010, 1), Step(1, 0.020, 0.004, 5),
                                              Step(1, 0.030, 0.004, 1)};
  lines[0].forward_cpu_s = 0.005;   // the prefill pass on its core throughout
  lines[1].forward_cpu_s = 0.001;   // 4 rows: half of the pass preempted
  lines[2].forward_cpu_s = 0.004;   // 1 row: 4 of 5 ms
  lines[3].forward_cpu_s = 0.0015;  // 5 rows: 1.5 of 2 ms; lines[4]: no CPU time
  e2e::TempDir tmp;
  auto steps = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(steps.ok()) << steps.error();
  auto price = [&](const policies::StepLogLine& l) {
    return sim::MakeStepCostModel(*cluster, static_cast<std::size_t>(l.instance))
        ->StepTime(l.step.shape);
  };
  auto expect = [&](const json& part, const std::vector<std::size_t>& with_cpu) {
    ASSERT_TRUE(part.contains("on_cpu")) << part;
    const json& on = part["on_cpu"];
    double forward_s = 0, cpu_s = 0, priced_s = 0;
    for (std::size_t i : with_cpu) {
      forward_s += lines[i].step.seconds;
      cpu_s += *lines[i].forward_cpu_s;
      priced_s += price(lines[i]);
    }
    EXPECT_EQ(on["steps"].get<std::size_t>(), with_cpu.size()) << on;
    EXPECT_NEAR(on["forward_s"].get<double>(), forward_s, 1e-12) << on;
    EXPECT_NEAR(on["share"].get<double>(), cpu_s / forward_s, 1e-12) << on;
    EXPECT_NEAR(on["priced_error_pct"].get<double>(), 100 * (priced_s / cpu_s - 1), 1e-9) << on;
  };
  expect(*steps, {0, 1, 2, 3});
  expect((*steps)["classes"]["prefill"], {0});
  expect((*steps)["classes"]["decode"], {1, 2, 3});
  EXPECT_EQ((*steps)["classes"]["decode"]["steps"], 4) << "the line without counts elsewhere";
  const json& bands = (*steps)["decode_by_rows"];
  ASSERT_EQ(bands.size(), 2u) << bands;
  expect(bands[0], {2});
  expect(bands[1], {1, 3});
  EXPECT_NEAR(bands[1]["on_cpu"]["share"].get<double>(), 2.5 / 4, 1e-12);
  // In words: the shares and the errors against the CPU time, by class and band.
  const std::string words = OnCpuText(*steps);
  EXPECT_NE(words.find("decode by batch rows 1 80.0%, 4-7 62.5%"), std::string::npos) << words;
  EXPECT_NE(words.find("against that time the cost model prices them at " +
                       PercentText((*steps)["on_cpu"]["priced_error_pct"])),
            std::string::npos)
      << words;
  // Logs without CPU time have none of it.
  lines.resize(1);
  lines[0].forward_cpu_s.reset();
  steps = AttributeLines(lines, *cluster, tmp);
  ASSERT_TRUE(steps.ok()) << steps.error();
  EXPECT_FALSE(steps->contains("on_cpu"));
  EXPECT_FALSE((*steps)["classes"]["prefill"].contains("on_cpu"));
  EXPECT_EQ(OnCpuText(*steps), "");
}

// The machine's reference shapes read apart (validate_machine.h): a one-row decode step, bound by
// memory bandwidth, 20% slower than at calibration, a two-row one 10%, a batch of 8 rows as
// then and a prefill pass 10% faster; 5% slower all together. A profile whose decode class is
// split at 4 rows prices each side by the shapes it prices (the two small ones weighted by their
// calibrated time), prefill by its own and the mixed steps, which no reference shape is, by all.
TEST(ValidateStepsTest, PricesEachKindOfStepAtTheMachinesSpeedForIt) {
  models::StepProfile profile;
  profile.fits.emplace_back();
  models::StepFit& fit = profile.fits.back();
  models::AffinePiece one;
  one.seconds_per.fill(1.0);
  for (auto& pieces : fit.pieces) pieces = {one};
  const auto decode = static_cast<std::size_t>(models::ShapeClass::kDecode);
  const auto prefill = static_cast<std::size_t>(models::ShapeClass::kPrefill);
  const auto mixed = static_cast<std::size_t>(models::ShapeClass::kMixed);
  fit.split_rows[decode] = 4;
  fit.pieces_above[decode] = {one, one};
  auto shape = [](const std::string& name, models::StepShape s, double calibrated_ms) {
    return json{
        {"name", name}, {"shape", models::StepShapeToJson(s)}, {"calibrated_ms", calibrated_ms}};
  };
  json machine = {{"slower_pct", 5.0},
                  {"min_pct", 4.0},
                  {"max_pct", 6.0},
                  {"shapes",
                   {{"prefill 256", -10.0},
                    {"decode 8x256", 0.0},
                    {"decode 1x256", 20.0},
                    {"decode 2x256", 10.0}}},
                  {"timings",
                   {{{"slower_pct", 5.0},
                     {"shapes",
                      {shape("prefill 256", {{{256, 0}}, 0, 0, 1}, 600),
                       shape("decode 8x256", {{}, 8, 8 * 256, 1}, 30),
                       shape("decode 1x256", {{}, 1, 256, 1}, 9),
                       shape("decode 2x256", {{}, 2, 512, 1}, 10)}}}}}};
  auto expect = [&](const models::StepProfile& scaled, double k_prefill, double k_decode,
                    double k_above, double k_mixed) {
    const models::StepFit& f = scaled.fits.at(0);
    for (auto [pieces, k] :
         {std::pair{&f.pieces[prefill], k_prefill}, std::pair{&f.pieces[decode], k_decode},
          std::pair{&f.pieces_above[decode], k_above}, std::pair{&f.pieces[mixed], k_mixed}})
      for (const models::AffinePiece& piece : *pieces)
        for (double v : piece.seconds_per) EXPECT_NEAR(v, k, 1e-12);
  };
  const double small = (9 * 1.2 + 10 * 1.1) / 19;
  auto [scaled, scales] = ProfileAtMachineSpeed(profile, machine);
  expect(scaled, 0.9, small, 1.0, 1.05);
  EXPECT_NEAR(scales["scale"].get<double>(), 1.05, 1e-12);
  EXPECT_NEAR(scales["scales"]["decode"].get<double>(), small, 1e-12) << scales;
  EXPECT_EQ(scales["by"], (json{{"prefill", "prefill 256"},
                                {"decode", "decode 1x256, decode 2x256"},
                                {"decode above split", "decode 8x256"}}))
      << scales;
  // A record from before the shapes' medians were kept: every step at the speed of all.
  machine.erase("shapes");
  auto [uniform, uniform_scales] = ProfileAtMachineSpeed(profile, machine);
  expect(uniform, 1.05, 1.05, 1.05, 1.05);
  EXPECT_TRUE(uniform_scales["by"].empty()) << uniform_scales;
}

// The reference shapes validate times beside the live runs, picked from the profile's own
// measurements: the longest prefill of up to 256 tokens, the decode batch of up to 8 rows and
// the one-row step, each at the least context per row of at least 256 (where none reaches 256,
// the most); each prefill one chunk at no context, each shape timed, of tp 1. Each shape left out
// here would be picked if it were not.
TEST(ValidateStepsTest, PicksTheMachinesReferenceShapesFromTheProfile) {
  models::StepProfile profile;
  auto add = [&](models::StepShape s, std::vector<Seconds> seconds = {0.1}) {
    profile.measurements.push_back({s, std::move(seconds)});
  };
  for (Tokens tokens : {128, 1024, 192, 512}) add({{{tokens, 0}}, 0, 0, 1});
  add({{{240, 256}}, 0, 0, 1});         // after a cached context
  add({{{240, 0}, {16, 0}}, 0, 0, 1});  // two chunks
  add({{{256, 0}}, 0, 0, 2});           // of another tp
  for (Tokens rows : {1, 4, 8, 16})
    for (Tokens context : {64, 1024, 512}) add({{}, rows, rows * context, 1});
  add({{}, 8, 8 * 256, 2});  // of another tp
  add({{}, 1, 256, 1}, {});  // not timed
  auto names = [&] {
    std::vector<std::string> out;
    for (std::size_t i : ReferenceShapes(profile))
      out.push_back(ReferenceShapeName(profile.measurements[i].shape));
    return out;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"prefill 192", "decode 8x512", "decode 1x512"}));
  // Contexts below 256 only: the most of them.
  std::erase_if(profile.measurements, [](const models::StepMeasurement& m) {
    return m.shape.decode_tokens > 0 &&
           m.shape.decode_context_tokens / m.shape.decode_tokens >= 256;
  });
  EXPECT_EQ(names(), (std::vector<std::string>{"prefill 192", "decode 8x64", "decode 1x64"}));
}

}  // namespace
}  // namespace duet::cli
