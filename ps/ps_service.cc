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
                                           int64_t default_chunk_bytes, PsMetrics* metrics)
    : ps_(ps), default_chunk_bytes_(default_chunk_bytes), metrics_(metrics) {
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

grpc::Status ParameterServiceImpl::PushTensors(grpc::ServerContext*, TensorStream* stream) {
  const absl::Time start = absl::Now();
  v1::PushResponse response;
  grpc::Status s = DoPush(stream, &response);
  if (s.ok() && !stream->Write(common::ToByteBuffer(response))) {
    s = grpc::Status(grpc::StatusCode::CANCELLED, "push: client went away");
  }
  RecordRpc("Push", s, start);
  return s;
}

grpc::Status ParameterServiceImpl::PullTensors(grpc::ServerContext* context,
                                               TensorStream* stream) {
  const absl::Time start = absl::Now();
  grpc::ByteBuffer buffer;
  v1::PullRequest request;
  grpc::Status s;
  if (!stream->Read(&buffer)) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pull: no request");
  } else if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(&buffer, &request).ok()) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pull: the request does not parse");
  } else {
    s = DoPull(context, request, stream);
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

PushStreamDecoder::PushStreamDecoder(ParameterServer& ps) : ps_(ps) {
  handler_.on_bytes = [this](int field, std::string encoded) -> absl::Status {
    if (field != kPushHeaderField) return absl::OkStatus();
    if (session_ != nullptr) return absl::InvalidArgumentError("push: a second header");
    v1::PushHeader header;
    if (!header.ParseFromString(encoded)) {
      return absl::InvalidArgumentError("push: the header does not parse");
    }
    job_id_ = header.job_id();
    TOWERPS_ASSIGN_OR_RETURN(session_, ps_.BeginPush(header));
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
  TOWERPS_RETURN_IF_ERROR(common::ReadTensorMessage(message, kPushSlicesField, handler_));
  if (session_ == nullptr) {
    return absl::InvalidArgumentError("push: the first message must carry the header");
  }
  return session_->CheckFinite();
}

absl::StatusOr<v1::PushResponse> PushStreamDecoder::Finish() {
  if (session_ == nullptr) return absl::InvalidArgumentError("push: empty stream");
  if (session_->header().ends_with_commit() && !committed_) {
    const v1::PushHeader h = session_->header();
    session_.reset();  // nothing of it is applied
    return absl::AbortedError(absl::StrCat(
        "push: the stream of worker ", h.worker_task(), " (sequence ", h.sequence(),
        ") ended without its commit: the worker abandoned it; nothing applied"));
  }
  return ps_.FinishPush(std::move(session_));
}

grpc::Status ParameterServiceImpl::DoPush(TensorStream* stream, v1::PushResponse* response) {
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "push: empty stream");
  }
  const absl::Time start = absl::Now();
  PushStreamDecoder decoder(ps_);
  do {
    absl::Status s = decoder.Add(buffer);
    if (!s.ok()) return ToGrpcStatus(s);
  } while (stream->Read(&buffer));
  auto r = decoder.Finish();
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
  ps_.RecordRequest(job_id, absl::Now() - start);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::DoPull(grpc::ServerContext* context,
                                          const v1::PullRequest& request, TensorStream* stream) {
  const absl::Time deadline = absl::FromChrono(context->deadline());
  const absl::Time asked = absl::Now();
  auto snap = ps_.Pull(request, deadline);
  if (!snap.ok()) return ToGrpcStatus(snap.status());
  const absl::Time start = absl::Now();  // after the wait: service time only
  const WeightsSnapshot& w = **snap;
  const int64_t chunk = std::clamp<int64_t>(
      request.chunk_bytes() > 0 ? request.chunk_bytes() : default_chunk_bytes_,
      4096, int64_t{32} << 20) / 4 * 4;
  // The messages point into the snapshot (no copy) and hold it until sent.
  common::TensorWireWriter out(kPullSlicesField, chunk,
                               [stream](const grpc::ByteBuffer& m) { return stream->Write(m); });
  std::string step;
  common::AppendVarintField(kPullStepField, static_cast<uint64_t>(w.global_step), &step);
  common::AppendVarintField(v1::ps_wire::kPullWaitedField,
                            static_cast<uint64_t>(absl::ToInt64Microseconds(start - asked)), &step);
  out.set_prefix(std::move(step));
  const std::shared_ptr<const void> keep_alive = *snap;
  for (size_t v = 0; v < w.values.size(); ++v) {
    out.Add(static_cast<uint32_t>(v), w.values[v].data(),
            static_cast<int64_t>(w.values[v].size()), 0, keep_alive);
  }
  // A job with no variables here still answers with its step.
  if (!out.Finish(/*even_if_empty=*/w.values.empty())) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
  }
  ps_.RecordRequest(request.job_id(), absl::Now() - start);
  if (metrics_ != nullptr) {
    int64_t bytes = 0;
    for (const auto& v : w.values) bytes += static_cast<int64_t>(v.size() * sizeof(float));
    metrics_->AddPullBytes(request.job_id(), bytes);
    metrics_->SetGlobalStep(request.job_id(), w.global_step);
  }
  return grpc::Status::OK;
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
