// Worker compute throughput: forward + backward (ComputeGradients) of the MLP,
// the dense stack and the image models (cnn_small, resnet18) on CPU and,
// where there is a GPU, on GPU, with 1..N towers, and the achieved GEMM
// FLOP/s as a fraction of a plain SGEMM of the same shapes (the CPU
// backend's Gemm on CPU, worker/device/cpu_gemm.h: cblas_sgemm on one
// thread per block of rows; one cublasSgemm per GEMM on GPU) measured in the
// same run. No parameter server: this isolates the worker's math. On
// GPU, one more row: the dense stack split layer by layer over 12 virtual
// devices of GPU 0 (the classic layout).
//
//   bazel run -c opt //tests/bench:worker_throughput [-- --seconds=2 --towers=1,2 --devices=cpu,gpu
//       --models=mlp,dense_stack,cnn_small,resnet18 --threads=0 --batch=0]
//
// Image models run at the batch the issue that added them measures at:
// cnn_small 64, resnet18 32 on CPU and 256 on GPU (their own job's batch
// otherwise; --batch sets one for every row). Their GEMM columns are "-": most of their work is convolution,
// which the backend runs through oneDNN (CPU) or cuDNN (GPU), named in the
// device column.
//
// Correctness in the same run: the reduced gradient with N towers must match
// one tower's (the `wrong` column counts elements off by more than 1e-4 rel;
// n/a for models with batch norm or dropout, whose towers differ by design).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/blas_kernels.h"
#include "common/host_limits.h"
#include "common/job_spec.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/gpu_info.h"
#include "worker/model/device_placer.h"
#include "worker/train/towers.h"

ABSL_FLAG(double, seconds, 2.0, "Timed seconds per row (after warm-up).");
ABSL_FLAG(std::string, towers, "1,2", "Tower counts to sweep.");
ABSL_FLAG(std::string, devices, "cpu,gpu", "Backends to measure (gpu is skipped, saying why, without one).");
ABSL_FLAG(std::string, models, "mlp,dense_stack,cnn_small,resnet18", "Builtin models to measure.");
ABSL_FLAG(int64_t, batch, 0,
          "Examples per step for every row; 0: each model's own (see above). "
          "tests/bench/step_breakdown.sh sets a cluster worker's batch, to compare with its steps.");
ABSL_FLAG(std::string, threads, "0",
          "CPU math threads per tower (BLAS and oneDNN) to sweep; 0: cores / towers.");

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

// Whether every layer is Dense: the GEMM columns describe the whole step.
bool AllDense(const v1::ModelSpec& spec) {
  for (const auto& l : spec.layers()) {
    if (l.type() != v1::LayerSpec::DENSE) return false;
  }
  return true;
}

// Whether N towers give one device's gradient (up to rounding).
bool TowerInvariant(const v1::ModelSpec& spec) {
  for (const auto& l : spec.layers()) {
    if (l.type() == v1::LayerSpec::BATCH_NORM || l.type() == v1::LayerSpec::RESIDUAL_BLOCK ||
        l.type() == v1::LayerSpec::DROPOUT) {
      return false;
    }
  }
  return true;
}

// The batch a row runs at (see the file comment).
int64_t BenchBatch(const std::string& name, const std::string& device, const v1::JobSpec& job) {
  if (absl::GetFlag(FLAGS_batch) > 0) return absl::GetFlag(FLAGS_batch);
  if (name == "cnn_small") return 64;
  if (name == "resnet18") return device == "cpu" ? 32 : 256;
  return job.global_batch_size();
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

// Same GEMMs straight through a backend's Gemm (CpuGemm or one cublasSgemm
// each), no model around them: the ceiling.
double ReferenceGemmSeconds(Backend& be, const v1::ModelSpec& spec, int64_t batch, int reps) {
  std::vector<float*> w, x, y;
  int64_t in = spec.input_dim();
  for (int i = 0; i < spec.layers_size(); ++i) {
    const int64_t out = spec.layers(i).units();
    const int64_t sizes[3] = {in * out, batch * std::max(in, out),
                              std::max({batch * out, in * out, batch * in})};
    for (int k = 0; k < 3; ++k) {
      float* p = *be.Allocate(sizes[k]);
      std::vector<float> fill(sizes[k], k == 0 ? 0.01f : 0.5f);
      be.CopyFromHost(fill.data(), sizes[k], p);
      (k == 0 ? w : k == 1 ? x : y).push_back(p);
    }
    in = out;
  }
  auto run = [&] {
    int64_t in = spec.input_dim();
    for (int i = 0; i < spec.layers_size(); ++i) {
      const int64_t out = spec.layers(i).units();
      be.Gemm(false, false, batch, out, in, 1.0f, x[i], w[i], 0.0f, y[i]);  // forward
      be.Gemm(true, false, in, out, batch, 1.0f, x[i], x[i], 0.0f, y[i]);   // dW = x^T dy
      if (i > 0) be.Gemm(false, true, batch, in, out, 1.0f, x[i], w[i], 0.0f, y[i]);  // dx
      in = out;
    }
  };
  run();
  (void)be.Synchronize();
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) run();
  (void)be.Synchronize();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  for (auto* v : {&w, &x, &y}) for (float* p : *v) be.Free(p);
  return s;
}

