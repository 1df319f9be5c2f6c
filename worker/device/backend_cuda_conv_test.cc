// Convolution, pooling and batch norm on the CUDA backend (cuDNN) against the
// CPU backend (oneDNN's convolutions, its own pooling and batch norm) on the
// same random inputs, and batch norm against a double-precision reference
// written here.
//
// Tolerance, per element: |gpu - want| <= 1e-5 |want| + floor, the relative
// target of the GPU-proof issue plus an absolute floor derived from the
// magnitudes: every output is a sum of N float terms, computed by each
// backend in its own order, and each backend's result is within gamma_N *
// (sum of |terms|) of the exact value (Higham, "Accuracy and Stability of
// Numerical Algorithms", 3.1; gamma_N = N u / (1 - N u), u = 2^-24). So the
// two differ by at most 2 gamma_N times that magnitude, which the CPU backend
// computes here by running the same op on the inputs' absolute values.
// Without the floor, an output that is a sum cancelling to near zero would
// need agreement far below float precision.
//
// Tagged "gpu" in worker/device/BUILD; without CUDA or a GPU the tests skip
// themselves (or fail under TOWERPS_REQUIRE_GPU=1: gpu_test_util.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/gpu_info.h"
#include "worker/device/gpu_test_util.h"

namespace towerps::worker {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr double kRelative = 1e-5;

#define ASSERT_OK(expr)                        \
  do {                                         \
    const absl::Status status_ = (expr);       \
    ASSERT_TRUE(status_.ok()) << status_;      \
  } while (0)

double FloatGamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// Every element: |got - want| <= kRelative |want| + 2 gamma_terms *
// magnitude; no NaN; and not all of `want` zero (a vacuous comparison).
void ExpectAgree(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& magnitude, int64_t terms, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(magnitude.size(), want.size()) << what;
  const double gamma2 = 2 * FloatGamma(terms);
  int reported = 0;
  bool any_nonzero = false;
  for (size_t i = 0; i < want.size() && reported < 5; ++i) {
    any_nonzero |= want[i] != 0.0f;
    const double bound = kRelative * std::fabs(want[i]) + gamma2 * magnitude[i];
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || std::isnan(want[i]) || !(diff <= bound)) {
      ADD_FAILURE() << what << ": element " << i << ": got " << got[i] << ", want " << want[i]
                    << " (|diff| " << diff << " > bound " << bound << ", N = " << terms << ")";
      ++reported;
    }
  }
  EXPECT_TRUE(any_nonzero) << what << ": all zero";
}

void ExpectAgree(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<float>& magnitude, int64_t terms, const std::string& what) {
  ExpectAgree(got, want, std::vector<double>(magnitude.begin(), magnitude.end()), terms, what);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class CudaConvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackendBuilt()) GTEST_SKIP() << "built without CUDA";
    const GpuInfo info = QueryGpus();
    TOWERPS_SKIP_WITHOUT_GPU(info);
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

  float* ToDevice(const std::vector<float>& host) {
    auto p = gpu_->Allocate(host.size());
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return nullptr;
    }
    buffers_.push_back(*p);
    gpu_->CopyFromHost(host.data(), host.size(), *p);
    return *p;
  }

  // An output buffer full of NaNs: outputs must be overwritten, not blended.
  float* Output(int64_t n) { return ToDevice(std::vector<float>(n, kNan)); }

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

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
  std::vector<float*> buffers_;
};

// ---- Convolution -------------------------------------------------------------

struct ConvCase {
  const char* name;
  Conv2DShape shape;
  bool bias;
};

Conv2DShape Conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s,
                 int stride_h, int stride_w, int pad_h, int pad_w) {
  Conv2DShape shape;
  shape.n = n, shape.c = c, shape.h = h, shape.w = w, shape.k = k, shape.r = r, shape.s = s;
  shape.stride_h = stride_h, shape.stride_w = stride_w;
  shape.pad_h = pad_h, shape.pad_w = pad_w;
  return shape;
}

