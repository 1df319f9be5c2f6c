// Assembles the ExportWeights stream of a job into one safetensors file
// (https://github.com/huggingface/safetensors):
//
//   [8 bytes: N, little-endian uint64]
//   [N bytes: JSON header, padded with spaces to a multiple of 8]
//     {"<variable>": {"dtype": "F32", "shape": [d0, d1, ...],
//                     "data_offsets": [begin, end]}, ...,
//      "__metadata__": {"job_id": "<id>", "global_step": "<step>"}}
//   [the raw little-endian data; offsets are relative to its start]
//
// Variables appear in stream order and tile the data with no holes.
//
// Thread-compatible: one stream per instance.
#ifndef TOWERPS_CLIENT_SAFETENSORS_WRITER_H_
#define TOWERPS_CLIENT_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job_service.pb.h"

namespace towerps::client {

class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string job_id);

  // Takes the next chunk of the stream. The first chunk of a variable carries
  // its def (a name, a shape of non-negative dims, dtype DT_FLOAT32); later
  // chunks continue the same variable at the next element, with no gap and no
  // overlap. Returns InvalidArgument naming the variable and the offsets for
  // anything else (a gap, an overlap, too much data, a duplicate name, a
  // variable left incomplete when the next one starts, mixed global steps);
  // the instance must then be discarded.
  absl::Status Add(const v1::ExportChunk& chunk);

  // The whole file. FailedPrecondition if the stream has no variable, or the
  // last one is incomplete (the stream ended early).
  absl::StatusOr<std::string> Serialize() const;

  // Serialize()s to "<path>.tmp", fsyncs it and renames it to `path`, so that
  // `path` is the old file or the whole new one. Errors name the path.
  absl::Status WriteFile(const std::string& path) const;

  int num_variables() const { return static_cast<int>(vars_.size()); }
  int64_t data_bytes() const { return static_cast<int64_t>(data_.size()); }
  int64_t global_step() const { return global_step_; }

 private:
  struct Var {
    std::string name;
    std::vector<int64_t> shape;
    int64_t begin = 0;     // Byte offset in data_.
    int64_t elements = 0;  // Expected.
    int64_t received = 0;  // Elements so far.
  };

  absl::Status CheckLastComplete() const;

  const std::string job_id_;
  std::vector<Var> vars_;
  std::string data_;
  int64_t global_step_ = 0;
  bool have_step_ = false;
};

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_SAFETENSORS_WRITER_H_
