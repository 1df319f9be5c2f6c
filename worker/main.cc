// The worker binary. Two modes:
// - one job from flags (default): parses flags into a JobSpec, trains it with
//   the parameter servers and (chief) prints the final summary line
//     final: test_accuracy=<x> test_loss=<y> steps=<n> wall_s=<t>
// - --serve: a long-running worker that runs the jobs the chief sends; the
//   chief also serves JobService (towerctl's server) with its queue of jobs.
#include <unistd.h>

#include <cmath>
#include <csignal>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/blas_kernels.h"
#include "common/cancellation.h"
#include "common/cluster_flags.h"
#include "common/host_limits.h"
#include "common/job_spec.h"
#include "common/process_cpu.h"
#include "common/process_memory.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/paths.h"
#include "common/rpc.h"
#include "common/rpc_security_flags.h"
#include "common/shutdown_signal.h"
#include "google/protobuf/util/json_util.h"
#include "proto/job.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "worker/chief/chief_metrics.h"
#include "worker/chief/job_manager.h"
#include "worker/chief/job_service.h"
#include "worker/device/backend.h"
#include "worker/device/cuda_memory.h"
#include "worker/device/device_manager.h"
#include "worker/device/gpu_info.h"
#include "worker/model/dataset.h"
#include "worker/model/device_placer.h"
#include "worker/model/model.h"
#include "worker/train/job_runner.h"
#include "worker/train/ps_client.h"
#include "worker/train/towers.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"
#include "worker/train/worker_service.h"

ABSL_FLAG(std::string, model, "mlp",
          "Built-in job: mlp, dense_stack, cnn_small, lenet, resnet18 or resnet_cifar (ignored "
          "with --job_spec).");
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
ABSL_FLAG(std::string, placement, "", "Override: round_robin, greedy_bytes or partitioned.");
ABSL_FLAG(std::string, compression, "",
          "Override: gradient compression on the wire: none, fp16, bf16, topk (1%) or "
          "topk:RATIO (the fraction of each variable part sent, in (0, 1]); with error feedback "
          "(JobSpec.compression).");
ABSL_FLAG(std::string, job_id, "", "Override: job id.");
ABSL_FLAG(std::string, data_dir, "", "Override: Fashion-MNIST directory.");
ABSL_FLAG(bool, shard_data, false,
          "Override: each worker loads and trains on its own shard of the train set "
          "(DataSpec.shard).");
ABSL_FLAG(int64_t, chunk_bytes, towerps::common::kDefaultChunkBytes,
          "Payload bytes per streamed message.");
ABSL_FLAG(bool, shared_memory, true,
          "Offer parameter servers on this host a shared memory segment to write pulls "
          "into (they stream them where they cannot); false: always over gRPC.");
ABSL_FLAG(bool, same_host_calls, true,
          "With --shared_memory: make Push and Pull calls to parameter servers on this "
          "host through the shared memory (no gRPC call per step) where they serve "
          "them; false: always gRPC calls.");
ABSL_FLAG(int, log_every_steps, 50, "Progress line every N steps.");
ABSL_FLAG(int, towers, 0, "Override: data-parallel towers in this worker.");
ABSL_FLAG(std::string, tower_devices, "",
          "Override: the towers' devices, comma-separated (e.g. \"GPU:0,GPU:1\"); sets the tower count.");
ABSL_FLAG(int, micro_batches, 0,
          "Override: micro-batches per tower step (a model split over devices runs as a pipeline).");
ABSL_FLAG(std::string, virtual_devices, "",
          "Split physical devices: e.g. \"CPU=4\" or \"GPU:0=1000x6;GPU:1=1000x6\" (MB x count).");
ABSL_FLAG(std::string, visible_devices, "", "Physical GPUs to use, e.g. \"0,2\". Default: all.");
ABSL_FLAG(bool, log_device_placement, false, "Log the device of every tower and layer.");
ABSL_FLAG(bool, allow_soft_placement, false,
          "Place on the default device (and log it) when a requested device is missing.");
ABSL_FLAG(std::string, layout, "",
          "\"classic\": first layer on device 0, hidden layer i on min(i+1, last), output on the last.");
ABSL_FLAG(int, blas_threads, 0,
          "CPU math threads (BLAS and oneDNN) per tower (0: cores / (towers x workers on this "
          "host), so towers and workers never oversubscribe the cores; half the cores where a "
          "ps runs on this host too and it has 4 or more, for the communication that overlaps "
          "the compute).");
