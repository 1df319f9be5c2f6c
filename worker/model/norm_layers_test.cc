// BatchNorm, Dropout and ResidualBlock on the CPU backend, and the models
// built from them (resnet18's parameter count, a few steps lowering the loss).
//
// Batch norm is checked against a double-precision reference written here
// from its definition, whose own gradient is checked by central differences
// in double (step 1e-5 on values of order 1: truncation and rounding there
// are below 1e-8, far inside the float bounds). The float layer is then
// compared with the reference within gamma_N * magnitude (Higham 3.1;
// u = 2^-24), N counted from the sums the kernel makes: a channel's mean and
// variance sum count = n * spatial terms, and each output adds a handful of
// operations; the magnitude carries E[x^2] / var, since a one-pass variance
// cancels.
#include "worker/model/norm_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"
#include "worker/device/float_bounds_testing.h"
#include "worker/model/batch.h"
#include "worker/model/model.h"
#include "worker/model/residual.h"

namespace towerps::worker {
namespace {

// Gives every params() and grads() entry of `layer` host storage from
// `store`, params filled from `values` (by name) or their initializer.
struct Storage {
  std::vector<std::vector<float>> params, grads;
};
void Attach(Layer& layer, Storage* store, uint64_t seed) {
  const auto specs = layer.param_specs();
  const auto params = layer.params();
  const auto grads = layer.grads();
  store->params.resize(specs.size());
  store->grads.resize(specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : specs[k].shape) n *= d;
    store->params[k] = specs[k].init == Layer::ParamSpec::Init::kOnes
                           ? std::vector<float>(n, 1.0f)
                           : specs[k].init == Layer::ParamSpec::Init::kZeros
                                 ? std::vector<float>(n, 0.0f)
                                 : RandomVector(n, seed + k, -0.3f, 0.3f);
    store->grads[k].assign(n, 0.0f);
    params[k]->ViewHost(specs[k].shape, store->params[k].data());
    grads[k]->ViewHost(specs[k].shape, store->grads[k].data());
  }
}

DeviceTensor View(Backend& b, std::vector<int64_t> shape, std::vector<float>& v) {
  DeviceTensor d(&b);
  d.ViewHost(std::move(shape), v.data());
  return d;
}

// ---- The batch norm reference, in double ------------------------------------------

struct BnRef {
  std::vector<double> y, mean, var, dx, dgamma, dbeta;
};

// x [n, c, s]; training mode; with dy, the gradients of L = sum(dy * y).
BnRef BatchNormRef(const std::vector<double>& x, const std::vector<double>& gamma,
                   const std::vector<double>& beta, int64_t n, int64_t c, int64_t s, double eps,
                   const std::vector<double>* dy) {
  BnRef r;
  r.y.assign(x.size(), 0);
  r.mean.assign(c, 0);
  r.var.assign(c, 0);
  r.dx.assign(x.size(), 0);
  r.dgamma.assign(c, 0);
  r.dbeta.assign(c, 0);
  const double m = static_cast<double>(n * s);
  auto at = [&](int64_t i, int64_t ch, int64_t p) { return (i * c + ch) * s + p; };
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < s; ++p) sum += x[at(i, ch, p)];
    const double mean = sum / m;
    double sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < s; ++p) sq += (x[at(i, ch, p)] - mean) * (x[at(i, ch, p)] - mean);
    const double var = sq / m;
    const double inv = 1.0 / std::sqrt(var + eps);
    r.mean[ch] = mean;
    r.var[ch] = var;
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < s; ++p) {
        const int64_t k = at(i, ch, p);
        const double xhat = (x[k] - mean) * inv;
        r.y[k] = gamma[ch] * xhat + beta[ch];
        if (dy) {
          sum_dy += (*dy)[k];
          sum_dy_xhat += (*dy)[k] * xhat;
        }
      }
    if (!dy) continue;
    r.dgamma[ch] = sum_dy_xhat;
    r.dbeta[ch] = sum_dy;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < s; ++p) {
        const int64_t k = at(i, ch, p);
        const double xhat = (x[k] - mean) * inv;
        r.dx[k] = gamma[ch] * inv * ((*dy)[k] - sum_dy / m - xhat * sum_dy_xhat / m);
      }
  }
  return r;
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

double DotDy(const std::vector<double>& y, const std::vector<double>& dy) {
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += y[i] * dy[i];
  return l;
}

