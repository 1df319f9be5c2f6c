#include "common/status.h"

#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

// "UNIMPLEMENTED (no message)" for a status that carries none.
std::string MessageOrCodeName(absl::StatusCode code, const std::string& message) {
  if (!message.empty()) return message;
  return absl::StrCat(absl::StatusCodeToString(code), " (no message)");
}

}  // namespace

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

absl::Status Annotate(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ",
                                   MessageOrCodeName(status.code(), std::string(status.message()))));
}

}  // namespace towerps::common
