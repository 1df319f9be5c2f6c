// ShmCallServer on a real worker segment (a sealed memfd this test creates
// and opens as a server would), with a small handler in place of the
// service's: calls are served one at a time, with their messages and
// status; a channel is set up again with a later generation only; an
// abandoned call gives way to the next; what a worker writes that cannot be
// right closes the channel, not the server; idle channels end and say so.
#include "ps/shm_calls.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/shared_segment.h"
#include "common/shm_channel.h"
#include "gtest/gtest.h"

namespace towerps::ps {
namespace {

using common::ShmCallHeader;
using common::ShmCallKind;
using common::ShmMethod;

constexpr absl::Duration kStateDeadline = absl::Seconds(20);
constexpr int64_t kOffset = common::kSegmentHeaderBytes;

// Polls `done` until it holds or kStateDeadline passes.
template <typename F>
bool WaitFor(F done) {
  const absl::Time deadline = absl::Now() + kStateDeadline;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

std::string ToString(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// The worker's side, by hand: its segment, the channel in it, the server's
// mapping of it.
struct Worker {
  Worker() {
    auto s = common::SharedSegment::Create(common::kShmChannelBytes + 4096);
    EXPECT_TRUE(s.ok()) << s.status();
    segment = *std::move(s);
    auto f = common::SegmentFile::Open(segment->pid(), segment->fd(), segment->nonce(),
                                       segment->size());
    EXPECT_TRUE(f.ok()) << f.status();
    file = std::make_shared<common::SegmentFile>(*std::move(f));
  }
  common::ShmChannelView view() { return common::ShmChannelView(segment->mutable_at(kOffset)); }

  void Send(ShmCallKind kind, uint64_t call_id, const std::string& payload, bool last,
            ShmMethod method = ShmMethod::kPull) {
    ShmCallHeader h;
    h.kind = kind;
    h.method = method;
    h.last = last;
    h.call_id = call_id;
    h.timeout_us = absl::ToInt64Microseconds(kStateDeadline);
    ASSERT_TRUE(view().to_server().Write({common::EncodeShmCallHeader(h), payload},
                                         absl::Now() + kStateDeadline)
                    .ok());
  }
  // The server's next message.
  std::pair<ShmCallHeader, std::string> Next() {
    std::string raw;
    absl::Status st = view().to_worker().Read(&raw, absl::Now() + kStateDeadline);
    EXPECT_TRUE(st.ok()) << st;
    absl::string_view payload;
    absl::StatusOr<ShmCallHeader> h = common::DecodeShmCallHeader(raw, &payload);
    EXPECT_TRUE(h.ok()) << h.status();
    return {h.ok() ? *h : ShmCallHeader(), std::string(payload)};
  }

  std::unique_ptr<common::SharedSegment> segment;
  std::shared_ptr<common::SegmentFile> file;
};

// Echoes each message it reads back with a prefix; then answers with the
// status named by the first message ("NOT_FOUND" or anything: OK).
grpc::Status Echo(ShmMethod method, CallStream* stream) {
  grpc::ByteBuffer in;
  std::string first;
  int n = 0;
  while (stream->Read(&in)) {
    const std::string s = ToString(in);
    if (n++ == 0) first = s;
    if (!stream->Write(ToBuffer((method == ShmMethod::kPush ? "push:" : "pull:") + s))) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    }
  }
  if (first == "NOT_FOUND") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
  return grpc::Status::OK;
}

TEST(ShmCallServerTest, ServesCallsWithTheirMessagesAndStatus) {
  Worker w;
  ShmCallServer server(Echo);
  ASSERT_TRUE(server.Attach(w.file, w.segment->nonce(), kOffset, 5).ok());
  EXPECT_EQ(w.view().served_generation().load(), 5u);
  EXPECT_EQ(w.view().server_pid().load(), static_cast<uint64_t>(getpid()));  // for a pidfd
  EXPECT_EQ(server.serving(), 1);

  // A call of one message.
  w.Send(ShmCallKind::kOpen, 1, "a", /*last=*/true);
  auto [h, payload] = w.Next();
  EXPECT_EQ(h.kind, ShmCallKind::kData);
  EXPECT_EQ(h.call_id, 1u);
  EXPECT_EQ(payload, "pull:a");
  std::tie(h, payload) = w.Next();
  EXPECT_EQ(h.kind, ShmCallKind::kStatus);
  EXPECT_EQ(h.status_code, 0u);

  // A call of three, with an error status and its message.
  w.Send(ShmCallKind::kOpen, 2, "NOT_FOUND", /*last=*/false, ShmMethod::kPush);
  w.Send(ShmCallKind::kData, 2, "b", /*last=*/false);
  w.Send(ShmCallKind::kData, 2, "c", /*last=*/true);
  for (const char* want : {"push:NOT_FOUND", "push:b", "push:c"}) {
    std::tie(h, payload) = w.Next();
    EXPECT_EQ(h.kind, ShmCallKind::kData);
    EXPECT_EQ(h.call_id, 2u);
    EXPECT_EQ(payload, want);
  }
  std::tie(h, payload) = w.Next();
  EXPECT_EQ(h.kind, ShmCallKind::kStatus);
  EXPECT_EQ(h.status_code, static_cast<uint32_t>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(payload, "no such job");
  // The heartbeat goes on while the channel is served.
  const uint64_t beat = w.view().heartbeat().load();
  EXPECT_TRUE(WaitFor([&] { return w.view().heartbeat().load() > beat; }));
}

TEST(ShmCallServerTest, AttachRefusesWhatCannotBeRight) {
  Worker w;
  ShmCallServer server(Echo);
  EXPECT_TRUE(absl::IsInvalidArgument(server.Attach(w.file, "k", kOffset, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(server.Attach(w.file, "k", kOffset + 8, 1)));
  // Past the end of the segment, or into its header.
  EXPECT_TRUE(absl::IsInvalidArgument(server.Attach(w.file, "k", w.segment->size(), 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(server.Attach(w.file, "k", 0, 1)));
  EXPECT_EQ(server.serving(), 0);
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 3).ok());
  // The same generation again: nothing changes; an older one is a late call's.
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 3).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(server.Attach(w.file, "k", kOffset, 2)));
  EXPECT_EQ(w.view().served_generation().load(), 3u);
  EXPECT_EQ(server.serving(), 1);
}

// A later generation replaces the thread that served the channel, ending the
// call it was in (unanswered); the channel starts afresh.
TEST(ShmCallServerTest, ALaterGenerationEndsTheCallUnderWay) {
  Worker w;
  std::atomic<bool> in_call{false}, cancelled{false};
  ShmCallServer server([&](ShmMethod, CallStream* stream) {
    grpc::ByteBuffer b;
    EXPECT_TRUE(stream->Read(&b));
    in_call = true;
    // Waits for more that never comes, as a push whose worker gave up.
    EXPECT_FALSE(stream->Read(&b));
    cancelled = stream->IsCancelled();
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 1).ok());
  w.Send(ShmCallKind::kOpen, 1, "x", /*last=*/false);
  ASSERT_TRUE(WaitFor([&] { return in_call.load(); }));
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 2).ok());
  EXPECT_TRUE(cancelled.load());
  EXPECT_EQ(w.view().served_generation().load(), 2u);
  EXPECT_FALSE(w.view().to_worker().HasMessage());  // no answer to the old call
  EXPECT_EQ(server.serving(), 1);
}

// The worker gives up on a call and opens the next: the first ends (its
// handler sees it cancelled) and the second is served.
TEST(ShmCallServerTest, AnAbandonedCallGivesWayToTheNext) {
  Worker w;
  std::atomic<int> calls{0}, cancelled{0};
  ShmCallServer server([&](ShmMethod method, CallStream* stream) {
    ++calls;
    grpc::ByteBuffer b;
    std::string got;
    while (stream->Read(&b)) got += ToString(b);
    if (stream->IsCancelled()) {
      ++cancelled;
      return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    }
    stream->Write(ToBuffer(got));
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 1).ok());
  w.Send(ShmCallKind::kOpen, 1, "a", /*last=*/false, ShmMethod::kPush);
  w.Send(ShmCallKind::kOpen, 2, "b", /*last=*/false, ShmMethod::kPush);
  w.Send(ShmCallKind::kData, 1, "late", /*last=*/true);  // of call 1: skipped
  w.Send(ShmCallKind::kData, 2, "c", /*last=*/true);
  auto [h, payload] = w.Next();
  EXPECT_EQ(h.call_id, 2u);
  EXPECT_EQ(payload, "bc");
  std::tie(h, payload) = w.Next();
  EXPECT_EQ(h.kind, ShmCallKind::kStatus);
  EXPECT_EQ(h.call_id, 2u);
  EXPECT_EQ(h.status_code, 0u);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(cancelled.load(), 1);
}

// Garbage from the worker closes its channel (marked served by no one); the
// server goes on and serves it again once set up again.
TEST(ShmCallServerTest, GarbageClosesTheChannelNotTheServer) {
  Worker w;
  ShmCallServer server(Echo);
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 1).ok());
  ASSERT_TRUE(w.view().to_server().Write({"not a header"}, absl::Now() + kStateDeadline).ok());
  ASSERT_TRUE(WaitFor([&] { return w.view().served_generation().load() == 0; }));
  ASSERT_TRUE(WaitFor([&] { return server.serving() == 0; }));
  // Positions that cannot be right: the same.
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 2).ok());
  std::memset(w.segment->mutable_at(kOffset + common::kShmChannelControlBytes), 0x5a, 16);
  w.view().to_server().WakeAll();
  ASSERT_TRUE(WaitFor([&] { return w.view().served_generation().load() == 0; }));
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 3).ok());
  w.Send(ShmCallKind::kOpen, 1, "a", /*last=*/true);
  EXPECT_EQ(w.Next().second, "pull:a");
}

