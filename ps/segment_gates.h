// The workers' shared segments (common/shared_segment.h) as one server uses
// them: each segment's mapping, kept between calls, and who may write into
// it. No gRPC here; the service (ps_service.h) asks for a segment by what a
// request names.
//
// A mapping made afresh for every call would fault each page in again and
// cost more than pwrite; one that is kept costs well under half of it. So a
// segment stays mapped until it has gone unused for idle_release (10 s), or
// the gates are destroyed: a worker that has gone holds no memory here
// longer than that.
//
// Thread-safe. A janitor thread, from construction to destruction, lets go
// of idle mappings and samples the shared memory resident (RssShmem) ten
// times a second while any segment is mapped.
#ifndef TOWERPS_PS_SEGMENT_GATES_H_
#define TOWERPS_PS_SEGMENT_GATES_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/shared_segment.h"
#include "proto/ps.pb.h"

namespace towerps::ps {

// common::SegmentFile::Open of the segment a request names (a mapping of
// the caller's own). FailedPrecondition / InvalidArgument as Open says.
absl::StatusOr<std::shared_ptr<common::SegmentFile>> OpenSegment(
    const v1::SharedSegment& segment);

class SegmentGates {
 public:
  // One worker segment: its mapping while in use, and who may write into
  // it: only the latest pull that named it (the highest pull_id). A call
  // the worker abandoned may still be running; it must not write over the
  // values of the pull that replaced it, so every pull's write holds `mu`
  // and checks `latest` first.
  struct Gate {
    absl::Mutex mu;
    uint64_t latest ABSL_GUARDED_BY(mu) = 0;
    absl::Time used ABSL_GUARDED_BY(mu);
    // The mapping, and the pid and fd it was opened with; null when not
    // mapped (never yet, or let go after idle_release).
    std::shared_ptr<common::SegmentFile> file ABSL_GUARDED_BY(mu);
    int64_t pid ABSL_GUARDED_BY(mu) = 0;
    int64_t fd ABSL_GUARDED_BY(mu) = 0;
  };

  SegmentGates();
  ~SegmentGates();
  SegmentGates(const SegmentGates&) = delete;
  SegmentGates& operator=(const SegmentGates&) = delete;

  // The segment `segment` names, mapped: its gate's mapping when that was
  // opened with the same pid, fd and size, else opened now (OpenSegment;
  // its errors) and kept in the gate, which is created on the first success
  // (gates unused for a minute are dropped once there are many). Marks the
  // gate used; sets *gate to it.
  absl::StatusOr<std::shared_ptr<common::SegmentFile>> Map(const v1::SharedSegment& segment,
                                                           std::shared_ptr<Gate>* gate)
      ABSL_LOCKS_EXCLUDED(mu_);

  // How long a segment stays mapped unused. Default: 10 s.
  void set_idle_release(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Segments mapped now.
  int mapped() ABSL_LOCKS_EXCLUDED(mu_);
  // The most bytes of workers' segments resident in this process at once
  // (RssShmem, looked at ten times a second while any is mapped, before one
  // is let go, and now). They count in its VmHWM, though the pages are the
  // workers' (one copy, theirs).
  int64_t PeakSharedResidentBytes();

 private:
  std::shared_ptr<Gate> GateFor(const std::string& nonce) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Gate>> All() ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of the mappings unused for idle_release_, noting the shared
  // memory resident first when any is mapped.
  void ReleaseIdle() ABSL_LOCKS_EXCLUDED(mu_);
  void NoteSharedResident();

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Gate>> gates_ ABSL_GUARDED_BY(mu_);  // by nonce
  absl::Duration idle_release_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  std::atomic<int64_t> peak_shared_resident_{0};
  // Runs ReleaseIdle until stop_janitor_.
  absl::Notification stop_janitor_;
  std::thread janitor_;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_SEGMENT_GATES_H_
