// The step-cost fit (see step_fit.h).
//
// The fit minimises the relative error of each measurement's median, not the absolute error:
// step times span four orders of magnitude and a 5% miss on a 1 ms decode step matters as much
// as one on a 1 s prefill. Each affine piece is a non-negative least-squares problem (Lawson
// and Hanson's active-set method over Eigen's column-pivoting QR); two pieces are fitted by
// alternating between assigning each measurement to the piece that prices it highest and
// refitting each piece on its measurements (Magnani and Boyd's max-affine regression).
#include "models/step_fit.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace duet::models {

namespace {

constexpr std::size_t kMinTrainingPerClass = 8;

// ---- Non-negative least squares --------------------------------------------------------------

// min ||A x - b|| subject to x >= 0 (Lawson and Hanson, "Solving Least Squares Problems", 23.3).
// Columns are scaled to unit norm first so that the tolerance means the same for a column of
// ones and a column of attention pairs in the billions.
Eigen::VectorXd Nnls(const Eigen::MatrixXd& a_in, const Eigen::VectorXd& b) {
  const Eigen::Index n = a_in.cols();
  Eigen::VectorXd scale(n);
  Eigen::MatrixXd a = a_in;
  for (Eigen::Index j = 0; j < n; ++j) {
    const double norm = a.col(j).norm();
    scale(j) = norm > 0 ? norm : 1.0;
    a.col(j) /= scale(j);
  }
  Eigen::VectorXd x = Eigen::VectorXd::Zero(n);
  std::vector<bool> passive(static_cast<std::size_t>(n), false);
  constexpr double kTolerance = 1e-12;
  auto solve_passive = [&]() {
    std::vector<Eigen::Index> cols;
    for (Eigen::Index j = 0; j < n; ++j)
      if (passive[static_cast<std::size_t>(j)]) cols.push_back(j);
    Eigen::MatrixXd ap(a.rows(), static_cast<Eigen::Index>(cols.size()));
    for (std::size_t k = 0; k < cols.size(); ++k)
      ap.col(static_cast<Eigen::Index>(k)) = a.col(cols[k]);
    const Eigen::VectorXd sp = ap.colPivHouseholderQr().solve(b);
    Eigen::VectorXd s = Eigen::VectorXd::Zero(n);
    for (std::size_t k = 0; k < cols.size(); ++k) s(cols[k]) = sp(static_cast<Eigen::Index>(k));
    return s;
  };
  for (int outer = 0; outer < 3 * n; ++outer) {
    const Eigen::VectorXd w = a.transpose() * (b - a * x);
    Eigen::Index best = -1;
    for (Eigen::Index j = 0; j < n; ++j)
      if (!passive[static_cast<std::size_t>(j)] && w(j) > kTolerance &&
          (best < 0 || w(j) > w(best)))
        best = j;
    if (best < 0) break;
    passive[static_cast<std::size_t>(best)] = true;
    for (int inner = 0; inner < 3 * n; ++inner) {
      const Eigen::VectorXd s = solve_passive();
      bool feasible = true;
      double alpha = 1.0;
      for (Eigen::Index j = 0; j < n; ++j) {
        if (!passive[static_cast<std::size_t>(j)] || s(j) > kTolerance) continue;
        feasible = false;
        const double denom = x(j) - s(j);
        if (denom > 0) alpha = std::min(alpha, x(j) / denom);
      }
      if (feasible) {
        x = s;
        break;
      }
      x += alpha * (s - x);
      for (Eigen::Index j = 0; j < n; ++j) {
        if (passive[static_cast<std::size_t>(j)] && x(j) <= kTolerance) {
          passive[static_cast<std::size_t>(j)] = false;
          x(j) = 0;
        }
      }
    }
  }
  for (Eigen::Index j = 0; j < n; ++j) x(j) = std::max(0.0, x(j)) / scale(j);
  return x;
}

struct Sample {
  std::array<double, kFitColumns> columns;
  double seconds;  // the median
  double tokens;   // new tokens: prefill and decode
  double context;  // cached tokens attended to: prefill and decode
  StepFeatures features;
};

// One piece fitted to `rows` of `samples` for the least relative error.
AffinePiece FitPiece(const std::vector<Sample>& samples, const std::vector<std::size_t>& rows) {
  Eigen::MatrixXd a(static_cast<Eigen::Index>(rows.size()), Eigen::Index(kFitColumns));
  Eigen::VectorXd b = Eigen::VectorXd::Ones(static_cast<Eigen::Index>(rows.size()));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Sample& s = samples[rows[r]];
    for (std::size_t c = 0; c < kFitColumns; ++c)
      a(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = s.columns[c] / s.seconds;
  }
  const Eigen::VectorXd x = Nnls(a, b);
  AffinePiece piece;
  for (std::size_t c = 0; c < kFitColumns; ++c)
    piece.seconds_per[c] = x(static_cast<Eigen::Index>(c));
  return piece;
}

double RmsRelativeError(const std::vector<AffinePiece>& pieces, const std::vector<Sample>& samples,
                        const std::vector<std::size_t>& rows) {
  double sum = 0;
  for (std::size_t r : rows) {
    const Sample& s = samples[r];
    const double e = MaxOfPieces(pieces, s.columns, nullptr) / s.seconds - 1.0;
    sum += e * e;
  }
  return rows.empty() ? 0 : std::sqrt(sum / double(rows.size()));
}

// Two pieces by alternating between refitting each piece on its measurements and assigning each
// measurement to the piece that prices it highest, from a given first assignment. Keeps the
// pieces with the least error seen: an assignment can leave a piece with nothing to fit, and
// the alternation need not improve at every step.
std::vector<AffinePiece> Alternate(const std::vector<Sample>& samples,
                                   const std::vector<std::size_t>& rows,
                                   std::vector<std::size_t> assignment) {
  std::vector<AffinePiece> best;
  double best_error = 0;
  for (int iteration = 0; iteration < 50; ++iteration) {
    std::vector<AffinePiece> pieces;
    for (std::size_t k = 0; k < 2; ++k) {
      std::vector<std::size_t> mine;
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (assignment[i] == k) mine.push_back(rows[i]);
      if (!mine.empty()) pieces.push_back(FitPiece(samples, mine));
    }
    if (pieces.size() < 2) break;
    const double error = RmsRelativeError(pieces, samples, rows);
    if (best.empty() || error < best_error) {
      best = pieces;
      best_error = error;
    }
    bool changed = false;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::size_t k = 0;
      MaxOfPieces(pieces, samples[rows[i]].columns, &k);
      changed |= k != assignment[i];
      assignment[i] = k;
    }
    if (!changed) break;
  }
  return best;
}

