// A plain-gRPC echo used as a ceiling by ps_throughput: the client streams a
// buffer up in chunks, the server keeps it, and a second call streams it back.
// Same call shapes as ParameterService Push (client stream) and Pull (server
// stream), with none of the ps logic (no placement, validation, optimizer or
// snapshots), so the gap between the two measures what our service costs.
//
// Several clients share one server through slots: each keeps its own buffer
// (the "echo-slot" metadata of its calls picks it; default slot 0).
//
// EchoServiceImpl is thread-safe. The client functions are thread-compatible:
// use one EchoStub per thread.
#ifndef TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_
#define TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_

#include <cstdint>
#include <memory>
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
  // Stores at most `capacity_bytes` (a multiple of 4) in each of `slots`
  // buffers; a larger upload fails with RESOURCE_EXHAUSTED, a slot out of
  // range with INVALID_ARGUMENT.
  explicit EchoServiceImpl(int64_t capacity_bytes, int slots = 1);

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
  struct Slot {
    absl::Mutex mu;
    // Preallocated so that rounds measure the network, not page faults.
    std::vector<float> stored ABSL_GUARDED_BY(mu);
  };
  // The slot a call's metadata names, or null if it names none that exists.
  Slot* SlotOf(const grpc::ServerContext& context);
  // Copies `n` bytes at `offset` in or out; false if out of range.
  static bool Store(Slot& slot, int64_t offset, const void* data, int64_t n);
  static bool Load(Slot& slot, int64_t offset, void* data, int64_t n);

  std::vector<std::unique_ptr<Slot>> slots_;  // fixed at construction
};

// Streams `data` up in messages of `chunk_bytes` payload (rounded down to a
// multiple of 4) into the server's buffer `slot`, then streams it back into
// `out` (same size). Errors are the calls' statuses, or DataLoss if the echo
// came back with the wrong size.
absl::Status EchoRoundTrip(Echo::Stub& stub, Payload payload,
                           int64_t chunk_bytes, absl::Span<const float> data,
                           absl::Span<float> out, int slot = 0);

}  // namespace towerps::bench

#endif  // TOWERPS_TESTS_BENCH_ECHO_SERVICE_H_
