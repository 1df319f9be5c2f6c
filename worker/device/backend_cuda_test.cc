// The CUDA backend against the CPU backend: every op on the same random
// inputs (fixed seeds), copies in and out through the Backend interface.
// Tagged "gpu" in worker/BUILD; without CUDA or without a GPU the GPU tests
// skip themselves (or fail, without a GPU, under TOWERPS_REQUIRE_GPU=1: see
// worker/device/gpu_test_util.h) and only the build-configuration checks run.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/cuda_memory.h"
#include "worker/device/device_manager.h"
#include "worker/device/float_bounds_testing.h"
#include "worker/device/gpu_info.h"
#include "worker/device/gpu_test_util.h"

namespace towerps::worker {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Class indices as floats, as Backend::Loss takes them.
std::vector<float> RandomLabels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, classes - 1);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(gen));
  return v;
}

// ||got - want||_2 / ||want||_2 (the plain norm when want is zero).
double RelativeL2(const std::vector<float>& got,
                  const std::vector<float>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// |got[i] - want[i]| <= rel * scale[i] + abs for every i; NaNs must match.
// Reports the first few mismatches only.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& scale, double rel, double abs,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < want.size() && reported < 5; ++i) {
    bool ok;
    if (std::isnan(want[i]) || std::isnan(got[i])) {
      ok = std::isnan(want[i]) && std::isnan(got[i]);
    } else if (std::isinf(want[i])) {
      ok = got[i] == want[i];
    } else {
      ok = std::fabs(static_cast<double>(got[i]) - want[i]) <=
           rel * scale[i] + abs;
    }
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << ": got " << got[i]
                    << ", want " << want[i];
      ++reported;
    }
  }
}

// Elementwise relative near-equality: |got - want| <= rel * |want| + abs.
void ExpectNearRelative(const std::vector<float>& got,
                        const std::vector<float>& want, double rel,
                        const std::string& what, double abs = 0.0) {
  std::vector<double> scale(want.size());
  for (size_t i = 0; i < want.size(); ++i) scale[i] = std::fabs(want[i]);
  ExpectClose(got, want, scale, rel, abs, what);
}

std::string GemmName(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                     float beta) {
  return "Gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
         " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + " beta=" + std::to_string(beta);
}

// ---- Build configuration (runs everywhere) ---------------------------------

TEST(CudaBackendBuildTest, UnavailableInCpuOnlyBuilds) {
  if (CudaBackendBuilt()) GTEST_SKIP() << "built with CUDA";
  const auto backend = NewCudaBackend(0);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CudaBackendBuildTest, WithoutAGpuCreationFailsCleanly) {
  if (!CudaBackendBuilt()) GTEST_SKIP() << "built without CUDA";
  if (!QueryGpus().devices.empty()) GTEST_SKIP() << "has a GPU";
  const auto backend = NewCudaBackend(0);
  // No driver (cudaErrorInsufficientDriver) or no device (cudaErrorNoDevice).
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
      << backend.status();
}

TEST(CudaBackendBuildTest, NegativeGpuIsInvalid) {
  if (!CudaBackendBuilt()) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(NewCudaBackend(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- On a GPU ---------------------------------------------------------------

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackendBuilt()) GTEST_SKIP() << "built without CUDA";
    const GpuInfo info = QueryGpus();
    TOWERPS_SKIP_WITHOUT_GPU(info);
    gpu_count_ = static_cast<int>(info.devices.size());
    cpu_ = NewCpuBackend();
    auto gpu = NewCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }

  void TearDown() override {
    if (gpu_ == nullptr) return;
    FreeAll();
    const absl::Status status = gpu_->Synchronize();
    EXPECT_TRUE(status.ok()) << status;
  }

  // `n` floats on gpu_, freed by FreeAll (or TearDown).
  float* DeviceBuffer(int64_t n) {
    auto p = gpu_->Allocate(n);
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return nullptr;
    }
    buffers_.push_back(*p);
    return *p;
  }

  // A device copy of `host`.
  float* ToDevice(const std::vector<float>& host) {
    float* p = DeviceBuffer(host.size());
    gpu_->CopyFromHost(host.data(), host.size(), p);
    return p;
  }

  std::vector<float> ToHost(const float* p, int64_t n) {
    std::vector<float> host(n, kNan);
    const absl::Status status = gpu_->CopyToHost(p, n, host.data());
    EXPECT_TRUE(status.ok()) << status;
    return host;
  }

  void FreeAll() {
    for (float* p : buffers_) gpu_->Free(p);
    buffers_.clear();
  }

  int gpu_count_ = 0;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
  std::vector<float*> buffers_;
};

