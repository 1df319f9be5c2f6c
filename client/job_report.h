// What towerctl prints about a job: the cells of `towerctl list`'s table, and
// `towerctl status`'s record, live status (workers, servers, the open step)
// and the servers as they were when the job ended. Plain text, for a reader;
// `--json` prints the messages themselves instead.
//
// Pure functions of their arguments (JobDuration reads the clock for a job
// still running); thread-safe.
#ifndef TOWERPS_CLIENT_JOB_REPORT_H_
#define TOWERPS_CLIENT_JOB_REPORT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "proto/job_service.pb.h"

namespace towerps::client {

// An error cell's width in towerctl's tables; longer errors end in "...".
inline constexpr int kErrorColumnChars = 48;

// "QUEUED", "RUNNING", "SUCCEEDED", ...
std::string JobStateName(v1::JobState s);

// Seconds from the job's start to its end, or to now while it runs; -1
// when it has not started.
double JobDuration(const v1::JobRecord& r);

// The STEP, LOSS and ACCURACY cells: "120/468" ("120" without a total);
// "0.4123" ("-" before a first step); "0.8512 test" once an evaluation ran,
// "0.8512 train" before, "-" for a model that is not a classifier.
std::string StepCell(const v1::Metrics& m);
std::string LossCell(const v1::Metrics& m);
std::string AccuracyCell(const v1::Metrics& m);

// "Placement is unbalanced: ps I holds P% of the bytes (an even share is
// E%)." when the largest shard of (ps task, bytes) holds more than 1.25
// times an even share; empty for fewer than 2 shards, no bytes, or a
// balanced placement.
std::string ImbalanceNote(const std::vector<std::pair<int, int64_t>>& shard_bytes);

// The record, one "Name:  value" line per field: job, state (and attempt),
// times, duration, checkpoint, TensorBoard directory, variables' bytes,
// metrics, error.
void PrintJobRecord(std::ostream& out, const v1::JobRecord& r);

// A running job's live status: its global step and the chief's explanation,
// the open step (who pushed, who it waits for), a table of workers and one
// of servers (bytes and share, variables, requests, latency, step). A server
// that did not report shows "-" in its figures, and then no server's share
// is known ("Shares of the bytes unknown: ps N did not report.");
// otherwise an unbalanced placement is noted (ImbalanceNote), and so are
// updates a server skipped.
void PrintJobLiveStatus(std::ostream& out, const v1::JobLiveStatus& live);

// An ended job's servers as they were at its end (JobRecord.final_shards):
// bytes, share, slots, variables, step, pushes applied, stale and
// duplicate, and the cores each server's process kept busy over the job's
// updates; nothing when the record has none.
void PrintFinalShards(std::ostream& out, const v1::JobRecord& r);

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_JOB_REPORT_H_
