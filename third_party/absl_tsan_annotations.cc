// ThreadSanitizer annotations for Debian's uninstrumented absl::Mutex.
//
// Linked only into --config=tsan builds (see third_party/BUILD). Debian's
// libabsl_synchronization.so is not built with -fsanitize=thread, so TSan
// cannot see its lock operations (atomics and futexes inside the library)
// and would report every access guarded by an absl::Mutex as a data race.
// An Abseil built with TSan annotates its Mutex with TSan's mutex API
// (absl/base/internal/tsan_mutex_interface.h); this file adds the same
// annotations from outside: it defines the Mutex and CondVar members that
// take or give up the lock, which interpose on the library's (calls from our
// code, from gRPC and from Abseil itself go through the dynamic linker), and
// each one forwards to the library's definition (dlsym(RTLD_NEXT)) between
// __tsan_mutex_pre_* and __tsan_mutex_post_* calls. Between those calls TSan
// ignores the thread's memory accesses, which covers the Condition functions
// the library evaluates while locking and unlocking, as Abseil's own
// annotations do. TSan then sees absl::Mutex as a mutex: happens-before
// edges, and lock-order (potential deadlock) reports.
//
// Await and CondVar::Wait give up the lock while they block and hold it again
// when they return; they are annotated as an unlock before the call and a
// lock after it, in exclusive mode (we never wait with a reader lock).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"

namespace {

#define TOWERPS_STR2(x) #x
#define TOWERPS_STR(x) TOWERPS_STR2(x)

// "_ZN4absl<len><inline namespace>" + suffix: the library's mangled name of
// an absl member, whatever inline namespace this Abseil uses.
void* Real(const char* suffix) {
  std::string name = "_ZN4absl";
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const char* ns = TOWERPS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  name += std::to_string(std::strlen(ns)) + ns;
#endif
  name += suffix;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return f;
}

template <typename Fn>
Fn* RealFn(const char* suffix) {
  return reinterpret_cast<Fn*>(Real(suffix));
}

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// The library's members call each other through the dynamic linker too
// (CondVar::WaitWithTimeout calls WaitWithDeadline): only the outermost call
// on a thread is annotated.
thread_local int depth = 0;

struct Nested {
  Nested() { ++depth; }
  ~Nested() { --depth; }
};

// Annotates a call that blocks with `mu` given up and returns holding it.
template <typename Call>
auto Unlocked(absl::Mutex* mu, Call call) {
  if (depth > 0) return call();
  Nested nested;
  __tsan_mutex_pre_unlock(mu, 0);
  auto result = call();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

// Annotates a call that takes `mu` (always, once it returns).
template <typename Call>
auto Locking(absl::Mutex* mu, unsigned flags, Call call) {
  if (depth > 0) return call();
  Nested nested;
  __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using MutexFn = void(Mutex*);
using MutexTryFn = bool(Mutex*);
using MutexCondFn = void(Mutex*, const Condition&);
using MutexCondTimeoutFn = bool(Mutex*, const Condition&, Duration);
using MutexCondDeadlineFn = bool(Mutex*, const Condition&, Time);
using CondVarWaitFn = void(CondVar*, Mutex*);
using CondVarTimeoutFn = bool(CondVar*, Mutex*, Duration);
using CondVarDeadlineFn = bool(CondVar*, Mutex*, Time);

void Mutex::Lock() {
  static MutexFn* real = RealFn<MutexFn>("5Mutex4LockEv");
  Locking(this, 0, [&] { return real(this), 0; });
}

void Mutex::ReaderLock() {
  static MutexFn* real = RealFn<MutexFn>("5Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { return real(this), 0; });
}

bool Mutex::TryLock() {
  static MutexTryFn* real = RealFn<MutexTryFn>("5Mutex7TryLockEv");
  if (depth > 0) return real(this);
  Nested nested;
  __tsan_mutex_pre_lock(this, kTry);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, kTry | (locked ? 0 : kTryFailed), 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static MutexTryFn* real = RealFn<MutexTryFn>("5Mutex13ReaderTryLockEv");
  if (depth > 0) return real(this);
  Nested nested;
  __tsan_mutex_pre_lock(this, kRead | kTry);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, kRead | kTry | (locked ? 0 : kTryFailed), 0);
  return locked;
}

void Mutex::Unlock() {
  static MutexFn* real = RealFn<MutexFn>("5Mutex6UnlockEv");
  if (depth > 0) return real(this);
  Nested nested;
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static MutexFn* real = RealFn<MutexFn>("5Mutex12ReaderUnlockEv");
  if (depth > 0) return real(this);
  Nested nested;
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  static MutexCondFn* real = RealFn<MutexCondFn>("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { return real(this, cond), 0; });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static MutexCondFn* real = RealFn<MutexCondFn>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kRead, [&] { return real(this, cond), 0; });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static MutexCondTimeoutFn* real = RealFn<MutexCondTimeoutFn>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static MutexCondTimeoutFn* real = RealFn<MutexCondTimeoutFn>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static MutexCondDeadlineFn* real = RealFn<MutexCondDeadlineFn>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static MutexCondDeadlineFn* real = RealFn<MutexCondDeadlineFn>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, kRead, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static MutexCondFn* real = RealFn<MutexCondFn>("5Mutex5AwaitERKNS0_9ConditionE");
  Unlocked(this, [&] { return real(this, cond), 0; });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static MutexCondTimeoutFn* real = RealFn<MutexCondTimeoutFn>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Unlocked(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static MutexCondDeadlineFn* real = RealFn<MutexCondDeadlineFn>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Unlocked(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static CondVarWaitFn* real = RealFn<CondVarWaitFn>("7CondVar4WaitEPNS0_5MutexE");
  Unlocked(mu, [&] { return real(this, mu), 0; });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static CondVarTimeoutFn* real =
      RealFn<CondVarTimeoutFn>("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Unlocked(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static CondVarDeadlineFn* real =
      RealFn<CondVarDeadlineFn>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Unlocked(mu, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
