// Convolution and pooling on the CPU backend (oneDNN) against a
// double-precision reference written here with direct loops.
//
// Tolerances are derived, not picked: every output is a sum of N products
// (or quotients) of float inputs, computed in some order; whatever the order,
// |computed - exact| <= gamma_N * magnitude, where magnitude is the same sum
// over absolute values and gamma_N = N u / (1 - N u), u = 2^-24 (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1; the same bound as
// worker/model/reference_model.h). N is counted per op below.
//
// The reference's backward loops are checked as the exact adjoints of its
// forward loops (<dy, F x> == <F^T dy, x> in double), so matching the
// reference within the bound checks the backward ops against the forward.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/dnnl_kernels.h"
#include "worker/device/fake_device_backend.h"
#include "worker/device/float_bounds_testing.h"

namespace towerps::worker {
namespace {

// A reference result: exact value and magnitude per element.
struct Ref {
  std::vector<double> value, magnitude;
  explicit Ref(int64_t n) : value(n, 0.0), magnitude(n, 0.0) {}
  void Add(int64_t i, double term) {
    value[i] += term;
    magnitude[i] += std::fabs(term);
  }
};

// Every element of `got` within gamma_roundings * magnitude of the exact
// value, and the result not trivially zero.
void ExpectWithinBound(const std::vector<float>& got, const Ref& ref,
                       int64_t roundings, const std::string& what) {
  ASSERT_EQ(got.size(), ref.value.size()) << what;
  const double gamma = FloatGamma(roundings);
  int64_t nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = gamma * ref.magnitude[i];
    ASSERT_LE(std::fabs(got[i] - ref.value[i]), bound)
        << what << " element " << i << ": got " << got[i] << ", exact "
        << ref.value[i] << ", N = " << roundings;
    if (ref.value[i] != 0) ++nonzero;
  }
  EXPECT_GT(nonzero, 0) << what;
}

double Dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- The reference: direct loops from the definitions in conv_shape.h ----

// Calls f(x index, y index, w index) for every (input pixel, output pixel,
// weight) triple that the convolution multiplies, padding skipped.
template <typename F>
void ForEachConvTerm(const Conv2DShape& s, F f) {
  const int64_t oh = s.out_h(), ow = s.out_w();
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j)
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t u = 0; u < s.r; ++u)
              for (int64_t v = 0; v < s.s; ++v) {
                const int64_t hi = i * s.stride_h - s.pad_h + u;
                const int64_t wi = j * s.stride_w - s.pad_w + v;
                if (hi < 0 || hi >= s.h || wi < 0 || wi >= s.w) continue;
                f(((n * s.c + c) * s.h + hi) * s.w + wi,
                  ((n * s.k + k) * oh + i) * ow + j,
                  ((k * s.c + c) * s.r + u) * s.s + v);
              }
}

Ref RefConvForward(const Conv2DShape& s, const std::vector<float>& x,
                   const std::vector<float>& w, const std::vector<float>* b) {
  Ref y(s.y_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    y.Add(yi, double{x[xi]} * w[wi]);
  });
  if (b != nullptr) {
    const int64_t plane = s.out_h() * s.out_w();
    for (int64_t i = 0; i < s.y_size(); ++i) y.Add(i, (*b)[i / plane % s.k]);
  }
  return y;
}

Ref RefConvBackwardData(const Conv2DShape& s, const std::vector<float>& dy,
                        const std::vector<float>& w) {
  Ref dx(s.x_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    dx.Add(xi, double{dy[yi]} * w[wi]);
  });
  return dx;
}

Ref RefConvBackwardWeights(const Conv2DShape& s, const std::vector<float>& x,
                           const std::vector<float>& dy) {
  Ref dw(s.w_size());
  ForEachConvTerm(s, [&](int64_t xi, int64_t yi, int64_t wi) {
    dw.Add(wi, double{dy[yi]} * x[xi]);
  });
  return dw;
}

Ref RefBiasGrad(const Conv2DShape& s, const std::vector<float>& dy) {
  Ref db(s.k);
  const int64_t plane = s.out_h() * s.out_w();
  for (int64_t i = 0; i < s.y_size(); ++i) db.Add(i / plane % s.k, dy[i]);
  return db;
}