TEST_F(CudaConvTest, ConvolutionMatchesCpu) {
  const ConvCase cases[] = {
      {"3x3 stride 2 pad 1, odd sizes", Conv(3, 5, 7, 5, 4, 3, 3, 2, 2, 1, 1), true},
      {"3x3 stride 1 pad 1", Conv(3, 5, 7, 5, 4, 3, 3, 1, 1, 1, 1), true},
      {"3x3 stride 1 no padding, no bias", Conv(2, 3, 9, 6, 5, 3, 3, 1, 1, 0, 0), false},
      {"1x1", Conv(2, 6, 5, 7, 3, 1, 1, 1, 1, 0, 0), true},
      {"1x1 stride 2 (ResNet shortcut)", Conv(3, 4, 7, 5, 8, 1, 1, 2, 2, 0, 0), true},
      {"5x3 strides 2x1 pads 2x0", Conv(2, 3, 11, 6, 4, 5, 3, 2, 1, 2, 0), true},
      {"7x7 stride 2 pad 3 (ResNet stem), 1 channel", Conv(2, 1, 15, 13, 6, 7, 7, 2, 2, 3, 3),
       true},
  };
  uint64_t seed = 1;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.name, ": ", c.shape.DebugString()));
    const Conv2DShape& s = c.shape;
    ASSERT_OK(s.Validate());
    const auto x = RandomVector(s.x_size(), seed++);
    const auto w = RandomVector(s.w_size(), seed++);
    const auto b = RandomVector(s.k, seed++);
    const auto dy = RandomVector(s.y_size(), seed++);

    // The CPU backend: results, and magnitudes from the absolute values.
    std::vector<float> y(s.y_size()), y_mag(s.y_size());
    ASSERT_OK(cpu_->Conv2DForward(s, x.data(), w.data(), c.bias ? b.data() : nullptr, y.data()));
    ASSERT_OK(cpu_->Conv2DForward(s, Abs(x).data(), Abs(w).data(),
                                  c.bias ? Abs(b).data() : nullptr, y_mag.data()));
    std::vector<float> dx(s.x_size()), dx_mag(s.x_size());
    ASSERT_OK(cpu_->Conv2DBackwardData(s, dy.data(), w.data(), dx.data()));
    ASSERT_OK(cpu_->Conv2DBackwardData(s, Abs(dy).data(), Abs(w).data(), dx_mag.data()));
    std::vector<float> dw(s.w_size()), dw_mag(s.w_size()), db(s.k), db_mag(s.k);
    ASSERT_OK(cpu_->Conv2DBackwardWeights(s, x.data(), dy.data(), dw.data(),
                                          c.bias ? db.data() : nullptr));
    ASSERT_OK(cpu_->Conv2DBackwardWeights(s, Abs(x).data(), Abs(dy).data(), dw_mag.data(),
                                          c.bias ? db_mag.data() : nullptr));

    float* gx = ToDevice(x);
    float* gw = ToDevice(w);
    float* gb = ToDevice(b);
    float* gdy = ToDevice(dy);
    float* gy = Output(s.y_size());
    float* gdx = Output(s.x_size());
    float* gdw = Output(s.w_size());
    float* gdb = Output(s.k);
    ASSERT_OK(gpu_->Conv2DForward(s, gx, gw, c.bias ? gb : nullptr, gy));
    ASSERT_OK(gpu_->Conv2DBackwardData(s, gdy, gw, gdx));
    ASSERT_OK(gpu_->Conv2DBackwardWeights(s, gx, gdy, gdw, c.bias ? gdb : nullptr));

    // Terms per output: c*r*s products (+ the bias); k*r*s products at most
    // (the windows covering an input pixel); n*out_h*out_w products.
    ExpectAgree(ToHost(gy, s.y_size()), y, y_mag, s.c * s.r * s.s + 1, "Conv2DForward y");
    ExpectAgree(ToHost(gdx, s.x_size()), dx, dx_mag, s.k * s.r * s.s, "Conv2DBackwardData dx");
    const int64_t pixels = s.n * s.out_h() * s.out_w();
    ExpectAgree(ToHost(gdw, s.w_size()), dw, dw_mag, pixels, "Conv2DBackwardWeights dw");
    if (c.bias) ExpectAgree(ToHost(gdb, s.k), db, db_mag, pixels, "Conv2DBackwardWeights db");
    FreeAll();
  }
}

