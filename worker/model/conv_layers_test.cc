// Conv2D, Pool2D and Flatten on the CPU backend, checked two ways:
//
// 1. Against a double-precision reference written here with direct loops
//    from the definitions in worker/device/conv_shape.h. Every output is a
//    sum of N float products (or quotients) computed in some order, so
//    |computed - exact| <= gamma_N * magnitude, where magnitude is the same
//    sum over absolute values and gamma_N = N u / (1 - N u), u = 2^-24
//    (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1;
//    worker/device/float_bounds_testing.h). N is counted per check.
//
// 2. Central differences of L = sum_i dy_i * y_i (summed in double from the
//    layer's float outputs) against the layer's own gradient. Every layer
//    here is linear (Conv2D in x and in the kernel, average pooling,
//    Flatten) or piecewise linear (max pooling, with inputs spaced more than
//    2h apart so no window changes its winner), so the difference has no
//    truncation error: its only error is the rounding of the two float
//    forwards, E = sum_i |dy_i| gamma_N magnitude_i for each, divided by the
//    step actually taken (fl(v+h) - fl(v-h), computed exactly). The
//    tolerance is that, plus the analytic gradient's own gamma bound.
#include "worker/model/conv_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/device_tensor.h"
#include "worker/device/float_bounds_testing.h"
#include "worker/model/batch.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

// Distinct values spaced 1/16 apart, shuffled: no max-pool window has a
// near-tie, so a step h < 1/32 never changes a winner.
std::vector<float> Spaced(int64_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i - n / 2) / 16.0f;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

DeviceTensor View(Backend& b, std::vector<int64_t> shape, std::vector<float>& v) {
  DeviceTensor d(&b);
  d.ViewHost(std::move(shape), v.data());
  return d;
}

std::vector<float> ToVector(const DeviceTensor& d) {
  return std::vector<float>(d.data(), d.data() + d.num_elements());
}

// An exact result with the magnitude of each element's sum.
struct Ref {
  std::vector<double> value, magnitude;
  explicit Ref(int64_t n) : value(n, 0.0), magnitude(n, 0.0) {}
  void Add(int64_t i, double term) {
    value[i] += term;
    magnitude[i] += std::fabs(term);
  }
};

void ExpectWithin(const std::vector<float>& got, const Ref& ref, int64_t roundings,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.value.size()) << what;
  const double gamma = FloatGamma(roundings);
  int64_t nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - ref.value[i]), gamma * ref.magnitude[i])
        << what << " element " << i << ": got " << got[i] << ", exact " << ref.value[i]
        << ", N = " << roundings;
    if (ref.value[i] != 0) ++nonzero;
  }
  EXPECT_GT(nonzero, 0) << what;
}

// ---- Reference ---------------------------------------------------------------

// Calls f(x index, y index, w index) for every product the convolution makes.
template <typename F>
void ForEachConvTerm(const Conv2DShape& s, F f) {
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t i = 0; i < s.out_h(); ++i)
        for (int64_t j = 0; j < s.out_w(); ++j)
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t u = 0; u < s.r; ++u)
              for (int64_t v = 0; v < s.s; ++v) {
                const int64_t row = i * s.stride_h - s.pad_h + u;
                const int64_t col = j * s.stride_w - s.pad_w + v;
                if (row < 0 || row >= s.h || col < 0 || col >= s.w) continue;
                f(((n * s.c + c) * s.h + row) * s.w + col,
                  ((n * s.k + k) * s.out_h() + i) * s.out_w() + j,
                  ((k * s.c + c) * s.r + u) * s.s + v);
              }
}

Ref ConvForward(const Conv2DShape& s, const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>* b) {
  Ref y(s.y_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    y.Add(yi, static_cast<double>(x[xi]) * w[wi]);
  });
  if (b != nullptr) {
    const int64_t plane = s.out_h() * s.out_w();
    for (int64_t i = 0; i < s.y_size(); ++i) y.Add(i, (*b)[(i / plane) % s.k]);
  }
  return y;
}

