// ShmCallClient against a server side written by hand on the same memory
// (the channel's rings and words): a channel is used only once the server
// serves the generation offered; a call's messages and status come back; a
// server that stops serving it, stops bumping its heartbeat or writes
// garbage breaks the call (the channel is given up and offered afresh); a
// call past its deadline or cancelled ends with that status.
#include "worker/train/shm_call_client.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace towerps::worker::internal {
namespace {

using common::ShmCallHeader;
using common::ShmCallKind;
using common::ShmMethod;

constexpr absl::Duration kLong = absl::Seconds(20);
constexpr int64_t kOffset = 4096;

class ShmCallClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    void* m = mmap(nullptr, kOffset + common::kShmChannelBytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    base_ = static_cast<char*>(m);
    server().Reset();
  }
  void TearDown() override { munmap(base_, kOffset + common::kShmChannelBytes); }

  common::ShmChannelView server() { return common::ShmChannelView(base_ + kOffset); }

  // Offers the channel and serves the generation offered, as a server would.
  void Attach(ShmCallClient& c) {
    v1::SharedSegment seg;
    c.Offer(&seg);
    EXPECT_EQ(seg.channel_offset(), kOffset);
    server().served_generation().store(seg.channel_generation());
  }
  // The worker's next message, as the server reads it.
  std::pair<ShmCallHeader, std::string> Take() {
    std::string raw;
    absl::Status st = server().to_server().Read(&raw, absl::Now() + kLong);
    EXPECT_TRUE(st.ok()) << st;
    absl::string_view payload;
    auto h = common::DecodeShmCallHeader(raw, &payload);
    EXPECT_TRUE(h.ok()) << h.status();
    return {h.ok() ? *h : ShmCallHeader(), std::string(payload)};
  }
  void Answer(ShmCallKind kind, uint64_t call_id, const std::string& payload, uint32_t code = 0) {
    ShmCallHeader h;
    h.kind = kind;
    h.call_id = call_id;
    h.status_code = code;
    ASSERT_TRUE(
        server().to_worker().Write({common::EncodeShmCallHeader(h), payload}, absl::Now() + kLong)
            .ok());
  }

  char* base_ = nullptr;
};

const std::function<bool()> kNever = [] { return false; };

TEST_F(ShmCallClientTest, ReadyOnlyOnceTheServerServesTheGenerationOffered) {
  ShmCallClient c(base_, kOffset);
  EXPECT_FALSE(c.Ready());  // never offered
  v1::SharedSegment seg;
  c.Offer(&seg);
  EXPECT_EQ(seg.channel_generation(), 1u);
  EXPECT_FALSE(c.Ready());
  server().served_generation().store(1);
  EXPECT_TRUE(c.Ready());
  c.GiveUp();
  EXPECT_FALSE(c.Ready());
  c.Offer(&seg);  // afresh: a later generation
  EXPECT_EQ(seg.channel_generation(), 2u);
  EXPECT_FALSE(c.Ready());  // the server serves 1 still
  server().served_generation().store(2);
  EXPECT_TRUE(c.Ready());
}

TEST_F(ShmCallClientTest, ACallsMessagesAndStatusComeBack) {
  ShmCallClient c(base_, kOffset);
  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPush, kLong, "first", /*last=*/false));
  ASSERT_TRUE(c.Send("second", /*last=*/true));
  auto [open, p1] = Take();
  EXPECT_EQ(open.kind, ShmCallKind::kOpen);
  EXPECT_EQ(open.method, ShmMethod::kPush);
  EXPECT_FALSE(open.last);
  EXPECT_EQ(p1, "first");
  EXPECT_NEAR(static_cast<double>(open.timeout_us), 20e6, 1);
  auto [data, p2] = Take();
  EXPECT_EQ(data.kind, ShmCallKind::kData);
  EXPECT_EQ(data.call_id, open.call_id);
  EXPECT_TRUE(data.last);
  EXPECT_EQ(p2, "second");
  // A late message of an earlier call is skipped.
  Answer(ShmCallKind::kData, open.call_id - 1, "stale");
  Answer(ShmCallKind::kData, open.call_id, "reply");
  Answer(ShmCallKind::kStatus, open.call_id, "no such job",
         static_cast<uint32_t>(absl::StatusCode::kNotFound));
  std::string msg;
  absl::Status st;
  ASSERT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kMessage);
  EXPECT_EQ(msg, "reply");
  ASSERT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kStatus);
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_EQ(st.message(), "no such job");
  EXPECT_TRUE(c.Ready());  // an error of the call's own: the channel goes on
}

