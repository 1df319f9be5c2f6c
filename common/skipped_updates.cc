#include "common/skipped_updates.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace towerps::common {

std::string SkippedUpdatesNote(const std::vector<std::pair<int, int64_t>>& shard_skipped) {
  std::vector<std::string> parts;
  for (const auto& [ps, skipped] : shard_skipped) {
    if (skipped > 0) parts.push_back(absl::StrCat("ps ", ps, " skipped ", skipped));
  }
  if (parts.empty()) return "";
  return absl::StrCat("Variable updates not applied, their values not finite (a gradient or an ",
                      "update out of float's range; the ps logs name them): ",
                      absl::StrJoin(parts, ", "), ".");
}

}  // namespace towerps::common
