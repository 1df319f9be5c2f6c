#include "ps/ps_service.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/slice_writer.h"
#include "common/status.h"

namespace towerps::ps {

using common::ToGrpcStatus;

ParameterServiceImpl::ParameterServiceImpl(ParameterServer& ps,
                                           int64_t default_chunk_bytes, PsMetrics* metrics)
    : ps_(ps), default_chunk_bytes_(default_chunk_bytes), metrics_(metrics) {}

void ParameterServiceImpl::RecordRpc(const char* method, const grpc::Status& status,
                                     absl::Time start) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRpc(method, GrpcCodeName(status.error_code()),
                      absl::ToDoubleSeconds(absl::Now() - start));
}

grpc::Status ParameterServiceImpl::Push(grpc::ServerContext*,
                                        grpc::ServerReader<v1::PushRequest>* reader,
                                        v1::PushResponse* response) {
  const absl::Time start = absl::Now();
  grpc::Status s = DoPush(reader, response);
  RecordRpc("Push", s, start);
  return s;
}

grpc::Status ParameterServiceImpl::Pull(grpc::ServerContext* context,
                                        const v1::PullRequest* request,
                                        grpc::ServerWriter<v1::PullResponse>* writer) {
  const absl::Time start = absl::Now();
  grpc::Status s = DoPull(context, request, writer);
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

grpc::Status ParameterServiceImpl::DoPush(grpc::ServerReader<v1::PushRequest>* reader,
                                          v1::PushResponse* response) {
  v1::PushRequest msg;
  if (!reader->Read(&msg)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "push: empty stream");
  }
  if (!msg.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "push: the first message must carry the header");
  }
  const absl::Time start = absl::Now();
  const std::string job_id = msg.header().job_id();
  auto session = ps_.BeginPush(msg.header());
  if (!session.ok()) return ToGrpcStatus(session.status());
  int64_t bytes = 0;
  do {
    for (const auto& slice : msg.slices()) {
      absl::Status s = (*session)->AddSlice(slice);
      if (!s.ok()) return ToGrpcStatus(s);
      bytes += static_cast<int64_t>(slice.data().size());
    }
  } while (reader->Read(&msg));
  auto r = ps_.FinishPush(std::move(*session));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *r;
  if (metrics_ != nullptr) {
    metrics_->AddPushBytes(job_id, bytes);
    metrics_->SetGlobalStep(job_id, r->global_step());
    metrics_->CountPush(job_id, r->outcome() == v1::PushResponse::STALE       ? "stale"
                                : r->outcome() == v1::PushResponse::DUPLICATE ? "duplicate"
                                                                              : "applied");
  }
  ps_.RecordRequest(job_id, absl::Now() - start);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::DoPull(grpc::ServerContext* context,
                                          const v1::PullRequest* request,
                                          grpc::ServerWriter<v1::PullResponse>* writer) {
  const absl::Time deadline = absl::FromChrono(context->deadline());
  auto snap = ps_.Pull(*request, deadline);
  if (!snap.ok()) return ToGrpcStatus(snap.status());
  const absl::Time start = absl::Now();  // after the wait: service time only
  const WeightsSnapshot& w = **snap;
  const int64_t chunk = std::clamp<int64_t>(
      request->chunk_bytes() > 0 ? request->chunk_bytes() : default_chunk_bytes_,
      4096, int64_t{32} << 20) / 4 * 4;
  // One message object reused for every chunk: its slices and their strings
  // keep their capacity, so steady-state pulls allocate nothing here.
  v1::PullResponse msg;
  msg.set_global_step(w.global_step);
  common::SliceWriter<v1::PullResponse> out(
      &msg, chunk, [writer](const v1::PullResponse& m) { return writer->Write(m); });
  for (size_t v = 0; v < w.values.size(); ++v) {
    out.Add(static_cast<uint32_t>(v), w.values[v].data(),
            static_cast<int64_t>(w.values[v].size()));
  }
  // A job with no variables here still answers with its step.
  if (!out.Finish(/*even_if_empty=*/w.values.empty())) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "pull: client went away");
  }
  ps_.RecordRequest(request->job_id(), absl::Now() - start);
  if (metrics_ != nullptr) {
    int64_t bytes = 0;
    for (const auto& v : w.values) bytes += static_cast<int64_t>(v.size() * sizeof(float));
    metrics_->AddPullBytes(request->job_id(), bytes);
    metrics_->SetGlobalStep(request->job_id(), w.global_step);
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