TEST(BatchNormRefTest, GradientMatchesCentralDifferences) {
  const int64_t n = 3, c = 2, s = 5;
  const auto x = ToDouble(RandomVector(n * c * s, 1, -1.0f, 2.0f));
  const auto dy = ToDouble(RandomVector(n * c * s, 2));
  const std::vector<double> gamma = {1.3, -0.7}, beta = {0.2, 0.5};
  const BnRef r = BatchNormRef(x, gamma, beta, n, c, s, 1e-3, &dy);
  const double h = 1e-5;
  for (int64_t k = 0; k < n * c * s; ++k) {
    auto xp = x, xm = x;
    xp[k] += h;
    xm[k] -= h;
    const double fd = (DotDy(BatchNormRef(xp, gamma, beta, n, c, s, 1e-3, nullptr).y, dy) -
                       DotDy(BatchNormRef(xm, gamma, beta, n, c, s, 1e-3, nullptr).y, dy)) /
                      (2 * h);
    EXPECT_NEAR(r.dx[k], fd, 1e-7 * (1 + std::fabs(fd))) << "x[" << k << "]";
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    auto gp = gamma, gm = gamma, bp = beta, bm = beta;
    gp[ch] += h;
    gm[ch] -= h;
    bp[ch] += h;
    bm[ch] -= h;
    const double fd_g = (DotDy(BatchNormRef(x, gp, beta, n, c, s, 1e-3, nullptr).y, dy) -
                         DotDy(BatchNormRef(x, gm, beta, n, c, s, 1e-3, nullptr).y, dy)) /
                        (2 * h);
    const double fd_b = (DotDy(BatchNormRef(x, gamma, bp, n, c, s, 1e-3, nullptr).y, dy) -
                         DotDy(BatchNormRef(x, gamma, bm, n, c, s, 1e-3, nullptr).y, dy)) /
                        (2 * h);
    EXPECT_NEAR(r.dgamma[ch], fd_g, 1e-7 * (1 + std::fabs(fd_g)));
    EXPECT_NEAR(r.dbeta[ch], fd_b, 1e-7 * (1 + std::fabs(fd_b)));
  }
}

// ---- The layer against the reference ----------------------------------------------

struct BnCase {
  int64_t n, c, h, w;
};

class BatchNormLayerTest : public ::testing::TestWithParam<BnCase> {};

