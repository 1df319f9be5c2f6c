#include "worker/chief/job_watch.h"

#include <algorithm>

#include "common/status.h"

namespace towerps::worker {

absl::Status WatchJob(const JobStore& store, const std::string& job_id, int64_t after_seq,
                      bool follow, const std::function<bool(const v1::JobEvent&)>& write,
                      const std::function<bool()>& stop, absl::Duration stop_poll) {
  int64_t sent = std::max<int64_t>(0, after_seq);
  while (true) {
    TOWERPS_ASSIGN_OR_RETURN(
        JobStore::EventBatch batch,
        store.EventsAfter(job_id, sent, follow ? stop_poll : absl::ZeroDuration()));
    for (const auto& ev : batch.events) {
      if (!write(ev)) return absl::OkStatus();
      sent = ev.seq();
    }
    if (!follow || (batch.ended && batch.events.empty()) || (stop && stop())) {
      return absl::OkStatus();
    }
  }
}

}  // namespace towerps::worker
