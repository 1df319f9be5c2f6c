#include "ps/ps_service.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tensor_wire.h"
#include "proto/ps_wire.h"
#include "grpcpp/support/method_handler.h"

namespace towerps::ps {

using common::ToGrpcStatus;

using v1::ps_wire::kPullSlicesField;
using v1::ps_wire::kPullStepField;
using v1::ps_wire::kPushCommitField;
using v1::ps_wire::kPushHeaderField;
using v1::ps_wire::kPushSlicesField;

ParameterServiceImpl::ParameterServiceImpl(ParameterServer& ps,
                                           int64_t default_chunk_bytes, PsMetrics* metrics,
                                           bool shared_memory)
    : ps_(ps),
      default_chunk_bytes_(default_chunk_bytes),
      metrics_(metrics),
      shared_memory_(shared_memory),
      shm_calls_(std::make_unique<ShmCallServer>(
          [this](common::ShmMethod method, CallStream* stream) {
            return method == common::ShmMethod::kPush ? ServePush(stream, /*attach=*/false)
                                                      : ServePull(stream, /*attach=*/false);
          })) {
  // Push and Pull get handlers on byte buffers in place of the generated ones.
  MarkMethodStreamed(v1::ps_wire::kPushMethodIndex,
                     new grpc::internal::BidiStreamingHandler<ParameterServiceImpl,
                                                              grpc::ByteBuffer, grpc::ByteBuffer>(
                         [](ParameterServiceImpl* self, grpc::ServerContext* ctx,
                            TensorStream* stream) { return self->PushTensors(ctx, stream); },
                         this));
  MarkMethodStreamed(v1::ps_wire::kPullMethodIndex,
                     new grpc::internal::BidiStreamingHandler<ParameterServiceImpl,
                                                              grpc::ByteBuffer, grpc::ByteBuffer>(
                         [](ParameterServiceImpl* self, grpc::ServerContext* ctx,
                            TensorStream* stream) { return self->PullTensors(ctx, stream); },
                         this));
}

void ParameterServiceImpl::RecordRpc(const char* method, const grpc::Status& status,
                                     absl::Time start) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRpc(method, GrpcCodeName(status.error_code()),
                      absl::ToDoubleSeconds(absl::Now() - start));
}

namespace {

// A gRPC call's stream as a CallStream.
class GrpcCallStream final : public CallStream {
 public:
  GrpcCallStream(grpc::ServerContext* context, ParameterServiceImpl::TensorStream* stream)
      : context_(context), stream_(stream) {}
  bool Read(grpc::ByteBuffer* message) override { return stream_->Read(message); }
  bool Write(const grpc::ByteBuffer& message, grpc::WriteOptions options) override {
    return stream_->Write(message, options);
  }
  absl::Time deadline() const override { return absl::FromChrono(context_->deadline()); }
  bool IsCancelled() override { return context_->IsCancelled(); }

 private:
  grpc::ServerContext* const context_;
  ParameterServiceImpl::TensorStream* const stream_;
};

}  // namespace

grpc::Status ParameterServiceImpl::PushTensors(grpc::ServerContext* context,
                                               TensorStream* stream) {
  GrpcCallStream call(context, stream);
  return ServePush(&call, /*attach=*/true);
}

grpc::Status ParameterServiceImpl::PullTensors(grpc::ServerContext* context,
                                               TensorStream* stream) {
  GrpcCallStream call(context, stream);
  return ServePull(&call, /*attach=*/true);
}

grpc::Status ParameterServiceImpl::ServePush(CallStream* stream, bool attach) {
  const absl::Time start = absl::Now();
  v1::PushResponse response;
  std::unique_ptr<Commit> commit;
  Served served;
  grpc::Status s = DoPush(stream, attach, &response, &commit, &served);
  // The update runs on the server's updater thread, and this call ends with
  // the answer: the worker starts its next step while the variables are
  // updated, and its pull streams each one as soon as it is final. Run even
  // if the worker goes away: the push was accepted.
  if (commit != nullptr) {
    ps_.RunLater(std::move(commit), served.time);
  } else if (!served.job_id.empty()) {
    ps_.RecordRequest(served.job_id, served.time);
  }
  if (s.ok() && !stream->Write(common::ToByteBuffer(response))) {
    s = grpc::Status(grpc::StatusCode::CANCELLED, "push: client went away");
  }
  RecordRpc("Push", s, start);
  return s;
}