// Calls f(x index, y index, pixels in the window) for every input pixel of
// every pooling window (padding skipped).
template <typename F>
void ForEachPoolTerm(const Pool2DShape& s, F f) {
  const int64_t oh = s.out_h(), ow = s.out_w();
  for (int64_t nc = 0; nc < s.n * s.c; ++nc)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t h0 = std::max<int64_t>(0, i * s.stride_h - s.pad_h);
        const int64_t h1 = std::min<int64_t>(s.h, i * s.stride_h - s.pad_h + s.r);
        const int64_t w0 = std::max<int64_t>(0, j * s.stride_w - s.pad_w);
        const int64_t w1 = std::min<int64_t>(s.w, j * s.stride_w - s.pad_w + s.s);
        const int64_t count = (h1 - h0) * (w1 - w0);
        for (int64_t hi = h0; hi < h1; ++hi)
          for (int64_t wi = w0; wi < w1; ++wi)
            f((nc * s.h + hi) * s.w + wi, (nc * oh + i) * ow + j, count);
      }
}

// The max of each window and where it is (the first maximum).
std::vector<int64_t> RefArgmax(const Pool2DShape& s,
                               const std::vector<float>& x) {
  std::vector<int64_t> arg(s.y_size(), -1);
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t) {
    if (arg[yi] < 0 || x[xi] > x[arg[yi]]) arg[yi] = xi;
  });
  return arg;
}

Ref RefAvgForward(const Pool2DShape& s, const std::vector<float>& x) {
  Ref y(s.y_size());
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t count) {
    y.Add(yi, double{x[xi]} / count);
  });
  return y;
}

Ref RefAvgBackward(const Pool2DShape& s, const std::vector<float>& dy) {
  Ref dx(s.x_size());
  ForEachPoolTerm(s, [&](int64_t xi, int64_t yi, int64_t count) {
    dx.Add(xi, double{dy[yi]} / count);
  });
  return dx;
}

// ---- The reference checked against itself: backward = adjoint ----------

// |<dy, F x> - <F^T dy, x>| within double rounding of the two dot products'
// magnitudes (1e-12 relative: they are sums of a few thousand terms).
void ExpectAdjoint(double lhs, double rhs, double magnitude,
                   const std::string& what) {
  EXPECT_LE(std::fabs(lhs - rhs), 1e-12 * magnitude) << what;
}

double AbsDot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::fabs(a[i] * b[i]);
  return s;
}

// ---- Shapes ----------------------------------------------------------------

Conv2DShape Conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                 int64_t r, int64_t s, int sh, int sw, int ph, int pw) {
  Conv2DShape x;
  x.n = n, x.c = c, x.h = h, x.w = w, x.k = k, x.r = r, x.s = s;
  x.stride_h = sh, x.stride_w = sw, x.pad_h = ph, x.pad_w = pw;
  return x;
}

Pool2DShape Pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t r,
                 int64_t s, int sh, int sw, int ph, int pw) {
  Pool2DShape x;
  x.n = n, x.c = c, x.h = h, x.w = w, x.r = r, x.s = s;
  x.stride_h = sh, x.stride_w = sw, x.pad_h = ph, x.pad_w = pw;
  return x;
}

const std::vector<Conv2DShape>& ConvShapes() {
  static const auto* shapes = new std::vector<Conv2DShape>{
      Conv(3, 1, 7, 5, 2, 3, 3, 1, 1, 0, 0),  // 1 channel, valid
      Conv(3, 1, 7, 5, 4, 3, 3, 1, 1, 1, 1),  // same padding
      Conv(3, 4, 7, 5, 3, 3, 3, 2, 2, 1, 1),  // stride 2, padding 1
      Conv(3, 4, 7, 5, 3, 3, 3, 2, 2, 0, 0),  // stride 2, no padding
      Conv(3, 4, 7, 5, 2, 1, 1, 1, 1, 0, 0),  // 1x1
      Conv(3, 4, 7, 5, 2, 1, 1, 2, 2, 0, 0),  // 1x1, stride 2 (skips pixels)
      Conv(2, 4, 7, 5, 3, 3, 2, 1, 2, 1, 0),  // uneven kernel, strides, pads
      Conv(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0),  // a single product
      // Wider, as real layers are (fan-in 144: a looser bound, longer sums).
      Conv(2, 16, 9, 9, 16, 3, 3, 1, 1, 1, 1),
      Conv(2, 16, 8, 8, 32, 3, 3, 2, 2, 1, 1),
  };
  return *shapes;
}