ABSL_FLAG(bool, adapt_blas_threads, false,
          "Between steps, move the CPU math threads from 1 to the count --blas_threads (or its "
          "default) gives, to whichever runs the steps fastest now: on a host where other "
          "processes keep cores busy, fewer threads wait less for the ones that lost their "
          "core. Each move is logged. The CPU backend's GEMMs give the same bits at any thread "
          "count (worker/device/cpu_gemm.h), so a dense job ends on the same bits however its "
          "count moved, as long as a GEMM split is exact on this CPU (the worker logs it); "
          "oneDNN's convolutions split their sums by the thread count, so a "
          "convolutional job's last bits follow the counts.");
ABSL_FLAG(double, wait_timeout_s, 600,
          "Longest wait for a step (while every peer is alive) before failing.");
ABSL_FLAG(double, peer_timeout_s, 0,
          "Override: seconds after which a silent peer is lost (a ps unreachable, a worker not "
          "heard from); the job then fails naming it. Every task of a job must agree. "
          "Default (JobSpec.peer_timeout_s = 0): 60.");
ABSL_FLAG(bool, print_job_spec, false,
          "Print the job that the job flags describe (built-in model, --job_spec, overrides) as "
          "JSON for `towerctl submit`, and exit.");
ABSL_FLAG(bool, serve, false,
          "Run as a service: wait for jobs from the chief (submitted with towerctl) instead of "
          "training the job given by flags. The chief (worker 0) also serves JobService.");
// Issue 15 (limits).
ABSL_FLAG(int64_t, memory_budget_bytes, 0,
          "Most bytes a job's model may take on this worker (weights, gradients and "
          "activations of all towers); a larger job fails with RESOURCE_EXHAUSTED before it is "
          "built. Default 0: half of the memory this process may use (the physical memory, "
          "or its cgroup's memory limit where lower).");
ABSL_FLAG(int, max_queued_jobs, 100,
          "Chief: most jobs queued at once; a submit beyond it is refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, drain_s, 0,
          "--serve, after SIGTERM/SIGINT: seconds to report NOT_SERVING with the port still open "
          "(for load balancers and readiness probes) before shutting the server down.");
ABSL_FLAG(double, stop_checkpoint_timeout_s, 30,
          "Chief with --serve, after SIGTERM/SIGINT: longest wait for the running job's next step "
          "boundary, where its checkpoint is written before it is queued again. The servers and "
          "workers must still serve meanwhile: give them a --drain_s at least this long.");
ABSL_FLAG(std::string, state_dir, "towerps_state",
          "Chief with --serve: job records, events, and default checkpoint and TensorBoard dirs. "
          "A job's checkpoint.dir and tensorboard_dir must lie under it (relative ones are taken "
          "below it); the ps tasks need the same directory as their --state_dir.");
ABSL_FLAG(std::string, data_root, "/usr/share/datasets",
          "With --serve: comma-separated directories a job's data.dir may name, besides "
          "--state_dir; any other data.dir is refused.");
ABSL_FLAG(std::string, bind_address, "",
          "With --serve: address to listen on. Default: 0.0.0.0 with this task's port.");
ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics at http://<bind host>:<port>/metrics (the host of "
          "--bind_address, else 0.0.0.0). Default 0: off.");

namespace {

using towerps::v1::JobSpec;

int Fail(const std::string& what, const absl::Status& s, int code = 1) {
  std::cerr << "worker: " << what << ": " << s.message() << "\n";
  return code;
}

std::vector<std::string> DataRootFlag() {
  std::vector<std::string> roots;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_data_root), ',', absl::SkipEmpty())) {
    roots.emplace_back(absl::StripAsciiWhitespace(r));
  }
  return roots;
}