TEST_F(CudaBackendTest, MemorySpaceNamesTheGpu) {
  EXPECT_EQ(gpu_->memory_space(), "cuda:0");
  EXPECT_FALSE(gpu_->host_memory());
}

TEST_F(CudaBackendTest, GemmMatchesCpuForAllTransposes) {
  struct Shape {
    int64_t m, n, k;
  };
  // An MLP layer (batch 256, 784 -> 256), a wide one (batch 10, 4096 ->
  // 4096), odd sizes and the smallest.
  const Shape shapes[] = {
      {256, 256, 784}, {10, 4096, 4096}, {7, 5, 13}, {33, 65, 129}, {1, 1, 1}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    // op(A) is [m, k] and op(B) [k, n] whatever the flags: the same buffers
    // serve all four transpose combinations.
    const auto a = RandomVector(s.m * s.k, seed++);
    const auto b = RandomVector(s.k * s.n, seed++);
    const auto c0 = RandomVector(s.m * s.n, seed++);
    float* da = ToDevice(a);
    float* db = ToDevice(b);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.5f}) {
          std::vector<float> want = c0;
          cpu_->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, a.data(), b.data(), beta,
                     want.data());
          float* dc = ToDevice(c0);
          gpu_->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, da, db, beta, dc);
          const auto got = ToHost(dc, s.m * s.n);
          EXPECT_LE(RelativeL2(got, want), 1e-5)
              << GemmName(ta, tb, s.m, s.n, s.k, beta);
        }
      }
    }
    FreeAll();
  }
}

TEST_F(CudaBackendTest, GemmWithBetaZeroIgnoresNansInC) {
  const int64_t m = 7, n = 5, k = 13;
  const auto a = RandomVector(m * k, 11);
  const auto b = RandomVector(k * n, 12);
  std::vector<float> want(m * n, kNan);
  cpu_->Gemm(false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f,
             want.data());
  float* dc = ToDevice(std::vector<float>(m * n, kNan));
  gpu_->Gemm(false, false, m, n, k, 1.0f, ToDevice(a), ToDevice(b), 0.0f, dc);
  const auto got = ToHost(dc, m * n);
  for (float x : got) ASSERT_FALSE(std::isnan(x));
  EXPECT_LE(RelativeL2(got, want), 1e-5);
}

TEST_F(CudaBackendTest, GemmWithKZeroScalesC) {
  const int64_t m = 7, n = 5;
  // beta == 0: exact zeros even over NaNs.
  float* dc = ToDevice(std::vector<float>(m * n, kNan));
  gpu_->Gemm(false, true, m, n, 0, 1.0f, nullptr, nullptr, 0.0f, dc);
  EXPECT_EQ(ToHost(dc, m * n), std::vector<float>(m * n, 0.0f));
  // beta != 0: C = beta * C.
  const auto c0 = RandomVector(m * n, 13);
  std::vector<float> want = c0;
  cpu_->Gemm(true, false, m, n, 0, 1.0f, nullptr, nullptr, -2.5f, want.data());
  float* dc2 = ToDevice(c0);
  gpu_->Gemm(true, false, m, n, 0, 1.0f, nullptr, nullptr, -2.5f, dc2);
  ExpectNearRelative(ToHost(dc2, m * n), want, 1e-6, "Gemm k=0");
}

TEST_F(CudaBackendTest, GemmWithEmptyOutputIsANoOp) {
  gpu_->Gemm(false, false, 0, 5, 3, 1.0f, nullptr, nullptr, 0.0f, nullptr);
  gpu_->Gemm(true, true, 5, 0, 3, 1.0f, nullptr, nullptr, 1.0f, nullptr);
  const absl::Status status = gpu_->Synchronize();
  EXPECT_TRUE(status.ok()) << status;
}

// The elementwise kernels launch at most 4096 blocks of 256 threads
// (worker/device/cuda_kernels.cu), 1 << 20 threads, and loop over the rest.
constexpr int64_t kElementwiseThreads = int64_t{4096} * 256;