TEST_F(CudaConvTest, ConvolutionIsDeterministic) {
  const Conv2DShape s = Conv(4, 8, 12, 10, 6, 3, 3, 1, 1, 1, 1);
  float* gx = ToDevice(RandomVector(s.x_size(), 101));
  float* gw = ToDevice(RandomVector(s.w_size(), 102));
  float* gdy = ToDevice(RandomVector(s.y_size(), 103));
  std::vector<float> first_dx, first_dw;
  for (int run = 0; run < 2; ++run) {
    float* gdx = Output(s.x_size());
    float* gdw = Output(s.w_size());
    float* gdb = Output(s.k);
    ASSERT_OK(gpu_->Conv2DBackwardData(s, gdy, gw, gdx));
    ASSERT_OK(gpu_->Conv2DBackwardWeights(s, gx, gdy, gdw, gdb));
    if (run == 0) {
      first_dx = ToHost(gdx, s.x_size());
      first_dw = ToHost(gdw, s.w_size());
    } else {
      EXPECT_EQ(ToHost(gdx, s.x_size()), first_dx);
      EXPECT_EQ(ToHost(gdw, s.w_size()), first_dw);
    }
  }
}

TEST_F(CudaConvTest, BadShapesAreInvalidArgument) {
  Conv2DShape conv = Conv(1, 1, 3, 3, 1, 5, 5, 1, 1, 0, 0);  // kernel larger than the image
  EXPECT_EQ(gpu_->Conv2DForward(conv, nullptr, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Conv2DBackwardData(conv, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Conv2DBackwardWeights(conv, nullptr, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  Pool2DShape pool;
  pool.n = 1, pool.c = 1, pool.h = 4, pool.w = 4, pool.r = 2, pool.s = 2, pool.stride_h = 0;
  EXPECT_EQ(gpu_->MaxPool2DForward(pool, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->AvgPool2DBackward(pool, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  BatchNormShape bn;
  bn.n = 2, bn.c = 3, bn.spatial = 1, bn.epsilon = 0.0f;
  EXPECT_EQ(
      gpu_->BatchNormForwardTraining(bn, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Nothing was queued: the backend is still fine.
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// ---- Pooling -----------------------------------------------------------------

struct PoolCase {
  const char* name;
  Pool2DShape shape;
};

Pool2DShape Pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t r, int64_t s, int stride_h,
                 int stride_w, int pad_h, int pad_w) {
  Pool2DShape shape;
  shape.n = n, shape.c = c, shape.h = h, shape.w = w, shape.r = r, shape.s = s;
  shape.stride_h = stride_h, shape.stride_w = stride_w;
  shape.pad_h = pad_h, shape.pad_w = pad_w;
  return shape;
}

TEST_F(CudaConvTest, PoolingMatchesCpu) {
  const PoolCase cases[] = {
      {"3x3 stride 2 pad 1 (ResNet stem), odd sizes", Pool(3, 5, 7, 5, 3, 3, 2, 2, 1, 1)},
      {"2x2 stride 2, odd sizes (last row and column unused)", Pool(3, 5, 7, 5, 2, 2, 2, 2, 0, 0)},
      {"3x3 stride 1 pad 1 (overlapping windows)", Pool(2, 3, 6, 7, 3, 3, 1, 1, 1, 1)},
      {"3x2 strides 1x2 pads 1x0", Pool(2, 4, 5, 8, 3, 2, 1, 2, 1, 0)},
      {"global 7x5", Pool(3, 5, 7, 5, 7, 5, 1, 1, 0, 0)},
  };
  uint64_t seed = 1000;
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.name, ": ", c.shape.DebugString()));
    const Pool2DShape& s = c.shape;
    ASSERT_OK(s.Validate());
    // Random floats: no ties in a window, so every library picks the same
    // winner.
    const auto x = RandomVector(s.x_size(), seed++);
    const auto dy = RandomVector(s.y_size(), seed++);
    // Windows covering one input pixel, at most.
    const int64_t cover = CeilDiv(s.r, s.stride_h) * CeilDiv(s.s, s.stride_w);

    // CPU results; magnitudes from |inputs| (max pooling's backward routes
    // |dy| to the same winners through the same workspace).
    std::vector<float> max_y(s.y_size()), ws(s.workspace_size()), max_dx(s.x_size()),
        max_dx_mag(s.x_size());
    ASSERT_OK(cpu_->MaxPool2DForward(s, x.data(), max_y.data(), ws.data()));
    ASSERT_OK(cpu_->MaxPool2DBackward(s, x.data(), max_y.data(), ws.data(), dy.data(),
                                      max_dx.data()));
    ASSERT_OK(cpu_->MaxPool2DBackward(s, x.data(), max_y.data(), ws.data(), Abs(dy).data(),
                                      max_dx_mag.data()));
    std::vector<float> avg_y(s.y_size()), avg_y_mag(s.y_size()), avg_dx(s.x_size()),
        avg_dx_mag(s.x_size());
    ASSERT_OK(cpu_->AvgPool2DForward(s, x.data(), avg_y.data()));
    ASSERT_OK(cpu_->AvgPool2DForward(s, Abs(x).data(), avg_y_mag.data()));
    ASSERT_OK(cpu_->AvgPool2DBackward(s, dy.data(), avg_dx.data()));
    ASSERT_OK(cpu_->AvgPool2DBackward(s, Abs(dy).data(), avg_dx_mag.data()));

    float* gx = ToDevice(x);
    float* gdy = ToDevice(dy);
    float* gws = Output(s.workspace_size());
    float* g_max_y = Output(s.y_size());
    float* g_max_dx = Output(s.x_size());
    float* g_avg_y = Output(s.y_size());
    float* g_avg_dx = Output(s.x_size());
    ASSERT_OK(gpu_->MaxPool2DForward(s, gx, g_max_y, gws));
    ASSERT_OK(gpu_->MaxPool2DBackward(s, gx, g_max_y, gws, gdy, g_max_dx));
    ASSERT_OK(gpu_->AvgPool2DForward(s, gx, g_avg_y));
    ASSERT_OK(gpu_->AvgPool2DBackward(s, gdy, g_avg_dx));

    // A maximum is one of the inputs: exact.
    EXPECT_EQ(ToHost(g_max_y, s.y_size()), max_y) << "MaxPool2DForward y";
    ExpectAgree(ToHost(g_max_dx, s.x_size()), max_dx, max_dx_mag, cover,
                "MaxPool2DBackward dx");
    // r*s terms and a division; `cover` terms each divided.
    ExpectAgree(ToHost(g_avg_y, s.y_size()), avg_y, avg_y_mag, s.r * s.s + 1,
                "AvgPool2DForward y");
    ExpectAgree(ToHost(g_avg_dx, s.x_size()), avg_dx, avg_dx_mag, cover + 1,
                "AvgPool2DBackward dx");
    FreeAll();
  }
}

// ---- Batch normalization -------------------------------------------------------

// The exact (double) results for x [n, c, spatial], and per element the
// magnitude whose 2 gamma_N multiple bounds a float computation's error
// (N = m + 8, m = n * spatial: the sums over m values plus the few
// operations after them). A statistic's error moves every output computed
// from it, so the magnitudes carry the statistics' magnitudes through (to
// first order): mean's is mean|x|; var's is mean(x^2), which also covers a
// library computing E[x^2] - E[x]^2; invstd's relative error is half var's
// over var + epsilon.
struct BatchNormRef {
  std::vector<double> mean, var, y, dx, dgamma, dbeta;                   // exact
  std::vector<double> mean_mag, var_mag, y_mag, dx_mag, dgamma_mag, dbeta_mag;
  std::vector<double> inference_y, inference_y_mag;  // with the exact mean and var
};

BatchNormRef ReferenceBatchNorm(const BatchNormShape& s, const std::vector<float>& x,
                                const std::vector<float>& gamma,
                                const std::vector<float>& beta,
                                const std::vector<float>& dy) {
  const int64_t m = s.n * s.spatial;
  BatchNormRef r;
  for (auto* v : {&r.mean, &r.var, &r.mean_mag, &r.var_mag, &r.dgamma, &r.dbeta, &r.dgamma_mag,
                  &r.dbeta_mag}) {
    v->assign(s.c, 0.0);
  }
  for (auto* v : {&r.y, &r.y_mag, &r.dx, &r.dx_mag, &r.inference_y, &r.inference_y_mag}) {
    v->assign(s.x_size(), 0.0);
  }
  auto index = [&](int64_t i, int64_t c, int64_t p) { return (i * s.c + c) * s.spatial + p; };
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0, abs_sum = 0, sq_sum = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t p = 0; p < s.spatial; ++p) {
        const double v = x[index(i, c, p)];
        sum += v, abs_sum += std::fabs(v), sq_sum += v * v;
      }
    }
    const double mean = sum / m;
    double dev = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t p = 0; p < s.spatial; ++p) {
        const double d = x[index(i, c, p)] - mean;
        dev += d * d;
      }
    }
    const double var = dev / m, invstd = 1 / std::sqrt(var + s.epsilon);
    r.mean[c] = mean, r.var[c] = var;
    r.mean_mag[c] = abs_sum / m, r.var_mag[c] = sq_sum / m;
    // Relative error of invstd per unit of gamma_N.
    const double invstd_rel = r.var_mag[c] / (var + s.epsilon);
    const double g = gamma[c];
    double dbeta = 0, dbeta_mag = 0, dgamma = 0, dgamma_mag = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t p = 0; p < s.spatial; ++p) {
        const int64_t j = index(i, c, p);
        const double xhat = (x[j] - mean) * invstd;
        // xhat's error magnitude: from x - mean, and from invstd.
        const double xhat_mag =
            (std::fabs(x[j]) + r.mean_mag[c]) * invstd + std::fabs(xhat) * invstd_rel;
        r.y[j] = g * xhat + beta[c];
        r.y_mag[j] = std::fabs(g) * xhat_mag + std::fabs(beta[c]);
        r.inference_y[j] = r.y[j];
        r.inference_y_mag[j] =
            std::fabs(g) * (std::fabs(x[j]) + std::fabs(mean)) * invstd * (1 + invstd_rel) +
            std::fabs(beta[c]);
        dbeta += dy[j], dbeta_mag += std::fabs(dy[j]);
        dgamma += dy[j] * xhat, dgamma_mag += std::fabs(dy[j]) * xhat_mag;
      }
    }
    r.dbeta[c] = dbeta, r.dbeta_mag[c] = dbeta_mag;
    r.dgamma[c] = dgamma, r.dgamma_mag[c] = dgamma_mag;
    // dx = gamma invstd / m (m dy - dbeta - xhat dgamma).
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t p = 0; p < s.spatial; ++p) {
        const int64_t j = index(i, c, p);
        const double xhat = (x[j] - mean) * invstd;
        const double xhat_mag =
            (std::fabs(x[j]) + r.mean_mag[c]) * invstd + std::fabs(xhat) * invstd_rel;
        const double inner = m * dy[j] - dbeta - xhat * dgamma;
        r.dx[j] = g * invstd / m * inner;
        const double inner_mag = m * std::fabs(dy[j]) + dbeta_mag +
                                 xhat_mag * std::fabs(dgamma) + std::fabs(xhat) * dgamma_mag;
        r.dx_mag[j] = std::fabs(g) * invstd / m * (inner_mag + std::fabs(inner) * invstd_rel);
      }
    }
  }
  return r;
}

