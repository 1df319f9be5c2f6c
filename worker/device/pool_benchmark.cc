// Micro-benchmark: the CPU backend's pooling (cpu_pool.h, our NCHW kernels)
// against oneDNN's (dnnl_kernels.h; for NCHW data oneDNN 2.6 picks its
// reference kernel, `simple_nchw`), forward and backward, on the built-in
// models' pooling layers, at --threads CPU math threads.
//
// Each direction is warmed up untimed, then timed over `reps` calls (the
// median is printed). The two are checked against each other in the same
// run: max pooling's outputs and gradients must agree bit for bit (the same
// winners), average pooling's within 4 float roundings of their magnitude
// (different orders of the same few terms): `#wrong` counts the elements
// that do not, so 0 is expected.
//
//   bazel run -c opt //worker/device:pool_benchmark [-- reps [threads]]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/dnnl_kernels.h"
#include "worker/device/micro_benchmark.h"

namespace towerps::worker {
namespace {

void Die(const absl::Status& s) { ExitUnlessOk("pool_benchmark", s); }

std::vector<float> Random(int64_t n, unsigned seed, bool relu) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = relu ? std::max(0.0f, dist(gen)) : dist(gen);
  return v;
}

// Elements of a and b that differ: in any bit (max pooling) or by more than
// 4 roundings of their magnitude (average pooling).
int64_t Wrong(const std::vector<float>& a, const std::vector<float>& b, bool exact) {
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (exact) {
      wrong += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    } else {
      const double bound = 4 * std::ldexp(1.0, -24) * std::max(std::fabs(a[i]), std::fabs(b[i]));
      wrong += !(std::fabs(double{a[i]} - b[i]) <= bound);
    }
  }
  return wrong;
}

void Run(const char* name, const Pool2DShape& s, bool max, int reps) {
  auto backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<DnnlKernels>> dnnl = NewDnnlKernels();
  Die(dnnl.status());
  // The input as a ReLU leaves it (cnn_small's max pooling follows one):
  // half zeros, many windows with equal maxima.
  const auto x = Random(s.x_size(), 1, max), dy = Random(s.y_size(), 2, false);
  std::vector<float> y1(s.y_size()), y2(s.y_size()), dx1(s.x_size()), dx2(s.x_size());
  std::vector<float> ws1(s.workspace_size()), ws2(s.workspace_size());
  double f1, b1, f2, b2;
  if (max) {
    DnnlKernels& k = **dnnl;
    f1 = MedianMs(reps, [&] { Die(k.MaxPool2DForward(s, x.data(), y1.data(), ws1.data())); });
    b1 = MedianMs(reps, [&] { Die(k.MaxPool2DBackward(s, ws1.data(), dy.data(), dx1.data())); });
    f2 = MedianMs(reps,
                  [&] { Die(backend->MaxPool2DForward(s, x.data(), y2.data(), ws2.data())); });
    b2 = MedianMs(reps, [&] {
      Die(backend->MaxPool2DBackward(s, x.data(), y2.data(), ws2.data(), dy.data(), dx2.data()));
    });
  } else {
    f1 = MedianMs(reps, [&] { Die((*dnnl)->AvgPool2DForward(s, x.data(), y1.data())); });
    b1 = MedianMs(reps, [&] { Die((*dnnl)->AvgPool2DBackward(s, dy.data(), dx1.data())); });
    f2 = MedianMs(reps, [&] { Die(backend->AvgPool2DForward(s, x.data(), y2.data())); });
    b2 = MedianMs(reps, [&] { Die(backend->AvgPool2DBackward(s, dy.data(), dx2.data())); });
  }
  const int64_t wrong = Wrong(y1, y2, max) + Wrong(dx1, dx2, max);
  std::printf("%-34s %-12s %9.3f %9.3f %9.3f %7lld\n", name, "oneDNN", f1, b1, f1 + b1,
              static_cast<long long>(wrong));
  std::printf("%-34s %-12s %9.3f %9.3f %9.3f\n", name, "cpu_pool", f2, b2, f2 + b2);
  std::printf("%-34s %-12s %8.2fx %8.2fx %8.2fx\n", name, "oneDNN/ours", f1 / f2, b1 / b2,
              (f1 + b1) / (f2 + b2));
}

Pool2DShape Pool(int64_t n, int64_t c, int64_t hw, int64_t window, int stride) {
  Pool2DShape s;
  s.n = n, s.c = c, s.h = s.w = hw, s.r = s.s = window;
  s.stride_h = s.stride_w = stride;
  return s;
}

}  // namespace
}  // namespace towerps::worker

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  if (reps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: pool_benchmark [reps >= 1 [threads >= 1]]\n");
    return 2;
  }
  using towerps::worker::Pool;
  towerps::worker::SetCpuMathThreads(threads);
  std::printf("median of %d calls after 3 untimed, %d CPU math thread(s); times in ms; #wrong: "
              "elements where the two disagree (max: any bit; avg: over 4 roundings)\n",
              reps, threads);
  std::printf("%-34s %-12s %9s %9s %9s %7s\n", "pooling", "impl", "fwd", "bwd", "total",
              "#wrong");
  towerps::worker::Run("cnn_small max 2x2/2 32ch 26x26 n64", Pool(64, 32, 26, 2, 2), true, reps);
  towerps::worker::Run("lenet avg 2x2/2 6ch 28x28 n256", Pool(256, 6, 28, 2, 2), false, reps);
  towerps::worker::Run("lenet avg 2x2/2 16ch 10x10 n256", Pool(256, 16, 10, 2, 2), false, reps);
  towerps::worker::Run("resnet_cifar global avg 64ch 8x8 n128", Pool(128, 64, 8, 8, 1), false,
                       reps);
  return 0;
}