absl::Status ApplyOverrides(JobSpec* job) {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "sync") job->set_mode(towerps::v1::SYNC);
  else if (mode == "async") job->set_mode(towerps::v1::ASYNC);
  else if (!mode.empty()) return absl::InvalidArgumentError("--mode must be sync or async, got \"" + mode + "\"");
  const std::string placement = absl::GetFlag(FLAGS_placement);
  if (placement == "round_robin") job->set_placement(towerps::v1::ROUND_ROBIN);
  else if (placement == "greedy_bytes") job->set_placement(towerps::v1::GREEDY_BYTES);
  else if (placement == "partitioned") job->set_placement(towerps::v1::PARTITIONED);
  else if (!placement.empty()) {
    return absl::InvalidArgumentError("--placement must be round_robin, greedy_bytes or partitioned, got \"" +
                                      placement + "\"");
  }
  if (const std::string c = absl::GetFlag(FLAGS_compression); !c.empty()) {
    auto compression = towerps::worker::ParseCompressionFlag(c);
    if (!compression.ok()) return compression.status();
    if (compression->type() == towerps::v1::GradientCompression::NONE) {
      job->clear_compression();  // as if never set: the printed job stays the same
    } else {
      *job->mutable_compression() = *compression;
    }
  }
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
  if (!absl::GetFlag(FLAGS_tower_devices).empty()) {
    job->clear_tower_devices();
    for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_tower_devices), ',', absl::SkipEmpty())) {
      job->add_tower_devices(std::string(absl::StripAsciiWhitespace(d)));
    }
    job->set_towers(job->tower_devices_size());
  }
  if (absl::GetFlag(FLAGS_micro_batches) != 0) job->set_micro_batches(absl::GetFlag(FLAGS_micro_batches));
  if (absl::GetFlag(FLAGS_max_steps) != 0) job->set_max_steps(absl::GetFlag(FLAGS_max_steps));
  if (absl::GetFlag(FLAGS_replicas_to_aggregate) >= 0) {
    job->set_replicas_to_aggregate(absl::GetFlag(FLAGS_replicas_to_aggregate));
  }
  if (absl::GetFlag(FLAGS_max_staleness) >= 0) job->set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  if (!absl::GetFlag(FLAGS_job_id).empty()) job->set_job_id(absl::GetFlag(FLAGS_job_id));
  if (absl::GetFlag(FLAGS_peer_timeout_s) != 0) job->set_peer_timeout_s(absl::GetFlag(FLAGS_peer_timeout_s));
  if (!absl::GetFlag(FLAGS_data_dir).empty()) job->mutable_data()->set_dir(absl::GetFlag(FLAGS_data_dir));
  if (absl::GetFlag(FLAGS_shard_data)) job->mutable_data()->set_shard(true);
  return absl::OkStatus();
}

// --print_job_spec: the job as the job flags describe it, as JSON for
// `towerctl submit`. The cluster flags are not needed; when they (or
// TF_CONFIG) are given, replicas_to_aggregate is checked against their
// workers. The chief assigns an id unless --job_id named one.
int PrintJobSpec(const JobSpec& job) {
  int num_workers = towerps::worker::kAnyWorkerCount;
  if (towerps::common::ClusterFlagsGiven()) {
    auto spec = towerps::common::ClusterSpecFromCommandLine("worker");
    if (!spec.ok()) return Fail("invalid cluster spec", spec.status(), 2);
    num_workers = static_cast<int>(spec->worker.size());
  }
  if (auto s = towerps::worker::ValidateJob(job, num_workers); !s.ok()) return Fail("job spec", s, 2);
  const JobSpec out =
      towerps::worker::JobForSubmitFile(job, /*keep_job_id=*/!absl::GetFlag(FLAGS_job_id).empty());
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(out, &json, o); !s.ok()) {
    return Fail("print_job_spec", absl::InternalError(s.ToString()), 1);
  }
  std::cout << json;
  return 0;
}

