// A job's values at one global step as a pull streams them
// (ParameterServer::Pull). A plain struct; immutable once handed out.
#ifndef TOWERPS_PS_WEIGHTS_SNAPSHOT_H_
#define TOWERPS_PS_WEIGHTS_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "ps/publication.h"

namespace towerps::ps {

// The values of a job's variables at one global step, for a pull to stream
// without the job's lock; immutable while anyone holds it. No copy is made
// for it: `values` view the variables themselves, and before the server
// changes them while a pull still holds the snapshot, the snapshot takes the
// old buffers and the variables continue on copies (copy on write).
//
// A snapshot taken while its step's update is still under way (Commit
// below) views variables that are not all final yet: each becomes final in
// var_index order, and a reader waits for it (Ready, AwaitReady) before
// reading it.
struct WeightsSnapshot {
  int64_t global_step = 0;
  std::vector<absl::Span<const float>> values;  // by var_index
  // Set once detached: the buffers `values` view (shared with other views of
  // the same step, e.g. a checkpoint being written).
  std::vector<std::shared_ptr<const std::vector<float>>> owned;
  // Null: every variable is final.
  std::shared_ptr<const Publication> publication;

  // Whether variable `v`'s values are final.
  bool Ready(size_t v) const { return publication == nullptr || publication->Ready(v); }
  // Blocks until they are (a commit never stops part way: it is CPU work).
  void AwaitReady(size_t v) const {
    if (publication != nullptr) publication->Await(v);
  }
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_WEIGHTS_SNAPSHOT_H_