TEST_F(ShmCallClientTest, AServerThatStopsServingBreaksTheCall) {
  ShmCallClient c(base_, kOffset);
  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPull, kLong, "req", true));
  std::thread stop([&] {
    Take();
    server().served_generation().store(0);
  });
  std::string msg;
  absl::Status st;
  EXPECT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kBroken);
  stop.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_FALSE(c.Ready());
}

TEST_F(ShmCallClientTest, AServerWhoseHeartbeatStopsIsTakenAsGone) {
  ShmCallClient c(base_, kOffset);
  // A hundred times the beat below: only a server that stopped (or a
  // machine stalled for a second) reads as silent.
  c.set_server_silence(absl::Seconds(1));
  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPull, kLong, "req", true));
  // While the heartbeat goes on (2 s: twice the silence), the call waits
  // (the server is busy); then it stops.
  std::atomic<bool> beating{true};
  std::thread beat([&] {
    const absl::Time until = absl::Now() + absl::Seconds(2);
    while (absl::Now() < until) {
      server().heartbeat().fetch_add(1);
      absl::SleepFor(absl::Milliseconds(10));
    }
    beating = false;
  });
  std::string msg;
  absl::Status st;
  EXPECT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kBroken);
  EXPECT_FALSE(beating.load());  // not before the heartbeat stopped
  beat.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("heartbeat"), absl::string_view::npos) << st;
  EXPECT_FALSE(c.Ready());
}

// A server process that exits while a call waits breaks the call at once
// (its pid in the channel, watched through a pidfd), though the heartbeat's
// silence limit here is an hour.
TEST_F(ShmCallClientTest, AServerProcessThatExitsBreaksTheCallAtOnce) {
  ShmCallClient c(base_, kOffset);
  c.set_server_silence(absl::Hours(1));
  v1::SharedSegment seg;
  c.Offer(&seg);
  const pid_t child = fork();
  if (child == 0) {
    // The server: serves the generation offered, takes the call, exits.
    server().server_pid().store(static_cast<uint64_t>(getpid()));
    server().served_generation().store(seg.channel_generation());
    std::string raw;
    (void)server().to_server().Read(&raw, absl::Now() + kLong);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  const absl::Time deadline = absl::Now() + kLong;
  while (!c.Ready() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(c.Ready());
  ASSERT_TRUE(c.Start(ShmMethod::kPull, absl::Hours(1), "req", /*last=*/true));
  std::string m;
  absl::Status st;
  EXPECT_EQ(c.Receive(&m, &st, kNever), ShmCallClient::Got::kBroken);
  EXPECT_NE(st.message().find("the server process exited"), std::string::npos) << st;
  EXPECT_FALSE(c.Ready());  // given up: the call goes over gRPC, which offers it afresh
  int wstatus = 0;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
}

TEST_F(ShmCallClientTest, GarbageFromTheServerBreaksTheCall) {
  ShmCallClient c(base_, kOffset);
  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPull, kLong, "req", true));
  ASSERT_TRUE(server().to_worker().Write({"not a header"}, absl::Now() + kLong).ok());
  std::string msg;
  absl::Status st;
  EXPECT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kBroken);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_FALSE(c.Ready());
}

TEST_F(ShmCallClientTest, DeadlineAndCancellationEndTheCallWithTheirStatus) {
  ShmCallClient c(base_, kOffset);
  // No heartbeat here: only the deadline or the cancellation ends the calls.
  c.set_server_silence(absl::InfiniteDuration());
  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPull, absl::Milliseconds(100), "req", true));
  std::string msg;
  absl::Status st;
  EXPECT_EQ(c.Receive(&msg, &st, kNever), ShmCallClient::Got::kStatus);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_FALSE(c.Ready());  // the server may still be in that call

  Attach(c);
  ASSERT_TRUE(c.Start(ShmMethod::kPull, kLong, "req", true));
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    cancel = true;
    c.Wake();
  });
  EXPECT_EQ(c.Receive(&msg, &st, [&] { return cancel.load(); }), ShmCallClient::Got::kStatus);
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  canceller.join();
}

TEST_F(ShmCallClientTest, AFirstMessageTooLongForTheChannelLeavesItReady) {
  ShmCallClient c(base_, kOffset);
  Attach(c);
  const std::string huge(common::kShmChannelRingBytes, 'x');
  EXPECT_FALSE(c.Start(ShmMethod::kPull, kLong, huge, true));
  EXPECT_TRUE(c.Ready());  // the caller makes this call over gRPC
  EXPECT_FALSE(server().to_server().HasMessage());
}

}  // namespace
}  // namespace towerps::worker::internal
