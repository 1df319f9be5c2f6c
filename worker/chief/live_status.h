// Live status: what a running job is doing right now, gathered from every
// ps and worker, with the one line that best explains it; and the
// cluster's health for `towerctl cluster`.
//
// Thread-safe (no state). The clients are not owned; each query waits at
// most 2 s per task, all tasks in parallel.
#ifndef TOWERPS_WORKER_CHIEF_LIVE_STATUS_H_
#define TOWERPS_WORKER_CHIEF_LIVE_STATUS_H_

#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "proto/job_service.pb.h"
#include "worker/chief/ps_control.h"
#include "worker/chief/worker_client.h"

namespace towerps::worker {

// Fills live.global_step, waiting_for, waiting_s and explanation from its
// shards and workers (already filled) and the record's metrics. The
// explanation, first that applies:
//   "step S has waited T s for worker(s) A, B[ (worker B does not answer
//    status requests either: stopped, hung or overloaded?)]"  (SYNC, >= 2 s)
//   "ps P (ADDR) is unreachable: ERR"
//   "worker W (ADDR) is unreachable: ERR"
//   "trained all N steps: evaluating and writing the final checkpoint"
//   "starting: the servers do not hold the job's variables yet"
//   "running: step S"
void ExplainLive(const v1::JobRecord& record, v1::JobLiveStatus& live);

// Queries every ps and worker about `record`'s job, then ExplainLive.
v1::JobLiveStatus GatherLive(const v1::JobRecord& record, const common::ClusterSpec& cluster,
                             const std::vector<PsControl*>& ps,
                             const std::vector<WorkerClient*>& workers);

// Every task's address, health, uptime (and memory held, devices).
v1::ClusterResponse GatherCluster(const common::ClusterSpec& cluster,
                                  const std::vector<PsControl*>& ps,
                                  const std::vector<WorkerClient*>& workers);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_LIVE_STATUS_H_
