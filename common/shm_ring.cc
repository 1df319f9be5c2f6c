#include "common/shm_ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::common {
namespace {

// The words live in memory that another process maps too, so they are
// std::atomic objects laid over that memory (the usual practice for shared
// memory: lock-free atomics are plain loads and stores of the same size, with
// no hidden state, and work across processes).
static_assert(std::atomic<uint64_t>::is_always_lock_free, "needs lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "needs lock-free 32-bit atomics");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(alignof(std::atomic<uint64_t>) <= 8 && alignof(std::atomic<uint32_t>) <= 4);

// Where each side's words are: its position (bytes written / read so far,
// always a multiple of 8), its futex word (bumped after each position it
// publishes) and its "I sleep" flag (set while it may be in FUTEX_WAIT on
// the other side's futex word).
constexpr int64_t kWriterWords = 0;
constexpr int64_t kReaderWords = 64;
constexpr int64_t kPositionAt = 0;
constexpr int64_t kFutexAt = 8;
constexpr int64_t kSleepsAt = 12;

// A record: a 4-byte length, the bytes, padding to 8. A length of kSkip
// marks the rest of the data as skipped; the next record starts at offset 0.
constexpr uint64_t kLengthBytes = 4;
constexpr uint64_t kAlign = 8;
constexpr uint32_t kSkip = 0xffffffff;
// Longest length field: below kSkip whatever the capacity.
constexpr int64_t kLongestLength = int64_t{0xfffffff0};

// Spins before sleeping: few, since on a machine with 2 cores spinning takes
// time from the other side that would end the wait.
constexpr int kSpins = 100;
// Longest single FUTEX_WAIT (only so that an infinite deadline gives a finite
// timespec; each wait ends at the deadline anyway).
constexpr absl::Duration kLongestSleep = absl::Hours(1);

struct Words {
  std::atomic<uint64_t>* position;
  std::atomic<uint32_t>* futex;
  std::atomic<uint32_t>* sleeps;
};

Words WordsAt(char* memory, int64_t at) {
  return Words{reinterpret_cast<std::atomic<uint64_t>*>(memory + at + kPositionAt),
               reinterpret_cast<std::atomic<uint32_t>*>(memory + at + kFutexAt),
               reinterpret_cast<std::atomic<uint32_t>*>(memory + at + kSleepsAt)};
}

uint64_t RecordBytes(uint64_t length) {
  return (kLengthBytes + length + kAlign - 1) & ~(kAlign - 1);
}

// Length fields are little endian whatever the host.
void StoreLength(char* at, uint32_t length) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((length >> (8 * i)) & 0xff);
}

uint32_t LoadLength(const char* at) {
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) {
    length |= static_cast<uint32_t>(static_cast<unsigned char>(at[i])) << (8 * i);
  }
  return length;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Not FUTEX_*_PRIVATE: the other side may be another process.
void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while *word == expected, for at most `timeout`. Returns on a wake-up,
// a change of the word (EAGAIN), a signal (EINTR) or the timeout alike: the
// caller looks at the ring again in each case.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(std::min(timeout, kLongestSleep));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Publishes `position` as `self`'s, then wakes `other` if it sleeps. The
// seq_cst store, bump and load pair with the sleeper's seq_cst flag store and
// position load in WaitUntil (Dekker): either the sleeper sees the new
// position, or this side sees its flag and wakes it (and if the wake comes
// before its FUTEX_WAIT, the bumped futex word makes that return at once).
void Publish(const Words& self, const Words& other, uint64_t position) {
  self.position->store(position, std::memory_order_seq_cst);
  self.futex->fetch_add(1, std::memory_order_seq_cst);
  if (other.sleeps->load(std::memory_order_seq_cst) != 0) FutexWake(self.futex);
}

// Calls `attempt` until it is done (true) or fails, sleeping on `other`'s
// futex word between attempts; timed_out() once `deadline` has passed with
// nothing done (built only then: the common path allocates nothing). The
// first attempt is made whatever the deadline.
template <typename Attempt, typename TimedOut>
absl::Status WaitUntil(const Words& self, const Words& other, absl::Time deadline,
                       const Attempt& attempt, const TimedOut& timed_out) {
  for (int spin = 0; spin < kSpins; ++spin) {
    absl::StatusOr<bool> done = attempt();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (spin == 0 && absl::Now() >= deadline) return timed_out();
    CpuRelax();
  }
  for (;;) {
    self.sleeps->store(1, std::memory_order_seq_cst);
    // Read before looking at the ring again: a position published after
    // that look has bumped the word past `seen`, and FUTEX_WAIT returns.
    const uint32_t seen = other.futex->load(std::memory_order_seq_cst);
    absl::StatusOr<bool> done = attempt();
    if (!done.ok() || *done) {
      self.sleeps->store(0, std::memory_order_relaxed);
      return done.ok() ? absl::OkStatus() : done.status();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      self.sleeps->store(0, std::memory_order_relaxed);
      return timed_out();
    }
    FutexWait(other.futex, seen, deadline - now);
  }
}

}  // namespace

// The data need not be zeroed: only bytes the positions say were written are
// read.
void ShmRing::Init(char* memory, int64_t bytes) {
  (void)bytes;
  std::memset(memory, 0, kShmRingHeaderBytes);
}

ShmRing::ShmRing(char* memory, int64_t bytes)
    : memory_(memory), capacity_(bytes - kShmRingHeaderBytes) {}

