// gRPC adapter for ParameterServer: converts messages and statuses, streams
// weights in chunks. No training logic here.
//
// Push and Pull, the streams that carry tensors, are served on gRPC byte
// buffers (common/tensor_wire.h): Pull's payload goes out of the weights
// snapshot's memory with no copy, and Push's payload is copied once, from
// gRPC's receive buffers into the push's staging buffer. On the wire they are
// the protobuf messages of proto/ps.proto, so any protobuf client works.
//
// Same host: a pull that names the worker's shared segment
// (PullRequest.segment, common/shared_segment.h) gets the values copied
// there, and messages that say which variables are in place;
// where the segment cannot be opened (another host, another pid namespace,
// another user, --shared_memory=false) the values go as slices as always,
// and the first message says why (segment_error). A push that names it
// (PushHeader.segment) is read from there. The service keeps each segment
// mapped between calls (segment_gates.h). A call whose segment names a
// channel (SharedSegment.channel_offset) sets up same-host calls: the
// worker's next Push and Pull calls come through that channel and are
// served by the same code (shm_calls.h, call_stream.h).
//
// Thread-safe (gRPC calls handlers concurrently).
#ifndef TOWERPS_PS_PS_SERVICE_H_
#define TOWERPS_PS_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_segment.h"
#include "common/tensor_wire.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/ps.grpc.pb.h"
#include "ps/call_stream.h"
#include "ps/parameter_server.h"
#include "ps/ps_metrics.h"
#include "ps/segment_gates.h"
#include "ps/shm_calls.h"

namespace towerps::ps {

// A push's variable in a shared segment is read this many elements at a time
// (256 KiB), each piece checked for NaN and Inf while it is still in cache.
inline constexpr int64_t kSegmentReadElements = int64_t{1} << 16;

// Maps (or finds already mapped) the segment a request names.
using SegmentOpener = std::function<absl::StatusOr<std::shared_ptr<common::SegmentFile>>(
    const v1::SharedSegment& segment)>;

// One Push stream's messages, decoded straight into a PushSession: the first
// carries the header (BeginPush), every TensorSlice's payload is copied from
// the message (or, for the variables a message names in segment_vars, from
// the worker's shared segment) into the session's staging buffer (a
// compressed one into its scratch buffer, then decoded into the staging
// buffer: PushSession). Used by the service; public for the fuzzer.
class PushStreamDecoder {
 public:
  // `ps` is not owned. `shared_memory`: whether a push may name the worker's
  // shared segment (PushHeader.segment); when false such a push is refused
  // as ps_wire::kPushSegmentRefused says. `open_segment`: how to get it
  // (null: common::SegmentFile::Open, a mapping of this push's own).
  explicit PushStreamDecoder(ParameterServer& ps, bool shared_memory = true,
                             SegmentOpener open_segment = nullptr);
  // Decodes one message. InvalidArgument / NotFound (from BeginPush, AddSlice's
  // checks) name what was wrong; the push is then abandoned, nothing applied.
  absl::Status Add(const grpc::ByteBuffer& message);
  // FinishPush of the whole stream. InvalidArgument if no message came;
  // Aborted, applying nothing, for a push whose header announced a commit
  // message that never came (the worker abandoned it).
  // `commit`: as ParameterServer::FinishPush's (the update for the caller to
  // run once it has answered; null: done before Finish returns).
  absl::StatusOr<v1::PushResponse> Finish(std::unique_ptr<Commit>* commit = nullptr);
  const std::string& job_id() const { return job_id_; }
  // Payload bytes received, as on the wire (compressed, in a compressed push).
  int64_t bytes() const { return bytes_; }

