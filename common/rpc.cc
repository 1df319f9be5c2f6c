#include "common/rpc.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace towerps::common {
namespace {

// gRPC's AddListeningPort reports a failed bind only as port 0 (the reason
// goes to its log). To name the cause, bind the same address ourselves.
// Returns "" when our bind succeeds (then the cause is not the address).
std::string WhyCannotBind(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "no port in the address";
  std::string host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::StrCat("invalid port \"", address.substr(colon + 1), "\"");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "localhost") host = host.empty() ? "::" : "127.0.0.1";
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    return absl::StrCat("cannot resolve host \"", host, "\" to a numeric address");
  }
  const int fd = socket(family, SOCK_STREAM, 0);
  if (fd < 0) return absl::StrCat("socket: ", std::strerror(errno));
  // Like gRPC: SO_REUSEADDR (a port in TIME_WAIT is free), no SO_REUSEPORT.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string why;
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    why = errno == EADDRINUSE
              ? absl::StrCat("address in use: port ", port, " is taken by another process")
              : absl::StrCat("bind: ", std::strerror(errno));
  }
  close(fd);
  return why;
}

// Both settings are process-wide and not thread-safe in gRPC; a function
// static makes the first StartServer set them once, before any builder reads
// them.
void EnableHealthAndReflectionOnce() {
  static const bool enabled = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)enabled;
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int* bound_port, const std::vector<std::string>& health_names,
    const RpcSecurity* security) {
  EnableHealthAndReflectionOnce();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address,
                           security != nullptr ? security->ServerCredentials()
                                               : grpc::InsecureServerCredentials(),
                           &port);
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // start without error and share the calls with the first. Never wanted.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreamsPerConnection);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    std::string why = WhyCannotBind(address);
    if (why.empty()) why = "gRPC refused the address (see its log above)";
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", why));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    for (const std::string& name : health_names) health->SetServingStatus(name, false);
    health->SetServingStatus("", false);
  }
  if (bound_port) *bound_port = port;
  return server;
}

void SetServing(grpc::Server& server) {
  // The bool overload applies to every registered name, "" included.
  if (auto* health = server.GetHealthCheckService()) health->SetServingStatus(true);
}

void BeginDraining(grpc::Server& server) {
  // Shutdown() marks every name NOT_SERVING and ignores later changes.
  if (auto* health = server.GetHealthCheckService()) health->Shutdown();
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                          const RpcSecurity* security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a server restart (or a late start): attempts
  // 100 ms apart, growing to 1 s.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC uses this one as the minimum *connect timeout* too (the deadline
  // of one connection attempt, handshake included), not only as a backoff.
  // At 100 ms, a freshly started server on a loaded machine missed it over
  // and over ("tcp handshaker shutdown") for many seconds.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  if (security != nullptr && !security->tls_server_name().empty()) {
    args.SetSslTargetNameOverride(security->tls_server_name());
  }
  if (security == nullptr) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, security->ChannelCredentials(), args, security->ClientInterceptors());
}

void TuneAllocatorForLargeMessages(int max_arenas) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (max_arenas > 0) mallopt(M_ARENA_MAX, max_arenas);
}

void ReleaseFreeMemory() { malloc_trim(0); }

std::string AnyAddressWithPortOf(const std::string& address) {
  size_t colon = address.rfind(':');
  return absl::StrCat("0.0.0.0", colon == std::string::npos ? ":0" : address.substr(colon));
}

}  // namespace towerps::common
