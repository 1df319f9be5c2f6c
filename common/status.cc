#include "common/status.h"

#include "absl/strings/str_cat.h"

namespace towerps::common {
std::string MessageOrCodeName(absl::StatusCode code, const std::string& message) {
  if (!message.empty()) return message;
  return absl::StrCat(absl::StatusCodeToString(code), " (no message)");
}

absl::Status Annotate(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ",
                                   MessageOrCodeName(status.code(), std::string(status.message()))));
}

}  // namespace towerps::common
