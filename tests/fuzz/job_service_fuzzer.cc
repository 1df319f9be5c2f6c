// Fuzzes the chief's JobService handlers in-process, with no network: a
// fresh JobManager per input over its own state directory (under this
// process's temp directory), with fake workers and servers (their attempts
// run until stopped), fed a sequence of serialized requests. Input: records
// of [op byte][length, 2 bytes little-endian][payload], the payload a
// serialized request picked by op % 7:
//   0 SubmitJobRequest (JobServiceImpl::SubmitJob: spec checks, paths, limits)
//   1 ListJobsRequest  2 GetJobRequest  3 CancelJobRequest
//   4 ClusterRequest   (GetCluster)
//   5 WatchJobRequest  (JobManager::Watch as WatchJob calls it; never follows)
//   6 ExportRequest    (JobManager::Export as ExportWeights calls it)
// A payload that does not parse is skipped. Specs naming directories are
// checked against the state directory by the chief itself (nothing is
// written outside it: the fakes write no checkpoint).
// Invariants: no crash, no exception out of a handler (gRPC would answer
// UNKNOWN), an error code the API documents with a message; a job submitted
// is then found by GetJob and in ListJobs, and a refused one is not.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/job_service.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/chief/fake_ps_control.h"
#include "worker/chief/fake_worker_client.h"
#include "worker/chief/job_manager.h"
#include "worker/chief/job_service.h"

namespace {

namespace v1 = towerps::v1;
using towerps::worker::FakePsControl;
using towerps::worker::FakeWorkerClient;
using towerps::worker::JobManager;

void CheckError(const grpc::Status& s, const char* what) {
  towerps::fuzz::CheckHandlerError(static_cast<int>(s.error_code()), s.error_message(), what);
}

void CheckError(const absl::Status& s, const char* what) {
  towerps::fuzz::CheckHandlerError(static_cast<int>(s.code()), std::string(s.message()), what);
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

std::unique_ptr<JobManager> NewManager(const std::string& dir) {
  towerps::worker::JobManagerOptions o;
  o.cluster.ps = {"127.0.0.1:1", "127.0.0.1:2"};
  o.cluster.worker = {"127.0.0.1:3", "127.0.0.1:4"};
  o.cluster.job_name = "worker";
  o.cluster.task_index = 0;
  o.state_dir = dir;
  o.poll_interval = absl::Milliseconds(5);
  o.control_timeout = absl::Seconds(1);
  o.restart_backoff = absl::Milliseconds(1);
  o.ps_factory = [](int p) { return std::make_unique<FakePsControl>(p); };
  o.worker_factory = [](int w, towerps::worker::JobHooksProvider) {
    auto fake = std::make_unique<FakeWorkerClient>(w);
    fake->SetOnStart(FakeWorkerClient::OnStart::kRun);
    return fake;
  };
  auto m = JobManager::Create(o);
  FUZZ_CHECK(m.ok(), "JobManager::Create: %s", m.status().ToString().c_str());
  const absl::Status started = (*m)->Start();
  FUZZ_CHECK(started.ok(), "JobManager::Start: %s", started.ToString().c_str());
  return std::move(*m);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::atomic<int64_t> runs{0};
  const std::string dir = absl::StrCat(towerps::fuzz::FuzzTempDir(), "/chief-", runs++);
  {
    std::unique_ptr<JobManager> manager = NewManager(dir);
    towerps::worker::JobServiceImpl service(*manager);
    grpc::ServerContext context;
    towerps::fuzz::ForEachRecord(data, size, 7, [&](int op, const uint8_t* payload, size_t len) {
      switch (op) {
        case 0: {
          v1::SubmitJobRequest r;
          if (!Parse(payload, len, &r)) return;
          v1::SubmitJobResponse out;
          const grpc::Status s = service.SubmitJob(&context, &r, &out);
          CheckError(s, "SubmitJob");
          if (s.ok()) {
            v1::GetJobRequest get;
            get.set_job_id(out.job().job_id());
            v1::GetJobResponse got;
            const grpc::Status g = service.GetJob(&context, &get, &got);
            FUZZ_CHECK(g.ok() && got.job().job_id() == out.job().job_id(),
                       "submitted job \"%s\" not found: %s", out.job().job_id().c_str(),
                       g.error_message().c_str());
          }
          break;
        }
        case 1: {
          v1::ListJobsRequest r;
          if (!Parse(payload, len, &r)) return;
          v1::ListJobsResponse out;
          CheckError(service.ListJobs(&context, &r, &out), "ListJobs");
          for (const auto& j : out.jobs()) {
            FUZZ_CHECK(!j.job_id().empty(), "a listed job without an id");
          }
          break;
        }
        case 2: {
          v1::GetJobRequest r;
          if (!Parse(payload, len, &r)) return;
          v1::GetJobResponse out;
          CheckError(service.GetJob(&context, &r, &out), "GetJob");
          break;
        }
        case 3: {
          v1::CancelJobRequest r;
          if (!Parse(payload, len, &r)) return;
          v1::CancelJobResponse out;
          CheckError(service.CancelJob(&context, &r, &out), "CancelJob");
          break;
        }
        case 4: {
          v1::ClusterRequest r;
          if (!Parse(payload, len, &r)) return;
          v1::ClusterResponse out;
          CheckError(service.GetCluster(&context, &r, &out), "GetCluster");
          break;
        }
        case 5: {
          v1::WatchJobRequest r;
          if (!Parse(payload, len, &r)) return;
          int64_t last = -1;
          const absl::Status s = manager->Watch(
              r.job_id(), r.after_seq(), /*follow=*/false,
              [&last](const v1::JobEvent& e) {
                FUZZ_CHECK(e.seq() > last, "events out of order: %lld after %lld",
                           static_cast<long long>(e.seq()), static_cast<long long>(last));
                last = e.seq();
                return true;
              },
              [] { return false; });
          CheckError(s, "WatchJob");
          break;
        }
        case 6: {
          v1::ExportRequest r;
          if (!Parse(payload, len, &r)) return;
          const absl::Status s =
              manager->Export(r.job_id(), 4096, [](const v1::ExportChunk&) { return true; });
          CheckError(s, "ExportWeights");
          break;
        }
      }
    });
  }  // the manager stops its runner and the fakes before the files go
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