grpc::Status ParameterServiceImpl::ServePull(CallStream* stream, bool attach) {
  const absl::Time start = absl::Now();
  grpc::ByteBuffer buffer;
  v1::PullRequest request;
  grpc::Status s;
  if (!stream->Read(&buffer)) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pull: no request");
  } else if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(&buffer, &request).ok()) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pull: the request does not parse");
  } else {
    s = DoPull(stream, attach, request);
  }
  RecordRpc("Pull", s, start);
  return s;
}

grpc::Status ParameterServiceImpl::RegisterVariables(
    grpc::ServerContext*, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  auto r = ps_.Register(*request);
  if (!r.ok()) {
    if (metrics_ != nullptr && absl::IsResourceExhausted(r.status())) {
      const absl::string_view m = r.status().message();
      metrics_->CountRefusal(absl::StrContains(m, "--memory_budget_bytes") ? "memory_budget_bytes"
                             : absl::StrContains(m, "--max_job_bytes") ? "max_job_bytes"
                                                                       : "size");
    }
    return ToGrpcStatus(r.status());
  }
  *response = *r;
  return grpc::Status::OK;
}

PushStreamDecoder::PushStreamDecoder(ParameterServer& ps, bool shared_memory,
                                     SegmentOpener open_segment)
    : ps_(ps),
      shared_memory_(shared_memory),
      open_segment_(open_segment != nullptr ? std::move(open_segment) : OpenSegment) {
  handler_.on_bytes = [this](int field, std::string encoded) -> absl::Status {
    if (field != kPushHeaderField) return absl::OkStatus();
    if (session_ != nullptr) return absl::InvalidArgumentError("push: a second header");
    v1::PushHeader header;
    if (!header.ParseFromString(encoded)) {
      return absl::InvalidArgumentError("push: the header does not parse");
    }
    job_id_ = header.job_id();
    TOWERPS_ASSIGN_OR_RETURN(session_, ps_.BeginPush(header));
    if (header.has_segment()) {
      if (header.slice_encoding() != v1::SLICE_FLOAT32) {
        return absl::InvalidArgumentError("push: a compressed push names a shared segment");
      }
      absl::StatusOr<std::shared_ptr<common::SegmentFile>> file =
          shared_memory_
              ? open_segment_(header.segment())
              : absl::FailedPreconditionError("this server runs with --shared_memory=false");
      absl::Status fits = file.ok() ? CheckPushSegment(header.segment(), *session_, **file)
                                    : file.status();
      if (!fits.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(v1::ps_wire::kPushSegmentRefused, fits.message()));
      }
      segment_ = *std::move(file);
      segment_offsets_.assign(header.segment().offsets().begin(),
                              header.segment().offsets().end());
      value_offsets_.assign(header.segment().value_offsets().begin(),
                            header.segment().value_offsets().end());
      if (!value_offsets_.empty()) session_->SetValuesSegment(header.segment().nonce());
    }
    return absl::OkStatus();
  };
  handler_.on_slice = [this](uint32_t var, uint64_t offset,
                             uint64_t n) -> absl::StatusOr<char*> {
    if (session_ == nullptr) {
      return absl::InvalidArgumentError("push: the first message must carry the header");
    }
    bytes_ += static_cast<int64_t>(n);
    return session_->Reserve(var, offset, n);
  };
  // A compressed slice is decoded once its payload is in (on_slice checked
  // that there is a session).
  handler_.on_slice_end = [this]() { return session_->FinishSlice(); };
  handler_.on_varint = [this](int field, uint64_t value) -> absl::Status {
    if (field == v1::ps_wire::kPushSegmentVarField) {
      if (session_ == nullptr) {
        return absl::InvalidArgumentError("push: the first message must carry the header");
      }
      if (segment_ == nullptr) {
        return absl::InvalidArgumentError("push: segment_vars in a push that names no segment");
      }
      if (value >= session_->num_variables()) {
        return absl::InvalidArgumentError(
            absl::StrCat("push: segment_vars names variable ", value, " of ",
                         session_->num_variables()));
      }
      const size_t v = static_cast<size_t>(value);
      const int64_t n = session_->num_elements(v);
      const int64_t at = segment_offsets_[v];
      if (at % static_cast<int64_t>(alignof(float)) == 0 && session_->CanShare(v)) {
        // Read in place by the update (PushSession::AddShared): no copy.
        TOWERPS_ASSIGN_OR_RETURN(char* values,
                                 segment_->Region(at, n * static_cast<int64_t>(sizeof(float))));
        bytes_ += n * static_cast<int64_t>(sizeof(float));
        // Where its pulls land, for the new values if they are formed now.
        float* values_to = nullptr;
        const int64_t to_at = value_offsets_.empty() ? -1 : value_offsets_[v];
        if (to_at >= 0 && to_at % static_cast<int64_t>(alignof(float)) == 0) {
          TOWERPS_ASSIGN_OR_RETURN(
              char* to, segment_->Region(to_at, n * static_cast<int64_t>(sizeof(float))));
          values_to = reinterpret_cast<float*>(to);
        }
        return session_->AddShared(v, reinterpret_cast<const float*>(values), segment_, values_to,
                                   to_at);
      }
      // The same checks as slices of the whole variable, in pieces small
      // enough that each is checked for NaN and Inf while still in cache.
      for (int64_t first = 0; first == 0 || first < n; first += kSegmentReadElements) {
        const int64_t bytes =
            std::min(kSegmentReadElements, n - first) * static_cast<int64_t>(sizeof(float));
        TOWERPS_ASSIGN_OR_RETURN(
            char* to, session_->Reserve(static_cast<uint32_t>(v), static_cast<uint64_t>(first),
                                        static_cast<uint64_t>(bytes)));
        TOWERPS_RETURN_IF_ERROR(segment_->Read(
            segment_offsets_[v] + first * static_cast<int64_t>(sizeof(float)), to, bytes));
        bytes_ += bytes;
        TOWERPS_RETURN_IF_ERROR(session_->FinishSlice());
        TOWERPS_RETURN_IF_ERROR(session_->CheckFinite());
      }
      return absl::OkStatus();
    }
    if (field != kPushCommitField || value == 0) return absl::OkStatus();
    if (session_ == nullptr) {
      return absl::InvalidArgumentError("push: the first message must carry the header");
    }
    committed_ = true;
    return absl::OkStatus();
  };
}

