#include "ps/segment_gates.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/shared_segment.h"
#include "gtest/gtest.h"

namespace towerps::ps {
namespace {

v1::SharedSegment Named(const common::SharedSegment& seg) {
  v1::SharedSegment s;
  s.set_pid(seg.pid());
  s.set_fd(seg.fd());
  s.set_nonce(seg.nonce());
  s.set_size(seg.size());
  return s;
}

// Waits (with a deadline) until `gates` maps `n` segments.
bool MappedBecomes(SegmentGates& gates, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (gates.mapped() != n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return gates.mapped() == n;
}

TEST(SegmentGatesTest, ASegmentIsMappedOnceAndWrittenThroughTheMapping) {
  auto seg = common::SharedSegment::Create(8192);
  ASSERT_TRUE(seg.ok()) << seg.status();
  SegmentGates gates;
  EXPECT_EQ(gates.mapped(), 0);
  std::shared_ptr<SegmentGates::Gate> gate;
  auto first = gates.Map(Named(**seg), &gate);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gates.mapped(), 1);
  std::shared_ptr<SegmentGates::Gate> again_gate;
  auto again = gates.Map(Named(**seg), &again_gate);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), first->get());  // the same mapping
  EXPECT_EQ(again_gate, gate);
  const float x[3] = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE((*again)->Write(common::kSegmentHeaderBytes + 8, x, sizeof(x)).ok());
  EXPECT_EQ(std::memcmp((*seg)->at(common::kSegmentHeaderBytes + 8), x, sizeof(x)), 0);
  EXPECT_GT(gates.PeakSharedResidentBytes(), 0);
}

TEST(SegmentGatesTest, AnotherNameForTheSameNonceIsOpenedAfresh) {
  auto seg = common::SharedSegment::Create(8192);
  ASSERT_TRUE(seg.ok()) << seg.status();
  SegmentGates gates;
  std::shared_ptr<SegmentGates::Gate> gate;
  auto first = gates.Map(Named(**seg), &gate);
  ASSERT_TRUE(first.ok()) << first.status();
  // The same memfd under another descriptor: opened and checked again.
  const int dup_fd = dup((*seg)->fd());
  ASSERT_GE(dup_fd, 0);
  v1::SharedSegment other = Named(**seg);
  other.set_fd(dup_fd);
  auto second = gates.Map(other, &gate);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->get(), first->get());
  EXPECT_EQ(gates.mapped(), 1);  // one gate per segment
  // A wrong size is not served from the mapping: the open refuses it.
  v1::SharedSegment sized = Named(**seg);
  sized.set_size(sized.size() + 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(gates.Map(sized, &gate).status()));
  close(dup_fd);
  // A nonce nobody holds opens nothing and creates no gate.
  v1::SharedSegment unknown = Named(**seg);
  unknown.set_nonce(std::string(common::kSegmentNonceBytes, 'x'));
  std::shared_ptr<SegmentGates::Gate> none;
  EXPECT_TRUE(absl::IsFailedPrecondition(gates.Map(unknown, &none).status()));
  EXPECT_EQ(none, nullptr);
}

TEST(SegmentGatesTest, AnIdleMappingIsLetGoAndAUsedOneKept) {
  auto idle_seg = common::SharedSegment::Create(8192);
  auto busy_seg = common::SharedSegment::Create(8192);
  ASSERT_TRUE(idle_seg.ok() && busy_seg.ok());
  SegmentGates gates;
  std::shared_ptr<SegmentGates::Gate> idle_gate, busy_gate;
  ASSERT_TRUE(gates.Map(Named(**idle_seg), &idle_gate).ok());
  ASSERT_TRUE(gates.Map(Named(**busy_seg), &busy_gate).ok());
  ASSERT_EQ(gates.mapped(), 2);
  gates.set_idle_release(absl::Seconds(1));
  // Keep one in use (every 20 ms) until the other is let go.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (gates.mapped() == 2 && absl::Now() < deadline) {
    ASSERT_TRUE(gates.Map(Named(**busy_seg), &busy_gate).ok());
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(gates.mapped(), 1);
  {
    absl::MutexLock lock(&idle_gate->mu);
    EXPECT_EQ(idle_gate->file, nullptr);
  }
  {
    absl::MutexLock lock(&busy_gate->mu);
    EXPECT_NE(busy_gate->file, nullptr);
  }
  // Unused, the other goes too; the gates (with their pull ids) stay.
  ASSERT_TRUE(MappedBecomes(gates, 0));
  std::shared_ptr<SegmentGates::Gate> back;
  ASSERT_TRUE(gates.Map(Named(**idle_seg), &back).ok());
  EXPECT_EQ(back, idle_gate);
  EXPECT_EQ(gates.mapped(), 1);
}

}  // namespace
}  // namespace towerps::ps
