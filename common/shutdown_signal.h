// ShutdownSignal: the one way a server binary waits for SIGTERM or SIGINT.
//
// Why not pthread_sigmask + sigwait: libraries (OpenBLAS, OpenMP) start
// threads in static initializers, before main() can block anything. Those
// threads keep the signals unblocked, so a second SIGTERM during shutdown
// (`timeout`, an orchestrator repeating its stop) lands on one of them with
// the default action and the process dies with status 143. Here a real
// handler is installed with sigaction: whichever thread a signal lands on,
// the handler runs, and its only action (async-signal-safe) is to write the
// signal number to a self-pipe that Wait() reads.
//
// Repeated signals are ignored: Wait() reports the first, later ones are
// dropped. Shutdown is already bounded (--drain_s plus the server's own
// deadline), and every orchestrator escalates to SIGKILL after its grace
// period, so a "third signal forces exit" rule would only add a path that
// skips the shutdown order.
//
// Thread-safe: Wait() may be called from one thread at a time; signals may
// arrive on any thread. At most one ShutdownSignal exists at a time (the
// handler reaches it through the one process-wide slot that a signal handler
// requires).
//
//   auto stop = common::ShutdownSignal::Install();  // early in main()
//   ...start serving...
//   int sig = (*stop)->Wait();                        // blocks
#ifndef TOWERPS_COMMON_SHUTDOWN_SIGNAL_H_
#define TOWERPS_COMMON_SHUTDOWN_SIGNAL_H_

#include <memory>

#include "absl/status/statusor.h"

namespace towerps::common {

class ShutdownSignal {
 public:
  // Installs handlers for SIGTERM and SIGINT. Returns FailedPrecondition if
  // another ShutdownSignal exists, Internal if the pipe or sigaction fails.
  static absl::StatusOr<std::unique_ptr<ShutdownSignal>> Install();

  // After destruction SIGTERM and SIGINT stay ignored (SIG_IGN), so that a
  // signal arriving while the process exits cannot kill it with the default
  // action. Install() again replaces that.
  ~ShutdownSignal();
  ShutdownSignal(const ShutdownSignal&) = delete;
  ShutdownSignal& operator=(const ShutdownSignal&) = delete;

  // Blocks until the first SIGTERM or SIGINT since Install() (returns at once
  // if it already came) and returns its number, or 0 if Release() came first. Every later call returns the
  // same number at once. Returns -1 only if reading its own pipe fails
  // (a bug, never expected).
  int Wait();

  // Makes Wait() return 0 (now or when called) unless a signal came first:
  // for a thread that waits for a signal during work that may end without
  // one. Later signals are still caught and ignored. Thread-safe.
  void Release();

 private:
  ShutdownSignal(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

  // What Release() writes to the pipe (no signal has this number).
  static constexpr unsigned char kReleasedByte = 255;

  const int read_fd_;
  const int write_fd_;
  int received_ = 0;  // Set by Wait(), which is called from one thread at a time.
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SHUTDOWN_SIGNAL_H_