double Median(const std::vector<Sample>& samples, const std::vector<std::size_t>& rows,
              double Sample::*field) {
  std::vector<double> v;
  for (std::size_t r : rows) v.push_back(samples[r].*field);
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The alternation finds a local optimum, so it starts from several splits and keeps the best:
// small steps against large ones at up to kTokenSplits token counts (a backend's kernels change
// regime at a batch size that the median need not be near: the CPU's matrix multiplies go from
// a weight-streaming GEMV to oneDNN at 12 rows), at the median cached context (attention-heavy
// against not), and by the sign of one piece's error (what it under-prices against what it
// over-prices). Empty when no start keeps two pieces.
constexpr std::size_t kTokenSplits = 8;
std::vector<AffinePiece> FitTwoPieces(const std::vector<Sample>& samples,
                                      const std::vector<std::size_t>& rows,
                                      const AffinePiece& one) {
  std::vector<double> token_counts;
  for (std::size_t r : rows) token_counts.push_back(samples[r].tokens);
  std::sort(token_counts.begin(), token_counts.end());
  token_counts.erase(std::unique(token_counts.begin(), token_counts.end()), token_counts.end());
  token_counts.pop_back();  // a split above the largest count leaves one side empty
  std::vector<double> splits;
  for (std::size_t k = 0; k < std::min(kTokenSplits, token_counts.size()); ++k)
    splits.push_back(
        token_counts[k * token_counts.size() / std::min(kTokenSplits, token_counts.size())]);
  const double median_context = Median(samples, rows, &Sample::context);
  std::vector<std::vector<std::size_t>> starts(splits.size() + 2,
                                               std::vector<std::size_t>(rows.size()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Sample& s = samples[rows[i]];
    for (std::size_t k = 0; k < splits.size(); ++k) starts[k][i] = s.tokens > splits[k] ? 1 : 0;
    starts[splits.size()][i] = s.context > median_context ? 1 : 0;
    starts[splits.size() + 1][i] = one.At(s.columns) < s.seconds ? 1 : 0;
  }
  std::vector<AffinePiece> best;
  double best_error = 0;
  for (std::vector<std::size_t>& start : starts) {
    std::vector<AffinePiece> pieces = Alternate(samples, rows, std::move(start));
    if (pieces.empty()) continue;
    const double error = RmsRelativeError(pieces, samples, rows);
    if (best.empty() || error < best_error) {
      best = std::move(pieces);
      best_error = error;
    }
  }
  return best;
}

// Whether a model with training error `candidate` earns its place beside a simpler one with
// `current`: a tenth less error, where there is error to lose (not rounding's).
bool Improves(double candidate, double current) {
  return current > 1e-9 && candidate < 0.9 * current;
}

// 1 or 2 pieces (max_pieces) fitted to `rows`; the second where it Improves on one.
std::vector<AffinePiece> FitClass(const std::vector<Sample>& samples,
                                  const std::vector<std::size_t>& rows, int max_pieces) {
  std::vector<AffinePiece> pieces = {FitPiece(samples, rows)};
  if (max_pieces == 2) {
    std::vector<AffinePiece> two = FitTwoPieces(samples, rows, pieces[0]);
    if (!two.empty() &&
        Improves(RmsRelativeError(two, samples, rows), RmsRelativeError(pieces, samples, rows)))
      pieces = std::move(two);
  }
  return pieces;
}

// A class split at a row count (StepFit::split_rows).
struct Split {
  Tokens rows = 0;
  std::vector<AffinePiece> below;
  std::vector<AffinePiece> above;
};

// The split of `rows` at a row count that prices them best, where it Improves on `unsplit`;
// nullopt where none does. Candidates are the measured row counts (at most
// kSplitCandidates of them, spread over their range) that leave kMinPerSide measurements on each
// side; a split at a measured count prices every count between it and the one below it as the
// lower side does.
constexpr std::size_t kSplitCandidates = 32;
constexpr std::size_t kMinPerSide = 6;
std::optional<Split> FitSplit(const std::vector<Sample>& samples,
                              const std::vector<std::size_t>& rows, int max_pieces,
                              const std::vector<AffinePiece>& unsplit) {
  std::vector<double> counts;
  for (std::size_t r : rows) counts.push_back(samples[r].tokens);
  std::sort(counts.begin(), counts.end());
  std::vector<double> candidates;
  for (std::size_t i = kMinPerSide; i + kMinPerSide <= counts.size(); ++i)
    if (counts[i] != counts[i - 1]) candidates.push_back(counts[i]);
  if (candidates.size() > kSplitCandidates) {
    std::vector<double> spread;
    for (std::size_t k = 0; k < kSplitCandidates; ++k)
      spread.push_back(candidates[k * candidates.size() / kSplitCandidates]);
    candidates = std::move(spread);
  }
  // The best split for each number of pieces (2 to 4); more pieces have to Improve on fewer,
  // as within a class: data that two splits fit equally well (a kernel change between two
  // measured counts) gets the split with the fewer pieces.
  std::map<std::size_t, std::pair<double, Split>> best;
  for (double at : candidates) {
    std::vector<std::size_t> below;
    std::vector<std::size_t> above;
    for (std::size_t r : rows) (samples[r].tokens < at ? below : above).push_back(r);
    Split split{static_cast<Tokens>(at), FitClass(samples, below, max_pieces),
                FitClass(samples, above, max_pieces)};
    const double sum_sq =
        std::pow(RmsRelativeError(split.below, samples, below), 2) * double(below.size()) +
        std::pow(RmsRelativeError(split.above, samples, above), 2) * double(above.size());
    const double error = std::sqrt(sum_sq / double(rows.size()));
    const std::size_t pieces = split.below.size() + split.above.size();
    auto it = best.find(pieces);
    if (it == best.end() || error < it->second.first) best[pieces] = {error, std::move(split)};
  }
  if (best.empty()) return std::nullopt;
  auto pick = best.begin();
  for (auto it = std::next(best.begin()); it != best.end(); ++it)
    if (Improves(it->second.first, pick->second.first)) pick = it;
  if (!Improves(pick->second.first, RmsRelativeError(unsplit, samples, rows))) return std::nullopt;
  return std::move(pick->second.second);
}

// Whether the i-th (from 0) of a class's n measurements is held out: one in each whole run of
// `every`, at a place that moves back by one from one run to the next. Sweeps vary one
// dimension fastest (a shape at 4 cached contexts, then the next size at the same 4): holding
// out every 4th would hold out only the longest context, which measures how the fit
// extrapolates beyond what it saw, not how it describes the sweep.
bool HeldOut(int i, int n, int every) {
  return i < n / every * every && (i + i / every) % every == every - 1;
}

using ClassRows = std::array<std::vector<std::size_t>, kShapeClasses>;

// Every class's pieces fitted to its `training` rows of `samples` (mixed steps to every
// class's). Errors: a coefficient that is not finite.
Status FitClasses(const std::vector<Sample>& samples, const ClassRows& training,
                  const FitOptions& options, const std::string& where, StepFit& fit) {
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const std::string name = ToString(static_cast<ShapeClass>(c));
    // Mixed steps have every column, and a sweep's mixed shapes vary few of them (a chunk's
    // cached context, several chunks): their pieces are fitted on every class's measurements,
    // so that what prefill and decode shapes tell about those columns carries over.
    std::vector<std::size_t> rows = training[c];
    if (static_cast<ShapeClass>(c) == ShapeClass::kMixed) {
      for (std::size_t other = 0; other < kShapeClasses; ++other)
        if (other != c) rows.insert(rows.end(), training[other].begin(), training[other].end());
    }
    fit.pieces[c] = FitClass(samples, rows, options.max_pieces);
    if (options.split_decode && static_cast<ShapeClass>(c) == ShapeClass::kDecode) {
      if (std::optional<Split> split = FitSplit(samples, rows, options.max_pieces, fit.pieces[c])) {
        fit.pieces[c] = std::move(split->below);
        fit.split_rows[c] = split->rows;
        fit.pieces_above[c] = std::move(split->above);
      }
    }
    for (const auto* pieces : {&fit.pieces[c], &fit.pieces_above[c]}) {
      for (const AffinePiece& piece : *pieces) {
        for (double v : piece.seconds_per) {
          if (!std::isfinite(v))
            return Status::Error(where + name +
                                 ": the fit did not converge (a coefficient is not finite)");
        }
      }
    }
  }
  return Status::Ok();
}

// How the fit extrapolates (StepFit::extrapolation): of each class, the quarter of its
// measurements that took longest are its sweep's largest shapes; the classes are fitted again
// without them, and priced on those of them that lie beyond what the rest of their class
// measured (a fit column larger than any of theirs), as a trace's steps beyond the sweep are
// priced. Zero shapes everywhere where a class would keep too few measurements to fit.
ClassErrors Extrapolation(const std::vector<Sample>& samples, const ClassRows& all,
                          const FitOptions& options) {
  ClassRows kept, largest;
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    std::vector<std::size_t> rows = all[c];
    std::sort(rows.begin(), rows.end(), [&](std::size_t a, std::size_t b) {
      return samples[a].seconds < samples[b].seconds;
    });
    const std::size_t keep = rows.size() - rows.size() / 4;
    if (keep < kMinTrainingPerClass || keep == rows.size()) return {};
    kept[c].assign(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(keep));
    largest[c].assign(rows.begin() + static_cast<std::ptrdiff_t>(keep), rows.end());
  }
  StepFit fit;
  if (!FitClasses(samples, kept, options, "", fit).ok()) return {};
  ClassErrors errors{};
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    std::array<double, kFitColumns> max{};
    for (std::size_t r : kept[c])
      for (std::size_t k = 0; k < kFitColumns; ++k)
        max[k] = std::max(max[k], samples[r].columns[k]);
    std::vector<double> pct;
    for (std::size_t r : largest[c]) {
      const Sample& s = samples[r];
      bool beyond = false;
      for (std::size_t k = 0; k < kFitColumns; ++k) beyond |= s.columns[k] > max[k];
      if (beyond) pct.push_back(std::abs(fit.Predict(s.features) / s.seconds - 1) * 100);
    }
    errors[c] = SummarizeErrors(pct);
  }
  return errors;
}

}  // namespace

