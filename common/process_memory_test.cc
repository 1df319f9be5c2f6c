#include "common/process_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <iostream>

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

// AnonHugePages of the mappings that overlap [begin, end), from
// /proc/self/smaps, in bytes.
int64_t AnonHugeBytes(uintptr_t begin, uintptr_t end) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool overlaps = false;
  int64_t total = 0;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      overlaps = lo < end && begin < hi;
      continue;
    }
    if (overlaps && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream fields(line.substr(14));
      int64_t kib = 0;
      fields >> kib;
      total += kib * 1024;
    }
  }
  return total;
}

// A buffer of several huge pages' bytes, not aligned to one: every whole
// huge page inside it is collapsed, or an error names why not; the contents
// are the same either way, and the kernel counts what was collapsed.
TEST(ProcessMemoryTest, BackWithHugePagesKeepsTheBytesAndCountsThePages) {
  constexpr size_t kBytes = (size_t{9} << 20) + 12345;
  std::vector<uint8_t> buffer(kBytes);
  for (size_t i = 0; i < kBytes; ++i) buffer[i] = static_cast<uint8_t>((i * 131) ^ (i >> 9));
  const HugePages huge = BackWithHugePages(buffer.data(), buffer.size());
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(buffer[i], static_cast<uint8_t>((i * 131) ^ (i >> 9))) << "byte " << i;
  }
  if (huge.page == 0) {
    EXPECT_FALSE(huge.error.empty());
    EXPECT_EQ(huge.bytes, 0);
    GTEST_SKIP() << "no transparent huge pages here: " << huge.error;
  }
  const uintptr_t page = static_cast<uintptr_t>(huge.page);
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(buffer.data()) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(buffer.data()) + kBytes) & ~(page - 1);
  const int64_t whole = static_cast<int64_t>(end - begin);
  ASSERT_GT(whole, 0);
  EXPECT_EQ(huge.bytes % huge.page, 0);
  if (huge.error.empty()) {
    EXPECT_EQ(huge.bytes, whole);
  } else {
    EXPECT_LT(huge.bytes, whole) << huge.error;
    std::cout << "not every page collapsed: " << huge.error << "\n";
  }
  const int64_t counted = AnonHugeBytes(begin, end);
  std::cout << huge.bytes << " of " << whole << " bytes collapsed; the kernel counts " << counted
            << "\n";
  EXPECT_GE(counted, huge.bytes);
}

// A range that holds no whole huge page is left alone, and that is no error.
TEST(ProcessMemoryTest, BackWithHugePagesLeavesARangeBelowAHugePage) {
  std::vector<uint8_t> buffer(size_t{1} << 19, 7);
  const HugePages huge = BackWithHugePages(buffer.data(), buffer.size());
  EXPECT_EQ(huge.bytes, 0);
  if (huge.page > 0) {
    EXPECT_EQ(huge.error, "");
  }
  for (uint8_t b : buffer) ASSERT_EQ(b, 7);
}

}  // namespace
}  // namespace towerps::common