const std::vector<Pool2DShape>& PoolShapes() {
  static const auto* shapes = new std::vector<Pool2DShape>{
      Pool(3, 4, 7, 5, 2, 2, 2, 2, 0, 0),  // 2x2/2, odd sizes drop the edge
      Pool(3, 4, 7, 5, 3, 3, 2, 2, 1, 1),  // 3x3/2 padded: windows clipped
      Pool(3, 1, 7, 5, 3, 3, 1, 1, 1, 1),  // overlapping windows, stride 1
      Pool(3, 4, 7, 5, 3, 2, 1, 2, 0, 1),  // uneven
      Pool(3, 4, 7, 5, 7, 5, 1, 1, 0, 0),  // global pooling
      Pool(2, 16, 8, 8, 2, 2, 2, 2, 0, 0),  // 16 channels: oneDNN's JIT
  };
  return *shapes;
}

// ---- Convolution -------------------------------------------------------

TEST(BackendConvTest, ReferenceBackwardIsTheForwardsAdjoint) {
  for (const Conv2DShape& s : ConvShapes()) {
    const auto x = RandomVector(s.x_size(), 1);
    const auto w = RandomVector(s.w_size(), 2);
    const auto dy = RandomVector(s.y_size(), 3);
    const Ref y = RefConvForward(s, x, w, nullptr);
    const Ref dx = RefConvBackwardData(s, dy, w);
    const Ref dw = RefConvBackwardWeights(s, x, dy);
    ExpectAdjoint(Dot(y.value, dy), Dot(dx.value, x), AbsDot(dx.value, x),
                  "data " + s.DebugString());
    ExpectAdjoint(Dot(y.value, dy), Dot(dw.value, w), AbsDot(dw.value, w),
                  "weights " + s.DebugString());
  }
}

