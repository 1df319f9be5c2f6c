// Plain TCP over 127.0.0.1, the transport ceiling for ps_throughput: a server
// thread accepts one connection and echoes every `round_bytes` it reads back
// to the client, which writes them and reads them back in `io_bytes` calls.
//
// Lifecycle: Start() -> RoundTrip()* -> destructor (closes the client side;
// the server thread sees EOF and is joined). Thread-compatible: one thread
// drives one LoopbackTcpEcho.
#ifndef TOWERPS_TESTS_BENCH_LOOPBACK_TCP_H_
#define TOWERPS_TESTS_BENCH_LOOPBACK_TCP_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace towerps::bench {

struct LoopbackTcpOptions {
  int64_t round_bytes = 0;         // REQUIRED > 0: bytes up (and back) per round.
  int64_t io_bytes = 1 << 20;      // Bytes per write()/read() call. Default: 1 MiB.
  int socket_buffer_bytes = 8 << 20;  // SO_SNDBUF and SO_RCVBUF. Default: 8 MiB.
};

class LoopbackTcpEcho {
 public:
  // Listens on 127.0.0.1:0, connects, starts the echo thread. Unavailable if
  // a socket call fails.
  static absl::StatusOr<std::unique_ptr<LoopbackTcpEcho>> Start(LoopbackTcpOptions options);
  ~LoopbackTcpEcho();
  LoopbackTcpEcho(const LoopbackTcpEcho&) = delete;
  LoopbackTcpEcho& operator=(const LoopbackTcpEcho&) = delete;

  // Writes `data` (round_bytes long) and reads the echo into `out` (same size).
  // Blocks. Unavailable on a socket error or early EOF.
  absl::Status RoundTrip(absl::Span<const char> data, absl::Span<char> out);

 private:
  LoopbackTcpEcho(LoopbackTcpOptions options, int client_fd, int server_fd);
  void ServeLoop();

  const LoopbackTcpOptions options_;
  int client_fd_ = -1;
  int server_fd_ = -1;  // the accepted connection; owned by the server thread
  std::thread server_;
};

}  // namespace towerps::bench

#endif  // TOWERPS_TESTS_BENCH_LOOPBACK_TCP_H_