TEST_P(BatchNormLayerTest, TrainingForwardAndBackwardMatchTheReference) {
  const BnCase p = GetParam();
  const int64_t s = p.h * p.w, count = p.n * s, size = p.n * p.c * s;
  auto backend = NewCpuBackend();
  BatchNorm::Options o;
  o.epsilon = 1e-3f;
  auto made = BatchNorm::Create(*backend, "bn", {p.c, p.h, p.w}, o);
  ASSERT_TRUE(made.ok()) << made.status();
  BatchNorm& bn = **made;
  Storage store;
  Attach(bn, &store, 7);
  store.params[0] = RandomVector(p.c, 8, 0.5f, 1.5f);   // gamma
  store.params[1] = RandomVector(p.c, 9, -0.5f, 0.5f);  // beta
  bn.params()[0]->ViewHost({p.c}, store.params[0].data());
  bn.params()[1]->ViewHost({p.c}, store.params[1].data());
  // Inputs with a mean away from zero (0.5) so that a one-pass variance would
  // show; the last channel constant (variance 0: epsilon keeps it finite).
  std::vector<float> x = RandomVector(size, 10, -0.5f, 1.5f);
  for (int64_t i = 0; i < p.n; ++i)
    for (int64_t q = 0; q < s; ++q) x[(i * p.c + p.c - 1) * s + q] = 0.25f;
  std::vector<float> dy = RandomVector(size, 11);
  DeviceTensor xt = View(*backend, {p.n, p.c * s}, x), dyt = View(*backend, {p.n, p.c * s}, dy);
  DeviceTensor y(backend.get()), dx(backend.get());
  bn.BeginPass(/*training=*/true, p.n, 1);
  ASSERT_TRUE(bn.Forward(xt, &y).ok());
  ASSERT_TRUE(bn.Backward(xt, y, dyt, &dx, false).ok());
  const auto xd = ToDouble(x), dyd = ToDouble(dy);
  const BnRef r = BatchNormRef(xd, ToDouble(store.params[0]), ToDouble(store.params[1]), p.n, p.c,
                               s, 1e-3, &dyd);
  const double g = FloatGamma(3 * count + 20);
  for (int64_t ch = 0; ch < p.c; ++ch) {
    double ex2 = 0, mean_abs = 0, dy_abs = 0, dyx_abs = 0;
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t q = 0; q < s; ++q) {
        const int64_t k = (i * p.c + ch) * s + q;
        ex2 += xd[k] * xd[k] / count;
        mean_abs += std::fabs(xd[k]) / count;
        dy_abs += std::fabs(dyd[k]);
      }
    const double sd = std::sqrt(r.var[ch] + 1e-3);
    const double cancel = 1 + ex2 / (r.var[ch] + 1e-3);  // one-pass variance
    const double gam = std::fabs(store.params[0][ch]);
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t q = 0; q < s; ++q) {
        const int64_t k = (i * p.c + ch) * s + q;
        dyx_abs += std::fabs(dyd[k] * (xd[k] - r.mean[ch]) / sd);
      }
    // The moving statistics' slots got this batch's mean and variance.
    EXPECT_NEAR(store.grads[2][ch], r.mean[ch], g * mean_abs) << "mean, channel " << ch;
    EXPECT_NEAR(store.grads[3][ch], r.var[ch], g * ex2 * 2) << "var, channel " << ch;
    EXPECT_NEAR(store.grads[1][ch], r.dbeta[ch], g * dy_abs) << "dbeta, channel " << ch;
    EXPECT_NEAR(store.grads[0][ch], r.dgamma[ch], g * cancel * (dyx_abs + dy_abs))
        << "dgamma, channel " << ch;
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t q = 0; q < s; ++q) {
        const int64_t k = (i * p.c + ch) * s + q;
        const double xmag = (std::fabs(xd[k]) + mean_abs) / sd;
        ASSERT_NEAR(y.data()[k], r.y[k],
                    g * (gam * cancel * xmag + std::fabs(store.params[1][ch])))
            << "y[" << k << "]";
        const double dxmag =
            gam / sd * cancel * (std::fabs(dyd[k]) + (dy_abs + xmag * dyx_abs) / count);
        ASSERT_NEAR(dx.data()[k], r.dx[k], g * dxmag) << "dx[" << k << "]";
      }
  }
  // The constant channel normalizes to beta exactly enough, with no NaN.
  for (int64_t i = 0; i < p.n; ++i) {
    const float v = y.data()[(i * p.c + p.c - 1) * s];
    EXPECT_TRUE(std::isfinite(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormLayerTest,
                         ::testing::Values(BnCase{4, 3, 1, 1},    // dense rows
                                           BnCase{3, 5, 7, 5},    // odd image
                                           BnCase{2, 16, 4, 4}));

TEST(BatchNormLayerTest, EvaluationUsesTheMovingStatistics) {
  auto backend = NewCpuBackend();
  BatchNorm::Options o;
  o.epsilon = 0.01f;
  auto made = BatchNorm::Create(*backend, "bn", {2, 1, 3}, o);
  ASSERT_TRUE(made.ok());
  Storage store;
  Attach(**made, &store, 1);
  store.params[0] = {2.0f, 0.5f};    // gamma
  store.params[1] = {1.0f, -1.0f};   // beta
  store.params[2] = {0.5f, -2.0f};   // moving mean
  store.params[3] = {3.99f, 0.24f};  // moving variance: sqrt(v + eps) = 2, 0.5
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  DeviceTensor xt = View(*backend, {1, 6}, x), y(backend.get());
  (*made)->BeginPass(/*training=*/false, 1, 0);
  ASSERT_TRUE((*made)->Forward(xt, &y).ok());
  const double want[6] = {2 * (1 - 0.5) / 2 + 1,    2 * (2 - 0.5) / 2 + 1,
                          2 * (3 - 0.5) / 2 + 1,    0.5 * (4 + 2) / 0.5 - 1,
                          0.5 * (5 + 2) / 0.5 - 1,  0.5 * (6 + 2) / 0.5 - 1};
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(y.data()[i], want[i], FloatGamma(8) * (std::fabs(want[i]) + 4)) << i;
  }
}

TEST(BatchNormLayerTest, BadOptionsAndMissingForwardAreErrorsNamingTheLayer) {
  auto backend = NewCpuBackend();
  BatchNorm::Options o;
  o.momentum = 1.0f;
  auto bad = BatchNorm::Create(*backend, "bn7", {2, 2, 2}, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bn7"), std::string::npos);
  EXPECT_NE(bad.status().message().find("momentum"), std::string::npos);
  o = BatchNorm::Options();
  o.epsilon = 0.0f;
  bad = BatchNorm::Create(*backend, "bn7", {2, 2, 2}, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("epsilon"), std::string::npos);
  auto made = BatchNorm::Create(*backend, "bn8", {2, 1, 1}, BatchNorm::Options());
  ASSERT_TRUE(made.ok());
  Storage store;
  Attach(**made, &store, 1);
  std::vector<float> x = {1, 2, 3, 4}, dy = {1, 1, 1, 1};
  DeviceTensor xt = View(*backend, {2, 2}, x), dyt = View(*backend, {2, 2}, dy);
  DeviceTensor y(backend.get()), dx(backend.get());
  (*made)->BeginPass(true, 2, 0);
  const absl::Status st = (*made)->Backward(xt, y, dyt, &dx, false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("bn8"), std::string::npos) << st;
}

// ---- Dropout ---------------------------------------------------------------------

TEST(DropoutLayerTest, TrainingDropsAboutRateScalesTheRestAndBackwardUsesTheSameMask) {
  auto backend = NewCpuBackend();
  const float rate = 0.25f;
  const int64_t n = 40, d = 1000;
  auto made = Dropout::Create(*backend, "drop", {d, 1, 1}, rate);
  ASSERT_TRUE(made.ok());
  Dropout& drop = **made;
  std::vector<float> x = RandomVector(n * d, 3, 0.5f, 1.5f), dy = RandomVector(n * d, 4, 0.5f, 1.5f);
  DeviceTensor xt = View(*backend, {n, d}, x), dyt = View(*backend, {n, d}, dy);
  DeviceTensor y(backend.get()), dx(backend.get());
  drop.BeginPass(true, n, 99);
  ASSERT_TRUE(drop.Forward(xt, &y).ok());
  ASSERT_TRUE(drop.Backward(xt, y, dyt, &dx, false).ok());
  int64_t dropped = 0;
  for (int64_t i = 0; i < n * d; ++i) {
    if (y.data()[i] == 0.0f) {
      ++dropped;
      ASSERT_EQ(dx.data()[i], 0.0f) << i;
    } else {
      ASSERT_EQ(y.data()[i], x[i] * (1.0f / (1.0f - rate))) << i;
      ASSERT_EQ(dx.data()[i], dy[i] * (1.0f / (1.0f - rate))) << i;
    }
  }
  // Binomial(40000, 0.25): sd = sqrt(N p (1-p)) ~ 86.6; 6 sd either side.
  const double expect = rate * n * d, sd = std::sqrt(n * d * rate * (1 - rate));
  EXPECT_NEAR(dropped, expect, 6 * sd);
  // The next pass draws another mask; evaluation is the identity.
  std::vector<float> first(y.data(), y.data() + n * d);
  drop.BeginPass(true, n, 100);
  ASSERT_TRUE(drop.Forward(xt, &y).ok());
  int64_t differ = 0;
  for (int64_t i = 0; i < n * d; ++i) differ += (y.data()[i] == 0.0f) != (first[i] == 0.0f);
  EXPECT_GT(differ, n * d / 10);
  drop.BeginPass(false, n, 101);
  ASSERT_TRUE(drop.Forward(xt, &y).ok());
  for (int64_t i = 0; i < n * d; ++i) ASSERT_EQ(y.data()[i], x[i]);
  EXPECT_FALSE(Dropout::Create(*backend, "d", {2, 1, 1}, 1.0f).ok());
  EXPECT_FALSE(Dropout::Create(*backend, "d", {2, 1, 1}, -0.1f).ok());
}

// ---- ResidualBlock ------------------------------------------------------------------

// The block against the same computation composed from its parts as
// separate layers (each tested on its own) with the same weights: the same
// kernels in the same order, so equal up to the last additions.
TEST(ResidualBlockTest, MatchesItsPartsComposedByHand) {
  for (const bool project : {false, true}) {
    SCOPED_TRACE(project ? "with projection" : "identity shortcut");
    auto backend = NewCpuBackend();
    const ImageDims in{4, 6, 6};
    ResidualBlock::Options o;
    o.filters = project ? 8 : 4;
    o.stride = project ? 2 : 1;
    auto made = ResidualBlock::Create(*backend, "res", in, o);
    ASSERT_TRUE(made.ok()) << made.status();
    ResidualBlock& block = **made;
    EXPECT_EQ(block.has_projection(), project);
    Storage store;
    Attach(block, &store, 21);
    // The parts, sharing the block's parameter storage.
    Conv2D::Options c;
    c.filters = o.filters;
    c.kernel_h = c.kernel_w = 3;
    c.stride = o.stride;
    c.explicit_pad = 1;
    auto conv1 = *Conv2D::Create(*backend, "c1", in, c);
    c.stride = 1;
    auto conv2 = *Conv2D::Create(*backend, "c2", conv1->output_image(), c);
    auto bn1 = *BatchNorm::Create(*backend, "b1", conv1->output_image(), o.batch_norm);
    auto bn2 = *BatchNorm::Create(*backend, "b2", conv2->output_image(), o.batch_norm);
    std::unique_ptr<Conv2D> proj;
    if (project) {
      Conv2D::Options pc;
      pc.filters = o.filters;
      pc.kernel_h = pc.kernel_w = 1;
      pc.stride = o.stride;
      proj = *Conv2D::Create(*backend, "p", in, pc);
    }
    std::vector<Layer*> parts = {conv1.get(), bn1.get(), conv2.get(), bn2.get()};
    if (proj) parts.push_back(proj.get());
    Storage part_grads;
    size_t k = 0;
    for (Layer* l : parts) {
      const auto specs = l->param_specs();
      for (size_t j = 0; j < specs.size(); ++j, ++k) {
        l->params()[j]->ViewHost(specs[j].shape, store.params[k].data());
        part_grads.grads.emplace_back(store.params[k].size(), 0.0f);
        l->grads()[j]->ViewHost(specs[j].shape, part_grads.grads.back().data());
      }
    }
    ASSERT_EQ(k, store.params.size());
    const int64_t n = 3;
    std::vector<float> x = RandomVector(n * in.size(), 22), dy = RandomVector(n * block.output_image().size(), 23);
    DeviceTensor xt = View(*backend, {n, in.size()}, x);
    DeviceTensor dyt = View(*backend, {n, block.output_image().size()}, dy);
    DeviceTensor y(backend.get()), dx(backend.get());
    block.BeginPass(true, n, 1);
    ASSERT_TRUE(block.Forward(xt, &y).ok());
    ASSERT_TRUE(block.Backward(xt, y, dyt, &dx, false).ok());
    // By hand.
    for (Layer* l : parts) l->BeginPass(true, n, 1);
    DeviceTensor c1(backend.get()), a1(backend.get()), c2(backend.get()), b2(backend.get()),
        s(backend.get());
    ASSERT_TRUE(conv1->Forward(xt, &c1).ok());
    ASSERT_TRUE(bn1->Forward(c1, &a1).ok());
    std::vector<float> pre(a1.data(), a1.data() + a1.num_elements());
    for (int64_t i = 0; i < a1.num_elements(); ++i) a1.data()[i] = std::max(a1.data()[i], 0.0f);
    ASSERT_TRUE(conv2->Forward(a1, &c2).ok());
    ASSERT_TRUE(bn2->Forward(c2, &b2).ok());
    const float* shortcut = x.data();
    if (proj) {
      ASSERT_TRUE(proj->Forward(xt, &s).ok());
      shortcut = s.data();
    }
    std::vector<float> want_y(y.num_elements()), g(y.num_elements());
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      want_y[i] = std::max(b2.data()[i] + shortcut[i], 0.0f);
      g[i] = want_y[i] > 0 ? dy[i] : 0.0f;
      ASSERT_EQ(y.data()[i], want_y[i]) << "y[" << i << "]";
    }
    DeviceTensor gt = View(*backend, {n, block.output_image().size()}, g);
    DeviceTensor gc2(backend.get()), ga1(backend.get()), gc1(backend.get()), hx(backend.get()),
        gs(backend.get());
    ASSERT_TRUE(bn2->Backward(c2, b2, gt, &gc2, false).ok());
    ASSERT_TRUE(conv2->Backward(a1, c2, gc2, &ga1, false).ok());
    for (int64_t i = 0; i < ga1.num_elements(); ++i) {
      if (!(a1.data()[i] > 0)) ga1.data()[i] = 0.0f;
    }
    ASSERT_TRUE(bn1->Backward(c1, a1, ga1, &gc1, false).ok());
    ASSERT_TRUE(conv1->Backward(xt, c1, gc1, &hx, false).ok());
    if (proj) {
      ASSERT_TRUE(proj->Backward(xt, s, gt, &gs, false).ok());
    }
    for (int64_t i = 0; i < dx.num_elements(); ++i) {
      const double want = static_cast<double>(hx.data()[i]) + (proj ? gs.data()[i] : g[i]);
      ASSERT_NEAR(dx.data()[i], want, FloatGamma(1) * std::fabs(want)) << "dx[" << i << "]";
    }
    for (size_t v = 0; v < store.grads.size(); ++v) {
      for (size_t i = 0; i < store.grads[v].size(); ++i) {
        ASSERT_EQ(store.grads[v][i], part_grads.grads[v][i]) << "gradient " << v << "[" << i << "]";
      }
    }
    const auto specs = block.param_specs();
    EXPECT_EQ(specs[0].name, "conv1/kernel");
    EXPECT_EQ(specs[4].name, "bn1/moving_mean");
    EXPECT_TRUE(specs[4].moving_average);
    EXPECT_EQ(specs.back().name, project ? "shortcut/bias" : "bn2/moving_variance");
  }
}

// ---- Models -------------------------------------------------------------------------

// Conv2D(k <- c, r x r) with bias; batch norm's trainable (gamma, beta) and
// moving statistics.
int64_t ConvParams(int64_t k, int64_t c, int64_t r) { return k * c * r * r + k; }

TEST(ResNetTest, Resnet18ParameterCountIsTheLayerByLayerSum) {
  auto job = BuiltinJob("resnet18");
  ASSERT_TRUE(job.ok());
  auto backend = NewCpuBackend();
  auto model = Model::Create(job->model(), *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t trainable = ConvParams(64, 1, 3) + 2 * 64;  // stem conv + bn
  int64_t moving = 2 * 64;
  int64_t channels = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t k = 64 << stage;
    for (int b = 0; b < 2; ++b) {
      trainable += ConvParams(k, channels, 3) + 2 * k + ConvParams(k, k, 3) + 2 * k;
      moving += 4 * k;
      if (channels != k) trainable += ConvParams(k, channels, 1);  // the 1x1 projection
      channels = k;
    }
  }
  trainable += 512 * 10 + 10;  // Dense(10) after global average pooling
  EXPECT_EQ((*model)->num_trainable_parameters(), trainable);
  EXPECT_EQ((*model)->num_parameters(), trainable + moving);
  // d2l reports about 11.2 million for this network.
  EXPECT_GT(trainable, 11'100'000);
  EXPECT_LT(trainable, 11'300'000);
  const std::string summary = (*model)->Summary();
  EXPECT_NE(summary.find(absl::StrCat("Non-trainable params: ", moving / 1000, ",")),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("(None, 512, 4, 4)"), std::string::npos) << summary;
  // Moving statistics are MOVING_AVERAGE variables with momentum 0.9.
  int moving_defs = 0;
  for (const auto& def : (*model)->VariableDefs()) {
    if (def.update() != v1::VariableDef::MOVING_AVERAGE) continue;
    ++moving_defs;
    EXPECT_FLOAT_EQ(def.moving_average_decay(), 0.9f) << def.name();
  }
  EXPECT_EQ(moving_defs, 2 * (1 + 16));  // stem + two per block
}

// One SGD step on the trainable variables and the servers' moving-average
// rule on the others, as the parameter servers apply them.
void ApplyStep(Model& model, float lr) {
  const auto defs = model.VariableDefs();
  const auto weights = model.weights();
  const auto grads = model.gradients();
  for (size_t v = 0; v < defs.size(); ++v) {
    const bool moving = defs[v].update() == v1::VariableDef::MOVING_AVERAGE;
    const float d = defs[v].moving_average_decay();
    for (int64_t i = 0; i < weights[v]->num_elements(); ++i) {
      float& w = (*weights[v])[i];
      w = moving ? d * w + (1 - d) * (*grads[v])[i] : w - lr * (*grads[v])[i];
    }
  }
}

v1::ModelSpec TinyResNet() {
  v1::ModelSpec m;
  m.set_name("tiny_resnet");
  m.set_input_dim(2 * 8 * 8);
  m.mutable_input_shape()->set_channels(2);
  m.mutable_input_shape()->set_height(8);
  m.mutable_input_shape()->set_width(8);
  auto* l = m.add_layers();
  l->set_type(v1::LayerSpec::CONV2D);
  l->set_filters(4);
  l->set_kernel_size(3);
  l->set_padding(v1::LayerSpec::PADDING_SAME);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::BATCH_NORM);
  l->set_activation(v1::RELU);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::RESIDUAL_BLOCK);
  l->set_filters(4);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::RESIDUAL_BLOCK);
  l->set_filters(8);
  l->set_strides(2);
  m.add_layers()->set_type(v1::LayerSpec::GLOBAL_AVG_POOL2D);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::DROPOUT);
  l->set_rate(0.1f);
  l = m.add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(5);
  m.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  return m;
}