Ref ConvDx(const Conv2DShape& s, const std::vector<float>& dy, const std::vector<float>& w) {
  Ref dx(s.x_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    dx.Add(xi, static_cast<double>(dy[yi]) * w[wi]);
  });
  return dx;
}

Ref ConvDw(const Conv2DShape& s, const std::vector<float>& x, const std::vector<float>& dy) {
  Ref dw(s.w_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    dw.Add(wi, static_cast<double>(x[xi]) * dy[yi]);
  });
  return dw;
}

Ref ConvDb(const Conv2DShape& s, const std::vector<float>& dy) {
  Ref db(s.k);
  const int64_t plane = s.out_h() * s.out_w();
  for (int64_t i = 0; i < s.y_size(); ++i) db.Add((i / plane) % s.k, dy[i]);
  return db;
}

// Calls f(x index, y index, pixels in the window) for every in-image pixel of
// every pooling window.
template <typename F>
void ForEachPoolTerm(const Pool2DShape& s, F f) {
  for (int64_t nc = 0; nc < s.n * s.c; ++nc)
    for (int64_t i = 0; i < s.out_h(); ++i)
      for (int64_t j = 0; j < s.out_w(); ++j) {
        const int64_t r0 = std::max<int64_t>(i * s.stride_h - s.pad_h, 0);
        const int64_t r1 = std::min<int64_t>(i * s.stride_h - s.pad_h + s.r, s.h);
        const int64_t c0 = std::max<int64_t>(j * s.stride_w - s.pad_w, 0);
        const int64_t c1 = std::min<int64_t>(j * s.stride_w - s.pad_w + s.s, s.w);
        const int64_t count = (r1 - r0) * (c1 - c0);
        for (int64_t row = r0; row < r1; ++row)
          for (int64_t col = c0; col < c1; ++col)
            f((nc * s.h + row) * s.w + col, (nc * s.out_h() + i) * s.out_w() + j, count);
      }
}

// Max pooling: value and, per output, the input index that wins.
Ref MaxForward(const Pool2DShape& s, const std::vector<float>& x, std::vector<int64_t>* arg) {
  Ref y(s.y_size());
  std::vector<double> best(s.y_size(), -std::numeric_limits<double>::infinity());
  arg->assign(s.y_size(), -1);
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t) {
    if (x[xi] > best[yi]) {
      best[yi] = x[xi];
      (*arg)[yi] = xi;
    }
  });
  for (int64_t i = 0; i < s.y_size(); ++i) y.Add(i, best[i]);
  return y;
}

Ref AvgForward(const Pool2DShape& s, const std::vector<float>& x) {
  Ref y(s.y_size());
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t count) {
    y.Add(yi, static_cast<double>(x[xi]) / count);
  });
  return y;
}

Ref AvgDx(const Pool2DShape& s, const std::vector<float>& dy) {
  Ref dx(s.x_size());
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t count) {
    dx.Add(xi, static_cast<double>(dy[yi]) / count);
  });
  return dx;
}

// Windows of the shape that can overlap one pixel.
int64_t Windows(const Pool2DShape& s) {
  return ((s.r + s.stride_h - 1) / s.stride_h) * ((s.s + s.stride_w - 1) / s.stride_w);
}

// ---- Central differences -----------------------------------------------------

