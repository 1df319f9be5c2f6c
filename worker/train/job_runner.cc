#include "worker/train/job_runner.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/blas_kernels.h"
#include "common/host_limits.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/process_memory.h"
#include "common/status.h"
#include "worker/device/backend.h"
#include "worker/device/cpu_gemm.h"
#include "worker/device/cpu_thread_tuner.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/gpu_info.h"
#include "worker/model/dataset.h"
#include "worker/model/device_placer.h"
#include "worker/model/model.h"
#include "worker/model/model_limits.h"
#include "worker/train/ps_client.h"
#include "worker/train/towers.h"

namespace towerps::worker {
namespace {

void Log(const JobHooks& hooks, const std::string& line) {
  if (hooks.log) {
    hooks.log(line);
  } else {
    TLOG(INFO) << line;
  }
}

// How the CPU backend's GEMMs use their threads (worker/device/cpu_gemm.h),
// and whether `model` has oneDNN ops whose last bits follow the thread
// count (convolution's backward weights at most counts, its plain-layout
// forward at some: bazel run -c opt //worker/device:thread_bits; batch norm
// and pooling are the backend's own, exact at any count).
std::string GemmSplitNote(const v1::ModelSpec& model) {
  bool onednn_sums = false;
  for (const v1::LayerSpec& layer : model.layers()) {
    onednn_sums |= layer.type() == v1::LayerSpec::CONV2D ||
                   layer.type() == v1::LayerSpec::RESIDUAL_BLOCK;
  }
  const std::string onednn =
      onednn_sums ? "; convolutions (oneDNN) split their sums by the thread count, so this "
                    "model's last bits follow it"
                  : "";
  if (CpuGemmRowGranule() == 0) {
    return absl::StrCat("; GEMMs on OpenBLAS's own threads (no exact split on this CPU: the "
                        "last bits depend on the thread count)",
                        onednn);
  }
  return absl::StrCat("; GEMMs split by rows at multiples of ", CpuGemmRowGranule(),
                      " (the same bits at any thread count)", onednn);
}

}  // namespace

absl::StatusOr<std::vector<v1::VariableDef>> JobVariables(const v1::JobSpec& job) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(job.model(), *backend));
  return model->VariableDefs();
}

