// Placement of a job's variables on parameter servers.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_PLACEMENT_H_
#define TOWERPS_WORKER_TRAIN_PLACEMENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::worker {

struct Placement {
  // server[i]: ps task of variable i (in the caller's order).
  std::vector<int> server;
  // index_on_server[i]: position of variable i in its server's list.
  std::vector<int> index_on_server;
  // bytes[s]: bytes placed on ps task s.
  std::vector<int64_t> bytes;

  // Variables of ps task `s`, in order of index_on_server.
  std::vector<int> VariablesOn(int s) const;
  // One line per server: "ps 0: 3 variables, 1.2 MB (dense/kernel, ...)".
  std::string Describe(const std::vector<v1::VariableDef>& vars) const;
};

// Deterministic: the same inputs give the same plan on every worker.
// ROUND_ROBIN: variable i goes to ps i % num_ps. GREEDY_BYTES (default):
// largest first (ties by name), each onto the least-loaded ps (ties: lowest
// index). Returns InvalidArgument if num_ps < 1 or a variable has a bad shape.
absl::StatusOr<Placement> PlanPlacement(const std::vector<v1::VariableDef>& vars,
                                        int num_ps,
                                        v1::PlacementStrategy strategy);

// Bytes of one variable's values.
int64_t VariableBytes(const v1::VariableDef& var);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_PLACEMENT_H_
