#include "worker/chief/job_service.h"

#include "common/grpc_status.h"
#include "common/rpc.h"
#include "common/status.h"

namespace towerps::worker {

using common::ToGrpcStatus;

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  auto r = manager_.Submit(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response->mutable_job() = *r;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  for (auto& r : manager_.List()) *response->add_jobs() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::GetJobResponse* response) {
  auto r = manager_.Get(request->job_id());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                       v1::CancelJobResponse* response) {
  auto r = manager_.Cancel(request->job_id());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response->mutable_job() = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return ToGrpcStatus(manager_.Watch(
      request->job_id(), request->after_seq(), request->follow(),
      [writer](const v1::JobEvent& e) { return writer->Write(e); },
      [context] { return context->IsCancelled(); }));
}

grpc::Status JobServiceImpl::GetCluster(grpc::ServerContext*, const v1::ClusterRequest*,
                                        v1::ClusterResponse* response) {
  *response = manager_.Cluster();
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ExportWeights(grpc::ServerContext*, const v1::ExportRequest* request,
                                           grpc::ServerWriter<v1::ExportChunk>* writer) {
  return ToGrpcStatus(manager_.Export(request->job_id(), common::kDefaultChunkBytes,
                                      [writer](const v1::ExportChunk& c) { return writer->Write(c); }));
}

}  // namespace towerps::worker
