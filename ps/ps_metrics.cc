#include "ps/ps_metrics.h"

#include <array>
#include <utility>

namespace towerps::ps {

namespace {
// From 100 us to ~100 s, x4 apart: pushes and pulls of small and large models.
prometheus::Histogram::BucketBoundaries RpcBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 1e-4; s < 200; s *= 4) b.push_back(s);
  return b;
}
}  // namespace

PsMetrics::PsMetrics(prometheus::Registry& registry, const std::string& task)
    : push_bytes_(prometheus::BuildCounter()
                      .Name("towerps_ps_push_bytes_total")
                      .Help("Gradient payload bytes received in pushes.")
                      .Labels({{"task", task}})
                      .Register(registry)),
      pull_bytes_(prometheus::BuildCounter()
                      .Name("towerps_ps_pull_bytes_total")
                      .Help("Weight payload bytes sent in pulls.")
                      .Labels({{"task", task}})
                      .Register(registry)),
      rpc_seconds_(prometheus::BuildHistogram()
                       .Name("towerps_ps_rpc_seconds")
                       .Help("Time in the ParameterService handler, by method (a pull's "
                             "wait for its step included).")
                       .Labels({{"task", task}})
                       .Register(registry)),
      requests_(prometheus::BuildCounter()
                    .Name("towerps_ps_requests_total")
                    .Help("Finished ParameterService RPCs, by method and gRPC code.")
                    .Labels({{"task", task}})
                    .Register(registry)),
      global_step_(prometheus::BuildGauge()
                       .Name("towerps_ps_global_step")
                       .Help("The job's global step on this server.")
                       .Labels({{"task", task}})
                       .Register(registry)),
      pushes_(prometheus::BuildCounter()
                  .Name("towerps_ps_pushes_total")
                  .Help("Finished pushes by outcome: applied, duplicate (a retry, ignored) or "
                        "stale (SYNC: its step was already applied; dropped).")
                  .Labels({{"task", task}})
                  .Register(registry)),
      updates_skipped_(prometheus::BuildCounter()
                           .Name("towerps_ps_updates_skipped_total")
                           .Help("Variable updates not applied (each logged): the mean of a "
                                 "step's gradients was not finite, or the update would "
                                 "overflow a float.")
                           .Labels({{"task", task}})
                           .Register(registry)),
      checkpoint_seconds_(prometheus::BuildHistogram()
                              .Name("towerps_ps_checkpoint_seconds")
                              .Help("Time to write this server's checkpoint shard.")
                              .Labels({{"task", task}})
                              .Register(registry)
                              .Add({}, RpcBuckets())),
      checkpoint_bytes_(prometheus::BuildCounter()
                            .Name("towerps_ps_checkpoint_bytes_total")
                            .Help("Bytes of the checkpoint shards this server wrote.")
                            .Labels({{"task", task}})
                            .Register(registry)
                            .Add({})),
      refusals_(prometheus::BuildCounter()
                    .Name("towerps_refusals_total")
                    .Help("Requests refused by a resource limit, by the limit's name.")
                    .Labels({{"task", task}, {"server", "ps"}})
                    .Register(registry)) {}

void PsMetrics::CountRefusal(const std::string& reason) {
  refusals_.Add({{"reason", reason}}).Increment();
}

void PsMetrics::CountPush(const std::string& training_job, const std::string& outcome) {
  pushes_.Add({{"training_job", training_job}, {"outcome", outcome}}).Increment();
}

void PsMetrics::CountSkippedUpdate(const std::string& training_job) {
  updates_skipped_.Add({{"training_job", training_job}}).Increment();
}

void PsMetrics::RecordCheckpoint(int64_t bytes, double seconds) {
  checkpoint_seconds_.Observe(seconds);
  checkpoint_bytes_.Increment(static_cast<double>(bytes));
}

void PsMetrics::AddPushBytes(const std::string& training_job, int64_t bytes) {
  push_bytes_.Add({{"training_job", training_job}}).Increment(static_cast<double>(bytes));
}

void PsMetrics::AddPullBytes(const std::string& training_job, int64_t bytes) {
  pull_bytes_.Add({{"training_job", training_job}}).Increment(static_cast<double>(bytes));
}

void PsMetrics::SetGlobalStep(const std::string& training_job, int64_t step) {
  global_step_.Add({{"training_job", training_job}}).Set(static_cast<double>(step));
}

PsMemoryCollector::PsMemoryCollector(std::function<Reading()> read, std::string task)
    : read_(std::move(read)), task_(std::move(task)) {}

std::vector<prometheus::MetricFamily> PsMemoryCollector::Collect() const {
  const Reading r = read_();
  auto gauge = [this](const char* name, const char* help, int64_t value) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric m;
    m.label = {{"task", task_}};
    m.gauge.value = static_cast<double>(value);
    f.metric.push_back(std::move(m));
    return f;
  };
  std::vector<prometheus::MetricFamily> out;
  if (r.budget_bytes > 0) {
    out.push_back(gauge("towerps_ps_memory_budget_bytes",
                        "Most bytes all jobs together may hold (--memory_budget_bytes).",
                        r.budget_bytes));
  }
  out.push_back(gauge("towerps_ps_memory_reserved_bytes",
                      "Bytes the jobs held count against the budget: values, pull snapshots, "
                      "optimizer slots, push buffers.",
                      r.reserved_bytes));
  return out;
}

void PsMetrics::RecordRpc(const std::string& method, const std::string& code, double seconds) {
  rpc_seconds_.Add({{"method", method}}, RpcBuckets()).Observe(seconds);
  requests_.Add({{"method", method}, {"code", code}}).Increment();
}

std::string GrpcCodeName(int code) {
  static constexpr std::array<const char*, 17> kNames = {
      "OK",        "CANCELLED",         "UNKNOWN",          "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",      "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(kNames.size())) return "UNKNOWN";
  return kNames[code];
}

}  // namespace towerps::ps
