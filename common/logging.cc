#include "common/logging.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace towerps::common {

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) {
  const char tag = severity == LogSeverity::kInfo      ? 'I'
                   : severity == LogSeverity::kWarning ? 'W'
                                                       : 'E';
  const char* base = std::strrchr(file, '/');
  stream_ << tag
          << absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(),
                              absl::LocalTimeZone())
          << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write so that lines from different threads never interleave.
  ssize_t unused = ::write(STDERR_FILENO, text.data(), text.size());
  (void)unused;
}

}  // namespace towerps::common
