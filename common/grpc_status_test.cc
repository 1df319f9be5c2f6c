#include "common/grpc_status.h"

#include "common/status.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(GrpcStatusTest, GrpcRoundTripKeepsCodeAndMessage) {
  absl::Status s = absl::ResourceExhaustedError("no room");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, NoEmptyMessages) {
  // An unknown method answers UNIMPLEMENTED with no text.
  const grpc::Status bare(grpc::StatusCode::UNIMPLEMENTED, "");
  EXPECT_EQ(FromGrpcStatus(bare).message(), "UNIMPLEMENTED (no message)");
  EXPECT_EQ(FromGrpcStatus(bare).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(FromGrpcStatus(bare, "Heartbeat on 127.0.0.1:5").message(),
            "Heartbeat on 127.0.0.1:5: UNIMPLEMENTED (no message)");
  EXPECT_EQ(ToGrpcStatus(absl::Status(absl::StatusCode::kInternal, "")).error_message(),
            "INTERNAL (no message)");
  EXPECT_EQ(Annotate(absl::Status(absl::StatusCode::kNotFound, ""), "ps 1").message(),
            "ps 1: NOT_FOUND (no message)");
}

TEST(GrpcStatusTest, TransportErrorsNameTheCall) {
  const grpc::Status g(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
  EXPECT_EQ(FromGrpcStatus(g, "Pull on 127.0.0.1:5").message(),
            "Deadline Exceeded (Pull on 127.0.0.1:5)");
  // A server's own message is kept as it is.
  const grpc::Status n(grpc::StatusCode::NOT_FOUND, "job \"x\" is not registered");
  EXPECT_EQ(FromGrpcStatus(n, "Pull on 127.0.0.1:5").message(), "job \"x\" is not registered");
}

}  // namespace
}  // namespace towerps::common
