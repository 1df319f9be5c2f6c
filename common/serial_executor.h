// A thread of its own that runs closures one at a time, in the order they
// were scheduled: for work that must leave the caller's thread at once and
// keep its order (e.g. the worker's push and pull streams to one server,
// started every step without creating a thread every step).
//
// Thread-safe: Schedule may be called from any thread, including from a
// closure it runs.
//
// Lifecycle:  constructed (thread started) --Schedule--> runs closures
//             --destructor--> runs every closure still scheduled, then joins.
#ifndef TOWERPS_COMMON_SERIAL_EXECUTOR_H_
#define TOWERPS_COMMON_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace towerps::common {

class SerialExecutor {
 public:
  // `name`: the thread's name (common/thread_name.h); "" keeps the
  // creator's.
  explicit SerialExecutor(std::string name = "");
  // Runs what is still scheduled, then joins the thread. REQUIRES: not
  // called from a closure of this executor.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Runs `fn` on the executor's thread after every closure scheduled before
  // it. Does not block.
  void Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: starts once the members above exist.
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SERIAL_EXECUTOR_H_