struct Row {
  std::string device;
  std::string model;
  int towers;
  int threads;  // CPU math threads per tower; 0 on GPU rows.
  int64_t batch;
  double examples_per_s;
  double gflops;
  double ref_gflops;
  int64_t wrong;
};

using BackendMaker = std::function<std::unique_ptr<Backend>()>;

// `split_devices` > 0: one tower, its layers over that many backends from
// `make` in the classic layout.
Row Measure(const std::string& device, const BackendMaker& make, const std::string& name,
            int towers, int threads_flag, int split_devices, double seconds,
            const std::vector<common::Tensor>* reference_grads,
            std::vector<common::Tensor>* grads_out) {
  v1::JobSpec job = *BuiltinJob(name);
  v1::ModelSpec spec = job.model();
  const int64_t batch = BenchBatch(name, device, job);
  const bool dense = AllDense(spec);
  const int cores = common::UsableCores().usable;  // as a worker counts them
  const int threads = threads_flag > 0 ? threads_flag : CpuThreadsPerTower(cores, towers);
  SetCpuMathThreads(threads);
  std::vector<std::unique_ptr<Backend>> split;
  absl::StatusOr<std::unique_ptr<Towers>> t;
  if (split_devices > 0) {
    std::vector<std::string> names;
    for (int i = 0; i < split_devices; ++i) {
      split.push_back(make());
      names.push_back(absl::StrCat("D:", i));
    }
    (void)ApplyClassicLayout(names, &spec);
    t = Towers::Create(spec, 1, [&](int) -> Model::LayerPlacer {
      return [&](const std::string&, const std::string& dev) -> absl::StatusOr<Model::LayerPlacement> {
        int i = 0;
        (void)absl::SimpleAtoi(dev.substr(2), &i);
        return Model::LayerPlacement{split[i].get(), dev};
      };
    });
  } else {
    t = Towers::Create(spec, towers, make);
  }
  if (!t.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(t.status().message()).c_str());
    std::exit(1);
  }
  (*t)->primary().InitializeWeights();
  const int64_t out_dim = (*t)->primary().output_dim();
  Batch b = RandomBatch(spec, batch, out_dim);
  for (int i = 0; i < 3; ++i) {
    auto r = (*t)->ComputeGradients(b);  // warm up
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(r.status().message()).c_str());
      std::exit(1);
    }
  }
  int64_t steps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    (void)(*t)->ComputeGradients(b);  // synchronous: ends with the download
    ++steps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // Image models name the library their convolutions run on.
  const std::string label = dense ? device : device + (device == "cpu" ? "/onednn" : "/cudnn");
  Row row{label, split_devices > 0 ? name + "/split" + std::to_string(split_devices) : name,
          towers, device == "cpu" ? threads : 0, batch, steps * batch / elapsed, 0, 0, 0};
  if (dense) {
    row.gflops = GemmFlops(spec, batch) * steps / elapsed / 1e9;
    SetCpuMathThreads(cores);  // the ceiling uses the whole machine
    std::unique_ptr<Backend> ref = make();
    const double ref_s = ReferenceGemmSeconds(*ref, spec, batch, std::max<int64_t>(3, steps / 2));
    row.ref_gflops = GemmFlops(spec, batch) / ref_s / 1e9;
  }
  std::vector<common::Tensor> grads;
  for (common::Tensor* g : (*t)->gradients()) grads.push_back(*g);
  // Batch norm (statistics per tower) and dropout (a mask per tower) make
  // towers' gradients differ from one device's by design: no check.
  if (!TowerInvariant(spec)) {
    row.wrong = -1;
  } else if (reference_grads != nullptr) {
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
  // The kernels the worker and ps run with (common/blas_kernels.h).
  towerps::common::RestartWithBetterBlasKernels("worker_throughput", argv);
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
  std::vector<int> thread_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 0) {
      std::fprintf(stderr, "--threads: bad count \"%.*s\"\n", static_cast<int>(s.size()), s.data());
      return 2;
    }
    thread_counts.push_back(n);
  }
  std::printf("worker_throughput: ComputeGradients (forward + loss + backward), no ps\n");
  const towerps::common::CoreCount count = towerps::common::UsableCores();
  std::printf("  cores: %d%s; CPU: BLAS and oneDNN threads per tower = --threads, or cores /"
              " towers;\n  %.1f s timed per row after 3 warm-up steps; %s\n",
              count.usable,
              count.limit.empty()
                  ? ""
                  : absl::StrCat(" of the host's ", count.online, " usable (", count.limit, ")")
                        .c_str(),
              absl::GetFlag(FLAGS_seconds),
              towerps::common::BlasDescription().c_str());
  std::printf("  gemm GFLOP/s counts forward, dW and dx GEMMs; ref = the same GEMMs through the backend's plain\n"
              "  SGEMM (cblas_sgemm with all cores; cublasSgemm), measured now; wrong = gradient elements that\n"
              "  differ from the CPU's first row of the model (rel 1e-4; n/a with batch norm or dropout,\n"
              "  which make towers differ by design)\n");
  const towerps::worker::GpuInfo gpus = towerps::worker::QueryGpus();
  std::printf("  %s\n\n", towerps::worker::DescribeGpus(gpus).c_str());
  std::printf("%-10s %-20s %6s %7s %6s %12s %11s %11s %8s %7s\n", "device", "model", "towers",
              "threads", "batch", "examples/s", "gemm_GF/s", "ref_GF/s", "of_ref", "wrong");
  int64_t total_wrong = 0;
  const std::string which = absl::GetFlag(FLAGS_devices);
  const bool want_cpu = which.find("cpu") != std::string::npos;
  const bool want_gpu = which.find("gpu") != std::string::npos;
  bool have_gpu = towerps::worker::CudaBackendBuilt() && !gpus.devices.empty();
  if (want_gpu && !have_gpu) {
    std::printf("(gpu rows skipped: %s)\n", towerps::worker::CudaBackendBuilt()
                                                ? "no GPU visible"
                                                : "built without CUDA");
  }
  if (want_gpu && have_gpu) {
    // A GPU that is listed but unusable (a driver older than the runtime, a
    // GPU taken exclusively by another process) fails here; say so and
    // measure the CPU, as without a GPU.
    const auto probe = towerps::worker::NewCudaBackend(0);
    if (!probe.ok()) {
      have_gpu = false;
      std::printf("(gpu rows skipped: cannot create a CUDA backend on GPU 0: %s)\n",
                  probe.status().ToString().c_str());
    }
  }
  towerps::worker::BackendMaker cpu = [] { return towerps::worker::NewCpuBackend(); };
  towerps::worker::BackendMaker gpu = [] {
    auto backend = towerps::worker::NewCudaBackend(0);
    if (!backend.ok()) {
      // The probe above succeeded, so this is a failure in the middle of a
      // run (out of memory for another stream or handle): no row can be
      // measured meaningfully any more; stop, as Measure does on errors.
      std::fprintf(stderr, "gpu: NewCudaBackend(0): %s\n", backend.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(*backend);
  };
  auto print = [&](const towerps::worker::Row& r) {
    total_wrong += std::max<int64_t>(r.wrong, 0);
    const std::string wrong = r.wrong < 0 ? "n/a" : std::to_string(r.wrong);
    if (r.ref_gflops > 0) {
      std::printf("%-10s %-20s %6d %7d %6lld %12.0f %11.2f %11.2f %8.3f %7s\n", r.device.c_str(),
                  r.model.c_str(), r.towers, r.threads, static_cast<long long>(r.batch),
                  r.examples_per_s,
                  r.gflops, r.ref_gflops, r.gflops / r.ref_gflops,
                  wrong.c_str());
    } else {
      std::printf("%-10s %-20s %6d %7d %6lld %12.0f %11s %11s %8s %7s\n", r.device.c_str(),
                  r.model.c_str(), r.towers, r.threads, static_cast<long long>(r.batch),
                  r.examples_per_s,
                  "-", "-", "-", wrong.c_str());
    }
    std::fflush(stdout);
  };
  const double secs = absl::GetFlag(FLAGS_seconds);
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  for (const std::string& name : models) {
    std::vector<towerps::common::Tensor> one;
    bool have_one = false;
    for (const auto& [device, make] : {std::make_pair(std::string("cpu"), cpu),
                                       std::make_pair(std::string("gpu"), gpu)}) {
      if (device == "cpu" ? !want_cpu : !(want_gpu && have_gpu)) continue;
      for (int towers : tower_counts) {
        for (int threads : device == "cpu" ? thread_counts : std::vector<int>{0}) {
          print(towerps::worker::Measure(device, make, name, towers, threads, 0, secs,
                                         have_one ? &one : nullptr, have_one ? nullptr : &one));
          have_one = true;
        }
      }
      if (device == "gpu" && name == "dense_stack") {
        print(towerps::worker::Measure(device, make, name, 1, 0, 12, secs, &one, nullptr));
      }
    }
  }
  return total_wrong == 0 ? 0 : 1;
}
