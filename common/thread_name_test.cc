#include "common/thread_name.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string mine = CurrentThreadName();
  std::string seen, after;
  std::thread t([&] {
    SetCurrentThreadName("push ps1");
    seen = CurrentThreadName();
  });
  t.join();
  EXPECT_EQ(seen, "push ps1");
  EXPECT_EQ(CurrentThreadName(), mine);
}

TEST(ThreadNameTest, LongNamesAreCutAtTheKernelsLimit) {
  std::string seen;
  std::thread t([&] {
    SetCurrentThreadName("a-thread-name-longer-than-fifteen");
    seen = CurrentThreadName();
  });
  t.join();
  EXPECT_EQ(seen, "a-thread-name-l");
}

}  // namespace
}  // namespace towerps::common
