// What a Push or Pull call reads from and writes to: a gRPC stream
// (ps_service.h), or a same-host channel in a worker's segment
// (shm_calls.h). The messages are the same either way.
//
// Thread-compatible: one call's handler uses it.
#ifndef TOWERPS_PS_CALL_STREAM_H_
#define TOWERPS_PS_CALL_STREAM_H_

#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/impl/call_op_set.h"

namespace towerps::ps {

class CallStream {
 public:
  virtual ~CallStream() = default;
  // The caller's next message; false at the end of its messages or when
  // the call broke.
  virtual bool Read(grpc::ByteBuffer* message) = 0;
  // Sends one message (options: the last one); false when the call broke
  // (the caller went away).
  virtual bool Write(const grpc::ByteBuffer& message,
                     grpc::WriteOptions options = grpc::WriteOptions()) = 0;
  // When the caller stops waiting for the answer.
  virtual absl::Time deadline() const = 0;
  // Whether the caller went away (or the server stops serving the call).
  virtual bool IsCancelled() = 0;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_CALL_STREAM_H_
