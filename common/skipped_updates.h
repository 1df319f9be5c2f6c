// The one line that reports variable updates the parameter servers did not
// apply (JobStatus.updates_skipped: their new values or optimizer slots
// would not have been finite), for `towerctl status` and the chief's job
// event alike.
#ifndef TOWERPS_COMMON_SKIPPED_UPDATES_H_
#define TOWERPS_COMMON_SKIPPED_UPDATES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace towerps::common {

// "Variable updates not applied, their values not finite (...): ps 1
// skipped 2, ps 3 skipped 1." from (ps task, updates_skipped) pairs, in
// their order; "" where none skipped any.
std::string SkippedUpdatesNote(const std::vector<std::pair<int, int64_t>>& shard_skipped);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SKIPPED_UPDATES_H_