// Checks dL/d(*v) == `analytic` (within `analytic_bound`) by a central
// difference of L = sum dy_i y_i, where `forward` runs the layer and
// `reference` gives the exact outputs with their magnitudes, both at the
// current value of *v, and `roundings` is the forward's N.
void CheckCentralDifference(const std::function<std::vector<float>()>& forward,
                            const std::function<Ref()>& reference,
                            const std::vector<float>& dy, float* v, float h, int64_t roundings,
                            double analytic, double analytic_bound, const std::string& what) {
  const float original = *v;
  double loss[2], error = 0;
  float at[2];
  for (int side = 0; side < 2; ++side) {
    at[side] = side == 0 ? original + h : original - h;
    *v = at[side];
    const std::vector<float> y = forward();
    const Ref ref = reference();
    double sum = 0, abs_sum = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      sum += static_cast<double>(dy[i]) * y[i];
      abs_sum += std::fabs(static_cast<double>(dy[i]) * y[i]);
      error += std::fabs(dy[i]) * FloatGamma(roundings) * ref.magnitude[i];
    }
    // The double sum's own rounding (y.size() terms, u = 2^-53).
    error += abs_sum * y.size() * std::ldexp(1.0, -52);
    loss[side] = sum;
  }
  *v = original;
  const double step = static_cast<double>(at[0]) - at[1];
  const double fd = (loss[0] - loss[1]) / step;
  EXPECT_LE(std::fabs(fd - analytic), error / step + analytic_bound)
      << what << ": central difference " << fd << ", analytic " << analytic;
}

// ---- Conv2D ------------------------------------------------------------------

struct ConvCase {
  ImageDims input;
  Conv2D::Options options;
  int64_t n;
  ImageDims want_output;  // Keras' formula: VALID floor((in-k)/s)+1, SAME ceil(in/s).
};

std::vector<ConvCase> ConvCases() {
  std::vector<ConvCase> cases;
  // Odd 7x5 image, 3 channels, SAME at stride 1.
  cases.push_back({{3, 7, 5}, {4, 3, 3, 1, Padding::kSame, true}, 2, {4, 7, 5}});
  // Non-square kernel, stride 2, VALID, no bias.
  cases.push_back({{2, 7, 5}, {3, 3, 2, 2, Padding::kValid, false}, 3, {3, 3, 2}});
  // Stride 2 with SAME: 7 -> 4 with one pixel of padding on each side.
  cases.push_back({{1, 7, 7}, {2, 3, 3, 2, Padding::kSame, true}, 2, {2, 4, 4}});
  return cases;
}

std::string CaseName(const ConvCase& c) {
  return absl::StrCat(c.input.channels, "x", c.input.height, "x", c.input.width, " k=",
                      c.options.filters, " ", c.options.kernel_h, "x", c.options.kernel_w,
                      " stride ", c.options.stride,
                      c.options.padding == Padding::kSame ? " SAME" : " VALID",
                      c.options.use_bias ? "" : " no bias");
}

