// Placement of a job's variables on parameter servers.
//
// A plan is a list of parts: a part is a contiguous run of one variable's
// elements on one server. ROUND_ROBIN and GREEDY_BYTES keep every variable
// whole (one part each); PARTITIONED (the default) splits large variables
// across the servers. A server registers each of its parts as a variable of
// its own (PartDef): a whole variable under its own definition, a run of a
// split one as a 1-D variable named "<name>/part-<k>-of-<K>" whose
// initializer starts at the run's first element, so that its values do not
// depend on the split.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_PLACEMENT_H_
#define TOWERPS_WORKER_TRAIN_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::worker {

struct VariablePart {
  int var = 0;              // The variable (index in the caller's order).
  int server = 0;           // ps task.
  int index_on_server = 0;  // Position in that server's list (its var_index).
  int64_t offset = 0;       // First element within the variable.
  int64_t count = 0;        // Elements.
  int part = 0;             // k of the variable's K parts (0 when whole).
  int num_parts = 1;        // K: 1 when the variable is whole.
};

struct Placement {
  // By variable, then offset: every element of every variable exactly once.
  std::vector<VariablePart> parts;
  // server[i] / index_on_server[i]: where variable i's first part is.
  std::vector<int> server;
  std::vector<int> index_on_server;
  // bytes[s]: bytes placed on ps task s.
  std::vector<int64_t> bytes;

  // Parts on ps task `s`, in order of index_on_server.
  std::vector<VariablePart> PartsOn(int s) const;
  // Variables with a part on ps task `s`, in order of index_on_server.
  std::vector<int> VariablesOn(int s) const;
  // The definitions ps task `s` registers (see the top of this file).
  std::vector<v1::VariableDef> DefsOn(const std::vector<v1::VariableDef>& vars, int s) const;
  // One line per server: "ps 0: 3 variables, 1.2 MB (dense/kernel[0:1000), ...)".
  std::string Describe(const std::vector<v1::VariableDef>& vars) const;
};

// What a server registers for `part` of `var`: `var` itself when the part is
// the whole variable, else the part's 1-D definition.
v1::VariableDef PartDef(const v1::VariableDef& var, const VariablePart& part);

// Deterministic: the same inputs give the same plan on every worker and the
// chief. ROUND_ROBIN: variable i goes to ps i % num_ps. GREEDY_BYTES:
// largest first (ties by name), each onto the least-loaded ps (ties: lowest
// index). PARTITIONED / PLACEMENT_UNSPECIFIED: see proto/job.proto. Returns
// InvalidArgument if num_ps < 1 or a variable has a bad shape.
absl::StatusOr<Placement> PlanPlacement(const std::vector<v1::VariableDef>& vars, int num_ps,
                                        v1::PlacementStrategy strategy);

// Bytes of one variable's values.
int64_t VariableBytes(const v1::VariableDef& var);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_PLACEMENT_H_
