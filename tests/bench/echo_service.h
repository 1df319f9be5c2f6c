// A plain-gRPC echo used as a ceiling by ps_throughput: the client streams a
// buffer up in chunks, the server keeps it, and a second call streams it back.
// Same call shapes as ParameterService Push (client stream) and Pull (server
// stream), with none of the ps logic (no placement, validation, optimizer or
// snapshots), so the gap between the two measures what our service costs.
//
// EchoServiceImpl is thread-safe. The client functions are thread-compatible:
// use one EchoStub per thread.
#ifndef TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_
#define TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "tests/bench/echo.grpc.pb.h"

namespace towerps::bench {

// How a payload travels on the wire.
enum class Payload { kBytes, kFloats };

class EchoServiceImpl final : public Echo::Service {
 public:
  // Stores at most `capacity_bytes` (a multiple of 4); a larger upload fails
  // with RESOURCE_EXHAUSTED.
  explicit EchoServiceImpl(int64_t capacity_bytes);

  grpc::Status UploadBytes(grpc::ServerContext* context,
                           grpc::ServerReader<BytesChunk>* reader,
                           UploadAck* response) override;
  grpc::Status DownloadBytes(grpc::ServerContext* context,
                             const DownloadRequest* request,
                             grpc::ServerWriter<BytesChunk>* writer) override;
  grpc::Status UploadFloats(grpc::ServerContext* context,
                            grpc::ServerReader<FloatChunk>* reader,
                            UploadAck* response) override;
  grpc::Status DownloadFloats(grpc::ServerContext* context,
                              const DownloadRequest* request,
                              grpc::ServerWriter<FloatChunk>* writer) override;

 private:
  // Copies `n` bytes at `offset` in or out; false if out of range.
  bool Store(int64_t offset, const void* data, int64_t n);
  bool Load(int64_t offset, void* data, int64_t n);

  absl::Mutex mu_;
  // Preallocated so that rounds measure the network, not page faults.
  std::vector<float> stored_ ABSL_GUARDED_BY(mu_);
};

// Streams `data` up in messages of `chunk_bytes` payload (rounded down to a
// multiple of 4), then streams it back into `out` (same size). Errors are the
// calls' statuses, or DataLoss if the echo came back with the wrong size.
absl::Status EchoRoundTrip(Echo::Stub& stub, Payload payload,
                           int64_t chunk_bytes, absl::Span<const float> data,
                           absl::Span<float> out);

}  // namespace towerps::bench

#endif  // TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_