Result<StepFit> FitSteps(std::vector<StepMeasurement>& measurements, int tp,
                         const FitOptions& options) {
  DUET_CHECK(options.held_out_every >= 2 && options.max_pieces >= 1 && options.max_pieces <= 2);
  std::vector<Sample> samples;
  ClassRows training, all;
  std::array<int, kShapeClasses> count{};
  for (const StepMeasurement& m : measurements) {
    const StepFeatures f = FeaturesOf(m.shape);
    if (m.shape.tp == tp && !f.empty()) ++count[static_cast<std::size_t>(ClassOf(f))];
  }
  std::array<int, kShapeClasses> seen{};
  std::array<int, kShapeClasses> held{};
  for (StepMeasurement& m : measurements) {
    if (m.shape.tp != tp) continue;
    const StepFeatures f = FeaturesOf(m.shape);
    const Seconds median = m.Median();
    if (f.empty() || !(median > 0))
      return Status::Error("a measurement with no tokens or no positive time cannot be fitted");
    const auto c = static_cast<std::size_t>(ClassOf(f));
    m.held_out = HeldOut(seen[c]++, count[c], options.held_out_every);
    held[c] += m.held_out ? 1 : 0;
    if (!m.held_out) training[c].push_back(samples.size());
    all[c].push_back(samples.size());
    samples.push_back(
        {FitColumns(f), median, f.tokens(), f.prefill_context_tokens + f.decode_context_tokens, f});
  }
  const std::string where = "tp " + std::to_string(tp) + ": ";
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const std::string name = ToString(static_cast<ShapeClass>(c));
    // The simulator prices every class, so each needs its own measurements.
    if (training[c].size() < kMinTrainingPerClass)
      return Status::Error(where + std::to_string(training[c].size()) + " " + name +
                           " measurements to fit; need at least " +
                           std::to_string(kMinTrainingPerClass));
    if (held[c] == 0)
      return Status::Error(where + std::to_string(seen[c]) + " " + name +
                           " measurements leave none to hold out; need at least " +
                           std::to_string(options.held_out_every));
  }
  StepFit fit;
  fit.tp = tp;
  DUET_RETURN_IF_ERROR(FitClasses(samples, training, options, where, fit));
  const FittedCostModel model(fit);
  fit.training = ErrorOf(model, measurements, tp, false);
  fit.held_out = ErrorOf(model, measurements, tp, true);
  fit.extrapolation = Extrapolation(samples, all, options);
  return fit;
}

