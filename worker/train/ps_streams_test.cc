// ParameterClient's streams (StartPull / StartPush) against real parameter
// servers on loopback: values arrive variable by variable while the caller
// goes on; a SYNC pull sent before the step's push is answered once the push
// completes it; gradients announced one by one (from several threads) are
// applied once; a push finished early or abandoned part way changes nothing
// on the servers; an abandoned waiting pull returns; a server's error reaches
// the waits.
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "worker/train/local_ps_cluster.h"
#include "worker/train/ps_client.h"
#include "worker/train/ps_client_testing.h"

namespace towerps::worker {
namespace {

using ::testing::HasSubstr;
using testing_ps::Buffers;
using testing_ps::Config;
using testing_ps::Grad;
using testing_ps::Grads;
using testing_ps::kLr;
using testing_ps::kStateDeadline;
using testing_ps::NewClient;
using testing_ps::Options;
using testing_ps::Vars;
using testing_ps::WaitFor;

v1::JobStatus JobOn(LocalPsCluster& cluster, int s) {
  v1::StatusRequest req;
  req.set_job_id("j");
  const v1::StatusResponse resp = cluster.server(s).Status(req);
  return resp.jobs_size() == 1 ? resp.jobs(0) : v1::JobStatus();
}

// Options for job "j", through the shared segment or not.
ParameterClientOptions SharedOrNot(LocalPsCluster& cluster, bool shared) {
  ParameterClientOptions o = Options(cluster, "j");
  o.shared_memory = shared;
  return o;
}

// Weights `w` and gradients `g` go to live in the client's segment, as a
// trainer's do while it trains; and back to memory of their own, the
// segment's values given back, as at its end.
void MoveIntoSegment(ParameterClient& client, Buffers& w, Buffers& g) {
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    w.tensors[v].MoveTo(client.SharedValues(static_cast<int>(v)));
    g.tensors[v].MoveTo(client.SharedGradients(static_cast<int>(v)));
  }
}
void MoveOutAndRelease(ParameterClient& client, Buffers& w, Buffers& g) {
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    w.tensors[v].MoveTo(nullptr);
    g.tensors[v].MoveTo(nullptr);
    client.ReleaseShared(static_cast<int>(v));
  }
}

// Every element of every variable is `1 - kLr * Grad` (one update) or 1
// (none).
void ExpectUpdated(const Buffers& w, bool updated) {
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(w.tensors[v][i], updated ? 1.0f - kLr * Grad(v, i) : 1.0f)
          << "variable " << v << " element " << i;
    }
  }
}

TEST(PsStreamsTest, PullStreamFillsEachVariableAndReportsTheStep) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers w(Vars());
  auto pull = client->StartPull(0, 0, w.ptrs);
  ASSERT_TRUE(pull.ok()) << pull.status();
  auto step = (*pull)->Step();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  // Each variable is whole once its wait returns, in whatever order asked.
  for (int v = 2; v >= 0; --v) {
    ASSERT_TRUE((*pull)->Wait(v, 1).ok());
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) ASSERT_EQ(w.tensors[v][i], 1.0f);
  }
  auto finished = (*pull)->Finish();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(*finished, 0);
}

