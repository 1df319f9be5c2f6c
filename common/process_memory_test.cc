#include "common/process_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

// The peak grows by (about) what the process touches: 64 MiB written is in it.
TEST(ProcessMemoryTest, PeakCountsMemoryTouched) {
  const int64_t before = PeakResidentBytes();
  ASSERT_GT(before, 0);
  constexpr size_t kBytes = size_t{64} << 20;
  std::unique_ptr<char[]> block(new char[kBytes]);
  std::memset(block.get(), 1, kBytes);
  // Resident now, then the peak: the peak read later covers it (the process
  // may grow in between, e.g. under ASan, so not the other way round).
  const int64_t now = ResidentBytes();
  const int64_t after = PeakResidentBytes();
  EXPECT_GE(after, before + static_cast<int64_t>(kBytes) / 2) << block[kBytes - 1];
  EXPECT_GE(now, static_cast<int64_t>(kBytes) / 2);
  EXPECT_LE(now, after);
}

// Pages of a memfd this process maps and touches count as shared resident
// memory (and go when unmapped); heap memory does not.
TEST(ProcessMemoryTest, SharedCountsMappedMemfdPages) {
  const int64_t before = SharedResidentBytes();
  ASSERT_GE(before, 0);
  constexpr size_t kBytes = size_t{16} << 20;
  const int fd = memfd_create("process_memory_test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::memset(m, 1, kBytes);
  const int64_t mapped = SharedResidentBytes();
  EXPECT_GE(mapped, before + static_cast<int64_t>(kBytes));
  ASSERT_EQ(munmap(m, kBytes), 0);
  close(fd);
  EXPECT_LE(SharedResidentBytes(), mapped - static_cast<int64_t>(kBytes));
  std::unique_ptr<char[]> block(new char[kBytes]);
  std::memset(block.get(), 1, kBytes);
  EXPECT_LT(SharedResidentBytes(), before + static_cast<int64_t>(kBytes) / 2) << block[1];
}

}  // namespace
}  // namespace towerps::common
