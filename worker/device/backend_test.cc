#include "worker/device/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cpu_threads.h"

namespace towerps::worker {
namespace {

std::vector<float> RandomVector(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// C = alpha * op(A) op(B) + beta * C in double, straight from the definition.
std::vector<double> ReferenceGemm(bool ta, bool tb, int64_t m, int64_t n,
                                  int64_t k, double alpha,
                                  const std::vector<float>& a,
                                  const std::vector<float>& b, double beta,
                                  const std::vector<float>& c) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      out[i * n + j] = alpha * sum + beta * c[i * n + j];
    }
  }
  return out;
}

TEST(CpuBackendTest, GemmMatchesReferenceForAllTransposes) {
  auto backend = NewCpuBackend();
  const int64_t m = 3, n = 4, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = RandomVector(m * k, 1);
      const auto b = RandomVector(k * n, 2);
      std::vector<float> c = RandomVector(m * n, 3);
      const auto want = ReferenceGemm(ta, tb, m, n, k, 0.5, a, b, 2.0, c);
      backend->Gemm(ta, tb, m, n, k, 0.5f, a.data(), b.data(), 2.0f, c.data());
      for (int64_t i = 0; i < m * n; ++i) {
        EXPECT_NEAR(c[i], want[i], 1e-5) << "ta=" << ta << " tb=" << tb;
      }
    }
  }
}

TEST(CpuBackendTest, GemmSmallExactValues) {
  auto backend = NewCpuBackend();
  // [[1,2],[3,4]] * [[5,6],[7,8]] = [[19,22],[43,50]].
  const float a[] = {1, 2, 3, 4};
  const float b[] = {5, 6, 7, 8};
  float c[4];
  backend->Gemm(false, false, 2, 2, 2, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c[0], 19);
  EXPECT_EQ(c[1], 22);
  EXPECT_EQ(c[2], 43);
  EXPECT_EQ(c[3], 50);
  // A^T * B = [[1,3],[2,4]] * [[5,6],[7,8]] = [[26,30],[38,44]].
  backend->Gemm(true, false, 2, 2, 2, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c[0], 26);
  EXPECT_EQ(c[3], 44);
}

TEST(CpuBackendTest, GemmWithZeroBetaIgnoresNanInOutput) {
  auto backend = NewCpuBackend();
  const float a[] = {1, 2};
  const float b[] = {3, 4};
  float c[1] = {std::numeric_limits<float>::quiet_NaN()};
  backend->Gemm(false, false, 1, 1, 2, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c[0], 11.0f);
}

TEST(CpuBackendTest, GemmWithZeroInnerDimensionScalesOutput) {
  auto backend = NewCpuBackend();
  float c[2] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  backend->Gemm(false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 0.0f, c);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_EQ(c[1], 0.0f);
  float d[2] = {1.0f, 2.0f};
  backend->Gemm(false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 3.0f, d);
  EXPECT_EQ(d[0], 3.0f);
  EXPECT_EQ(d[1], 6.0f);
}

TEST(CpuBackendTest, AddBiasRows) {
  auto backend = NewCpuBackend();
  float x[] = {1, 2, 3, 4, 5, 6};
  const float bias[] = {10, 20, 30};
  backend->AddBiasRows(2, 3, bias, x);
  const float want[] = {11, 22, 33, 14, 25, 36};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x[i], want[i]) << i;
}

TEST(CpuBackendTest, SumRowsGivesColumnSumsAndGrowsItsOnes) {
  auto backend = NewCpuBackend();
  const float x[] = {1, 2, 3, 4, 5, 6};
  float out[3] = {-1, -1, -1};
  backend->SumRows(2, 3, x, out);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], 7);
  EXPECT_EQ(out[2], 9);
  // More rows than before: the ones vector must grow.
  const auto big = RandomVector(7 * 2, 9);
  float big_out[2];
  backend->SumRows(7, 2, big.data(), big_out);
  double s0 = 0, s1 = 0;
  for (int r = 0; r < 7; ++r) {
    s0 += big[r * 2];
    s1 += big[r * 2 + 1];
  }
  EXPECT_NEAR(big_out[0], s0, 1e-5);
  EXPECT_NEAR(big_out[1], s1, 1e-5);
  // Zero rows: zero sums.
  backend->SumRows(0, 3, x, out);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[2], 0);
}

