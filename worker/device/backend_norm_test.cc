// Batch normalization on the CPU backend (oneDNN) and through the fake
// device backend, against a double-precision reference written here with
// direct loops from the contract in worker/device/backend.h; dropout and
// Mul.
//
// Tolerances are derived (worker/device/float_bounds_testing.h): a float
// result reached through at most N roundings is within gamma_N * magnitude
// of the exact value, where magnitude bounds every intermediate the
// roundings apply to. The magnitudes below are written so that they hold
// for either way a library may compute batch norm: two-pass statistics or
// one-pass (E[x^2] - mean^2), and y as (x - mean) * scale + beta or as the
// fused x * scale + (beta - mean * scale). So they use |x| + |mean| where
// the math has |x - mean|. Errors carried from one step to the next (the
// batch mean's error into the variance and into y) are added explicitly.
//
// The reference backward is checked against central differences of
// L = sum(dy * y) computed in double through the reference forward, so
// matching the reference within the bound checks the backend's backward
// against its forward's definition.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/dnnl_kernels.h"
#include "worker/device/dropout_mask.h"
#include "worker/device/fake_device_backend.h"
#include "worker/device/float_bounds_testing.h"

namespace towerps::worker {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

BatchNormShape Shape(int64_t n, int64_t c, int64_t spatial,
                     float epsilon = 1e-3f) {
  BatchNormShape s;
  s.n = n, s.c = c, s.spatial = spatial, s.epsilon = epsilon;
  return s;
}

// x[n, c, spatial]'s element index.
int64_t At(const BatchNormShape& s, int64_t n, int64_t c, int64_t p) {
  return (n * s.c + c) * s.spatial + p;
}

// A test case: the shape, the inputs, and how x is drawn.
struct Case {
  std::string name;
  BatchNormShape shape;
  float offset = 0.0f;          // x uniform in [offset - 1, offset + 1)
  int64_t constant_channel = -1;  // this channel's x all equal (variance 0)
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"dense rows", Shape(16, 10, 1)});
  cases.push_back({"odd image", Shape(3, 5, 7 * 5)});
  cases.push_back({"constant channel", Shape(3, 5, 7 * 5), 0.0f, 2});
  // The mean far from 0: cancellation in the statistics and in y.
  cases.push_back({"offset mean", Shape(3, 5, 7 * 5), 4.0f});
  // 16 channels, as real layers have: oneDNN's vectorized paths.
  cases.push_back({"16 channels", Shape(4, 16, 8 * 8)});
  cases.push_back({"single example, single pixel", Shape(1, 3, 1)});
  return cases;
}

std::vector<float> MakeX(const Case& c, uint64_t seed) {
  std::vector<float> x = RandomVector(c.shape.x_size(), seed,
                                      c.offset - 1.0f, c.offset + 1.0f);
  if (c.constant_channel >= 0) {
    const BatchNormShape& s = c.shape;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t p = 0; p < s.spatial; ++p)
        x[At(s, n, c.constant_channel, p)] = 0.75f;
  }
  return x;
}

// ---- The reference: direct loops in double ---------------------------------

struct Stats {
  std::vector<double> mean, var;
  // Bounds on the float statistics' errors (see ExpectStatsWithinBound).
  std::vector<double> mean_error, var_error;
};

// The batch mean and BIASED variance (divided by n * spatial) per channel,
// with the derived bounds on a float computation of them:
//  - mean: a sum of m = n * spatial terms and a division (or a
//    multiplication by a rounded 1/m): N = m + 2, magnitude sum|x| / m.
//  - var: a sum of m squares of differences, then a division; a one-pass
//    algorithm instead subtracts mean^2 from E[x^2]. Either way at most
//    m + 4 roundings, over magnitude sum (|x| + |mean|)^2 / m, which bounds
//    both sum (x - mean)^2 / m and E[x^2] + mean^2; plus the mean's error,
//    which moves sum (x - mean')^2 / m by 2 |mean| dmean + dmean^2 at most
//    in the one-pass form (by dmean^2 in the two-pass one).
Stats RefStats(const BatchNormShape& s, const std::vector<float>& x) {
  const int64_t m = s.n * s.spatial;
  Stats st;
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0, abs_sum = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t p = 0; p < s.spatial; ++p) {
        sum += x[At(s, n, c, p)];
        abs_sum += std::fabs(x[At(s, n, c, p)]);
      }
    const double mean = sum / m;
    double sq = 0, mag = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t p = 0; p < s.spatial; ++p) {
        const double v = x[At(s, n, c, p)];
        sq += (v - mean) * (v - mean);
        mag += (std::fabs(v) + std::fabs(mean)) * (std::fabs(v) + std::fabs(mean));
      }
    const double dmean = FloatGamma(m + 2) * abs_sum / m;
    st.mean.push_back(mean);
    st.var.push_back(sq / m);
    st.mean_error.push_back(dmean);
    st.var_error.push_back(FloatGamma(m + 4) * mag / m +
                           2 * std::fabs(mean) * dmean + dmean * dmean);
  }
  return st;
}