Result<HostFit> FitHost(const std::vector<HostSample>& samples, const FitOptions& options) {
  DUET_CHECK(options.held_out_every >= 2);
  constexpr std::size_t kMinSamples = 20;
  const int n = static_cast<int>(samples.size());
  if (samples.size() < kMinSamples)
    return Status::Error("a host-time fit needs at least " + std::to_string(kMinSamples) +
                         " iterations (got " + std::to_string(n) + ")");
  std::vector<std::size_t> training;
  std::vector<bool> held(samples.size());
  for (int i = 0; i < n; ++i) {
    held[static_cast<std::size_t>(i)] = HeldOut(i, n, options.held_out_every);
    if (!held[static_cast<std::size_t>(i)]) training.push_back(static_cast<std::size_t>(i));
  }
  constexpr auto kColumns = static_cast<Eigen::Index>(kHostColumns);
  Eigen::MatrixXd a(static_cast<Eigen::Index>(training.size()), kColumns);
  Eigen::VectorXd b(static_cast<Eigen::Index>(training.size()));
  for (std::size_t r = 0; r < training.size(); ++r) {
    const HostSample& s = samples[training[r]];
    const auto columns = HostColumns(s.counts);
    for (Eigen::Index c = 0; c < kColumns; ++c)
      a(static_cast<Eigen::Index>(r), c) = columns[static_cast<std::size_t>(c)];
    b(static_cast<Eigen::Index>(r)) = s.seconds;
  }
  if (!(b.sum() > 0))
    return Status::Error(
        "the iterations spent no time outside their forward passes: nothing to fit");
  const Eigen::VectorXd x = Nnls(a, b);
  HostFit fit;
  for (Eigen::Index c = 0; c < kColumns; ++c) {
    if (!std::isfinite(x(c)))
      return Status::Error("the host-time fit did not converge (a coefficient is not finite)");
    fit.seconds_per[static_cast<std::size_t>(c)] = x(c);
  }
  fit.steps = n;
  std::vector<double> held_pct, training_pct;
  double held_priced = 0, held_measured = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Seconds priced = fit.Predict(samples[i].counts);
    const Seconds measured = samples[i].seconds;
    if (held[i]) {
      held_priced += priced;
      held_measured += measured;
    }
    if (!(measured > 0)) continue;  // no relative error of nothing
    (held[i] ? held_pct : training_pct).push_back(std::abs(priced / measured - 1) * 100);
  }
  fit.training = SummarizeErrors(training_pct);
  fit.held_out = SummarizeErrors(held_pct);
  fit.held_out_total_pct = held_measured > 0 ? 100 * (held_priced / held_measured - 1) : 0;
  return fit;
}