// A Conv2D with host parameters, as the Model gives them.
struct ConvFixture {
  explicit ConvFixture(const ConvCase& c) : backend(NewCpuBackend()) {
    auto made = Conv2D::Create(*backend, "conv", c.input, c.options);
    EXPECT_TRUE(made.ok()) << made.status();
    layer = std::move(*made);
    shape = layer->ShapeFor(c.n);
    kernel = RandomVector(shape.w_size(), 2);
    bias = RandomVector(shape.k, 3);
    kernel_grad.assign(kernel.size(), std::numeric_limits<float>::quiet_NaN());
    bias_grad.assign(bias.size(), std::numeric_limits<float>::quiet_NaN());
    layer->params()[0]->ViewHost({shape.k, shape.c, shape.r, shape.s}, kernel.data());
    layer->grads()[0]->ViewHost({shape.k, shape.c, shape.r, shape.s}, kernel_grad.data());
    if (c.options.use_bias) {
      layer->params()[1]->ViewHost({shape.k}, bias.data());
      layer->grads()[1]->ViewHost({shape.k}, bias_grad.data());
    }
    x = RandomVector(shape.x_size(), 4);
    dy = RandomVector(shape.y_size(), 5);
  }
  const std::vector<float>* b() const { return layer->params().size() > 1 ? &bias : nullptr; }
  std::vector<float> Forward() {
    DeviceTensor y(backend.get());
    EXPECT_TRUE(layer->Forward(View(*backend, {shape.n, shape.c * shape.h * shape.w}, x), &y).ok());
    return ToVector(y);
  }
  // Backward over the batch rows [first, first + rows).
  std::vector<float> Backward(int64_t first, int64_t rows, bool accumulate) {
    const int64_t in = shape.c * shape.h * shape.w;
    const int64_t out = shape.k * shape.out_h() * shape.out_w();
    std::vector<float> xs(x.begin() + first * in, x.begin() + (first + rows) * in);
    std::vector<float> dys(dy.begin() + first * out, dy.begin() + (first + rows) * out);
    std::vector<float> ys(rows * out);
    DeviceTensor dx(backend.get());
    const absl::Status st =
        layer->Backward(View(*backend, {rows, in}, xs), View(*backend, {rows, out}, ys),
                        View(*backend, {rows, out}, dys), &dx, accumulate);
    EXPECT_TRUE(st.ok()) << st;
    return ToVector(dx);
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Conv2D> layer;
  Conv2DShape shape;
  std::vector<float> kernel, bias, kernel_grad, bias_grad, x, dy;
};

TEST(Conv2DTest, OutputShapeParamsAndInitializerFollowKeras) {
  for (const ConvCase& c : ConvCases()) {
    ConvFixture f(c);
    EXPECT_EQ(f.layer->output_image(), c.want_output) << CaseName(c);
    EXPECT_EQ(f.layer->OutputDim(c.input.size()), c.want_output.size());
    const int64_t k = c.options.filters, rs = c.options.kernel_h * c.options.kernel_w;
    EXPECT_EQ(f.layer->num_params(),
              k * c.input.channels * rs + (c.options.use_bias ? k : 0)) << CaseName(c);
    const auto specs = f.layer->param_specs();
    EXPECT_EQ(specs[0].name, "kernel");
    EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{k, c.input.channels, c.options.kernel_h,
                                                    c.options.kernel_w}));
    EXPECT_EQ(specs[0].init, Layer::ParamSpec::Init::kGlorotUniform);
    EXPECT_EQ(specs[0].fan_in, c.input.channels * rs);
    EXPECT_EQ(specs[0].fan_out, k * rs);
    if (c.options.use_bias) {
      EXPECT_EQ(specs[1].name, "bias");
      EXPECT_EQ(specs[1].init, Layer::ParamSpec::Init::kZeros);
    }
  }
}

TEST(Conv2DTest, ForwardAndBackwardMatchDoubleReference) {
  for (const ConvCase& c : ConvCases()) {
    ConvFixture f(c);
    const Conv2DShape& s = f.shape;
    ExpectWithin(f.Forward(), ConvForward(s, f.x, f.kernel, f.b()), s.c * s.r * s.s + 1,
                 "forward " + CaseName(c));
    const std::vector<float> dx = f.Backward(0, s.n, /*accumulate=*/false);
    // N: at most k*r*s products reach one input pixel.
    ExpectWithin(dx, ConvDx(s, f.dy, f.kernel), s.k * s.r * s.s, "dx " + CaseName(c));
    // N: one product per output pixel of the batch.
    const int64_t pixels = s.n * s.out_h() * s.out_w();
    ExpectWithin(f.kernel_grad, ConvDw(s, f.x, f.dy), pixels, "dkernel " + CaseName(c));
    if (c.options.use_bias) {
      ExpectWithin(f.bias_grad, ConvDb(s, f.dy), pixels, "dbias " + CaseName(c));
    }
  }
}

TEST(Conv2DTest, AccumulateAddsMicroBatchGradients) {
  for (const ConvCase& c : ConvCases()) {
    ConvFixture f(c);
    const Conv2DShape& s = f.shape;
    // Micro-batches: row 0 overwrites, rows 1.. add. One more rounding (the
    // add) on top of the whole batch's N.
    f.Backward(0, 1, /*accumulate=*/false);
    f.Backward(1, s.n - 1, /*accumulate=*/true);
    const int64_t pixels = s.n * s.out_h() * s.out_w();
    ExpectWithin(f.kernel_grad, ConvDw(s, f.x, f.dy), pixels + 1, "dkernel " + CaseName(c));
    if (c.options.use_bias) {
      ExpectWithin(f.bias_grad, ConvDb(s, f.dy), pixels + 1, "dbias " + CaseName(c));
    }
  }
}