// y = gamma * (x - mean) / sqrt(var + epsilon) + beta, in double.
std::vector<double> RefForward(const BatchNormShape& s,
                               const std::vector<double>& x,
                               const std::vector<float>& gamma,
                               const std::vector<float>& beta,
                               const std::vector<double>& mean,
                               const std::vector<double>& var) {
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t c = 0; c < s.c; ++c) {
      const double inv = 1.0 / std::sqrt(var[c] + double{s.epsilon});
      for (int64_t p = 0; p < s.spatial; ++p) {
        const int64_t i = At(s, n, c, p);
        y[i] = gamma[c] * (x[i] - mean[c]) * inv + beta[c];
      }
    }
  return y;
}

// The training forward's y as a function of x alone (statistics from x), in
// double: what the finite differences differentiate.
std::vector<double> RefTrainingForward(const BatchNormShape& s,
                                       const std::vector<double>& x,
                                       const std::vector<float>& gamma,
                                       const std::vector<float>& beta) {
  const int64_t m = s.n * s.spatial;
  std::vector<double> mean(s.c, 0.0), var(s.c, 0.0);
  for (int64_t i = 0; i < s.x_size(); ++i) mean[i / s.spatial % s.c] += x[i];
  for (double& v : mean) v /= m;
  for (int64_t i = 0; i < s.x_size(); ++i) {
    const double d = x[i] - mean[i / s.spatial % s.c];
    var[i / s.spatial % s.c] += d * d;
  }
  for (double& v : var) v /= m;
  return RefForward(s, x, gamma, beta, mean, var);
}

// A value per element with the bound on a float computation of it.
struct Bounded {
  std::vector<double> value, error;
};

// y's derived bound for given float statistics (mean_error, var_error: how
// far those may be from the exact ones; 0 in inference, where they are
// inputs). With scale = gamma / sqrt(var + eps):
//  - rounding: at most 8 roundings along any path (var + eps, sqrt, the
//    division, gamma * ., x - mean or x * scale and mean * scale, the
//    addition of beta or of the shift) over magnitude
//    |scale| (|x| + |mean|) + |beta|;
//  - carried: |scale| dmean + |gamma| |x - mean| |d(1/sqrt(var + eps))|,
//    with |d(1/sqrt(v + eps))| <= dvar / (2 (v - dvar + eps)^(3/2)).
Bounded RefForwardBound(const BatchNormShape& s, const std::vector<float>& x,
                        const std::vector<float>& gamma,
                        const std::vector<float>& beta,
                        const std::vector<double>& mean,
                        const std::vector<double>& var,
                        const std::vector<double>& mean_error,
                        const std::vector<double>& var_error) {
  std::vector<double> xd(x.begin(), x.end());
  Bounded b;
  b.value = RefForward(s, xd, gamma, beta, mean, var);
  b.error.resize(x.size());
  for (int64_t i = 0; i < s.x_size(); ++i) {
    const int64_t c = i / s.spatial % s.c;
    const double eps = s.epsilon;
    const double inv = 1.0 / std::sqrt(var[c] + eps);
    const double scale = std::fabs(gamma[c]) * inv;
    const double low = std::max(var[c] - var_error[c] + eps, eps / 2);
    const double dinv = var_error[c] / (2 * low * std::sqrt(low));
    b.error[i] =
        FloatGamma(8) * (scale * (std::fabs(x[i]) + std::fabs(mean[c])) +
                         std::fabs(beta[c])) +
        scale * mean_error[c] +
        std::fabs(gamma[c]) * (std::fabs(x[i] - mean[c]) + mean_error[c]) * dinv;
  }
  return b;
}

