#include "common/shm_ring.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

// Where the header puts each side's position (common/shm_ring.h, "Layout").
constexpr int64_t kWrittenAt = 0;
constexpr int64_t kReadAt = 64;

// Memory that a fork()ed child shares: mmap(MAP_SHARED | MAP_ANONYMOUS), page
// aligned, made an empty ring.
class RingMemory {
 public:
  explicit RingMemory(int64_t bytes) : bytes_(bytes) {
    void* m = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(m, MAP_FAILED);
    memory_ = static_cast<char*>(m);
    ShmRing::Init(memory_, bytes_);
  }
  ~RingMemory() { munmap(memory_, static_cast<size_t>(bytes_)); }
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;

  char* memory() { return memory_; }
  int64_t bytes() const { return bytes_; }
  ShmRing ring() { return ShmRing(memory_, bytes_); }
  char* data() { return memory_ + kShmRingHeaderBytes; }
  void SetWord(int64_t at, uint64_t value) { std::memcpy(memory_ + at, &value, 8); }
  uint64_t Word(int64_t at) const {
    uint64_t value;
    std::memcpy(&value, memory_ + at, 8);
    return value;
  }

 private:
  const int64_t bytes_;
  char* memory_ = nullptr;
};

// Message `index` of `length` bytes: a pattern that differs by index and by
// byte, so a message out of order, shifted or torn does not compare equal.
std::string Pattern(int64_t index, int64_t length) {
  std::string s(static_cast<size_t>(length), '\0');
  for (int64_t j = 0; j < length; ++j) {
    s[static_cast<size_t>(j)] = static_cast<char>((index * 131 + j * 7 + (j >> 8)) & 0xff);
  }
  return s;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(ShmRingTest, RoundTripsMessagesOfManySizes) {
  RingMemory mem(kShmRingHeaderBytes + 4096);
  ShmRing ring = mem.ring();
  const int64_t longest = ring.max_message_bytes();
  // Documented in shm_ring.cc: half the data, less the length field.
  EXPECT_EQ(longest, 4096 / 2 - 4);
  int64_t index = 0;
  for (int64_t length : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{7},
                         int64_t{8}, int64_t{9}, int64_t{100}, int64_t{1000}, longest - 1,
                         longest}) {
    SCOPED_TRACE(absl::StrCat("length ", length));
    EXPECT_FALSE(ring.HasMessage());
    const std::string sent = Pattern(index++, length);
    ASSERT_TRUE(ring.Write({sent}, Soon()).ok());
    EXPECT_TRUE(ring.HasMessage());
    std::string got = "left over";
    ASSERT_TRUE(ring.Read(&got, Soon()).ok());
    EXPECT_EQ(got, sent);
  }
  EXPECT_FALSE(ring.HasMessage());
}

TEST(ShmRingTest, LongestMessageFitsAnEmptyRingAtEveryOffset) {
  // For each write offset of an empty ring (moved there by 4-byte messages,
  // 8-byte records), the longest message fits at once: it is written with a
  // deadline already passed. Twice, so the second starts where the first
  // (possibly after a skipped tail) ended.
  for (int64_t data_bytes : {int64_t{64}, int64_t{192}}) {
    RingMemory mem(kShmRingHeaderBytes + data_bytes);
    ShmRing ring = mem.ring();
    const int64_t longest = ring.max_message_bytes();
    EXPECT_EQ(longest, data_bytes / 2 - 4);
    for (int64_t offset = 0; offset < data_bytes; offset += 8) {
      SCOPED_TRACE(absl::StrCat(data_bytes, " bytes, offset ", offset));
      ShmRing::Init(mem.memory(), mem.bytes());
      std::string got;
      for (int64_t i = 0; i < offset / 8; ++i) {
        ASSERT_TRUE(ring.Write({"abcd"}, absl::InfinitePast()).ok());
        ASSERT_TRUE(ring.Read(&got, absl::InfinitePast()).ok());
        EXPECT_EQ(got, "abcd");
      }
      for (int64_t i = 0; i < 2; ++i) {
        const std::string sent = Pattern(offset + i, longest);
        absl::Status s = ring.Write({sent}, absl::InfinitePast());
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE(ring.Read(&got, absl::InfinitePast()).ok());
        EXPECT_EQ(got, sent);
      }
    }
  }
}