namespace {

// a + b * x / scale through (x, seconds) points, the relative error minimised by least squares
// (short times count as much as long ones), a and b at least 0: {a, b}. `scale` (the largest
// x) keeps the system well conditioned.
std::pair<double, double> FitRelativeLine(const std::vector<std::pair<double, Seconds>>& points,
                                          double scale) {
  // Rows: the model's time over the measured one should be 1, so each is (1/t, x/t) against 1.
  double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
  for (const auto& [x, t] : points) {
    const double u = 1 / t, v = x / scale / t;
    uu += u * u;
    uv += u * v;
    vv += v * v;
    u1 += u;
    v1 += v;
  }
  const double det = uu * vv - uv * uv;
  double a = det > 0 ? (u1 * vv - v1 * uv) / det : 0;
  double b = det > 0 ? (uu * v1 - uv * u1) / det : 0;
  if (a < 0) {  // the best line crosses below the origin: through it
    a = 0;
    b = vv > 0 ? v1 / vv : 0;
  }
  if (b < 0) {  // it falls with x: the constant of least relative error
    a = uu > 0 ? u1 / uu : 0;
    b = 0;
  }
  return {a, b};
}

}  // namespace

Result<LinkFit> FitLink(std::vector<TransferMeasurement> measurements, const FitOptions& options) {
  DUET_CHECK(options.held_out_every >= 2);
  const int n = static_cast<int>(measurements.size());
  const int needed = std::max(5, options.held_out_every + 1);
  if (n < needed)
    return Status::Error("a link fit needs at least " + std::to_string(needed) +
                         " transfer sizes (got " + std::to_string(n) + ")");
  const auto [smallest, largest] =
      std::minmax_element(measurements.begin(), measurements.end(),
                          [](const auto& x, const auto& y) { return x.bytes < y.bytes; });
  std::vector<std::pair<double, Seconds>> points;
  for (int i = 0; i < n; ++i) {
    TransferMeasurement& m = measurements[static_cast<std::size_t>(i)];
    m.held_out = HeldOut(i, n, options.held_out_every);
    if (!m.held_out) points.emplace_back(static_cast<double>(m.bytes), m.Median());
  }
  const auto scale = static_cast<double>(largest->bytes);
  auto [a, b] = FitRelativeLine(points, scale);  // latency; seconds per `scale` bytes
  // b is the bytes' share of the largest transfer's time: none (to rounding) is no bandwidth.
  if (!(b > 1e-6 * largest->Median()) || !std::isfinite(a))
    return Status::Error("transfer times do not grow with size over " +
                         std::to_string(smallest->bytes) + " to " + std::to_string(largest->bytes) +
                         " bytes: no bandwidth to fit (time larger transfers)");
  LinkFit link;
  link.latency = a;
  link.bandwidth = scale / b;
  // The bounds a profile's links are read with (models/step_profile.cpp).
  if (link.bandwidth > 1e15 || link.bandwidth < 1e3 || link.latency > 1)
    return Status::Error(
        "the transfer times fit no link of at most 1 s latency and 1e-6 to 1e6 GB/s");
  std::vector<double> held_pct, training_pct;
  for (const TransferMeasurement& m : measurements) {
    const double pct = std::abs(link.Time(m.bytes) / m.Median() - 1) * 100;
    (m.held_out ? held_pct : training_pct).push_back(pct);
  }
  link.held_out = SummarizeErrors(held_pct);
  link.training = SummarizeErrors(training_pct);
  link.measurements = std::move(measurements);
  return link;
}