std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

TEST_F(CudaConvTest, BatchNormMatchesReference) {
  struct Case {
    const char* name;
    int64_t n, c, spatial;
    float lo, hi;  // x's range: off-centre, so the mean matters
  };
  const Case cases[] = {
      {"dense rows (spatial 1)", 16, 5, 1, -0.5f, 1.5f},
      {"odd image 7x5", 3, 4, 35, 1.0f, 3.0f},
      {"two examples of one pixel", 2, 3, 1, -1.0f, 1.0f},
      {"one larger image 16x16", 2, 3, 256, -2.0f, 0.5f},
  };
  uint64_t seed = 5000;
  for (const Case& t : cases) {
    BatchNormShape s;
    s.n = t.n, s.c = t.c, s.spatial = t.spatial, s.epsilon = 1e-3f;
    SCOPED_TRACE(absl::StrCat(t.name, ": ", s.DebugString()));
    ASSERT_OK(s.Validate());
    const int64_t m = s.n * s.spatial;
    const auto x = RandomVector(s.x_size(), seed++, t.lo, t.hi);
    const auto gamma = RandomVector(s.c, seed++, 0.5f, 1.5f);
    const auto beta = RandomVector(s.c, seed++);
    const auto dy = RandomVector(s.x_size(), seed++);
    const BatchNormRef ref = ReferenceBatchNorm(s, x, gamma, beta, dy);
    const int64_t terms = m + 8;

    float* gx = ToDevice(x);
    float* g_gamma = ToDevice(gamma);
    float* g_beta = ToDevice(beta);
    float* gdy = ToDevice(dy);
    float* gy = Output(s.x_size());
    float* g_mean = Output(s.c);
    float* g_var = Output(s.c);
    ASSERT_OK(gpu_->BatchNormForwardTraining(s, gx, g_gamma, g_beta, gy, g_mean, g_var));
    const auto y = ToHost(gy, s.x_size());
    const auto mean = ToHost(g_mean, s.c);
    const auto var = ToHost(g_var, s.c);
    ExpectAgree(mean, ToFloat(ref.mean), ref.mean_mag, terms, "training mean");
    // The biased variance (cuDNN's running variance is the unbiased one).
    ExpectAgree(var, ToFloat(ref.var), ref.var_mag, terms, "training var");
    ExpectAgree(y, ToFloat(ref.y), ref.y_mag, terms, "training y");

    float* gdx = Output(s.x_size());
    float* g_dgamma = Output(s.c);
    float* g_dbeta = Output(s.c);
    ASSERT_OK(
        gpu_->BatchNormBackward(s, gx, gdy, g_gamma, g_mean, g_var, gdx, g_dgamma, g_dbeta));
    const auto dx = ToHost(gdx, s.x_size());
    const auto dgamma = ToHost(g_dgamma, s.c);
    const auto dbeta = ToHost(g_dbeta, s.c);
    ExpectAgree(dbeta, ToFloat(ref.dbeta), ref.dbeta_mag, terms, "backward dbeta");
    ExpectAgree(dgamma, ToFloat(ref.dgamma), ref.dgamma_mag, terms, "backward dgamma");
    ExpectAgree(dx, ToFloat(ref.dx), ref.dx_mag, terms, "backward dx");

    // Inference with the exact statistics (rounded to float).
    const auto mean_f = ToFloat(ref.mean), var_f = ToFloat(ref.var);
    float* g_inf_y = Output(s.x_size());
    ASSERT_OK(gpu_->BatchNormForwardInference(s, gx, g_gamma, g_beta, ToDevice(mean_f),
                                              ToDevice(var_f), g_inf_y));
    const auto inf_y = ToHost(g_inf_y, s.x_size());
    ExpectAgree(inf_y, ToFloat(ref.inference_y), ref.inference_y_mag, 16, "inference y");

    // The CPU backend, where it has batch norm: the same outputs within the
    // same bounds (each is within one bound of the exact value).
    std::vector<float> cy(s.x_size()), cmean(s.c), cvar(s.c);
    const absl::Status cpu = cpu_->BatchNormForwardTraining(s, x.data(), gamma.data(),
                                                            beta.data(), cy.data(), cmean.data(),
                                                            cvar.data());
    if (cpu.code() != absl::StatusCode::kUnimplemented) {
      ASSERT_OK(cpu);
      ExpectAgree(mean, cmean, ref.mean_mag, terms, "training mean vs CPU");
      ExpectAgree(var, cvar, ref.var_mag, terms, "training var vs CPU");
      ExpectAgree(y, cy, ref.y_mag, terms, "training y vs CPU");
      std::vector<float> cdx(s.x_size()), cdgamma(s.c), cdbeta(s.c);
      ASSERT_OK(cpu_->BatchNormBackward(s, x.data(), dy.data(), gamma.data(), cmean.data(),
                                        cvar.data(), cdx.data(), cdgamma.data(),
                                        cdbeta.data()));
      ExpectAgree(dbeta, cdbeta, ref.dbeta_mag, terms, "backward dbeta vs CPU");
      ExpectAgree(dgamma, cdgamma, ref.dgamma_mag, terms, "backward dgamma vs CPU");
      ExpectAgree(dx, cdx, ref.dx_mag, terms, "backward dx vs CPU");
      std::vector<float> cinf(s.x_size());
      ASSERT_OK(cpu_->BatchNormForwardInference(s, x.data(), gamma.data(), beta.data(),
                                                mean_f.data(), var_f.data(), cinf.data()));
      ExpectAgree(inf_y, cinf, ref.inference_y_mag, 16, "inference y vs CPU");
    }
    FreeAll();
  }
}

