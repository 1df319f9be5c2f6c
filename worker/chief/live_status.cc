#include "worker/chief/live_status.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parallel.h"

namespace towerps::worker {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(2);

}  // namespace

void ExplainLive(const v1::JobRecord& record, v1::JobLiveStatus& live) {
  int64_t step = -1;
  double waited = 0;
  std::vector<int> waiting;
  for (const auto& sh : live.shards()) {
    if (!sh.has_status()) continue;
    step = step < 0 ? sh.status().global_step() : std::min(step, sh.status().global_step());
    if (sh.status().step_open_s() >= waited) {
      waited = sh.status().step_open_s();
      waiting.assign(sh.status().waiting_for().begin(), sh.status().waiting_for().end());
    }
  }
  live.set_global_step(std::max<int64_t>(step, 0));
  // Past the last step the servers still hold the next step open, but no
  // worker will push it: the chief is evaluating or writing the final
  // checkpoint, and nobody is waited for.
  const int64_t total = record.metrics().total_steps();
  const bool trained = total > 0 && step >= total;
  const bool sync = record.spec().mode() != v1::ASYNC;
  live.clear_waiting_for();
  if (sync && !trained) {
    for (int w : waiting) live.add_waiting_for(w);
    live.set_waiting_s(waited);
  }
  // The most useful single line: a ps that does not answer first (every
  // step needs every ps: workers blocked on it leave the servers' step
  // waiting for them too), then a step stuck on some workers (and whether
  // they answer at all), then unreachable workers.
  std::string explanation;
  for (const auto& sh : live.shards()) {
    if (explanation.empty() && !sh.reachable()) {
      const double timeout_s =
          record.spec().peer_timeout_s() > 0 ? record.spec().peer_timeout_s() : 60;
      explanation = absl::StrFormat(
          "ps %d (%s) is unreachable: %s (every step needs it: the workers fail the job after "
          "%g s without it)",
          sh.ps_task(), sh.address(), sh.error(), timeout_s);
    }
  }
  if (explanation.empty() && sync && !trained && !waiting.empty() && waited >= 2.0) {
    std::vector<std::string> silent;
    for (int w : waiting) {
      if (w >= 0 && w < live.workers_size() && !live.workers(w).reachable()) {
        silent.push_back(absl::StrCat(w));
      }
    }
    explanation = absl::StrFormat(
        "step %d has waited %.1f s for worker%s %s%s", step, waited, waiting.size() > 1 ? "s" : "",
        absl::StrJoin(waiting, ", "),
        silent.empty() ? ""
                       : absl::StrCat(" (worker ", absl::StrJoin(silent, ", "),
                                      " does not answer status requests either: stopped, "
                                      "hung or overloaded?)"));
  }
  for (const auto& w : live.workers()) {
    if (explanation.empty() && !w.reachable()) {
      explanation = absl::StrCat("worker ", w.task_index(), " (", w.address(),
                                 ") is unreachable: ", w.error());
    }
  }
  if (explanation.empty() && trained) {
    explanation =
        absl::StrCat("trained all ", total, " steps: evaluating and writing the final checkpoint");
  }
  if (explanation.empty() && step < 0) {
    explanation = "starting: the servers do not hold the job's variables yet";
  }
  if (explanation.empty()) explanation = absl::StrCat("running: step ", step);
  live.set_explanation(explanation);
}

v1::JobLiveStatus GatherLive(const v1::JobRecord& record, const common::ClusterSpec& cluster,
                             const std::vector<PsControl*>& ps,
                             const std::vector<WorkerClient*>& workers) {
  const std::string& id = record.job_id();
  const int nps = static_cast<int>(ps.size()), nw = static_cast<int>(workers.size());
  std::vector<v1::ShardStatus> shards(nps);
  std::vector<v1::WorkerProgress> progress(nw);
  common::RunInParallel(nps + nw, [&](int i) {
    if (i < nps) {
      v1::ShardStatus& sh = shards[i];
      sh.set_ps_task(i);
      if (i < static_cast<int>(cluster.ps.size())) sh.set_address(cluster.ps[i]);
      absl::StatusOr<v1::StatusResponse> s = ps[i]->GetStatus(id, kTimeout);
      sh.set_reachable(s.ok());
      if (!s.ok()) sh.set_error(std::string(s.status().message()));
      if (s.ok() && s->jobs_size() == 1) *sh.mutable_status() = s->jobs(0);
      if (s.ok() && s->jobs_size() == 0) sh.set_error("job not registered here (yet)");
    } else {
      const int w = i - nps;
      v1::WorkerProgress& wp = progress[w];
      wp.set_task_index(w);
      if (w < static_cast<int>(cluster.worker.size())) wp.set_address(cluster.worker[w]);
      absl::StatusOr<v1::WorkerStatus> s = workers[w]->GetStatus(kTimeout);
      wp.set_reachable(s.ok());
      if (!s.ok()) wp.set_error(std::string(s.status().message()));
      if (s.ok() && s->job_id() == id) {
        wp.set_state(s->state());
        wp.set_iterations(s->iterations());
        wp.set_last_step(s->last_step());
        wp.set_error(s->error());
      }
    }
    return absl::OkStatus();
  });
  v1::JobLiveStatus live;
  for (auto& sh : shards) *live.add_shards() = std::move(sh);
  for (auto& w : progress) *live.add_workers() = std::move(w);
  ExplainLive(record, live);
  return live;
}

v1::ClusterResponse GatherCluster(const common::ClusterSpec& cluster,
                                  const std::vector<PsControl*>& ps,
                                  const std::vector<WorkerClient*>& workers) {
  const int nps = static_cast<int>(ps.size()), nw = static_cast<int>(workers.size());
  std::vector<v1::TaskInfo> tasks(nps + nw);
  common::RunInParallel(nps + nw, [&](int i) {
    v1::TaskInfo& t = tasks[i];
    if (i < nps) {
      t.set_job("ps");
      t.set_index(i);
      if (i < static_cast<int>(cluster.ps.size())) t.set_address(cluster.ps[i]);
      absl::StatusOr<v1::StatusResponse> s = ps[i]->GetStatus("", kTimeout);
      t.set_healthy(s.ok());
      if (!s.ok()) {
        t.set_error(std::string(s.status().message()));
        return absl::OkStatus();
      }
      t.set_uptime_s(s->uptime_s());
      int64_t bytes = 0;
      for (const auto& j : s->jobs()) bytes += j.bytes_held() + j.slot_bytes();
      t.set_bytes_held(bytes);
      t.set_jobs(s->jobs_size());
      t.set_memory_budget_bytes(s->memory_budget_bytes());
      t.set_memory_reserved_bytes(s->memory_reserved_bytes());
    } else {
      const int w = i - nps;
      t.set_job("worker");
      t.set_index(w);
      if (w < static_cast<int>(cluster.worker.size())) t.set_address(cluster.worker[w]);
      t.set_is_chief(w == cluster.task_index);
      absl::StatusOr<v1::WorkerStatus> s = workers[w]->GetStatus(kTimeout);
      t.set_healthy(s.ok());
      if (!s.ok()) {
        t.set_error(std::string(s.status().message()));
        return absl::OkStatus();
      }
      t.set_uptime_s(s->uptime_s());
      *t.mutable_devices() = s->devices();
    }
    return absl::OkStatus();
  });
  v1::ClusterResponse response;
  for (auto& t : tasks) *response.add_tasks() = std::move(t);
  return response;
}

}  // namespace towerps::worker