TEST(Conv2DTest, GradientsMatchCentralDifferences) {
  for (const ConvCase& c : ConvCases()) {
    ConvFixture f(c);
    const Conv2DShape& s = f.shape;
    const std::vector<float> dx = f.Backward(0, s.n, false);
    const Ref dx_ref = ConvDx(s, f.dy, f.kernel);
    const Ref dw_ref = ConvDw(s, f.x, f.dy);
    const int64_t pixels = s.n * s.out_h() * s.out_w();
    auto forward = [&f] { return f.Forward(); };
    auto reference = [&f, &s] { return ConvForward(s, f.x, f.kernel, f.b()); };
    const int64_t n_fwd = s.c * s.r * s.s + 1;
    // Linear in each: a large step is exact but for rounding.
    constexpr float kStep = 0.25f;
    for (int64_t i : {int64_t{0}, s.x_size() / 2, s.x_size() - 1}) {
      CheckCentralDifference(forward, reference, f.dy, &f.x[i], kStep, n_fwd, dx[i],
                             FloatGamma(s.k * s.r * s.s) * dx_ref.magnitude[i],
                             absl::StrCat("dx[", i, "] ", CaseName(c)));
    }
    for (int64_t i : {int64_t{0}, s.w_size() / 3, s.w_size() - 1}) {
      CheckCentralDifference(forward, reference, f.dy, &f.kernel[i], kStep, n_fwd,
                             f.kernel_grad[i], FloatGamma(pixels) * dw_ref.magnitude[i],
                             absl::StrCat("dkernel[", i, "] ", CaseName(c)));
    }
    if (c.options.use_bias) {
      const Ref db_ref = ConvDb(s, f.dy);
      CheckCentralDifference(forward, reference, f.dy, &f.bias[s.k - 1], kStep, n_fwd,
                             f.bias_grad[s.k - 1], FloatGamma(pixels) * db_ref.magnitude[s.k - 1],
                             absl::StrCat("dbias ", CaseName(c)));
    }
  }
}

TEST(Conv2DTest, BadOptionsAndInputsAreInvalidArgumentNamingLayerAndField) {
  auto backend = NewCpuBackend();
  auto expect_error = [&](ImageDims in, Conv2D::Options o, const std::string& field) {
    auto made = Conv2D::Create(*backend, "c1", in, o);
    ASSERT_FALSE(made.ok()) << field;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(made.status().message().find("'c1'"), std::string::npos) << made.status();
    EXPECT_NE(made.status().message().find(field), std::string::npos) << made.status();
  };
  expect_error({1, 5, 5}, {0, 3, 3, 1, Padding::kValid, true}, "filters");
  expect_error({1, 5, 5}, {2, 0, 3, 1, Padding::kValid, true}, "kernel_size");
  expect_error({1, 5, 5}, {2, 3, 3, 0, Padding::kValid, true}, "strides");
  expect_error({1, 2, 5}, {2, 3, 3, 1, Padding::kValid, true}, "does not fit");
  // 8 at stride 2 with a 3-kernel needs 1 padding row: uneven.
  expect_error({1, 8, 8}, {2, 3, 3, 2, Padding::kSame, true}, "SAME");

  ConvFixture f({{2, 4, 4}, {2, 3, 3, 1, Padding::kValid, true}, 1, {2, 2, 2}});
  std::vector<float> wrong(2 * 15);
  DeviceTensor y(f.backend.get());
  const absl::Status st = f.layer->Forward(View(*f.backend, {2, 15}, wrong), &y);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Conv2D layer 'conv'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("2x4x4"), std::string::npos) << st;
}

// ---- Pooling and Flatten -----------------------------------------------------

struct PoolCase {
  ImageDims input;
  Pool2D::Options options;
  ImageDims want_output;
};