// The backward of the training forward, given its (float) statistics, in
// double, with the derived bound on a float computation:
//   dbeta[c]  = sum dy
//   dgamma[c] = sum dy * (x - mean) * inv
//   dx        = gamma * inv * (dy - dbeta / m - (x - mean) * inv * dgamma / m)
// with inv = 1 / sqrt(var + eps) and m = n * spatial. Rounding: sums of m
// terms and at most 8 more roundings on each path (inv: 3; products,
// the subtraction of the mean, the divisions by m), over the magnitudes
// with |x| + |mean| for |x - mean| (a library may expand the product).
struct RefGrads {
  Bounded dx, dgamma, dbeta;
};

RefGrads RefBackward(const BatchNormShape& s, const std::vector<float>& x,
                     const std::vector<float>& dy,
                     const std::vector<float>& gamma,
                     const std::vector<double>& mean,
                     const std::vector<double>& var) {
  const int64_t m = s.n * s.spatial;
  RefGrads g;
  g.dgamma.value.assign(s.c, 0.0);
  g.dgamma.error.assign(s.c, 0.0);
  g.dbeta.value.assign(s.c, 0.0);
  g.dbeta.error.assign(s.c, 0.0);
  std::vector<double> inv(s.c), dgamma_mag(s.c, 0.0), dbeta_mag(s.c, 0.0);
  for (int64_t c = 0; c < s.c; ++c) {
    inv[c] = 1.0 / std::sqrt(var[c] + double{s.epsilon});
  }
  for (int64_t i = 0; i < s.x_size(); ++i) {
    const int64_t c = i / s.spatial % s.c;
    g.dbeta.value[c] += dy[i];
    dbeta_mag[c] += std::fabs(dy[i]);
    g.dgamma.value[c] += dy[i] * (x[i] - mean[c]) * inv[c];
    dgamma_mag[c] +=
        std::fabs(dy[i]) * (std::fabs(x[i]) + std::fabs(mean[c])) * inv[c];
  }
  for (int64_t c = 0; c < s.c; ++c) {
    g.dbeta.error[c] = FloatGamma(m) * dbeta_mag[c];
    g.dgamma.error[c] = FloatGamma(m + 8) * dgamma_mag[c];
  }
  g.dx.value.resize(x.size());
  g.dx.error.resize(x.size());
  for (int64_t i = 0; i < s.x_size(); ++i) {
    const int64_t c = i / s.spatial % s.c;
    const double centered = (x[i] - mean[c]) * inv[c];
    g.dx.value[i] = gamma[c] * inv[c] *
                    (dy[i] - g.dbeta.value[c] / m -
                     centered * g.dgamma.value[c] / m);
    const double spread = (std::fabs(x[i]) + std::fabs(mean[c])) * inv[c];
    const double mag = std::fabs(gamma[c]) * inv[c] *
                       (std::fabs(dy[i]) + dbeta_mag[c] / m +
                        spread * dgamma_mag[c] / m);
    g.dx.error[i] = FloatGamma(m + 16) * mag;
  }
  return g;
}

void ExpectWithinBound(const std::vector<float>& got, const Bounded& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_LE(std::fabs(got[i] - want.value[i]), want.error[i])
        << what << " element " << i << ": got " << got[i] << ", exact "
        << want.value[i];
  }
}