// Same host: after the first step's gRPC calls set the channels up, pushes
// and pulls go through the shared segment (no gRPC call); when a server
// stops serving its channels while a pull waits there, the pull goes on over
// gRPC and the channels are set up again. The values are the same all along.
TEST(PsStreamsTest, SameHostCallsFallBackToGrpcWhenAServerStopsServingThem) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  Buffers g = Grads();
  // Expected values after each step, updated as the servers do (within the
  // rounding of a fused multiply-add, one ulp of the value per step).
  std::vector<std::vector<float>> want(w.tensors.size());
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    want[v].assign(static_cast<size_t>(w.tensors[v].num_elements()), 1.0f);
  }
  auto step = [&](int64_t s, bool stop_first) {
    auto pull = client->StartPull(s + 1, s + 1, w.ptrs);
    ASSERT_TRUE(pull.ok()) << pull.status();
    if (stop_first) {
      // Both servers hold the pull for step s + 1; server 0 stops serving
      // its channels under it.
      ASSERT_TRUE(WaitFor([&] {
        return JobOn(cluster, 0).pulls_waiting() > 0 && JobOn(cluster, 1).pulls_waiting() > 0;
      }));
      cluster.service(0).shm_calls().StopServing();
    }
    auto push = client->StartPush(s, 4, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(0, static_cast<int>(w.tensors.size())).ok());
    auto r = (*push)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->applied, 2);
    auto got = (*pull)->Finish();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, s + 1);
    for (size_t v = 0; v < w.tensors.size(); ++v) {
      for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
        float& e = want[v][static_cast<size_t>(i)];
        e -= kLr * Grad(static_cast<int>(v), i);
        ASSERT_NEAR(w.tensors[v][i], e, 2 * (s + 1) * 1.2e-7f * std::max(1.0f, std::abs(e)))
            << "step " << s << " variable " << v << " element " << i;
      }
    }
  };
  auto served = [&](int s) { return cluster.service(s).shm_calls().calls_served(); };
  // Over gRPC, offering the channels: the pull's in step 0; the push's in
  // step 1 (a push goes into the segment once a pull came through it).
  step(0, false);
  step(1, false);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(cluster.service(s).shm_calls().serving(), 2) << s;
  const int64_t before0 = served(0), before1 = served(1);
  step(2, false);
  step(3, false);
  // A pull and a push per step, on each server.
  EXPECT_EQ(served(0) - before0, 4);
  EXPECT_EQ(served(1) - before1, 4);
  step(4, /*stop_first=*/true);
  EXPECT_EQ(cluster.service(0).shm_calls().serving(), 2);  // set up again
  const int64_t again = served(0);
  step(5, false);
  EXPECT_EQ(served(0) - again, 2);
}

TEST(PsStreamsTest, SyncPullSentBeforeThePushIsAnsweredWithTheNextStep) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  // Step 1 does not exist yet: both servers hold the pull.
  auto pull = client->StartPull(1, 1, w.ptrs);
  ASSERT_TRUE(pull.ok()) << pull.status();
  ASSERT_TRUE(WaitFor([&] {
    return JobOn(cluster, 0).pulls_waiting() > 0 && JobOn(cluster, 1).pulls_waiting() > 0;
  }));
  Buffers g = Grads();
  auto push = client->StartPush(0, 4, g.const_ptrs);
  ASSERT_TRUE(push.ok()) << push.status();
  // Announced as backward produces them: the last variable first.
  for (int v = 2; v >= 0; --v) ASSERT_TRUE((*push)->Send(v, 1).ok());
  auto r = (*push)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 2);
  EXPECT_EQ(r->global_step, 1);
  auto step = (*pull)->Finish();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  ExpectUpdated(w, true);
}

// ASYNC: a pull started after a push (StartPullAfterPush) is held by each
// server until it has taken that push, so the values include it, through
// buffers and through the shared segment; with no push yet it is refused.
TEST(PsStreamsTest, AsyncPullAfterPushIsAnsweredWithThatPushApplied) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared segment" : "slices");
    LocalPsCluster cluster(2);
    auto client = NewClient(SharedOrNot(cluster, shared));
    ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
    Buffers w(Vars());
    auto none = client->StartPullAfterPush(0, 1, w.ptrs);
    EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
    Buffers g = Grads();
    auto push = client->StartPush(0, 4, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    // Sent before any gradient: both servers hold it.
    auto pull = client->StartPullAfterPush(0, 1, w.ptrs);
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_TRUE(WaitFor([&] {
      return JobOn(cluster, 0).pulls_waiting() > 0 && JobOn(cluster, 1).pulls_waiting() > 0;
    }));
    for (int v = 2; v >= 0; --v) ASSERT_TRUE((*push)->Send(v, 1).ok());
    auto r = (*push)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->applied, 2);
    auto step = (*pull)->Finish();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 1);
    ExpectUpdated(w, true);
  }
}