TEST(ShmRingTest, MultipartWriteConcatenates) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  ASSERT_TRUE(ring.Write({"ab", "", "cde", absl::string_view("\0f", 2)}, Soon()).ok());
  ASSERT_TRUE(ring.Write({}, Soon()).ok());
  std::string got;
  ASSERT_TRUE(ring.Read(&got, Soon()).ok());
  EXPECT_EQ(got, std::string("abcde\0f", 7));
  ASSERT_TRUE(ring.Read(&got, Soon()).ok());
  EXPECT_EQ(got, "");
}

TEST(ShmRingTest, WrapsAroundUnderConcurrentUse) {
  // A small ring, so the writer often waits for room and records wrap (and
  // skip the tail) many times.
  RingMemory mem(kShmRingHeaderBytes + 1024);
  ShmRing ring = mem.ring();
  const int64_t longest = ring.max_message_bytes();
  constexpr int64_t kMessages = 5000;
  auto length_of = [longest](int64_t i) { return (i * 37 + (i % 3) * 101) % (longest + 1); };
  std::thread writer([&] {
    for (int64_t i = 0; i < kMessages; ++i) {
      const std::string sent = Pattern(i, length_of(i));
      // Split some messages into parts, at a point that varies.
      const size_t cut = static_cast<size_t>(i) % (sent.size() + 1);
      absl::Status s = (i % 2 == 0)
                           ? ring.Write({sent}, Soon())
                           : ring.Write({absl::string_view(sent).substr(0, cut),
                                         absl::string_view(sent).substr(cut)},
                                        Soon());
      if (!s.ok()) {
        ADD_FAILURE() << "write " << i << ": " << s;
        return;
      }
    }
  });
  int64_t wrong = 0;
  std::string got;
  for (int64_t i = 0; i < kMessages; ++i) {
    absl::Status s = ring.Read(&got, Soon());
    if (!s.ok()) {
      ADD_FAILURE() << "read " << i << ": " << s;
      break;
    }
    if (got != Pattern(i, length_of(i))) ++wrong;
  }
  writer.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_FALSE(ring.HasMessage());
  // Many times round the 1024 bytes.
  EXPECT_GT(mem.Word(kReadAt), uint64_t{100} * 1024);
}

// What the child of CrossProcessEcho exits with: 0, or which step failed.
int EchoChild(ShmRing& in, ShmRing& out, int64_t messages) {
  std::string message;
  for (int64_t i = 0; i < messages; ++i) {
    if (!in.Read(&message, Soon()).ok()) return 10;
    // Echoed with its index in front, so the parent sees the child's order.
    const std::string index = absl::StrCat(i, ":");
    if (!out.Write({index, message}, Soon()).ok()) return 11;
  }
  // Nothing more comes.
  if (!absl::IsDeadlineExceeded(in.Read(&message, absl::Now() + absl::Milliseconds(20)))) {
    return 12;
  }
  return 0;
}

TEST(ShmRingTest, EchoesAcrossProcesses) {
  // To the child: a ring smaller than a window of messages, so the parent
  // waits for room; back: a ring that holds a whole window of echoes, so the
  // child never waits on a parent that is still writing.
  RingMemory to_child(kShmRingHeaderBytes + 512);
  RingMemory to_parent(kShmRingHeaderBytes + 4096);
  constexpr int64_t kMessages = 1200;
  constexpr int64_t kWindow = 8;
  auto length_of = [](int64_t i) { return (i * 53) % 200; };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ShmRing in = to_child.ring();
    ShmRing out = to_parent.ring();
    _exit(EchoChild(in, out, kMessages));
  }
  ShmRing out = to_child.ring();
  ShmRing in = to_parent.ring();
  int64_t wrong = 0;
  std::string got;
  for (int64_t start = 0; start < kMessages; start += kWindow) {
    for (int64_t i = start; i < start + kWindow; ++i) {
      absl::Status s = out.Write({Pattern(i, length_of(i))}, Soon());
      ASSERT_TRUE(s.ok()) << "write " << i << ": " << s;
    }
    for (int64_t i = start; i < start + kWindow; ++i) {
      absl::Status s = in.Read(&got, Soon());
      ASSERT_TRUE(s.ok()) << "read " << i << ": " << s;
      if (got != absl::StrCat(i, ":", Pattern(i, length_of(i)))) ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ShmRingTest, WriteToAFullRingTimesOutAndWritesNothing) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  // 20-byte messages are 24-byte records: ten fit in 256 bytes, not eleven.
  int64_t sent = 0;
  while (sent < 100 && ring.Write({Pattern(sent, 20)}, absl::InfinitePast()).ok()) ++sent;
  EXPECT_EQ(sent, 10);
  const uint64_t written = mem.Word(kWrittenAt);
  absl::Status s = ring.Write({Pattern(sent, 20)}, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("20 bytes"));
  EXPECT_EQ(mem.Word(kWrittenAt), written);
  std::string got;
  for (int64_t i = 0; i < sent; ++i) {
    ASSERT_TRUE(ring.Read(&got, absl::InfinitePast()).ok()) << i;
    EXPECT_EQ(got, Pattern(i, 20)) << i;
  }
  EXPECT_FALSE(ring.HasMessage());
  // Room again.
  ASSERT_TRUE(ring.Write({"again"}, absl::InfinitePast()).ok());
  ASSERT_TRUE(ring.Read(&got, absl::InfinitePast()).ok());
  EXPECT_EQ(got, "again");
}

