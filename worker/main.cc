// The worker binary: parses flags into a JobSpec, loads its data, trains with
// the parameter servers, and (chief) prints the final summary line:
//   final: test_accuracy=<x> test_loss=<y> steps=<n> wall_s=<t>
#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster_flags.h"
#include "common/device_manager.h"
#include "common/gpu_info.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "worker/backend.h"
#include "worker/dataset.h"
#include "worker/device_placer.h"
#include "worker/job_spec.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/towers.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, model, "mlp", "Built-in job: mlp or dense_stack (ignored with --job_spec).");
ABSL_FLAG(std::string, job_spec, "", "JobSpec file, JSON or protobuf text format.");
ABSL_FLAG(std::string, mode, "", "Override: sync or async.");
ABSL_FLAG(int, epochs, 0, "Override: epochs.");
ABSL_FLAG(int, batch_size, 0, "Override: global batch size.");
ABSL_FLAG(double, learning_rate, 0, "Override: learning rate.");
ABSL_FLAG(int64_t, max_train_examples, 0, "Override: use only the first N train examples.");
ABSL_FLAG(int64_t, max_test_examples, 0, "Override: use only the first N test examples.");
ABSL_FLAG(int, max_steps, 0, "Override: stop after N global steps.");
ABSL_FLAG(int, replicas_to_aggregate, -1, "Override (sync): gradients per step.");
ABSL_FLAG(int, max_staleness, -1, "Override (async): staleness bound.");
ABSL_FLAG(std::string, placement, "", "Override: round_robin or greedy_bytes.");
ABSL_FLAG(std::string, job_id, "", "Override: job id.");
ABSL_FLAG(std::string, data_dir, "", "Override: Fashion-MNIST directory.");
ABSL_FLAG(int64_t, chunk_bytes, towerps::common::kDefaultChunkBytes,
          "Payload bytes per streamed message.");
ABSL_FLAG(int, log_every_steps, 50, "Progress line every N steps.");
ABSL_FLAG(int, towers, 0, "Override: data-parallel towers in this worker.");
ABSL_FLAG(std::string, virtual_devices, "",
          "Split physical devices: e.g. \"CPU=4\" or \"GPU:0=1000x6;GPU:1=1000x6\" (MB x count).");
ABSL_FLAG(std::string, visible_devices, "", "Physical GPUs to use, e.g. \"0,2\". Default: all.");
ABSL_FLAG(bool, log_device_placement, false, "Log the device of every tower and layer.");
ABSL_FLAG(bool, allow_soft_placement, false,
          "Place on the default device (and log it) when a requested device is missing.");
ABSL_FLAG(std::string, layout, "",
          "\"classic\": first layer on device 0, hidden layer i on min(i+1, last), output on the last.");
ABSL_FLAG(int, blas_threads, 0,
          "BLAS threads per tower (0: cores / towers, so towers never oversubscribe).");
ABSL_FLAG(double, wait_timeout_s, 600, "Longest wait for servers or a step before failing.");