// A server answers the push that completes a step before it updates its
// variables, and the next pull, already waiting, reads each variable only
// once it is final: the push's Finish returns while the server is held part
// way through its update (after the first variable), and the pulled values
// are all updated ones, through buffers and through the shared segment.
TEST(PsStreamsTest, APushIsAnsweredBeforeTheUpdateAndThePullReadsEachVariableOnceFinal) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared segment" : "slices");
    absl::Notification first_published, release;
    LocalPsCluster cluster(1, /*start=*/false);
    ps::ParameterServerOptions so;
    so.after_publish = [&](size_t count) {  // holds the first update only
      if (count != 1 || first_published.HasBeenNotified()) return;
      first_published.Notify();
      release.WaitForNotification();
    };
    cluster.set_server_options(so);
    ASSERT_TRUE(cluster.Start(0).ok());
    auto client = NewClient(SharedOrNot(cluster, shared));
    ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
    Buffers w(Vars());
    auto pull = client->StartPull(1, 1, w.ptrs);
    ASSERT_TRUE(pull.ok()) << pull.status();
    Buffers g = Grads();
    auto push = client->StartPush(0, 4, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(0, 3).ok());
    auto answered = std::async(std::launch::async, [&] { return (*push)->Finish(); });
    const bool in_time = answered.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    const bool held = first_published.WaitForNotificationWithTimeout(absl::Seconds(30));
    auto step = (*pull)->Step();  // served at once, the update still under way
    release.Notify();  // before anything that could end the test
    EXPECT_TRUE(in_time) << "the push was not answered while the update was held";
    EXPECT_TRUE(held);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 1);
    auto r = answered.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->applied, 1);
    EXPECT_EQ(r->global_step, 1);
    push->reset();  // cancels the call, answered already: the update goes on
    auto finished = (*pull)->Finish();
    ASSERT_TRUE(finished.ok()) << finished.status();
    EXPECT_EQ(*finished, 1);
    ExpectUpdated(w, true);
    EXPECT_EQ(client->bytes_pulled_in_place() > 0, shared);
  }
}

TEST(PsStreamsTest, GradientsSentFromSeveralThreadsAreAppliedOnce) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers g = Grads();
  auto push = client->StartPush(0, 1, g.const_ptrs);
  ASSERT_TRUE(push.ok()) << push.status();
  std::vector<std::thread> threads;
  for (int v = 0; v < 3; ++v) {
    threads.emplace_back([&, v] {
      EXPECT_TRUE((*push)->Send(v, 1).ok());
      EXPECT_TRUE((*push)->Send(0, 3).ok());  // a variable announced twice is sent once
    });
  }
  for (auto& t : threads) t.join();
  auto r = (*push)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 2);
  EXPECT_EQ(JobOn(cluster, 0).pushes_applied(), 1);
  EXPECT_EQ(JobOn(cluster, 1).pushes_applied(), 1);
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  ExpectUpdated(w, true);
}

TEST(PsStreamsTest, PushFinishedBeforeEveryGradientWasSentChangesNothing) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers g = Grads();
  {
    auto push = client->StartPush(0, 4, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(0, 1).ok());  // "big" only: ps 0's call opens and sends it
    auto r = (*push)->Finish();
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("gradient of mid was never sent"));
  }
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(JobOn(cluster, s).global_step(), 0) << "ps " << s;
    EXPECT_EQ(JobOn(cluster, s).pushes_applied(), 0) << "ps " << s;
  }
  // The step is still open: a whole push completes it, once.
  auto r = client->Push(0, 4, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  ExpectUpdated(w, true);
}

TEST(PsStreamsTest, AbandonedPushChangesNothing) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers g = Grads();
  {
    auto push = client->StartPush(0, 1, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(0, 2).ok());  // "big" (ps 0, whole) and "mid" (ps 1; "small" is missing)
    // Destroyed here, unfinished: its calls are cancelled.
  }
  Buffers w(Vars());
  auto step = client->Pull(0, 0, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  ExpectUpdated(w, false);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(JobOn(cluster, s).pushes_applied(), 0) << "ps " << s;
}