TEST(ShmRingTest, ReadFromAnEmptyRingTimesOut) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  std::string got = "untouched";
  absl::Status s = ring.Read(&got, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(got, "untouched");
  s = ring.Read(&got, absl::InfinitePast());
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  // A message written before a passed deadline is still read.
  ASSERT_TRUE(ring.Write({"x"}, absl::InfinitePast()).ok());
  EXPECT_TRUE(ring.Read(&got, absl::InfinitePast()).ok());
  EXPECT_EQ(got, "x");
}

TEST(ShmRingTest, RejectsAMessageLongerThanTheLongest) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  const int64_t longest = ring.max_message_bytes();
  const std::string long_one(static_cast<size_t>(longest) + 1, 'x');
  absl::Status s = ring.Write({long_one}, Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(longest + 1)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(longest)));
  // In parts too.
  const absl::string_view whole(long_one);
  s = ring.Write({whole.substr(0, 10), whole.substr(10)}, Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_FALSE(ring.HasMessage());
  EXPECT_EQ(mem.Word(kWrittenAt), 0u);
}

void StoreLength(char* at, uint32_t length) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>(length >> (8 * i));
}

TEST(ShmRingTest, CorruptLengthsGiveDataLoss) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  std::string got;
  struct Case {
    const char* what;
    uint32_t length;
  };
  // One 20-byte message (a 24-byte record) is written; its length field
  // then says something else.
  for (const Case& c : {Case{"past what was written", 21}, Case{"past the data", 1000},
                        Case{"longer than any message", 0xfffffff0},
                        Case{"a skip with nothing after it", 0xffffffff}}) {
    SCOPED_TRACE(c.what);
    ShmRing::Init(mem.memory(), mem.bytes());
    ASSERT_TRUE(ring.Write({Pattern(0, 20)}, absl::InfinitePast()).ok());
    StoreLength(mem.data(), c.length);
    absl::Status s = ring.Read(&got, Soon());
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shm ring"));
    // Nothing was taken: the same again.
    EXPECT_TRUE(absl::IsDataLoss(ring.Read(&got, Soon())));
  }
  // A record that would pass the end of the data: the positions say 64
  // bytes are written from 8 bytes before the end; the length there is 20.
  ShmRing::Init(mem.memory(), mem.bytes());
  mem.SetWord(kReadAt, 256 - 8);
  mem.SetWord(kWrittenAt, 256 - 8 + 64);
  StoreLength(mem.data() + 256 - 8, 20);
  absl::Status s = ring.Read(&got, Soon());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  // A skip marker followed by another one.
  ShmRing::Init(mem.memory(), mem.bytes());
  mem.SetWord(kReadAt, 256 - 16);
  mem.SetWord(kWrittenAt, 256 - 16 + 64);
  StoreLength(mem.data() + 256 - 16, 0xffffffff);
  StoreLength(mem.data(), 0xffffffff);
  s = ring.Read(&got, Soon());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  // The same with a real message after the skip reads fine.
  StoreLength(mem.data(), 3);
  std::memcpy(mem.data() + 4, "abc", 3);
  s = ring.Read(&got, Soon());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, "abc");
}

