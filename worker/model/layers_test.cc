#include "worker/model/layers.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"

namespace towerps::worker {
namespace {

using common::Tensor;

// Host tensors as layer inputs (the CPU backend reads host memory in place).
DeviceTensor View(Backend& b, const Tensor& t) {
  DeviceTensor d(&b);
  d.ViewHost(t.shape(), t.data());
  return d;
}

void ToHost(const DeviceTensor& d, Tensor* t) {
  t->Resize(d.shape());
  for (int64_t i = 0; i < d.num_elements(); ++i) (*t)[i] = d.data()[i];
}

// Layer calls on host tensors: outputs are copied back into `y`/`dx`.
absl::Status Fwd(Layer& layer, const Tensor& x, Tensor* y) {
  DeviceTensor out(&layer.backend());
  absl::Status s = layer.Forward(View(layer.backend(), x), &out);
  if (s.ok()) ToHost(out, y);
  return s;
}

absl::Status Bwd(Layer& layer, const Tensor& x, const Tensor& y, const Tensor& dy,
                 Tensor* dx, bool accumulate = false) {
  Backend& b = layer.backend();
  DeviceTensor d(&b);
  absl::Status s = layer.Backward(View(b, x), View(b, y), View(b, dy),
                                  dx != nullptr ? &d : nullptr, accumulate);
  if (s.ok() && dx != nullptr) ToHost(d, dx);
  return s;
}

// Host storage for a layer's parameters and gradients, as the Model gives.
struct HostParams {
  explicit HostParams(Layer& layer) {
    const auto shapes = layer.param_shapes();
    for (const auto& sh : shapes) {
      values.emplace_back(sh);
      grad_values.emplace_back(sh);
    }
    for (size_t k = 0; k < shapes.size(); ++k) {
      layer.params()[k]->ViewHost(shapes[k], values[k].data());
      layer.grads()[k]->ViewHost(shapes[k], grad_values[k].data());
    }
  }
  Tensor& kernel() { return values[0]; }
  Tensor& bias() { return values[1]; }
  std::vector<Tensor*> params() {
    std::vector<Tensor*> out;
    for (Tensor& t : values) out.push_back(&t);
    return out;
  }
  std::vector<Tensor*> grads() {
    std::vector<Tensor*> out;
    for (Tensor& t : grad_values) out.push_back(&t);
    return out;
  }
  std::vector<Tensor> values, grad_values;
};

void FillRandom(Tensor* t, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t->num_elements(); ++i) (*t)[i] = dist(gen);
}

// L = sum(y * r): a scalar whose gradient w.r.t. y is r.
double Objective(Layer& layer, const Tensor& x, const Tensor& r) {
  Tensor y;
  EXPECT_TRUE(Fwd(layer, x, &y).ok());
  double sum = 0;
  for (int64_t i = 0; i < y.num_elements(); ++i) sum += double{y[i]} * r[i];
  return sum;
}

// Checks `analytic` against central differences of Objective in `wrt` (a
// parameter, or the input itself: `wrt` may be `&x_in`).
void ExpectMatchesFiniteDifferences(Layer& layer, const Tensor& x_in,
                                    const Tensor& r, Tensor* wrt,
                                    const Tensor& analytic, const char* what) {
  ASSERT_EQ(wrt->shape(), analytic.shape()) << what;
  const float eps = 1e-2f;
  for (int64_t i = 0; i < wrt->num_elements(); ++i) {
    const float saved = (*wrt)[i];
    (*wrt)[i] = saved + eps;
    const double plus = Objective(layer, x_in, r);
    (*wrt)[i] = saved - eps;
    const double minus = Objective(layer, x_in, r);
    (*wrt)[i] = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, 1e-2 * std::max(std::fabs(numeric), 1.0))
        << what << "[" << i << "]";
  }
}

TEST(DenseTest, ForwardComputesAffineMap) {
  auto backend = NewCpuBackend();
  Dense dense(*backend, "dense", 3, 2, /*use_bias=*/true);
  HostParams p(dense);
  EXPECT_EQ(dense.TypeName(), "Dense");
  EXPECT_EQ(dense.name(), "dense");
  EXPECT_EQ(dense.OutputDim(3), 2);
  // kernel [[1,2],[3,4],[5,6]], bias [0.5,-1].
  for (int i = 0; i < 6; ++i) p.kernel()[i] = i + 1;
  p.bias()[0] = 0.5f;
  p.bias()[1] = -1.0f;
  Tensor x({2, 3}, {1, 0, -1, 2, 1, 0});
  Tensor y;
  ASSERT_TRUE(Fwd(dense, x, &y).ok());
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 2}));
  // Row 0: [1-5, 2-6] + b = [-3.5, -5]; row 1: [2+3, 4+4] + b = [5.5, 7].
  EXPECT_FLOAT_EQ(y[0], -3.5f);
  EXPECT_FLOAT_EQ(y[1], -5.0f);
  EXPECT_FLOAT_EQ(y[2], 5.5f);
  EXPECT_FLOAT_EQ(y[3], 7.0f);
}

