// One worker's share of an update as a push leaves it (PushSession) and
// the update reads it (Commit). A plain struct; thread-compatible.
#ifndef TOWERPS_PS_GRADIENT_PART_H_
#define TOWERPS_PS_GRADIENT_PART_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/optimizer.h"

namespace towerps::ps {

// One worker's gradient (or batch statistic) for an update, variable by
// variable: in the server's own buffer (`owned[v]`: copied in from slices;
// where the update is formed ahead, the new values), or read in place
// from the worker's shared segment (`shared[v]` non-null), which `segment`
// keeps mapped. A worker leaves its pushed gradients unchanged until its
// next forward has pulled every variable of the update (ps_client.h), so
// the update reads them there, after the push was answered, and a server
// holds no copy of a same-host push (issue 16: with several workers a copy
// each was most of a server's memory).
struct GradientPart {
  float weight = 1.0f;  // examples over the step's total (1 in ASYNC)
  std::vector<std::vector<float>> owned;  // by var_index (empty where shared)
  std::vector<const float*> shared;       // by var_index, or empty
  std::shared_ptr<const void> segment;
  // Same host: where the worker's pulls of each variable land in that
  // segment (null, -1: not named), which `values_key` names, for the
  // update to write the new values there as well (Commit::Run).
  std::vector<float*> values_to;  // by var_index, or empty
  std::vector<int64_t> values_at;
  std::string values_key;
  // Where the update was formed ahead, the optimizer slots' new values, by
  // var_index (Optimizer::AdoptSlots order; empty where none).
  std::vector<std::vector<std::vector<float>>> slots;
  // By var_index, for the overflow guard (Commit::Run): the sum of |g| of
  // each owned gradient, as checked when it came (none: unknown);
  // and where the update was formed ahead, bounds on what it formed.
  std::vector<double> abs_sums;
  std::vector<MagnitudeBounds> formed_bounds;

  bool is_shared(size_t v) const { return v < shared.size() && shared[v] != nullptr; }
  const float* data(size_t v) const { return is_shared(v) ? shared[v] : owned[v].data(); }
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_GRADIENT_PART_H_
