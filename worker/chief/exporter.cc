#include "worker/chief/exporter.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "worker/train/job_runner.h"
#include "worker/train/placement.h"

namespace towerps::worker {

absl::Status ExportJob(const v1::JobRecord& record, int64_t chunk_bytes,
                       const std::function<bool(const v1::ExportChunk&)>& write) {
  const std::string dir = record.checkpoint_dir();
  auto latest = common::FindLatestValidCheckpoint(
      dir, [](const std::string& line) { TLOG(WARNING) << "export: " << line; });
  if (!latest.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("job \"", record.job_id(),
                                                      "\" has no usable checkpoint to export (",
                                                      latest.status().message(), ")"));
  }
  std::map<std::string, common::VariableState> by_name;
  for (int s = 0; s < latest->num_ps; ++s) {
    TOWERPS_ASSIGN_OR_RETURN(
        common::ShardState shard,
        common::ReadShard(absl::StrCat(dir, "/", latest->dir_name, "/",
                                       common::ShardFileName(s, latest->num_ps))));
    for (auto& v : shard.vars) by_name[v.def.name()] = std::move(v);
  }
  TOWERPS_ASSIGN_OR_RETURN(std::vector<v1::VariableDef> defs, JobVariables(record.spec()));
  // The servers held the job's plan: a split variable is reassembled from
  // its parts.
  TOWERPS_ASSIGN_OR_RETURN(Placement plan,
                           PlanPlacement(defs, latest->num_ps, record.spec().placement()));
  const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / 4);
  for (size_t i = 0; i < defs.size(); ++i) {
    const v1::VariableDef& def = defs[i];
    std::vector<float> joined;
    const std::vector<float>* found = nullptr;
    // Whole under its own name (every plan but a split; also checkpoints of
    // jobs placed before PARTITIONED was the default).
    auto whole = by_name.find(def.name());
    if (whole != by_name.end() &&
        static_cast<int64_t>(whole->second.value.size()) * 4 == VariableBytes(def)) {
      found = &whole->second.value;
    }
    for (const VariablePart& part : plan.parts) {
      if (found != nullptr && joined.empty()) break;
      if (part.var != static_cast<int>(i)) continue;
      const std::string name = PartDef(def, part).name();
      auto it = by_name.find(name);
      if (it == by_name.end() ||
          static_cast<int64_t>(it->second.value.size()) != part.count) {
        return absl::DataLossError(absl::StrCat("checkpoint ", latest->dir_name,
                                                " has no variable \"", name, "\"",
                                                it == by_name.end() ? "" : " of its size"));
      }
      if (part.num_parts == 1) {
        found = &it->second.value;
      } else {
        joined.insert(joined.end(), it->second.value.begin(), it->second.value.end());
        found = &joined;
      }
    }
    if (found == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", latest->dir_name, " has no variable \"", def.name(), "\""));
    }
    const std::vector<float>& values = *found;
    int64_t offset = 0;
    do {
      const int64_t n = std::min<int64_t>(per_chunk, values.size() - offset);
      v1::ExportChunk chunk;
      if (offset == 0) *chunk.mutable_def() = def;
      chunk.set_offset(offset);
      chunk.set_global_step(latest->step);
      chunk.set_data(reinterpret_cast<const char*>(values.data() + offset), n * 4);
      if (!write(chunk)) return absl::CancelledError("export: client went away");
      offset += n;
    } while (offset < static_cast<int64_t>(values.size()));
  }
  return absl::OkStatus();
}

}  // namespace towerps::worker
