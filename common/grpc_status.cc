#include "common/grpc_status.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::common {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      MessageOrCodeName(status.code(), std::string(status.message())));
}

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& call) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (status.error_message().empty()) {
    const std::string name = MessageOrCodeName(code, "");
    return absl::Status(code, call.empty() ? name : absl::StrCat(call, ": ", name));
  }
  // Transport errors ("Deadline Exceeded", "Socket closed") often say neither
  // what was called nor where.
  const bool transport = code == absl::StatusCode::kUnavailable ||
                         code == absl::StatusCode::kDeadlineExceeded;
  if (transport && !call.empty()) {
    return absl::Status(code, absl::StrCat(status.error_message(), " (", call, ")"));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace towerps::common