absl::Status PushStreamDecoder::Add(const grpc::ByteBuffer& message) {
  if (committed_) return absl::InvalidArgumentError("push: a message after the commit");
  ++messages_;
  TOWERPS_RETURN_IF_ERROR(common::ReadTensorMessage(message, kPushSlicesField, handler_));
  if (session_ == nullptr) {
    return absl::InvalidArgumentError("push: the first message must carry the header");
  }
  return session_->CheckFinite();
}

absl::StatusOr<v1::PushResponse> PushStreamDecoder::Finish(std::unique_ptr<Commit>* commit) {
  if (session_ == nullptr) return absl::InvalidArgumentError("push: empty stream");
  if (session_->header().ends_with_commit() && !committed_) {
    const v1::PushHeader h = session_->header();
    session_.reset();  // nothing of it is applied
    return absl::AbortedError(absl::StrCat(
        "push: the stream of worker ", h.worker_task(), " (sequence ", h.sequence(),
        ") ended without its commit: the worker abandoned it; nothing applied"));
  }
  if (segment_ != nullptr && committed_ && messages_ == 1) session_->NamedAtOnce();
  return ps_.FinishPush(std::move(session_), commit);
}

grpc::Status ParameterServiceImpl::DoPush(CallStream* stream, bool attach,
                                          v1::PushResponse* response,
                                          std::unique_ptr<Commit>* commit, Served* served) {
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "push: empty stream");
  }
  const absl::Time start = absl::Now();
  PushStreamDecoder decoder(
      ps_, shared_memory_.load(), [this, attach](const v1::SharedSegment& segment) {
        std::shared_ptr<SegmentGates::Gate> gate;
        auto file = segments_.Map(segment, &gate);
        if (file.ok() && attach) AttachChannel(segment, *file);
        return file;
      });
  do {
    absl::Status s = decoder.Add(buffer);
    if (!s.ok()) return ToGrpcStatus(s);
  } while (stream->Read(&buffer));
  auto r = decoder.Finish(commit);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *r;
  const std::string& job_id = decoder.job_id();
  if (metrics_ != nullptr) {
    metrics_->AddPushBytes(job_id, decoder.bytes());
    metrics_->SetGlobalStep(job_id, r->global_step());
    metrics_->CountPush(job_id, r->outcome() == v1::PushResponse::STALE       ? "stale"
                                : r->outcome() == v1::PushResponse::DUPLICATE ? "duplicate"
                                                                              : "applied");
  }
  *served = {job_id, absl::Now() - start};
  return grpc::Status::OK;
}

