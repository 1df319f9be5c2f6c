#include "ps/publication.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace towerps::ps {
namespace {

TEST(PublicationTest, VariablesBecomeReadyInOrderAndNeverGoBack) {
  Publication p;
  EXPECT_FALSE(p.Ready(0));
  p.Publish(2);
  EXPECT_TRUE(p.Ready(0));
  EXPECT_TRUE(p.Ready(1));
  EXPECT_FALSE(p.Ready(2));
  p.Publish(1);  // a smaller count does not take variable 1 back
  EXPECT_TRUE(p.Ready(1));
  p.Await(1);  // ready: returns at once
}

TEST(PublicationTest, AwaitReturnsOnceItsVariableIsPublished) {
  Publication p;
  absl::Notification started, returned;
  std::thread waiter([&] {
    started.Notify();
    p.Await(2);
    returned.Notify();
  });
  started.WaitForNotification();
  p.Publish(2);  // variables 0 and 1: the waiter's is not among them
  EXPECT_FALSE(p.Ready(2));
  EXPECT_FALSE(returned.HasBeenNotified());
  p.Publish(3);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  waiter.join();
}

}  // namespace
}  // namespace towerps::ps
