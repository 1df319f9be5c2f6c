// Micro-benchmark: the CPU backend's batch norm (cpu_batch_norm.h, ours)
// against oneDNN's (dnnl_kernels.h; for the plain layout oneDNN 2.6 picks
// `ncsp_bnorm`), training forward and backward, on the built-in models'
// batch-norm shapes and a dense one, at --threads CPU math threads.
//
// Each direction is warmed up untimed, then timed over `reps` calls (the
// median is printed). The two are checked against each other in the same
// run: `#wrong` counts the elements of y, mean, var, dx, dgamma and dbeta
// where they differ by more than 2^-16 of the largest magnitude in that
// output (float sums of up to a million terms in different orders, then a
// few roundings), so 0 is expected.
//
//   bazel run -c opt //worker/device:batch_norm_benchmark [-- reps [threads]]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

void Die(const absl::Status& s) { ExitUnlessOk("batch_norm_benchmark", s); }

// Normal values around `mean` (a convolution's output is not centred).
std::vector<float> Random(int64_t n, unsigned seed, float mean) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

int64_t Wrong(const std::vector<float>& a, const std::vector<float>& b) {
  double largest = 0;
  for (float v : a) largest = std::max(largest, std::fabs(double{v}));
  const double bound = std::ldexp(largest, -16);
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += !(std::fabs(double{a[i]} - b[i]) <= bound);
  return wrong;
}

void Run(const char* name, int64_t n, int64_t c, int64_t spatial, int reps) {
  BatchNormShape s;
  s.n = n, s.c = c, s.spatial = spatial;
  auto backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<DnnlKernels>> dnnl = NewDnnlKernels();
  Die(dnnl.status());
  DnnlKernels& k = **dnnl;
  const auto x = Random(s.x_size(), 1, 0.5f), dy = Random(s.x_size(), 2, 0.0f);
  const auto gamma = Random(c, 3, 1.0f), beta = Random(c, 4, 0.0f);
  struct Out {
    std::vector<float> y, mean, var, dx, dgamma, dbeta;
  };
  auto fresh = [&] {
    return Out{std::vector<float>(s.x_size()), std::vector<float>(c), std::vector<float>(c),
               std::vector<float>(s.x_size()), std::vector<float>(c), std::vector<float>(c)};
  };
  Out a = fresh(), b = fresh();
  const double f1 = MedianMs(reps, [&] {
    Die(k.BatchNormForwardTraining(s, x.data(), gamma.data(), beta.data(), a.y.data(),
                                   a.mean.data(), a.var.data()));
  });
  const double b1 = MedianMs(reps, [&] {
    Die(k.BatchNormBackward(s, x.data(), dy.data(), gamma.data(), a.mean.data(), a.var.data(),
                            a.dx.data(), a.dgamma.data(), a.dbeta.data()));
  });
  const double f2 = MedianMs(reps, [&] {
    Die(backend->BatchNormForwardTraining(s, x.data(), gamma.data(), beta.data(), b.y.data(),
                                          b.mean.data(), b.var.data()));
  });
  const double b2 = MedianMs(reps, [&] {
    Die(backend->BatchNormBackward(s, x.data(), dy.data(), gamma.data(), b.mean.data(),
                                   b.var.data(), b.dx.data(), b.dgamma.data(), b.dbeta.data()));
  });
  const int64_t wrong = Wrong(a.y, b.y) + Wrong(a.mean, b.mean) + Wrong(a.var, b.var) +
                        Wrong(a.dx, b.dx) + Wrong(a.dgamma, b.dgamma) + Wrong(a.dbeta, b.dbeta);
  std::printf("%-34s %-14s %9.3f %9.3f %9.3f %7lld\n", name, "oneDNN", f1, b1, f1 + b1,
              static_cast<long long>(wrong));
  std::printf("%-34s %-14s %9.3f %9.3f %9.3f\n", name, "cpu_batch_norm", f2, b2, f2 + b2);
  std::printf("%-34s %-14s %8.2fx %8.2fx %8.2fx\n", name, "oneDNN/ours", f1 / f2, b1 / b2,
              (f1 + b1) / (f2 + b2));
}

}  // namespace
}  // namespace towerps::worker

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  if (reps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: batch_norm_benchmark [reps >= 1 [threads >= 1]]\n");
    return 2;
  }
  towerps::worker::SetCpuMathThreads(threads);
  std::printf("median of %d calls after 3 untimed, %d CPU math thread(s); times in ms; #wrong: "
              "elements where the two differ by over 2^-16 of the output's largest\n",
              reps, threads);
  std::printf("%-34s %-14s %9s %9s %9s %7s\n", "batch norm (training)", "impl", "fwd", "bwd",
              "total", "#wrong");
  using towerps::worker::Run;
  Run("resnet_cifar 16ch 32x32 n128", 128, 16, 32 * 32, reps);
  Run("resnet_cifar 32ch 16x16 n128", 128, 32, 16 * 16, reps);
  Run("resnet_cifar 64ch 8x8 n128", 128, 64, 8 * 8, reps);
  Run("resnet18 64ch 28x28 n32", 32, 64, 28 * 28, reps);
  Run("resnet18 512ch 4x4 n32", 32, 512, 4 * 4, reps);
  Run("dense 256 features n128", 128, 256, 1, reps);
  return 0;
}