// The forward's statistics within their bounds.
void ExpectStatsWithinBound(const std::vector<float>& mean,
                            const std::vector<float>& var, const Stats& st,
                            const std::string& what) {
  for (size_t c = 0; c < st.mean.size(); ++c) {
    EXPECT_LE(std::fabs(mean[c] - st.mean[c]), st.mean_error[c])
        << what << " mean of channel " << c << ": got " << mean[c]
        << ", exact " << st.mean[c];
    EXPECT_LE(std::fabs(var[c] - st.var[c]), st.var_error[c])
        << what << " variance of channel " << c << ": got " << var[c]
        << ", exact (biased) " << st.var[c];
  }
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// ---- The reference checked against itself: backward = derivative ---------

// Central differences of L = sum(dy * y(x)) in double, with step h = 1e-4
// on values of magnitude ~1: truncation h^2 |L'''| / 6 ~ 1e-9 and rounding
// ~ 1e-16 |L| / h ~ 1e-11 (|L| ~ m), so 1e-6 (relative to 1 + |gradient|)
// leaves room by orders of magnitude while still catching any wrong term
// (each is O(1)).
TEST(BackendNormTest, ReferenceBackwardMatchesCentralDifferences) {
  for (const Case& k : Cases()) {
    const BatchNormShape& s = k.shape;
    const std::vector<float> x = MakeX(k, 1);
    const std::vector<float> dy = RandomVector(s.x_size(), 2);
    std::vector<float> gamma = RandomVector(s.c, 3, 0.5f, 1.5f);
    std::vector<float> beta = RandomVector(s.c, 4);
    const Stats st = RefStats(s, x);
    const RefGrads g = RefBackward(s, x, dy, gamma, st.mean, st.var);

    auto loss = [&](const std::vector<double>& xd,
                    const std::vector<float>& ga,
                    const std::vector<float>& be) {
      const std::vector<double> y = RefTrainingForward(s, xd, ga, be);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
      return l;
    };
    const double h = 1e-4;
    // A few elements: the first, the last, and some in between (every
    // channel of the first example).
    std::vector<int64_t> elements = {0, s.x_size() - 1, s.x_size() / 2};
    for (int64_t c = 0; c < s.c; ++c) elements.push_back(At(s, 0, c, 0));
    for (int64_t i : elements) {
      std::vector<double> xp = ToDouble(x), xm = ToDouble(x);
      xp[i] += h;
      xm[i] -= h;
      const double fd = (loss(xp, gamma, beta) - loss(xm, gamma, beta)) / (2 * h);
      EXPECT_NEAR(g.dx.value[i], fd, 1e-6 * (1 + std::fabs(fd)))
          << k.name << " dx element " << i;
    }
    // gamma and beta: L is linear in them, so the difference is exact up
    // to rounding; step them as floats (the step actually taken is exact).
    for (int64_t c = 0; c < s.c; ++c) {
      const double hc = 1.0 / 64;  // exact in float at these magnitudes
      std::vector<float> gp = gamma, gm = gamma, bp = beta, bm = beta;
      gp[c] += hc, gm[c] -= hc, bp[c] += hc, bm[c] -= hc;
      const double fd_gamma =
          (loss(ToDouble(x), gp, beta) - loss(ToDouble(x), gm, beta)) / (2 * hc);
      const double fd_beta =
          (loss(ToDouble(x), gamma, bp) - loss(ToDouble(x), gamma, bm)) / (2 * hc);
      EXPECT_NEAR(g.dgamma.value[c], fd_gamma, 1e-9 * (1 + std::fabs(fd_gamma)))
          << k.name << " dgamma " << c;
      EXPECT_NEAR(g.dbeta.value[c], fd_beta, 1e-9 * (1 + std::fabs(fd_beta)))
          << k.name << " dbeta " << c;
    }
  }
}

// ---- The CPU backend --------------------------------------------------------

// What one case gives on a backend that reads host pointers.
struct Outputs {
  std::vector<float> y, mean, var, y_inference, dx, dgamma, dbeta;
};

struct Inputs {
  std::vector<float> x, gamma, beta, dy, moving_mean, moving_var;
};

Inputs MakeInputs(const Case& k) {
  const BatchNormShape& s = k.shape;
  Inputs in;
  in.x = MakeX(k, 11);
  in.gamma = RandomVector(s.c, 12, 0.5f, 1.5f);
  in.beta = RandomVector(s.c, 13);
  in.dy = RandomVector(s.x_size(), 14);
  in.moving_mean = RandomVector(s.c, 15, k.offset - 0.5f, k.offset + 0.5f);
  in.moving_var = RandomVector(s.c, 16, 0.0f, 2.0f);
  if (k.constant_channel >= 0) in.moving_var[k.constant_channel] = 0.0f;
  return in;
}

// Runs the three calls on `b`, whose device pointers are host pointers
// (outputs start as NaN: they must be overwritten).
Outputs RunOnHost(Backend& b, const BatchNormShape& s, const Inputs& in) {
  Outputs o;
  o.y.assign(s.x_size(), kNan);
  o.mean.assign(s.c, kNan);
  o.var.assign(s.c, kNan);
  o.y_inference.assign(s.x_size(), kNan);
  o.dx.assign(s.x_size(), kNan);
  o.dgamma.assign(s.c, kNan);
  o.dbeta.assign(s.c, kNan);
  absl::Status st = b.BatchNormForwardTraining(s, in.x.data(), in.gamma.data(),
                                               in.beta.data(), o.y.data(),
                                               o.mean.data(), o.var.data());
  EXPECT_TRUE(st.ok()) << st;
  st = b.BatchNormForwardInference(s, in.x.data(), in.gamma.data(),
                                   in.beta.data(), in.moving_mean.data(),
                                   in.moving_var.data(), o.y_inference.data());
  EXPECT_TRUE(st.ok()) << st;
  st = b.BatchNormBackward(s, in.x.data(), in.dy.data(), in.gamma.data(),
                           o.mean.data(), o.var.data(), o.dx.data(),
                           o.dgamma.data(), o.dbeta.data());
  EXPECT_TRUE(st.ok()) << st;
  return o;
}

TEST(BackendNormTest, CpuMatchesReferenceWithinDerivedBounds) {
  auto backend = NewCpuBackend();
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.name + " " + k.shape.DebugString());
    const BatchNormShape& s = k.shape;
    const Inputs in = MakeInputs(k);
    const Outputs o = RunOnHost(*backend, s, in);

    // Training: the batch statistics, then y with their errors carried.
    const Stats st = RefStats(s, in.x);
    ExpectStatsWithinBound(o.mean, o.var, st, "training");
    ExpectWithinBound(o.y,
                      RefForwardBound(s, in.x, in.gamma, in.beta, st.mean,
                                      st.var, st.mean_error, st.var_error),
                      "training y");

    // Inference: the given statistics are exact inputs.
    const std::vector<double> zero(s.c, 0.0);
    ExpectWithinBound(o.y_inference,
                      RefForwardBound(s, in.x, in.gamma, in.beta,
                                      ToDouble(in.moving_mean),
                                      ToDouble(in.moving_var), zero, zero),
                      "inference y");

    // Backward, given the statistics the forward wrote.
    const RefGrads g =
        RefBackward(s, in.x, in.dy, in.gamma, ToDouble(o.mean), ToDouble(o.var));
    ExpectWithinBound(o.dx, g.dx, "dx");
    ExpectWithinBound(o.dgamma, g.dgamma, "dgamma");
    ExpectWithinBound(o.dbeta, g.dbeta, "dbeta");

    if (k.constant_channel >= 0) {
      // Variance 0: epsilon keeps y finite, and y is beta (x == mean).
      const int64_t c = k.constant_channel;
      EXPECT_LE(std::fabs(o.var[c]), st.var_error[c]);
      EXPECT_LE(std::fabs(o.y[At(s, 0, c, 0)] - in.beta[c]),
                RefForwardBound(s, in.x, in.gamma, in.beta, st.mean, st.var,
                                st.mean_error, st.var_error)
                    .error[At(s, 0, c, 0)]);
    }
  }
}

