#include "common/rpc.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace towerps::common {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int* bound_port) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (address in use or invalid?)"));
  }
  if (bound_port) *bound_port = port;
  return server;
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a server restart.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void TuneAllocatorForLargeMessages() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

std::string AnyAddressWithPortOf(const std::string& address) {
  size_t colon = address.rfind(':');
  return absl::StrCat("0.0.0.0", colon == std::string::npos ? ":0" : address.substr(colon));
}

}  // namespace towerps::common