TEST_F(CudaBackendTest, AddBiasRowsMatchesCpu) {
  struct Shape {
    int64_t rows, cols;
  };
  // The last two exceed kElementwiseThreads elements, so their grid-stride
  // loop makes a second pass, whose bias index (i % cols) starts mid-row: two
  // rows wider than a pass's worth of threads, and many narrow rows.
  static_assert(2 * 600000 > kElementwiseThreads);
  static_assert(1100 * 1000 > kElementwiseThreads);
  for (const Shape& s : {Shape{256, 784}, Shape{7, 13}, Shape{1, 1},
                         Shape{2, 600000}, Shape{1100, 1000}}) {
    const auto x0 = RandomVector(s.rows * s.cols, 21);
    const auto bias = RandomVector(s.cols, 22);
    std::vector<float> want = x0;
    cpu_->AddBiasRows(s.rows, s.cols, bias.data(), want.data());
    float* dx = ToDevice(x0);
    gpu_->AddBiasRows(s.rows, s.cols, ToDevice(bias), dx);
    ExpectNearRelative(
        ToHost(dx, s.rows * s.cols), want, 1e-6,
        "AddBiasRows " + std::to_string(s.rows) + "x" + std::to_string(s.cols));
    FreeAll();
  }
}

TEST_F(CudaBackendTest, SumRowsMatchesCpuAndExactSums) {
  struct Shape {
    int64_t rows, cols;
  };
  // SumRows launches at most 4096 blocks of 32 columns each
  // (worker/device/cuda_kernels.cu), 131072 columns a pass: 140003 columns need a
  // second pass, whose last block has 3 columns (140003 = 4375 * 32 + 3).
  static_assert(140003 > 4096 * 32 && 140003 % 32 != 0);
  for (const Shape& s : {Shape{256, 784}, Shape{7, 13}, Shape{4096, 10},
                         Shape{1, 5}, Shape{100, 1}, Shape{0, 5},
                         Shape{3, 140003}}) {
    const std::string what =
        "SumRows " + std::to_string(s.rows) + "x" + std::to_string(s.cols);
    const auto x = RandomVector(s.rows * s.cols, 31);
    std::vector<float> want(s.cols, kNan);
    cpu_->SumRows(s.rows, s.cols, x.data(), want.data());
    // Sums in double, and the sums of magnitudes that bound rounding errors.
    std::vector<float> exact(s.cols);
    std::vector<double> magnitude(s.cols, 0.0);
    for (int64_t c = 0; c < s.cols; ++c) {
      double sum = 0.0;
      for (int64_t r = 0; r < s.rows; ++r) {
        sum += x[r * s.cols + c];
        magnitude[c] += std::fabs(x[r * s.cols + c]);
      }
      exact[c] = static_cast<float>(sum);
    }
    float* dout = ToDevice(std::vector<float>(s.cols, kNan));
    gpu_->SumRows(s.rows, s.cols, s.rows > 0 ? ToDevice(x) : nullptr, dout);
    const auto got = ToHost(dout, s.cols);
    // The GPU accumulates in double: within float rounding of the exact sum.
    ExpectClose(got, exact, magnitude, 1e-6, 0.0, what + " vs exact");
    // The CPU (OpenBLAS sgemv) accumulates in float.
    ExpectClose(got, want, magnitude, 1e-5, 0.0, what + " vs cpu");
    FreeAll();
  }
}

TEST_F(CudaBackendTest, ReluMatchesCpuInAndOutOfPlace) {
  const int64_t n = (int64_t{1} << 20) + 3;
  auto x = RandomVector(n, 41);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = kNan;
  x[3] = std::numeric_limits<float>::infinity();
  x[4] = -std::numeric_limits<float>::infinity();
  std::vector<float> want(n);
  cpu_->Relu(n, x.data(), want.data());
  float* dx = ToDevice(x);
  float* dout = DeviceBuffer(n);
  gpu_->Relu(n, dx, dout);
  ExpectNearRelative(ToHost(dout, n), want, 1e-6, "Relu");
  gpu_->Relu(n, dx, dx);
  ExpectNearRelative(ToHost(dx, n), want, 1e-6, "Relu in place");
}

