// The parameter server's Prometheus metrics (issue 14). The gRPC adapter
// (ps_service) reports to them; parameter_server knows nothing of them.
//
//   towerps_ps_push_bytes_total{training_job}   gradient payload received, as on the
//                                               wire (compressed bytes when the
//                                               job compresses its pushes)
//   towerps_ps_pull_bytes_total{training_job}   weight payload sent
//   towerps_ps_rpc_seconds{method}              handler time, waits included (histogram)
//   towerps_ps_requests_total{method,code}      finished RPCs by gRPC code name
//   towerps_ps_global_step{training_job}        the job's step after a push
//   towerps_ps_pushes_total{training_job,outcome}  pushes by outcome: applied,
//                                               duplicate (a retry), stale (SYNC:
//                                               its step already applied: dropped)
//   towerps_ps_updates_skipped_total{training_job}  variable updates not applied:
//                                               the step's mean gradient not finite,
//                                               or the update would overflow a float
//   towerps_ps_checkpoint_seconds               time to write this server's shard (histogram)
//   towerps_ps_checkpoint_bytes_total           bytes of the shards written
//   towerps_refusals_total{server="ps",reason}  requests refused by a limit
//                                               (issue 15): reason names it,
//                                               e.g. memory_budget_bytes
//
// Every series also carries the constant label task ("ps:0").
//
// Thread-safe.
#ifndef TOWERPS_PS_PS_METRICS_H_
#define TOWERPS_PS_PS_METRICS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace towerps::ps {

class PsMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  PsMetrics(prometheus::Registry& registry, const std::string& task);

  void AddPushBytes(const std::string& training_job, int64_t bytes);
  void AddPullBytes(const std::string& training_job, int64_t bytes);
  void SetGlobalStep(const std::string& training_job, int64_t step);
  // One finished push of `training_job`: "applied", "duplicate" or "stale".
  void CountPush(const std::string& training_job, const std::string& outcome);
  // One variable's update of `training_job` not applied (its values would
  // not be finite).
  void CountSkippedUpdate(const std::string& training_job);
  // One shard written: its bytes and how long it took.
  void RecordCheckpoint(int64_t bytes, double seconds);
  // One request refused by a limit; `reason` names it ("max_job_bytes").
  void CountRefusal(const std::string& reason);
  // One finished RPC: `method` ("Push"), `code` a gRPC code name ("OK").
  void RecordRpc(const std::string& method, const std::string& code, double seconds);

 private:
  prometheus::Family<prometheus::Counter>& push_bytes_;
  prometheus::Family<prometheus::Counter>& pull_bytes_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Gauge>& global_step_;
  prometheus::Family<prometheus::Counter>& pushes_;
  prometheus::Family<prometheus::Counter>& updates_skipped_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Counter& checkpoint_bytes_;
  prometheus::Family<prometheus::Counter>& refusals_;
};

// The server's memory budget and what its jobs count against it, read at
// each scrape (they change with every register and delete):
//   towerps_ps_memory_budget_bytes{task}    --memory_budget_bytes (absent: none)
//   towerps_ps_memory_reserved_bytes{task}  values, pull snapshots, optimizer
//                                           slots and push buffers of the jobs held
class PsMemoryCollector : public prometheus::Collectable {
 public:
  struct Reading {
    int64_t budget_bytes = 0;  // 0: no budget
    int64_t reserved_bytes = 0;
  };
  // `read` runs on the HTTP thread at each scrape; what it reads must
  // outlive every scrape (remove this collector first).
  PsMemoryCollector(std::function<Reading()> read, std::string task);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<Reading()> read_;
  const std::string task_;
};

// "OK", "INVALID_ARGUMENT", ... for a gRPC status code number.
std::string GrpcCodeName(int code);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PS_METRICS_H_
