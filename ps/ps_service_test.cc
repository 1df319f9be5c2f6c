// ParameterService over real gRPC on loopback: chunked pulls, retried pushes
// applied once, malformed streams rejected without touching state.
#include "ps/ps_service.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/shared_segment.h"
#include "common/tensor_wire.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/ps_wire.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {
namespace {

// The first message of a push from worker 0 (incarnation 1) of one example.
v1::PushRequest HeaderMessage(uint64_t seq, const std::string& job_id = "j") {
  v1::PushRequest m;
  auto* h = m.mutable_header();
  h->set_job_id(job_id);
  h->set_incarnation(1);
  h->set_sequence(seq);
  h->set_num_examples(1);
  return m;
}

class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<ParameterServiceImpl>(ps_, /*default_chunk_bytes=*/4096);
    int port = 0;
    auto s = common::StartServer("127.0.0.1:0", {service_.get()}, &port);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    channel_ = common::NewChannel("127.0.0.1:" + std::to_string(port));
    stub_ = v1::ParameterService::NewStub(channel_);
    v1::RegisterRequest r;
    r.set_job_id("j");
    r.mutable_config()->set_mode(v1::ASYNC);
    r.mutable_config()->set_num_workers(1);
    r.mutable_config()->mutable_optimizer()->set_learning_rate(1.0f);
    auto* v = r.add_variables();
    v->set_name("big");
    v->add_shape(5000);  // 20000 bytes: several 4096-byte chunks
    v->set_dtype(v1::DT_FLOAT32);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->RegisterVariables(&ctx, r, &resp).ok());
  }
  void TearDown() override { server_->Shutdown(); }

  // How a push announces and sends its commit message (issue 16).
  enum class Commit { kNone, kAnnouncedAndSent, kAnnouncedNotSent, kSentThenMore };

  // Streams a push of `values` (one per element) in 1000-element slices.
  grpc::Status Push(uint64_t seq, float value, v1::PushResponse* resp,
                    int elements = 5000, bool header = true, Commit commit = Commit::kNone) {
    grpc::ClientContext ctx;
    auto w = stub_->Push(&ctx, resp);
    v1::PushRequest m;
    if (header) {
      m = HeaderMessage(seq);
      m.mutable_header()->set_ends_with_commit(commit != Commit::kNone);
    }
    w->Write(m);
    if (commit == Commit::kSentThenMore) {
      v1::PushRequest c;
      c.set_commit(true);
      w->Write(c);
    }
    std::vector<float> chunk(1000, value);
    for (int off = 0; off < elements; off += 1000) {
      v1::PushRequest s;
      auto* sl = s.add_slices();
      sl->set_offset(off);
      sl->set_data(chunk.data(), std::min(1000, elements - off) * 4);
      w->Write(s);
    }
    if (commit == Commit::kAnnouncedAndSent) {
      v1::PushRequest c;
      c.set_commit(true);
      w->Write(c);
    }
    w->WritesDone();
    return w->Finish();
  }

  std::vector<float> Pull(int* messages) {
    grpc::ClientContext ctx;
    v1::PullRequest req;
    req.set_job_id("j");
    auto r = stub_->Pull(&ctx, req);
    std::vector<float> out(5000, -99.0f);
    v1::PullResponse m;
    *messages = 0;
    while (r->Read(&m)) {
      ++*messages;
      for (const auto& s : m.slices()) {
        std::memcpy(out.data() + s.offset(), s.data().data(), s.data().size());
      }
    }
    EXPECT_TRUE(r->Finish().ok());
    return out;
  }

  // The segment's pushes come from this very process: updated ahead all
  // the same, as from a worker on cores apart (ps/push_session.h, "Updates ahead").
  static ParameterServerOptions Options() {
    ParameterServerOptions o;
    o.as_if_on_cores_apart = true;
    return o;
  }
  ParameterServer ps_{Options()};
  std::unique_ptr<ParameterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterService::Stub> stub_;
};

// A client that cancels its waiting pull frees the server's thread at once,
// not at the pull's deadline (max_pull_wait: 30 s here).
TEST_F(PsServiceTest, ACancelledPullStopsWaiting) {
  auto pulls_waiting = [this] {
    v1::StatusRequest req;
    req.set_job_id("j");
    const v1::StatusResponse st = ps_.Status(req);
    return st.jobs_size() == 1 ? st.jobs(0).pulls_waiting() : -1;
  };
  auto wait_until = [](const std::function<bool()>& done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!done() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    return done();
  };
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::PullRequest req;
  req.set_job_id("j");
  req.set_min_step(5);  // never reached: nobody pushes
  auto reader = stub_->Pull(&ctx, req);
  ASSERT_TRUE(wait_until([&] { return pulls_waiting() == 1; }));
  ctx.TryCancel();
  v1::PullResponse m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(wait_until([&] { return pulls_waiting() == 0; }))
      << "the server still waits for the cancelled pull's step";
  int messages = 0;
  EXPECT_EQ(Pull(&messages).size(), 5000u);  // the job serves the next pull
}

TEST_F(PsServiceTest, PullIsChunkedAndComplete) {
  int messages = 0;
  std::vector<float> w = Pull(&messages);
  EXPECT_EQ(messages, 5);  // ceil(20000 / 4096)
  for (float x : w) EXPECT_EQ(x, 0.0f);
}

TEST_F(PsServiceTest, RetriedPushOverTheWireIsAppliedOnce) {
  v1::PushResponse resp;
  ASSERT_TRUE(Push(1, 2.0f, &resp).ok());
  EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  ASSERT_TRUE(Push(1, 2.0f, &resp).ok());  // the retry
  EXPECT_EQ(resp.outcome(), v1::PushResponse::DUPLICATE);
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_FLOAT_EQ(x, -2.0f);  // lr 1, applied once
}