TEST_F(CudaBackendTest, ReluGradMatchesCpuIncludingAliasing) {
  const int64_t n = (int64_t{1} << 20) + 3;
  std::vector<float> y(n);
  cpu_->Relu(n, RandomVector(n, 51).data(), y.data());  // Half exact zeros.
  const auto dy = RandomVector(n, 52);
  std::vector<float> want(n);
  cpu_->ReluGrad(n, y.data(), dy.data(), want.data());
  float* dyv = ToDevice(y);
  float* ddy = ToDevice(dy);
  float* ddx = DeviceBuffer(n);
  gpu_->ReluGrad(n, dyv, ddy, ddx);
  ExpectNearRelative(ToHost(ddx, n), want, 1e-6, "ReluGrad");
  gpu_->ReluGrad(n, dyv, ddy, ddy);  // dx aliases dy.
  ExpectNearRelative(ToHost(ddy, n), want, 1e-6, "ReluGrad in place");
}

// One float product per element, as on the CPU: bit for bit.
TEST_F(CudaBackendTest, MulMatchesCpuIncludingAliasing) {
  const int64_t n = (int64_t{1} << 20) + 3;
  const auto a = RandomVector(n, 53);
  const auto b = RandomVector(n, 54);
  std::vector<float> want(n);
  cpu_->Mul(n, a.data(), b.data(), want.data());
  float* da = ToDevice(a);
  float* db = ToDevice(b);
  float* dout = DeviceBuffer(n);
  gpu_->Mul(n, da, db, dout);
  EXPECT_EQ(ToHost(dout, n), want) << "Mul";
  gpu_->Mul(n, da, db, da);  // out aliases a
  EXPECT_EQ(ToHost(da, n), want) << "Mul into a";
  float* db2 = ToDevice(a);
  gpu_->Mul(n, db2, db, db);  // out aliases b
  EXPECT_EQ(ToHost(db, n), want) << "Mul into b";
}

// The mask is DropoutMaskValue(seed, i, rate) on both (the same header), so
// mask and output agree bit for bit, in and out of place.
TEST_F(CudaBackendTest, DropoutMatchesCpuBitForBit) {
  const int64_t n = (int64_t{1} << 20) + 3;
  const auto x = RandomVector(n, 55);
  for (float rate : {0.0f, 0.3f, 0.5f}) {
    std::vector<float> want_y(n), want_mask(n);
    cpu_->DropoutForward(n, rate, 1234, x.data(), want_y.data(),
                         want_mask.data());
    float* dx = ToDevice(x);
    float* dy = DeviceBuffer(n);
    float* dmask = DeviceBuffer(n);
    gpu_->DropoutForward(n, rate, 1234, dx, dy, dmask);
    EXPECT_EQ(ToHost(dmask, n), want_mask) << "rate " << rate;
    EXPECT_EQ(ToHost(dy, n), want_y) << "rate " << rate;
    gpu_->DropoutForward(n, rate, 1234, dx, dx, dmask);  // y aliases x
    EXPECT_EQ(ToHost(dx, n), want_y) << "in place, rate " << rate;
    FreeAll();
  }
}

