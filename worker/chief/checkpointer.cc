#include "worker/chief/checkpointer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "common/storage/file_util.h"

namespace towerps::worker {

Checkpointer::Checkpointer(std::vector<PsControl*> ps, JobStore& store,
                           const common::PathRoots* roots)
    : ps_(std::move(ps)), store_(store), roots_(roots) {}

absl::Status Checkpointer::Save(const std::string& job_id, const v1::JobSpec& spec,
                                int64_t step) {
  const int nps = static_cast<int>(ps_.size());
  std::string dir = spec.checkpoint().dir();
  if (roots_ != nullptr) {
    TOWERPS_ASSIGN_OR_RETURN(dir, roots_->Resolve("checkpoint.dir", dir));
  }
  const std::string name = common::CheckpointDirName(step);
  std::vector<v1::SaveResponse> saved(nps);
  std::vector<absl::Status> r = common::RunInParallel(nps, [&](int p) {
    v1::SaveRequest req;
    req.set_job_id(job_id);
    req.set_checkpoint_dir(dir + "/" + name);
    req.set_num_ps(nps);
    absl::StatusOr<v1::SaveResponse> s = ps_[p]->SaveCheckpoint(req, absl::Seconds(120));
    if (s.ok()) saved[p] = *s;
    return common::Annotate(s.status(), absl::StrCat("ps ", p));
  });
  for (int p = 0; p < nps; ++p) {
    if (!r[p].ok()) {
      RemovePartial(job_id, dir, name);
      return r[p];
    }
  }
  int64_t bytes = 0;
  for (int p = 0; p < nps; ++p) {
    bytes += saved[p].bytes();
    if (saved[p].global_step() != step) {
      store_.AddEvent(job_id, v1::JobEvent::LOG,
                      absl::StrCat("checkpoint ", name, ": ps ", p, " saved step ",
                                   saved[p].global_step(),
                                   " (asynchronous training moves on while saving)"));
    }
  }
  common::ManifestEntry entry;
  entry.step = step;
  entry.dir_name = name;
  entry.num_ps = nps;
  entry.unix_time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  // A damaged MANIFEST is rebuilt from the intact checkpoints on disk; the
  // job's events say so and from which.
  TOWERPS_RETURN_IF_ERROR(common::AddToManifest(
      dir, entry, spec.checkpoint().keep(), [&](const std::string& line) {
        store_.AddEvent(job_id, v1::JobEvent::LOG, absl::StrCat("checkpoint ", name, ": ", line));
        TLOG(WARNING) << "chief: job \"" << job_id << "\": checkpoint " << name << ": " << line;
      }));
  if (absl::Status s = store_.Update(job_id, [&](v1::JobRecord& r) { r.set_checkpoint_step(step); });
      !s.ok()) {
    TLOG(WARNING) << "chief: " << s;
  }
  store_.AddEvent(job_id, v1::JobEvent::LOG,
                  absl::StrFormat("checkpoint %s written: %d shards, %.1f MB", name, nps, bytes / 1e6));
  return absl::OkStatus();
}

void Checkpointer::RemovePartial(const std::string& job_id, const std::string& dir,
                                 const std::string& name) {
  // A directory the MANIFEST lists is a complete checkpoint (this step saved
  // before, e.g. at a stop): never touched.
  absl::StatusOr<std::vector<common::ManifestEntry>> listed = common::ReadManifest(dir);
  if (listed.ok()) {
    for (const auto& e : *listed) {
      if (e.dir_name == name) return;
    }
  } else if (!absl::IsNotFound(listed.status())) {
    return;  // Unknown: leave it; it is not listed, so never restored.
  }
  const std::string path = dir + "/" + name;
  absl::Status removed = common::RemoveAll(path);
  const std::string line =
      removed.ok() ? absl::StrCat("checkpoint ", name, " incomplete: removed ", path)
                   : absl::StrCat("checkpoint ", name, " incomplete, not listed in the MANIFEST; ",
                                  removed.message());
  store_.AddEvent(job_id, v1::JobEvent::LOG, line);
  TLOG(WARNING) << "chief: job \"" << job_id << "\": " << line;
}

absl::Status Checkpointer::MaybeSave(const std::string& job_id, const v1::JobSpec& spec,
                                     int64_t step, Schedule& schedule) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.disabled() || step <= 0 || step == schedule.last_step) return absl::OkStatus();
  const bool by_steps = c.every_steps() > 0 && step % c.every_steps() == 0;
  const bool by_time = c.every_seconds() > 0 &&
                       absl::Now() - schedule.last_time >= absl::Seconds(c.every_seconds());
  if (!by_steps && !by_time) return absl::OkStatus();
  schedule.last_step = step;
  schedule.last_time = absl::Now();
  absl::Status s = Save(job_id, spec, step);
  if (s.ok()) {
    schedule.failures_in_a_row = 0;
    return absl::OkStatus();
  }
  ++schedule.failures_in_a_row;
  const bool give_up = schedule.failures_in_a_row >= kMaxFailuresInARow;
  const std::string line =
      absl::StrCat("checkpoint at step ", step, " failed (", schedule.failures_in_a_row, " of ",
                   kMaxFailuresInARow, " in a row", give_up ? "" : "; the next one tries again",
                   "): ", s.message());
  store_.AddEvent(job_id, v1::JobEvent::LOG, line);
  TLOG(WARNING) << "chief: job \"" << job_id << "\": " << line;
  if (!give_up) return absl::OkStatus();
  return common::Annotate(s, absl::StrCat("checkpoint at step ", step, " failed ",
                                          kMaxFailuresInARow, " times in a row"));
}

}  // namespace towerps::worker