std::vector<PoolCase> PoolCases(Pool2D::Kind kind) {
  std::vector<PoolCase> cases;
  // Keras' default: 2x2 windows at stride 2 (the last row of 7 dropped).
  cases.push_back({{3, 7, 5}, {kind, 2, 0, Padding::kValid}, {3, 3, 2}});
  // Overlapping 3x3 windows at stride 2 with SAME padding: 7x5 -> 4x3.
  cases.push_back({{2, 7, 5}, {kind, 3, 2, Padding::kSame}, {2, 4, 3}});
  // Stride 1.
  cases.push_back({{2, 5, 5}, {kind, 2, 1, Padding::kValid}, {2, 4, 4}});
  return cases;
}

void CheckPool(const PoolCase& c, int64_t n) {
  auto backend = NewCpuBackend();
  auto made = Pool2D::Create(*backend, "pool", c.input, c.options);
  ASSERT_TRUE(made.ok()) << made.status();
  Pool2D& layer = **made;
  const std::string what = absl::StrCat(layer.TypeName(), " ", c.input.channels, "x",
                                        c.input.height, "x", c.input.width, " pool ",
                                        c.options.pool_size, " stride ", c.options.stride);
  EXPECT_EQ(layer.output_image(), c.want_output) << what;
  EXPECT_EQ(layer.num_params(), 0);
  const Pool2DShape s = layer.ShapeFor(n);
  const bool max = c.options.kind == Pool2D::Kind::kMax;
  std::vector<float> x = max ? Spaced(s.x_size(), 7) : RandomVector(s.x_size(), 7);
  std::vector<float> dy = RandomVector(s.y_size(), 8);
  const int64_t in = c.input.size(), out = c.want_output.size();

  auto forward = [&]() {
    DeviceTensor y(backend.get());
    EXPECT_TRUE(layer.Forward(View(*backend, {n, in}, x), &y).ok());
    return ToVector(y);
  };
  std::vector<int64_t> arg;
  auto reference = [&]() { return max ? MaxForward(s, x, &arg) : AvgForward(s, x); };
  // Max: a copy (no rounding). Avg: r*s terms and the division (or a
  // multiplication by a rounded reciprocal: 2).
  const int64_t n_fwd = max ? 1 : s.r * s.s + 2;
  std::vector<float> y = forward();
  ExpectWithin(y, reference(), n_fwd, "forward " + what);

  // Backward twice: the workspace must not matter (micro-batches run every
  // forward before the backwards), so run another forward in between.
  std::vector<float> other = RandomVector(s.x_size(), 9);
  DeviceTensor scratch(backend.get());
  ASSERT_TRUE(layer.Forward(View(*backend, {n, in}, other), &scratch).ok());
  DeviceTensor dx_t(backend.get());
  const absl::Status st = layer.Backward(View(*backend, {n, in}, x), View(*backend, {n, out}, y),
                                         View(*backend, {n, out}, dy), &dx_t, false);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<float> dx = ToVector(dx_t);
  Ref dx_ref(s.x_size());
  if (max) {
    MaxForward(s, x, &arg);
    for (int64_t i = 0; i < s.y_size(); ++i) dx_ref.Add(arg[i], dy[i]);
  } else {
    dx_ref = AvgDx(s, dy);
  }
  const int64_t n_bwd = Windows(s) + (max ? 0 : 2);
  ExpectWithin(dx, dx_ref, std::max<int64_t>(n_bwd, 1), "dx " + what);

  // Max: steps below half the 1/16 spacing keep every winner.
  const float step = max ? 1.0f / 64 : 0.25f;
  for (int64_t i : {int64_t{0}, s.x_size() / 2, s.x_size() - 1}) {
    CheckCentralDifference(forward, reference, dy, &x[i], step, n_fwd, dx[i],
                           FloatGamma(std::max<int64_t>(n_bwd, 1)) * dx_ref.magnitude[i],
                           absl::StrCat("dx[", i, "] ", what));
  }
}

