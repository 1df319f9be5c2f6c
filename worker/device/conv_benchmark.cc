// Micro-benchmark: the CPU backend's convolution (oneDNN) against im2col +
// OpenBLAS sgemm written here, forward and both backward directions, on the
// convolutions of a small CNN for Fashion-MNIST (batch 64). Issue 13 asks
// for oneDNN unless im2col + OpenBLAS is measured faster; this prints both.
//
// Each direction is warmed up untimed, then timed over --reps calls (the
// median is printed). The two implementations are checked against each
// other in the same run: `#wrong` counts elements where they differ by more
// than twice the float bound gamma_N * magnitude (N the sum's length, the
// magnitude computed by the im2col path on absolute values), so 0 is
// expected.
//
//   bazel run -c opt //worker/device:conv_benchmark [-- reps]
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/micro_benchmark.h"

namespace towerps::worker {
namespace {

// ---- im2col + sgemm, one image at a time (Caffe's scheme) ----------------

// col[(c*r + u)*s + v, i*ow + j] = x[c, i*sh - ph + u, j*sw - pw + v] (0 in
// the padding), for one image.
void Im2Col(const Conv2DShape& s, const float* x, float* col) {
  const int64_t oh = s.out_h(), ow = s.out_w();
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t u = 0; u < s.r; ++u)
      for (int64_t v = 0; v < s.s; ++v) {
        float* row = col + ((c * s.r + u) * s.s + v) * oh * ow;
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t hi = i * s.stride_h - s.pad_h + u;
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t wi = j * s.stride_w - s.pad_w + v;
            row[i * ow + j] = (hi >= 0 && hi < s.h && wi >= 0 && wi < s.w)
                                  ? x[(c * s.h + hi) * s.w + wi]
                                  : 0.0f;
          }
        }
      }
}

// The adjoint: x[c, ...] += col[...] (x zeroed by the caller).
void Col2Im(const Conv2DShape& s, const float* col, float* x) {
  const int64_t oh = s.out_h(), ow = s.out_w();
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t u = 0; u < s.r; ++u)
      for (int64_t v = 0; v < s.s; ++v) {
        const float* row = col + ((c * s.r + u) * s.s + v) * oh * ow;
        for (int64_t i = 0; i < oh; ++i) {
          const int64_t hi = i * s.stride_h - s.pad_h + u;
          if (hi < 0 || hi >= s.h) continue;
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t wi = j * s.stride_w - s.pad_w + v;
            if (wi >= 0 && wi < s.w) x[(c * s.h + hi) * s.w + wi] += row[i * ow + j];
          }
        }
      }
}

class Im2ColConv {
 public:
  explicit Im2ColConv(const Conv2DShape& s)
      : s_(s), col_(s.c * s.r * s.s * s.out_h() * s.out_w()) {}

  // y_n [k, P] = W [k, CRS] * col_n [CRS, P] (+ b).
  void Forward(const float* x, const float* w, const float* b, float* y) {
    const int64_t p = s_.out_h() * s_.out_w(), crs = s_.c * s_.r * s_.s;
    for (int64_t n = 0; n < s_.n; ++n) {
      Im2Col(s_, x + n * s_.c * s_.h * s_.w, col_.data());
      float* yn = y + n * s_.k * p;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s_.k, p, crs, 1.0f,
                  w, crs, col_.data(), p, 0.0f, yn, p);
      if (b != nullptr) {
        for (int64_t k = 0; k < s_.k; ++k)
          for (int64_t i = 0; i < p; ++i) yn[k * p + i] += b[k];
      }
    }
  }

  // col_n = W^T [CRS, k] * dy_n [k, P]; dx_n = col2im(col_n).
  void BackwardData(const float* dy, const float* w, float* dx) {
    const int64_t p = s_.out_h() * s_.out_w(), crs = s_.c * s_.r * s_.s;
    std::fill(dx, dx + s_.x_size(), 0.0f);
    for (int64_t n = 0; n < s_.n; ++n) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, crs, p, s_.k, 1.0f,
                  w, crs, dy + n * s_.k * p, p, 0.0f, col_.data(), p);
      Col2Im(s_, col_.data(), dx + n * s_.c * s_.h * s_.w);
    }
  }

  // dW [k, CRS] += dy_n [k, P] * col_n^T [P, CRS]; db[k] += sum dy_n[k, :].
  void BackwardWeights(const float* x, const float* dy, float* dw, float* db) {
    const int64_t p = s_.out_h() * s_.out_w(), crs = s_.c * s_.r * s_.s;
    for (int64_t n = 0; n < s_.n; ++n) {
      Im2Col(s_, x + n * s_.c * s_.h * s_.w, col_.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s_.k, crs, p, 1.0f,
                  dy + n * s_.k * p, p, col_.data(), p, n == 0 ? 0.0f : 1.0f,
                  dw, crs);
    }
    for (int64_t k = 0; k < s_.k; ++k) {
      double sum = 0;  // the bias gradient is not what is measured here
      for (int64_t n = 0; n < s_.n; ++n)
        for (int64_t i = 0; i < p; ++i) sum += dy[(n * s_.k + k) * p + i];
      db[k] = static_cast<float>(sum);
    }
  }

 private:
  const Conv2DShape s_;
  std::vector<float> col_;
};

