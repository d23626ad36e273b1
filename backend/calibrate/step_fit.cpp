// The step-cost fit (see step_fit.h).
//
// The fit minimises the relative error of each measurement's median, not the absolute error:
// step times span four orders of magnitude and a 5% miss on a 1 ms decode step matters as much
// as one on a 1 s prefill. Each affine piece is a non-negative least-squares problem (Lawson
// and Hanson's active-set method over Eigen's column-pivoting QR); two pieces are fitted by
// alternating between assigning each measurement to the piece that prices it highest and
// refitting each piece on its measurements (Magnani and Boyd's max-affine regression).
#include "backend/calibrate/step_fit.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace duet::backend {

using models::AffinePiece;
using models::ClassOf;
using models::ErrorOf;
using models::FeaturesOf;
using models::FitColumns;
using models::FittedCostModel;
using models::kFitColumns;
using models::kShapeClasses;
using models::MaxOfPieces;
using models::ShapeClass;
using models::StepFeatures;
using models::StepFit;
using models::StepMeasurement;

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
// measurement to the piece that prices it highest, from a given first assignment.
std::vector<AffinePiece> Alternate(const std::vector<Sample>& samples,
                                   const std::vector<std::size_t>& rows,
                                   std::vector<std::size_t> assignment) {
  std::vector<AffinePiece> pieces;
  for (int iteration = 0; iteration < 50; ++iteration) {
    pieces.clear();
    for (std::size_t k = 0; k < 2; ++k) {
      std::vector<std::size_t> mine;
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (assignment[i] == k) mine.push_back(rows[i]);
      if (!mine.empty()) pieces.push_back(FitPiece(samples, mine));
    }
    if (pieces.size() < 2) break;
    bool changed = false;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::size_t k = 0;
      MaxOfPieces(pieces, samples[rows[i]].columns, &k);
      changed |= k != assignment[i];
      assignment[i] = k;
    }
    if (!changed) break;
  }
  return pieces;
}

double Median(const std::vector<Sample>& samples, const std::vector<std::size_t>& rows,
              double Sample::*field) {
  std::vector<double> v;
  for (std::size_t r : rows) v.push_back(samples[r].*field);
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The alternation finds a local optimum, so it starts from three splits and keeps the best:
// at the median token count (small steps against large ones), at the median cached context
// (attention-heavy against not), and by the sign of one piece's error (what it under-prices
// against what it over-prices).
std::vector<AffinePiece> FitTwoPieces(const std::vector<Sample>& samples,
                                      const std::vector<std::size_t>& rows,
                                      const AffinePiece& one) {
  const double median_tokens = Median(samples, rows, &Sample::tokens);
  const double median_context = Median(samples, rows, &Sample::context);
  std::vector<std::vector<std::size_t>> starts(3, std::vector<std::size_t>(rows.size()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Sample& s = samples[rows[i]];
    starts[0][i] = s.tokens > median_tokens ? 1 : 0;
    starts[1][i] = s.context > median_context ? 1 : 0;
    starts[2][i] = one.At(s.columns) < s.seconds ? 1 : 0;
  }
  std::vector<AffinePiece> best;
  double best_error = 0;
  for (std::vector<std::size_t>& start : starts) {
    std::vector<AffinePiece> pieces = Alternate(samples, rows, std::move(start));
    const double error = RmsRelativeError(pieces, samples, rows);
    if (best.empty() || error < best_error) {
      best = std::move(pieces);
      best_error = error;
    }
  }
  return best;
}
}  // namespace

Result<StepFit> FitSteps(std::vector<StepMeasurement>& measurements, int tp,
                         const FitOptions& options) {
  DUET_CHECK(options.held_out_every >= 2 && options.max_pieces >= 1 && options.max_pieces <= 2);
  std::vector<Sample> samples;
  std::array<std::vector<std::size_t>, kShapeClasses> training;
  std::array<int, kShapeClasses> seen{};
  std::array<int, kShapeClasses> held{};
  for (StepMeasurement& m : measurements) {
    if (m.shape.tp != tp) continue;
    const StepFeatures f = FeaturesOf(m.shape);
    const Seconds median = m.Median();
    if (f.empty() || !(median > 0))
      return Status::Error("a measurement with no tokens or no positive time cannot be fitted");
    const auto c = static_cast<std::size_t>(ClassOf(f));
    m.held_out = ++seen[c] % options.held_out_every == 0;
    held[c] += m.held_out ? 1 : 0;
    if (!m.held_out) training[c].push_back(samples.size());
    samples.push_back(
        {FitColumns(f), median, f.tokens(), f.prefill_context_tokens + f.decode_context_tokens});
  }
  const std::string where = "tp " + std::to_string(tp) + ": ";
  StepFit fit;
  fit.tp = tp;
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const std::string name = models::ToString(static_cast<ShapeClass>(c));
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
  for (std::size_t c = 0; c < kShapeClasses; ++c) {
    const std::string name = models::ToString(static_cast<ShapeClass>(c));
    // Mixed steps have every column, and a sweep's mixed shapes vary few of them (a chunk's
    // cached context, several chunks): their pieces are fitted on every class's measurements,
    // so that what prefill and decode shapes tell about those columns carries over.
    std::vector<std::size_t> rows = training[c];
    if (static_cast<ShapeClass>(c) == ShapeClass::kMixed) {
      for (std::size_t other = 0; other < kShapeClasses; ++other)
        if (other != c) rows.insert(rows.end(), training[other].begin(), training[other].end());
    }
    std::vector<AffinePiece>& pieces = fit.pieces[c];
    pieces = {FitPiece(samples, rows)};
    if (options.max_pieces == 2) {
      std::vector<AffinePiece> two = FitTwoPieces(samples, rows, pieces[0]);
      // The second piece has to earn its place: a tenth less training error.
      if (RmsRelativeError(two, samples, rows) < 0.9 * RmsRelativeError(pieces, samples, rows))
        pieces = std::move(two);
    }
    for (const AffinePiece& piece : pieces) {
      for (double v : piece.seconds_per) {
        if (!std::isfinite(v))
          return Status::Error(where + name +
                               ": the fit did not converge (a coefficient is not finite)");
      }
    }
  }
  const FittedCostModel model(fit);
  fit.training = ErrorOf(model, measurements, tp, false);
  fit.held_out = ErrorOf(model, measurements, tp, true);
  return fit;
}

}  // namespace duet::backend