TEST(Pool2DTest, MaxPoolingMatchesReferenceAndCentralDifferences) {
  for (const PoolCase& c : PoolCases(Pool2D::Kind::kMax)) CheckPool(c, 2);
}

TEST(Pool2DTest, AvgPoolingMatchesReferenceAndCentralDifferences) {
  for (const PoolCase& c : PoolCases(Pool2D::Kind::kAvg)) CheckPool(c, 2);
}

TEST(Pool2DTest, GlobalAvgPoolingMatchesReferenceAndCentralDifferences) {
  Pool2D::Options o;
  o.kind = Pool2D::Kind::kGlobalAvg;
  CheckPool({{3, 7, 5}, o, {3, 1, 1}}, 2);
}

TEST(Pool2DTest, BadOptionsAreInvalidArgumentNamingLayerAndField) {
  auto backend = NewCpuBackend();
  auto pool = Pool2D::Create(*backend, "p1", {1, 5, 5}, {Pool2D::Kind::kMax, 0, 0,
                                                          Padding::kValid});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("'p1'"), std::string::npos);
  EXPECT_NE(pool.status().message().find("pool_size"), std::string::npos);
  pool = Pool2D::Create(*backend, "p2", {1, 1, 5}, {Pool2D::Kind::kAvg, 2, 0, Padding::kValid});
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("does not fit"), std::string::npos) << pool.status();
}

