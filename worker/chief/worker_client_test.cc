// The gRPC clients report a task that does not answer as UNAVAILABLE or
// DEADLINE_EXCEEDED within the timeout asked (never hang).
#include "worker/chief/worker_client.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/chief/ps_control.h"

namespace towerps::worker {
namespace {

bool IsUnreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// Port 1 on loopback: nothing listens there.
constexpr char kNobody[] = "127.0.0.1:1";

TEST(GrpcWorkerClientTest, AWorkerThatDoesNotAnswer) {
  std::unique_ptr<WorkerClient> w = NewGrpcWorkerClient(kNobody, common::RpcSecurity::Insecure());
  const absl::Time start = absl::Now();
  absl::Status st = w->GetStatus(absl::Milliseconds(500)).status();
  EXPECT_TRUE(IsUnreachable(st)) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(GrpcPsControlTest, APsThatDoesNotAnswer) {
  std::unique_ptr<PsControl> ps = NewGrpcPsControl(kNobody, common::RpcSecurity::Insecure());
  absl::Status st = ps->GetStatus("", absl::Milliseconds(500)).status();
  EXPECT_TRUE(IsUnreachable(st)) << st;
  st = ps->DeleteJob("j", absl::Milliseconds(300)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;  // Waits for ready.
}

}  // namespace
}  // namespace towerps::worker
