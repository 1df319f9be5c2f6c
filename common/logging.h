// Minimal structured logging to stderr: "I1121 18:46:01.123 file.cc:42] msg".
//
// Thread-safe: each message is written with one write(2) call.
#ifndef TOWERPS_COMMON_LOGGING_H_
#define TOWERPS_COMMON_LOGGING_H_

#include <sstream>

namespace towerps::common {

enum class LogSeverity { kInfo, kWarning, kError };

// Collects one message and writes it when destroyed.
class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace towerps::common

#define TOWERPS_LOG_INFO ::towerps::common::LogSeverity::kInfo
#define TOWERPS_LOG_WARNING ::towerps::common::LogSeverity::kWarning
#define TOWERPS_LOG_ERROR ::towerps::common::LogSeverity::kError
// Usage: TLOG(INFO) << "text " << value;
#define TLOG(severity) \
  ::towerps::common::LogMessage(TOWERPS_LOG_##severity, __FILE__, __LINE__).stream()

#endif  // TOWERPS_COMMON_LOGGING_H_
