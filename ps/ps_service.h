// gRPC adapter for ParameterServer: converts messages and statuses, streams
// weights in chunks. No training logic here.
//
// Push and Pull, the streams that carry tensors, are served on gRPC byte
// buffers (common/tensor_wire.h): Pull's payload goes out of the weights
// snapshot's memory with no copy, and Push's payload is copied once, from
// gRPC's receive buffers into the push's staging buffer. On the wire they are
// the protobuf messages of proto/ps.proto, so any protobuf client works.
//
// Thread-safe (gRPC calls handlers concurrently).
#ifndef TOWERPS_PS_PS_SERVICE_H_
#define TOWERPS_PS_PS_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/tensor_wire.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/ps.grpc.pb.h"
#include "ps/parameter_server.h"
#include "ps/ps_metrics.h"

namespace towerps::ps {

// One Push stream's messages, decoded straight into a PushSession: the first
// carries the header (BeginPush), every TensorSlice's payload is copied from
// the message into the session's staging buffer (a compressed one into its
// scratch buffer, then decoded into the staging buffer: PushSession). Used by
// the service; public for the fuzzer.
class PushStreamDecoder {
 public:
  explicit PushStreamDecoder(ParameterServer& ps);  // Not owned.
  // Decodes one message. InvalidArgument / NotFound (from BeginPush, AddSlice's
  // checks) name what was wrong; the push is then abandoned, nothing applied.
  absl::Status Add(const grpc::ByteBuffer& message);
  // FinishPush of the whole stream. InvalidArgument if no message came;
  // Aborted, applying nothing, for a push whose header announced a commit
  // message that never came (the worker abandoned it).
  absl::StatusOr<v1::PushResponse> Finish();
  const std::string& job_id() const { return job_id_; }
  // Payload bytes received, as on the wire (compressed, in a compressed push).
  int64_t bytes() const { return bytes_; }

 private:
  ParameterServer& ps_;
  common::TensorWireHandler handler_;
  std::unique_ptr<PushSession> session_;
  std::string job_id_;
  int64_t bytes_ = 0;
  bool committed_ = false;  // The commit message came.
};

class ParameterServiceImpl final : public v1::ParameterService::Service {
 public:
  // `ps` is not owned and must outlive this service. `metrics` (not owned;
  // may be null) gets Push and Pull bytes, times and codes, and must outlive
  // this service too.
  ParameterServiceImpl(ParameterServer& ps, int64_t default_chunk_bytes,
                       PsMetrics* metrics = nullptr);

  grpc::Status RegisterVariables(grpc::ServerContext* context,
                                 const v1::RegisterRequest* request,
                                 v1::RegisterResponse* response) override;
  // ParameterService.Push and .Pull (see the top of this file), served as
  // bidirectional streams of byte buffers: Push reads every message, then
  // writes its one PushResponse; Pull reads its one PullRequest, then writes.
  using TensorStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  grpc::Status PushTensors(grpc::ServerContext* context, TensorStream* stream);
  grpc::Status PullTensors(grpc::ServerContext* context, TensorStream* stream);
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::StatusRequest* request,
                         v1::StatusResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* context, const v1::SaveRequest* request,
                              v1::SaveResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;

 private:
  grpc::Status DoPush(TensorStream* stream, v1::PushResponse* response);
  grpc::Status DoPull(grpc::ServerContext* context, const v1::PullRequest& request,
                      TensorStream* stream);
  // Counts one finished RPC that started at `start` (no-op without metrics).
  void RecordRpc(const char* method, const grpc::Status& status, absl::Time start);

  ParameterServer& ps_;
  const int64_t default_chunk_bytes_;
  PsMetrics* const metrics_;  // Not owned; may be null.
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PS_SERVICE_H_
