// The on-disk checkpoint format of parameter-server shards, and the MANIFEST
// that lists a job's complete checkpoints.
//
// Layout, for a job's checkpoint directory DIR (CheckpointSpec.dir):
//
//   DIR/ckpt-0000000200/shard-0-of-2   one file per ps shard (WriteShard)
//   DIR/ckpt-0000000200/shard-1-of-2
//   DIR/MANIFEST                       complete checkpoints, newest last
//
// Every file is written atomically (temporary file, fsync, rename, fsync of
// the directory), so a reader sees an old file or the whole new one. The chief
// adds a checkpoint to the MANIFEST only after every ps has written its shard;
// a ckpt-* directory not in the MANIFEST is incomplete or abandoned.
//
// A shard file is a sequence of TFRecord-framed records (common/storage/record_io.h,
// masked CRC-32C on each length and each payload), holding the messages of
// proto/checkpoint.proto:
//
//   ShardHeader      job, task, num_ps, global step, variable count, version,
//                    per-worker async progress
//   per variable:
//     VariableHeader def, updates, element count, slot names and counts
//     value payload  raw little-endian float32, in records of at most
//                    ShardWriteOptions::max_record_bytes
//     slot payloads  likewise, one slot after the other
//   ShardFooter      counts; a file cut at a record boundary lacks it
//
// Any flipped byte or truncation is reported as DataLoss naming the file and,
// for a framing error, the byte offset of the bad record.
//
// All functions are thread-safe (no shared state); concurrent writers of the
// same file or MANIFEST must be serialized by the caller (in towerps each
// shard has one ps, and only the chief writes the MANIFEST).
#ifndef TOWERPS_COMMON_STORAGE_CHECKPOINT_H_
#define TOWERPS_COMMON_STORAGE_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace towerps::common {

// An optimizer slot of a variable, e.g. "m", "v" (Adam) or "velocity".
struct SlotValues {
  std::string name;
  std::vector<float> values;
};

struct VariableState {
  v1::VariableDef def;        // dtype DT_FLOAT32; shape dims >= 0.
  std::vector<float> value;   // Product of def.shape() elements.
  int64_t updates = 0;
  // In the optimizer's order; names unique. None for a MOVING_AVERAGE
  // variable (def.update), whose state is its value alone.
  std::vector<SlotValues> slots;
};

// One ps task's part of a job at one global step.
struct ShardState {
  std::string job_id;
  int ps_task = 0;            // In [0, num_ps).
  int num_ps = 1;
  int64_t global_step = 0;
  std::vector<VariableState> vars;
  // Per-worker async progress (completed steps, index = worker task), so a
  // staleness bound survives a restore.
  std::vector<int64_t> worker_completed;
};

// "ckpt-0000000200": the directory, under DIR, of the checkpoint at `step`.
std::string CheckpointDirName(int64_t step);

// "shard-0-of-2": the file, in a checkpoint directory, of ps task `ps_task`.
std::string ShardFileName(int ps_task, int num_ps);

// The format version WriteShard writes and ReadShard accepts.
inline constexpr int kShardFormatVersion = 1;

struct ShardWriteOptions {
  // Largest payload of one record; a tensor larger than this is split over
  // several records. Rounded down to a multiple of 4 bytes.
  // REQUIRES: >= 4. Default: 64 MiB.
  int64_t max_record_bytes = int64_t{64} << 20;
};

// A shard to write, as views of values held elsewhere (e.g. a parameter
// server's own variables): WriteShard streams them to the file from where
// they lie. The viewed memory must stay unchanged until WriteShard returns.
struct ShardView {
  struct Slot {
    std::string name;
    absl::Span<const float> values;
  };
  struct Variable {
    v1::VariableDef def;
    absl::Span<const float> value;
    int64_t updates = 0;
    std::vector<Slot> slots;
  };
  std::string job_id;
  int ps_task = 0;
  int num_ps = 1;
  int64_t global_step = 0;
  std::vector<Variable> vars;
  std::vector<int64_t> worker_completed;
};

// A view of `state` (which must outlive it).
ShardView ViewOf(const ShardState& state);

// Writes `shard` to `checkpoint_dir`/ShardFileName(shard.ps_task,
// shard.num_ps) atomically, creating `checkpoint_dir` (a ckpt-* directory)
// if missing. Returns the file's path. InvalidArgument if `shard` is
// inconsistent (task out of range, a value's size not matching its def's
// shape, a slot's size not matching its value's, a dtype other than float32,
// duplicate or empty slot names, bad options); the file-system's error
// (naming the path) if writing fails: ResourceExhausted for a full disk,
// Internal otherwise. Blocks on disk I/O. The values go to the file from the
// viewed memory: what it holds beyond them is a small write buffer.
absl::StatusOr<std::string> WriteShard(const std::string& checkpoint_dir, const ShardView& shard,
                                       const ShardWriteOptions& options = {});