absl::StatusOr<TrainResult> RunJob(const WorkerEnv& env, const v1::JobSpec& job_in,
                                   const std::string& restore_from, const JobHooks& hooks) {
  v1::JobSpec job = job_in;
  const common::ClusterSpec& spec = env.cluster;
  DeviceManager& devices = *env.devices;
  const int num_workers = static_cast<int>(spec.worker.size());
  const bool chief = spec.is_chief();

  if (job.tower_devices_size() > 0) {
    if (job.towers() > 1 && job.towers() != job.tower_devices_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "towers = ", job.towers(), " but tower_devices names ", job.tower_devices_size()));
    }
    job.set_towers(job.tower_devices_size());
  }
  const int num_towers = std::max(1, job.towers());
  job.set_towers(num_towers);

  // With towers and per-layer devices, layers name devices of tower 0's
  // group (see TowerDevice); the classic layout uses that group.
  std::vector<std::string> device_names;
  for (const std::string type : {"CPU", "GPU"}) {
    const auto of_type = devices.DevicesOfType(type);
    const size_t group = of_type.size() / num_towers;
    for (size_t i = 0; i < (num_towers > 1 ? group : of_type.size()); ++i) {
      device_names.push_back(of_type[i]->short_name());
    }
  }
  if (env.layout == "classic") {
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        ApplyClassicLayout(device_names, job.mutable_model()), "layout"));
  } else if (!env.layout.empty()) {
    return absl::InvalidArgumentError("--layout must be \"classic\" or empty");
  }
  bool layers_placed = false;
  for (const auto& l : job.model().layers()) layers_placed |= !l.device().empty();
  if (layers_placed && job.tower_devices_size() > 0) {
    return absl::InvalidArgumentError(
        "tower_devices and per-layer devices together: name the layers' devices "
        "(tower t uses group t of the devices) or the towers', not both");
  }
  // Tower t runs on tower_devices[t], else the t-th device of the preferred
  // type (GPU if any).
  auto preferred = devices.DevicesOfType("GPU");
  if (preferred.empty()) preferred = devices.DevicesOfType("CPU");
  std::vector<std::string> tower_device(num_towers);
  std::vector<std::unique_ptr<DevicePlacer>> placers;
  for (int t = 0; t < num_towers; ++t) {
    placers.push_back(std::make_unique<DevicePlacer>(devices));
    if (layers_placed) continue;
    const std::string wanted = job.tower_devices_size() > 0
                                   ? job.tower_devices(t)
                                   : preferred[t % preferred.size()]->short_name();
    auto d = devices.Resolve(wanted, absl::StrCat("tower ", t));
    if (!d.ok()) return common::Annotate(d.status(), "tower_devices");
    tower_device[t] = (*d)->name();
    if (env.log_device_placement) Log(hooks, absl::StrCat("tower ", t, ": ", tower_device[t]));
  }
  // Issue 15 (limits): what the towers will hold, against this worker's
  // budget, before anything is built.
  {
    auto size = CheckModelLimits(job.model());
    if (!size.ok()) return common::Annotate(size.status(), "job spec");
    const int64_t per_tower = TowerBatch(job.global_batch_size(), num_workers, num_towers);
    const int64_t need = WorkerTrainingBytes(*size, per_tower, num_towers, job.micro_batches());
    if (need > env.memory_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job spec: the model needs about ", need, " bytes on this worker (",
          size->parameters, " parameters, ", size->activations_per_example,
          " activation floats per example x ", per_tower, " examples x ", num_towers,
          " towers, weights and gradients",
          job.micro_batches() > 1
              ? absl::StrCat(", and what adds up ", job.micro_batches(), " micro-batches")
              : "",
          "); its budget is ", env.memory_budget_bytes, " bytes (--memory_budget_bytes)"));
    }
  }
  auto towers_or = Towers::Create(job.model(), num_towers, [&](int t) {
    if (layers_placed && num_towers > 1) return placers[t]->TowerPlacer(t, num_towers);
    return placers[t]->Placer(tower_device[t]);
  });
  if (!towers_or.ok()) return common::Annotate(towers_or.status(), "model");
  std::unique_ptr<Towers> towers = std::move(*towers_or);
  // Dropout masks: a stream of its own for every tower of every worker.
  for (int t = 0; t < num_towers; ++t) {
    towers->tower(t).set_random_stream((static_cast<uint64_t>(spec.task_index) << 16) |
                                       static_cast<uint64_t>(t));
  }
  if (job.micro_batches() > 1) {
    towers->set_micro_batches(job.micro_batches());
    Log(hooks, absl::StrCat(job.micro_batches(), " micro-batches per tower step, ",
                            towers->primary().num_stages(), " pipeline stage(s)"));
  }
  if (env.log_device_placement && layers_placed) {
    for (int t = 0; t < num_towers; ++t) {
      const auto& where = towers->tower(t).layer_devices();
      Log(hooks, absl::StrCat("tower ", t, " layers: ", absl::StrJoin(where, ", ")));
    }
  }

  // Charge every tower's layers to their devices' memory limits now, so a
  // model that does not fit fails here with the device and the numbers. The
  // reservations are released when the job ends. The chief evaluates on
  // tower 0 in passes of the same batch (TowerBatch): an evaluation never
  // needs memory that training did not.
  const int64_t tower_batch = TowerBatch(job.global_batch_size(), num_workers, num_towers);
  std::vector<std::unique_ptr<MemoryReservation>> reservations;
  for (int t = 0; t < num_towers; ++t) {
    auto r = MemoryReservation::Reserve(towers->tower(t), devices, tower_batch);
    if (!r.ok()) {
      return common::Annotate(r.status(), absl::StrCat("tower ", t, " does not fit its devices"));
    }
    reservations.push_back(std::move(*r));
  }
  if (env.log_device_placement) Log(hooks, "devices:\n" + devices.Describe());
  TLOG(INFO) << spec.TaskName() << ": " << DescribeGpus(QueryGpus());
  Model* model = &towers->primary();
  // The CPU math (BLAS and oneDNN) of every tower of every worker on this
  // host shares its cores: never more threads in all than cores (spinning
  // teams of the two libraries, or of two processes, starve each other), and
  // half of them where servers share a host of 4 cores or more (see
  // CpuThreadsPerTower).
  int math_threads = 1;
  {
    const int stages = job.micro_batches() > 1 ? towers->primary().num_stages() : 1;
    const int parallel = num_towers * stages;
    const int on_host = spec.WorkersOnSameHost();
    const int ps_on_host = spec.PsOnSameHost();
    // The cores this worker may run on (its affinity, its cgroup's CPU
    // limit), not the host's: a team wider than those waits at every barrier.
    const common::CoreCount count = common::UsableCores();
    const int cores = count.usable;
    const int threads = env.blas_threads > 0
                            ? env.blas_threads
                            : CpuThreadsPerTower(cores, parallel, on_host, ps_on_host);
    SetCpuMathThreads(threads);
    math_threads = threads;
    const std::string usable =
        count.limit.empty()
            ? ""
            : absl::StrCat("; ", count.usable, " of the host's ", count.online,
                           " cores usable: ", count.limit);
    Log(hooks, absl::StrCat(num_towers, " tower(s), ", threads, " CPU math thread(s) each",
                            env.blas_threads > 0
                                ? absl::StrCat(" (--blas_threads", usable, ")")
                                : absl::StrCat(" (", on_host, " worker(s) on this host",
                                               CpuMathShare(cores, ps_on_host) < cores
                                                   ? absl::StrCat(" and ", ps_on_host,
                                                                  " ps, which get half of its ",
                                                                  cores, " cores")
                                                   : "",
                                               usable, ")"),
                            ", OpenBLAS kernels ", common::BlasCoreName(),
                            common::BlasKernelsNote().empty()
                                ? ""
                                : absl::StrCat(" (", common::BlasKernelsNote(), ")"),
                            GemmSplitNote(job.model()),
                            "; reduction: ", towers->reducer().Name()));
  }

  // Data: every worker reads the set (or with data.shard, its own shard of
  // it) and trains on its slices of each batch. Only the chief evaluates,
  // so only the chief reads the test set.
  Dataset train, test;
  const auto& d = job.data();
  DataShard shard{job.global_batch_size(), num_workers, spec.task_index};
  const DataShard* shard_or_null = d.shard() ? &shard : nullptr;
  if (d.source() == v1::DataSpec::ONES) {
    train = MakeOnes(d.ones_examples(), model->input_dim(),
                     d.ones_target_dim() > 0 ? d.ones_target_dim() : model->output_dim());
    if (chief) test = train;
    if (shard_or_null != nullptr) {
      TOWERPS_RETURN_IF_ERROR(common::Annotate(KeepShard(shard, &train), "train data"));
    }
  } else {
    auto load = d.source() == v1::DataSpec::CIFAR10 ? LoadCifar10 : LoadFashionMnist;
    std::string dir = d.dir();
    if (env.data_roots != nullptr) {  // A job from StartJob: only under --data_root.
      TOWERPS_ASSIGN_OR_RETURN(dir, env.data_roots->Resolve("data.dir", d.dir()));
    }
    auto tr = load(dir, true, d.max_train_examples(), shard_or_null);
    if (!tr.ok()) return common::Annotate(tr.status(), "train data");
    train = std::move(*tr);
    if (chief) {
      auto te = load(dir, false, d.max_test_examples(), nullptr);
      if (!te.ok()) return common::Annotate(te.status(), "test data");
      test = std::move(*te);
    }
  }
  if (shard_or_null != nullptr) {
    Log(hooks, absl::StrCat("data: worker ", spec.task_index, " holds a shard of ", train.size(),
                            " of the ", train.whole_size(), " train examples"));
  }
  // Batches read the train set's rows at random (GatherBatch).
  const int64_t train_bytes = train.pixels.empty()
                                  ? train.features.num_elements() * int64_t{sizeof(float)}
                                  : static_cast<int64_t>(train.pixels.size());
  const common::HugePages huge = PlaceOnHugePages(&train);
  if (huge.bytes > 0) {
    const std::string page = huge.page >= (1 << 20) ? absl::StrCat(huge.page >> 20, " MiB")
                                                    : absl::StrCat(huge.page >> 10, " KiB");
    Log(hooks, absl::StrFormat("data: %.1f of the train set's %.1f MB on %s pages",
                               huge.bytes / 1e6, train_bytes / 1e6, page));
  } else if (!huge.error.empty()) {
    Log(hooks, absl::StrFormat(
                   "data: the train set's %.1f MB on the system's small pages (huge pages: %s)",
                   train_bytes / 1e6, huge.error));
  }

  ParameterClientOptions copts;
  copts.ps_addresses = spec.ps;
  copts.job_id = job.job_id();
  copts.worker_task = spec.task_index;
  copts.chunk_bytes = env.chunk_bytes;
  copts.shared_memory = env.shared_memory;
  copts.same_host_calls = env.same_host_calls;
  copts.wait_timeout = env.wait_timeout;
  copts.peer_timeout = absl::Seconds(job.peer_timeout_s() > 0 ? job.peer_timeout_s()
                                                              : kDefaultPeerTimeoutS);
  copts.restore_from = restore_from;
  copts.cancel = hooks.cancel;
  copts.security = env.security;
  copts.compression = job.compression();
  TOWERPS_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterClient> client,
      NewGrpcParameterClient(copts, model->VariableDefs(), job.placement()));

  if (chief) {
    Log(hooks, model->Summary());
    Log(hooks, absl::StrCat("Placement (", v1::PlacementStrategy_Name(job.placement()), "):\n",
                            client->placement().Describe(model->VariableDefs())));
    Log(hooks, absl::StrFormat(
                   "Job \"%s\": %s, %d workers, global batch %d, %d epochs, %d train / %d test examples%s",
                   job.job_id(), v1::Mode_Name(job.mode()), num_workers, job.global_batch_size(),
                   job.epochs(), train.whole_size(), test.size(),
                   restore_from.empty() ? "" : ", restoring " + restore_from));
  }
  TrainerOptions topts;
  topts.job = job;
  topts.worker_task = spec.task_index;
  topts.num_workers = num_workers;
  topts.is_chief = chief;
  topts.log_every_steps = hooks.log_every_steps;
  // With structured metrics (the chief in service mode), progress lines go
  // to the process log only; the metrics become the job's events.
  if (hooks.on_metrics) {
    topts.progress = [](const std::string& line) { TLOG(INFO) << line; };
  } else {
    topts.progress = [&hooks](const std::string& line) { Log(hooks, line); };
  }
  topts.on_metrics = hooks.on_metrics;
  topts.after_pull = hooks.after_pull;
  if (hooks.on_epoch) {
    const std::vector<v1::VariableDef> defs = model->VariableDefs();
    topts.on_epoch = [&hooks, defs](int64_t step, const std::vector<common::Tensor*>& w) {
      hooks.on_epoch(step, defs, w);
    };
  }
  topts.restoring = !restore_from.empty();
  topts.cancel = hooks.cancel;
  topts.last_step = hooks.last_step;
  topts.iterations = hooks.iterations;
  if (env.metrics != nullptr) {
    topts.on_iteration = [m = env.metrics, id = job.job_id()](int64_t examples) {
      m->CountIteration(id, examples);
    };
  }
  // The towers' tensors stay in the client's shared memory to the end, and
  // the towers go before the client: moving them back would copy the model
  // twice over while the segment still holds the gradients (it set the
  // worker's peak: the dense stack's worker at 158 MB, 120 MB without it).
  topts.tensors_stay_shared = true;
  // --adapt_blas_threads: between steps the thread count moves from 1 to
  // the one set above, to whichever runs the steps fastest now (other
  // processes' load; worker/device/cpu_thread_tuner.h).
  std::unique_ptr<CpuThreadTuner> tuner;
  const int w = spec.task_index;
  if (env.adapt_blas_threads && math_threads > 1) {
    tuner = std::make_unique<CpuThreadTuner>(math_threads);
    topts.after_step = [&tuner, &hooks, w](double compute_s) {
      const CpuThreadTuner::Decision d = tuner->OnStep(compute_s);
      if (d.threads != CpuMathThreads()) SetCpuMathThreads(d.threads);
      if (!d.change.empty()) Log(hooks, absl::StrCat("worker ", w, ": ", d.change));
    };
  }
  Trainer trainer(topts, *towers, *client, train, test);
  absl::StatusOr<TrainResult> result = trainer.Run();
  towers.reset();
  if (tuner != nullptr) {
    Log(hooks, absl::StrCat("worker ", w, ": CPU math threads (--adapt_blas_threads): ",
                            tuner->StepsPerCount()));
  }
  return result;
}

}  // namespace towerps::worker
