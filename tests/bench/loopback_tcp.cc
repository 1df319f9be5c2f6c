#include "tests/bench/loopback_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace towerps::bench {
namespace {

absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat("loopback tcp: ", what, ": ", std::strerror(errno)));
}

void TuneSocket(int fd, int buffer_bytes) {
  // Best effort: the kernel caps these at net.core.{w,r}mem_max.
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Full transfers in calls of at most `io` bytes. False on error or EOF.
bool WriteAll(int fd, const char* p, int64_t n, int64_t io) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, static_cast<size_t>(std::min(n, io)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= w;
  }
  return true;
}

bool ReadAll(int fd, char* p, int64_t n, int64_t io) {
  while (n > 0) {
    ssize_t r = ::read(fd, p, static_cast<size_t>(std::min(n, io)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= r;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoopbackTcpEcho>> LoopbackTcpEcho::Start(
    LoopbackTcpOptions options) {
  if (options.round_bytes <= 0 || options.io_bytes <= 0) {
    return absl::InvalidArgumentError("loopback tcp: round_bytes and io_bytes must be > 0");
  }
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  // Buffers set before listen/connect so the window scale is negotiated for them.
  TuneSocket(listener, options.socket_buffer_bytes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status st = Errno("bind/listen");
    ::close(listener);
    return st;
  }
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0) {
    absl::Status st = Errno("socket");
    ::close(listener);
    return st;
  }
  TuneSocket(client, options.socket_buffer_bytes);
  if (::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status st = Errno("connect");
    ::close(client);
    ::close(listener);
    return st;
  }
  int server = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  if (server < 0) {
    absl::Status st = Errno("accept");
    ::close(client);
    return st;
  }
  TuneSocket(server, options.socket_buffer_bytes);
  std::unique_ptr<LoopbackTcpEcho> echo(new LoopbackTcpEcho(options, client, server));
  echo->server_ = std::thread([e = echo.get()] { e->ServeLoop(); });
  return echo;
}

LoopbackTcpEcho::LoopbackTcpEcho(LoopbackTcpOptions options, int client_fd, int server_fd)
    : options_(options), client_fd_(client_fd), server_fd_(server_fd) {}

LoopbackTcpEcho::~LoopbackTcpEcho() {
  ::shutdown(client_fd_, SHUT_RDWR);
  if (server_.joinable()) server_.join();
  ::close(client_fd_);
  ::close(server_fd_);
}

void LoopbackTcpEcho::ServeLoop() {
  std::vector<char> buf(static_cast<size_t>(options_.round_bytes));
  while (ReadAll(server_fd_, buf.data(), options_.round_bytes, options_.io_bytes) &&
         WriteAll(server_fd_, buf.data(), options_.round_bytes, options_.io_bytes)) {
  }
}

absl::Status LoopbackTcpEcho::RoundTrip(absl::Span<const char> data, absl::Span<char> out) {
  const int64_t n = options_.round_bytes;
  if (static_cast<int64_t>(data.size()) != n || static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError("loopback tcp: buffers must be round_bytes long");
  }
  if (!WriteAll(client_fd_, data.data(), n, options_.io_bytes)) return Errno("write");
  if (!ReadAll(client_fd_, out.data(), n, options_.io_bytes)) return Errno("read (or early EOF)");
  return absl::OkStatus();
}

}  // namespace towerps::bench