TEST(PsStreamsTest, AbandonedWaitingPullReturns) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  // SYNC with 2 workers: step 1 never comes.
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 2)).ok());
  Buffers w(Vars());
  auto pull = client->StartPull(1, 1, w.ptrs);
  ASSERT_TRUE(pull.ok()) << pull.status();
  ASSERT_TRUE(WaitFor([&] {
    return JobOn(cluster, 0).pulls_waiting() > 0 && JobOn(cluster, 1).pulls_waiting() > 0;
  }));
  auto destroyed = std::async(std::launch::async, [&] { pull->reset(); });
  ASSERT_EQ(destroyed.wait_for(absl::ToChronoSeconds(kStateDeadline)),
            std::future_status::ready);
  // The servers let go of it.
  EXPECT_TRUE(WaitFor([&] {
    return JobOn(cluster, 0).pulls_waiting() == 0 && JobOn(cluster, 1).pulls_waiting() == 0;
  }));
}

TEST(PsStreamsTest, AServersErrorReachesTheWaits) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));  // never registered: NOT_FOUND
  Buffers w(Vars());
  auto pull = client->StartPull(0, 0, w.ptrs);
  ASSERT_TRUE(pull.ok()) << pull.status();
  const absl::Status st = (*pull)->Wait(0, 3);
  ASSERT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("not registered"));
  EXPECT_EQ((*pull)->Step().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*pull)->Finish().status().code(), absl::StatusCode::kNotFound);
}

// Compression with the gradients announced layer by layer: each batch is
// encoded once as it is sent, and the servers apply what a whole push would
// (the values are exact in float16 and bfloat16; top-k at ratio 1 sends all).
TEST(PsStreamsTest, CompressedBatchesApplyAsAWholePush) {
  for (auto type : {v1::GradientCompression::FP16, v1::GradientCompression::BF16,
                    v1::GradientCompression::TOPK}) {
    SCOPED_TRACE(v1::GradientCompression::Type_Name(type));
    LocalPsCluster cluster(3);
    ParameterClientOptions o = Options(cluster, "j");
    o.compression.set_type(type);
    if (type == v1::GradientCompression::TOPK) o.compression.set_ratio(1.0);
    auto c = NewGrpcParameterClient(o, Vars(), v1::PARTITIONED);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Register(Config(v1::SYNC, 1)).ok());
    Buffers g = Grads();
    auto push = (*c)->StartPush(0, 4, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    for (int v = 2; v >= 0; --v) ASSERT_TRUE((*push)->Send(v, 1).ok());
    auto r = (*push)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->applied, 3);
    Buffers w(Vars());
    ASSERT_TRUE((*c)->Pull(1, 1, w.ptrs).ok());
    ExpectUpdated(w, true);
  }
}

TEST(PsStreamsTest, AGradientThatCannotBeEncodedAbandonsThePush) {
  LocalPsCluster cluster(2);
  ParameterClientOptions o = Options(cluster, "j");
  o.compression.set_type(v1::GradientCompression::FP16);
  auto client = NewClient(o);
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers g = Grads();
  g.tensors[0][5] = std::nanf("");
  auto push = client->StartPush(0, 4, g.const_ptrs);
  ASSERT_TRUE(push.ok()) << push.status();
  ASSERT_TRUE((*push)->Send(2, 1).ok());  // "small" goes out
  const absl::Status bad = (*push)->Send(0, 2);
  ASSERT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("\"big\" is NaN at element 5"));
  EXPECT_EQ((*push)->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(JobOn(cluster, s).global_step(), 0) << "ps " << s;
    EXPECT_EQ(JobOn(cluster, s).pushes_applied(), 0) << "ps " << s;
  }
}