// The longest message that fits in an empty ring wherever its write offset
// is: a record never wraps (it starts at offset 0 instead, the tail
// skipped), so with the offset at o a record of R bytes fits when
// R <= capacity - o (no wrap) or R <= o (tail skipped). One of the two is at
// least capacity / 2, so every record of up to capacity / 2 bytes fits:
// length + 4 padded to 8 <= capacity / 2 (a multiple of 32) means
// length <= capacity / 2 - 4. Hence a Write that waits long enough always
// gets room.
int64_t ShmRing::max_message_bytes() const {
  return std::min(capacity_ / 2 - static_cast<int64_t>(kLengthBytes), kLongestLength);
}

absl::Status ShmRing::Write(std::initializer_list<absl::string_view> parts,
                            absl::Time deadline) {
  uint64_t length = 0;
  for (absl::string_view part : parts) length += part.size();
  if (length > static_cast<uint64_t>(max_message_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat("shm ring: a message of ", length,
                                                   " bytes is longer than the longest, ",
                                                   max_message_bytes(), " bytes"));
  }
  const Words writer = WordsAt(memory_, kWriterWords);
  const Words reader = WordsAt(memory_, kReaderWords);
  const uint64_t capacity = static_cast<uint64_t>(capacity_);
  char* const data = memory_ + kShmRingHeaderBytes;
  const uint64_t record = RecordBytes(length);
  auto attempt = [&]() -> absl::StatusOr<bool> {
    const uint64_t written = writer.position->load(std::memory_order_relaxed);
    const uint64_t read = reader.position->load(std::memory_order_seq_cst);
    // (A position so near 2^64 that this message would wrap it round cannot
    // come from counting bytes: refused too.)
    if (read > written || written - read > capacity || read % kAlign != 0 ||
        written % kAlign != 0 || written > UINT64_MAX - 2 * capacity) {
      return absl::DataLossError(absl::StrCat("shm ring: the reader's position ", read,
                                              " does not fit the writer's ", written,
                                              " in a ring of ", capacity, " bytes"));
    }
    const uint64_t offset = written % capacity;
    const uint64_t tail = capacity - offset;  // a multiple of 8, so >= 8
    const uint64_t needed = record <= tail ? record : tail + record;
    if (needed > capacity - (written - read)) return false;
    char* at = data + offset;
    if (record > tail) {
      StoreLength(at, kSkip);
      at = data;
    }
    StoreLength(at, static_cast<uint32_t>(length));
    at += kLengthBytes;
    for (absl::string_view part : parts) {
      if (!part.empty()) std::memcpy(at, part.data(), part.size());
      at += part.size();
    }
    Publish(writer, reader, written + needed);
    return true;
  };
  return WaitUntil(writer, reader, deadline, attempt,
                   [length] {
                     return absl::DeadlineExceededError(absl::StrCat(
                         "shm ring: no room for a message of ", length, " bytes by the deadline"));
                   });
}

absl::Status ShmRing::Read(std::string* out, absl::Time deadline) {
  const Words writer = WordsAt(memory_, kWriterWords);
  const Words reader = WordsAt(memory_, kReaderWords);
  const uint64_t capacity = static_cast<uint64_t>(capacity_);
  const uint64_t longest = static_cast<uint64_t>(max_message_bytes());
  const char* const data = memory_ + kShmRingHeaderBytes;
  auto attempt = [&]() -> absl::StatusOr<bool> {
    const uint64_t read = reader.position->load(std::memory_order_relaxed);
    const uint64_t written = writer.position->load(std::memory_order_seq_cst);
    if (read > written || written - read > capacity || read % kAlign != 0 ||
        written % kAlign != 0) {
      return absl::DataLossError(absl::StrCat("shm ring: the writer's position ", written,
                                              " does not fit the reader's ", read,
                                              " in a ring of ", capacity, " bytes"));
    }
    if (written == read) return false;
    uint64_t position = read;
    uint64_t offset = position % capacity;
    // Each length is read once: the writer may be changing the memory.
    uint32_t length = LoadLength(data + offset);
    if (length == kSkip) {
      const uint64_t tail = capacity - offset;
      if (tail >= written - position) {
        return absl::DataLossError(absl::StrCat(
            "shm ring: a skip marker at offset ", offset, " skips ", tail,
            " bytes with no message after them (", written - position, " bytes written)"));
      }
      position += tail;
      offset = 0;
      length = LoadLength(data);
    }
    if (length > longest) {
      return absl::DataLossError(absl::StrCat("shm ring: a length of ", length,
                                              " bytes at offset ", offset,
                                              " is longer than the longest, ", longest));
    }
    const uint64_t record = RecordBytes(length);
    if (record > written - position || offset + record > capacity) {
      return absl::DataLossError(absl::StrCat(
          "shm ring: a message of ", length, " bytes at offset ", offset, " passes the ",
          written - position, " bytes written or the end of the data at ", capacity));
    }
    out->resize(length);
    if (length > 0) std::memcpy(out->data(), data + offset + kLengthBytes, length);
    Publish(reader, writer, position + record);
    return true;
  };
  return WaitUntil(reader, writer, deadline, attempt, [] {
    return absl::DeadlineExceededError("shm ring: no message by the deadline");
  });
}

bool ShmRing::HasMessage() const {
  const Words writer = WordsAt(memory_, kWriterWords);
  const Words reader = WordsAt(memory_, kReaderWords);
  return writer.position->load(std::memory_order_acquire) !=
         reader.position->load(std::memory_order_relaxed);
}

void ShmRing::WakeAll() {
  for (int64_t at : {kWriterWords, kReaderWords}) {
    const Words words = WordsAt(memory_, at);
    words.futex->fetch_add(1, std::memory_order_seq_cst);
    FutexWake(words.futex);
  }
}

}  // namespace towerps::common