Batch RandomImages(int64_t n, int64_t dim, int classes, uint64_t seed) {
  Batch b;
  b.features = common::Tensor({n, dim});
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = pixel(gen);
  for (int64_t i = 0; i < n; ++i) b.labels.push_back(static_cast<int32_t>(i % classes));
  return b;
}

TEST(ResNetTest, StepsOnAFixedBatchLowerTheLossWithAndWithoutMicroBatches) {
  const Batch batch = RandomImages(12, 2 * 8 * 8, 5, 4);
  for (int micro : {1, 3}) {
    auto backend = NewCpuBackend();
    auto made = Model::Create(TinyResNet(), *backend);
    ASSERT_TRUE(made.ok()) << made.status();
    Model& model = **made;
    model.set_micro_batches(micro);
    model.InitializeWeights();
    double first = 0, last = 0;
    for (int step = 0; step < 15; ++step) {
      auto r = model.ComputeGradients(batch);
      ASSERT_TRUE(r.ok()) << r.status();
      if (step == 0) first = r->loss_sum;
      last = r->loss_sum;
      ApplyStep(model, 0.1f);
    }
    EXPECT_LT(last, 0.7 * first) << "micro-batches " << micro;
    // The stem's moving mean moved from zero toward the batch means.
    const auto defs = model.VariableDefs();
    size_t mm = 0;
    while (defs[mm].name() != "batch_normalization/moving_mean") ++mm;
    double moved = 0;
    for (int64_t i = 0; i < model.weights()[mm]->num_elements(); ++i) {
      moved += std::fabs((*model.weights()[mm])[i]);
    }
    EXPECT_GT(moved, 0.0);
    auto eval = model.Evaluate(batch);
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_TRUE(std::isfinite(eval->loss_sum));
  }
}