Result<FrontendFit> FitFrontend(const std::vector<FrontendSample>& samples) {
  std::vector<std::pair<double, Seconds>> points;
  double longest = 0;
  int requests = 0;
  for (const FrontendSample& s : samples) {
    if (s.seconds.empty() || s.prompt_tokens < 1) continue;
    std::vector<Seconds> sorted = s.seconds;
    std::sort(sorted.begin(), sorted.end());
    const Seconds median = sorted[sorted.size() / 2];
    if (!(median > 0)) continue;
    points.emplace_back(static_cast<double>(s.prompt_tokens), median);
    longest = std::max(longest, static_cast<double>(s.prompt_tokens));
    requests += static_cast<int>(s.seconds.size());
  }
  if (points.size() < 2)
    return Status::Error("a frontend fit needs at least 2 prompt lengths timed (got " +
                         std::to_string(points.size()) + ")");
  const auto [a, b] = FitRelativeLine(points, longest);
  FrontendFit fit;
  fit.request_s = a;
  fit.prompt_token_s = b / longest;
  fit.requests = requests;
  std::vector<double> pct;
  for (const auto& [tokens, t] : points)
    pct.push_back(std::abs(fit.Predict(static_cast<Tokens>(tokens)) / t - 1) * 100);
  fit.training = SummarizeErrors(pct);
  return fit;
}

std::vector<Seconds> FitAfterIdle(const std::vector<std::vector<Seconds>>& extras) {
  // Blocks of pooled medians: their mean and how many they pool, non-decreasing once merged.
  std::vector<std::pair<double, std::size_t>> blocks;
  for (const std::vector<Seconds>& e : extras) {
    blocks.emplace_back(std::max<Seconds>(0, MedianOf(e)), 1);
    while (blocks.size() > 1 && blocks[blocks.size() - 2].first > blocks.back().first) {
      const auto [mean, n] = blocks.back();
      blocks.pop_back();
      auto& [before_mean, before_n] = blocks.back();
      before_mean = (before_mean * static_cast<double>(before_n) + mean * static_cast<double>(n)) /
                    static_cast<double>(before_n + n);
      before_n += n;
    }
  }
  std::vector<Seconds> out;
  for (const auto& [mean, n] : blocks) out.insert(out.end(), n, mean);
  return out;
}

}  // namespace duet::models