TEST(DenseTest, GradientsMatchFiniteDifferences) {
  auto backend = NewCpuBackend();
  for (bool use_bias : {true, false}) {
    Dense dense(*backend, "d", 4, 3, use_bias);
    HostParams p(dense);
    FillRandom(&p.kernel(), 1);
    if (use_bias) FillRandom(&p.bias(), 2);
    Tensor x({5, 4});
    FillRandom(&x, 3);
    Tensor r({5, 3});
    FillRandom(&r, 4);

    Tensor y, dx;
    ASSERT_TRUE(Fwd(dense, x, &y).ok());
    ASSERT_TRUE(Bwd(dense, x, y, r, &dx).ok());
    const std::vector<Tensor*> grads = p.grads();
    const std::vector<Tensor*> params = p.params();
    ASSERT_EQ(params.size(), use_bias ? 2u : 1u);
    ASSERT_EQ(grads.size(), params.size());
    ExpectMatchesFiniteDifferences(dense, x, r, params[0], *grads[0], "kernel");
    if (use_bias) {
      ExpectMatchesFiniteDifferences(dense, x, r, params[1], *grads[1], "bias");
    }
    // dx: perturb the input itself.
    Tensor x_copy = x;
    ExpectMatchesFiniteDifferences(dense, x_copy, r, &x_copy, dx, "dx");
  }
}

TEST(DenseTest, BackwardOverwritesGradientsAndAllowsNullDx) {
  auto backend = NewCpuBackend();
  Dense dense(*backend, "d", 2, 1, true);
  HostParams p(dense);
  p.kernel()[0] = 1;
  p.kernel()[1] = 1;
  Tensor x({1, 2}, {3, 4});
  Tensor dy({1, 1}, {2});
  Tensor y;
  ASSERT_TRUE(Fwd(dense, x, &y).ok());
  ASSERT_TRUE(Bwd(dense, x, y, dy, nullptr).ok());
  ASSERT_TRUE(Bwd(dense, x, y, dy, nullptr).ok());  // Not accumulated.
  EXPECT_EQ((*p.grads()[0])[0], 6.0f);
  EXPECT_EQ((*p.grads()[0])[1], 8.0f);
  EXPECT_EQ((*p.grads()[1])[0], 2.0f);
}

TEST(DenseTest, ReusesOutputBuffer) {
  auto backend = NewCpuBackend();
  Dense dense(*backend, "d", 3, 4, true);
  HostParams p(dense);
  Tensor x({8, 3});
  DeviceTensor y(backend.get());
  ASSERT_TRUE(dense.Forward(View(*backend, x), &y).ok());
  const float* first = y.data();
  Tensor smaller({5, 3});
  ASSERT_TRUE(dense.Forward(View(*backend, smaller), &y).ok());
  EXPECT_EQ(y.data(), first);
  EXPECT_EQ(y.dim(0), 5);
}

TEST(DenseTest, AccumulateAddsMicroBatchGradients) {
  // Two halves of a batch, accumulated, give the whole batch's gradients.
  auto backend = NewCpuBackend();
  Dense dense(*backend, "d", 4, 3, true);
  HostParams p(dense);
  FillRandom(&p.kernel(), 7);
  FillRandom(&p.bias(), 8);
  Tensor x({6, 4}), dy({6, 3});
  FillRandom(&x, 9);
  FillRandom(&dy, 10);
  Tensor y;
  ASSERT_TRUE(Fwd(dense, x, &y).ok());
  ASSERT_TRUE(Bwd(dense, x, y, dy, nullptr).ok());
  const Tensor whole_k = *p.grads()[0], whole_b = *p.grads()[1];
  for (int half = 0; half < 2; ++half) {
    Tensor xh({3, 4}, std::vector<float>(x.data() + half * 12, x.data() + half * 12 + 12));
    Tensor dyh({3, 3}, std::vector<float>(dy.data() + half * 9, dy.data() + half * 9 + 9));
    Tensor yh;
    ASSERT_TRUE(Fwd(dense, xh, &yh).ok());
    ASSERT_TRUE(Bwd(dense, xh, yh, dyh, nullptr, /*accumulate=*/half > 0).ok());
  }
  for (int64_t i = 0; i < whole_k.num_elements(); ++i) {
    EXPECT_NEAR((*p.grads()[0])[i], whole_k[i], 1e-5) << i;
  }
  for (int64_t i = 0; i < whole_b.num_elements(); ++i) {
    EXPECT_NEAR((*p.grads()[1])[i], whole_b[i], 1e-5) << i;
  }
}

