// Fan-out helper: one call per server or worker, each on its own thread.
//
// Thread-safe if `fn` is.
#ifndef TOWERPS_COMMON_PARALLEL_H_
#define TOWERPS_COMMON_PARALLEL_H_

#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace towerps::common {

// Runs fn(i) for every i in [0, n), concurrently (inline when n == 1), and
// returns their statuses by i once all have returned.
template <typename Fn>
std::vector<absl::Status> RunInParallel(int n, Fn fn) {
  std::vector<absl::Status> results(n);
  if (n == 1) {
    results[0] = fn(0);
    return results;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { results[i] = fn(i); });
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PARALLEL_H_
