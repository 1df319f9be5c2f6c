// gRPC adapter for the chief's JobManager. Thread-safe (the manager is).
#ifndef TOWERPS_WORKER_CHIEF_JOB_SERVICE_H_
#define TOWERPS_WORKER_CHIEF_JOB_SERVICE_H_

#include "proto/job_service.grpc.pb.h"
#include "worker/chief/job_manager.h"

namespace towerps::worker {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `manager` is not owned and must outlive the service.
  explicit JobServiceImpl(JobManager& manager) : manager_(manager) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status GetCluster(grpc::ServerContext*, const v1::ClusterRequest* request,
                          v1::ClusterResponse* response) override;
  grpc::Status ExportWeights(grpc::ServerContext* context, const v1::ExportRequest* request,
                             grpc::ServerWriter<v1::ExportChunk>* writer) override;

 private:
  JobManager& manager_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_JOB_SERVICE_H_
