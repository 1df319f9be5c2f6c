#include "worker/train/placement.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace towerps::worker {
namespace {

int64_t Elements(const v1::VariableDef& var) {
  int64_t n = 1;
  for (int64_t d : var.shape()) n *= d;
  return n;
}

// Capacities (elements) that bring the servers' `load`s (elements) up to an
// even level with `extra` more elements in all: water-filling.
std::vector<int64_t> FillToLevel(const std::vector<int64_t>& load, int64_t extra) {
  const int n = static_cast<int>(load.size());
  std::vector<int64_t> sorted = load;
  std::sort(sorted.begin(), sorted.end());
  // The level when the k least-loaded servers take everything.
  int64_t level = 0, below = 0;
  for (int k = 1; k <= n; ++k) {
    below += sorted[k - 1];
    level = (extra + below) / k;
    if (k == n || level <= sorted[k]) break;
  }
  std::vector<int64_t> cap(n, 0);
  int64_t given = 0;
  for (int s = 0; s < n; ++s) {
    cap[s] = std::max<int64_t>(0, level - load[s]);
    given += cap[s];
  }
  // The rounding remainder (fewer than n elements), one each, lowest load first.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return load[a] + cap[a] < load[b] + cap[b]; });
  for (int k = 0; given < extra; k = (k + 1) % n, ++given) ++cap[order[k]];
  return cap;
}

}  // namespace

int64_t VariableBytes(const v1::VariableDef& var) {
  return Elements(var) * 4;  // DT_FLOAT32 is the only dtype so far.
}

std::vector<VariablePart> Placement::PartsOn(int s) const {
  std::vector<VariablePart> out;
  for (const auto& p : parts) {
    if (p.server == s) out.push_back(p);
  }
  std::sort(out.begin(), out.end(), [](const VariablePart& a, const VariablePart& b) {
    return a.index_on_server < b.index_on_server;
  });
  return out;
}

std::vector<int> Placement::VariablesOn(int s) const {
  std::vector<int> out;
  for (const auto& p : PartsOn(s)) out.push_back(p.var);
  return out;
}

v1::VariableDef PartDef(const v1::VariableDef& var, const VariablePart& part) {
  if (part.num_parts == 1) return var;
  v1::VariableDef def = var;
  def.set_name(absl::StrCat(var.name(), "/part-", part.part, "-of-", part.num_parts));
  def.clear_shape();
  def.add_shape(part.count);
  def.mutable_initializer()->set_offset(var.initializer().offset() + part.offset);
  return def;
}

std::vector<v1::VariableDef> Placement::DefsOn(const std::vector<v1::VariableDef>& vars,
                                               int s) const {
  std::vector<v1::VariableDef> out;
  for (const auto& p : PartsOn(s)) out.push_back(PartDef(vars[p.var], p));
  return out;
}

std::string Placement::Describe(const std::vector<v1::VariableDef>& vars) const {
  std::string out;
  for (size_t s = 0; s < bytes.size(); ++s) {
    const std::vector<VariablePart> on = PartsOn(static_cast<int>(s));
    absl::StrAppendFormat(&out, "ps %d: %d variables, %.2f MB (", s, on.size(), bytes[s] / 1e6);
    for (size_t k = 0; k < on.size(); ++k) {
      absl::StrAppend(&out, k ? ", " : "", vars[on[k].var].name());
      if (on[k].num_parts > 1) {
        absl::StrAppend(&out, "[", on[k].offset, ":", on[k].offset + on[k].count, ")");
      }
    }
    absl::StrAppend(&out, ")", s + 1 < bytes.size() ? "\n" : "");
  }
  return out;
}

absl::StatusOr<Placement> PlanPlacement(const std::vector<v1::VariableDef>& vars, int num_ps,
                                        v1::PlacementStrategy strategy) {
  if (num_ps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement needs at least one ps task, got ", num_ps));
  }
  for (const auto& v : vars) {
    for (int64_t d : v.shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", v.name(), "\" has a non-positive dimension ", d));
      }
    }
  }
  const int n = static_cast<int>(vars.size());
  Placement p;
  p.bytes.assign(num_ps, 0);
  std::vector<int64_t> load(num_ps, 0);  // elements
  auto place = [&](int var, int s, int64_t offset, int64_t count) {
    VariablePart part;
    part.var = var;
    part.server = s;
    part.offset = offset;
    part.count = count;
    p.parts.push_back(part);
    load[s] += count;
  };
  if (strategy == v1::ROUND_ROBIN) {
    for (int i = 0; i < n; ++i) place(i, i % num_ps, 0, Elements(vars[i]));
  } else {
    int64_t total = 0;
    for (const auto& v : vars) total += Elements(v);
    // PARTITIONED (and the default): variables above 1/(4 num_ps) of the
    // model are split; the rest are placed greedily first.
    const bool partition = strategy != v1::GREEDY_BYTES && num_ps > 1;
    std::vector<int> whole, split;
    for (int i = 0; i < n; ++i) {
      const bool large = partition && Elements(vars[i]) * 4 * num_ps > total;
      (large ? split : whole).push_back(i);
    }
    std::stable_sort(whole.begin(), whole.end(), [&](int a, int b) {
      const int64_t ea = Elements(vars[a]), eb = Elements(vars[b]);
      if (ea != eb) return ea > eb;
      return vars[a].name() < vars[b].name();
    });
    for (int i : whole) {
      place(i, static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin()), 0,
            Elements(vars[i]));
    }
    // The split variables, in the caller's order, as one run of elements
    // poured over the servers in index order up to an even level.
    int64_t extra = 0;
    for (int i : split) extra += Elements(vars[i]);
    std::vector<int64_t> cap = FillToLevel(load, extra);
    int s = 0;
    for (int i : split) {
      for (int64_t offset = 0, left = Elements(vars[i]); left > 0;) {
        while (cap[s] == 0) ++s;
        const int64_t take = std::min(left, cap[s]);
        place(i, s, offset, take);
        cap[s] -= take;
        offset += take;
        left -= take;
      }
    }
  }
  // By variable then offset; each part's k of K; positions on each server
  // follow that order, so that every worker and the server agree without
  // exchanging the plan.
  std::sort(p.parts.begin(), p.parts.end(), [](const VariablePart& a, const VariablePart& b) {
    return a.var != b.var ? a.var < b.var : a.offset < b.offset;
  });
  std::vector<int> count(num_ps, 0);
  p.server.assign(n, 0);
  p.index_on_server.assign(n, 0);
  for (size_t k = 0; k < p.parts.size(); ++k) {
    VariablePart& part = p.parts[k];
    size_t first = k;
    while (first > 0 && p.parts[first - 1].var == part.var) --first;
    size_t last = k;
    while (last + 1 < p.parts.size() && p.parts[last + 1].var == part.var) ++last;
    part.part = static_cast<int>(k - first);
    part.num_parts = static_cast<int>(last - first + 1);
    part.index_on_server = count[part.server]++;
    if (part.part == 0) {
      p.server[part.var] = part.server;
      p.index_on_server[part.var] = part.index_on_server;
    }
  }
  for (int s = 0; s < num_ps; ++s) p.bytes[s] = load[s] * 4;
  return p;
}

}  // namespace towerps::worker