// Service mode: serve WorkerService (and, on the chief, JobService) until
// SIGINT or SIGTERM.
// `metrics_server`: not owned; null without --metrics_port.
int Serve(const towerps::common::ClusterSpec& spec, const towerps::worker::WorkerEnv& env,
          towerps::common::ShutdownSignal& stop, towerps::common::MetricsServer* metrics_server) {
  towerps::worker::WorkerRuntime runtime(env);
  towerps::worker::WorkerServiceImpl worker_service(runtime);
  std::vector<grpc::Service*> services = {&worker_service};
  // Before the manager, which reports to it.
  std::unique_ptr<towerps::worker::ChiefRefusals> refusals;
  std::unique_ptr<towerps::worker::JobManager> manager;
  std::unique_ptr<towerps::worker::JobServiceImpl> job_service;
  if (spec.is_chief()) {
    towerps::worker::JobManagerOptions mopts;
    mopts.cluster = spec;
    mopts.state_dir = absl::GetFlag(FLAGS_state_dir);
    mopts.data_roots = DataRootFlag();
    mopts.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
    mopts.worker_budget_bytes = env.memory_budget_bytes;
    if (metrics_server != nullptr) {
      refusals = std::make_unique<towerps::worker::ChiefRefusals>(
          metrics_server->registry(), absl::StrCat("worker:", spec.task_index));
      mopts.on_refusal = [r = refusals.get()](const std::string& reason) { r->Count(reason); };
    }
    mopts.local = &runtime;
    mopts.security = env.security;
    auto m = towerps::worker::JobManager::Create(mopts);
    if (!m.ok()) return Fail("job service", m.status(), 2);
    manager = std::move(*m);
    if (auto s = manager->Start(); !s.ok()) return Fail("job service", s, 1);
    job_service = std::make_unique<towerps::worker::JobServiceImpl>(*manager);
    services.push_back(job_service.get());
  }
  // The chief's jobs by state, read from the manager at each scrape.
  std::shared_ptr<towerps::worker::ChiefJobsCollector> jobs_collector;
  if (manager != nullptr && metrics_server != nullptr) {
    jobs_collector = std::make_shared<towerps::worker::ChiefJobsCollector>(
        [m = manager.get()] { return m->List(); }, absl::StrCat("worker:", spec.task_index));
    metrics_server->Register(jobs_collector);
  }
  std::string address = absl::GetFlag(FLAGS_bind_address);
  if (address.empty()) address = towerps::common::AnyAddressWithPortOf(spec.self_address());
  int port = 0;
  std::vector<std::string> health_names = {towerps::v1::WorkerService::service_full_name()};
  if (job_service != nullptr) health_names.push_back(towerps::v1::JobService::service_full_name());
  auto server = towerps::common::StartServer(address, services, &port, health_names,
                                             env.security.get());
  if (!server.ok()) return Fail("serve", server.status(), 1);
  // The runtime takes calls as soon as it exists, and the chief's job store
  // was loaded by manager->Start() above: ready (grpc.health.v1 SERVING).
  towerps::common::SetServing(**server);
  TLOG(INFO) << spec.TaskName() << " serving on " << address << " (port " << port << ")"
             << (spec.is_chief() ? absl::StrCat("; chief: JobService up, state in ",
                                                absl::GetFlag(FLAGS_state_dir))
                                 : std::string());
  TLOG(INFO) << spec.TaskName() << ": " << env.security->Describe();
  const int sig = stop.Wait();  // later signals are ignored
  const absl::Duration drain = absl::Seconds(absl::GetFlag(FLAGS_drain_s));
  const absl::Time drain_end = absl::Now() + drain;
  TLOG(INFO) << spec.TaskName() << ": signal " << sig << ", shutting down (drain " << drain
             << ")";
  towerps::common::BeginDraining(**server);  // health: NOT_SERVING before the port closes
  if (manager != nullptr) {
    // The running job stops at its next step boundary with a checkpoint and
    // is queued again; the other processes keep serving meanwhile (their
    // --drain_s), and so does this one: calls still arrive while it drains.
    manager->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_stop_checkpoint_timeout_s)));
  }
  absl::SleepFor(drain_end - absl::Now());  // the port stays open while probes see it
  (*server)->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  if (jobs_collector != nullptr) metrics_server->Remove(jobs_collector);  // before the manager goes
  manager.reset();
  TLOG(INFO) << spec.TaskName() << ": stopped; peak resident memory (VmHWM) "
             << towerps::common::PeakResidentBytes() << " bytes; cpu time user "
             << towerps::common::ProcessCpuTime().user_s << " s, system "
             << towerps::common::ProcessCpuTime().system_s << " s";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: where OpenBLAS picked kernels older than this CPU, start
  // again with the right ones (common/blas_kernels.h).
  towerps::common::RestartWithBetterBlasKernels("worker", argv);
  // One heap, as in the ps: a worker's big buffers (weights, gradients,
  // pulled and pushed messages) are allocated on gRPC's, the towers' and the
  // training thread, and with a heap per thread each kept its own copy of the
  // space. A 1-epoch dense-stack worker peaked at 246-278 MB with the default
  // and 142-145 MB with one heap, the MLP's at 107-112 and 96-99 MB, with the
  // same step times within noise (issue 16, tests/bench/step_breakdown.sh).
  towerps::common::TuneAllocatorForLargeMessages(/*max_arenas=*/1);
  towerps::common::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage("towerps worker. Example:\n  worker --ps_hosts=h1:2222 "
                               "--worker_hosts=h2:2222 --job_name=worker --task_index=0 --model=mlp");
  absl::ParseCommandLine(argc, argv);
  // A real handler before anything else starts, so that SIGTERM/SIGINT
  // landing on any thread (OpenBLAS's start before main) is caught, never the
  // default action: --serve drains and stops; a one-job run stops training
  // at its next step.
  auto installed = towerps::common::ShutdownSignal::Install();
  if (!installed.ok()) return Fail("signals", installed.status(), 1);
  std::unique_ptr<towerps::common::ShutdownSignal> stop = std::move(*installed);
  absl::StatusOr<JobSpec> job = absl::GetFlag(FLAGS_job_spec).empty()
                                    ? towerps::worker::BuiltinJob(absl::GetFlag(FLAGS_model))
                                    : towerps::worker::ReadJobSpecFile(absl::GetFlag(FLAGS_job_spec));
  if (!job.ok()) return Fail("job spec", job.status(), 2);
  if (auto s = ApplyOverrides(&*job); !s.ok()) return Fail("flags", s, 2);
  *job = towerps::worker::JobWithDefaults(*job);
  if (absl::GetFlag(FLAGS_print_job_spec)) return PrintJobSpec(*job);

  auto spec = towerps::common::ClusterSpecFromCommandLine("worker");
  if (!spec.ok()) return Fail("invalid cluster spec", spec.status(), 2);
  const int num_workers = static_cast<int>(spec->worker.size());
  if (auto s = towerps::worker::ValidateJob(*job, num_workers); !s.ok()) return Fail("job spec", s, 2);

  // Devices: the physical ones, split as asked. CUDA has already applied
  // CUDA_VISIBLE_DEVICES to what it reports, so it is not passed again here.
  towerps::worker::DeviceManagerOptions dopts;
  dopts.task_name = spec->TaskName();
  dopts.virtual_devices = absl::GetFlag(FLAGS_virtual_devices);
  dopts.visible_devices = absl::GetFlag(FLAGS_visible_devices);
  dopts.physical = towerps::worker::DiscoverPhysicalDevices();
  dopts.allow_soft_placement = absl::GetFlag(FLAGS_allow_soft_placement);
  dopts.log_device_placement = absl::GetFlag(FLAGS_log_device_placement);
  // Virtual GPUs allocate real device memory (cudaMalloc), under their limits.
  dopts.gpu_backend_factory = [](const towerps::worker::PhysicalDevice& gpu) {
    return towerps::worker::NewCudaMemoryBackend(gpu.index);
  };
  auto devices = towerps::worker::DeviceManager::Create(dopts);
  if (!devices.ok()) return Fail("devices", devices.status(), 2);
  auto security =
      towerps::common::RpcSecurityFromCommandLine(towerps::common::RpcRole::kServerAndClient);
  if (!security.ok()) return Fail("flags", security.status(), 2);
  towerps::worker::WorkerEnv env;
  env.cluster = *spec;
  env.security = *security;
  env.devices = devices->get();
  env.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  env.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  env.same_host_calls = absl::GetFlag(FLAGS_same_host_calls);
  env.wait_timeout = absl::Seconds(absl::GetFlag(FLAGS_wait_timeout_s));
  env.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  env.adapt_blas_threads = absl::GetFlag(FLAGS_adapt_blas_threads);
  env.log_device_placement = absl::GetFlag(FLAGS_log_device_placement);
  env.layout = absl::GetFlag(FLAGS_layout);
  env.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  if (env.memory_budget_bytes < 0) {
    std::cerr << "worker: --memory_budget_bytes must be >= 0 (0: half the usable memory)\n";
    return 2;
  }
  if (env.memory_budget_bytes == 0) {
    // Half of what this process may use (its cgroup's limit, in a container).
    const towerps::common::MemoryAmount memory = towerps::common::UsableMemory();
    env.memory_budget_bytes = memory.usable > 0 ? memory.usable / 2 : int64_t{4} << 30;
    if (!memory.limit.empty()) {
      TLOG(INFO) << "worker: memory budget " << env.memory_budget_bytes << " bytes, half of "
                 << memory.usable << ": " << memory.limit;
    }
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"drain_s", absl::GetFlag(FLAGS_drain_s)},
                                     {"stop_checkpoint_timeout_s",
                                      absl::GetFlag(FLAGS_stop_checkpoint_timeout_s)}}) {
    if (!(value >= 0 && value <= 3600)) {
      return Fail("flags", absl::InvalidArgumentError(absl::StrCat("--", name, "=", value,
                                                                   " must be in [0, 3600] seconds")),
                  2);
    }
  }
  if (!env.layout.empty() && env.layout != "classic") {
    return Fail("flags", absl::InvalidArgumentError("--layout must be \"classic\" or empty"), 2);
  }

  // Metrics: on the host the gRPC server binds (--serve), with their own port.
  std::unique_ptr<towerps::common::MetricsServer> metrics_server;
  std::unique_ptr<towerps::worker::WorkerMetrics> metrics;
  std::shared_ptr<towerps::worker::DeviceMemoryCollector> device_memory;
  if (absl::GetFlag(FLAGS_metrics_port) != 0) {
    std::string address = absl::GetFlag(FLAGS_bind_address);
    if (address.empty()) address = towerps::common::AnyAddressWithPortOf(spec->self_address());
    auto m = towerps::common::MetricsServer::Start(
        towerps::common::MetricsAddress(address, absl::GetFlag(FLAGS_metrics_port)));
    if (!m.ok()) {
      std::cerr << "worker: " << m.status().message() << "\n";
      return 1;
    }
    metrics_server = std::move(*m);
    metrics = std::make_unique<towerps::worker::WorkerMetrics>(
        metrics_server->registry(), absl::StrCat("worker:", spec->task_index));
    env.metrics = metrics.get();
    device_memory = std::make_shared<towerps::worker::DeviceMemoryCollector>(
        **devices, absl::StrCat("worker:", spec->task_index));
    metrics_server->Register(device_memory);
    TLOG(INFO) << spec->TaskName() << ": metrics on port " << metrics_server->port();
  }

  if (absl::GetFlag(FLAGS_serve)) {
    // Jobs come from StartJob: their data.dir only under --data_root or
    // --state_dir (the chief checked at submit; every worker checks again).
    std::vector<std::string> data_roots = DataRootFlag();
    data_roots.push_back(absl::GetFlag(FLAGS_state_dir));
    auto roots = towerps::common::PathRoots::Create("--data_root", std::move(data_roots));
    if (!roots.ok()) return Fail("flags", roots.status(), 2);
    env.data_roots = &*roots;
    TLOG(INFO) << spec->TaskName() << ": data only under " << roots->Describe();
    TLOG(INFO) << spec->TaskName() << ": " << towerps::worker::DescribeGpus(towerps::worker::QueryGpus());
    return Serve(*spec, env, *stop, metrics_server.get());
  }

  towerps::worker::JobHooks hooks;
  hooks.log = [](const std::string& line) { std::cout << line << std::endl; };
  hooks.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  // SIGTERM/SIGINT: the trainer stops at its next step (its pushes and pulls
  // are whole), and the exit code says the job did not finish (128 + the
  // signal, as a shell reports a process ended by it).
  towerps::common::CancellationToken stop_training;
  hooks.cancel = &stop_training;
  int stopped_by = 0;
  std::thread signal_watch([&] {
    stopped_by = stop->Wait();
    if (stopped_by > 0) stop_training.Cancel(absl::StrCat("stopped by signal ", stopped_by));
  });
  auto result = towerps::worker::RunJob(env, *job, "", hooks);
  stop->Release();
  signal_watch.join();
  if (stopped_by > 0) {
    std::cerr << "worker: stopped by signal " << stopped_by << " ("
              << (stopped_by == SIGINT ? "SIGINT" : "SIGTERM")
              << ") before the job finished; nothing resumes a one-job run (use --serve and "
                 "towerctl for that)\n";
    return 128 + stopped_by;
  }
  if (!result.ok()) {
    const bool setup = absl::IsInvalidArgument(result.status()) ||
                       absl::IsResourceExhausted(result.status());
    return Fail(setup ? "job cannot run here" : "training failed", result.status(), setup ? 2 : 1);
  }
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