// Same host: the servers write pulls into the client's shared memory and
// read pushes from it; with it off on either side the same values come over
// gRPC. Every case pulls
// the initial values, pushes once, and pulls the update.
TEST(PsStreamsTest, PullsGoThroughSharedMemoryWhereBothSidesAllowIt) {
  int64_t total_bytes = 0;
  for (const auto& v : Vars()) {
    int64_t n = 1;
    for (int64_t d : v.shape()) n *= d;
    total_bytes += n * 4;
  }
  struct Case {
    bool client, servers;
  };
  for (const Case c : {Case{true, true}, Case{false, true}, Case{true, false}}) {
    SCOPED_TRACE(absl::StrCat("client ", c.client, ", servers ", c.servers));
    LocalPsCluster cluster(2, /*start=*/true, /*shared_memory=*/c.servers);
    ParameterClientOptions o = Options(cluster, "j");
    o.shared_memory = c.client;
    auto client = NewClient(o);
    ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
    Buffers w(Vars());
    ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());
    ExpectUpdated(w, false);
    Buffers g = Grads();
    auto pushed = client->Push(0, 1, g.const_ptrs);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    Buffers again(Vars());
    auto step = client->Pull(1, 1, again.ptrs);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 1);
    ExpectUpdated(again, true);
    // Both pulls whole through the segments, and the push (after the first
    // pull showed that the servers can open them), or not at all.
    const bool shared = c.client && c.servers;
    EXPECT_EQ(client->bytes_pulled_in_place(), shared ? 2 * total_bytes : 0);
    EXPECT_EQ(client->bytes_pushed_in_place(), shared ? total_bytes : 0);
  }
}


// Weights and gradients living in the client's shared memory (as the trainer
// places them): the servers' pulls land in the weights themselves and pushes
// are read from the gradients, nothing copied on the worker, with the same
// values as through buffers of their own.
TEST(PsStreamsTest, TensorsLivingInTheSegmentArePulledAndPushedInPlace) {
  LocalPsCluster cluster(2, /*start=*/true, /*shared_memory=*/true);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  Buffers g = Grads();
  // Every variable's values and gradient: its own room, apart from the rest.
  std::vector<std::pair<const char*, const char*>> rooms;
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    float* values = client->SharedValues(static_cast<int>(v));
    float* grads = client->SharedGradients(static_cast<int>(v));
    ASSERT_NE(values, nullptr);
    ASSERT_NE(grads, nullptr);
    const int64_t bytes = w.tensors[v].num_bytes();
    rooms.emplace_back(reinterpret_cast<const char*>(values),
                       reinterpret_cast<const char*>(values) + bytes);
    rooms.emplace_back(reinterpret_cast<const char*>(grads),
                       reinterpret_cast<const char*>(grads) + bytes);
    w.tensors[v].MoveTo(values);
    g.tensors[v].MoveTo(grads);
  }
  for (size_t a = 0; a < rooms.size(); ++a) {
    for (size_t b = a + 1; b < rooms.size(); ++b) {
      EXPECT_TRUE(rooms[a].second <= rooms[b].first || rooms[b].second <= rooms[a].first)
          << "rooms " << a << " and " << b << " overlap";
    }
  }
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());
  ExpectUpdated(w, false);
  auto pushed = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  const Buffers reference = Grads();
  for (size_t v = 0; v < g.tensors.size(); ++v) {  // read, not changed
    ASSERT_EQ(std::vector<float>(g.tensors[v].span().begin(), g.tensors[v].span().end()),
              std::vector<float>(reference.tensors[v].span().begin(),
                                 reference.tensors[v].span().end()))
        << "gradient " << v;
  }
  auto step = client->Pull(1, 1, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  ExpectUpdated(w, true);
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    EXPECT_EQ(w.tensors[v].data(), client->SharedValues(static_cast<int>(v)));
  }
  EXPECT_GT(client->bytes_pulled_in_place(), 0);
  EXPECT_GT(client->bytes_pushed_in_place(), 0);
}