// ---- Timing and checking ------------------------------------------------

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// Elements where a and b differ by more than 2 gamma_N * magnitude (each is
// within gamma_N of the exact value); a little slack for the magnitude's
// own float rounding.
int64_t Wrong(const std::vector<float>& a, const std::vector<float>& b,
              const std::vector<float>& magnitude, int64_t n_terms) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = n_terms * u / (1 - n_terms * u);
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(double{a[i]} - b[i]) <= 2.01 * gamma * magnitude[i])) ++wrong;
  }
  return wrong;
}

void Die(const absl::Status& s) { ExitUnlessOk("conv_benchmark", s); }

void Run(const char* name, const Conv2DShape& s, int reps) {
  auto backend = NewCpuBackend();
  Im2ColConv im2col(s);
  const auto x = Random(s.x_size(), 1), w = Random(s.w_size(), 2),
             b = Random(s.k, 3), dy = Random(s.y_size(), 4);
  std::vector<float> y1(s.y_size()), y2(s.y_size()), dx1(s.x_size()),
      dx2(s.x_size()), dw1(s.w_size()), dw2(s.w_size()), db1(s.k), db2(s.k);

  // Magnitudes: the same sums over absolute values.
  Im2ColConv mag(s);
  const auto ax = Abs(x), aw = Abs(w), ab = Abs(b), ady = Abs(dy);
  std::vector<float> my(s.y_size()), mdx(s.x_size()), mdw(s.w_size()), mdb(s.k);
  mag.Forward(ax.data(), aw.data(), ab.data(), my.data());
  mag.BackwardData(ady.data(), aw.data(), mdx.data());
  mag.BackwardWeights(ax.data(), ady.data(), mdw.data(), mdb.data());

  const double f_dnnl = MedianMs(reps, [&] {
    Die(backend->Conv2DForward(s, x.data(), w.data(), b.data(), y1.data()));
  });
  const double bd_dnnl = MedianMs(reps, [&] {
    Die(backend->Conv2DBackwardData(s, dy.data(), w.data(), dx1.data()));
  });
  const double bw_dnnl = MedianMs(reps, [&] {
    Die(backend->Conv2DBackwardWeights(s, x.data(), dy.data(), dw1.data(),
                                       db1.data()));
  });
  const double f_blas = MedianMs(
      reps, [&] { im2col.Forward(x.data(), w.data(), b.data(), y2.data()); });
  const double bd_blas = MedianMs(
      reps, [&] { im2col.BackwardData(dy.data(), w.data(), dx2.data()); });
  const double bw_blas = MedianMs(reps, [&] {
    im2col.BackwardWeights(x.data(), dy.data(), dw2.data(), db2.data());
  });

  const int64_t wrong =
      Wrong(y1, y2, my, s.c * s.r * s.s + 1) +
      Wrong(dx1, dx2, mdx, s.k * s.r * s.s) +
      Wrong(dw1, dw2, mdw, s.n * s.out_h() * s.out_w()) +
      Wrong(db1, db2, mdb, s.n * s.out_h() * s.out_w());
  const double gflop = 2.0 * s.n * s.k * s.out_h() * s.out_w() * s.c * s.r *
                       s.s / 1e9;  // per direction
  auto row = [&](const char* impl, double f, double bd, double bw) {
    const double total = f + bd + bw;
    std::printf("%-24s %-14s %9.3f %9.3f %9.3f %9.3f %8.2f %7lld\n", name,
                impl, f, bd, bw, total, 3 * gflop / (total / 1e3),
                static_cast<long long>(wrong));
    return total;
  };
  const double t_dnnl = row("oneDNN", f_dnnl, bd_dnnl, bw_dnnl);
  const double t_blas = row("im2col+sgemm", f_blas, bd_blas, bw_blas);
  // The ratio people read: how many times longer im2col + OpenBLAS takes.
  std::printf("%-24s %-14s %8.2fx %8.2fx %8.2fx %8.2fx\n", name,
              "im2col/oneDNN", f_blas / f_dnnl, bd_blas / bd_dnnl,
              bw_blas / bw_dnnl, t_blas / t_dnnl);
}

}  // namespace
}  // namespace towerps::worker

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  if (reps < 1) {
    std::fprintf(stderr, "usage: conv_benchmark [reps >= 1]\n");
    return 2;
  }
  using towerps::worker::Conv2DShape;
  auto conv = [](int64_t n, int64_t c, int64_t hw, int64_t k) {
    Conv2DShape s;
    s.n = n, s.c = c, s.h = hw, s.w = hw, s.k = k, s.r = 3, s.s = 3;
    s.pad_h = 1, s.pad_w = 1;  // "same"
    return s;
  };
  std::printf("median of %d calls after 3 untimed; times in ms; GFLOP/s over "
              "the three directions; #wrong: elements outside 2 gamma_N * "
              "magnitude of each other\n", reps);
  std::printf("%-24s %-14s %9s %9s %9s %9s %8s %7s\n", "conv (batch 64)",
              "impl", "fwd", "bwd_data", "bwd_wt", "total", "GFLOP/s",
              "#wrong");
  towerps::worker::Run("1->32 3x3 28x28 pad1", conv(64, 1, 28, 32), reps);
  towerps::worker::Run("32->64 3x3 14x14 pad1", conv(64, 32, 14, 64), reps);
  return 0;
}