 private:
  ParameterServer& ps_;
  const bool shared_memory_;
  common::TensorWireHandler handler_;
  const SegmentOpener open_segment_;
  std::unique_ptr<PushSession> session_;
  // The header's segment, when it named one.
  std::shared_ptr<common::SegmentFile> segment_;
  std::vector<int64_t> segment_offsets_;
  std::vector<int64_t> value_offsets_;  // SharedSegment.value_offsets, or empty
  std::string job_id_;
  int64_t bytes_ = 0;
  int64_t messages_ = 0;
  bool committed_ = false;  // The commit message came.
};

// Checks that the segment a pull names (PullRequest.segment) can take the
// snapshot `w`: one offset per variable, each variable's bytes inside the
// payload of `file` (the segment opened), pull_id set. InvalidArgument says
// what was wrong. Used by the service; public for the fuzzer.
absl::Status CheckPullSegment(const v1::SharedSegment& segment, const WeightsSnapshot& w,
                              const common::SegmentFile& file);
// The same for a push's segment (PushHeader.segment): one offset per
// variable of the job on this server, each variable's gradient inside it;
// and value_offsets, if any, one per variable, each variable's values
// inside it.
absl::Status CheckPushSegment(const v1::SharedSegment& segment, const PushSession& session,
                              const common::SegmentFile& file);

class ParameterServiceImpl final : public v1::ParameterService::Service {
 public:
  // `ps` is not owned and must outlive this service. `metrics` (not owned;
  // may be null) gets Push and Pull bytes, times and codes, and must outlive
  // this service too.
  // `shared_memory`: whether pulls may be written into workers' segments.
  ParameterServiceImpl(ParameterServer& ps, int64_t default_chunk_bytes,
                       PsMetrics* metrics = nullptr, bool shared_memory = true);

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

  // Turns shared memory off (or on) for the calls that start from now on,
  // as if the server had been started so.
  void set_shared_memory(bool on) { shared_memory_.store(on); }
  // The workers' segments as this service maps them (segment_gates.h).
  SegmentGates& segments() { return segments_; }
  // The same-host channels this service serves (shm_calls.h).
  ShmCallServer& shm_calls() { return *shm_calls_; }
  // Tests only, set before any call: in a pull written into a worker's
  // segment, called each time the server has told the worker of more
  // variables in place, with the request and how many are; a status other
  // than OK ends the call with it there (a transport failure part way).
  void set_pull_fault_for_testing(
      std::function<grpc::Status(const v1::PullRequest&, size_t in_segment)> fault) {
    pull_fault_for_testing_ = std::move(fault);
  }

 private:
  // A served push: its job and the time spent on it, without waits.
  struct Served {
    std::string job_id;
    absl::Duration time;
  };
  // Push and Pull on either transport. `attach`: a call over gRPC, which
  // may set up a same-host channel for the worker's next calls (the
  // segment's channel_offset; shm_calls.h).
  grpc::Status ServePush(CallStream* stream, bool attach);
  grpc::Status ServePull(CallStream* stream, bool attach);
  // *commit: the update, for ParameterServer::RunLater (null: none); *served: set
  // when the push was decided.
  grpc::Status DoPush(CallStream* stream, bool attach, v1::PushResponse* response,
                      std::unique_ptr<Commit>* commit, Served* served);
  grpc::Status DoPull(CallStream* stream, bool attach, const v1::PullRequest& request);
  // Serves the channel `segment` names (none: channel_offset 0) in `file`.
  void AttachChannel(const v1::SharedSegment& segment,
                     const std::shared_ptr<common::SegmentFile>& file);
  // Counts one finished RPC that started at `start` (no-op without metrics).
  void RecordRpc(const char* method, const grpc::Status& status, absl::Time start);

  ParameterServer& ps_;
  const int64_t default_chunk_bytes_;
  PsMetrics* const metrics_;  // Not owned; may be null.
  std::atomic<bool> shared_memory_;
  std::function<grpc::Status(const v1::PullRequest&, size_t)> pull_fault_for_testing_;
  SegmentGates segments_;
  // Last: its threads call into this service; destroyed (stopped) first.
  std::unique_ptr<ShmCallServer> shm_calls_;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PS_SERVICE_H_