TEST(FlattenTest, IsTheIdentityOnRowsBothWays) {
  auto backend = NewCpuBackend();
  Flatten layer(*backend, "flatten", {2, 3, 5});
  EXPECT_EQ(layer.output_image(), (ImageDims{30, 1, 1}));
  EXPECT_EQ(layer.OutputDim(30), 30);
  std::vector<float> x = RandomVector(60, 1), dy = RandomVector(60, 2);
  DeviceTensor y(backend.get()), dx(backend.get());
  ASSERT_TRUE(layer.Forward(View(*backend, {2, 30}, x), &y).ok());
  EXPECT_EQ(ToVector(y), x);
  ASSERT_TRUE(layer.Backward(View(*backend, {2, 30}, x), y, View(*backend, {2, 30}, dy), &dx,
                             false)
                  .ok());
  EXPECT_EQ(ToVector(dx), dy);
  std::vector<float> wrong(2 * 31);
  EXPECT_EQ(layer.Forward(View(*backend, {2, 31}, wrong), &y).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Model -------------------------------------------------------------------

// BuiltinJob("cnn_small")'s model (common/job_spec.cc).
v1::ModelSpec CnnSmall() {
  v1::ModelSpec m;
  m.set_name("cnn_small");
  m.set_input_dim(784);
  m.mutable_input_shape()->set_channels(1);
  m.mutable_input_shape()->set_height(28);
  m.mutable_input_shape()->set_width(28);
  v1::LayerSpec* l = m.add_layers();
  l->set_type(v1::LayerSpec::CONV2D);
  l->set_filters(32);
  l->set_kernel_size(3);
  l->set_activation(v1::RELU);
  m.add_layers()->set_type(v1::LayerSpec::MAX_POOL2D);
  m.add_layers()->set_type(v1::LayerSpec::FLATTEN);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(64);
  l->set_activation(v1::RELU);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(10);
  m.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  return m;
}

TEST(ConvModelTest, CnnSmallBuildsWithKerasCountsAndShapes) {
  auto backend = NewCpuBackend();
  auto model = Model::Create(CnnSmall(), *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  // Conv2D k*c*r*s + k; pooling 28-2=26 -> 13; Dense in*out + out.
  const int64_t conv = 32 * 1 * 3 * 3 + 32;
  const int64_t dense1 = 32 * 13 * 13 * 64 + 64;
  const int64_t dense2 = 64 * 10 + 10;
  EXPECT_EQ((*model)->num_parameters(), conv + dense1 + dense2);
  const std::string summary = (*model)->Summary();
  EXPECT_NE(summary.find("conv2d (Conv2D)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(None, 32, 26, 26)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("max_pooling2d (MaxPooling2D)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(None, 32, 13, 13)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("flatten (Flatten)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(None, 5408)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("320"), std::string::npos) << summary;
  const auto defs = (*model)->VariableDefs();
  ASSERT_EQ(defs.size(), 6u);
  EXPECT_EQ(defs[0].name(), "conv2d/kernel");
  EXPECT_EQ(defs[0].shape_size(), 4);
  EXPECT_EQ(defs[0].initializer().fan_in(), 9);
  EXPECT_EQ(defs[0].initializer().fan_out(), 32 * 9);
  EXPECT_EQ(defs[1].name(), "conv2d/bias");
  EXPECT_EQ(defs[2].name(), "dense/kernel");
  EXPECT_EQ(defs[2].shape(0), 5408);
}

TEST(ConvModelTest, SgdStepsOnAFixedBatchLowerTheLoss) {
  double last_whole = 0;
  for (int micro_batches : {1, 2}) {
    auto backend = NewCpuBackend();
    auto made = Model::Create(CnnSmall(), *backend);
    ASSERT_TRUE(made.ok()) << made.status();
    Model& model = **made;
    model.set_micro_batches(micro_batches);
    model.InitializeWeights();
    Batch batch;
    batch.features = common::Tensor({16, 784});
    std::mt19937_64 gen(3);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (int64_t i = 0; i < batch.features.num_elements(); ++i) batch.features[i] = pixel(gen);
    for (int i = 0; i < 16; ++i) batch.labels.push_back(i % 10);
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      auto result = model.ComputeGradients(batch);
      ASSERT_TRUE(result.ok()) << result.status();
      if (step == 0) first = result->loss_sum;
      if (step > 0) {
        EXPECT_LT(result->loss_sum, last) << "step " << step;
      }
      last = result->loss_sum;
      const auto weights = model.weights();
      const auto grads = model.gradients();
      for (size_t v = 0; v < weights.size(); ++v) {
        for (int64_t i = 0; i < weights[v]->num_elements(); ++i) {
          (*weights[v])[i] -= 0.05f * (*grads[v])[i];
        }
      }
    }
    // ln(10) per example at the start; 15 small steps take off over 20%.
    EXPECT_LT(last, 0.8 * first) << "micro-batches " << micro_batches << ": first " << first
                                 << ", last " << last;
    // Micro-batches change only the summation order.
    if (micro_batches == 1) {
      last_whole = last;
    } else {
      EXPECT_NEAR(last, last_whole, 1e-4 * last_whole);
    }
  }
}

TEST(ConvModelTest, BadImageSpecsAreInvalidArgumentNamingTheLayer) {
  auto backend = NewCpuBackend();
  auto expect_error = [&](const v1::ModelSpec& spec, const std::string& part) {
    auto model = Model::Create(spec, *backend);
    ASSERT_FALSE(model.ok()) << part;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find(part), std::string::npos) << model.status();
  };
  v1::ModelSpec spec = CnnSmall();
  spec.clear_input_shape();
  expect_error(spec, "input_shape is unset");
  spec = CnnSmall();
  spec.set_input_dim(785);
  expect_error(spec, "input_dim");
  spec = CnnSmall();
  // A CONV2D after the Dense.
  v1::LayerSpec* late = spec.add_layers();
  late->set_type(v1::LayerSpec::CONV2D);
  late->set_name("late_conv");
  late->set_filters(2);
  late->set_kernel_size(1);
  expect_error(spec, "'late_conv'");
  spec = CnnSmall();
  spec.mutable_layers(0)->set_kernel_size(0);
  expect_error(spec, "kernel_size");
  spec = CnnSmall();
  spec.mutable_layers(0)->set_filters(0);
  expect_error(spec, "filters");
  spec = CnnSmall();
  spec.mutable_layers(0)->set_kernel_size(29);
  expect_error(spec, "does not fit");
}

}  // namespace
}  // namespace towerps::worker
