// The one conversion between absl::Status and grpc::Status. absl::Status
// codes are gRPC's codes, so the code is a cast; the message is kept, and a
// non-OK result never has an empty message.
//
// Thread-safe (pure functions).
#ifndef TOWERPS_COMMON_GRPC_STATUS_H_
#define TOWERPS_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace towerps::common {

// Converts between absl::Status and grpc::Status, keeping code and message.
// A non-OK result never has an empty message: a peer that answers with a bare
// code (an unknown method gives UNIMPLEMENTED with no text) gets the code's
// name, and `call` (what was called, on which address, e.g.
// "RegisterVariables on 127.0.0.1:2222"; may be empty) when given.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& call = "");

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_GRPC_STATUS_H_
