// TensorBoard event files written by our own code: scalars and histograms as
// TFRecord-framed towerps.tb.Event records (proto/tensorboard.proto), which
// TensorBoard reads as if TensorFlow had written them.
//
// EventWriter is thread-safe: concurrent Add* calls each append one whole
// record, in the order they take the writer's lock.
#ifndef TOWERPS_COMMON_STORAGE_EVENT_WRITER_H_
#define TOWERPS_COMMON_STORAGE_EVENT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/storage/record_io.h"
#include "proto/tensorboard.pb.h"

namespace towerps::common {

// The histogram TensorFlow's default summary histogram would write for
// `values`: bucket limits -DBL_MAX, -1e20 .. -1e-12, 0, 1e-12 .. 1e20, DBL_MAX
// growing by 10% per bucket; bucket i counts values in
// [limit(i-1), limit(i)). Runs of empty buckets are collapsed into one zero
// bucket ending where the run ends (as TensorFlow does), which keeps every
// non-empty bucket's left edge for TensorBoard. num, min, max, sum and
// sum_squares are exact (sums in double).
//
// No values: num 0, min and max 0, no buckets. InvalidArgument if a value is
// NaN or infinite (the message says how many), since TensorBoard cannot draw
// them; log such a tensor's non-finite count as a scalar instead.
absl::StatusOr<tb::HistogramProto> MakeHistogram(
    absl::Span<const float> values);

// Appends summaries to one event file in a log directory.
//
// Records are buffered: a reader sees them after Flush() or Close() (or once
// 1 MiB has gathered). Errors name the file.
class EventWriter {
 public:
  // Creates `log_dir` (mkdir -p) and in it the file
  // "events.out.tfevents.<unix seconds, 10 digits>.<hostname>", whose first
  // record is an Event with file_version "brain.Event:2", flushed at once.
  // If that name is taken (a second writer in the same second), ".1", ".2" ...
  // is appended. Errors from creating the directory or the file.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(
      const std::string& log_dir);

  // Closes the file, dropping any error (call Close() to see it).
  ~EventWriter();

  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event at `step`, wall time now, with a simple_value (a float, as
  // TensorBoard stores scalars) tagged `tag`. FailedPrecondition after Close.
  absl::Status AddScalar(const std::string& tag, int64_t step, double value);

  // One Event at `step` with MakeHistogram(values) tagged `tag`.
  // InvalidArgument for non-finite values (nothing is written);
  // FailedPrecondition after Close. O(values.size()), a few comparisons per
  // value; runs under the writer's lock only to append the record.
  absl::Status AddHistogram(const std::string& tag, int64_t step,
                            absl::Span<const float> values);

  // Hands buffered records to the OS (no fsync). FailedPrecondition after
  // Close.
  absl::Status Flush();

  // Flushes and closes the file; later calls fail with FailedPrecondition.
  // Closing twice is OK.
  absl::Status Close();

  // The event file's full path.
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::unique_ptr<RecordWriter> writer);
  absl::Status WriteEvent(const tb::Event& event);

  // Constant after construction.
  const std::string path_;

  absl::Mutex mu_;
  std::unique_ptr<RecordWriter> writer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_STORAGE_EVENT_WRITER_H_