// An answer too long for the channel (slices, where the segment could not be
// used) closes it, so that the worker, waiting, goes back to gRPC at once.
TEST(ShmCallServerTest, AnAnswerTooLongForTheChannelClosesIt) {
  Worker w;
  ShmCallServer server([](ShmMethod, CallStream* stream) {
    grpc::ByteBuffer b;
    while (stream->Read(&b)) {
    }
    EXPECT_FALSE(stream->Write(ToBuffer(std::string(common::kShmChannelRingBytes, 's'))));
    EXPECT_TRUE(stream->IsCancelled());
    return grpc::Status::OK;
  });
  ASSERT_TRUE(server.Attach(w.file, "k", kOffset, 1).ok());
  w.Send(ShmCallKind::kOpen, 1, "a", /*last=*/true);
  ASSERT_TRUE(WaitFor([&] { return w.view().served_generation().load() == 0; }));
  EXPECT_FALSE(w.view().to_worker().HasMessage());
}

TEST(ShmCallServerTest, IdleChannelsEndAndStopServingEndsTheRest) {
  Worker a, b;
  ShmCallServer server(Echo, /*idle_exit=*/absl::Milliseconds(200));
  ASSERT_TRUE(server.Attach(a.file, "a", kOffset, 1).ok());
  ASSERT_TRUE(WaitFor([&] { return a.view().served_generation().load() == 0; }));
  ASSERT_TRUE(WaitFor([&] { return server.serving() == 0; }));
  // Set up again, then a call keeps it busy while the server stops serving.
  ASSERT_TRUE(server.Attach(a.file, "a", kOffset, 2).ok());
  ASSERT_TRUE(server.Attach(b.file, "b", kOffset, 1).ok());
  a.Send(ShmCallKind::kOpen, 1, "x", /*last=*/false);
  server.StopServing();
  EXPECT_EQ(server.serving(), 0);
  EXPECT_EQ(a.view().served_generation().load(), 0u);
  EXPECT_EQ(b.view().served_generation().load(), 0u);
  ASSERT_TRUE(server.Attach(b.file, "b", kOffset, 2).ok());
  b.Send(ShmCallKind::kOpen, 1, "y", /*last=*/true);
  EXPECT_EQ(b.Next().second, "pull:y");
}

}  // namespace
}  // namespace towerps::ps
