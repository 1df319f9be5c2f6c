// Tensors on the wire without protobuf copies: the hot streamed messages
// (PushRequest, PullResponse: top-level fields plus `repeated TensorSlice`)
// are written and read here directly as gRPC byte buffers in protobuf's own
// wire format, so any protobuf client or server still understands them.
//
// Writing: each slice's payload is a gRPC slice that points into the
// tensor's memory (no copy; the transport sends it from there). Reading: the
// payload is copied once, from gRPC's receive buffers straight into the
// destination the caller names (a tensor, a staging buffer), with no
// intermediate message or string.
//
// What the reader accepts is what protobuf accepts, with one limit:
// within a TensorSlice, var_index and offset must come before data (every
// protobuf encoder writes fields in number order); a message that breaks it,
// is truncated or is malformed gets InvalidArgument naming the byte.
//
// Thread-compatible.
#ifndef TOWERPS_COMMON_TENSOR_WIRE_H_
#define TOWERPS_COMMON_TENSOR_WIRE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace towerps::common {

// Packs tensors into messages of at most `chunk_bytes` of payload each, every
// message = `prefix` (already-encoded top-level fields, e.g. a step; may be
// empty) followed by TensorSlices in field `slices_field`.
class TensorWireWriter {
 public:
  // `flush` sends one message and returns false if the stream broke.
  // REQUIRES: chunk_bytes >= 4, 1 <= slices_field < 2^29.
  TensorWireWriter(int slices_field, int64_t chunk_bytes,
                   std::function<bool(const grpc::ByteBuffer&)> flush);

  // Encoded top-level fields at the start of every later message.
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }

  // Adds `n` floats of variable `var`, element `first` onwards. The payload is
  // not copied: the messages point at `data`. `keep_alive` (may be null) is
  // held by them until gRPC has sent them; when null the caller keeps `data`
  // valid and unchanged until the call that sends them has finished. Returns
  // false once a flush has failed.
  bool Add(uint32_t var, const float* data, int64_t n, uint64_t first = 0,
           const std::shared_ptr<const void>& keep_alive = nullptr);

  // Adds one TensorSlice of variable `var` from element `first` whose data
  // is the `bytes` bytes at `data` as they are (an encoded payload, e.g. a
  // compressed gradient's: common/gradient_codec.h), never split. When the
  // message being built already holds payload and this one would take it
  // past chunk_bytes, that message is sent first. Ownership as for Add.
  bool AddEncoded(uint32_t var, uint64_t first, const char* data, int64_t bytes,
                  const std::shared_ptr<const void>& keep_alive = nullptr);

  // Sends what is left; with `even_if_empty`, sends a message even if no
  // slice is pending (so a stream carries at least one). Returns false if any
  // flush failed.
  bool Finish(bool even_if_empty = false);

 private:
  void Flush();
  // Appends one TensorSlice (framing, then the payload by reference).
  void AppendSlice(uint32_t var, uint64_t element, const char* data, int64_t len,
                   const std::shared_ptr<const void>& keep_alive);

  const uint32_t slices_tag_;
  const int64_t chunk_;
  const std::function<bool(const grpc::ByteBuffer&)> flush_;
  std::string prefix_;
  std::vector<grpc::Slice> pending_;  // the message being built
  int64_t in_msg_ = 0;                // payload bytes in it
  bool has_slices_ = false;
  bool ok_ = true;
};

// `message`'s protobuf encoding as one gRPC byte buffer (the small messages of
// a stream, e.g. Push's header).
template <typename Message>
grpc::ByteBuffer ToByteBuffer(const Message& message) {
  grpc::Slice s(message.SerializeAsString());
  return grpc::ByteBuffer(&s, 1);
}

// What a reader does with the parts of a message.
struct TensorWireHandler {
  // A top-level varint field (not the slices). May be null: ignored.
  std::function<absl::Status(int field, uint64_t value)> on_varint;
  // A top-level length-delimited field (not the slices), e.g. a header
  // message. At most 1 MiB. May be null: skipped.
  std::function<absl::Status(int field, std::string bytes)> on_bytes;
  // A TensorSlice: `bytes` of payload for variable `var` from element
  // `offset`. Returns where to copy them (room for `bytes`), or an error that
  // ends the read. REQUIRED.
  std::function<absl::StatusOr<char*>(uint32_t var, uint64_t offset, uint64_t bytes)> on_slice;
  // After a TensorSlice's payload was copied where on_slice said (e.g. to
  // decode it from there); an error ends the read. May be null.
  std::function<absl::Status()> on_slice_end;
};

// Reads one message written as above (or by protobuf) whose TensorSlices are
// field `slices_field`. Fields are handed over in order.
absl::Status ReadTensorMessage(const grpc::ByteBuffer& buffer, int slices_field,
                               const TensorWireHandler& handler);

// Encodes a varint field (for writers' prefixes).
void AppendVarintField(int field, uint64_t value, std::string* out);
// Encodes a length-delimited field (a string or bytes).
void AppendBytesField(int field, absl::string_view bytes, std::string* out);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_TENSOR_WIRE_H_