// A server's update reads a push's gradient in the segment after answering
// it (several workers: no copy), so a client that gives its memory back as
// soon as its last push is answered must not take the gradient's pages
// with it: the update, held after its first variable until then, still
// finds every gradient whole.
TEST(PsStreamsTest, TheLastPushIsReadWholeAfterTheClientReleasedItsMemory) {
  LocalPsCluster cluster(1, /*start=*/false, /*shared_memory=*/true);
  std::atomic<bool> hold{false};
  std::atomic<bool> held{false};
  absl::Notification go;
  ps::ParameterServerOptions options;
  options.after_publish = [&](size_t published) {
    if (published != 1 || !hold.load()) return;
    held.store(true);
    go.WaitForNotification();
  };
  cluster.set_server_options(options);
  ASSERT_TRUE(cluster.Start(0).ok());
  auto client = NewClient(Options(cluster, "j"));
  // Two workers: the update is not formed ahead, so it reads in place.
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 2)).ok());
  Buffers w(Vars());
  Buffers g = Grads();
  MoveIntoSegment(*client, w, g);
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());  // the server writes into the segment
  hold.store(true);
  auto pushed = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  ASSERT_TRUE(WaitFor([&] { return held.load(); }));  // the update read variable 0 only
  MoveOutAndRelease(*client, w, g);  // as the trainer does at its end
  go.Notify();
  Buffers after(Vars());
  ASSERT_TRUE(client->Pull(1, 0, after.ptrs).ok());
  ExpectUpdated(after, true);
  EXPECT_GT(client->bytes_pushed_in_place(), 0);
}

// One worker (SGD): its server writes the new values where its pulls land
// during the push (ps/push_session.h). A client that gives that memory
// back once its last push is answered (as the trainer does at its end,
// after its final pull) and pulls again gets the server's values, not
// what the released pages read as: such pulls land in the landing region.
// Before that, the next pull after a push writes nothing and the weights
// living in the segment are the new values.
TEST(PsStreamsTest, APullAfterTheClientReleasedItsMemoryGetsTheValuesWritten) {
  LocalPsCluster cluster(1, /*start=*/false, /*shared_memory=*/true);
  // The worker is this very process: updated ahead all the same, as from
  // a worker on cores apart (ps/push_session.h, "Updates ahead").
  ps::ParameterServerOptions options;
  options.as_if_on_cores_apart = true;
  cluster.set_server_options(options);
  ASSERT_TRUE(cluster.Start(0).ok());
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  Buffers g = Grads();
  MoveIntoSegment(*client, w, g);
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());  // the server writes into the segment
  ASSERT_TRUE(client->Push(0, 1, g.const_ptrs).ok());
  ExpectUpdated(w, true);  // written during the push
  ASSERT_TRUE(client->Pull(1, 0, w.ptrs).ok());
  ExpectUpdated(w, true);
  EXPECT_EQ(JobOn(cluster, 0).updates_ahead(), 1);
  ASSERT_TRUE(client->Push(1, 1, g.const_ptrs).ok());  // written again, then given back
  MoveOutAndRelease(*client, w, g);
  Buffers after(Vars());
  ASSERT_TRUE(client->Pull(2, 0, after.ptrs).ok());
  for (size_t v = 0; v < after.tensors.size(); ++v) {
    for (int64_t i = 0; i < after.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(after.tensors[v][i], (1.0f - kLr * Grad(v, i)) - kLr * Grad(v, i))
          << "variable " << v << " element " << i;
    }
  }
}

