#include "common/tensor_wire.h"

#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a buffer of slices of `piece` bytes each (as a transport might
// hand them over: fields and payloads split anywhere).
grpc::ByteBuffer Pieces(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(TensorWireTest, WrittenMessagesAreProtobufAndRespectTheChunk) {
  const std::vector<float> a = Iota(10, 1), b = Iota(3, 100);
  std::vector<std::string> sent;
  TensorWireWriter w(/*slices_field=*/2, /*chunk_bytes=*/16, [&](const grpc::ByteBuffer& m) {
    sent.push_back(Flatten(m));
    return true;
  });
  std::string prefix;
  AppendVarintField(1, 42, &prefix);
  w.set_prefix(prefix);
  ASSERT_TRUE(w.Add(0, a.data(), 10));
  ASSERT_TRUE(w.Add(7, b.data(), 3, /*first=*/5));
  ASSERT_TRUE(w.Finish());
  // 52 bytes of payload in messages of at most 16.
  ASSERT_EQ(sent.size(), 4u);
  std::vector<float> got_a(10, -1), got_b(8, -1);
  for (const auto& bytes : sent) {
    v1::PullResponse m;
    ASSERT_TRUE(m.ParseFromString(bytes));
    EXPECT_EQ(m.global_step(), 42);
    int64_t payload = 0;
    for (const auto& s : m.slices()) {
      payload += s.data().size();
      std::vector<float>& dst = s.var_index() == 0 ? got_a : got_b;
      ASSERT_LE(s.offset() + s.data().size() / 4, dst.size());
      std::memcpy(dst.data() + s.offset(), s.data().data(), s.data().size());
    }
    EXPECT_LE(payload, 16);
  }
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(std::vector<float>(got_b.begin() + 5, got_b.end()), b);
}

TEST(TensorWireTest, FinishCanSendAnEmptyMessageAndStopsAfterAFailedFlush) {
  int flushes = 0;
  TensorWireWriter empty(2, 4096, [&](const grpc::ByteBuffer&) { return ++flushes > 0; });
  EXPECT_TRUE(empty.Finish());
  EXPECT_EQ(flushes, 0);
  EXPECT_TRUE(empty.Finish(/*even_if_empty=*/true));
  EXPECT_EQ(flushes, 1);

  const std::vector<float> v = Iota(100, 0);
  int calls = 0;
  TensorWireWriter failing(2, 40, [&](const grpc::ByteBuffer&) { return ++calls < 2; });
  EXPECT_FALSE(failing.Add(0, v.data(), 100));
  EXPECT_EQ(calls, 2);  // nothing sent after the failure
  EXPECT_FALSE(failing.Finish());
}

TEST(TensorWireTest, MessagesHoldKeepAliveUntilReleased) {
  auto values = std::make_shared<std::vector<float>>(Iota(64, 0));
  std::vector<grpc::ByteBuffer> held;
  {
    TensorWireWriter w(2, 64, [&](const grpc::ByteBuffer& m) {
      held.push_back(m);
      return true;
    });
    ASSERT_TRUE(w.Add(0, values->data(), 64, 0, values));
    ASSERT_TRUE(w.Finish());
  }
  EXPECT_GT(values.use_count(), 1);
  held.clear();
  EXPECT_EQ(values.use_count(), 1);
}

// The exact bytes of float payloads (what every uncompressed push and pull
// sends): a TensorSlice per chunk with var_index and offset always written.
TEST(TensorWireTest, FloatPayloadBytesAreExactlyTheseTwoMessages) {
  const std::vector<float> v = {1.0f, 2.0f, 3.0f};
  std::vector<std::string> sent;
  TensorWireWriter w(2, /*chunk_bytes=*/8, [&](const grpc::ByteBuffer& m) {
    sent.push_back(Flatten(m));
    return true;
  });
  std::string prefix;
  AppendVarintField(1, 5, &prefix);
  w.set_prefix(prefix);
  ASSERT_TRUE(w.Add(1, v.data(), 3));
  ASSERT_TRUE(w.Finish());
  const std::string payload(reinterpret_cast<const char*>(v.data()), 12);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0], std::string("\x08\x05\x12\x0e\x08\x01\x10\x00\x1a\x08", 10) +
                         payload.substr(0, 8));
  EXPECT_EQ(sent[1], std::string("\x08\x05\x12\x0a\x08\x01\x10\x02\x1a\x04", 10) +
                         payload.substr(8));
}

