// An optional, append-only record of what a parameter server did to each
// job's step, for tests that check a cluster's history after faults (the
// chaos test): one line per event, written with one write(2) on an O_APPEND
// descriptor, so a line is in the file as soon as the event happened, even
// if the process is killed with SIGKILL right after.
//
// Lines (space separated; JOB never holds a space, job ids are validated):
//   create JOB STEP           the job was registered fresh here (STEP 0)
//   restore JOB STEP          the job was registered from a checkpoint shard
//   apply JOB WORKER STEP     a push of WORKER for STEP was accepted (SYNC:
//                             counted into the step's mean; ASYNC: applied)
//   save JOB STEP             a checkpoint shard of the job at STEP was written
//   delete JOB                the job was deleted here
// Each line starts with the server's incarnation (hex) so that a reader can
// tell restarts apart: "INCARNATION EVENT ...".
//
// Thread-safe. Off unless the ps is given --apply_log: callers hold a null
// pointer then and pay nothing.
#ifndef TOWERPS_PS_APPLY_LOG_H_
#define TOWERPS_PS_APPLY_LOG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::ps {

class ApplyLog {
 public:
  // Opens `path` for appending, creating it (mode 0644). The error names it.
  static absl::StatusOr<std::unique_ptr<ApplyLog>> Open(const std::string& path);
  ~ApplyLog();
  ApplyLog(const ApplyLog&) = delete;
  ApplyLog& operator=(const ApplyLog&) = delete;

  // Appends "<incarnation> <event>\n". A failed write is logged once and
  // otherwise ignored: the record is a test aid, never a reason to stop.
  void Append(uint64_t incarnation, absl::string_view event);

  const std::string& path() const { return path_; }

 private:
  ApplyLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
  bool warned_ = false;  // Races only on the log line; harmless.
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_APPLY_LOG_H_
