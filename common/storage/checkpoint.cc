// The checkpoints of a directory: each one's directory name, the MANIFEST
// that lists them (written, read, rebuilt from the shards where it is lost)
// and the newest whose shards all verify. A shard file's encoding is in
// checkpoint_shard.cc.
#include "common/storage/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "proto/checkpoint.pb.h"

namespace towerps::common {
namespace {

constexpr char kManifestMagic[] = "towerps-manifest";
constexpr int kManifestFormatVersion = 1;
constexpr char kManifestFileName[] = "MANIFEST";

// Empty if `e` is fine, else what is wrong with it.
std::string CheckEntry(const ManifestEntry& e) {
  if (e.step < 0) return absl::StrCat("step ", e.step, " < 0");
  if (e.dir_name.empty() || e.dir_name == "." || e.dir_name == ".." ||
      e.dir_name == kManifestFileName || e.dir_name.find('/') != std::string::npos ||
      e.dir_name.find('\0') != std::string::npos) {
    return absl::StrCat("step ", e.step, ": dir_name \"", absl::CHexEscape(e.dir_name),
                        "\" is not a plain directory name");
  }
  if (e.num_ps < 1) return absl::StrCat("step ", e.step, ": num_ps ", e.num_ps, " < 1");
  return "";
}

std::string CheckEntries(const std::vector<ManifestEntry>& entries) {
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string bad = CheckEntry(entries[i]);
    if (!bad.empty()) return bad;
    if (i > 0 && entries[i].step <= entries[i - 1].step) {
      return absl::StrCat("steps not increasing: ", entries[i - 1].step, " then ",
                          entries[i].step);
    }
  }
  return "";
}

// Verifies every shard of checkpoint `e`: OK, or the first problem found.
absl::Status CheckCheckpoint(const std::string& dir, const ManifestEntry& e) {
  const std::string ckpt_dir = JoinPath(dir, e.dir_name);
  for (int task = 0; task < e.num_ps; ++task) {
    const std::string path = JoinPath(ckpt_dir, ShardFileName(task, e.num_ps));
    TOWERPS_ASSIGN_OR_RETURN(ShardState header, VerifyShard(path));
    if (header.ps_task != task || header.num_ps != e.num_ps) {
      return absl::DataLossError(absl::StrCat(path, ": holds shard ", header.ps_task, " of ",
                                              header.num_ps));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("ckpt-%010d", step); }

namespace {

// The step of a directory named CheckpointDirName(step), or -1 for any other name.
int64_t StepOfCheckpointDirName(const std::string& name) {
  int64_t step = -1;
  if (name.size() != 15 || !absl::StartsWith(name, "ckpt-") ||
      !absl::SimpleAtoi(name.substr(5), &step) || CheckpointDirName(step) != name) {
    return -1;
  }
  return step;
}

}  // namespace

absl::Status WriteManifest(const std::string& dir, const std::vector<ManifestEntry>& entries) {
  const std::string path = JoinPath(dir, kManifestFileName);
  if (std::string bad = CheckEntries(entries); !bad.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("write ", path, ": ", bad));
  }
  ckpt::Manifest manifest;
  manifest.set_magic(kManifestMagic);
  manifest.set_format_version(kManifestFormatVersion);
  for (const ManifestEntry& e : entries) {
    ckpt::ManifestEntry* m = manifest.add_entries();
    m->set_step(e.step);
    m->set_dir_name(e.dir_name);
    m->set_num_ps(e.num_ps);
    m->set_unix_time(e.unix_time);
  }
  std::string out;
  AppendRecord(manifest.SerializeAsString(), &out);
  TOWERPS_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomically(path, out);
}

absl::StatusOr<std::vector<ManifestEntry>> ReadManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFileName);
  TOWERPS_ASSIGN_OR_RETURN(std::string contents, ReadFileToString(path));
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  RecordReader reader(contents, path);
  absl::StatusOr<absl::string_view> rec = reader.Next();
  if (absl::IsOutOfRange(rec.status())) return bad("empty file");
  if (!rec.ok()) return rec.status();
  ckpt::Manifest manifest;
  if (!manifest.ParseFromArray(rec->data(), static_cast<int>(rec->size()))) {
    return bad("the manifest record does not parse");
  }
  if (manifest.magic() != kManifestMagic) {
    return bad(absl::StrCat("not a manifest (magic \"", absl::CHexEscape(manifest.magic()),
                            "\", expected \"", kManifestMagic, "\")"));
  }
  if (manifest.format_version() != kManifestFormatVersion) {
    return bad(absl::StrCat("format version ", manifest.format_version(),
                            ", this build reads version ", kManifestFormatVersion));
  }
  const int64_t end = reader.offset();
  absl::StatusOr<absl::string_view> extra = reader.Next();
  if (extra.ok()) return bad(absl::StrCat("trailing record at byte ", end));
  if (!absl::IsOutOfRange(extra.status())) return extra.status();

