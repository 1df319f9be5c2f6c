#include "common/shutdown_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

// The write end of the live ShutdownSignal's pipe, or -1. A signal handler
// can reach nothing else, so this one process-wide slot is the exception to
// "no mutable globals". Lock-free atomics are async-signal-safe.
std::atomic<int> g_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kSignals[] = {SIGTERM, SIGINT};

// Runs on whichever thread the signal landed on. Only async-signal-safe
// calls; errno is saved because the interrupted code may be reading it.
void OnSignal(int sig) {
  const int saved_errno = errno;
  const int fd = g_write_fd.load(std::memory_order_acquire);
  if (fd >= 0) {
    const char byte = static_cast<char>(sig);
    // Non-blocking: a full pipe (thousands of repeats) drops the byte, which
    // is fine, since only the first one is read.
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);
  }
  errno = saved_errno;
}

absl::Status SetDisposition(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kSignals) {
    if (sigaction(sig, &sa, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction(", sig, "): ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShutdownSignal>> ShutdownSignal::Install() {
  if (g_write_fd.load() >= 0) {
    return absl::FailedPreconditionError("a ShutdownSignal is already installed");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  if (fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0) {
    const int e = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fcntl(O_NONBLOCK): ", strerror(e)));
  }
  int expected = -1;
  if (!g_write_fd.compare_exchange_strong(expected, fds[1])) {
    close(fds[0]);
    close(fds[1]);
    return absl::FailedPreconditionError("a ShutdownSignal is already installed");
  }
  std::unique_ptr<ShutdownSignal> out(new ShutdownSignal(fds[0], fds[1]));
  // Unblock too, in case a caller (or an older main) blocked them: a blocked
  // signal would never reach the handler on this thread.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kSignals) sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  if (absl::Status s = SetDisposition(&OnSignal); !s.ok()) return s;  // ~ShutdownSignal cleans up
  return out;
}

ShutdownSignal::~ShutdownSignal() {
  // Ignore first, then stop the handler from writing, then close the pipe.
  (void)SetDisposition(SIG_IGN);
  g_write_fd.store(-1, std::memory_order_release);
  close(write_fd_);
  close(read_fd_);
}

int ShutdownSignal::Wait() {
  while (received_ == 0) {
    char byte = 0;
    const ssize_t n = read(read_fd_, &byte, 1);
    if (n == 1) {
      received_ = static_cast<unsigned char>(byte);
    } else if (n < 0 && errno != EINTR) {
      // The pipe is ours and open: this is our bug, not input.
      return -1;
    }
  }
  return received_ == kReleasedByte ? 0 : received_;
}

void ShutdownSignal::Release() {
  const char byte = static_cast<char>(kReleasedByte);
  ssize_t n;
  do {
    n = write(write_fd_, &byte, 1);
  } while (n < 0 && errno == EINTR);
}

}  // namespace towerps::common
