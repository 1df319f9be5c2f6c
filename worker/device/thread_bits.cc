// Which of the CPU backend's ops give the same bits at every CPU math thread
// count (--blas_threads, or the counts --adapt_blas_threads moves between).
// Each op runs on the shapes of the built-in models (at their default
// batch sizes), once per thread count, on a fresh backend; the table counts
// the output elements whose bits differ from the 1-thread result.
//
// The GEMMs are split by the backend itself (worker/device/cpu_gemm.h),
// pooling pools each image plane on one thread (cpu_pool.h) and batch norm
// sums each channel on one thread (cpu_batch_norm.h): 0 everywhere;
// convolution is oneDNN's, whose kernels split their sums by the thread
// count they were created for.
//
//   bazel run -c opt //worker/device:thread_bits [-- 1,2,3,4,8]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/cpu_gemm.h"
#include "worker/device/cpu_threads.h"

namespace towerps::worker {
namespace {

std::vector<float> Random(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void Die(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "thread_bits: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// The outputs of one op (several arrays: y, mean, var, ...), one run.
using Outputs = std::vector<std::vector<float>>;

int64_t BitsDiffer(const Outputs& a, const Outputs& b) {
  int64_t n = 0;
  for (size_t o = 0; o < a.size(); ++o) {
    for (size_t i = 0; i < a[o].size(); ++i) {
      n += std::memcmp(&a[o][i], &b[o][i], sizeof(float)) != 0;
    }
  }
  return n;
}

int64_t Elements(const Outputs& a) {
  int64_t n = 0;
  for (const auto& v : a) n += static_cast<int64_t>(v.size());
  return n;
}

struct Case {
  std::string op, shape;
  std::function<Outputs(Backend&)> run;
};

Conv2DShape Conv(int64_t n, int64_t c, int64_t hw, int64_t k, int64_t r, int stride, int pad) {
  Conv2DShape s;
  s.n = n, s.c = c, s.h = hw, s.w = hw, s.k = k, s.r = r, s.s = r;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

void AddConvCases(const std::string& name, const Conv2DShape& s, std::vector<Case>* cases) {
  auto x = std::make_shared<std::vector<float>>(Random(s.x_size(), 1));
  auto w = std::make_shared<std::vector<float>>(Random(s.w_size(), 2));
  auto b = std::make_shared<std::vector<float>>(Random(s.k, 3));
  auto dy = std::make_shared<std::vector<float>>(Random(s.y_size(), 4));
  cases->push_back({"conv forward", name, [=](Backend& be) {
                      Outputs o{std::vector<float>(s.y_size())};
                      Die(be.Conv2DForward(s, x->data(), w->data(), b->data(), o[0].data()));
                      return o;
                    }});
  cases->push_back({"conv backward data", name, [=](Backend& be) {
                      Outputs o{std::vector<float>(s.x_size())};
                      Die(be.Conv2DBackwardData(s, dy->data(), w->data(), o[0].data()));
                      return o;
                    }});
  cases->push_back({"conv backward weights", name, [=](Backend& be) {
                      Outputs o{std::vector<float>(s.w_size()), std::vector<float>(s.k)};
                      Die(be.Conv2DBackwardWeights(s, x->data(), dy->data(), o[0].data(),
                                                   o[1].data()));
                      return o;
                    }});
}

void AddPoolCases(const std::string& name, const Pool2DShape& s, bool max,
                  std::vector<Case>* cases) {
  auto x = std::make_shared<std::vector<float>>(Random(s.x_size(), 5));
  auto dy = std::make_shared<std::vector<float>>(Random(s.y_size(), 6));
  cases->push_back({max ? "max pool fwd+bwd" : "avg pool fwd+bwd", name, [=](Backend& be) {
                      Outputs o{std::vector<float>(s.y_size()), std::vector<float>(s.x_size())};
                      if (max) {
                        std::vector<float> ws(s.workspace_size());
                        Die(be.MaxPool2DForward(s, x->data(), o[0].data(), ws.data()));
                        Die(be.MaxPool2DBackward(s, x->data(), o[0].data(), ws.data(),
                                                 dy->data(), o[1].data()));
                      } else {
                        Die(be.AvgPool2DForward(s, x->data(), o[0].data()));
                        Die(be.AvgPool2DBackward(s, dy->data(), o[1].data()));
                      }
                      return o;
                    }});
}

void AddBatchNormCase(const std::string& name, int64_t n, int64_t c, int64_t spatial,
                      std::vector<Case>* cases) {
  BatchNormShape s;
  s.n = n, s.c = c, s.spatial = spatial, s.epsilon = 1e-5f;
  auto x = std::make_shared<std::vector<float>>(Random(s.x_size(), 7));
  auto dy = std::make_shared<std::vector<float>>(Random(s.x_size(), 8));
  auto gamma = std::make_shared<std::vector<float>>(Random(c, 9));
  auto beta = std::make_shared<std::vector<float>>(Random(c, 10));
  cases->push_back({"batch norm fwd+bwd", name, [=](Backend& be) {
                      Outputs o(6);
                      o[0].resize(s.x_size()), o[1].resize(c), o[2].resize(c);
                      o[3].resize(s.x_size()), o[4].resize(c), o[5].resize(c);
                      Die(be.BatchNormForwardTraining(s, x->data(), gamma->data(), beta->data(),
                                                      o[0].data(), o[1].data(), o[2].data()));
                      Die(be.BatchNormBackward(s, x->data(), dy->data(), gamma->data(),
                                               o[1].data(), o[2].data(), o[3].data(),
                                               o[4].data(), o[5].data()));
                      return o;
                    }});
}

void AddGemmCase(const std::string& name, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 std::vector<Case>* cases) {
  auto a = std::make_shared<std::vector<float>>(Random(m * k, 11));
  auto b = std::make_shared<std::vector<float>>(Random(k * n, 12));
  cases->push_back({"gemm", name, [=](Backend& be) {
                      Outputs o{std::vector<float>(m * n)};
                      be.Gemm(ta, tb, m, n, k, 1.0f, a->data(), b->data(), 0.0f, o[0].data());
                      return o;
                    }});
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  // The MLP's products at batch 256 (forward, both backward) and the dense
  // stack's at batch 10.
  AddGemmCase("mlp 256x784 * 784x256", false, false, 256, 256, 784, &c);
  AddGemmCase("mlp dW 784x256 (A^T B)", true, false, 784, 256, 256, &c);
  AddGemmCase("mlp dX 256x784 (A B^T)", false, true, 256, 784, 256, &c);
  AddGemmCase("dense_stack 10x1000 * 1000x1000", false, false, 10, 1000, 1000, &c);
  // cnn_small (batch 64), LeNet (256), ResNet-20 for CIFAR (128), ResNet-18
  // (256: its first stage and its last).
  AddConvCases("cnn_small 1->32 3x3 28x28 n64", Conv(64, 1, 28, 32, 3, 1, 0), &c);
  AddConvCases("lenet 6->16 5x5 14x14 n256", Conv(256, 6, 14, 16, 5, 1, 0), &c);
  AddConvCases("resnet_cifar 16->16 3x3 32x32 n128", Conv(128, 16, 32, 16, 3, 1, 1), &c);
  AddConvCases("resnet_cifar 16->32 3x3/2 n128", Conv(128, 16, 32, 32, 3, 2, 1), &c);
  AddConvCases("resnet18 64->64 3x3 28x28 n256", Conv(256, 64, 28, 64, 3, 1, 1), &c);
  AddConvCases("resnet18 512->512 3x3 4x4 n256", Conv(256, 512, 4, 512, 3, 1, 1), &c);
  Pool2DShape p;
  p.n = 64, p.c = 32, p.h = p.w = 26, p.r = p.s = 2, p.stride_h = p.stride_w = 2;
  AddPoolCases("cnn_small 2x2 26x26 n64", p, true, &c);
  Pool2DShape q;
  q.n = 256, q.c = 6, q.h = q.w = 28, q.r = q.s = 2, q.stride_h = q.stride_w = 2;
  AddPoolCases("lenet 2x2 28x28 n256", q, false, &c);
  AddBatchNormCase("resnet_cifar 16ch 32x32 n128", 128, 16, 32 * 32, &c);
  AddBatchNormCase("resnet18 64ch 28x28 n256", 256, 64, 28 * 28, &c);
  AddBatchNormCase("resnet18 512ch 4x4 n256", 256, 512, 4 * 4, &c);
  return c;
}

}  // namespace
}  // namespace towerps::worker

int main(int argc, char** argv) {
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(argc > 1 ? argv[1] : "1,2,3,4,8", ',')) {
    int t = 0;
    if (!absl::SimpleAtoi(part, &t) || t < 1) {
      std::fprintf(stderr, "usage: thread_bits [COUNTS, e.g. 1,2,3,4,8; each >= 1]\n");
      return 2;
    }
    counts.push_back(t);
  }
  using namespace towerps::worker;  // NOLINT: a tool's main
  std::printf("elements whose bits differ from the %d-thread result (of all the op's outputs); "
              "GEMM row granule %d\n", counts[0], CpuGemmRowGranule());
  std::printf("%-22s %-34s %11s", "op", "shape", "elements");
  for (size_t i = 1; i < counts.size(); ++i) std::printf(" %8s%-2d", "threads=", counts[i]);
  std::printf("\n");
  for (const Case& c : Cases()) {
    Outputs first;
    std::printf("%-22s %-34s", c.op.c_str(), c.shape.c_str());
    for (size_t i = 0; i < counts.size(); ++i) {
      SetCpuMathThreads(counts[i]);
      std::unique_ptr<Backend> backend = NewCpuBackend();
      Outputs out = c.run(*backend);
      if (i == 0) {
        first = std::move(out);
        std::printf(" %11lld", static_cast<long long>(Elements(first)));
      } else {
        std::printf(" %10lld", static_cast<long long>(BitsDiffer(first, out)));
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