// oneDNN's variance is the biased one (divided by n * spatial, not
// n * spatial - 1), as the contract asks: exact on small integers.
TEST(BackendNormTest, TrainingVarianceIsBiased) {
  auto backend = NewCpuBackend();
  const BatchNormShape s = Shape(2, 2, 1);
  // Channel 0: {0, 2} (mean 1, biased variance 1, unbiased 2); channel 1:
  // {1, 4} (mean 2.5, biased 2.25, unbiased 4.5).
  const std::vector<float> x = {0, 1, 2, 4};
  const std::vector<float> gamma = {1, 1}, beta = {0, 0};
  std::vector<float> y(4), mean(2), var(2);
  ASSERT_TRUE(backend
                  ->BatchNormForwardTraining(s, x.data(), gamma.data(),
                                             beta.data(), y.data(),
                                             mean.data(), var.data())
                  .ok());
  EXPECT_EQ(mean, (std::vector<float>{1.0f, 2.5f}));
  EXPECT_EQ(var, (std::vector<float>{1.0f, 2.25f}));
}

TEST(BackendNormTest, FakeDeviceBackendGivesTheCpuResultInItsOwnMemory) {
  std::vector<std::string> violations;
  auto fake = NewFakeDeviceBackend(/*space=*/9, &violations);
  auto cpu = NewCpuBackend();
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.name);
    const BatchNormShape& s = k.shape;
    const Inputs in = MakeInputs(k);
    const Outputs want = RunOnHost(*cpu, s, in);

    std::vector<float*> buffers;
    auto upload = [&](const std::vector<float>& v) {
      float* p = *fake->Allocate(v.size());
      fake->CopyFromHost(v.data(), v.size(), p);
      buffers.push_back(p);
      return p;
    };
    auto download = [&](const float* p, int64_t n) {
      std::vector<float> v(n, kNan);
      EXPECT_TRUE(fake->CopyToHost(p, n, v.data()).ok());
      return v;
    };
    const std::vector<float> xs(s.x_size(), kNan), cs(s.c, kNan);
    float* x = upload(in.x);
    float* gamma = upload(in.gamma);
    float* beta = upload(in.beta);
    float* dy = upload(in.dy);
    float* mm = upload(in.moving_mean);
    float* mv = upload(in.moving_var);
    float* y = upload(xs);
    float* yi = upload(xs);
    float* dx = upload(xs);
    float* mean = upload(cs);
    float* var = upload(cs);
    float* dgamma = upload(cs);
    float* dbeta = upload(cs);
    ASSERT_TRUE(fake->BatchNormForwardTraining(s, x, gamma, beta, y, mean, var).ok());
    ASSERT_TRUE(fake->BatchNormForwardInference(s, x, gamma, beta, mm, mv, yi).ok());
    ASSERT_TRUE(fake->BatchNormBackward(s, x, dy, gamma, mean, var, dx, dgamma,
                                        dbeta)
                    .ok());
    EXPECT_EQ(download(y, s.x_size()), want.y);
    EXPECT_EQ(download(mean, s.c), want.mean);
    EXPECT_EQ(download(var, s.c), want.var);
    EXPECT_EQ(download(yi, s.x_size()), want.y_inference);
    EXPECT_EQ(download(dx, s.x_size()), want.dx);
    EXPECT_EQ(download(dgamma, s.c), want.dgamma);
    EXPECT_EQ(download(dbeta, s.c), want.dbeta);
    EXPECT_TRUE(violations.empty());

    // A host pointer passed to the fake device is a violation.
    ASSERT_TRUE(fake->BatchNormForwardInference(s, in.x.data(), gamma, beta,
                                                mm, mv, yi)
                    .ok());
    EXPECT_EQ(violations.size(), 1u);
    violations.clear();
    for (float* p : buffers) fake->Free(p);
  }
}

