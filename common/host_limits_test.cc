#include "common/host_limits.h"

#include <sched.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

// A cgroup file system under the test's temporary directory.
class CgroupTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void Write(const std::string& path, const std::string& text) {
    std::string dir = root_;
    mkdir(dir.c_str(), 0755);
    for (absl::string_view part : absl::StrSplit(path.substr(0, path.rfind('/')), '/',
                                                 absl::SkipEmpty())) {
      absl::StrAppend(&dir, "/", part);
      mkdir(dir.c_str(), 0755);
    }
    std::ofstream(root_ + path) << text;
  }
  std::optional<CgroupLimit> Read(const std::string& mountinfo, const std::string& cgroup) {
    return ReadCgroupCpuLimit(mountinfo, cgroup, root_);
  }
  std::optional<CgroupLimit> ReadMemory(const std::string& mountinfo, const std::string& cgroup) {
    return ReadCgroupMemoryLimit(mountinfo, cgroup, root_);
  }
  std::string root_;
};

constexpr char kV2Mount[] =
    "25 1 0:22 / / rw - ext4 /dev/vda1 rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

TEST_F(CgroupTreeTest, V2TakesTheTightestLimitOnThePathUp) {
  Write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  Write("/sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  const auto limit = Read(kV2Mount, "0::/kubepods/pod1/ctr\n");
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->value, 1.5);
  EXPECT_EQ(limit->file, "/sys/fs/cgroup/kubepods/pod1/cpu.max");
  // An ancestor's limit binds a child with a looser one.
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "400000 100000\n");
  Write("/sys/fs/cgroup/kubepods/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(Read(kV2Mount, "0::/kubepods/pod1/ctr\n")->value, 0.5);
}

TEST_F(CgroupTreeTest, V2InsideACgroupNamespaceReadsTheMountsOwnLimit) {
  Write("/sys/fs/cgroup/cpu.max", "200000 100000\n");
  const auto limit = Read(kV2Mount, "0::/\n");
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->value, 2.0);
}

TEST_F(CgroupTreeTest, NoLimitSetOrNoFileIsNone) {
  Write("/sys/fs/cgroup/a/cpu.max", "max 100000\n");
  EXPECT_FALSE(Read(kV2Mount, "0::/a\n").has_value());
  EXPECT_FALSE(Read(kV2Mount, "0::/nowhere\n").has_value());
  Write("/sys/fs/cgroup/b/cpu.max", "garbage\n");
  EXPECT_FALSE(Read(kV2Mount, "0::/b\n").has_value());
  Write("/sys/fs/cgroup/c/cpu.max", "0 100000\n");  // not a limit anyone sets
  EXPECT_FALSE(Read(kV2Mount, "0::/c\n").has_value());
  EXPECT_FALSE(Read("", "").has_value());
  EXPECT_FALSE(Read(kV2Mount, "").has_value());  // not in the hierarchy
}

constexpr char kV1Mounts[] =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n";

TEST_F(CgroupTreeTest, V1ReadsTheCpuControllersQuota) {
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  const std::string cgroup = "5:cpuset:/other\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  const auto limit = Read(kV1Mounts, cgroup);
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->value, 0.5);
  EXPECT_EQ(limit->file, "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us");
  // -1 everywhere: none.
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_FALSE(Read(kV1Mounts, cgroup).has_value());
}

TEST_F(CgroupTreeTest, V1MountedAtTheProcesssOwnCgroup) {
  // A container without a cgroup namespace: the mount's root is the
  // container's cgroup, which /proc/self/cgroup names in full.
  const std::string mounts =
      "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
  Write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "300000\n");
  Write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  const auto limit = Read(mounts, "3:cpu:/docker/abc\n");
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->value, 3.0);
}

TEST_F(CgroupTreeTest, V2MemoryLimitIsTheTightestOnThePathUp) {
  Write("/sys/fs/cgroup/kubepods/memory.max", "8589934592\n");
  Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "4294967296\n");
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  const auto limit = ReadMemory(kV2Mount, "0::/kubepods/pod1/ctr\n");
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->value, 4294967296.0);
  EXPECT_EQ(limit->file, "/sys/fs/cgroup/kubepods/pod1/memory.max");
  // The CPU limit is read apart: none is set here.
  EXPECT_FALSE(Read(kV2Mount, "0::/kubepods/pod1/ctr\n").has_value());
  Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "max\n");
  Write("/sys/fs/cgroup/kubepods/memory.max", "max\n");
  EXPECT_FALSE(ReadMemory(kV2Mount, "0::/kubepods/pod1/ctr\n").has_value());
}

TEST_F(CgroupTreeTest, V1MemoryUnlimitedIsNone) {
  const std::string mounts =
      "34 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
  const std::string cgroup = "4:memory:/process_api/abc\n3:cpu:/\n";
  // The kernel's "no limit": INT64_MAX rounded down to a page.
  Write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_FALSE(ReadMemory(mounts, cgroup).has_value());
  Write("/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "2147483648\n");
  const auto limit = ReadMemory(mounts, cgroup);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->value, 2147483648.0);
  EXPECT_EQ(limit->file, "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes");
}

TEST(UsableMemoryTest, AtMostThePhysicalMemory) {
  const MemoryAmount m = UsableMemory();
  EXPECT_GT(m.physical, 0);
  EXPECT_GT(m.usable, 0);
  EXPECT_LE(m.usable, m.physical);
  EXPECT_EQ(m.usable < m.physical, !m.limit.empty()) << m.limit;
}

TEST(UsableCoresTest, ACallerBoundToOneCpuCountsOne) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const CoreCount free = UsableCores();
  EXPECT_GE(free.online, 1);
  EXPECT_GE(free.usable, 1);
  EXPECT_LE(free.usable, free.online);
  EXPECT_LE(free.usable, CPU_COUNT(&saved));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const CoreCount bound = UsableCores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(bound.usable, 1);
  EXPECT_EQ(bound.online, free.online);
  if (bound.online > 1) {
    EXPECT_EQ(bound.limit, "its CPU affinity allows 1") << bound.limit;
  }
}

}  // namespace
}  // namespace towerps::common
