// ParameterService's tensor streams, Push and Pull, are served and called on
// gRPC byte buffers (common/tensor_wire.h) rather than through the generated
// stubs, so that payloads are not copied into and out of protobuf messages.
// Their bytes are still exactly proto/ps.proto's PushRequest and
// PullResponse; these are the names and field numbers that code relies on.
#ifndef TOWERPS_PROTO_PS_WIRE_H_
#define TOWERPS_PROTO_PS_WIRE_H_

#include <string>

#include "proto/ps.grpc.pb.h"

namespace towerps::v1::ps_wire {

// Positions of Push and Pull in the service (the generated Service's method
// indices, in proto order; ps_service_test checks them).
inline constexpr int kPushMethodIndex = 1, kPullMethodIndex = 2;

// PushRequest.header, .slices, .commit, .segment_vars.
inline constexpr int kPushHeaderField = 1, kPushSlicesField = 2, kPushCommitField = 3,
                     kPushSegmentVarField = 4;
// How a push's error message begins when the server cannot use the push's
// shared segment (PushHeader.segment): the worker sends it again as slices.
inline constexpr char kPushSegmentRefused[] = "push: shared segment: ";
// PullResponse.global_step, .slices, .waited_us, .segment_vars, .segment_error.
inline constexpr int kPullStepField = 1, kPullSlicesField = 2, kPullWaitedField = 3,
                     kPullSegmentVarField = 4, kPullSegmentErrorField = 5;

// "/towerps.v1.ParameterService/Push"; alive for the process.
inline const char* PushMethod() {
  static const std::string* name =
      new std::string("/" + std::string(ParameterService::service_full_name()) + "/Push");
  return name->c_str();
}

// "/towerps.v1.ParameterService/Pull"; alive for the process.
inline const char* PullMethod() {
  static const std::string* name =
      new std::string("/" + std::string(ParameterService::service_full_name()) + "/Pull");
  return name->c_str();
}

}  // namespace towerps::v1::ps_wire

#endif  // TOWERPS_PROTO_PS_WIRE_H_