// One value per channel: the biased variance is 0 (cuDNN's unbiased one is
// undefined), so y = beta, and the mean is x.
TEST_F(CudaConvTest, BatchNormOfOneValuePerChannel) {
  BatchNormShape s;
  s.n = 1, s.c = 4, s.spatial = 1, s.epsilon = 1e-3f;
  const auto x = RandomVector(s.c, 77);
  const auto gamma = RandomVector(s.c, 78, 0.5f, 1.5f);
  const auto beta = RandomVector(s.c, 79);
  float* gy = Output(s.c);
  float* g_mean = Output(s.c);
  float* g_var = Output(s.c);
  ASSERT_OK(gpu_->BatchNormForwardTraining(s, ToDevice(x), ToDevice(gamma), ToDevice(beta), gy,
                                           g_mean, g_var));
  EXPECT_EQ(ToHost(g_mean, s.c), x);
  EXPECT_EQ(ToHost(g_var, s.c), std::vector<float>(s.c, 0.0f));
  // y = gamma (x - mean) / sqrt(epsilon) + beta, exactly beta; a library
  // computing x * scale + (beta - mean * scale) rounds terms of that size.
  const auto y = ToHost(gy, s.c);
  for (int64_t c = 0; c < s.c; ++c) {
    const double terms = std::fabs(x[c] * gamma[c]) / std::sqrt(s.epsilon) + std::fabs(beta[c]);
    EXPECT_NEAR(y[c], beta[c], 2 * FloatGamma(4) * terms) << c;
  }
}

}  // namespace
}  // namespace towerps::worker