TEST(BackendConvTest, ForwardMatchesReferenceWithAndWithoutBias) {
  auto backend = NewCpuBackend();
  for (const Conv2DShape& s : ConvShapes()) {
    for (bool bias : {false, true}) {
      const auto x = RandomVector(s.x_size(), 11);
      const auto w = RandomVector(s.w_size(), 12);
      const auto b = RandomVector(s.k, 13);
      // NaN: the output is overwritten, never read.
      std::vector<float> y(s.y_size(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(backend
                      ->Conv2DForward(s, x.data(), w.data(),
                                      bias ? b.data() : nullptr, y.data())
                      .ok());
      // N: c*r*s products summed, plus the bias.
      ExpectWithinBound(y, RefConvForward(s, x, w, bias ? &b : nullptr),
                        s.c * s.r * s.s + 1,
                        s.DebugString() + (bias ? " bias" : ""));
    }
  }
}

TEST(BackendConvTest, BackwardDataMatchesReference) {
  auto backend = NewCpuBackend();
  for (const Conv2DShape& s : ConvShapes()) {
    const auto dy = RandomVector(s.y_size(), 21);
    const auto w = RandomVector(s.w_size(), 22);
    std::vector<float> dx(s.x_size(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(
        backend->Conv2DBackwardData(s, dy.data(), w.data(), dx.data()).ok());
    // N: at most k*r*s products reach one input pixel. A 1x1 stride-2
    // convolution never reads some pixels: their gradient must be exactly 0
    // (the bound, with magnitude 0, says so).
    ExpectWithinBound(dx, RefConvBackwardData(s, dy, w), s.k * s.r * s.s,
                      s.DebugString());
  }
}

TEST(BackendConvTest, BackwardWeightsMatchesReferenceWithAndWithoutBias) {
  auto backend = NewCpuBackend();
  for (const Conv2DShape& s : ConvShapes()) {
    for (bool bias : {false, true}) {
      const auto x = RandomVector(s.x_size(), 31);
      const auto dy = RandomVector(s.y_size(), 32);
      std::vector<float> dw(s.w_size(), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> db(s.k, std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(backend
                      ->Conv2DBackwardWeights(s, x.data(), dy.data(), dw.data(),
                                              bias ? db.data() : nullptr)
                      .ok());
      // N: one product per output pixel of the batch.
      const int64_t pixels = s.n * s.out_h() * s.out_w();
      ExpectWithinBound(dw, RefConvBackwardWeights(s, x, dy), pixels,
                        s.DebugString() + (bias ? " bias" : ""));
      if (bias) {
        ExpectWithinBound(db, RefBiasGrad(s, dy), pixels,
                          "db " + s.DebugString());
      } else {
        for (float v : db) EXPECT_TRUE(std::isnan(v)) << "db written";
      }
    }
  }
}

// Towers run their backends on their own threads at once, new threads every
// step. oneDNN's default scratchpad belongs to the thread that created the
// primitive, so a primitive run later on another thread had none (a crash
// seen with 2 towers); each backend now brings its own. Each thread must get
// exactly the bits one backend alone gets.
TEST(BackendConvTest, BackendsOnSeveralThreadsAtOnceGiveTheSingleThreadBits) {
  Conv2DShape s;
  s.n = 8, s.c = 16, s.h = 14, s.w = 14, s.k = 32, s.r = 3, s.s = 3;
  s.pad_h = s.pad_w = 1;
  BatchNormShape bs;
  bs.n = 8, bs.c = 32, bs.spatial = 14 * 14;
  const auto x = RandomVector(s.x_size(), 51);
  const auto w = RandomVector(s.w_size(), 52);
  const auto dy = RandomVector(s.y_size(), 53);
  const std::vector<float> gamma(bs.c, 1.5f), beta(bs.c, 0.25f);
  struct Out {
    std::vector<float> y, dx, dw, bn, dbn;
  };
  auto run = [&](Backend& b, Out* o) {
    o->y.assign(s.y_size(), 0);
    o->dx.assign(s.x_size(), 0);
    o->dw.assign(s.w_size(), 0);
    o->bn.assign(bs.x_size(), 0);
    o->dbn.assign(bs.x_size(), 0);
    std::vector<float> mean(bs.c), var(bs.c), dg(bs.c), db(bs.c);
    for (int rep = 0; rep < 5; ++rep) {
      ASSERT_TRUE(b.Conv2DForward(s, x.data(), w.data(), nullptr, o->y.data()).ok());
      ASSERT_TRUE(b.Conv2DBackwardData(s, dy.data(), w.data(), o->dx.data()).ok());
      ASSERT_TRUE(b.Conv2DBackwardWeights(s, x.data(), dy.data(), o->dw.data(), nullptr).ok());
      ASSERT_TRUE(b.BatchNormForwardTraining(bs, o->y.data(), gamma.data(), beta.data(),
                                             o->bn.data(), mean.data(), var.data())
                      .ok());
      ASSERT_TRUE(b.BatchNormBackward(bs, o->y.data(), dy.data(), gamma.data(), mean.data(),
                                      var.data(), o->dbn.data(), dg.data(), db.data())
                      .ok());
    }
  };
  // One thread per backend, as the worker sets it for towers on few cores.
  SetCpuMathThreads(1);
  auto alone = NewCpuBackend();
  Out want;
  run(*alone, &want);
  constexpr int kThreads = 3;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Out> got(kThreads);
  for (int t = 0; t < kThreads; ++t) backends.push_back(NewCpuBackend());
  // Two rounds of threads, as towers get new threads every step: the second
  // round runs primitives the first round's (finished) threads created.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { run(*backends[t], &got[t]); });
    for (auto& th : threads) th.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(got[t].y, want.y) << "thread " << t;
    EXPECT_EQ(got[t].dx, want.dx) << "thread " << t;
    EXPECT_EQ(got[t].dw, want.dw) << "thread " << t;
    EXPECT_EQ(got[t].bn, want.bn) << "thread " << t;
    EXPECT_EQ(got[t].dbn, want.dbn) << "thread " << t;
  }
}

TEST(BackendConvTest, FakeDeviceBackendGivesTheCpuResultInItsOwnMemory) {
  std::vector<std::string> violations;
  auto fake = NewFakeDeviceBackend(/*space=*/7, &violations);
  auto cpu = NewCpuBackend();
  const Conv2DShape s = ConvShapes()[2];
  const auto x = RandomVector(s.x_size(), 41);
  const auto w = RandomVector(s.w_size(), 42);
  const auto b = RandomVector(s.k, 43);
  std::vector<float> want(s.y_size());
  ASSERT_TRUE(
      cpu->Conv2DForward(s, x.data(), w.data(), b.data(), want.data()).ok());

  float* dx = *fake->Allocate(s.x_size());
  float* dw = *fake->Allocate(s.w_size());
  float* db = *fake->Allocate(s.k);
  float* dy = *fake->Allocate(s.y_size());
  fake->CopyFromHost(x.data(), s.x_size(), dx);
  fake->CopyFromHost(w.data(), s.w_size(), dw);
  fake->CopyFromHost(b.data(), s.k, db);
  ASSERT_TRUE(fake->Conv2DForward(s, dx, dw, db, dy).ok());
  std::vector<float> got(s.y_size());
  ASSERT_TRUE(fake->CopyToHost(dy, s.y_size(), got.data()).ok());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(violations.empty());

  // A host pointer passed to the fake device is a violation.
  ASSERT_TRUE(fake->Conv2DForward(s, x.data(), dw, db, dy).ok());
  EXPECT_EQ(violations.size(), 1u);
  for (float* p : {dx, dw, db, dy}) fake->Free(p);
}

// ---- Pooling ---------------------------------------------------------------

TEST(BackendConvTest, MaxPoolMatchesReference) {
  auto backend = NewCpuBackend();
  for (const Pool2DShape& s : PoolShapes()) {
    const auto x = RandomVector(s.x_size(), 51);
    const auto dy = RandomVector(s.y_size(), 52);
    std::vector<float> y(s.y_size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> ws(s.workspace_size());
    ASSERT_TRUE(
        backend->MaxPool2DForward(s, x.data(), y.data(), ws.data()).ok());
    const std::vector<int64_t> arg = RefArgmax(s, x);
    // The max is one of the inputs: exact.
    for (int64_t i = 0; i < s.y_size(); ++i) {
      ASSERT_EQ(y[i], x[arg[i]]) << s.DebugString() << " element " << i;
    }

    std::vector<float> dx(s.x_size(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(backend
                    ->MaxPool2DBackward(s, x.data(), y.data(), ws.data(),
                                        dy.data(), dx.data())
                    .ok());
    Ref want(s.x_size());
    for (int64_t i = 0; i < s.y_size(); ++i) want.Add(arg[i], dy[i]);
    // The reference is its own adjoint: <dy, x[arg]> == <dx, x>.
    double lhs = 0;
    for (int64_t i = 0; i < s.y_size(); ++i) lhs += double{dy[i]} * x[arg[i]];
    ExpectAdjoint(lhs, Dot(want.value, x), AbsDot(want.value, x),
                  "max " + s.DebugString());
    // N: one term per window that overlaps the pixel.
    const int64_t windows = ((s.r + s.stride_h - 1) / s.stride_h) *
                            ((s.s + s.stride_w - 1) / s.stride_w);
    ExpectWithinBound(dx, want, windows, "max backward " + s.DebugString());
  }
}

TEST(BackendConvTest, AvgPoolMatchesReferenceExcludingPadding) {
  auto backend = NewCpuBackend();
  for (const Pool2DShape& s : PoolShapes()) {
    const auto x = RandomVector(s.x_size(), 61);
    const auto dy = RandomVector(s.y_size(), 62);
    const Ref y_ref = RefAvgForward(s, x);
    const Ref dx_ref = RefAvgBackward(s, dy);
    ExpectAdjoint(Dot(y_ref.value, dy), Dot(dx_ref.value, x),
                  AbsDot(dx_ref.value, x), "avg " + s.DebugString());

    std::vector<float> y(s.y_size(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(backend->AvgPool2DForward(s, x.data(), y.data()).ok());
    // N: r*s terms, and the division (or a multiplication by a rounded
    // reciprocal: 2).
    ExpectWithinBound(y, y_ref, s.r * s.s + 2, "avg " + s.DebugString());

    std::vector<float> dx(s.x_size(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(backend->AvgPool2DBackward(s, dy.data(), dx.data()).ok());
    const int64_t windows = ((s.r + s.stride_h - 1) / s.stride_h) *
                            ((s.s + s.stride_w - 1) / s.stride_w);
    ExpectWithinBound(dx, dx_ref, windows + 2,
                      "avg backward " + s.DebugString());
  }
}

// ---- Errors and the primitive cache ---------------------------------------

TEST(BackendConvTest, BadShapesAreInvalidArgumentNamingTheField) {
  auto backend = NewCpuBackend();
  std::vector<float> buf(4096);
  float* p = buf.data();
  const Conv2DShape good = ConvShapes()[2];
  struct Case {
    const char* field;
    Conv2DShape shape;
  };
  std::vector<Case> cases;
  auto with = [&](const char* field, auto edit) {
    Conv2DShape s = good;
    edit(s);
    cases.push_back({field, s});
  };
  with("Conv2DShape.n", [](Conv2DShape& s) { s.n = 0; });
  with("Conv2DShape.c", [](Conv2DShape& s) { s.c = -1; });
  with("Conv2DShape.k", [](Conv2DShape& s) { s.k = 0; });
  with("Conv2DShape.stride_h", [](Conv2DShape& s) { s.stride_h = 0; });
  with("Conv2DShape.stride_w", [](Conv2DShape& s) { s.stride_w = -2; });
  with("Conv2DShape.pad_h", [](Conv2DShape& s) { s.pad_h = -1; });
  with("Conv2DShape.pad_w", [](Conv2DShape& s) { s.pad_w = 3; });  // = s
  with("Conv2DShape.r", [](Conv2DShape& s) { s.r = 10; s.pad_h = 1; });
  for (const Case& c : cases) {
    for (const absl::Status& st :
         {backend->Conv2DForward(c.shape, p, p, p, p),
          backend->Conv2DBackwardData(c.shape, p, p, p),
          backend->Conv2DBackwardWeights(c.shape, p, p, p, p)}) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find(c.field), std::string::npos)
          << c.field << ": " << st;
    }
  }

  Pool2DShape pool = PoolShapes()[1];
  pool.pad_w = pool.s;  // a window of only padding
  for (const absl::Status& st :
       {backend->MaxPool2DForward(pool, p, p, p),
        backend->MaxPool2DBackward(pool, p, p, p, p, p),
        backend->AvgPool2DForward(pool, p, p),
        backend->AvgPool2DBackward(pool, p, p)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("Pool2DShape.pad_w"), std::string::npos) << st;
  }
  // A plane of 2^31 pixels: valid, but more than max pooling's workspace
  // records (its winners' offsets are int32); refused before any is read.
  Pool2DShape huge = PoolShapes()[0];
  huge.h = int64_t{1} << 16;
  huge.w = int64_t{1} << 15;
  ASSERT_TRUE(huge.Validate().ok());
  for (const absl::Status& st : {backend->MaxPool2DForward(huge, p, p, p),
                                 backend->MaxPool2DBackward(huge, p, p, p, p, p)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("h * w = 2147483648"), std::string::npos) << st;
  }
}

TEST(BackendConvTest, PrimitivesAreCachedByShape) {
  absl::StatusOr<std::unique_ptr<DnnlKernels>> k = NewDnnlKernels();
  ASSERT_TRUE(k.ok()) << k.status();
  const Conv2DShape s = ConvShapes()[1];
  const auto x = RandomVector(s.x_size(), 71);
  const auto w = RandomVector(s.w_size(), 72);
  std::vector<float> y1(s.y_size()), y2(s.y_size());
  ASSERT_TRUE((*k)->Conv2DForward(s, x.data(), w.data(), nullptr, y1.data()).ok());
  ASSERT_TRUE((*k)->Conv2DForward(s, x.data(), w.data(), nullptr, y2.data()).ok());
  EXPECT_EQ((*k)->cached_primitives(), 1);
  EXPECT_EQ(y1, y2);  // the same primitive, the same bits
  Conv2DShape other = s;
  other.n = 2;
  ASSERT_TRUE((*k)->Conv2DForward(other, x.data(), w.data(), nullptr, y1.data()).ok());
  EXPECT_EQ((*k)->cached_primitives(), 2);
  // An invalid shape creates nothing.
  other.k = 0;
  EXPECT_EQ((*k)->Conv2DForward(other, x.data(), w.data(), nullptr, y1.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*k)->cached_primitives(), 2);
}

}  // namespace
}  // namespace towerps::worker
