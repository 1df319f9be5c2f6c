// Compression of the gradients a worker pushes (JobSpec.compression, issue
// 16): encodes each variable part's gradient once per push, as the servers
// will decode it (common/gradient_codec.h), with optional error feedback.
//
// Error feedback: per part (of the variables the optimizer trains), a
// residual r, zero at first. For each push, e = g + r is encoded and r
// becomes e - decode(encoded): what compression left out is added to the
// next gradient instead of being lost. Over T pushes, the decoded gradients
// plus the last residual sum to the true gradients (up to the rounding of
// the additions e = g + r).
//
// Retries: a push is encoded once (Encode), and the EncodedPush is what every
// attempt of it sends, byte for byte; the residual moves once per push, never
// per attempt. MOVING_AVERAGE variables (batch norm's statistics) are sent as
// float32, uncompressed and without residual.
//
// Thread-compatible: one training loop calls Encode. An EncodedPush is
// immutable, safe to send from several threads.
#ifndef TOWERPS_WORKER_TRAIN_GRADIENT_COMPRESSOR_H_
#define TOWERPS_WORKER_TRAIN_GRADIENT_COMPRESSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "common/tensor_wire.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/placement.h"

namespace towerps::worker {

// One push's encoded gradient: the TensorSlices every server gets.
class EncodedPush {
 public:
  v1::SliceEncoding encoding() const { return encoding_; }  // PushHeader.slice_encoding
  // Payload bytes for server `s` (what its slices' data fields hold).
  int64_t bytes(int s) const { return static_cast<int64_t>(servers_[s].payload.size()); }

  // Slices for server `s` (whether WriteTo adds anything).
  int64_t slices(int s) const { return static_cast<int64_t>(servers_[s].slices.size()); }

  // Adds server `s`'s slices to `out`, in the order of its variables. The
  // messages point into `push` and hold it until gRPC has sent them. Returns
  // false once a flush failed (as TensorWireWriter::AddEncoded).
  static bool WriteTo(const std::shared_ptr<const EncodedPush>& push, int s,
                      common::TensorWireWriter* out);

 private:
  friend class GradientCompressor;
  struct Slice {
    uint32_t var_index = 0;  // on the server
    uint64_t offset = 0;     // element of the part (the server's variable)
    int64_t begin = 0;       // in payload
    int64_t bytes = 0;
  };
  struct Server {
    std::string payload;
    std::vector<Slice> slices;
  };
  v1::SliceEncoding encoding_ = v1::SLICE_FLOAT32;
  std::vector<Server> servers_;
};

class GradientCompressor {
 public:
  // The compressor for `spec` (defaults as common/job_spec.h's
  // CompressionWithDefaults) over `placement`'s parts of `vars`, slices of
  // at most `max_slice_bytes` (the client's chunk_bytes). Null when spec.type
  // is NONE. InvalidArgument for a bad spec (naming the field, as
  // ValidateJob), max_slice_bytes below common::kMinEncodedSliceBytes, or a
  // TOPK part of 2^32 elements or more.
  static absl::StatusOr<std::unique_ptr<GradientCompressor>> Create(
      const v1::GradientCompression& spec, std::vector<v1::VariableDef> vars,
      const Placement& placement, int64_t max_slice_bytes);

  // Encodes one push of `grads` (VariableDef order, as the placement's
  // variables). Call once per push, not per attempt. InvalidArgument naming
  // the variable and element for a NaN or Inf in a gradient; the residuals are
  // unchanged then. InvalidArgument for a wrong number or size of gradients.
  absl::StatusOr<std::shared_ptr<const EncodedPush>> Encode(
      const std::vector<const common::Tensor*>& grads);
  // As above for variables [first, first + count) only (a push whose
  // gradients become final layer by layer: PushStream::Send encodes each
  // batch as it is announced, once). The EncodedPush holds their parts'
  // slices; the other variables' residuals do not move.
  absl::StatusOr<std::shared_ptr<const EncodedPush>> Encode(
      const std::vector<const common::Tensor*>& grads, int first, int count);

  // What PushHeader.slice_encoding says of the pushes it encodes.
  v1::SliceEncoding encoding() const { return encoding_; }
  // "topk:0.01" / "fp16" / "bf16", with ", error feedback" when on.
  std::string Describe() const;
  // Payload bytes of one push over all servers: float32 and as encoded
  // (exact: the sizes do not depend on the values).
  int64_t uncompressed_bytes() const { return uncompressed_bytes_; }
  int64_t compressed_bytes() const { return compressed_bytes_; }
  // One line for the log: Describe() and the bytes per push before and after.
  std::string Summary() const;

  // Test seam: the residual of part `p` (placement.parts order); empty
  // without error feedback or for a MOVING_AVERAGE part.
  const std::vector<float>& residual(int p) const { return residuals_[p]; }

 private:
  GradientCompressor() = default;

  // Constant after construction.
  v1::GradientCompression spec_;  // with defaults
  v1::SliceEncoding encoding_ = v1::SLICE_FLOAT32;
  std::vector<v1::VariableDef> vars_;
  std::vector<VariablePart> parts_;
  int num_servers_ = 0;
  int64_t max_slice_bytes_ = 0;
  int64_t uncompressed_bytes_ = 0;
  int64_t compressed_bytes_ = 0;

  std::vector<std::vector<float>> residuals_;  // by part
  std::vector<uint32_t> scratch_;              // top-k's index work
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_GRADIENT_COMPRESSOR_H_
