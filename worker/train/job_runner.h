// Runs this worker's part of one job: builds the towers on the task's
// devices, charges their memory, loads the data, connects to the parameter
// servers and trains. Used by the worker binary directly (one job from flags)
// and by the WorkerService (jobs sent by the chief).
//
// Thread-safe: concurrent RunJob calls must use different jobs; the devices'
// allocators are shared and enforce their limits across them.
#ifndef TOWERPS_WORKER_TRAIN_JOB_RUNNER_H_
#define TOWERPS_WORKER_TRAIN_JOB_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/rpc_security.h"
#include "common/cluster_spec.h"
#include "common/paths.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "proto/tensor.pb.h"
#include "worker/device/device_manager.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"

namespace towerps::worker {

// What stays the same across jobs on one worker. Dependencies not owned.
struct WorkerEnv {
  common::ClusterSpec cluster;                  // REQUIRED.
  DeviceManager* devices = nullptr;     // REQUIRED.
  int64_t chunk_bytes = 1 << 20;
  bool shared_memory = true;     // ParameterClientOptions.shared_memory
  bool same_host_calls = true;   // ParameterClientOptions.same_host_calls
  absl::Duration wait_timeout = absl::Minutes(10);
  int blas_threads = 0;          // CPU math threads per tower; 0: CpuThreadsPerTower's rule.
  // Moves that count between steps, from 1 to the count above, to whichever
  // runs the steps fastest now (CpuThreadTuner). The job's bits then depend
  // on the moves (OpenBLAS's GEMMs differ by thread count).
  bool adapt_blas_threads = false;
  bool log_device_placement = false;
  std::string layout;            // "" or "classic".
  WorkerMetrics* metrics = nullptr;  // Not owned; may be null (no --metrics_port).
  // TLS and token of the channels to the servers. Default: plaintext, no token.
  std::shared_ptr<const common::RpcSecurity> security = common::RpcSecurity::Insecure();
  // Where data.dir may point (--data_root and --state_dir; set with --serve,
  // where jobs come from StartJob): InvalidArgument naming data.dir otherwise.
  // Not owned; null: anywhere (a job from the command line).
  const common::PathRoots* data_roots = nullptr;
  // Most bytes a job's model may take on this worker (weights, gradients and
  // activations of every tower, worker/model/model_limits.h; not the data
  // set): RunJob refuses a larger job with ResourceExhausted before building
  // it. The binary sets --memory_budget_bytes (default half the physical
  // memory).
  int64_t memory_budget_bytes = INT64_MAX;
};

// Callbacks and controls of one run. All optional.
struct JobHooks {
  // Human-readable lines (summary, placement, progress).
  std::function<void(const std::string&)> log;
  std::function<void(const v1::Metrics&, bool epoch_end)> on_metrics;  // Chief.
  std::function<absl::Status(int64_t step)> after_pull;                // Chief.
  // Chief: the variables and their values after each evaluation.
  std::function<void(int64_t step, const std::vector<v1::VariableDef>& defs,
                     const std::vector<common::Tensor*>& weights)> on_epoch;
  const common::CancellationToken* cancel = nullptr;  // Not owned; may be null.
  std::atomic<int64_t>* last_step = nullptr;
  std::atomic<int64_t>* iterations = nullptr;
  int log_every_steps = 50;
};

// `job` must have defaults applied (JobWithDefaults) and a job_id.
// `restore_from`: checkpoint directory the servers restore from, or "".
// Errors: InvalidArgument for a job that cannot run here (model, devices,
// layout), ResourceExhausted when it does not fit the devices, data errors
// naming the file, the ps client's errors, Cancelled when `cancel` is.
absl::StatusOr<TrainResult> RunJob(const WorkerEnv& env, const v1::JobSpec& job,
                                   const std::string& restore_from, const JobHooks& hooks);

// The variables the job registers (in the model's order), without building
// towers on devices. For the chief's export and status pages.
absl::StatusOr<std::vector<v1::VariableDef>> JobVariables(const v1::JobSpec& job);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_JOB_RUNNER_H_