namespace {

using towerps::v1::JobSpec;

int Fail(const std::string& what, const absl::Status& s, int code = 1) {
  std::cerr << "worker: " << what << ": " << s.message() << "\n";
  return code;
}

absl::Status ApplyOverrides(JobSpec* job) {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "sync") job->set_mode(towerps::v1::SYNC);
  else if (mode == "async") job->set_mode(towerps::v1::ASYNC);
  else if (!mode.empty()) return absl::InvalidArgumentError("--mode must be sync or async, got \"" + mode + "\"");
  const std::string placement = absl::GetFlag(FLAGS_placement);
  if (placement == "round_robin") job->set_placement(towerps::v1::ROUND_ROBIN);
  else if (placement == "greedy_bytes") job->set_placement(towerps::v1::GREEDY_BYTES);
  else if (!placement.empty()) return absl::InvalidArgumentError("--placement must be round_robin or greedy_bytes");
  if (absl::GetFlag(FLAGS_epochs) != 0) job->set_epochs(absl::GetFlag(FLAGS_epochs));
  if (absl::GetFlag(FLAGS_batch_size) != 0) job->set_global_batch_size(absl::GetFlag(FLAGS_batch_size));
  if (absl::GetFlag(FLAGS_learning_rate) != 0) {
    job->mutable_optimizer()->set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_learning_rate)));
  }
  if (absl::GetFlag(FLAGS_max_train_examples) != 0) {
    job->mutable_data()->set_max_train_examples(absl::GetFlag(FLAGS_max_train_examples));
  }
  if (absl::GetFlag(FLAGS_max_test_examples) != 0) {
    job->mutable_data()->set_max_test_examples(absl::GetFlag(FLAGS_max_test_examples));
  }
  if (absl::GetFlag(FLAGS_towers) != 0) job->set_towers(absl::GetFlag(FLAGS_towers));
  if (absl::GetFlag(FLAGS_max_steps) != 0) job->set_max_steps(absl::GetFlag(FLAGS_max_steps));
  if (absl::GetFlag(FLAGS_replicas_to_aggregate) >= 0) {
    job->set_replicas_to_aggregate(absl::GetFlag(FLAGS_replicas_to_aggregate));
  }
  if (absl::GetFlag(FLAGS_max_staleness) >= 0) job->set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  if (!absl::GetFlag(FLAGS_job_id).empty()) job->set_job_id(absl::GetFlag(FLAGS_job_id));
  if (!absl::GetFlag(FLAGS_data_dir).empty()) job->mutable_data()->set_dir(absl::GetFlag(FLAGS_data_dir));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  towerps::common::TuneAllocatorForLargeMessages();
  absl::SetProgramUsageMessage("towerps worker. Example:\n  worker --ps_hosts=h1:2222 "
                               "--worker_hosts=h2:2222 --job_name=worker --task_index=0 --model=mlp");
  absl::ParseCommandLine(argc, argv);
  auto spec = towerps::common::ClusterSpecFromCommandLine("worker");
  if (!spec.ok()) return Fail("invalid cluster spec", spec.status(), 2);

  absl::StatusOr<JobSpec> job = absl::GetFlag(FLAGS_job_spec).empty()
                                    ? towerps::worker::BuiltinJob(absl::GetFlag(FLAGS_model))
                                    : towerps::worker::ReadJobSpecFile(absl::GetFlag(FLAGS_job_spec));
  if (!job.ok()) return Fail("job spec", job.status(), 2);
  if (auto s = ApplyOverrides(&*job); !s.ok()) return Fail("flags", s, 2);
  *job = towerps::worker::JobWithDefaults(*job);
  const int num_workers = static_cast<int>(spec->worker.size());
  if (auto s = towerps::worker::ValidateJob(*job, num_workers); !s.ok()) return Fail("job spec", s, 2);

  // Devices: the physical ones, split as asked. CUDA has already applied
  // CUDA_VISIBLE_DEVICES to what it reports, so it is not passed again here.
  towerps::common::DeviceManagerOptions dopts;
  dopts.task_name = spec->TaskName();
  dopts.virtual_devices = absl::GetFlag(FLAGS_virtual_devices);
  dopts.visible_devices = absl::GetFlag(FLAGS_visible_devices);
  dopts.physical = towerps::common::DiscoverPhysicalDevices();
  dopts.allow_soft_placement = absl::GetFlag(FLAGS_allow_soft_placement);
  dopts.log_device_placement = absl::GetFlag(FLAGS_log_device_placement);
  auto devices = towerps::common::DeviceManager::Create(dopts);
  if (!devices.ok()) return Fail("devices", devices.status(), 2);
  std::vector<std::string> device_names;
  for (const auto* d : (*devices)->devices()) device_names.push_back(d->short_name());
  if (absl::GetFlag(FLAGS_layout) == "classic") {
    if (auto s = towerps::worker::ApplyClassicLayout(device_names, job->mutable_model()); !s.ok()) {
      return Fail("layout", s, 2);
    }
  } else if (!absl::GetFlag(FLAGS_layout).empty()) {
    return Fail("flags", absl::InvalidArgumentError("--layout must be \"classic\" or empty"), 2);
  }
  bool layers_placed = false;
  for (const auto& l : job->model().layers()) layers_placed |= !l.device().empty();
  if (layers_placed && job->towers() > 1) {
    return Fail("job spec", absl::InvalidArgumentError(
                                "towers > 1 with per-layer devices is not supported yet"), 2);
  }
  // Tower t runs on the t-th device of the preferred type (GPU if any).
  auto tower_devices = (*devices)->DevicesOfType("GPU");
  if (tower_devices.empty()) tower_devices = (*devices)->DevicesOfType("CPU");
  std::vector<std::unique_ptr<towerps::worker::DevicePlacer>> placers;
  for (int t = 0; t < job->towers(); ++t) {
    placers.push_back(std::make_unique<towerps::worker::DevicePlacer>(
        **devices, [] { return towerps::worker::NewCpuBackend(); }));
    if (absl::GetFlag(FLAGS_log_device_placement) && !layers_placed) {
      TLOG(INFO) << "tower " << t << ": "
                 << tower_devices[t % tower_devices.size()]->name();
    }
  }
  auto towers = towerps::worker::Towers::Create(
      job->model(), job->towers(), [&](int t) {
        return placers[t]->Placer(
            layers_placed ? "" : tower_devices[t % tower_devices.size()]->short_name());
      });
  if (!towers.ok()) return Fail("model", towers.status(), 2);
  // Charge every tower's layers to their devices' memory limits now, so a
  // model that does not fit fails here with the device and the numbers.
  constexpr int64_t kEvalBatch = 1000;  // EvaluateModel's batch
  const int64_t worker_batch =
      (job->global_batch_size() + num_workers - 1) / num_workers;
  const int64_t tower_batch = (worker_batch + job->towers() - 1) / job->towers();
  std::vector<std::unique_ptr<towerps::worker::MemoryReservation>> reservations;
  for (int t = 0; t < job->towers(); ++t) {
    const int64_t max_batch =
        (t == 0 && spec->is_chief()) ? std::max(tower_batch, kEvalBatch) : tower_batch;
    auto r = towerps::worker::MemoryReservation::Reserve((*towers)->tower(t), **devices, max_batch);
    if (!r.ok()) return Fail(absl::StrCat("tower ", t, " does not fit its devices"), r.status(), 2);
    reservations.push_back(std::move(*r));
  }
  if (absl::GetFlag(FLAGS_log_device_placement)) {
    TLOG(INFO) << "devices:\n" << (*devices)->Describe();
  }
  towerps::worker::Model* model = &(*towers)->primary();
  // Towers on CPU share the cores: never more BLAS threads in all than cores.
  if (absl::GetFlag(FLAGS_blas_threads) > 0 || job->towers() > 1) {
    const int threads = absl::GetFlag(FLAGS_blas_threads) > 0
                            ? absl::GetFlag(FLAGS_blas_threads)
                            : towerps::worker::BlasThreadsPerTower(
                                  static_cast<int>(std::thread::hardware_concurrency()),
                                  job->towers());
    openblas_set_num_threads(threads);
    TLOG(INFO) << job->towers() << " tower(s), " << threads << " BLAS thread(s) each; reduction: "
               << (*towers)->reducer().Name();
  }

  TLOG(INFO) << spec->TaskName() << ": " << towerps::common::DescribeGpus(towerps::common::QueryGpus());

  // Data: every worker reads the set and trains on its slices of each batch.
  towerps::worker::Dataset train, test;
  const auto& d = job->data();
  if (d.source() == towerps::v1::DataSpec::ONES) {
    train = towerps::worker::MakeOnes(d.ones_examples(), model->input_dim(),
                                      d.ones_target_dim() > 0 ? d.ones_target_dim()
                                                              : model->output_dim());
    test = train;
  } else {
    auto tr = towerps::worker::LoadFashionMnist(d.dir(), true, d.max_train_examples());
    if (!tr.ok()) return Fail("train data", tr.status());
    auto te = towerps::worker::LoadFashionMnist(d.dir(), false, d.max_test_examples());
    if (!te.ok()) return Fail("test data", te.status());
    train = std::move(*tr);
    test = std::move(*te);
  }

  towerps::worker::ParameterClientOptions copts;
  copts.ps_addresses = spec->ps;
  copts.job_id = job->job_id();
  copts.worker_task = spec->task_index;
  copts.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  copts.wait_timeout = absl::Seconds(absl::GetFlag(FLAGS_wait_timeout_s));
  auto client = towerps::worker::NewGrpcParameterClient(copts, model->VariableDefs(),
                                                        job->placement());
  if (!client.ok()) return Fail("parameter client", client.status());

  if (spec->is_chief()) {
    std::cout << model->Summary() << "\n";
    std::cout << "Placement (" << towerps::v1::PlacementStrategy_Name(job->placement()) << "):\n"
              << (*client)->placement().Describe(model->VariableDefs()) << "\n";
    std::cout << absl::StrFormat(
                     "Job \"%s\": %s, %d workers, global batch %d, %d epochs, %d train / %d test examples\n",
                     job->job_id(), towerps::v1::Mode_Name(job->mode()), num_workers,
                     job->global_batch_size(), job->epochs(), train.size(), test.size())
              << std::flush;
  }
  towerps::worker::TrainerOptions topts;
  topts.job = *job;
  topts.worker_task = spec->task_index;
  topts.num_workers = num_workers;
  topts.is_chief = spec->is_chief();
  topts.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  topts.progress = [](const std::string& line) { std::cout << line << std::endl; };
  towerps::worker::Trainer trainer(topts, **towers, **client, train, test);
  auto result = trainer.Run();
  if (!result.ok()) return Fail("training failed", result.status());
  if (spec->is_chief()) {
    const std::string acc = std::isnan(result->test_accuracy)
                                ? "n/a"
                                : absl::StrFormat("%.4f", result->test_accuracy);
    std::cout << absl::StrFormat("final: test_accuracy=%s test_loss=%.4f steps=%d wall_s=%.1f",
                                 acc, result->test_loss, result->global_steps, result->wall_s)
              << std::endl;
  } else {
    std::cout << absl::StrFormat("worker %d done: %d iterations, %d stale, wall_s=%.1f",
                                 spec->task_index, result->iterations, result->stale_pushes,
                                 result->wall_s)
              << std::endl;
  }
  return 0;
}
