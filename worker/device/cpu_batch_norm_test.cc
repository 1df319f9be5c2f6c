#include "worker/device/cpu_batch_norm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/conv_shape.h"

// Accuracy against a double reference with derived bounds, through the CPU
// backend, is backend_norm_test's; here the fixed order the header defines,
// which is what makes the bits independent of the thread count.

namespace towerps::worker {
namespace {

BatchNormShape Shape(int64_t n, int64_t c, int64_t spatial) {
  BatchNormShape s;
  s.n = n, s.c = c, s.spatial = spatial;
  return s;
}

std::vector<float> Random(int64_t size, unsigned seed, float mean) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, 1.0f);
  std::vector<float> v(size);
  for (float& x : v) x = dist(gen);
  return v;
}

// Channel ch's sum of term(index of x) in the header's order, written one
// element at a time.
double DefinedSum(const BatchNormShape& s, int64_t ch,
                  const std::function<float(int64_t)>& term) {
  double total = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t plane = (i * s.c + ch) * s.spatial;
    for (int64_t begin = 0; begin < s.spatial; begin += kCpuBatchNormBlock) {
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = begin; k < s.spatial && k < begin + kCpuBatchNormBlock; ++k) {
        l[(k - begin) % 8] += term(plane + k);
      }
      total += ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
  }
  return total;
}

struct Outputs {
  std::vector<float> y, mean, var, y_inference, dx, dgamma, dbeta;
};

struct Inputs {
  std::vector<float> x, dy, gamma, beta, moving_mean, moving_var;
};

Inputs MakeInputs(const BatchNormShape& s) {
  Inputs in;
  in.x = Random(s.x_size(), 1, 3.0f);  // off centre, as a convolution leaves it
  in.dy = Random(s.x_size(), 2, 0.0f);
  in.gamma = Random(s.c, 3, 1.0f);
  in.beta = Random(s.c, 4, 0.0f);
  in.moving_mean = Random(s.c, 5, 3.0f);
  in.moving_var = Random(s.c, 6, 2.0f);
  for (float& v : in.moving_var) v = std::fabs(v);
  return in;
}

Outputs Normalize(const BatchNormShape& s, const Inputs& in, int threads) {
  Outputs o{std::vector<float>(s.x_size()), std::vector<float>(s.c), std::vector<float>(s.c),
            std::vector<float>(s.x_size()), std::vector<float>(s.x_size()),
            std::vector<float>(s.c),        std::vector<float>(s.c)};
  CpuBatchNormForwardTraining(s, in.x.data(), in.gamma.data(), in.beta.data(), o.y.data(),
                              o.mean.data(), o.var.data(), threads);
  CpuBatchNormForwardInference(s, in.x.data(), in.gamma.data(), in.beta.data(),
                               in.moving_mean.data(), in.moving_var.data(),
                               o.y_inference.data(), threads);
  CpuBatchNormBackward(s, in.x.data(), in.dy.data(), in.gamma.data(), o.mean.data(),
                       o.var.data(), o.dx.data(), o.dgamma.data(), o.dbeta.data(), threads);
  return o;
}

// The outputs as the header defines them, one element at a time.
Outputs Defined(const BatchNormShape& s, const Inputs& in) {
  Outputs o{std::vector<float>(s.x_size()), std::vector<float>(s.c), std::vector<float>(s.c),
            std::vector<float>(s.x_size()), std::vector<float>(s.x_size()),
            std::vector<float>(s.c),        std::vector<float>(s.c)};
  const double count = static_cast<double>(s.n * s.spatial);
  auto inv_std = [&](float var) { return 1.0 / std::sqrt(double{var} + double{s.epsilon}); };
  for (int64_t ch = 0; ch < s.c; ++ch) {
    const float m = static_cast<float>(DefinedSum(s, ch, [&](int64_t i) { return in.x[i]; }) /
                                       count);
    const double squares = DefinedSum(s, ch, [&](int64_t i) {
      const float d = in.x[i] - m;
      return d * d;
    });
    o.mean[ch] = m;
    o.var[ch] = static_cast<float>(squares / count);
    const float scale = static_cast<float>(in.gamma[ch] * inv_std(o.var[ch]));
    const float scale_inf = static_cast<float>(in.gamma[ch] * inv_std(in.moving_var[ch]));
    const double dy_sum = DefinedSum(s, ch, [&](int64_t i) { return in.dy[i]; });
    const double dyd_sum =
        DefinedSum(s, ch, [&](int64_t i) { return in.dy[i] * (in.x[i] - m); });
    const double inv = inv_std(o.var[ch]);
    o.dbeta[ch] = static_cast<float>(dy_sum);
    o.dgamma[ch] = static_cast<float>(dyd_sum * inv);
    const float dy_mean = static_cast<float>(dy_sum / count);
    const float d_scale = static_cast<float>(inv * inv * dyd_sum / count);
    const float dx_scale = static_cast<float>(in.gamma[ch] * inv);
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t k = 0; k < s.spatial; ++k) {
        const int64_t e = (i * s.c + ch) * s.spatial + k;
        o.y[e] = (in.x[e] - m) * scale + in.beta[ch];
        o.y_inference[e] = (in.x[e] - in.moving_mean[ch]) * scale_inf + in.beta[ch];
        o.dx[e] = dx_scale * (in.dy[e] - dy_mean - (in.x[e] - m) * d_scale);
      }
    }
  }
  return o;
}