TEST(BackendNormTest, BadShapesAreInvalidArgumentNamingTheFieldBeforeTouchingBuffers) {
  std::vector<std::string> violations;
  auto fake = NewFakeDeviceBackend(/*space=*/10, &violations);
  auto cpu = NewCpuBackend();
  struct Bad {
    const char* field;
    BatchNormShape shape;
  };
  const Bad cases[] = {
      {"BatchNormShape.n", Shape(0, 5, 7)},
      {"BatchNormShape.c", Shape(3, -1, 7)},
      {"BatchNormShape.spatial", Shape(3, 5, 0)},
      {"BatchNormShape.epsilon", Shape(3, 5, 7, 0.0f)},
      {"BatchNormShape.epsilon", Shape(3, 5, 7, -1e-3f)},
      {"BatchNormShape.epsilon", Shape(3, 5, 7, kNan)},
      {"BatchNormShape.epsilon",
       Shape(3, 5, 7, std::numeric_limits<float>::infinity())},
  };
  // Null buffers: touching one would crash.
  float* p = nullptr;
  for (Backend* b : {cpu.get(), fake.get()}) {
    for (const Bad& c : cases) {
      for (const absl::Status& st :
           {b->BatchNormForwardTraining(c.shape, p, p, p, p, p, p),
            b->BatchNormForwardInference(c.shape, p, p, p, p, p, p),
            b->BatchNormBackward(c.shape, p, p, p, p, p, p, p, p)}) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument)
            << b->memory_space() << " " << st;
        EXPECT_NE(st.message().find(c.field), std::string::npos)
            << c.field << ": " << st;
      }
    }
  }
  EXPECT_TRUE(violations.empty());
}