// Encoded payloads go out whole, one TensorSlice each, in a new message when
// the current one would pass the chunk; a reader gets on_slice_end after
// each payload is copied (where it decodes it).
TEST(TensorWireTest, EncodedPayloadsAreNeverSplitAndEndEachSlice) {
  const std::string a(10, 'a'), b(9, 'b'), c(30, 'c');
  std::vector<std::string> sent;
  TensorWireWriter w(/*slices_field=*/2, /*chunk_bytes=*/20, [&](const grpc::ByteBuffer& m) {
    sent.push_back(Flatten(m));
    return true;
  });
  ASSERT_TRUE(w.AddEncoded(0, 0, a.data(), 10));
  ASSERT_TRUE(w.AddEncoded(0, 7, b.data(), 9));   // 19 <= 20: same message
  ASSERT_TRUE(w.AddEncoded(1, 3, c.data(), 30));  // a message of its own, sent at once
  ASSERT_TRUE(w.AddEncoded(2, 0, a.data(), 0));   // an empty payload
  ASSERT_TRUE(w.Finish());
  ASSERT_EQ(sent.size(), 3u);
  std::vector<std::vector<std::tuple<uint32_t, uint64_t, std::string>>> got;
  for (const auto& bytes : sent) {
    v1::PushRequest m;
    ASSERT_TRUE(m.ParseFromString(bytes));
    got.emplace_back();
    for (const auto& s : m.slices()) got.back().emplace_back(s.var_index(), s.offset(), s.data());
  }
  using Slice = std::tuple<uint32_t, uint64_t, std::string>;
  EXPECT_EQ(got[0], (std::vector<Slice>{{0, 0, a}, {0, 7, b}}));
  EXPECT_EQ(got[1], (std::vector<Slice>{{1, 3, c}}));
  EXPECT_EQ(got[2], (std::vector<Slice>{{2, 0, ""}}));

  // The reader: on_slice_end sees each payload already copied.
  std::string buffer(64, '\0');
  std::vector<std::string> ended;
  uint64_t last = 0;
  TensorWireHandler h;
  h.on_slice = [&](uint32_t, uint64_t, uint64_t n) -> absl::StatusOr<char*> {
    last = n;
    return buffer.data();
  };
  h.on_slice_end = [&]() -> absl::Status {
    ended.push_back(buffer.substr(0, last));
    return ended.size() == 5 ? absl::DataLossError("stop") : absl::OkStatus();
  };
  for (const auto& bytes : sent) ASSERT_TRUE(ReadTensorMessage(Pieces(bytes, 3), 2, h).ok());
  EXPECT_EQ(ended, (std::vector<std::string>{a, b, c, ""}));
  EXPECT_TRUE(absl::IsDataLoss(ReadTensorMessage(Pieces(sent[0], 5), 2, h)));
}

// Reads `bytes` split into pieces of every size from 1 to 9 bytes.
struct Read {
  uint64_t step = 0;
  std::string header;
  std::vector<float> values;
  std::vector<std::pair<uint32_t, uint64_t>> slices;  // (var, offset)
};

absl::Status ReadAll(const grpc::ByteBuffer& b, Read* r, size_t room = 1000) {
  r->values.assign(room, -1);
  TensorWireHandler h;
  h.on_varint = [&](int field, uint64_t v) {
    if (field == 1) r->step = v;
    return absl::OkStatus();
  };
  h.on_bytes = [&](int field, std::string s) {
    if (field == 1) r->header = s;
    return absl::OkStatus();
  };
  h.on_slice = [&](uint32_t var, uint64_t offset, uint64_t n) -> absl::StatusOr<char*> {
    r->slices.emplace_back(var, offset);
    if (offset + n / 4 > r->values.size()) return absl::OutOfRangeError("no room");
    return reinterpret_cast<char*>(r->values.data() + offset);
  };
  return ReadTensorMessage(b, 2, h);
}

