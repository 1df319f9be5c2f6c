// Fuzzes the checkpoint MANIFEST (common/storage/checkpoint): the input is a
// job's DIR/MANIFEST, read by ReadManifest, FindLatestValidCheckpoint and
// AddToManifest (which rewrites it and prunes inside DIR only; a damaged one
// is rebuilt from the checkpoints on disk).
// Invariants: a refusal is DataLoss naming the file (NotFound when no
// checkpoint is usable); an accepted MANIFEST obeys WriteManifest's rules,
// is written again and reads back the same entries.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/storage/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using towerps::common::ManifestEntry;

bool SameEntries(const std::vector<ManifestEntry>& a, const std::vector<ManifestEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].step != b[i].step || a[i].dir_name != b[i].dir_name || a[i].num_ps != b[i].num_ps ||
        !(a[i].unix_time == b[i].unix_time || (a[i].unix_time != a[i].unix_time &&
                                               b[i].unix_time != b[i].unix_time))) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& tmp = towerps::fuzz::FuzzTempDir();
  const std::string dir = tmp + "/job";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  towerps::fuzz::WriteFuzzFile(dir + "/MANIFEST", data, size);

  auto entries = towerps::common::ReadManifest(dir);
  auto latest = towerps::common::FindLatestValidCheckpoint(dir, [](const std::string&) {});
  FUZZ_CHECK(!latest.ok(), "a checkpoint found where no shard exists");
  if (!entries.ok()) {
    FUZZ_CHECK(entries.status().code() == absl::StatusCode::kDataLoss, "%s",
               entries.status().ToString().c_str());
    FUZZ_CHECK(entries.status().message().find("MANIFEST") != std::string::npos,
               "not naming the file: %s", entries.status().ToString().c_str());
    // Rebuilt from the disk (issue 15): no shard exists, so nothing.
    FUZZ_CHECK(latest.status().code() == absl::StatusCode::kNotFound, "%s",
               latest.status().ToString().c_str());
    // The next checkpoint rewrites it from the disk alone, never from what
    // the damaged file named (nothing outside DIR is touched).
    ManifestEntry e;
    e.step = 7;
    e.dir_name = towerps::common::CheckpointDirName(7);
    const absl::Status added = towerps::common::AddToManifest(dir, e, /*keep=*/2);
    FUZZ_CHECK(added.ok(), "AddToManifest over a damaged MANIFEST: %s", added.ToString().c_str());
    auto after = towerps::common::ReadManifest(dir);
    FUZZ_CHECK(after.ok() && after->size() == 1 && after->back().step == 7,
               "AddToManifest did not rebuild a damaged MANIFEST");
    return 0;
  }
  FUZZ_CHECK(latest.status().code() == absl::StatusCode::kNotFound, "%s",
             latest.status().ToString().c_str());
  for (size_t i = 0; i < entries->size(); ++i) {
    const ManifestEntry& e = (*entries)[i];
    FUZZ_CHECK(i == 0 || e.step > (*entries)[i - 1].step, "steps do not increase");
    FUZZ_CHECK(!e.dir_name.empty() && e.dir_name != "." && e.dir_name != ".." &&
                   e.dir_name.find('/') == std::string::npos,
               "dir name \"%s\" is not a plain name", e.dir_name.c_str());
    FUZZ_CHECK(e.num_ps >= 1, "num_ps %d", e.num_ps);
  }
  const std::string out = tmp + "/copy";
  const absl::Status w = towerps::common::WriteManifest(out, *entries);
  FUZZ_CHECK(w.ok(), "an accepted MANIFEST cannot be written: %s", w.ToString().c_str());
  auto again = towerps::common::ReadManifest(out);
  FUZZ_CHECK(again.ok() && SameEntries(*entries, *again), "MANIFEST changed on a round trip");

  // The chief's next checkpoint: pruning stays inside DIR.
  const int64_t next = entries->empty() ? 1 : entries->back().step + 1;
  if (next > 0) {
    ManifestEntry e;
    e.step = next;
    e.dir_name = towerps::common::CheckpointDirName(next);
    const absl::Status added = towerps::common::AddToManifest(dir, e, /*keep=*/2);
    FUZZ_CHECK(added.ok(), "%s", added.ToString().c_str());
    auto after = towerps::common::ReadManifest(dir);
    FUZZ_CHECK(after.ok() && !after->empty() && after->back().step == next &&
                   after->size() <= 2,
               "AddToManifest left a wrong MANIFEST");
  }
  return 0;
}