TEST_F(CudaBackendTest, BatchNormChecksTheShapeBeforeAnyBuffer) {
  BatchNormShape s;
  s.n = 0, s.c = 3, s.spatial = 4;
  float* p = nullptr;
  EXPECT_EQ(gpu_->BatchNormForwardTraining(s, p, p, p, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->BatchNormForwardInference(s, p, p, p, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->BatchNormBackward(s, p, p, p, p, p, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, AxpyMatchesCpu) {
  const int64_t n = (int64_t{1} << 20) + 3;
  const float alpha = -0.37f;
  const auto x = RandomVector(n, 61);
  const auto y0 = RandomVector(n, 62);
  std::vector<float> want = y0;
  cpu_->Axpy(n, alpha, x.data(), want.data());
  float* dy = ToDevice(y0);
  gpu_->Axpy(n, alpha, ToDevice(x), dy);
  // OpenBLAS may fuse the multiply-add, the GPU kernel does not: one
  // rounding of alpha * x apart, relative to the terms, not the result.
  std::vector<double> scale(n);
  for (int64_t i = 0; i < n; ++i) {
    scale[i] = std::fabs(y0[i]) + std::fabs(alpha * x[i]);
  }
  ExpectClose(ToHost(dy, n), want, scale, 1e-6, 0.0, "Axpy");
}

TEST_F(CudaBackendTest, ScaleAndZeroMatchCpu) {
  const int64_t n = (int64_t{1} << 20) + 3;
  const auto x0 = RandomVector(n, 71);
  std::vector<float> want = x0;
  cpu_->Scale(n, 3.25f, want.data());
  float* dx = ToDevice(x0);
  gpu_->Scale(n, 3.25f, dx);
  ExpectNearRelative(ToHost(dx, n), want, 1e-6, "Scale");
  float* dz = ToDevice(std::vector<float>(n, kNan));
  gpu_->Zero(n, dz);
  EXPECT_EQ(ToHost(dz, n), std::vector<float>(n, 0.0f));
}

struct LossCase {
  LossKind type;
  int64_t n, d;
  int64_t grad_count;
};

std::string LossName(const LossCase& c) {
  return std::string(LossKindName(c.type)) + " n=" + std::to_string(c.n) +
         " d=" + std::to_string(c.d) +
         " grad_count=" + std::to_string(c.grad_count);
}

TEST_F(CudaBackendTest, LossesMatchCpu) {
  std::vector<LossCase> cases;
  for (LossKind type :
       {LossKind::kSoftmaxCrossEntropy, LossKind::kMse, LossKind::kMae}) {
    cases.push_back({type, 256, 10, 256});
    cases.push_back({type, 256, 10, 1024});  // A micro-batch of 1024.
    cases.push_back({type, 7, 13, 7});
    cases.push_back({type, 1, 1, 1});
    cases.push_back({type, 512, 1000, 512});
    // The loss kernels run a thread per row, at most 4096 blocks of 128
    // (worker/device/cuda_kernels.cu): 524288 rows a pass. 600001 rows make a
    // second pass; 3 columns keep it small (and leave room for the ties).
    static_assert(600001 > 4096 * 128);
    cases.push_back({type, 600001, 3, 600001});
  }
  uint64_t seed = 100;
  for (const LossCase& c : cases) {
    const bool classification = c.type == LossKind::kSoftmaxCrossEntropy;
    auto pred = RandomVector(c.n * c.d, seed++, -5.0f, 5.0f);
    const auto labels = RandomLabels(c.n, c.d, seed++);
    const auto targets = RandomVector(c.n * c.d, seed++, -5.0f, 5.0f);
    if (classification && c.n >= 2 && c.d >= 3) {
      // Ties go to the lowest index: an all-equal row, and a row whose
      // maximum appears twice.
      for (int64_t j = 0; j < c.d; ++j) pred[j] = 0.5f;
      pred[c.d + 1] = 9.0f;
      pred[c.d + 2] = 9.0f;
    }
    if (!classification && c.n * c.d >= 2) {
      pred[0] = targets[0];  // diff == 0: MAE's gradient is 0 there.
    }
    for (bool with_grad : {true, false}) {
      const std::string what =
          LossName(c) + (with_grad ? " with gradient" : " loss only");
      std::vector<float> cpu_grad(c.n * c.d, kNan);
      const auto want =
          cpu_->Loss(c.type, c.n, c.d, pred.data(),
                     classification ? labels.data() : nullptr,
                     classification ? nullptr : targets.data(),
                     with_grad ? cpu_grad.data() : nullptr, c.grad_count);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      float* dgrad = ToDevice(std::vector<float>(c.n * c.d, kNan));
      const auto got = gpu_->Loss(c.type, c.n, c.d, ToDevice(pred),
                                  classification ? ToDevice(labels) : nullptr,
                                  classification ? nullptr : ToDevice(targets),
                                  with_grad ? dgrad : nullptr, c.grad_count);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      EXPECT_NEAR(got->loss_sum, want->loss_sum,
                  1e-6 * std::fabs(want->loss_sum) + 1e-12)
          << what;
      EXPECT_EQ(got->correct, want->correct) << what;
      if (!classification) {
        EXPECT_EQ(got->correct, 0) << what;
      }
      if (with_grad) {
        ExpectNearRelative(ToHost(dgrad, c.n * c.d), cpu_grad, 1e-6,
                           what + " gradient", 1e-12);
      }
      FreeAll();
    }
  }
}

TEST_F(CudaBackendTest, LossOfAnEmptyBatchIsZero) {
  for (LossKind type : {LossKind::kSoftmaxCrossEntropy, LossKind::kMse, LossKind::kMae}) {
    const auto got =
        gpu_->Loss(type, 0, 10, nullptr, nullptr, nullptr, nullptr, 0);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->loss_sum, 0.0);
    EXPECT_EQ(got->correct, 0);
  }
}

// No class to pick. A label in (-1, 0) truncates to 0, so without the check
// the kernel would read row[0] of an empty row.
TEST_F(CudaBackendTest, SoftmaxCrossEntropyOverNoClassesIsInvalidArgument) {
  const int64_t n = 3;
  float* labels = ToDevice({-0.5f, 0.0f, -0.25f});
  float* pred = DeviceBuffer(1);  // Holds no logits: [3, 0].
  for (float* dpred : {static_cast<float*>(nullptr), DeviceBuffer(1)}) {
    const auto got = gpu_->Loss(LossKind::kSoftmaxCrossEntropy, n, 0, pred,
                                labels, nullptr, dpred, n);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
        << got.status();
  }
  // An empty batch is still fine at d == 0, as on the CPU.
  const auto empty = gpu_->Loss(LossKind::kSoftmaxCrossEntropy, 0, 0, nullptr,
                                nullptr, nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->loss_sum, 0.0);
  const absl::Status status = gpu_->Synchronize();
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(CudaBackendTest, UnknownLossKindIsInvalidArgument) {
  const auto got = gpu_->Loss(static_cast<LossKind>(42), 1, 1, nullptr,
                              nullptr, nullptr, nullptr, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), "loss: unknown loss kind 42");
}

TEST_F(CudaBackendTest, LabelOutOfRangeIsInvalidArgumentAndHarmless) {
  const int64_t n = 3, d = 4;
  const auto pred = RandomVector(n * d, 81);
  for (float bad : {4.0f, -1.0f, kNan}) {
    const auto got = gpu_->Loss(LossKind::kSoftmaxCrossEntropy, n, d, ToDevice(pred),
                                ToDevice({0.0f, bad, 2.0f}), nullptr,
                                DeviceBuffer(n * d), n);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
        << got.status();
  }
  // Not a device error: the backend goes on working.
  const absl::Status status = gpu_->Synchronize();
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(CudaBackendTest, CopyFromBetweenBackendsOnOneGpu) {
  auto other = NewCudaBackend(0);
  ASSERT_TRUE(other.ok()) << other.status();
  const int64_t n = 100003;
  const auto data = RandomVector(n, 91);
  float* src = ToDevice(data);
  // Milliseconds of work queued ahead of the Scale whose result is copied
  // (40 GEMMs of 2048^3, 0.7 TFLOP: about 10 ms even on an H200's FP32
  // units), so that a CopyFrom that did not wait for gpu_ would copy src
  // before the Scale ran and fail the comparison, rather than usually win the
  // race against one short kernel.
  const int64_t side = 2048;
  float* scratch_a = DeviceBuffer(side * side);
  float* scratch_c = DeviceBuffer(side * side);
  gpu_->Zero(side * side, scratch_a);
  for (int i = 0; i < 40; ++i) {
    gpu_->Gemm(false, false, side, side, side, 1.0f, scratch_a, scratch_a,
               0.0f, scratch_c);
  }
  gpu_->Scale(n, 2.0f, src);
  std::vector<float> want = data;
  cpu_->Scale(n, 2.0f, want.data());

  auto dst = (*other)->Allocate(n);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_TRUE((*other)->CopyFrom(*gpu_, src, n, *dst).ok());
  std::vector<float> got(n);
  ASSERT_TRUE((*other)->CopyToHost(*dst, n, got.data()).ok());
  EXPECT_EQ(got, want);
  (*other)->Free(*dst);
}

TEST_F(CudaBackendTest, CopyFromBetweenCpuAndGpu) {
  const int64_t n = 4099;
  const auto data = RandomVector(n, 92);
  float* dev = DeviceBuffer(n);
  ASSERT_TRUE(gpu_->CopyFrom(*cpu_, data.data(), n, dev).ok());
  EXPECT_EQ(ToHost(dev, n), data);

  gpu_->Scale(n, -1.0f, dev);
  std::vector<float> back(n);
  ASSERT_TRUE(cpu_->CopyFrom(*gpu_, dev, n, back.data()).ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], -data[i]) << i;
}

TEST_F(CudaBackendTest, CopyFromAnotherGpu) {
  if (gpu_count_ < 2) GTEST_SKIP() << "needs two GPUs";
  auto other = NewCudaBackend(1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->memory_space(), "cuda:1");
  const int64_t n = 1 << 20;
  const auto data = RandomVector(n, 93);
  float* src = ToDevice(data);
  auto dst = (*other)->Allocate(n);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_TRUE((*other)->CopyFrom(*gpu_, src, n, *dst).ok());
  (*other)->Scale(n, 0.5f, *dst);
  float* back = DeviceBuffer(n);
  ASSERT_TRUE(gpu_->CopyFrom(**other, *dst, n, back).ok());
  std::vector<float> want = data;
  cpu_->Scale(n, 0.5f, want.data());
  EXPECT_EQ(ToHost(back, n), want);
  (*other)->Free(*dst);
}

TEST_F(CudaBackendTest, AllocateChargesTheAllocator) {
  auto memory = NewCudaMemoryBackend(0);
  ASSERT_TRUE(memory.ok()) << memory.status();
  Allocator allocator("/job:localhost/replica:0/task:0/device:GPU:0",
                              worker::kMegabyte, std::move(*memory));
  auto backend = NewCudaBackend(0, &allocator);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto p = (*backend)->Allocate(worker::kMegabyte / sizeof(float));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(allocator.bytes_in_use(), worker::kMegabyte);

  const auto q = (*backend)->Allocate(1);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(q.status().message().find("device:GPU:0"), std::string::npos)
      << q.status();

  // The memory works: a round trip through it.
  const auto data = RandomVector(1000, 94);
  (*backend)->CopyFromHost(data.data(), 1000, *p);
  std::vector<float> got(1000);
  ASSERT_TRUE((*backend)->CopyToHost(*p, 1000, got.data()).ok());
  EXPECT_EQ(got, data);
  (*backend)->Free(*p);
  EXPECT_EQ(allocator.bytes_in_use(), 0);
}

TEST_F(CudaBackendTest, AllocatorWithHostMemoryIsRefused) {
  Allocator allocator("/job:localhost/replica:0/task:0/device:GPU:0", 0,
                              NewHostMemoryBackend());
  auto backend = NewCudaBackend(0, &allocator);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const auto p = (*backend)->Allocate(16);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition)
      << p.status();
  EXPECT_EQ(allocator.bytes_in_use(), 0);
}

TEST_F(CudaBackendTest, OversizedGemmIsReportedAtSynchronize) {
  auto backend = NewCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  (*backend)->Gemm(false, false, int64_t{3} << 30, 1, 1, 1.0f, nullptr, nullptr,
                   0.0f, nullptr);
  const absl::Status status = (*backend)->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // Sticky: reported again.
  EXPECT_EQ((*backend)->Synchronize().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, GpuIndexOutOfRangeIsInvalidArgument) {
  const auto backend = NewCudaBackend(gpu_count_);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument)
      << backend.status();
}

// Backends driven by different threads at once (on every GPU, two each):
// each sets its own device and uses its own stream and handle.
TEST_F(CudaBackendTest, BackendsOnSeparateThreads) {
  const int64_t m = 64, n = 128, k = 256;
  const auto a = RandomVector(m * k, 95);
  const auto b = RandomVector(k * n, 96);
  std::vector<float> want(m * n);
  cpu_->Gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, want.data());
  const int threads = 2 * gpu_count_;
  std::vector<double> errors(threads, -1.0);
  std::vector<std::string> failures(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto backend = NewCudaBackend(t % gpu_count_);
      if (!backend.ok()) {
        failures[t] = backend.status().ToString();
        return;
      }
      Backend& g = **backend;
      auto da = g.Allocate(m * k);
      auto db = g.Allocate(k * n);
      auto dc = g.Allocate(m * n);
      if (!da.ok() || !db.ok() || !dc.ok()) {
        failures[t] = "allocation failed";
        return;
      }
      g.CopyFromHost(a.data(), m * k, *da);
      g.CopyFromHost(b.data(), k * n, *db);
      std::vector<float> got(m * n);
      for (int rep = 0; rep < 20; ++rep) {
        g.Gemm(false, true, m, n, k, 1.0f, *da, *db, 0.0f, *dc);
      }
      const absl::Status status = g.CopyToHost(*dc, m * n, got.data());
      if (!status.ok()) failures[t] = status.ToString();
      errors[t] = RelativeL2(got, want);
      g.Free(*da);
      g.Free(*db);
      g.Free(*dc);
    });
  }
  for (auto& w : workers) w.join();
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    EXPECT_GE(errors[t], 0.0) << "thread " << t;
    EXPECT_LE(errors[t], 1e-5) << "thread " << t;
  }
}

}  // namespace
}  // namespace towerps::worker
