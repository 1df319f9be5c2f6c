// Worker compute throughput: forward + backward (ComputeGradients) of the MLP
// and the dense stack on CPU, with 1..N towers, and the dense stack's achieved
// GEMM FLOP/s as a fraction of a plain BLAS SGEMM of the same shapes measured
// in the same run. No parameter server: this isolates the worker's math.
//
//   bazel run -c opt //tests/bench:worker_throughput [-- --seconds=2 --towers=1,2]
//
// Correctness in the same run: the reduced gradient with N towers must match
// one tower's (the `wrong` column counts elements off by more than 1e-4 rel).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/backend.h"
#include "worker/job_spec.h"
#include "worker/towers.h"

ABSL_FLAG(double, seconds, 2.0, "Timed seconds per row (after warm-up).");
ABSL_FLAG(std::string, towers, "1,2", "Tower counts to sweep.");

namespace towerps::worker {
namespace {

using Clock = std::chrono::steady_clock;

Batch RandomBatch(const v1::ModelSpec& spec, int64_t rows, int64_t out_dim) {
  Batch b;
  b.features = common::Tensor({rows, spec.input_dim()});
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = u(gen);
  if (spec.loss() == v1::SOFTMAX_CROSS_ENTROPY) {
    for (int64_t i = 0; i < rows; ++i) b.labels.push_back(static_cast<int32_t>(i % out_dim));
  } else {
    b.targets = common::Tensor({rows, out_dim});
    b.targets.Fill(1.0f);
  }
  return b;
}

// GEMM flops of one ComputeGradients: forward x*W, backward dW and dx (no dx
// for the first layer).
double GemmFlops(const v1::ModelSpec& spec, int64_t batch) {
  double flops = 0;
  int64_t in = spec.input_dim();
  for (int i = 0; i < spec.layers_size(); ++i) {
    const int64_t out = spec.layers(i).units();
    flops += (i == 0 ? 4.0 : 6.0) * batch * in * out;
    in = out;
  }
  return flops;
}

// Same GEMMs through plain cblas_sgemm, no model around them: the ceiling.
double ReferenceGemmSeconds(const v1::ModelSpec& spec, int64_t batch, int reps) {
  std::vector<std::vector<float>> w, x, y;
  int64_t in = spec.input_dim();
  for (int i = 0; i < spec.layers_size(); ++i) {
    const int64_t out = spec.layers(i).units();
    w.emplace_back(in * out, 0.01f);
    x.emplace_back(batch * std::max(in, out), 0.5f);
    y.emplace_back(std::max({batch * out, in * out, batch * in}), 0.0f);
    in = out;
  }
  auto run = [&] {
    int64_t in = spec.input_dim();
    for (int i = 0; i < spec.layers_size(); ++i) {
      const int64_t out = spec.layers(i).units();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in, 1.0f, x[i].data(),
                  in, w[i].data(), out, 0.0f, y[i].data(), out);  // forward
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f, x[i].data(),
                  in, x[i].data(), out, 0.0f, y[i].data(), out);  // dW = x^T dy
      if (i > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out, 1.0f,
                    x[i].data(), out, w[i].data(), out, 0.0f, y[i].data(), in);  // dx
      }
      in = out;
    }
  };
  run();
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) run();
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

struct Row {
  std::string model;
  int towers;
  int64_t batch;
  double examples_per_s;
  double gflops;
  double ref_gflops;
  int64_t wrong;
};

Row Measure(const std::string& name, int towers, double seconds,
            const std::vector<common::Tensor>* reference_grads,
            std::vector<common::Tensor>* grads_out) {
  v1::JobSpec job = *BuiltinJob(name);
  const v1::ModelSpec& spec = job.model();
  const int64_t batch = job.global_batch_size();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  openblas_set_num_threads(BlasThreadsPerTower(cores, towers));
  auto t = Towers::Create(spec, towers, [] { return NewCpuBackend(); });
  (*t)->primary().InitializeWeights();
  const int64_t out_dim = (*t)->primary().output_dim();
  Batch b = RandomBatch(spec, batch, out_dim);
  for (int i = 0; i < 3; ++i) (void)(*t)->ComputeGradients(b);  // warm up
  int64_t steps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    (void)(*t)->ComputeGradients(b);
    ++steps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  Row row{name, towers, batch, steps * batch / elapsed, 0, 0, 0};
  row.gflops = GemmFlops(spec, batch) * steps / elapsed / 1e9;
  openblas_set_num_threads(cores);  // the ceiling uses the whole machine
  const double ref_s = ReferenceGemmSeconds(spec, batch, std::max<int64_t>(3, steps / 2));
  row.ref_gflops = GemmFlops(spec, batch) / ref_s / 1e9;
  std::vector<common::Tensor> grads;
  for (common::Tensor* g : (*t)->gradients()) grads.push_back(*g);
  if (reference_grads != nullptr) {
    for (size_t v = 0; v < grads.size(); ++v) {
      for (int64_t i = 0; i < grads[v].num_elements(); ++i) {
        const float a = (*reference_grads)[v][i], g = grads[v][i];
        if (!(std::abs(a - g) <= 1e-6f + 1e-4f * std::abs(a))) ++row.wrong;
      }
    }
  }
  if (grads_out) *grads_out = std::move(grads);
  return row;
}

}  // namespace
}  // namespace towerps::worker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> tower_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_towers), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      std::fprintf(stderr, "--towers: bad count \"%.*s\"\n", static_cast<int>(s.size()), s.data());
      return 2;
    }
    tower_counts.push_back(n);
  }
  std::printf("worker_throughput: ComputeGradients (forward + loss + backward) on CPU, no ps\n");
  std::printf("  cores: %u; BLAS threads per tower = cores / towers; %.1f s timed per row after 3 warm-up steps\n",
              std::thread::hardware_concurrency(), absl::GetFlag(FLAGS_seconds));
  std::printf("  gemm GFLOP/s counts forward, dW and dx GEMMs; ref = the same GEMMs through plain cblas_sgemm\n"
              "  with all cores, measured now; wrong = gradient elements that differ from 1 tower\n\n");
  std::printf("%-12s %6s %6s %12s %11s %11s %8s %7s\n", "model", "towers", "batch", "examples/s",
              "gemm_GF/s", "ref_GF/s", "of_ref", "wrong");
  int64_t total_wrong = 0;
  for (const std::string name : {"mlp", "dense_stack"}) {
    std::vector<towerps::common::Tensor> one;
    for (size_t k = 0; k < tower_counts.size(); ++k) {
      const bool first = k == 0;
      towerps::worker::Row r = towerps::worker::Measure(
          name, tower_counts[k], absl::GetFlag(FLAGS_seconds), first ? nullptr : &one,
          first ? &one : nullptr);
      total_wrong += r.wrong;
      std::printf("%-12s %6d %6lld %12.0f %11.2f %11.2f %8.3f %7lld\n", r.model.c_str(), r.towers,
                  static_cast<long long>(r.batch), r.examples_per_s, r.gflops, r.ref_gflops,
                  r.gflops / r.ref_gflops, static_cast<long long>(r.wrong));
    }
  }
  return total_wrong == 0 ? 0 : 1;
}