  std::vector<ManifestEntry> entries;
  entries.reserve(manifest.entries_size());
  for (const ckpt::ManifestEntry& m : manifest.entries()) {
    entries.push_back({m.step(), m.dir_name(), m.num_ps(), m.unix_time()});
  }
  if (std::string why = CheckEntries(entries); !why.empty()) return bad(why);
  return entries;
}

absl::StatusOr<RebuiltManifest> RebuildManifest(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("rebuild manifest: ", dir, " is not a directory"));
  }
  // ckpt-NNNNNNNNNN -> the shard files in it.
  std::map<int64_t, std::vector<std::string>> found;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("rebuild manifest: list ", dir, ": ", ec.message()));
  }
  RebuiltManifest out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfCheckpointDirName(name);
    if (step < 0) continue;  // MANIFEST, temporary files, anything else
    if (!it->is_directory(ec)) continue;
    std::vector<std::string>& shards = found[step];
    for (fs::directory_iterator f(it->path(), ec); !ec && f != fs::directory_iterator();
         f.increment(ec)) {
      const std::string fname = f->path().filename().string();
      if (absl::StartsWith(fname, "shard-")) shards.push_back(fname);
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("rebuild manifest: list ", dir, ": ", ec.message()));
  }
  for (const auto& [step, shards] : found) {
    const std::string name = CheckpointDirName(step);
    // N from the first shard's name; all N must be there and verify.
    int task = 0, num_ps = 0;
    if (shards.empty() ||
        std::sscanf(shards[0].c_str(), "shard-%d-of-%d", &task, &num_ps) != 2 || num_ps < 1) {
      out.skipped.push_back(absl::StrCat(name, ": no shard file"));
      continue;
    }
    ManifestEntry e;
    e.step = step;
    e.dir_name = name;
    e.num_ps = num_ps;
    absl::Status ok = CheckCheckpoint(dir, e);
    if (ok.ok() && static_cast<int>(shards.size()) != num_ps) {
      ok = absl::DataLossError(absl::StrCat(JoinPath(dir, name), ": ", shards.size(),
                                            " shard files for ", num_ps, " servers"));
    }
    if (!ok.ok()) {
      out.skipped.push_back(absl::StrCat(name, ": ", ok.message()));
      continue;
    }
    const auto mtime = fs::last_write_time(JoinPath(dir, name), ec);
    if (!ec) {
      const auto sys = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
          mtime - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
      e.unix_time = std::chrono::duration<double>(sys.time_since_epoch()).count();
    }
    out.entries.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::vector<ManifestEntry>> ReadOrRebuildManifest(
    const std::string& dir, bool write, const std::function<void(const std::string&)>& log) {
  absl::StatusOr<std::vector<ManifestEntry>> read = ReadManifest(dir);
  if (!absl::IsDataLoss(read.status())) return read;
  TOWERPS_ASSIGN_OR_RETURN(RebuiltManifest rebuilt, RebuildManifest(dir));
  if (write) TOWERPS_RETURN_IF_ERROR(WriteManifest(dir, rebuilt.entries));
  if (log) {
    std::vector<std::string> names;
    for (const ManifestEntry& e : rebuilt.entries) names.push_back(e.dir_name);
    log(absl::StrCat(
        "MANIFEST damaged (", read.status().message(), "): rebuilt",
        write ? "" : " (in memory)", " from the intact checkpoints on disk: ",
        names.empty() ? "none" : absl::StrJoin(names, ", "),
        rebuilt.skipped.empty() ? "" : "; skipped ", absl::StrJoin(rebuilt.skipped, "; ")));
  }
  return rebuilt.entries;
}

absl::StatusOr<ManifestEntry> FindLatestValidCheckpoint(
    const std::string& dir, const std::function<void(const std::string&)>& log) {
  TOWERPS_ASSIGN_OR_RETURN(std::vector<ManifestEntry> entries,
                           ReadOrRebuildManifest(dir, /*write=*/false, log));
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    absl::Status s = CheckCheckpoint(dir, *it);
    if (s.ok()) return *it;
    // Anything but a corrupt or missing file (a permission or I/O error)
    // could hide a good checkpoint; falling back past it would silently lose
    // progress, so it is returned.
    if (!absl::IsDataLoss(s) && !absl::IsNotFound(s)) return s;
    if (log) log(absl::StrCat("checkpoint ", it->dir_name, " skipped: ", s.message()));
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir, ": ", entries.size(),
                                          " listed in its MANIFEST",
                                          entries.empty() ? "" : ", all skipped"));
}

