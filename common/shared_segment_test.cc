#include "common/shared_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SharedSegment> MakeSegment(int64_t payload) {
  auto s = SharedSegment::Create(payload);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(SharedSegmentTest, ServerWritesWhatTheWorkerSees) {
  auto seg = MakeSegment(1 << 16);
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->size(), kSegmentHeaderBytes + (1 << 16));
  EXPECT_EQ(seg->nonce().size(), static_cast<size_t>(kSegmentNonceBytes));
  auto file = SegmentFile::Open(seg->pid(), seg->fd(), seg->nonce(), seg->size());
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 7;
  const int64_t at = kSegmentHeaderBytes + 64;
  ASSERT_TRUE(file->Write(at, values.data(), 4000).ok());
  EXPECT_EQ(std::memcmp(seg->at(at), values.data(), 4000), 0);
  // And back: what the worker writes, the server reads.
  std::memset(seg->mutable_at(at), 0x3c, 100);
  std::vector<char> back(100);
  ASSERT_TRUE(file->Read(at, back.data(), 100).ok());
  EXPECT_EQ(back, std::vector<char>(100, 0x3c));
  // The last byte of the payload fits; one more does not.
  EXPECT_TRUE(file->Write(seg->size() - 1, "x", 1).ok());
  EXPECT_EQ(*seg->at(seg->size() - 1), 'x');
}

TEST(SharedSegmentTest, TwoSegmentsHaveTheirOwnNonces) {
  auto a = MakeSegment(0);
  auto b = MakeSegment(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->nonce(), b->nonce());
  auto wrong = SegmentFile::Open(a->pid(), a->fd(), b->nonce(), a->size());
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong.status())) << wrong.status();
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("another nonce"));
}

