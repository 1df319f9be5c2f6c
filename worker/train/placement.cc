#include "worker/train/placement.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace towerps::worker {

int64_t VariableBytes(const v1::VariableDef& var) {
  int64_t n = 1;
  for (int64_t d : var.shape()) n *= d;
  return n * 4;  // DT_FLOAT32 is the only dtype so far.
}

std::vector<int> Placement::VariablesOn(int s) const {
  std::vector<int> out;
  for (size_t i = 0; i < server.size(); ++i) {
    if (server[i] == s) out.push_back(static_cast<int>(i));
  }
  std::sort(out.begin(), out.end(), [&](int a, int b) {
    return index_on_server[a] < index_on_server[b];
  });
  return out;
}

std::string Placement::Describe(const std::vector<v1::VariableDef>& vars) const {
  std::string out;
  for (size_t s = 0; s < bytes.size(); ++s) {
    std::vector<int> on = VariablesOn(static_cast<int>(s));
    absl::StrAppendFormat(&out, "ps %d: %d variables, %.2f MB (", s, on.size(),
                          bytes[s] / 1e6);
    for (size_t k = 0; k < on.size(); ++k) {
      absl::StrAppend(&out, k ? ", " : "", vars[on[k]].name());
    }
    absl::StrAppend(&out, ")", s + 1 < bytes.size() ? "\n" : "");
  }
  return out;
}

absl::StatusOr<Placement> PlanPlacement(const std::vector<v1::VariableDef>& vars,
                                        int num_ps,
                                        v1::PlacementStrategy strategy) {
  if (num_ps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement needs at least one ps task, got ", num_ps));
  }
  for (const auto& v : vars) {
    for (int64_t d : v.shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variable \"", v.name(), "\" has a non-positive dimension ", d));
      }
    }
  }
  const int n = static_cast<int>(vars.size());
  Placement p;
  p.server.assign(n, 0);
  p.index_on_server.assign(n, 0);
  p.bytes.assign(num_ps, 0);
  std::vector<int> count(num_ps, 0);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  const bool greedy = strategy != v1::ROUND_ROBIN;
  if (greedy) {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      int64_t ba = VariableBytes(vars[a]), bb = VariableBytes(vars[b]);
      if (ba != bb) return ba > bb;
      return vars[a].name() < vars[b].name();
    });
  }
  for (int k = 0; k < n; ++k) {
    const int i = order[k];
    int s = k % num_ps;
    if (greedy) {
      s = static_cast<int>(std::min_element(p.bytes.begin(), p.bytes.end()) -
                           p.bytes.begin());
    }
    p.server[i] = s;
    p.bytes[s] += VariableBytes(vars[i]);
  }
  // Positions on each server follow the caller's order, so that every worker
  // and the server agree without exchanging the plan.
  for (int i = 0; i < n; ++i) p.index_on_server[i] = count[p.server[i]]++;
  return p;
}

}  // namespace towerps::worker
