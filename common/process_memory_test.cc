#include "common/process_memory.h"

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

}  // namespace
}  // namespace towerps::common