TEST(SharedSegmentTest, WritesOutsideThePayloadAreRefused) {
  auto seg = MakeSegment(4096);
  ASSERT_NE(seg, nullptr);
  auto file = SegmentFile::Open(seg->pid(), seg->fd(), seg->nonce(), seg->size());
  ASSERT_TRUE(file.ok()) << file.status();
  char buf[8] = {};
  // The header is not payload: the nonce cannot be overwritten.
  EXPECT_TRUE(absl::IsInvalidArgument(file->Write(0, buf, 8)));
  EXPECT_TRUE(absl::IsInvalidArgument(file->Write(kSegmentHeaderBytes - 4, buf, 8)));
  EXPECT_TRUE(absl::IsInvalidArgument(file->Write(seg->size() - 4, buf, 8)));
  EXPECT_TRUE(absl::IsInvalidArgument(file->Write(INT64_MAX - 2, buf, 8)));
  EXPECT_TRUE(absl::IsInvalidArgument(file->Write(kSegmentHeaderBytes, buf, -1)));
  EXPECT_TRUE(absl::IsInvalidArgument(file->Read(seg->size(), buf, 1)));
  EXPECT_TRUE(file->Write(seg->size(), buf, 0).ok());
  // Nothing was written by the refused calls.
  auto again = SegmentFile::Open(seg->pid(), seg->fd(), seg->nonce(), seg->size());
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(SharedSegmentTest, OnlyASealedTowerpsMemfdIsOpened) {
  auto seg = MakeSegment(4096);
  ASSERT_NE(seg, nullptr);
  const int pid = seg->pid();
  // Another size.
  auto sized = SegmentFile::Open(pid, seg->fd(), seg->nonce(), seg->size() + 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(sized.status())) << sized.status();
  // A regular file.
  char path[] = "/tmp/shared_segment_testXXXXXX";
  const int plain = mkstemp(path);
  ASSERT_GE(plain, 0);
  unlink(path);
  auto file = SegmentFile::Open(pid, plain, seg->nonce(), seg->size());
  EXPECT_TRUE(absl::IsFailedPrecondition(file.status())) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a towerps segment"));
  close(plain);
  // A memfd of the right name, size and header, but not sealed: it could
  // shrink under the server.
  const int loose = memfd_create(std::string(kSegmentName).c_str(), MFD_CLOEXEC);
  ASSERT_GE(loose, 0);
  ASSERT_EQ(ftruncate(loose, seg->size()), 0);
  ASSERT_EQ(pwrite(loose, seg->at(0), 64, 0), 64);
  auto unsealed = SegmentFile::Open(pid, loose, seg->nonce(), seg->size());
  EXPECT_TRUE(absl::IsFailedPrecondition(unsealed.status())) << unsealed.status();
  EXPECT_THAT(std::string(unsealed.status().message()), HasSubstr("not sealed"));
  close(loose);
  // A descriptor that is not open, a process that does not exist.
  auto closed = SegmentFile::Open(pid, loose, seg->nonce(), seg->size());
  EXPECT_TRUE(absl::IsFailedPrecondition(closed.status())) << closed.status();
  auto gone = SegmentFile::Open((1 << 22) - 1, seg->fd(), seg->nonce(), seg->size());
  EXPECT_TRUE(absl::IsFailedPrecondition(gone.status())) << gone.status();
  // Values that cannot be right.
  EXPECT_TRUE(absl::IsInvalidArgument(
      SegmentFile::Open(0, seg->fd(), seg->nonce(), seg->size()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SegmentFile::Open(pid, -1, seg->nonce(), seg->size()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SegmentFile::Open(pid, seg->fd(), "short", seg->size()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SegmentFile::Open(pid, seg->fd(), seg->nonce(), 100).status()));
}

// A sealed memfd of the right name on hugetlbfs is not mapped: its pages
// can run out when first touched, and the server would get SIGBUS.
TEST(SharedSegmentTest, AHugetlbMemfdIsNotMapped) {
  const int huge = memfd_create(std::string(kSegmentName).c_str(),
                                MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (huge < 0) GTEST_SKIP() << "no hugetlbfs memfds here: " << std::strerror(errno);
  const int64_t size = int64_t{2} << 20;  // one huge page of the usual size
  if (ftruncate(huge, size) != 0) {
    close(huge);
    GTEST_SKIP() << "hugetlbfs memfd of 2 MiB: " << std::strerror(errno);
  }
  ASSERT_EQ(fcntl(huge, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  auto file = SegmentFile::Open(getpid(), huge, std::string(kSegmentNonceBytes, 'n'), size);
  EXPECT_TRUE(absl::IsFailedPrecondition(file.status())) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a memfd on tmpfs"));
  close(huge);
}

// The case it is for: another process (here a child) opens the segment by
// the owner's pid and writes into it.
TEST(SharedSegmentTest, AnotherProcessWritesIntoIt) {
  auto seg = MakeSegment(1 << 20);
  ASSERT_NE(seg, nullptr);
  const int parent = seg->pid();
  const int fd = seg->fd();
  const std::string nonce = seg->nonce();
  const int64_t size = seg->size();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto file = SegmentFile::Open(parent, fd, nonce, size);
    if (!file.ok()) _exit(2);
    std::vector<uint32_t> pattern(1 << 18);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 2654435761u);
    _exit(file->Write(kSegmentHeaderBytes, pattern.data(), 1 << 20).ok() ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const uint32_t* got = reinterpret_cast<const uint32_t*>(seg->at(kSegmentHeaderBytes));
  for (size_t i = 0; i < (1u << 18); i += 4093) {
    ASSERT_EQ(got[i], static_cast<uint32_t>(i * 2654435761u)) << i;
  }
}

// A worker killed while a server has its segment open: the server's writes
// and reads go on into memory that its own descriptor keeps alive (nobody
// else sees them), and a new open names the dead process instead.
TEST(SharedSegmentTest, AnOpenedSegmentOutlivesItsWorker) {
  int to_parent[2];
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto seg = SharedSegment::Create(1 << 20);
    if (!seg.ok()) _exit(2);
    const int64_t where[3] = {(*seg)->fd(), (*seg)->size(), 0};
    if (write(to_parent[1], where, sizeof(where)) != sizeof(where)) _exit(3);
    if (write(to_parent[1], (*seg)->nonce().data(), (*seg)->nonce().size()) !=
        static_cast<ssize_t>((*seg)->nonce().size())) {
      _exit(4);
    }
    for (;;) pause();  // killed by the parent
  }
  close(to_parent[1]);
  int64_t where[3];
  ASSERT_EQ(read(to_parent[0], where, sizeof(where)), static_cast<ssize_t>(sizeof(where)));
  std::string nonce(16, '\0');
  ASSERT_EQ(read(to_parent[0], nonce.data(), nonce.size()), 16);
  close(to_parent[0]);
  auto file = SegmentFile::Open(child, where[0], nonce, where[1]);
  if (!file.ok()) kill(child, SIGKILL);
  ASSERT_TRUE(file.ok()) << file.status();

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  std::vector<uint32_t> pattern(1 << 18), back(1 << 18);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 40503u);
  ASSERT_TRUE(file->Write(kSegmentHeaderBytes, pattern.data(), 1 << 20).ok());
  ASSERT_TRUE(file->Read(kSegmentHeaderBytes, back.data(), 1 << 20).ok());
  EXPECT_EQ(back, pattern);
  auto again = SegmentFile::Open(child, where[0], nonce, where[1]);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr(std::to_string(child)));
}

}  // namespace
}  // namespace towerps::common