// A same-host server on the worker's cores (here the test's own process)
// answers a push it read in place with names_with_commit; the worker's
// later pushes to it then name every gradient in one message, with the
// commit, although they were announced one by one, from several threads
// (as backward and pipeline stages do) while the server's push executor
// may or may not be waiting yet, and apply as before. A server taken as on
// cores apart, or pushes over gRPC, keep getting each gradient as it is
// announced (where the threads announce them all before the server's push
// executor looks, that too is one message in place; over gRPC, none is
// in place).
TEST(PsStreamsTest, AServerOnTheWorkersCoresGetsEveryGradientWithTheCommit) {
  for (bool apart : {false, true}) {
    for (bool shared : {true, false}) {
      SCOPED_TRACE(absl::StrCat(apart ? "cores apart" : "same cores",
                                shared ? ", shared memory" : ", gRPC"));
      LocalPsCluster cluster(2, /*start=*/false, /*shared_memory=*/true);
      ps::ParameterServerOptions options;
      options.as_if_on_cores_apart = apart;
      cluster.set_server_options(options);
      for (int s = 0; s < 2; ++s) ASSERT_TRUE(cluster.Start(s).ok());
      auto client = NewClient(SharedOrNot(cluster, shared));
      ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
      Buffers w(Vars());
      Buffers g = Grads();
      ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());  // the servers write into the segment
      constexpr int kSteps = 12;
      for (int step = 0; step < kSteps; ++step) {
        auto push = client->StartPush(step, 1, g.const_ptrs);
        ASSERT_TRUE(push.ok()) << push.status();
        std::vector<std::thread> threads;
        for (int v = 0; v < 3; ++v) {
          threads.emplace_back([&, v] {
            for (int i = 0; i < (step + v) % 3; ++i) std::this_thread::yield();
            EXPECT_TRUE((*push)->Send(v, 1).ok());
          });
        }
        for (auto& t : threads) t.join();
        auto r = (*push)->Finish();
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->applied, 2);
        auto pulled = client->Pull(step + 1, step + 1, w.ptrs);
        ASSERT_TRUE(pulled.ok()) << pulled.status();
        EXPECT_EQ(*pulled, step + 1);
      }
      for (size_t v = 0; v < w.tensors.size(); ++v) {
        for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
          float want = 1.0f;
          for (int step = 0; step < kSteps; ++step) want -= kLr * Grad(v, i);
          ASSERT_EQ(w.tensors[v][i], want) << "variable " << v << " element " << i;
        }
      }
      for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(JobOn(cluster, s).pushes_applied(), kSteps) << "ps " << s;
        const int64_t at_once = JobOn(cluster, s).pushes_named_at_once();
        if (!shared) {
          EXPECT_EQ(at_once, 0) << "ps " << s;
        } else if (!apart) {
          // Every push after the first, whose answer tells.
          EXPECT_GE(at_once, kSteps - 1) << "ps " << s;
        }
      }
      EXPECT_EQ(client->bytes_pushed_in_place() > 0, shared);
    }
  }
}

// Once the servers take every gradient at once (same host, on the
// worker's cores), their calls start only with the last gradient: a push
// finished, or dropped, before that changes nothing on any server, and
// returns; the next whole push applies.
TEST(PsStreamsTest, APushOfGradientsNamedWithTheCommitAbandonedPartWayChangesNothing) {
  LocalPsCluster cluster(2, /*start=*/true, /*shared_memory=*/true);
  auto client = NewClient(SharedOrNot(cluster, true));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  Buffers g = Grads();
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());  // the servers write into the segment
  ASSERT_TRUE(client->Push(0, 1, g.const_ptrs).ok());  // answered: names with the commit
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  auto applied = [&] {
    return JobOn(cluster, 0).pushes_applied() + JobOn(cluster, 1).pushes_applied();
  };
  ASSERT_EQ(applied(), 2);
  {
    auto push = client->StartPush(1, 1, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(0, 2).ok());  // "small" is missing
    auto r = (*push)->Finish();
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("gradient of small was never sent"));
  }
  {
    auto push = client->StartPush(1, 1, g.const_ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_TRUE((*push)->Send(1, 2).ok());  // "big" is missing; dropped unfinished
  }
  EXPECT_EQ(applied(), 2);
  EXPECT_EQ(JobOn(cluster, 0).global_step(), 1);
  auto r = client->Push(1, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 2);
  EXPECT_EQ(applied(), 4);
  // Push sends every gradient in one batch: one message each time.
  EXPECT_EQ(JobOn(cluster, 0).pushes_named_at_once() + JobOn(cluster, 1).pushes_named_at_once(),
            4);
}

