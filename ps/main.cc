// The parameter-server binary: parses flags, serves ParameterService until
// SIGINT or SIGTERM.
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/blas_kernels.h"
#include "common/cluster_flags.h"
#include "common/host_limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/paths.h"
#include "common/process_cpu.h"
#include "common/process_memory.h"
#include "common/rpc.h"
#include "common/rpc_security_flags.h"
#include "common/shutdown_signal.h"
#include "proto/ps.grpc.pb.h"
#include "ps/apply_log.h"
#include "ps/optimizer.h"
#include "ps/parameter_server.h"
#include "ps/ps_metrics.h"
#include "ps/ps_service.h"

ABSL_FLAG(std::string, bind_address, "",
          "Address to listen on. Default: 0.0.0.0 with this task's port.");
ABSL_FLAG(int64_t, chunk_bytes, towerps::common::kDefaultChunkBytes,
          "Default payload bytes per streamed pull message.");
ABSL_FLAG(double, max_pull_wait_s, 30, "Longest a pull waits server-side.");
ABSL_FLAG(bool, shared_memory, true,
          "Write pulls of workers on this host into their shared memory segments (mapped) "
          "instead of streaming them over gRPC; false: always over gRPC.");
ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics at http://<bind host>:<port>/metrics. Default 0: off.");
ABSL_FLAG(double, wait_log_interval_s, 5,
          "A sync step open this long logs which workers it waits for.");
ABSL_FLAG(std::string, state_dir, "towerps_state",
          "Checkpoint shards are written (SaveCheckpoint) and restored (Register's "
          "restore_from) only under this directory; any other path is refused. Give it the "
          "chief's --state_dir (the same directory, or a shared file system mounted at the "
          "same path). Default: towerps_state, like the chief's.");
ABSL_FLAG(std::string, apply_log, "",
          "Append a line per registration, accepted push (job, worker, step), checkpoint "
          "shard written and deletion to this file (for tests of the cluster's history "
          "after faults; see ps/apply_log.h). Default empty: off.");
// Issue 15 (limits): what jobs may hold on this server, counted in full
// (values, pull snapshot, optimizer slots, one push
// buffer per worker; see ParameterServerOptions).
ABSL_FLAG(int64_t, memory_budget_bytes, 0,
          "Most bytes all jobs together may hold on this server (values, "
          "optimizer slots, pull snapshot, push buffers); a register beyond it is refused with "
          "RESOURCE_EXHAUSTED. Default 0: half of the memory this process may use (the "
          "physical memory, or its cgroup's memory limit where lower).");
ABSL_FLAG(int64_t, max_job_bytes, int64_t{8} << 30,
          "Most bytes one job may hold on this server, counted as for --memory_budget_bytes. "
          "Default: 8 GiB.");
ABSL_FLAG(int, blas_threads, towerps::ps::kDefaultMathThreads,
          "Threads OpenBLAS may use for one update (saxpy, sum, check) on this server; each "
          "stream already runs its own. Default 1: more only spin beside gRPC's threads.");
ABSL_FLAG(double, drain_s, 0,
          "After SIGTERM/SIGINT: seconds to report NOT_SERVING with the port still open "
          "(for load balancers and readiness probes) before shutting the server down.");