// The index of the first element whose bits differ, or -1.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

void ExpectSameBits(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(FirstDifference(got.mean, want.mean), -1) << "mean";
  EXPECT_EQ(FirstDifference(got.var, want.var), -1) << "var";
  EXPECT_EQ(FirstDifference(got.y, want.y), -1) << "y";
  EXPECT_EQ(FirstDifference(got.y_inference, want.y_inference), -1) << "inference y";
  EXPECT_EQ(FirstDifference(got.dx, want.dx), -1) << "dx";
  EXPECT_EQ(FirstDifference(got.dgamma, want.dgamma), -1) << "dgamma";
  EXPECT_EQ(FirstDifference(got.dbeta, want.dbeta), -1) << "dbeta";
}

// Planes of one element (a dense layer's features), shorter than the 8
// lanes, with a tail, exactly a block, across blocks.
TEST(CpuBatchNormTest, EveryOutputIsItsDefinitionBitForBit) {
  for (const BatchNormShape& s :
       {Shape(7, 5, 1), Shape(3, 4, 3), Shape(4, 2, 8), Shape(3, 4, 13), Shape(2, 3, 1024),
        Shape(2, 3, 1024 + 13), Shape(1, 2, 3000), Shape(5, 3, 9 * 9)}) {
    SCOPED_TRACE(s.DebugString());
    const Inputs in = MakeInputs(s);
    ExpectSameBits(Normalize(s, in, 1), Defined(s, in));
  }
}

// Shapes large enough to be split (over 2^15 elements), with channel counts
// that do not divide evenly among the threads.
TEST(CpuBatchNormTest, SameBitsAtEveryThreadCount) {
  for (const BatchNormShape& s : {Shape(16, 12, 300), Shape(64, 7, 100), Shape(1024, 48, 1)}) {
    SCOPED_TRACE(s.DebugString());
    const Inputs in = MakeInputs(s);
    const Outputs one = Normalize(s, in, 1);
    ExpectSameBits(one, Defined(s, in));
    for (int threads : {2, 3, 4, 7}) {
      SCOPED_TRACE(threads);
      ExpectSameBits(Normalize(s, in, threads), one);
    }
  }
}

// The float sums restart every block, so their error grows with the block,
// not the plane: a million copies of 0.1f average to 0.1f within the
// roundings of 1024 / 8 = 128 additions in a lane and 3 in the fold
// (gamma(131) |x|), plus the double sum's and the division's (negligible).
// One float sum per lane would drift by far more (each of 131,072 additions
// rounds at up to half an ulp of a total near 13,107, about 5e-4).
TEST(CpuBatchNormTest, ErrorsGrowWithTheBlockNotThePlane) {
  const BatchNormShape s = Shape(1, 1, int64_t{1} << 20);
  const std::vector<float> x(s.x_size(), 0.1f), dy(s.x_size(), 0.1f);
  const float gamma = 1, beta = 0;
  std::vector<float> y(s.x_size()), dx(s.x_size());
  float mean, var, dgamma, dbeta;
  CpuBatchNormForwardTraining(s, x.data(), &gamma, &beta, y.data(), &mean, &var, 1);
  const double u = std::ldexp(1.0, -24);
  const double gamma131 = 131 * u / (1 - 131 * u);
  EXPECT_LE(std::fabs(double{mean} - double{0.1f}), gamma131 * 0.1f + 2 * u * 0.1f);
  // x - mean is then the same small float for every element.
  EXPECT_LE(var, std::pow(gamma131 * 0.1f + 2 * u * 0.1f, 2) * 1.01);
  CpuBatchNormBackward(s, x.data(), dy.data(), &gamma, &mean, &var, dx.data(), &dgamma, &dbeta,
                       1);
  const double exact_dbeta = double{0.1f} * s.x_size();
  EXPECT_LE(std::fabs(dbeta - exact_dbeta), (gamma131 + 2 * u) * exact_dbeta);
}

}  // namespace
}  // namespace towerps::worker
