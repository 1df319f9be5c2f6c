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
  const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / 4);
  for (const auto& def : defs) {
    auto it = by_name.find(def.name());
    if (it == by_name.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", latest->dir_name, " has no variable \"", def.name(), "\""));
    }
    const std::vector<float>& values = it->second.value;
    int64_t offset = 0;
    do {
      const int64_t n = std::min<int64_t>(per_chunk, values.size() - offset);
      v1::ExportChunk chunk;
      if (offset == 0) *chunk.mutable_def() = it->second.def;
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