int main(int argc, char** argv) {
  // First of all: where OpenBLAS picked kernels older than this CPU, start
  // again with the right ones (common/blas_kernels.h; the server's update
  // math is BLAS too).
  towerps::common::RestartWithBetterBlasKernels("ps", argv);
  // First: a real handler, so that SIGTERM/SIGINT landing on any thread
  // (OpenBLAS's start before main) is caught, never the default action.
  auto stop = towerps::common::ShutdownSignal::Install();
  if (!stop.ok()) {
    std::cerr << "ps: " << stop.status().message() << "\n";
    return 1;
  }
  // One heap: the server's work is streaming and BLAS updates under a job's
  // lock, not allocation from many threads at once.
  towerps::common::TuneAllocatorForLargeMessages(/*max_arenas=*/1);
  towerps::common::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage("towerps parameter server. Example:\n  ps --ps_hosts=h1:2222 "
                               "--worker_hosts=h2:2222 --job_name=ps --task_index=0");
  absl::ParseCommandLine(argc, argv);
  auto spec = towerps::common::ClusterSpecFromCommandLine("ps");
  if (!spec.ok()) {
    std::cerr << "ps: invalid cluster spec: " << spec.status().message() << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_chunk_bytes) < 4096) {
    std::cerr << "ps: --chunk_bytes must be at least 4096\n";
    return 2;
  }
  if (const int t = absl::GetFlag(FLAGS_blas_threads); t < 1 || t > 1024) {
    std::cerr << "ps: --blas_threads=" << t << " must be in [1, 1024]\n";
    return 2;
  }
  towerps::ps::SetMathThreads(absl::GetFlag(FLAGS_blas_threads));
  if (const double d = absl::GetFlag(FLAGS_drain_s); !(d >= 0 && d <= 3600)) {
    std::cerr << "ps: --drain_s=" << d << " must be in [0, 3600] seconds\n";
    return 2;
  }
  auto security = towerps::common::RpcSecurityFromCommandLine(towerps::common::RpcRole::kServer);
  if (!security.ok()) {
    std::cerr << "ps: " << security.status().message() << "\n";
    return 2;
  }
  int64_t budget = absl::GetFlag(FLAGS_memory_budget_bytes);
  if (budget < 0 || absl::GetFlag(FLAGS_max_job_bytes) <= 0) {
    std::cerr << "ps: --memory_budget_bytes must be >= 0 (0: half the usable memory) and "
                 "--max_job_bytes > 0\n";
    return 2;
  }
  // Half of what this process may use: in a container the host's memory
  // would admit jobs the kernel then kills the server for.
  const towerps::common::MemoryAmount memory = towerps::common::UsableMemory();
  const bool default_budget = budget == 0;
  if (default_budget) budget = memory.usable > 0 ? memory.usable / 2 : int64_t{4} << 30;
  auto state_roots =
      towerps::common::PathRoots::Create("--state_dir", {absl::GetFlag(FLAGS_state_dir)});
  if (!state_roots.ok()) {
    std::cerr << "ps: " << state_roots.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<towerps::ps::ApplyLog> apply_log;
  if (!absl::GetFlag(FLAGS_apply_log).empty()) {
    auto log = towerps::ps::ApplyLog::Open(absl::GetFlag(FLAGS_apply_log));
    if (!log.ok()) {
      std::cerr << "ps: " << log.status().message() << "\n";
      return 2;
    }
    apply_log = std::move(*log);
  }
  std::string address = absl::GetFlag(FLAGS_bind_address);
  if (address.empty()) address = towerps::common::AnyAddressWithPortOf(spec->self_address());
  std::unique_ptr<towerps::common::MetricsServer> metrics_server;
  std::unique_ptr<towerps::ps::PsMetrics> metrics;
  if (absl::GetFlag(FLAGS_metrics_port) != 0) {
    auto m = towerps::common::MetricsServer::Start(
        towerps::common::MetricsAddress(address, absl::GetFlag(FLAGS_metrics_port)));
    if (!m.ok()) {
      std::cerr << "ps: " << m.status().message() << "\n";
      return 1;
    }
    metrics_server = std::move(*m);
    metrics = std::make_unique<towerps::ps::PsMetrics>(
        metrics_server->registry(), absl::StrCat("ps:", spec->task_index));
    TLOG(INFO) << "ps " << spec->task_index << ": metrics on port " << metrics_server->port();
  }
  std::function<void(const std::string&)> on_update_skipped;
  if (metrics != nullptr) {
    on_update_skipped = [m = metrics.get()](const std::string& job) { m->CountSkippedUpdate(job); };
  }
  towerps::ps::ParameterServer ps(
      {.task_index = spec->task_index,
       .max_pull_wait = absl::Seconds(absl::GetFlag(FLAGS_max_pull_wait_s)),
       .wait_log_interval = absl::Seconds(absl::GetFlag(FLAGS_wait_log_interval_s)),
       .max_job_bytes = absl::GetFlag(FLAGS_max_job_bytes),
       .memory_budget_bytes = budget,
       .checkpoint_roots = *state_roots,
       .apply_log = apply_log.get(),
       .on_update_skipped = std::move(on_update_skipped)});
  // The budget and what the jobs count against it, read at each scrape;
  // removed before the server goes.
  std::shared_ptr<towerps::ps::PsMemoryCollector> memory_collector;
  if (metrics_server != nullptr) {
    memory_collector = std::make_shared<towerps::ps::PsMemoryCollector>(
        [&ps, budget] {
          return towerps::ps::PsMemoryCollector::Reading{budget, ps.reserved_bytes()};
        },
        absl::StrCat("ps:", spec->task_index));
    metrics_server->Register(memory_collector);
  }
  absl::Cleanup stop_collecting = [&] {
    if (memory_collector != nullptr) metrics_server->Remove(memory_collector);
  };
  towerps::ps::ParameterServiceImpl service(ps, absl::GetFlag(FLAGS_chunk_bytes), metrics.get(),
                                            absl::GetFlag(FLAGS_shared_memory));
  // What this ps is set to, logged before it listens: a client that reaches
  // it finds these lines in its log.
  TLOG(INFO) << "ps " << spec->task_index << ": " << towerps::common::BlasDescription()
             << "; update loops (momentum, Adam): "
             << towerps::ps::UpdateLoopsName(towerps::ps::ActiveUpdateLoops());
  TLOG(INFO) << "ps " << spec->task_index << ": memory budget " << budget << " bytes"
             << (default_budget && !memory.limit.empty()
                     ? absl::StrCat(" (half of ", memory.usable, ": ", memory.limit, ")")
                     : "")
             << " for all jobs, at most " << absl::GetFlag(FLAGS_max_job_bytes)
             << " per job; checkpoints only under " << state_roots->roots()[0];
  TLOG(INFO) << "ps " << spec->task_index << ": " << (*security)->Describe();
  int port = 0;
  auto server = towerps::common::StartServer(
      address, {&service}, &port, {towerps::v1::ParameterService::service_full_name()},
      security->get());
  if (!server.ok()) {
    std::cerr << "ps: " << server.status().message() << "\n";
    return 1;
  }
  // Nothing to load: a listening ps can take calls (grpc.health.v1 SERVING).
  towerps::common::SetServing(**server);
  TLOG(INFO) << "ps " << spec->task_index << " (" << spec->TaskName() << ") serving on "
             << address << " (port " << port << ")";
  // With the CPU time start-up took (libraries, gRPC): what the server's
  // work used is the exit line's less this one's (tests/bench/step_breakdown.sh).
  const towerps::common::CpuTime started = towerps::common::ProcessCpuTime();
  TLOG(INFO) << "ps " << spec->task_index << ": resident memory with no job "
             << towerps::common::ResidentBytes() << " bytes; cpu time at start user "
             << started.user_s << " s, system " << started.system_s << " s";
  const int sig = (*stop)->Wait();  // later signals are ignored
  const absl::Duration drain = absl::Seconds(absl::GetFlag(FLAGS_drain_s));
  TLOG(INFO) << "ps " << spec->task_index << ": signal " << sig << ", shutting down (drain "
             << drain << ")";
  towerps::common::BeginDraining(**server);  // health: NOT_SERVING before the port closes
  absl::SleepFor(drain);                     // the port stays open while probes see it
  // Long polls (up to --max_pull_wait_s) are answered UNAVAILABLE now: the
  // server's Shutdown waits for every handler, whatever its deadline.
  ps.StopWaiting();
  service.shm_calls().StopServing();  // same-host calls end too
  (*server)->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  const towerps::v1::StatusResponse held = ps.Status(towerps::v1::StatusRequest());
  for (const towerps::v1::JobStatus& j : held.jobs()) {
    const std::string updates = towerps::ps::DescribeUpdates(j);
    TLOG(INFO) << "ps " << spec->task_index << ": job \"" << j.job_id() << "\" held at exit: step "
               << j.global_step() << ", " << j.pushes_applied() << " pushes applied"
               << (updates.empty() ? "" : "; ") << updates;
  }
  const towerps::common::CpuTime stopped = towerps::common::ProcessCpuTime();
  TLOG(INFO) << "ps " << spec->task_index << ": stopped; peak resident memory (VmHWM) "
             << towerps::common::PeakResidentBytes()
             << " bytes, of which workers' shared segments mapped here (RssShmem, their pages, "
                "not this server's) at most "
             << service.segments().PeakSharedResidentBytes() << " bytes; cpu time user "
             << stopped.user_s << " s, system " << stopped.system_s << " s";
  return 0;
}