namespace {

// Sends `*message` (encoded fields after `prefix`) and starts the next one
// with `prefix`; false if the stream broke.
bool SendPrefixed(CallStream* stream,
                  std::string* message, const std::string& prefix) {
  grpc::Slice slice(*message);
  const bool ok = stream->Write(grpc::ByteBuffer(&slice, 1));
  *message = prefix;
  return ok;
}

// Whether `file` (the segment a request names) has one offset per variable
// of `elements` floats each, each variable's bytes inside the payload.
absl::Status CheckSegmentFor(const google::protobuf::RepeatedField<int64_t>& offsets,
                             absl::string_view field, const std::vector<int64_t>& elements,
                             const common::SegmentFile& file) {
  if (offsets.size() != static_cast<int>(elements.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the segment names ", offsets.size(), " ",
                                                   field, "s for ", elements.size(),
                                                   " variables"));
  }
  for (size_t v = 0; v < elements.size(); ++v) {
    const int64_t bytes = elements[v] * static_cast<int64_t>(sizeof(float));
    const int64_t offset = offsets[static_cast<int>(v)];
    if (!file.Fits(offset, bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", v, "'s ", bytes, " bytes at ",
                                                     field, " ", offset,
                                                     " do not fit the segment's ", file.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPullSegment(const v1::SharedSegment& segment, const WeightsSnapshot& w,
                              const common::SegmentFile& file) {
  if (segment.pull_id() == 0) return absl::InvalidArgumentError("the segment's pull_id is 0");
  std::vector<int64_t> elements;
  for (const auto& values : w.values) elements.push_back(static_cast<int64_t>(values.size()));
  return CheckSegmentFor(segment.offsets(), "offset", elements, file);
}

absl::Status CheckPushSegment(const v1::SharedSegment& segment, const PushSession& session,
                              const common::SegmentFile& file) {
  std::vector<int64_t> elements;
  for (size_t v = 0; v < session.num_variables(); ++v) elements.push_back(session.num_elements(v));
  TOWERPS_RETURN_IF_ERROR(CheckSegmentFor(segment.offsets(), "offset", elements, file));
  if (segment.value_offsets().empty()) return absl::OkStatus();
  return CheckSegmentFor(segment.value_offsets(), "value offset", elements, file);
}

grpc::Status ParameterServiceImpl::DoPull(CallStream* stream, bool attach,
                                          const v1::PullRequest& request) {
  const absl::Time deadline = stream->deadline();
  const absl::Time asked = absl::Now();
  // A pull into a segment holds a lease while it writes: a push that would
  // change the values waits for it instead of copying them (see
  // ParameterServer::Pull). Declared before `snap`, so that on every return
  // the snapshot is dropped first.
  std::shared_ptr<void> lease;
  // The call's channel is attached before the pull waits and takes its
  // lease: Attach may wait for a channel's thread, whose push may wait for
  // that very lease (a stopping ps deadlocked so, in tests:ps_sigterm_test:
  // StopServing joining a channel whose push waited for a pull's lease, the
  // pull waiting to attach).
  if (attach && request.has_segment() && shared_memory_.load()) {
    std::shared_ptr<SegmentGates::Gate> gate;
    auto file = segments_.Map(request.segment(), &gate);
    if (file.ok()) AttachChannel(request.segment(), *file);
  }
  // Variables the segment holds already (a push wrote them as it formed
  // them): announced, not written.
  std::vector<char> in_place;
  auto snap = ps_.Pull(request, deadline,
                       request.has_segment() && shared_memory_.load() ? &lease : nullptr,
                       &in_place, [stream] { return stream->IsCancelled(); });
  if (!snap.ok()) return ToGrpcStatus(snap.status());
  const absl::Time start = absl::Now();  // after the wait: service time only
  const WeightsSnapshot& w = **snap;
  const int64_t global_step = w.global_step;
  const size_t num_vars = w.values.size();
  int64_t pulled_bytes = 0;
  for (const auto& v : w.values) pulled_bytes += static_cast<int64_t>(v.size() * sizeof(float));
  const int64_t chunk = std::clamp<int64_t>(
      request.chunk_bytes() > 0 ? request.chunk_bytes() : default_chunk_bytes_,
      4096, int64_t{32} << 20) / 4 * 4;
  std::string prefix;
  common::AppendVarintField(kPullStepField, static_cast<uint64_t>(w.global_step), &prefix);
  common::AppendVarintField(v1::ps_wire::kPullWaitedField,
                            static_cast<uint64_t>(absl::ToInt64Microseconds(start - asked)),
                            &prefix);
  // Same host: write into the worker's segment what it can take; say which.
  size_t in_segment = 0;  // variables [0, in_segment) went there
  std::string segment_error;
  if (request.has_segment()) {
    const v1::SharedSegment& seg = request.segment();
    std::shared_ptr<SegmentGates::Gate> gate;
    absl::StatusOr<std::shared_ptr<common::SegmentFile>> file =
        shared_memory_.load()
            ? segments_.Map(seg, &gate)
            : absl::FailedPreconditionError("this server runs with --shared_memory=false");
    if (file.ok()) {
      if (absl::Status fits = CheckPullSegment(seg, w, **file); !fits.ok()) file = fits;
    }
    if (file.ok()) {
      absl::MutexLock lock(&gate->mu);
      gate->used = absl::Now();
      if (seg.pull_id() <= gate->latest) {
        // A call the worker has given up on (a later one came first): it
        // gets slices, and no word that would turn the segment off.
        file = absl::CancelledError();
      } else {
        gate->latest = seg.pull_id();
      }
    }
    if (!file.ok() && !absl::IsCancelled(file.status())) {
      segment_error = std::string(file.status().message());
    }
    std::string message = prefix;
    int64_t pending = 0;  // bytes written since `message` was last sent
    while (file.ok() && in_segment < w.values.size()) {
      if (stream->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
      }
      if (!w.Ready(in_segment)) {
        // The step's update is under way: say what is in place (at first,
        // only the step, so that the worker gets on with its step) and
        // wait for this variable.
        if ((in_segment == 0 || pending > 0) && !SendPrefixed(stream, &message, prefix)) {
          return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
        }
        pending = 0;
        w.AwaitReady(in_segment);
      }
      const absl::Span<const float> values = w.values[in_segment];
      const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(float));
      {
        absl::MutexLock lock(&gate->mu);
        // Replaced by a later call (this one's worker has gone): the rest go
        // as slices.
        if (gate->latest != seg.pull_id()) break;
        const bool there = in_segment < in_place.size() && in_place[in_segment];
        absl::Status st = there ? absl::OkStatus()
                                : (*file)->Write(seg.offsets(static_cast<int>(in_segment)),
                                                 values.data(), bytes);
        if (!st.ok()) {
          segment_error = std::string(st.message());
          break;
        }
      }
      common::AppendVarintField(v1::ps_wire::kPullSegmentVarField, in_segment, &message);
      pending += bytes;
      ++in_segment;
      // Say what is in place once a chunk's worth is (so that the worker
      // starts on the first layers), and at the end: then with the call's
      // status (one write and one wake-up on each side, not two).
      if (pending >= chunk || in_segment == w.values.size()) {
        grpc::Slice slice(message);
        grpc::WriteOptions options;
        if (in_segment == w.values.size()) options.set_last_message();
        const bool sent = stream->Write(grpc::ByteBuffer(&slice, 1), options);
        if (!sent) {
          return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
        }
        message = prefix;
        pending = 0;
        if (pull_fault_for_testing_) {
          grpc::Status fault = pull_fault_for_testing_(request, in_segment);
          if (!fault.ok()) return fault;
        }
      }
    }
    if (message.size() > prefix.size()) {  // stopped part way: say what is there
      grpc::Slice slice(message);
      if (!stream->Write(grpc::ByteBuffer(&slice, 1))) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
      }
    }
    if (!segment_error.empty()) {
      common::AppendBytesField(v1::ps_wire::kPullSegmentErrorField, segment_error, &prefix);
    }
  }
  // The writes are done: let a waiting push go. Slices still to send keep the
  // snapshot (a push then copies the values away from under them).
  std::shared_ptr<const WeightsSnapshot> rest;
  if (in_segment < num_vars) rest = *std::move(snap);
  snap = absl::CancelledError();  // this call's hold, dropped before the lease
  lease.reset();
  // The rest as slices: the messages point into the snapshot (no copy) and
  // hold it until sent.
  common::TensorWireWriter out(kPullSlicesField, chunk,
                               [stream](const grpc::ByteBuffer& m) { return stream->Write(m); });
  out.set_prefix(std::move(prefix));
  for (size_t v = in_segment; v < num_vars; ++v) {
    if (!rest->Ready(v)) {
      // The step's update is under way: what is ready goes now (at least
      // the step, at first), then this variable once it is final.
      if (!out.Finish(/*even_if_empty=*/v == 0)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
      }
      rest->AwaitReady(v);
    }
    out.Add(static_cast<uint32_t>(v), rest->values[v].data(),
            static_cast<int64_t>(rest->values[v].size()), 0, rest);
  }
  // A job with no variables here still answers with its step.
  if (!out.Finish(/*even_if_empty=*/num_vars == 0)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
  }
  ps_.RecordRequest(request.job_id(), absl::Now() - start);
  if (metrics_ != nullptr) {
    metrics_->AddPullBytes(request.job_id(), pulled_bytes);
    metrics_->SetGlobalStep(request.job_id(), global_step);
  }
  return grpc::Status::OK;
}

void ParameterServiceImpl::AttachChannel(const v1::SharedSegment& segment,
                                         const std::shared_ptr<common::SegmentFile>& file) {
  if (segment.channel_offset() == 0) return;
  // Refused (it does not fit the segment): the worker sees no generation
  // served and goes on over gRPC.
  shm_calls_->Attach(file, segment.nonce(), segment.channel_offset(),
                     segment.channel_generation())
      .IgnoreError();
}

grpc::Status ParameterServiceImpl::DeleteJob(grpc::ServerContext*,
                                             const v1::DeleteJobRequest* request,
                                             v1::DeleteJobResponse* response) {
  *response = ps_.DeleteJob(*request);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::SaveCheckpoint(grpc::ServerContext*,
                                                  const v1::SaveRequest* request,
                                                  v1::SaveResponse* response) {
  const absl::Time start = absl::Now();
  auto r = ps_.Save(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *r;
  if (metrics_ != nullptr) {
    metrics_->RecordCheckpoint(r->bytes(), absl::ToDoubleSeconds(absl::Now() - start));
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::Heartbeat(grpc::ServerContext*,
                                             const v1::HeartbeatRequest* request,
                                             v1::HeartbeatResponse* response) {
  auto r = ps_.Heartbeat(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *r;
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::GetStatus(grpc::ServerContext*,
                                             const v1::StatusRequest* request,
                                             v1::StatusResponse* response) {
  *response = ps_.Status(*request);
  return grpc::Status::OK;
}

}  // namespace towerps::ps