// A pull that fails part way, after a variable was written in place, is
// retried into the segment's landing region: the variable the first call
// completed (which the compute may already be reading, in the tensor that
// lives there) keeps what that call wrote, although the values changed on
// the server in between; the others arrive from the retry.
TEST(PsStreamsTest, ARetriedPullDoesNotWriteAVariableAlreadyInPlace) {
  LocalPsCluster cluster(1, /*start=*/true, /*shared_memory=*/true);
  ParameterClientOptions o = Options(cluster, "j");
  o.chunk_bytes = 4096;  // "big" (10240 bytes) is told in place on its own
  auto client = NewClient(o);
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers w(Vars());
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    w.tensors[v].MoveTo(client->SharedValues(static_cast<int>(v)));
  }
  absl::Mutex mu;
  std::vector<v1::SharedSegment> calls;  // the segment of each call, by pull_id
  bool failed = false, push_waited = false;
  std::thread pusher;
  cluster.service(0).set_pull_fault_for_testing(
      [&](const v1::PullRequest& r, size_t in_segment) -> grpc::Status {
        absl::MutexLock lock(&mu);
        if (calls.empty() || calls.back().pull_id() != r.segment().pull_id()) {
          calls.push_back(r.segment());
        }
        if (failed || in_segment != 1) return grpc::Status::OK;
        failed = true;
        // The values change before the retry: a push applied on the server.
        // It waits for this pull's writes to end (ParameterServer::Pull's
        // segment lease), so it runs on its own thread; the retry, a pull
        // into the segment too, waits for it in turn.
        pusher = std::thread([&cluster] {
          v1::PushHeader h;
          h.set_job_id("j");
          h.set_worker_task(0);
          h.set_incarnation(99);
          h.set_sequence(1);
          h.set_num_examples(1);
          auto session = cluster.server(0).BeginPush(h);
          ASSERT_TRUE(session.ok()) << session.status();
          const Buffers g = Grads();
          for (size_t v = 0; v < g.tensors.size(); ++v) {
            v1::TensorSlice slice;
            slice.set_var_index(static_cast<uint32_t>(v));
            slice.set_data(g.tensors[v].data(), g.tensors[v].num_bytes());
            EXPECT_TRUE((*session)->AddSlice(slice).ok());
          }
          EXPECT_TRUE(cluster.server(0).FinishPush(std::move(*session)).ok());
        });
        push_waited = WaitFor([&] { return JobOn(cluster, 0).pushes_waiting() == 1; });
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "test: the connection broke");
      });
  auto step = client->Pull(0, 0, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(failed);
  pusher.join();
  ASSERT_TRUE(push_waited);
  ASSERT_GE(calls.size(), 2u);
  for (int k = 0; k < calls[0].offsets_size(); ++k) {
    EXPECT_NE(calls[1].offsets(k), calls[0].offsets(k)) << "part " << k;  // the landing region
  }
  for (int64_t i = 0; i < w.tensors[0].num_elements(); ++i) {
    ASSERT_EQ(w.tensors[0][i], 1.0f) << "big, element " << i;  // as the first call wrote it
  }
  for (size_t v = 1; v < w.tensors.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(static_cast<int>(v), i))
          << "variable " << v << " element " << i;  // from the retry
    }
  }
}

// A server that wrote pulls into the segment but then cannot read a push
// from it: the push goes again as slices, applied once, and that server is
// not offered the segment again.
TEST(PsStreamsTest, APushTheServerCannotReadFromTheSegmentGoesAsSlices) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());
  const int64_t pulled = client->bytes_pulled_in_place();
  ASSERT_GT(pulled, 0);
  cluster.service(0).set_shared_memory(false);
  cluster.service(1).set_shared_memory(false);
  Buffers g = Grads();
  auto pushed = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->applied, 2);
  EXPECT_EQ(client->bytes_pushed_in_place(), 0);
  EXPECT_EQ(JobOn(cluster, 0).pushes_applied(), 1);
  EXPECT_EQ(JobOn(cluster, 1).pushes_applied(), 1);
  Buffers again(Vars());
  auto step = client->Pull(1, 1, again.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  ExpectUpdated(again, true);  // applied exactly once
  EXPECT_EQ(client->bytes_pulled_in_place(), pulled);  // not offered again
}

}  // namespace
}  // namespace towerps::worker