absl::Status AddToManifest(const std::string& dir, const ManifestEntry& entry, int keep,
                           const std::function<void(const std::string&)>& log) {
  if (keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("add to manifest in ", dir, ": keep ", keep,
                                                   " < 1"));
  }
  if (std::string bad = CheckEntry(entry); !bad.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("add to manifest in ", dir, ": ", bad));
  }
  std::vector<ManifestEntry> old;
  absl::StatusOr<std::vector<ManifestEntry>> read =
      ReadOrRebuildManifest(dir, /*write=*/true, log);
  if (read.ok()) {
    old = std::move(*read);
  } else if (!absl::IsNotFound(read.status())) {
    return read.status();
  }
  std::vector<ManifestEntry> kept;
  std::vector<ManifestEntry> dropped;
  for (ManifestEntry& e : old) {
    (e.step < entry.step ? kept : dropped).push_back(std::move(e));
  }
  kept.push_back(entry);
  const size_t excess = kept.size() > static_cast<size_t>(keep) ? kept.size() - keep : 0;
  dropped.insert(dropped.end(), kept.begin(), kept.begin() + excess);
  kept.erase(kept.begin(), kept.begin() + excess);
  TOWERPS_RETURN_IF_ERROR(WriteManifest(dir, kept));

  absl::Status first_error;
  for (const ManifestEntry& d : dropped) {
    const bool still_listed = std::any_of(kept.begin(), kept.end(), [&](const ManifestEntry& k) {
      return k.dir_name == d.dir_name;
    });
    if (still_listed) continue;
    absl::Status s = RemoveAll(JoinPath(dir, d.dir_name));
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  // Checkpoint directories older than the oldest one kept that no MANIFEST
  // lists any more: left half-removed by a chief that died while pruning, or
  // half-written by one that died while saving. Nothing will ever list or
  // read them, so they go too. Newer unlisted ones may be a save in flight.
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> stale;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfCheckpointDirName(name);
    if (step >= 0 && step < kept.front().step && it->is_directory(ec)) stale.push_back(name);
  }
  for (const std::string& name : stale) {
    absl::Status s = RemoveAll(JoinPath(dir, name));
    if (s.ok() && log) {
      log(absl::StrCat("removed ", name,
                       ": older than every checkpoint kept and not in the MANIFEST"));
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

}  // namespace towerps::common
