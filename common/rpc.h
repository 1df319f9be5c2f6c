// gRPC plumbing shared by servers and clients: message-size limits, server
// start-up on a chosen (or ephemeral) port, health reporting, and allocator
// tuning.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_RPC_H_
#define TOWERPS_COMMON_RPC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/server.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "common/rpc_security.h"

namespace towerps::common {

// Messages are chunked well below this; the limit only guards against abuse.
constexpr int kMaxMessageBytes = 64 << 20;

// Most concurrent calls (HTTP/2 streams) one client connection may have open
// on a server (issue 15, limits); further calls wait on the client's side
// until one ends. gRPC 1.51 has no per-client bound across connections: this
// is per connection. High enough for every in-process client sharing one
// connection (ps_throughput's workers, a worker's pulls, pushes, heartbeats).
constexpr int kMaxConcurrentStreamsPerConnection = 1024;

// Default payload per chunk of a streamed tensor (see tests/bench).
constexpr int64_t kDefaultChunkBytes = 1 << 20;

// Starts a server on `address` ("host:port"; port 0 picks a free one) with the
// given services (not owned; they must outlive the server). *bound_port gets
// the port actually bound. Unavailable if the address cannot be bound.
//
// Every server also serves grpc.health.v1.Health (gRPC's default health
// service) and server reflection. Health reports the overall status ("") and
// each name in `health_names` (full service names, such as
// "towerps.v1.ParameterService"); Check answers any other name with
// NOT_FOUND, which health clients print as SERVICE_UNKNOWN. `security` (not
// owned; null: plaintext, no token) sets TLS / mutual TLS and the token check
// on every call but health's (common/rpc_security.h). Their lifecycle:
//
//   StartServer --> NOT_SERVING --SetServing--> SERVING --BeginDraining--> NOT_SERVING
//                        |                                                 (final)
//                        +---------------------BeginDraining-------------------^
//
// (gRPC starts its health service as SERVING; StartServer turns it to
// NOT_SERVING before returning, so a check in the first microseconds after
// the port opens may still read SERVING.)
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int* bound_port, const std::vector<std::string>& health_names = {},
    const RpcSecurity* security = nullptr);

// Reports the overall status and every name given to StartServer as
// SERVING: call once the process can take calls. No effect after
// BeginDraining.
void SetServing(grpc::Server& server);

// Reports NOT_SERVING for all of them, for good: call when shutdown begins,
// before grpc::Server::Shutdown, so that load balancers and probes stop
// sending calls.
void BeginDraining(grpc::Server& server);

// A channel with our message-size limits. `security` (not owned; null:
// plaintext, no token) sets its TLS credentials and adds the token to every
// call.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                          const RpcSecurity* security = nullptr);

// Large tensors are sent every step. glibc returns big blocks to the kernel on
// free and faults fresh pages in on the next malloc (seen as ~17% of a
// server's time); raising the mmap and trim thresholds keeps them in the heap
// for reuse. With `max_arenas` > 0, glibc keeps at most that many heaps:
// gRPC's threads then share them instead of each growing (and, with the
// thresholds raised, keeping) a heap of its own; a parameter server peaked at
// 7.6x the bytes it held with the default and 5.6x with one (issue 16,
// tests/bench/step_breakdown.sh, dense stack, 1 worker). Call once at the top
// of main(), before any thread starts.
void TuneAllocatorForLargeMessages(int max_arenas = 0);
// With those thresholds, memory freed stays in the heap: this gives the
// heap's free pages back to the kernel now (malloc_trim), for a large buffer
// that is gone for good.
void ReleaseFreeMemory();

// "0.0.0.0:<port>" for a "host:port" (or "[v6]:port") address.
std::string AnyAddressWithPortOf(const std::string& address);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_RPC_H_