// Issue 16: a worker streams each layer's gradient as backward produces it
// and commits the push once the whole step was announced; a stream that
// announced a commit and ended without it was abandoned (its step failed part
// way) and changes nothing, even though every element arrived.
TEST_F(PsServiceTest, PushAnnouncingACommitIsAppliedOnlyWithIt) {
  v1::PushResponse resp;
  grpc::Status s = Push(1, 2.0f, &resp, 5000, true, Commit::kAnnouncedNotSent);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_NE(s.error_message().find("ended without its commit"), std::string::npos)
      << s.error_message();
  s = Push(1, 2.0f, &resp, 5000, true, Commit::kSentThenMore);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("after the commit"), std::string::npos) << s.error_message();
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_EQ(x, 0.0f);  // nothing applied
  ASSERT_TRUE(Push(1, 2.0f, &resp, 5000, true, Commit::kAnnouncedAndSent).ok());
  EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  for (float x : Pull(&messages)) ASSERT_FLOAT_EQ(x, -2.0f);
}

TEST_F(PsServiceTest, MalformedStreamsAreRejectedAndChangeNothing) {
  v1::PushResponse resp;
  grpc::Status s = Push(1, 2.0f, &resp, /*elements=*/3000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("incomplete"), std::string::npos) << s.error_message();
  s = Push(1, 2.0f, &resp, 5000, /*header=*/false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("header"), std::string::npos);
  {
    grpc::ClientContext ctx;
    auto w = stub_->Push(&ctx, &resp);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // A NaN in the payload (caught as its message arrives) and bytes that are
  // not a PushRequest at all.
  s = Push(1, std::numeric_limits<float>::quiet_NaN(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("NaN or Inf"), std::string::npos) << s.error_message();
  {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> w(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel_.get(),
            grpc::internal::RpcMethod(v1::ps_wire::PushMethod(),
                                      grpc::internal::RpcMethod::CLIENT_STREAMING),
            &ctx, &resp));
    grpc::Slice junk(std::string("\x0a\xff\xff\xff\xff\x0f", 6));  // a header of 4 GiB
    w->Write(grpc::ByteBuffer(&junk, 1));
    w->WritesDone();
    s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("malformed tensor message"), std::string::npos)
        << s.error_message();
  }
  // The server is still up and the weights are untouched.
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_EQ(x, 0.0f);
  v1::StatusResponse st;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetStatus(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_EQ(st.jobs(0).global_step(), 0);
}

// Compressed pushes (issue 16), sent by protobuf's own client: a top-k push
// in two slices applies its decoded gradient (zeros between the entries).
std::string TopK(uint32_t length, const std::vector<uint32_t>& indices,
                 const std::vector<float>& values) {
  std::string out(reinterpret_cast<const char*>(&length), 4);
  for (uint32_t i : indices) out.append(reinterpret_cast<const char*>(&i), 4);
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

grpc::Status PushEncoded(v1::ParameterService::Stub& stub, v1::SliceEncoding encoding,
                         const std::vector<std::pair<uint64_t, std::string>>& slices,
                         v1::PushResponse* resp) {
  grpc::ClientContext ctx;
  auto w = stub.Push(&ctx, resp);
  v1::PushRequest m = HeaderMessage(1);
  m.mutable_header()->set_slice_encoding(encoding);
  w->Write(m);
  for (const auto& [offset, data] : slices) {
    v1::PushRequest s;
    auto* sl = s.add_slices();
    sl->set_offset(offset);
    sl->set_data(data);
    w->Write(s);
  }
  w->WritesDone();
  return w->Finish();
}

TEST_F(PsServiceTest, CompressedPushOverTheWireAppliesTheDecodedGradient) {
  v1::PushResponse resp;
  const grpc::Status s =
      PushEncoded(*stub_, v1::SLICE_TOPK,
                  {{0, TopK(2500, {7}, {3.0f})}, {2500, TopK(2500, {0, 2499}, {-1.0f, 0.5f})}},
                  &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  int messages = 0;
  const std::vector<float> w = Pull(&messages);
  for (int i = 0; i < 5000; ++i) {
    const float want = i == 7 ? -3.0f : i == 2500 ? 1.0f : i == 4999 ? -0.5f : 0.0f;
    ASSERT_EQ(w[i], want) << i;  // lr 1
  }
}

TEST_F(PsServiceTest, MalformedCompressedPushesAreInvalidArgumentAndChangeNothing) {
  v1::PushResponse resp;
  grpc::Status s = PushEncoded(*stub_, v1::SLICE_TOPK, {{0, TopK(5000, {10, 5}, {1, 1})}}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("variable 0 from worker 0 at element 0: top-k slice: indices "
                                   "are not strictly increasing"),
            std::string::npos)
      << s.error_message();
  const uint16_t inf = 0x7c00;
  s = PushEncoded(*stub_, v1::SLICE_FLOAT16,
                  {{0, std::string(reinterpret_cast<const char*>(&inf), 2)}}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("float16 slice: value 0 is Inf or NaN"), std::string::npos)
      << s.error_message();
  s = PushEncoded(*stub_, static_cast<v1::SliceEncoding>(9), {{0, TopK(5000, {1}, {1})}}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown slice_encoding 9"), std::string::npos)
      << s.error_message();
  s = PushEncoded(*stub_, v1::SLICE_TOPK, {{0, TopK(4000, {1}, {1})}}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("incomplete"), std::string::npos) << s.error_message();
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_EQ(x, 0.0f);
  v1::StatusResponse st;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetStatus(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_EQ(st.jobs(0).global_step(), 0);
  EXPECT_EQ(st.jobs(0).pushes_applied(), 0);
}

// The push bytes the metrics count are the payload as it was on the wire:
// 2 bytes per element for float16.
TEST(PushStreamDecoderTest, CountsPayloadBytesAsOnTheWire) {
  ParameterServer ps({});
  v1::RegisterRequest r;
  r.set_job_id("j");
  r.mutable_config()->set_num_workers(1);
  auto* v = r.add_variables();
  v->set_name("v");
  v->add_shape(1000);
  v->set_dtype(v1::DT_FLOAT32);
  ASSERT_TRUE(ps.Register(r).ok());
  const std::vector<std::pair<v1::SliceEncoding, int>> cases = {
      {v1::SLICE_FLOAT32, 4000}, {v1::SLICE_FLOAT16, 2000}, {v1::SLICE_TOPK, 4 + 8}};
  for (const auto& [encoding, bytes] : cases) {
    v1::PushRequest m;
    auto* h = m.mutable_header();
    h->set_job_id("j");
    h->set_incarnation(static_cast<uint64_t>(encoding) + 1);
    h->set_sequence(1);
    h->set_num_examples(1);
    h->set_slice_encoding(encoding);
    m.add_slices()->set_data(encoding == v1::SLICE_TOPK ? TopK(1000, {3}, {1.0f})
                                                          : std::string(bytes, '\0'));
    PushStreamDecoder decoder(ps);
    ASSERT_TRUE(decoder.Add(common::ToByteBuffer(m)).ok());
    ASSERT_TRUE(decoder.Finish().ok());
    EXPECT_EQ(decoder.bytes(), bytes) << encoding;
  }
}

// A bad moving-average definition (a wire value the server must not trust)
// is INVALID_ARGUMENT over the wire; the server keeps serving.
TEST_F(PsServiceTest, BadMovingAverageDecayIsInvalidArgument) {
  for (float decay : {1.0f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(decay);
    v1::RegisterRequest r;
    r.set_job_id("bn");
    r.mutable_config()->set_num_workers(1);
    auto* v = r.add_variables();
    v->set_name("bn/moving_var");
    v->add_shape(4);
    v->set_dtype(v1::DT_FLOAT32);
    v->set_update(v1::VariableDef::MOVING_AVERAGE);
    v->set_moving_average_decay(decay);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->RegisterVariables(&ctx, r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("\"bn/moving_var\": moving_average_decay"),
              std::string::npos)
        << s.error_message();
  }
  v1::StatusResponse st;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetStatus(&ctx, v1::StatusRequest(), &st).ok());
  ASSERT_EQ(st.jobs_size(), 1);  // Only "j".
  EXPECT_EQ(st.jobs(0).job_id(), "j");
}

// What a pull that names a shared segment got back.
struct SegmentPull {
  std::vector<uint32_t> in_segment;  // segment_vars, in order
  std::vector<float> sliced;         // values that came as slices (-99: none)
  std::string error;                 // segment_error
  int messages = 0;
  int64_t step = -1;
};

class PsServiceSegmentTest : public PsServiceTest {
 protected:
  void SetUp() override {
    PsServiceTest::SetUp();
    auto seg = common::SharedSegment::Create(64 + 5000 * 4);
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    // The variable's values after one push of 2 with lr 1: -2.
    v1::PushResponse resp;
    ASSERT_TRUE(Push(1, 2.0f, &resp).ok());
    std::memset(segment_->mutable_at(common::kSegmentHeaderBytes), 0x7f, 64 + 5000 * 4);
  }
  v1::SharedSegment Segment(uint64_t pull_id) const {
    v1::SharedSegment s;
    s.set_pid(segment_->pid());
    s.set_fd(segment_->fd());
    s.set_nonce(segment_->nonce());
    s.set_size(segment_->size());
    s.add_offsets(kAt);
    s.set_pull_id(pull_id);
    return s;
  }
  SegmentPull PullInto(const v1::SharedSegment& segment) {
    grpc::ClientContext ctx;
    v1::PullRequest req;
    req.set_job_id("j");
    *req.mutable_segment() = segment;
    auto r = stub_->Pull(&ctx, req);
    SegmentPull out;
    out.sliced.assign(5000, -99.0f);
    v1::PullResponse m;
    while (r->Read(&m)) {
      if (out.messages++ == 0) {
        out.step = m.global_step();
        out.error = m.segment_error();
      }
      for (uint32_t v : m.segment_vars()) out.in_segment.push_back(v);
      for (const auto& s : m.slices()) {
        std::memcpy(out.sliced.data() + s.offset(), s.data().data(), s.data().size());
      }
    }
    EXPECT_TRUE(r->Finish().ok());
    return out;
  }
  // The variable as it stands in the segment.
  std::vector<float> InSegment() const {
    std::vector<float> v(5000);
    std::memcpy(v.data(), segment_->at(kAt), v.size() * 4);
    return v;
  }
  bool SegmentUntouched() const {
    const char* p = segment_->at(common::kSegmentHeaderBytes);
    for (int i = 0; i < 64 + 5000 * 4; ++i) {
      if (p[i] != 0x7f) return false;
    }
    return true;
  }

  static constexpr int64_t kAt = common::kSegmentHeaderBytes + 64;
  std::unique_ptr<common::SharedSegment> segment_;
};

TEST_F(PsServiceSegmentTest, PullWritesIntoTheWorkersSegment) {
  const SegmentPull p = PullInto(Segment(1));
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.in_segment, std::vector<uint32_t>{0});
  EXPECT_EQ(p.step, 1);
  for (float x : p.sliced) ASSERT_EQ(x, -99.0f);  // no slices at all
  for (float x : InSegment()) ASSERT_EQ(x, -2.0f);
  // The bytes before the variable's offset were not written.
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(segment_->at(common::kSegmentHeaderBytes)[i], 0x7f) << i;
  }
  // And again, after another update, with the next pull_id.
  v1::PushResponse resp;
  ASSERT_TRUE(Push(2, 1.0f, &resp).ok());
  const SegmentPull q = PullInto(Segment(2));
  EXPECT_EQ(q.in_segment, std::vector<uint32_t>{0});
  for (float x : InSegment()) ASSERT_EQ(x, -3.0f);
}

TEST_F(PsServiceSegmentTest, ASegmentThatCannotBeUsedGetsSlicesAndWhy) {
  struct Case {
    const char* what;
    std::function<void(v1::SharedSegment*)> spoil;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"another nonce", [](v1::SharedSegment* s) { s->set_nonce(std::string(16, 'x')); },
       "another nonce"},
      {"a short nonce", [](v1::SharedSegment* s) { s->set_nonce("x"); }, "nonce has 1 bytes"},
      {"another size", [](v1::SharedSegment* s) { s->set_size(s->size() + 4096); },
       "is not a segment of"},
      {"two offsets", [](v1::SharedSegment* s) { s->add_offsets(kAt); }, "2 offsets for 1"},
      {"an offset in the header", [](v1::SharedSegment* s) { s->set_offsets(0, 16); },
       "do not fit"},
      {"an offset past the end", [](v1::SharedSegment* s) { s->set_offsets(0, kAt + 128); },
       "do not fit"},
      {"a huge offset", [](v1::SharedSegment* s) { s->set_offsets(0, INT64_MAX - 8); },
       "do not fit"},
      {"pull_id 0", [](v1::SharedSegment* s) { s->set_pull_id(0); }, "pull_id is 0"},
      {"no such descriptor", [](v1::SharedSegment* s) { s->set_fd(1 << 20); }, "/fd/"},
      {"a negative pid", [](v1::SharedSegment* s) { s->set_pid(-1); }, "out of range"},
  };
  uint64_t id = 1;
  for (const Case& c : cases) {
    v1::SharedSegment seg = Segment(id++);
    c.spoil(&seg);
    const SegmentPull p = PullInto(seg);
    EXPECT_NE(p.error.find(c.error), std::string::npos) << c.what << ": " << p.error;
    EXPECT_TRUE(p.in_segment.empty()) << c.what;
    for (float x : p.sliced) ASSERT_EQ(x, -2.0f) << c.what;
    EXPECT_TRUE(SegmentUntouched()) << c.what;
  }
  // The server is fine: a good request still gets the segment.
  const SegmentPull ok = PullInto(Segment(id++));
  EXPECT_EQ(ok.in_segment, std::vector<uint32_t>{0});
  for (float x : InSegment()) ASSERT_EQ(x, -2.0f);
}

// A call the worker abandoned can reach the server after the one that
// replaced it: it must not write over the newer call's values.
TEST_F(PsServiceSegmentTest, AnOlderPullOfTheSameSegmentDoesNotWrite) {
  const SegmentPull newer = PullInto(Segment(7));
  ASSERT_EQ(newer.in_segment, std::vector<uint32_t>{0});
  std::memset(segment_->mutable_at(common::kSegmentHeaderBytes), 0x7f, 64 + 5000 * 4);
  for (uint64_t old : {uint64_t{6}, uint64_t{7}}) {
    const SegmentPull p = PullInto(Segment(old));
    EXPECT_TRUE(p.in_segment.empty()) << old;
    EXPECT_EQ(p.error, "") << old;  // nothing that would turn the segment off
    for (float x : p.sliced) ASSERT_EQ(x, -2.0f);
    EXPECT_TRUE(SegmentUntouched()) << old;
  }
}

// A push that would change the values while a pull writes them into a
// worker's segment waits for the writes (Status: pushes_waiting) instead of
// copying the values away; a pull into a segment that comes meanwhile waits
// for that push and gets its values. The pull is held part way by the
// test-only fault hook, which drives the rest by the server's state.
TEST_F(PsServiceSegmentTest, APushWaitsForAPullWritingIntoASegmentNotACopy) {
  auto second = common::SharedSegment::Create(64 + 5000 * 4);
  ASSERT_TRUE(second.ok()) << second.status();
  // Waits (deadline 60 s) until `pred` holds for job "j"'s status.
  auto wait_for = [this](const std::function<bool(const v1::JobStatus&)>& pred) {
    v1::StatusRequest req;
    req.set_job_id("j");
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (absl::Now() < give_up) {
      const v1::StatusResponse s = ps_.Status(req);
      if (s.jobs_size() == 1 && pred(s.jobs(0))) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return false;
  };
  std::atomic<bool> pushed{false};
  grpc::Status push_status;
  v1::PushResponse push_resp;
  std::thread push, late_pull;
  SegmentPull late;
  std::atomic<int> calls{0};
  std::atomic<int> hook_calls{0};  // every pull's, after its last write
  bool push_waited = false, late_pull_waited = false, push_done_early = true;
  service_->set_pull_fault_for_testing([&](const v1::PullRequest& r, size_t in_segment) {
    ++hook_calls;
    // Only the first pull, after its variable is written; the lease is held.
    if (r.segment().nonce() != segment_->nonce() || calls++ > 0 || in_segment != 1) {
      return grpc::Status::OK;
    }
    push = std::thread([&] {
      push_status = Push(2, 1.0f, &push_resp);
      pushed = true;
    });
    push_waited = wait_for([](const v1::JobStatus& j) { return j.pushes_waiting() == 1; });
    push_done_early = pushed.load();
    late_pull = std::thread([&] {
      v1::SharedSegment seg = Segment(1);
      seg.set_pid((*second)->pid());
      seg.set_fd((*second)->fd());
      seg.set_nonce((*second)->nonce());
      late = PullInto(seg);
    });
    late_pull_waited = wait_for([](const v1::JobStatus& j) { return j.pulls_waiting() == 1; });
    return grpc::Status::OK;
  });
  const SegmentPull first = PullInto(Segment(1));
  push.join();
  late_pull.join();
  // A pull's handler calls the hook after its last write, which the
  // client may see first: the hook goes once both handlers are past it.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (hook_calls.load() < 2 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(hook_calls.load(), 2);
  service_->set_pull_fault_for_testing(nullptr);
  EXPECT_TRUE(push_waited) << "the push did not wait for the pull writing into the segment";
  EXPECT_FALSE(push_done_early);
  EXPECT_TRUE(late_pull_waited) << "a pull into a segment did not wait for the waiting push";
  // The first pull wrote the values of its step, whole.
  EXPECT_EQ(first.step, 1);
  EXPECT_EQ(first.in_segment, std::vector<uint32_t>{0});
  for (float x : InSegment()) ASSERT_EQ(x, -2.0f);
  // Then the push was applied, and the late pull has its values.
  ASSERT_TRUE(push_status.ok()) << push_status.error_message();
  EXPECT_EQ(push_resp.outcome(), v1::PushResponse::APPLIED);
  EXPECT_EQ(late.step, 2);
  EXPECT_EQ(late.in_segment, std::vector<uint32_t>{0});
  std::vector<float> in_second(5000);
  std::memcpy(in_second.data(), (*second)->at(kAt), in_second.size() * 4);
  for (float x : in_second) ASSERT_EQ(x, -3.0f);
  v1::StatusRequest req;
  const v1::StatusResponse st = ps_.Status(req);
  ASSERT_EQ(st.jobs_size(), 1);
  EXPECT_EQ(st.jobs(0).pushes_waiting(), 0);
  EXPECT_EQ(st.jobs(0).pulls_waiting(), 0);
}

// A push whose gradient lies in the worker's segment: the header names it,
// then messages name the variables (raw bytes, as the worker writes them).
grpc::Status PushFromSegment(v1::ParameterService::Stub& stub, const v1::SharedSegment& segment,
                             uint64_t seq, const std::vector<std::string>& messages,
                             v1::PushResponse* resp, const std::string& job_id = "j") {
  grpc::ClientContext ctx;
  auto w = stub.Push(&ctx, resp);
  v1::PushRequest m = HeaderMessage(seq, job_id);
  m.mutable_header()->set_ends_with_commit(true);
  *m.mutable_header()->mutable_segment() = segment;
  w->Write(m);
  for (const std::string& raw : messages) {
    v1::PushRequest r;
    EXPECT_TRUE(r.ParseFromString(raw));
    w->Write(r);
  }
  v1::PushRequest c;
  c.set_commit(true);
  w->Write(c);
  w->WritesDone();
  return w->Finish();
}

std::string SegmentVars(std::initializer_list<uint64_t> vars) {
  std::string out;
  for (uint64_t v : vars) common::AppendVarintField(v1::ps_wire::kPushSegmentVarField, v, &out);
  return out;
}

TEST_F(PsServiceSegmentTest, PushReadsTheGradientFromTheSegment) {
  std::vector<float> g(5000);
  for (int i = 0; i < 5000; ++i) g[i] = 0.25f * static_cast<float>(i % 7);
  std::memcpy(segment_->mutable_at(kAt), g.data(), g.size() * 4);
  v1::PushResponse resp;
  const grpc::Status st = PushFromSegment(*stub_, Segment(1), 2, {SegmentVars({0})}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  int messages = 0;
  const std::vector<float> w = Pull(&messages);
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(w[i], -2.0f - g[i]) << i;  // lr 1
}

// With two workers (no update formed ahead), each worker's gradient is read
// in place from its segment by the step's update: the values are those of
// the same gradients sent as slices, bit for bit; a variable named twice is
// refused and nothing of that push is applied.
TEST_F(PsServiceSegmentTest, TwoWorkersGradientsAreReadInPlaceAsIfSent) {
  auto job = [&](const std::string& id) {
    v1::RegisterRequest r;
    r.set_job_id(id);
    r.mutable_config()->set_mode(v1::SYNC);
    r.mutable_config()->set_num_workers(2);
    r.mutable_config()->mutable_optimizer()->set_learning_rate(0.5f);
    auto* v = r.add_variables();
    v->set_name("big");
    v->add_shape(5000);
    v->set_dtype(v1::DT_FLOAT32);
    ASSERT_TRUE(ps_.Register(r).ok());
  };
  job("shared");
  job("sliced");
  std::vector<std::unique_ptr<common::SharedSegment>> segs;
  std::vector<float> g[2];
  for (int w = 0; w < 2; ++w) {
    auto seg = common::SharedSegment::Create(64 + 5000 * 4);
    ASSERT_TRUE(seg.ok()) << seg.status();
    g[w].resize(5000);
    for (int i = 0; i < 5000; ++i) g[w][i] = 0.37f * static_cast<float>((i * (w + 3)) % 11) - 1.1f;
    std::memcpy((*seg)->mutable_at(kAt), g[w].data(), 5000 * 4);
    segs.push_back(std::move(*seg));
  }
  auto where = [&](int w) {
    v1::SharedSegment s;
    s.set_pid(segs[w]->pid());
    s.set_fd(segs[w]->fd());
    s.set_nonce(segs[w]->nonce());
    s.set_size(segs[w]->size());
    s.add_offsets(kAt);
    return s;
  };
  // Worker w's push of step 0, `examples` examples.
  auto header = [&](const std::string& id, int w, int64_t examples) {
    v1::PushRequest m = HeaderMessage(1, id);
    m.mutable_header()->set_worker_task(w);
    m.mutable_header()->set_num_examples(examples);
    return m;
  };
  v1::PushResponse resp;
  {
    // An offset that leaves the variable no room is refused, as with copies.
    v1::SharedSegment past = where(0);
    past.set_offsets(0, kAt + 128);
    const grpc::Status st = PushFromSegment(*stub_, past, 1, {SegmentVars({0})}, &resp, "shared");
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_NE(st.error_message().find("do not fit"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    auto w = stub_->Push(&ctx, &resp);
    v1::PushRequest m = header("shared", 0, 3);
    m.mutable_header()->set_ends_with_commit(true);
    *m.mutable_header()->mutable_segment() = where(0);
    w->Write(m);
    v1::PushRequest twice;
    ASSERT_TRUE(twice.ParseFromString(SegmentVars({0, 0})));
    twice.set_commit(true);
    w->Write(twice);
    w->WritesDone();
    const grpc::Status st = w->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("variable 0 named again"), std::string::npos)
        << st.error_message();
  }
  for (int w = 0; w < 2; ++w) {
    const int64_t examples = w == 0 ? 3 : 5;
    grpc::ClientContext ctx;
    auto writer = stub_->Push(&ctx, &resp);
    v1::PushRequest m = header("shared", w, examples);
    m.mutable_header()->set_ends_with_commit(true);
    *m.mutable_header()->mutable_segment() = where(w);
    writer->Write(m);
    v1::PushRequest names;
    ASSERT_TRUE(names.ParseFromString(SegmentVars({0})));
    names.set_commit(true);
    writer->Write(names);
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
    auto s = ps_.BeginPush(header("sliced", w, examples).header());
    ASSERT_TRUE(s.ok()) << s.status();
    v1::TensorSlice slice;
    slice.set_var_index(0);
    slice.set_data(g[w].data(), g[w].size() * 4);
    ASSERT_TRUE((*s)->AddSlice(slice).ok());
    auto r = ps_.FinishPush(std::move(*s));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto values = [&](const std::string& id) {
    v1::PullRequest req;
    req.set_job_id(id);
    req.set_min_step(1);
    auto snap = ps_.Pull(req, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(snap.ok()) << snap.status();
    if (!snap.ok()) return std::vector<float>();
    (*snap)->AwaitReady(0);
    return std::vector<float>((*snap)->values[0].begin(), (*snap)->values[0].end());
  };
  const std::vector<float> shared = values("shared");
  ASSERT_EQ(shared.size(), 5000u);
  EXPECT_TRUE(shared == values("sliced"));
  // And they moved by the weighted mean: 3/8 g0 + 5/8 g1, at learning rate
  // 0.5, from 0: a few float roundings, each within half an ulp of a value
  // at most (3 |g0| + 5 |g1|) / 8.
  for (int i = 0; i < 5000; ++i) {
    const double mean = (3.0 * g[0][i] + 5.0 * g[1][i]) / 8.0;
    const double bound = (3.0 * std::abs(g[0][i]) + 5.0 * std::abs(g[1][i])) / 8.0;
    ASSERT_NEAR(shared[i], -0.5 * mean, 8 * bound * std::ldexp(1.0, -24)) << i;
  }
}

// The service keeps a segment mapped between calls, and lets it go once it
// has been idle for segment_idle_release. Seen from outside: once the
// worker's descriptor names another file, a segment still mapped is written
// (pull) and read (push) as before, while one let go cannot be opened again.
TEST_F(PsServiceSegmentTest, ASegmentStaysMappedBetweenCallsAndIsLetGoWhenIdle) {
  EXPECT_EQ(service_->segments().mapped(), 0);
  const SegmentPull first = PullInto(Segment(1));
  ASSERT_EQ(first.error, "");
  EXPECT_EQ(service_->segments().mapped(), 1);
  // The worker's fd now names a plain memfd: opening it would be refused.
  const int plain = memfd_create("not-a-segment", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(dup2(plain, segment_->fd()), segment_->fd());
  close(plain);
  v1::PushResponse resp;
  ASSERT_TRUE(Push(2, 1.0f, &resp).ok());
  const SegmentPull again = PullInto(Segment(2));
  EXPECT_EQ(again.error, "");
  EXPECT_EQ(again.in_segment, std::vector<uint32_t>{0});
  for (float x : InSegment()) ASSERT_EQ(x, -3.0f);
  std::vector<float> g(5000, 0.5f);
  std::memcpy(segment_->mutable_at(kAt), g.data(), g.size() * 4);
  const grpc::Status st = PushFromSegment(*stub_, Segment(3), 3, {SegmentVars({0})}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_EQ(x, -3.5f);  // lr 1
  EXPECT_EQ(service_->segments().mapped(), 1);
  EXPECT_GT(service_->segments().PeakSharedResidentBytes(), 0);

  service_->segments().set_idle_release(absl::Milliseconds(20));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (service_->segments().mapped() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(service_->segments().mapped(), 0);
  // Let go: the next pull opens the descriptor afresh, which now fails.
  const SegmentPull after = PullInto(Segment(4));
  EXPECT_NE(after.error.find("not a towerps segment"), std::string::npos) << after.error;
  EXPECT_TRUE(after.in_segment.empty());
  for (float x : after.sliced) ASSERT_EQ(x, -3.5f);
}

// A variable of several read pieces is read whole, and a NaN in its last
// piece refuses the push: at an aligned offset, where its new values are
// formed from it in place (PushSession::AddShared, in pieces of its own), and
// at an unaligned one, where it is copied in pieces (kSegmentReadElements).
TEST_F(PsServiceSegmentTest, ALargeVariableIsReadInPiecesAndCheckedToTheEnd) {
  const int64_t n = 2 * kSegmentReadElements + 5;
  for (int64_t at : {kAt, kAt + 2}) {
    SCOPED_TRACE(absl::StrCat("offset ", at));
    const std::string job = absl::StrCat("big", at);
    v1::RegisterRequest r;
    r.set_job_id(job);
    r.mutable_config()->set_mode(v1::ASYNC);
    r.mutable_config()->set_num_workers(1);
    r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
    r.mutable_config()->mutable_optimizer()->set_learning_rate(1.0f);
    auto* var = r.add_variables();
    var->set_name("w");
    var->add_shape(n);
    var->set_dtype(v1::DT_FLOAT32);
    ASSERT_TRUE(ps_.Register(r).ok());  // zeros
    auto seg = common::SharedSegment::Create(64 + n * 4 + 4);
    ASSERT_TRUE(seg.ok()) << seg.status();
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 1001) * 0.5f;
    std::memcpy((*seg)->mutable_at(at), g.data(), n * 4);
    v1::SharedSegment where;
    where.set_pid((*seg)->pid());
    where.set_fd((*seg)->fd());
    where.set_nonce((*seg)->nonce());
    where.set_size((*seg)->size());
    where.add_offsets(at);
    auto values = [&] {
      v1::PullRequest req;
      req.set_job_id(job);
      auto snap = ps_.Pull(req, absl::Now() + absl::Seconds(10));
      EXPECT_TRUE(snap.ok()) << snap.status();
      if (snap.ok()) (*snap)->AwaitReady(0);  // the push's update runs after its answer
      return snap.ok() ? std::vector<float>((*snap)->values[0].begin(), (*snap)->values[0].end())
                       : std::vector<float>();
    };
    v1::PushResponse resp;
    grpc::Status st = PushFromSegment(*stub_, where, 1, {SegmentVars({0})}, &resp, job);
    ASSERT_TRUE(st.ok()) << st.error_message();
    std::vector<float> w = values();
    ASSERT_EQ(static_cast<int64_t>(w.size()), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[i], -g[i]) << i;  // lr 1, from 0
    float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy((*seg)->mutable_at(at + (n - 2) * 4), &nan, 4);
    st = PushFromSegment(*stub_, where, 2, {SegmentVars({0})}, &resp, job);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("NaN or Inf"), std::string::npos) << st.error_message();
    EXPECT_EQ(values(), w);  // nothing applied
  }
}

// Same host, one worker, SGD: a push that names where its pulls land
// (value_offsets) gets the new values written there as they are formed,
// and the next pull into that place announces them without writing (a
// mark the test leaves there stays); they are the server's values. Any
// other place, and the place after a refused push, gets the pull's
// writes. value_offsets that do not fit are refused as offsets are.
TEST_F(PsServiceSegmentTest, APushWritesTheNewValuesWhereItsPullsLand) {
  constexpr int64_t n = 5000;
  auto seg = common::SharedSegment::Create(64 + 3 * n * 4);
  ASSERT_TRUE(seg.ok()) << seg.status();
  const int64_t grad_at = kAt, values_at = kAt + n * 4, other_at = kAt + 2 * n * 4;
  v1::SharedSegment where;
  where.set_pid((*seg)->pid());
  where.set_fd((*seg)->fd());
  where.set_nonce((*seg)->nonce());
  where.set_size((*seg)->size());
  auto pull_to = [&](int64_t at, uint64_t pull_id) {
    v1::SharedSegment p = where;
    p.add_offsets(at);
    p.set_pull_id(pull_id);
    return PullInto(p);
  };
  auto at = [&](int64_t offset) {
    std::vector<float> v(n);
    std::memcpy(v.data(), (*seg)->at(offset), n * 4);
    return v;
  };
  int messages = 0;
  ASSERT_EQ(pull_to(values_at, 1).in_segment, std::vector<uint32_t>{0});
  ASSERT_EQ(at(values_at), Pull(&messages));  // -2 (SetUp)
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = 0.125f * static_cast<float>(i % 13) - 0.5f;
  std::memcpy((*seg)->mutable_at(grad_at), g.data(), n * 4);
  v1::SharedSegment push = where;
  push.add_offsets(grad_at);
  push.add_value_offsets(values_at);
  v1::PushResponse resp;
  grpc::Status st = PushFromSegment(*stub_, push, 2, {SegmentVars({0})}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.outcome(), v1::PushResponse::APPLIED);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = -2.0f - g[i];  // lr 1
  EXPECT_EQ(at(values_at), want);  // written during the push
  EXPECT_EQ(Pull(&messages), want);  // and they are the server's
  // The next pull there writes nothing: a mark left there stays.
  constexpr float kMark = 12345.0f;
  std::memcpy((*seg)->mutable_at(values_at + 17 * 4), &kMark, 4);
  SegmentPull p = pull_to(values_at, 2);
  EXPECT_EQ(p.step, 2);
  EXPECT_EQ(p.in_segment, std::vector<uint32_t>{0});
  EXPECT_EQ(at(values_at)[17], kMark);
  // Elsewhere, the pull writes.
  p = pull_to(other_at, 3);
  EXPECT_EQ(p.in_segment, std::vector<uint32_t>{0});
  EXPECT_EQ(at(other_at), want);
  // A refused push (a NaN in its last element) leaves the place to the
  // next pull, which writes the values whole (the mark goes).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy((*seg)->mutable_at(grad_at + (n - 1) * 4), &nan, 4);
  st = PushFromSegment(*stub_, push, 3, {SegmentVars({0})}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  p = pull_to(values_at, 4);
  EXPECT_EQ(p.step, 2);
  EXPECT_EQ(p.in_segment, std::vector<uint32_t>{0});
  EXPECT_EQ(at(values_at), want);
  // value_offsets are checked like offsets: nothing is applied.
  v1::SharedSegment twice = push;
  twice.add_value_offsets(values_at);
  std::memcpy((*seg)->mutable_at(grad_at + (n - 1) * 4), &g[n - 1], 4);
  st = PushFromSegment(*stub_, twice, 4, {SegmentVars({0})}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("2 value offsets for 1 variables"), std::string::npos)
      << st.error_message();
  v1::SharedSegment past = push;
  past.set_value_offsets(0, (*seg)->size() - 8);
  st = PushFromSegment(*stub_, past, 5, {SegmentVars({0})}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("at value offset"), std::string::npos) << st.error_message();
  EXPECT_EQ(Pull(&messages), want);
}

TEST_F(PsServiceSegmentTest, ABadSegmentPushChangesNothing) {
  std::vector<float> ones(5000, 1.0f);
  std::memcpy(segment_->mutable_at(kAt), ones.data(), ones.size() * 4);
  struct Case {
    const char* what;
    std::function<void(v1::SharedSegment*)> spoil;
    std::vector<std::string> messages;
    grpc::StatusCode code;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"another nonce", [](v1::SharedSegment* s) { s->set_nonce(std::string(16, 'x')); },
       {SegmentVars({0})}, grpc::StatusCode::FAILED_PRECONDITION,
       "push: shared segment: "},
      {"an offset past the end", [](v1::SharedSegment* s) { s->set_offsets(0, kAt + 128); },
       {SegmentVars({0})}, grpc::StatusCode::FAILED_PRECONDITION, "do not fit"},
      {"two offsets", [](v1::SharedSegment* s) { s->add_offsets(kAt); }, {SegmentVars({0})},
       grpc::StatusCode::FAILED_PRECONDITION, "2 offsets for 1"},
      {"a variable it does not hold", [](v1::SharedSegment*) {}, {SegmentVars({1})},
       grpc::StatusCode::INVALID_ARGUMENT, "names variable 1 of 1"},
      {"a variable twice", [](v1::SharedSegment*) {}, {SegmentVars({0, 0})},
       grpc::StatusCode::INVALID_ARGUMENT, ""},
      {"no variable at all", [](v1::SharedSegment*) {}, {},
       grpc::StatusCode::INVALID_ARGUMENT, "incomplete"},
  };
  uint64_t seq = 10;
  for (const Case& c : cases) {
    v1::SharedSegment seg = Segment(1);
    c.spoil(&seg);
    v1::PushResponse resp;
    const grpc::Status st = PushFromSegment(*stub_, seg, seq++, c.messages, &resp);
    EXPECT_EQ(st.error_code(), c.code) << c.what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.error), std::string::npos)
        << c.what << ": " << st.error_message();
    int messages = 0;
    for (float x : Pull(&messages)) ASSERT_EQ(x, -2.0f) << c.what;  // nothing applied
  }
  // A NaN in the segment is refused like one in a slice.
  ones[1234] = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(segment_->mutable_at(kAt), ones.data(), ones.size() * 4);
  v1::PushResponse resp;
  const grpc::Status nan = PushFromSegment(*stub_, Segment(1), seq++, {SegmentVars({0})}, &resp);
  EXPECT_EQ(nan.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << nan.error_message();
  // segment_vars in a push that names no segment.
  {
    grpc::ClientContext ctx;
    auto w = stub_->Push(&ctx, &resp);
    w->Write(HeaderMessage(seq++));
    v1::PushRequest r;
    ASSERT_TRUE(r.ParseFromString(SegmentVars({0})));
    w->Write(r);
    w->WritesDone();
    const grpc::Status st = w->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("names no segment"), std::string::npos)
        << st.error_message();
  }
  int messages = 0;
  for (float x : Pull(&messages)) ASSERT_EQ(x, -2.0f);
}

TEST(PsServiceSharedMemoryOffTest, SaysSoAndSendsSlices) {
  ParameterServer ps{{}};
  ParameterServiceImpl service(ps, 4096, nullptr, /*shared_memory=*/false);
  int port = 0;
  auto server = common::StartServer("127.0.0.1:0", {&service}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ParameterService::NewStub(common::NewChannel("127.0.0.1:" + std::to_string(port)));
  v1::RegisterRequest r;
  r.set_job_id("j");
  r.mutable_config()->set_num_workers(1);
  auto* v = r.add_variables();
  v->set_name("w");
  v->add_shape(10);
  v->set_dtype(v1::DT_FLOAT32);
  v1::RegisterResponse resp;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub->RegisterVariables(&rctx, r, &resp).ok());
  auto seg = common::SharedSegment::Create(40);
  ASSERT_TRUE(seg.ok()) << seg.status();
  v1::PullRequest req;
  req.set_job_id("j");
  req.mutable_segment()->set_pid((*seg)->pid());
  req.mutable_segment()->set_fd((*seg)->fd());
  req.mutable_segment()->set_nonce((*seg)->nonce());
  req.mutable_segment()->set_size((*seg)->size());
  req.mutable_segment()->add_offsets(common::kSegmentHeaderBytes);
  req.mutable_segment()->set_pull_id(1);
  grpc::ClientContext ctx;
  auto reader = stub->Pull(&ctx, req);
  v1::PullResponse m;
  int elements = 0, messages = 0;
  std::string error;
  while (reader->Read(&m)) {
    if (messages++ == 0) error = m.segment_error();
    EXPECT_EQ(m.segment_vars_size(), 0);
    for (const auto& s : m.slices()) elements += static_cast<int>(s.data().size() / 4);
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(elements, 10);
  EXPECT_NE(error.find("--shared_memory=false"), std::string::npos) << error;
  // A push that names the segment is refused so that the worker sends slices.
  v1::PushResponse presp;
  const grpc::Status pushed =
      PushFromSegment(*stub, req.segment(), 1, {SegmentVars({0})}, &presp);
  EXPECT_EQ(pushed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(pushed.error_message().rfind(v1::ps_wire::kPushSegmentRefused, 0), 0u)
      << pushed.error_message();
  (*server)->Shutdown();
}

TEST_F(PsServiceTest, UnknownJobIsNotFound) {
  grpc::ClientContext ctx;
  v1::PullRequest req;
  req.set_job_id("nope");
  auto r = stub_->Pull(&ctx, req);
  v1::PullResponse m;
  while (r->Read(&m)) {
  }
  grpc::Status s = r->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("\"nope\""), std::string::npos);
}

// The service serves Push and Pull by their positions in the generated
// service: they must be where proto/ps_wire.h says.
TEST(PsWireTest, MethodIndicesAndNamesMatchTheProto) {
  const auto* service = v1::PushRequest::descriptor()->file()->FindServiceByName("ParameterService");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->method(v1::ps_wire::kPushMethodIndex)->name(), "Push");
  EXPECT_EQ(service->method(v1::ps_wire::kPullMethodIndex)->name(), "Pull");
  EXPECT_STREQ(v1::ps_wire::PushMethod(), "/towerps.v1.ParameterService/Push");
  EXPECT_STREQ(v1::ps_wire::PullMethod(), "/towerps.v1.ParameterService/Pull");
  EXPECT_EQ(v1::PushRequest::descriptor()->FindFieldByName("header")->number(),
            v1::ps_wire::kPushHeaderField);
  EXPECT_EQ(v1::PushRequest::descriptor()->FindFieldByName("slices")->number(),
            v1::ps_wire::kPushSlicesField);
  EXPECT_EQ(v1::PushRequest::descriptor()->FindFieldByName("commit")->number(),
            v1::ps_wire::kPushCommitField);
  EXPECT_EQ(v1::PullResponse::descriptor()->FindFieldByName("global_step")->number(),
            v1::ps_wire::kPullStepField);
  EXPECT_EQ(v1::PullResponse::descriptor()->FindFieldByName("waited_us")->number(),
            v1::ps_wire::kPullWaitedField);
  EXPECT_EQ(v1::PullResponse::descriptor()->FindFieldByName("slices")->number(),
            v1::ps_wire::kPullSlicesField);
  EXPECT_EQ(v1::PullResponse::descriptor()->FindFieldByName("segment_vars")->number(),
            v1::ps_wire::kPullSegmentVarField);
  EXPECT_EQ(v1::PullResponse::descriptor()->FindFieldByName("segment_error")->number(),
            v1::ps_wire::kPullSegmentErrorField);
}

}  // namespace
}  // namespace towerps::ps