TEST(ShmRingTest, CorruptPositionsGiveDataLoss) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  std::string got;
  struct Case {
    const char* what;
    uint64_t written;
    uint64_t read;
  };
  for (const Case& c : {Case{"read past written", 64, 72}, Case{"more than the ring", 256 + 8, 0},
                        Case{"far apart", 0xfffffffffffffff8u, 0},
                        Case{"unaligned written", 12, 0}, Case{"unaligned read", 16, 4}}) {
    SCOPED_TRACE(c.what);
    ShmRing::Init(mem.memory(), mem.bytes());
    mem.SetWord(kWrittenAt, c.written);
    mem.SetWord(kReadAt, c.read);
    absl::Status s = ring.Read(&got, Soon());
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(c.written)));
    s = ring.Write({"x"}, Soon());
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(c.read)));
    // The writer wrote nothing.
    EXPECT_EQ(mem.Word(kWrittenAt), c.written);
  }
}

// The waits below end long before their deadlines unless a wake-up is lost;
// a lost one would show as a wait that ran to its deadline.
constexpr absl::Duration kLongWait = absl::Seconds(20);

TEST(ShmRingTest, SleepingReaderIsWokenByAWrite) {
  RingMemory mem(kShmRingHeaderBytes + 256);
  ShmRing ring = mem.ring();
  for (int round = 0; round < 20; ++round) {
    absl::Status read_status;
    std::string got;
    const absl::Time deadline = absl::Now() + kLongWait;
    absl::Time returned;
    std::thread reader([&] {
      read_status = ring.Read(&got, deadline);
      returned = absl::Now();
    });
    // Usually asleep by then; the test passes either way, and tests the
    // wake-up whenever it is.
    absl::SleepFor(absl::Milliseconds(2));
    const std::string sent = Pattern(round, round);
    ASSERT_TRUE(ring.Write({sent}, Soon()).ok());
    reader.join();
    ASSERT_TRUE(read_status.ok()) << read_status;
    EXPECT_EQ(got, sent);
    ASSERT_LT(returned, deadline);
  }
}

TEST(ShmRingTest, SleepingWriterIsWokenByARead) {
  RingMemory mem(kShmRingHeaderBytes + 64);
  ShmRing ring = mem.ring();
  std::string got;
  for (int round = 0; round < 20; ++round) {
    // Full: two longest messages (from offset 0, so neither skips a tail)
    // take all of it; a third waits for the first to go.
    ShmRing::Init(mem.memory(), mem.bytes());
    ASSERT_TRUE(ring.Write({Pattern(round, ring.max_message_bytes())}, Soon()).ok());
    ASSERT_TRUE(ring.Write({Pattern(round, ring.max_message_bytes())}, Soon()).ok());
    absl::Status write_status;
    const absl::Time deadline = absl::Now() + kLongWait;
    absl::Time returned;
    std::thread writer([&] {
      write_status = ring.Write({"third"}, deadline);
      returned = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(ring.Read(&got, Soon()).ok());
    writer.join();
    ASSERT_TRUE(write_status.ok()) << write_status;
    ASSERT_LT(returned, deadline);
    ASSERT_TRUE(ring.Read(&got, Soon()).ok());
    ASSERT_TRUE(ring.Read(&got, Soon()).ok());
    EXPECT_EQ(got, "third");
  }
}

TEST(ShmRingTest, WakeAllSendsSleepersBackToTheirWaits) {
  RingMemory mem(kShmRingHeaderBytes + 64);
  ShmRing ring = mem.ring();
  absl::Status read_status;
  std::string got = "untouched";
  std::thread reader(
      [&] { read_status = ring.Read(&got, absl::Now() + absl::Milliseconds(100)); });
  for (int i = 0; i < 20; ++i) {
    ring.WakeAll();
    absl::SleepFor(absl::Milliseconds(1));
  }
  reader.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(read_status)) << read_status;
  EXPECT_EQ(got, "untouched");
  // The ring still works after the bumps.
  ASSERT_TRUE(ring.Write({"y"}, Soon()).ok());
  ASSERT_TRUE(ring.Read(&got, Soon()).ok());
  EXPECT_EQ(got, "y");
}

}  // namespace
}  // namespace towerps::common
