#include "common/slice_writer.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace towerps::common {
namespace {

TEST(SliceWriterTest, SplitsAcrossMessagesAndReassembles) {
  std::vector<float> a(10), b(3);
  for (int i = 0; i < 10; ++i) a[i] = i;
  for (int i = 0; i < 3; ++i) b[i] = 100 + i;
  std::vector<v1::PullResponse> sent;
  v1::PullResponse msg;
  SliceWriter<v1::PullResponse> w(&msg, /*chunk_bytes=*/16, [&](const v1::PullResponse& m) {
    sent.push_back(m);
    return true;
  });
  ASSERT_TRUE(w.Add(0, a.data(), 10));
  ASSERT_TRUE(w.Add(1, b.data(), 3));
  ASSERT_TRUE(w.Finish());
  // 52 bytes in 16-byte messages: 16, 16, 16, 4.
  ASSERT_EQ(sent.size(), 4u);
  std::vector<float> ra(10, -1), rb(3, -1);
  for (const auto& m : sent) {
    int64_t bytes = 0;
    for (const auto& s : m.slices()) {
      float* dst = (s.var_index() == 0 ? ra.data() : rb.data()) + s.offset();
      std::memcpy(dst, s.data().data(), s.data().size());
      bytes += s.data().size();
    }
    EXPECT_LE(bytes, 16);
  }
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  // The third message carries the end of var 0 and the start of var 1.
  EXPECT_EQ(sent[2].slices_size(), 2);
}

TEST(SliceWriterTest, StopsAfterAFailedFlushAndCanSendEmpty) {
  std::vector<float> a(100, 1.0f);
  int flushes = 0;
  v1::PushRequest msg;
  SliceWriter<v1::PushRequest> w(&msg, 40, [&](const v1::PushRequest&) { return ++flushes < 2; });
  EXPECT_FALSE(w.Add(0, a.data(), 100));
  EXPECT_EQ(flushes, 2);
  EXPECT_FALSE(w.Finish());

  int empty = 0;
  v1::PullResponse m2;
  SliceWriter<v1::PullResponse> e(&m2, 40, [&](const v1::PullResponse& m) {
    empty += m.slices_size() == 0;
    return true;
  });
  EXPECT_TRUE(e.Finish(/*even_if_empty=*/true));
  EXPECT_EQ(empty, 1);
}

}  // namespace
}  // namespace towerps::common
