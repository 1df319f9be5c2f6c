#include "common/status.h"

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  TOWERPS_ASSIGN_OR_RETURN(int h, Half(x));
  TOWERPS_ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  absl::Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
}

TEST(StatusTest, GrpcRoundTripKeepsCodeAndMessage) {
  absl::Status s = absl::ResourceExhaustedError("no room");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusTest, NoEmptyMessages) {
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

TEST(StatusTest, TransportErrorsNameTheCall) {
  const grpc::Status g(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
  EXPECT_EQ(FromGrpcStatus(g, "Pull on 127.0.0.1:5").message(),
            "Deadline Exceeded (Pull on 127.0.0.1:5)");
  // A server's own message is kept as it is.
  const grpc::Status n(grpc::StatusCode::NOT_FOUND, "job \"x\" is not registered");
  EXPECT_EQ(FromGrpcStatus(n, "Pull on 127.0.0.1:5").message(), "job \"x\" is not registered");
}

TEST(StatusTest, AnnotatePrefixesContext) {
  EXPECT_EQ(Annotate(absl::NotFoundError("x"), "ps 1").message(), "ps 1: x");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
}

}  // namespace
}  // namespace towerps::common
