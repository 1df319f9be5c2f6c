// Error-handling helpers shared by every layer (no gRPC here: the conversion
// to and from grpc::Status is common/grpc_status.h).
//
// Debian's Abseil (20220623) has no status macros; these are ours.
#ifndef TOWERPS_COMMON_STATUS_H_
#define TOWERPS_COMMON_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace towerps::common {

// `message`, or "<CODE> (no message)" when it is empty: no error is shown
// without words.
std::string MessageOrCodeName(absl::StatusCode code, const std::string& message);

// Returns `status` with `context + ": "` put before its message (or before
// the code's name when the message is empty).
absl::Status Annotate(const absl::Status& status, const std::string& context);

}  // namespace towerps::common

#define TOWERPS_STATUS_CONCAT_INNER_(a, b) a##b
#define TOWERPS_STATUS_CONCAT_(a, b) TOWERPS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller if not OK.
#define TOWERPS_RETURN_IF_ERROR(expr)                \
  do {                                               \
    ::absl::Status towerps_status_ = (expr);         \
    if (!towerps_status_.ok()) return towerps_status_; \
  } while (0)

// `lhs` = value of `expr` (an absl::StatusOr<T>), or returns its status.
#define TOWERPS_ASSIGN_OR_RETURN(lhs, expr)                                   \
  TOWERPS_ASSIGN_OR_RETURN_IMPL_(                                             \
      TOWERPS_STATUS_CONCAT_(towerps_statusor_, __LINE__), lhs, expr)
#define TOWERPS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return statusor.status();             \
  lhs = std::move(statusor).value()

#endif  // TOWERPS_COMMON_STATUS_H_