TEST(TensorWireTest, ReadsProtobufEncodingsSplitAnywhere) {
  v1::PushRequest m;
  m.mutable_header()->set_job_id("job-1");
  m.mutable_header()->set_sequence(9);
  const std::vector<float> a = Iota(7, 3);
  auto* s = m.add_slices();
  s->set_var_index(0);  // default: not on the wire
  s->set_offset(2);
  s->set_data(std::string(reinterpret_cast<const char*>(a.data()), a.size() * 4));
  auto* e = m.add_slices();  // an empty slice
  e->set_var_index(3);
  e->set_offset(11);
  const std::string bytes = m.SerializeAsString();
  for (size_t piece = 1; piece <= 9; ++piece) {
    Read r;
    ASSERT_TRUE(ReadAll(Pieces(bytes, piece), &r).ok()) << piece;
    v1::PushHeader h;
    ASSERT_TRUE(h.ParseFromString(r.header));
    EXPECT_EQ(h.job_id(), "job-1");
    EXPECT_EQ(h.sequence(), 9u);
    EXPECT_EQ(std::vector<float>(r.values.begin() + 2, r.values.begin() + 9), a);
    EXPECT_EQ(r.values[1], -1);
    EXPECT_EQ(r.values[9], -1);
    EXPECT_EQ(r.slices, (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}, {3, 11}}));
  }
}

TEST(TensorWireTest, EveryTruncationIsAnErrorNotACrash) {
  v1::PullResponse m;
  m.set_global_step(300);
  const std::vector<float> a = Iota(5, 1);
  auto* s = m.add_slices();
  s->set_var_index(1);
  s->set_offset(4);
  s->set_data(std::string(reinterpret_cast<const char*>(a.data()), a.size() * 4));
  const std::string bytes = m.SerializeAsString();
  for (size_t len = 1; len < bytes.size(); ++len) {
    if (len == 3) continue;  // the step alone is a whole message
    Read r;
    const absl::Status st = ReadAll(Pieces(bytes.substr(0, len), 4), &r);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << len << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("malformed tensor message")) << len;
  }
  Read whole;
  ASSERT_TRUE(ReadAll(Pieces(bytes, 4), &whole).ok());
  EXPECT_EQ(whole.step, 300u);
}

TEST(TensorWireTest, RefusesDataBeforeItsIndexAndPassesHandlerErrors) {
  // TensorSlice {data: 4 bytes, var_index: 1}: legal protobuf, not accepted.
  std::string inner = std::string("\x1a\x04", 2) + std::string(4, '\0') + "\x08\x01";
  std::string msg = "\x12" + std::string(1, static_cast<char>(inner.size())) + inner;
  Read r;
  absl::Status st = ReadAll(Pieces(msg, 100), &r);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("after its data"));

  v1::PullResponse m;
  auto* s = m.add_slices();
  s->set_offset(999);
  s->set_data(std::string(8, 'x'));
  Read small;
  st = ReadAll(Pieces(m.SerializeAsString(), 3), &small, /*room=*/10);
  EXPECT_TRUE(absl::IsOutOfRange(st)) << st;
}

TEST(TensorWireTest, SkipsUnknownFieldsAndRefusesGroups) {
  v1::PullResponse m;
  m.set_global_step(7);
  std::string bytes = m.SerializeAsString();
  bytes += std::string("\x1d") + std::string(4, 'z');  // field 3, fixed32
  bytes += std::string("\x21") + std::string(8, 'z');  // field 4, fixed64
  bytes += std::string("\x2a\x02zz");                  // field 5, bytes
  Read r;
  ASSERT_TRUE(ReadAll(Pieces(bytes, 2), &r).ok());
  EXPECT_EQ(r.step, 7u);
  EXPECT_TRUE(absl::IsInvalidArgument(ReadAll(Pieces("\x0b", 1), &r)));  // start group
  EXPECT_TRUE(absl::IsInvalidArgument(ReadAll(Pieces(std::string("\0", 1), 1), &r)));
}

}  // namespace
}  // namespace towerps::common