absl::StatusOr<std::string> WriteShard(const std::string& checkpoint_dir, const ShardState& state,
                                       const ShardWriteOptions& options = {});

// Reads and fully verifies a shard file. NotFound if it does not exist;
// DataLoss naming the file and what is wrong for a bad CRC (with its byte
// offset), a truncated file or missing footer, an element count not matching
// the def's shape, counts not matching the footer, trailing records, or a
// format version other than kShardFormatVersion.
absl::StatusOr<ShardState> ReadShard(const std::string& path);

// As ReadShard, without keeping the values: checks every CRC and count.
// Returns the header fields (`vars` empty) so callers can check them.
absl::StatusOr<ShardState> VerifyShard(const std::string& path);

struct ManifestEntry {
  int64_t step = 0;
  std::string dir_name;       // CheckpointDirName(step); a plain name, no '/'.
  int num_ps = 1;
  double unix_time = 0;       // Seconds since the epoch when it was recorded.
};

// Writes DIR/MANIFEST atomically (one record holding a ckpt.Manifest).
// InvalidArgument unless steps strictly increase, dir names are plain names
// (not empty, ".", ".." and without '/') and num_ps >= 1. Creates `dir` if
// missing.
absl::Status WriteManifest(const std::string& dir, const std::vector<ManifestEntry>& entries);

// The entries of DIR/MANIFEST, oldest first. NotFound when there is none;
// DataLoss naming the file when it is corrupt or its entries break the rules
// WriteManifest enforces.
absl::StatusOr<std::vector<ManifestEntry>> ReadManifest(const std::string& dir);

// What RebuildManifest found on disk.
struct RebuiltManifest {
  std::vector<ManifestEntry> entries;  // The intact checkpoints, oldest first.
  std::vector<std::string> skipped;    // One line per ckpt-* directory left out.
};

// Lists the complete checkpoints under DIR from the disk alone, for a MANIFEST
// that is corrupt: every DIR/ckpt-NNNNNNNNNN directory whose shards
// shard-0-of-N .. shard-(N-1)-of-N are all there and verify (every CRC, and
// each header's task and num_ps match its name). A checkpoint missing a
// shard (half-written) or with a damaged one is never listed; it gets a line
// in `skipped`. unix_time is the directory's modification time. Reads every
// shard; writes nothing. NotFound if DIR does not exist; the file system's
// error naming the path if it cannot be listed.
absl::StatusOr<RebuiltManifest> RebuildManifest(const std::string& dir);

// ReadManifest, except that a corrupt MANIFEST (DataLoss) is rebuilt with
// RebuildManifest: `log` (may be empty) gets one line saying so, naming the
// checkpoints it was rebuilt from and the ones skipped, and, if `write`, the
// rebuilt MANIFEST replaces the damaged one. NotFound when there is no
// MANIFEST.
absl::StatusOr<std::vector<ManifestEntry>> ReadOrRebuildManifest(
    const std::string& dir, bool write, const std::function<void(const std::string&)>& log);

// The newest checkpoint in DIR/MANIFEST whose every shard reads back cleanly
// (full CRC verification; header's task and num_ps match the file name).
// A checkpoint with a corrupt or missing shard is skipped with one line
// passed to `log` (may be empty), e.g.
//   "checkpoint ckpt-0000000200 skipped: DIR/ckpt-0000000200/shard-1-of-2:
//    record at byte 4096: data CRC mismatch"
// and the previous one is tried. NotFound if there is no MANIFEST or no
// usable checkpoint. A corrupt MANIFEST is rebuilt in memory from the
// intact checkpoints on disk (ReadOrRebuildManifest, not written; `log` says
// so). Blocks reading every shard it checks.
absl::StatusOr<ManifestEntry> FindLatestValidCheckpoint(
    const std::string& dir, const std::function<void(const std::string&)>& log);

// Adds `entry` as the newest checkpoint of DIR/MANIFEST, keeps the newest
// `keep` entries and then removes the directories of the dropped ones (after
// the new MANIFEST is durable, so it never lists a removed directory). Entries
// at or after entry.step belong to an abandoned run (after a restore from an
// older checkpoint) and are dropped as well; the directory named by `entry`
// itself is never removed. So are unlisted ckpt-* directories older than the
// oldest entry kept (left by a writer that died while pruning or saving;
// `log` gets a line for each). A missing MANIFEST counts as empty; a corrupt one
// is rebuilt from the intact checkpoints on disk first (`log`, which may be
// empty, gets a line naming them). InvalidArgument if keep < 1 or `entry`
// breaks WriteManifest's rules; the first error removing a directory (the
// new MANIFEST is written by then).
absl::Status AddToManifest(const std::string& dir, const ManifestEntry& entry, int keep,
                           const std::function<void(const std::string&)>& log = nullptr);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_STORAGE_CHECKPOINT_H_