TEST(CpuBackendTest, ReluAndReluGrad) {
  auto backend = NewCpuBackend();
  const float in[] = {-2, -0.0f, 0.5f, 3};
  float out[4];
  backend->Relu(4, in, out);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 0);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], 3);
  const float dy[] = {10, 20, 30, 40};
  float dx[4];
  backend->ReluGrad(4, out, dy, dx);
  EXPECT_EQ(dx[0], 0);
  EXPECT_EQ(dx[1], 0);
  EXPECT_EQ(dx[2], 30);
  EXPECT_EQ(dx[3], 40);
  // In place.
  float inplace[] = {-1, 2};
  backend->Relu(2, inplace, inplace);
  EXPECT_EQ(inplace[0], 0);
  EXPECT_EQ(inplace[1], 2);
}

// Tensors over the split threshold go to the CPU math team in slices; every
// element must still be its own definition, in place too, at any team size
// (a length that no slice boundary divides, NaN and -0 included).
TEST(CpuBackendTest, ReluAndReluGradOnTheTeamMatchTheirDefinition) {
  auto backend = NewCpuBackend();
  const int64_t n = (int64_t{1} << 17) + 37;
  std::vector<float> x = RandomVector(n, 7), dy = RandomVector(n, 8);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[n - 1] = -0.0f;
  std::vector<float> y_want(n), dx_want(n);
  for (int64_t i = 0; i < n; ++i) {
    y_want[i] = std::max(x[i], 0.0f);
    dx_want[i] = y_want[i] > 0.0f ? dy[i] : 0.0f;
  }
  auto same_bits = [&](const std::vector<float>& got, const std::vector<float>& want) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return i;
    }
    return int64_t{-1};
  };
  for (int threads : {1, 2, 3, 7}) {
    SCOPED_TRACE(threads);
    SetCpuMathThreads(threads);
    std::vector<float> y(n, 99.0f), dx(n, 99.0f);
    backend->Relu(n, x.data(), y.data());
    EXPECT_EQ(same_bits(y, y_want), -1);
    backend->ReluGrad(n, y.data(), dy.data(), dx.data());
    EXPECT_EQ(same_bits(dx, dx_want), -1);
    std::vector<float> in_place = x;
    backend->Relu(n, in_place.data(), in_place.data());
    EXPECT_EQ(same_bits(in_place, y_want), -1);
    in_place = dy;
    backend->ReluGrad(n, y.data(), in_place.data(), in_place.data());
    EXPECT_EQ(same_bits(in_place, dx_want), -1);
  }
  SetCpuMathThreads(1);
}

TEST(CpuBackendTest, AxpyAndScale) {
  auto backend = NewCpuBackend();
  const float x[] = {1, 2, 3};
  float y[] = {10, 20, 30};
  backend->Axpy(3, -2.0f, x, y);
  EXPECT_EQ(y[0], 8);
  EXPECT_EQ(y[1], 16);
  EXPECT_EQ(y[2], 24);
  backend->Scale(3, 0.25f, y);
  EXPECT_EQ(y[0], 2);
  EXPECT_EQ(y[1], 4);
  EXPECT_EQ(y[2], 6);
  backend->Scale(0, 5.0f, y);  // No-op.
  EXPECT_EQ(y[0], 2);
}

// Classification over no classes is refused (the CUDA backend answers the
// same; backend_cuda_test), while an empty batch is fine at any width.
TEST(CpuBackendTest, SoftmaxCrossEntropyOverNoClassesIsInvalid) {
  std::unique_ptr<Backend> be = NewCpuBackend();
  const float labels[2] = {-0.5f, -0.25f};
  float pred[1] = {0.0f};
  const auto got =
      be->Loss(LossKind::kSoftmaxCrossEntropy, 2, 0, pred, labels, nullptr, nullptr, 2);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("0 classes"), std::string::npos) << got.status();
  const auto empty = be->Loss(LossKind::kSoftmaxCrossEntropy, 0, 0, nullptr, nullptr, nullptr,
                              nullptr, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->loss_sum, 0.0);
}

}  // namespace
}  // namespace towerps::worker
