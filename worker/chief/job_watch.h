// WatchJob: streams a job's events (progress, epochs, logs, state changes)
// from the job store to one client.
//
// Thread-safe; blocks the calling thread (one per watching client) and
// calls `write` on it, with no lock held.
#ifndef TOWERPS_WORKER_CHIEF_JOB_WATCH_H_
#define TOWERPS_WORKER_CHIEF_JOB_WATCH_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/job_service.pb.h"
#include "worker/chief/job_store.h"

namespace towerps::worker {

// Sends the events with seq > `after_seq`, in order. Without `follow`,
// returns after those. With `follow`, keeps sending new ones until the job
// has ended and every event is sent, `write` returns false, or `stop()`
// (checked at least every `stop_poll`) returns true. `stop` may be empty.
// NotFound for an unknown job.
absl::Status WatchJob(const JobStore& store, const std::string& job_id, int64_t after_seq,
                      bool follow, const std::function<bool(const v1::JobEvent&)>& write,
                      const std::function<bool()>& stop,
                      absl::Duration stop_poll = absl::Milliseconds(500));

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_JOB_WATCH_H_
