// Publication: the variables of one step, becoming final one by one in
// var_index order while the server updates them (ps/commit.h), for the
// pulls that stream them meanwhile.
//
// Thread-safe.
#ifndef TOWERPS_PS_PUBLICATION_H_
#define TOWERPS_PS_PUBLICATION_H_

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace towerps::ps {

class Publication {
 public:
  Publication() = default;
  Publication(const Publication&) = delete;
  Publication& operator=(const Publication&) = delete;

  // Whether variable `v` is final.
  bool Ready(size_t v) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return v < ready_;
  }
  // Blocks until variable `v` is final.
  void Await(size_t v) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, v]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return v < ready_; };
    mu_.Await(absl::Condition(&ready));
  }
  // Variables [0, count) are final (a count never goes back).
  void Publish(size_t count) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (count > ready_) ready_ = count;
  }

 private:
  mutable absl::Mutex mu_;
  size_t ready_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PUBLICATION_H_
