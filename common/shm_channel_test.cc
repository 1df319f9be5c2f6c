#include "common/shm_channel.h"

#include <sys/mman.h>

#include <string>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(ShmChannelTest, HeaderRoundTrips) {
  ShmCallHeader h;
  h.kind = ShmCallKind::kOpen;
  h.method = ShmMethod::kPush;
  h.last = true;
  h.call_id = 0x0123456789abcdefULL;
  h.timeout_us = 60'000'000;
  const std::string bytes = EncodeShmCallHeader(h) + "payload";
  absl::string_view payload;
  absl::StatusOr<ShmCallHeader> back = DecodeShmCallHeader(bytes, &payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, ShmCallKind::kOpen);
  EXPECT_EQ(back->method, ShmMethod::kPush);
  EXPECT_TRUE(back->last);
  EXPECT_EQ(back->call_id, h.call_id);
  EXPECT_EQ(back->timeout_us, h.timeout_us);
  EXPECT_EQ(payload, "payload");

  ShmCallHeader st;
  st.kind = ShmCallKind::kStatus;
  st.status_code = static_cast<uint32_t>(absl::StatusCode::kNotFound);
  st.call_id = 7;
  back = DecodeShmCallHeader(EncodeShmCallHeader(st), &payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, ShmCallKind::kStatus);
  EXPECT_FALSE(back->last);
  EXPECT_EQ(back->status_code, st.status_code);
  EXPECT_EQ(back->call_id, 7u);
  EXPECT_TRUE(payload.empty());
}

// What the other process wrote cannot be trusted: each way a header can be
// wrong is DataLoss naming it.
TEST(ShmChannelTest, BadHeadersAreDataLoss) {
  absl::string_view payload;
  EXPECT_TRUE(absl::IsDataLoss(DecodeShmCallHeader("short", &payload).status()));
  ShmCallHeader h;
  h.kind = ShmCallKind::kOpen;
  const std::string good = EncodeShmCallHeader(h);
  ASSERT_TRUE(DecodeShmCallHeader(good, &payload).ok());
  struct Case {
    size_t at;
    char value;
    const char* names;
  };
  for (const Case& c : {Case{0, 0, "kind"}, Case{0, 9, "kind"}, Case{1, 3, "method"},
                        Case{1, 0, "method"}, Case{2, 2, "last"}, Case{4, 17, "status code"}}) {
    std::string bad = good;
    bad[c.at] = c.value;
    absl::Status st = DecodeShmCallHeader(bad, &payload).status();
    EXPECT_TRUE(absl::IsDataLoss(st)) << c.names << ": " << st;
    EXPECT_NE(st.message().find(c.names), absl::string_view::npos) << st;
  }
}

TEST(ShmChannelTest, ResetEmptiesTheRingsAndZeroesTheWords) {
  void* m = mmap(nullptr, kShmChannelBytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  char* base = static_cast<char*>(m);
  ShmChannelView view(base);
  view.Reset();
  view.served_generation().store(3);
  view.heartbeat().store(9);
  ASSERT_TRUE(view.to_server().Write({"a"}, absl::Now()).ok());
  ASSERT_TRUE(view.to_worker().Write({"b"}, absl::Now()).ok());
  EXPECT_TRUE(view.to_server().HasMessage());
  // The two rings are apart: each holds only its own message.
  std::string got;
  ASSERT_TRUE(view.to_worker().Read(&got, absl::Now()).ok());
  EXPECT_EQ(got, "b");
  EXPECT_FALSE(view.to_worker().HasMessage());
  view.Reset();
  EXPECT_EQ(view.served_generation().load(), 0u);
  EXPECT_EQ(view.heartbeat().load(), 0u);
  EXPECT_FALSE(view.to_server().HasMessage());
  EXPECT_TRUE(absl::IsDeadlineExceeded(view.to_server().Read(&got, absl::Now())));
  munmap(m, kShmChannelBytes);
}

}  // namespace
}  // namespace towerps::common
