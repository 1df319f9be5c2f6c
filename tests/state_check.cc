// state_check STATE_DIR: reads back everything a chief and its servers left
// under a --state_dir and says whether any of it is corrupt (tests/chaos_test.sh).
// For every job directory STATE_DIR/jobs/ID:
//   - `record` holds exactly one record with a valid CRC that parses as a
//     JobRecord naming ID;
//   - `events`, if present, is a sequence of whole records with valid CRCs,
//     each a JobEvent, to a clean end (no torn or corrupt record anywhere);
//   - the checkpoint directory (the record's checkpoint_dir, else
//     ID/checkpoints), if it has a MANIFEST: the MANIFEST reads back, and every
//     checkpoint it lists has all its shards, each fully CRC-verified, with
//     the job, task, number of servers and step the MANIFEST says; checkpoint
//     directories it does not list are named, and counted as a problem (a
//     leak) when older than every one it lists.
// Prints one line per job and per checkpoint, and one "CORRUPT: ..." line per
// problem; exit 0 when nothing is corrupt, 1 otherwise, 2 on usage errors.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/storage/checkpoint.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "proto/job_service.pb.h"

namespace {

namespace fs = std::filesystem;
using towerps::common::RecordReader;

int problems = 0;

void Corrupt(const std::string& what) {
  std::cout << "CORRUPT: " << what << "\n";
  ++problems;
}

// Every record of `path` up to a clean end; counts them in `n`.
template <typename Message>
bool ReadAllRecords(const std::string& path, int* n, Message* last) {
  auto text = towerps::common::ReadFileToString(path);
  if (!text.ok()) {
    Corrupt(text.status().ToString());
    return false;
  }
  RecordReader reader(*text, path);
  *n = 0;
  while (true) {
    auto rec = reader.Next();
    if (absl::IsOutOfRange(rec.status())) return true;
    if (!rec.ok()) {
      Corrupt(absl::StrCat(path, ": record ", *n + 1, ": ", rec.status().ToString()));
      return false;
    }
    if (!last->ParseFromString(std::string(*rec))) {
      Corrupt(absl::StrCat(path, ": record ", *n + 1, " is not a ", last->GetTypeName()));
      return false;
    }
    ++*n;
  }
}

void CheckCheckpoints(const std::string& job_id, const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "MANIFEST")) {
    std::cout << "job " << job_id << ": no MANIFEST in " << dir << "\n";
    return;
  }
  auto entries = towerps::common::ReadManifest(dir);
  if (!entries.ok()) {
    Corrupt(entries.status().ToString());
    return;
  }
  for (const auto& e : *entries) {
    for (int task = 0; task < e.num_ps; ++task) {
      const std::string path = absl::StrCat(dir, "/", e.dir_name, "/",
                                            towerps::common::ShardFileName(task, e.num_ps));
      auto shard = towerps::common::VerifyShard(path);
      if (!shard.ok()) {
        Corrupt(shard.status().ToString());
        continue;
      }
      if (shard->job_id != job_id || shard->ps_task != task || shard->num_ps != e.num_ps ||
          shard->global_step != e.step) {
        Corrupt(absl::StrCat(path, ": header says job \"", shard->job_id, "\" task ",
                             shard->ps_task, " of ", shard->num_ps, " at step ",
                             shard->global_step, "; MANIFEST says \"", job_id, "\" task ", task,
                             " of ", e.num_ps, " at step ", e.step));
      }
    }
    std::cout << "job " << job_id << ": checkpoint " << e.dir_name << " (step " << e.step
              << ", " << e.num_ps << " shards) verified\n";
  }
  std::cout << "job " << job_id << ": MANIFEST lists " << entries->size() << " checkpoints\n";
  // Worth seeing: checkpoint directories the MANIFEST does not list (a save
  // cut short, or left by an abandoned attempt); a problem when older than
  // every listed one (below).
  std::set<std::string> listed;
  for (const auto& e : *entries) listed.insert(e.dir_name);
  std::vector<std::string> unlisted;
  for (const auto& d : fs::directory_iterator(dir)) {
    const std::string name = d.path().filename().string();
    if (d.is_directory() && name.rfind("ckpt-", 0) == 0 && !listed.count(name)) {
      unlisted.push_back(name);
    }
  }
  std::sort(unlisted.begin(), unlisted.end());
  // Older than every listed one: nothing will ever list, read or remove it
  // but the pruning of the next checkpoint (AddToManifest), which ran after
  // it: a leak.
  for (const auto& name : unlisted) {
    if (!entries->empty() && name < entries->front().dir_name) {
      Corrupt(absl::StrCat(dir, "/", name, ": leaked: not in the MANIFEST and older than ",
                           "every checkpoint it lists"));
    }
  }
  std::cout << "job " << job_id << ": " << unlisted.size()
            << " checkpoint directories not in the MANIFEST";
  for (const auto& name : unlisted) std::cout << " " << name;
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: state_check STATE_DIR\n";
    return 2;
  }
  const fs::path jobs = fs::path(argv[1]) / "jobs";
  std::error_code ec;
  if (!fs::is_directory(jobs, ec)) {
    std::cerr << "state_check: " << jobs.string() << " is not a directory\n";
    return 2;
  }
  for (const auto& entry : fs::directory_iterator(jobs)) {
    if (!entry.is_directory()) continue;
    const std::string id = entry.path().filename().string();
    const std::string job_dir = entry.path().string();
    towerps::v1::JobRecord record;
    int n = 0;
    if (ReadAllRecords(job_dir + "/record", &n, &record)) {
      if (n != 1) Corrupt(absl::StrCat(job_dir, "/record holds ", n, " records, want 1"));
      if (record.job_id() != id) {
        Corrupt(absl::StrCat(job_dir, "/record names job \"", record.job_id(), "\""));
      }
      std::cout << "job " << id << ": record " << towerps::v1::JobState_Name(record.state())
                << "\n";
    }
    if (fs::exists(job_dir + "/events")) {
      towerps::v1::JobEvent event;
      if (ReadAllRecords(job_dir + "/events", &n, &event)) {
        std::cout << "job " << id << ": " << n << " events\n";
      }
    }
    CheckCheckpoints(id, record.checkpoint_dir().empty() ? job_dir + "/checkpoints"
                                                         : record.checkpoint_dir());
  }
  std::cout << "state_check: " << problems << " problems\n";
  return problems == 0 ? 0 : 1;
}