TEST(BackendNormTest, PrimitivesAreCachedByShapeAndEpsilon) {
  absl::StatusOr<std::unique_ptr<DnnlKernels>> k = NewDnnlKernels();
  ASSERT_TRUE(k.ok()) << k.status();
  const Case c = Cases()[1];
  BatchNormShape s = c.shape;
  const Inputs in = MakeInputs(c);
  std::vector<float> y1(s.x_size()), y2(s.x_size()), mean(s.c), var(s.c);
  std::vector<float> dx(s.x_size()), dgamma(s.c), dbeta(s.c);
  auto training = [&](const BatchNormShape& shape, std::vector<float>& y) {
    return (*k)->BatchNormForwardTraining(shape, in.x.data(), in.gamma.data(),
                                          in.beta.data(), y.data(),
                                          mean.data(), var.data());
  };
  ASSERT_TRUE(training(s, y1).ok());
  ASSERT_TRUE(training(s, y2).ok());
  EXPECT_EQ((*k)->cached_primitives(), 1);
  EXPECT_EQ(y1, y2);  // the same primitive, the same bits
  ASSERT_TRUE((*k)->BatchNormForwardInference(s, in.x.data(), in.gamma.data(),
                                              in.beta.data(), mean.data(),
                                              var.data(), y2.data())
                  .ok());
  EXPECT_EQ((*k)->cached_primitives(), 2);
  ASSERT_TRUE((*k)->BatchNormBackward(s, in.x.data(), in.dy.data(),
                                      in.gamma.data(), mean.data(), var.data(),
                                      dx.data(), dgamma.data(), dbeta.data())
                  .ok());
  ASSERT_TRUE((*k)->BatchNormBackward(s, in.x.data(), in.dy.data(),
                                      in.gamma.data(), mean.data(), var.data(),
                                      dx.data(), dgamma.data(), dbeta.data())
                  .ok());
  EXPECT_EQ((*k)->cached_primitives(), 3);
  // Another epsilon is another primitive (oneDNN bakes it in).
  s.epsilon = 1e-5f;
  ASSERT_TRUE(training(s, y2).ok());
  EXPECT_EQ((*k)->cached_primitives(), 4);
  EXPECT_NE(y1, y2);
  // Another shape (fewer examples over the same buffers).
  s.n = 2;
  ASSERT_TRUE(training(s, y2).ok());
  EXPECT_EQ((*k)->cached_primitives(), 5);
  // An invalid shape creates nothing.
  s.n = 0;
  EXPECT_EQ(training(s, y2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*k)->cached_primitives(), 5);
}

// ---- Dropout and Mul ---------------------------------------------------------

TEST(BackendDropoutTest, RateZeroKeepsEverything) {
  auto backend = NewCpuBackend();
  const int64_t n = 1000;
  const std::vector<float> x = RandomVector(n, 21);
  std::vector<float> y(n, kNan), mask(n, kNan);
  backend->DropoutForward(n, 0.0f, 7, x.data(), y.data(), mask.data());
  EXPECT_EQ(mask, std::vector<float>(n, 1.0f));
  EXPECT_EQ(y, x);
}

// The dropped count is Binomial(n, rate): within 6 standard deviations
// (sqrt(n rate (1 - rate)) = 158 here) but for a 2e-9 chance, while a
// generator off by 0.5% would be 3 sigma away already.
TEST(BackendDropoutTest, RateHalfDropsAboutHalfAndScalesTheRestExactly) {
  auto backend = NewCpuBackend();
  const int64_t n = 100000;
  const float rate = 0.5f;
  const std::vector<float> x = RandomVector(n, 22);
  std::vector<float> y(n, kNan), mask(n, kNan);
  backend->DropoutForward(n, rate, 42, x.data(), y.data(), mask.data());
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(mask[i], DropoutMaskValue(42, i, rate)) << i;
    if (mask[i] == 0.0f) {
      ++dropped;
      ASSERT_EQ(y[i], 0.0f) << i;
    } else {
      ASSERT_EQ(mask[i], 2.0f) << i;
      ASSERT_EQ(y[i], x[i] / (1.0f - rate)) << i;  // x * 2: exact
    }
  }
  const double sigma = std::sqrt(n * rate * (1.0 - rate));
  EXPECT_LE(std::fabs(dropped - n * rate), 6 * sigma) << dropped;
}