TEST(ResNetTest, Resnet18StepsOnAFixedSmallBatchLowerTheLoss) {
  auto job = BuiltinJob("resnet18");
  ASSERT_TRUE(job.ok());
  auto backend = NewCpuBackend();
  auto made = Model::Create(job->model(), *backend);
  ASSERT_TRUE(made.ok()) << made.status();
  Model& model = **made;
  model.InitializeWeights();
  const Batch batch = RandomImages(8, 28 * 28, 10, 5);
  double first = 0, last = 0;
  for (int step = 0; step < 4; ++step) {
    auto r = model.ComputeGradients(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    if (step == 0) first = r->loss_sum;
    last = r->loss_sum;
    ApplyStep(model, 0.05f);
  }
  EXPECT_LT(last, first);
}

TEST(ResNetTest, BadSpecsNameTheLayerAndField) {
  auto backend = NewCpuBackend();
  v1::ModelSpec m = TinyResNet();
  m.mutable_layers(5)->set_rate(1.5f);
  auto made = Model::Create(m, *backend);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("rate"), std::string::npos) << made.status();
  m = TinyResNet();
  m.mutable_layers(1)->set_momentum(-0.5f);
  made = Model::Create(m, *backend);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("momentum"), std::string::npos) << made.status();
  m = TinyResNet();
  m.mutable_layers(2)->set_filters(0);
  made = Model::Create(m, *backend);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("residual"), std::string::npos) << made.status();
  // A residual block after the image ended.
  m = TinyResNet();
  m.mutable_layers(5)->set_type(v1::LayerSpec::RESIDUAL_BLOCK);
  m.mutable_layers(5)->set_filters(4);
  made = Model::Create(m, *backend);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("needs an image"), std::string::npos) << made.status();
}

}  // namespace
}  // namespace towerps::worker
