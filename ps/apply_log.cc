#include "ps/apply_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace towerps::ps {

absl::StatusOr<std::unique_ptr<ApplyLog>> ApplyLog::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--apply_log is empty");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--apply_log: cannot open ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<ApplyLog>(new ApplyLog(path, fd));
}

ApplyLog::~ApplyLog() { ::close(fd_); }

void ApplyLog::Append(uint64_t incarnation, absl::string_view event) {
  const std::string line = absl::StrFormat("%x %s\n", incarnation, event);
  // O_APPEND: one write is one line, never interleaved with another's.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()) && !warned_) {
    warned_ = true;
    TLOG(WARNING) << "apply log " << path_ << ": write failed: "
                  << (n < 0 ? std::strerror(errno) : "short write") << " (further failures not logged)";
  }
}

}  // namespace towerps::ps