TEST(BackendDropoutTest, OtherRatesScaleByTheMaskValue) {
  auto backend = NewCpuBackend();
  const int64_t n = 10000;
  const float rate = 0.3f;
  const std::vector<float> x = RandomVector(n, 23);
  std::vector<float> y(n, kNan), mask(n, kNan);
  backend->DropoutForward(n, rate, 5, x.data(), y.data(), mask.data());
  const float keep = 1.0f / (1.0f - rate);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(mask[i] == 0.0f || mask[i] == keep) << i << ": " << mask[i];
    ASSERT_EQ(y[i], x[i] * mask[i]) << i;
  }
}

TEST(BackendDropoutTest, TheSeedDecidesTheMask) {
  auto backend = NewCpuBackend();
  const int64_t n = 10000;
  const std::vector<float> x = RandomVector(n, 24);
  std::vector<float> y(n), a(n), b(n), c(n);
  backend->DropoutForward(n, 0.5f, 1, x.data(), y.data(), a.data());
  backend->DropoutForward(n, 0.5f, 1, x.data(), y.data(), b.data());
  backend->DropoutForward(n, 0.5f, 2, x.data(), y.data(), c.data());
  EXPECT_EQ(a, b);
  // Independent masks differ in half the places (5000 +- 50).
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += a[i] != c[i];
  EXPECT_GT(differ, n / 2 - 6 * 50) << differ;
  // A prefix's mask is the longer call's prefix: a function of (seed, i).
  std::vector<float> prefix(100);
  backend->DropoutForward(100, 0.5f, 1, x.data(), y.data(), prefix.data());
  EXPECT_EQ(prefix, std::vector<float>(a.begin(), a.begin() + 100));
}

TEST(BackendDropoutTest, InPlace) {
  auto backend = NewCpuBackend();
  const int64_t n = 1000;
  const std::vector<float> x = RandomVector(n, 25);
  std::vector<float> want(n), mask(n), got = x;
  backend->DropoutForward(n, 0.25f, 3, x.data(), want.data(), mask.data());
  backend->DropoutForward(n, 0.25f, 3, got.data(), got.data(), mask.data());
  EXPECT_EQ(got, want);
}

TEST(BackendDropoutTest, MulIncludingAliasing) {
  auto backend = NewCpuBackend();
  const int64_t n = 1003;
  const std::vector<float> a = RandomVector(n, 26), b = RandomVector(n, 27);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] * b[i];
  std::vector<float> out(n, kNan);
  backend->Mul(n, a.data(), b.data(), out.data());
  EXPECT_EQ(out, want);
  std::vector<float> in_a = a;
  backend->Mul(n, in_a.data(), b.data(), in_a.data());
  EXPECT_EQ(in_a, want);
  std::vector<float> in_b = b;
  backend->Mul(n, a.data(), in_b.data(), in_b.data());
  EXPECT_EQ(in_b, want);
  std::vector<float> square = a;
  backend->Mul(n, square.data(), square.data(), square.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(square[i], a[i] * a[i]) << i;
  backend->Mul(0, nullptr, nullptr, nullptr);  // empty: a no-op
}

TEST(BackendDropoutTest, FakeDeviceBackendGivesTheCpuResult) {
  std::vector<std::string> violations;
  auto fake = NewFakeDeviceBackend(/*space=*/11, &violations);
  auto cpu = NewCpuBackend();
  const int64_t n = 777;
  const std::vector<float> x = RandomVector(n, 28);
  std::vector<float> want_y(n), want_mask(n), want_mul(n);
  cpu->DropoutForward(n, 0.4f, 9, x.data(), want_y.data(), want_mask.data());
  cpu->Mul(n, x.data(), want_mask.data(), want_mul.data());
  float* dx = *fake->Allocate(n);
  float* dy = *fake->Allocate(n);
  float* dmask = *fake->Allocate(n);
  fake->CopyFromHost(x.data(), n, dx);
  fake->DropoutForward(n, 0.4f, 9, dx, dy, dmask);
  std::vector<float> y(n), mask(n), mul(n);
  ASSERT_TRUE(fake->CopyToHost(dy, n, y.data()).ok());
  ASSERT_TRUE(fake->CopyToHost(dmask, n, mask.data()).ok());
  fake->Mul(n, dx, dmask, dy);
  ASSERT_TRUE(fake->CopyToHost(dy, n, mul.data()).ok());
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(mask, want_mask);
  EXPECT_EQ(mul, want_mul);
  EXPECT_TRUE(violations.empty());
  for (float* p : {dx, dy, dmask}) fake->Free(p);
}

}  // namespace
}  // namespace towerps::worker