// BackwardInput and BackwardParams are Backward's two halves: in either
// order, with and without accumulation, the same bits (Model::StepEvents
// forms the parameters' gradients after backpropagating through every
// layer).
TEST(DenseTest, BackwardHalvesAreBackwardBitForBit) {
  auto backend = NewCpuBackend();
  for (bool bias : {true, false}) {
    Dense whole(*backend, "d", 37, 19, bias), halves(*backend, "d", 37, 19, bias);
    HostParams pw(whole), ph(halves);
    ASSERT_TRUE(halves.SplitsBackward());
    FillRandom(&pw.kernel(), 3);
    ph.kernel() = pw.kernel();
    if (bias) {
      FillRandom(&pw.bias(), 4);
      ph.bias() = pw.bias();
    }
    for (int pass = 0; pass < 3; ++pass) {
      SCOPED_TRACE(absl::StrCat("bias ", bias, " pass ", pass));
      Tensor x({23, 37}), dy({23, 19}), y;
      FillRandom(&x, 10 + pass);
      FillRandom(&dy, 20 + pass);
      ASSERT_TRUE(Fwd(whole, x, &y).ok());
      const bool accumulate = pass > 0;
      Tensor dx_whole;
      ASSERT_TRUE(Bwd(whole, x, y, dy, &dx_whole, accumulate).ok());
      DeviceTensor dx(backend.get());
      Backend& b = halves.backend();
      if (pass == 1) {  // params first
        ASSERT_TRUE(halves.BackwardParams(View(b, x), View(b, y), View(b, dy), accumulate).ok());
        ASSERT_TRUE(halves.BackwardInput(View(b, x), View(b, y), View(b, dy), &dx).ok());
      } else {
        ASSERT_TRUE(halves.BackwardInput(View(b, x), View(b, y), View(b, dy), &dx).ok());
        ASSERT_TRUE(halves.BackwardParams(View(b, x), View(b, y), View(b, dy), accumulate).ok());
      }
      Tensor dx_halves;
      ToHost(dx, &dx_halves);
      ASSERT_EQ(dx_halves.shape(), dx_whole.shape());
      EXPECT_EQ(0, std::memcmp(dx_halves.data(), dx_whole.data(),
                               dx_whole.num_elements() * sizeof(float)));
      for (size_t k = 0; k < pw.grad_values.size(); ++k) {
        EXPECT_EQ(0, std::memcmp(ph.grad_values[k].data(), pw.grad_values[k].data(),
                                 pw.grad_values[k].num_elements() * sizeof(float)))
            << "gradient " << k;
      }
    }
  }
}

TEST(DenseTest, RejectsWrongInputWidth) {
  auto backend = NewCpuBackend();
  Dense dense(*backend, "hidden", 3, 2, true);
  HostParams p(dense);
  Tensor x({2, 4});
  Tensor y;
  const absl::Status s = Fwd(dense, x, &y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hidden"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2,4]"), std::string::npos) << s;
  Tensor good({2, 3});
  ASSERT_TRUE(Fwd(dense, good, &y).ok());
  Tensor bad_dy({2, 3});
  EXPECT_EQ(Bwd(dense, good, y, bad_dy, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReLUTest, ForwardAndGradientMatchFiniteDifferences) {
  auto backend = NewCpuBackend();
  ReLU relu(*backend, "re_lu");
  EXPECT_EQ(relu.TypeName(), "ReLU");
  EXPECT_EQ(relu.OutputDim(17), 17);
  EXPECT_TRUE(relu.params().empty());
  Tensor x({3, 4});
  FillRandom(&x, 5);
  // Keep inputs away from the kink so finite differences are exact.
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    if (std::fabs(x[i]) < 0.1f) x[i] = x[i] < 0 ? -0.5f : 0.5f;
  }
  Tensor r({3, 4});
  FillRandom(&r, 6);
  Tensor y, dx;
  ASSERT_TRUE(Fwd(relu, x, &y).ok());
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f);
  }
  ASSERT_TRUE(Bwd(relu, x, y, r, &dx).ok());
  Tensor x_copy = x;
  const float eps = 1e-2f;
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    x_copy[i] = x[i] + eps;
    const double plus = Objective(relu, x_copy, r);
    x_copy[i] = x[i] - eps;
    const double minus = Objective(relu, x_copy, r);
    x_copy[i] = x[i];
    EXPECT_NEAR(dx[i], (plus - minus) / (2.0 * eps), 1e-4) << i;
    EXPECT_EQ(dx[i], x[i] > 0 ? r[i] : 0.0f);
  }
}

TEST(ReLUTest, RejectsMismatchedShapes) {
  auto backend = NewCpuBackend();
  ReLU relu(*backend, "r");
  Tensor x({2, 2}), y({2, 2}), dy({2, 3}), dx;
  EXPECT_EQ(Bwd(relu, x, y, dy, &dx).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor rank1({4});
  EXPECT_EQ(Fwd(relu, rank1, &y).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace towerps::worker
