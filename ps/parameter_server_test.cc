#include "ps/parameter_server.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/gradient_codec.h"
#include "common/process_cpu.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "ps/optimizer.h"
#include "ps/register_request_testing.h"

namespace towerps::ps {
namespace {

constexpr float kLr = kTwoVarJobLearningRate;

v1::TensorSlice Slice(uint32_t var, uint64_t offset, std::vector<float> values) {
  v1::TensorSlice s;
  s.set_var_index(var);
  s.set_offset(offset);
  s.set_data(values.data(), values.size() * sizeof(float));
  return s;
}

v1::PushHeader Header(int worker, uint64_t seq, int64_t step, int64_t n,
                      uint64_t incarnation = 7) {
  v1::PushHeader h;
  h.set_job_id("j");
  h.set_worker_task(worker);
  h.set_incarnation(incarnation);
  h.set_sequence(seq);
  h.set_step(step);
  h.set_num_examples(n);
  return h;
}

// Pushes gradient g (same value everywhere) for both variables.
absl::StatusOr<v1::PushResponse> PushConst(ParameterServer& ps, const v1::PushHeader& h,
                                           float g) {
  auto s = ps.BeginPush(h);
  if (!s.ok()) return s.status();
  auto st = (*s)->AddSlice(Slice(0, 0, std::vector<float>(6, g)));
  if (!st.ok()) return st;
  st = (*s)->AddSlice(Slice(1, 0, std::vector<float>(2, g)));
  if (!st.ok()) return st;
  return ps.FinishPush(std::move(*s));
}

// Waits (deadline 60 s, polling) until job "j"'s status satisfies `pred`:
// a test drives the other side by that state, not by sleeping.
bool WaitForJob(ParameterServer& ps, const std::function<bool(const v1::JobStatus&)>& pred) {
  v1::StatusRequest req;
  req.set_job_id("j");
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    const v1::StatusResponse s = ps.Status(req);
    if (s.jobs_size() == 1 && pred(s.jobs(0))) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// ... until job "j" has `n` pulls blocked in their wait.
bool WaitForWaitingPulls(ParameterServer& ps, int n) {
  return WaitForJob(ps, [n](const v1::JobStatus& j) { return j.pulls_waiting() == n; });
}

std::shared_ptr<const WeightsSnapshot> PullNow(ParameterServer& ps, int64_t min_step = 0) {
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_min_step(min_step);
  auto s = ps.Pull(r, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : nullptr;
}

TEST(ParameterServerTest, RegisterIsIdempotentAndInitializes) {
  ParameterServer ps({});
  auto r1 = ps.Register(TwoVarJob(v1::SYNC, 2));
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_TRUE(r1->created());
  auto r2 = ps.Register(TwoVarJob(v1::SYNC, 2));
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2->created());
  auto snap = PullNow(ps);
  EXPECT_EQ(snap->values[0], std::vector<float>(6, 1.0f));
  EXPECT_EQ(snap->values[1], std::vector<float>(2, 0.0f));

  auto other = TwoVarJob(v1::SYNC, 3);
  EXPECT_EQ(ps.Register(other).status().code(), absl::StatusCode::kFailedPrecondition);
  auto shape = TwoVarJob(v1::SYNC, 2);
  shape.mutable_variables(1)->set_shape(0, 5);
  auto st = ps.Register(shape).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("\"b\""), std::string::npos) << st;
}

// Workers register a job at once: one builds it, the others wait for it
// (never a second copy of its values) and are checked against it, so that
// one with another config is refused even while the job is being built.
TEST(ParameterServerTest, ConcurrentRegistersWaitForTheOneThatCreates) {
  absl::Notification release;
  std::atomic<int> builds{0};
  ParameterServerOptions options;
  options.before_create_job = [&] {
    if (builds.fetch_add(1) == 0) release.WaitForNotification();
  };
  ParameterServer ps(options);
  absl::StatusOr<v1::RegisterResponse> first, same, other;
  std::thread creator([&] { first = ps.Register(TwoVarJob(v1::SYNC, 2)); });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (builds.load() == 0 && absl::Now() < deadline) {  // until it is building
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::thread twin([&] { same = ps.Register(TwoVarJob(v1::SYNC, 2)); });
  std::thread odd([&] { other = ps.Register(TwoVarJob(v1::ASYNC, 2)); });
  while (ps.registers_waiting() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(ps.registers_waiting(), 2);
  release.Notify();
  creator.join();
  twin.join();
  odd.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->created());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_EQ(builds.load(), 1);
  ParameterServer alone({});
  ASSERT_TRUE(alone.Register(TwoVarJob(v1::SYNC, 2)).ok());
  EXPECT_EQ(ps.reserved_bytes(), alone.reserved_bytes());  // reserved once
}

TEST(ParameterServerTest, BadRegistrationsAreRejected) {
  ParameterServer ps({.task_index = 0, .max_job_bytes = 1 << 20});
  auto r = TwoVarJob(v1::SYNC, 2);
  r.set_job_id("");
  EXPECT_EQ(ps.Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = TwoVarJob(v1::SYNC, 2, /*replicas=*/3);
  EXPECT_NE(ps.Register(r).status().message().find("replicas_to_aggregate"), std::string::npos);
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(0)->set_shape(1, -1);
  EXPECT_EQ(ps.Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(1)->set_name("a");
  EXPECT_NE(ps.Register(r).status().message().find("twice"), std::string::npos);
  // An initializer that would start the values off NaN or Inf, or is not known.
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(0)->mutable_initializer()->set_value(INFINITY);
  absl::Status st = ps.Register(r).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("variable \"a\": initializer.value = inf"), std::string::npos)
      << st;
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(1)->mutable_initializer()->set_type(static_cast<v1::Initializer::Type>(9));
  st = ps.Register(r).status();
  EXPECT_NE(st.message().find("variable \"b\": initializer.type = 9 is unknown"),
            std::string::npos)
      << st;
  EXPECT_EQ(ps.Status(v1::StatusRequest()).jobs_size(), 0);
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(0)->set_shape(0, 1 << 20);
  EXPECT_EQ(ps.Register(r).status().code(), absl::StatusCode::kResourceExhausted);
  r = TwoVarJob(v1::SYNC, 2);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(-1);
  EXPECT_NE(ps.Register(r).status().message().find("learning_rate"), std::string::npos);
}

// Found by tests/fuzz:ps_fuzzer: a register naming 2^31 workers made the
// server allocate a record per worker (tens of GB) before any other check.
TEST(ParameterServerTest, WorkerCountIsBounded) {
  ParameterServer ps({});
  for (int workers : {kMaxWorkers + 1, 1 << 30, 0, -3}) {
    auto r = TwoVarJob(v1::SYNC, 2);
    r.mutable_config()->set_num_workers(workers);
    r.mutable_config()->set_replicas_to_aggregate(0);
    auto st = ps.Register(r).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << workers;
    EXPECT_NE(st.message().find("config.num_workers"), std::string::npos) << st;
  }
  auto r = TwoVarJob(v1::SYNC, 2);
  r.mutable_config()->set_num_workers(kMaxWorkers);
  EXPECT_TRUE(ps.Register(r).ok());
}

// Shapes whose element count overflows int64 (issue 15) are refused by the
// size check, naming the variable, never multiplied out.
TEST(ParameterServerTest, ShapesThatOverflowAreRefusedNamingTheVariable) {
  ParameterServer ps({});  // the default limit, 8 GiB
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{int64_t{1} << 31, (int64_t{1} << 33) - 1},
                                         {int64_t{1} << 33, int64_t{1} << 33, int64_t{1} << 33},
                                         {3, int64_t{1} << 31}}) {
    auto r = TwoVarJob(v1::SYNC, 2);
    r.mutable_variables(0)->clear_shape();
    for (int64_t d : shape) r.mutable_variables(0)->add_shape(d);
    auto st = ps.Register(r).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("variable \"a\" of shape"), std::string::npos) << st;
  }
}

TEST(ParameterServerTest, SyncAveragesWeightedByExamplesAndAppliesOnce) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  auto p0 = PushConst(ps, Header(0, 1, 0, /*n=*/3), 1.0f);
  ASSERT_TRUE(p0.ok()) << p0.status();
  EXPECT_EQ(p0->outcome(), v1::PushResponse::APPLIED);
  EXPECT_EQ(p0->global_step(), 0);  // still waiting for worker 1
  auto status = ps.Status({});
  EXPECT_EQ(status.jobs(0).waiting_for(0), 1);
  auto p1 = PushConst(ps, Header(1, 1, 0, /*n=*/1), 5.0f);
  ASSERT_TRUE(p1.ok());
  EXPECT_EQ(p1->global_step(), 1);
  // Mean gradient = (3*1 + 1*5) / 4 = 2; SGD: 1 - 0.5 * 2 = 0.
  auto snap = PullNow(ps, 1);
  EXPECT_EQ(snap->global_step, 1);
  for (float v : snap->values[0]) EXPECT_FLOAT_EQ(v, 0.0f);
  for (float v : snap->values[1]) EXPECT_FLOAT_EQ(v, -1.0f);
}

// Pushes a gradient around g for both variables: element i of a is
// g + 0.1 (i + 1) + 0.001, of b g - 0.1 (i + 1) - 0.001, so that the
// elements round differently.
absl::StatusOr<v1::PushResponse> PushRamp(ParameterServer& ps, const v1::PushHeader& h,
                                          float g, std::unique_ptr<Commit>* commit = nullptr) {
  std::vector<float> a(6), b(2);
  for (int i = 0; i < 6; ++i) a[i] = g + 0.1f * static_cast<float>(i + 1) + 1e-3f;
  for (int i = 0; i < 2; ++i) b[i] = g - 0.1f * static_cast<float>(i + 1) - 1e-3f;
  auto s = ps.BeginPush(h);
  if (!s.ok()) return s.status();
  if (auto st = (*s)->AddSlice(Slice(0, 0, a)); !st.ok()) return st;
  if (auto st = (*s)->AddSlice(Slice(1, 0, b)); !st.ok()) return st;
  return ps.FinishPush(std::move(*s), commit);
}

// One worker's gradient reaches the optimizer exactly as pushed, whatever its
// number of examples (n g / n rounds away from g for some g).
TEST(ParameterServerTest, SyncLoneWorkersGradientIsAppliedExactly) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 1)).ok());
  auto p = PushRamp(ps, Header(0, 1, 0, /*n=*/3), 0.0f);
  ASSERT_TRUE(p.ok()) << p.status();
  auto snap = PullNow(ps, 1);
  ASSERT_NE(snap, nullptr);
  for (int i = 0; i < 6; ++i) {
    const float g = 0.1f * static_cast<float>(i + 1) + 1e-3f;
    EXPECT_EQ(snap->values[0][i], 1.0f - kLr * g) << "a[" << i << "]";  // kLr * g is exact
  }
  for (int i = 0; i < 2; ++i) {
    const float g = -0.1f * static_cast<float>(i + 1) - 1e-3f;
    EXPECT_EQ(snap->values[1][i], 0.0f - kLr * g) << "b[" << i << "]";
  }
}

// Three workers with 1, 2 and 5 examples: the weighted mean, and the same
// bits whatever order their pushes arrive in.
TEST(ParameterServerTest, SyncMeanOfThreeWorkersIsWeightedAndIndependentOfArrivalOrder) {
  const float g[3] = {0.25f, -1.5f, 3.0f};
  const int64_t n[3] = {1, 2, 5};
  std::vector<std::vector<float>> first_a, first_b;
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 0, 1},
                                        std::vector<int>{1, 2, 0}}) {
    ParameterServer ps({});
    ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 3)).ok());
    for (int w : order) ASSERT_TRUE(PushRamp(ps, Header(w, 1, 0, n[w]), g[w]).ok());
    auto snap = PullNow(ps, 1);
    ASSERT_NE(snap, nullptr);
    ASSERT_EQ(snap->global_step, 1);
    const std::vector<float> a(snap->values[0].begin(), snap->values[0].end());
    const std::vector<float> b(snap->values[1].begin(), snap->values[1].end());
    if (first_a.empty()) {
      first_a.push_back(a);
      first_b.push_back(b);
    } else {
      EXPECT_EQ(a, first_a[0]) << "arrival order " << order[0] << order[1] << order[2];
      EXPECT_EQ(b, first_b[0]) << "arrival order " << order[0] << order[1] << order[2];
    }
    // Against the mean in double: each of the few float operations on the
    // way (a_i = n_i / 8, its product and sum, the update) rounds by at most
    // half an ulp of a value no larger than sum |a_i g_i| + 1 (for b: + 0).
    for (int i = 0; i < 6; ++i) {
      double mean = 0, bound = 1;
      for (int w = 0; w < 3; ++w) {
        const double gi = static_cast<double>(g[w] + 0.1f * static_cast<float>(i + 1) + 1e-3f);
        mean += static_cast<double>(n[w]) / 8.0 * gi;
        bound += std::abs(static_cast<double>(n[w]) / 8.0 * gi);
      }
      EXPECT_NEAR(a[i], 1.0 - kLr * mean, 8 * bound * std::ldexp(1.0, -24)) << "a[" << i << "]";
    }
  }
}

// A pull still streaming while the values change keeps its step's values
// (copy on write); when no pull holds the snapshot, updates are applied in
// place and pulls stream from the variables themselves, with no copy.
TEST(ParameterServerTest, HeldSnapshotKeepsItsValuesWhileTheJobMovesOn) {
  ParameterServer ps({});
  // Two workers (only worker 0 pushes): a job of one would form its updates
  // ahead, in the push's buffer (UpdateAheadTest).
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 2)).ok());
  auto held = PullNow(ps);  // step 0: a = 1
  const float* viewed = held->values[0].data();
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());  // a = 1 - 0.5 = 0.5
  auto next = PullNow(ps);
  EXPECT_EQ(held->global_step, 0);
  EXPECT_EQ(held->values[0], std::vector<float>(6, 1.0f));
  EXPECT_EQ(held->values[0].data(), viewed);  // the same memory, now the snapshot's own
  EXPECT_EQ(held->owned.size(), 2u);
  EXPECT_EQ(next->global_step, 1);
  EXPECT_EQ(next->values[0], std::vector<float>(6, 0.5f));
  EXPECT_NE(next->values[0].data(), viewed);
  held.reset();
  next.reset();

  auto before = PullNow(ps);
  const float* where = before->values[0].data();
  before.reset();
  ASSERT_TRUE(PushConst(ps, Header(0, 2, 1, 1), 1.0f).ok());  // a = 0
  auto after = PullNow(ps);
  EXPECT_EQ(after->global_step, 2);
  EXPECT_EQ(after->values[0], std::vector<float>(6, 0.0f));
  EXPECT_EQ(after->values[0].data(), where);
  EXPECT_TRUE(after->owned.empty());
}

// Job "j" (ASYNC, 2 workers of which worker 0 pushes, a = 1: updated in
// place, not ahead) with a pull that writes into a worker's segment holding
// its lease, and a push (a -= 0.5) waiting for it.
class SegmentLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ps_.Register(TwoVarJob(v1::ASYNC, 2)).ok());
    v1::PullRequest r;
    r.set_job_id("j");
    snap_ = ps_.Pull(r, absl::Now() + absl::Seconds(5), &lease_);
    ASSERT_TRUE(snap_.ok()) << snap_.status();
    ASSERT_NE(lease_, nullptr);
    push_ = std::thread([this] { pushed_ = PushConst(ps_, Header(0, 1, 0, 1), 1.0f); });
    ASSERT_TRUE(
        WaitForJob(ps_, [](const v1::JobStatus& j) { return j.pushes_waiting() == 1; }));
  }
  void TearDown() override {
    if (push_.joinable()) {
      Release();
      push_.join();
    }
  }
  // What the pull does when its writes are done: the snapshot, then the lease.
  void Release() {
    snap_ = absl::CancelledError();
    lease_.reset();
  }

  ParameterServer ps_{{}};
  std::shared_ptr<void> lease_;
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> snap_;
  absl::StatusOr<v1::PushResponse> pushed_;
  std::thread push_;
};

// The push waits for the lease, then applies in place (no copy).
TEST_F(SegmentLeaseTest, APushWaitsForItAndThenAppliesInPlace) {
  const float* viewed = (*snap_)->values[0].data();
  EXPECT_EQ((*snap_)->values[0], std::vector<float>(6, 1.0f));  // nothing changed under it
  EXPECT_TRUE((*snap_)->owned.empty());
  Release();
  push_.join();
  ASSERT_TRUE(pushed_.ok()) << pushed_.status();
  EXPECT_EQ(pushed_->outcome(), v1::PushResponse::APPLIED);
  auto after = PullNow(ps_);
  EXPECT_EQ(after->global_step, 1);
  EXPECT_EQ(after->values[0], std::vector<float>(6, 0.5f));
  EXPECT_EQ(after->values[0].data(), viewed);  // updated where it was: no copy
  EXPECT_TRUE(after->owned.empty());
}

// A job deleted meanwhile: the pull's view stays readable, and the push, once
// the lease goes, is refused as deleted.
TEST_F(SegmentLeaseTest, AJobDeletedUnderItRefusesTheWaitingPush) {
  v1::DeleteJobRequest del;
  del.set_job_id("j");
  EXPECT_TRUE(ps_.DeleteJob(del).existed());
  EXPECT_EQ((*snap_)->values[0], std::vector<float>(6, 1.0f));  // still there to write
  Release();
  push_.join();
  EXPECT_EQ(pushed_.status().code(), absl::StatusCode::kAborted) << pushed_.status();
  EXPECT_NE(pushed_.status().message().find("deleted"), std::string::npos) << pushed_.status();
}

TEST(ParameterServerTest, StaleAndRetriedPushesAreNotApplied) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2, /*replicas=*/1)).ok());
  ASSERT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->global_step(), 1);
  // Worker 1 was a backup: its gradient for step 0 arrives late.
  auto late = PushConst(ps, Header(1, 1, 0, 1), 1.0f);
  EXPECT_EQ(late->outcome(), v1::PushResponse::STALE);
  // Worker 0 retries its push (same incarnation and sequence): ignored.
  auto retry = PushConst(ps, Header(0, 1, 0, 1), 1.0f);
  EXPECT_EQ(retry->outcome(), v1::PushResponse::DUPLICATE);
  auto s = ps.Status({}).jobs(0);
  EXPECT_EQ(s.global_step(), 1);
  EXPECT_EQ(s.pushes_stale(), 1);
  EXPECT_EQ(s.pushes_duplicate(), 1);
  EXPECT_FLOAT_EQ(PullNow(ps)->values[0][0], 0.5f);  // applied exactly once
  // A push ahead of the server is refused.
  EXPECT_EQ(PushConst(ps, Header(0, 2, 5, 1), 1.0f).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterServerTest, ApplyLogRecordsOnlyAcceptedPushes) {
  const std::string path = ::testing::TempDir() + "/ps_apply.log";
  std::remove(path.c_str());
  auto log = ApplyLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  {
    ParameterServer ps({.apply_log = log->get()});
    ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2, /*replicas=*/1)).ok());
    ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2, /*replicas=*/1)).ok());  // not created again
    ASSERT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::APPLIED);
    ASSERT_EQ(PushConst(ps, Header(1, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::STALE);
    ASSERT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::DUPLICATE);
    ASSERT_EQ(PushConst(ps, Header(1, 2, 1, 1), 1.0f)->outcome(), v1::PushResponse::APPLIED);
    v1::DeleteJobRequest del;
    del.set_job_id("j");
    ps.DeleteJob(del);
  }
  log->reset();
  std::ifstream in(path);
  std::vector<std::string> events;
  for (std::string line; std::getline(in, line);) {
    events.push_back(line.substr(line.find(' ') + 1));  // drop the incarnation
  }
  EXPECT_EQ(events, (std::vector<std::string>{"create j 0", "apply j 0 0", "apply j 1 1",
                                              "delete j"}));
}

TEST(ParameterServerTest, AsyncRetryIsAppliedOnceButNewIncarnationIsNot) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  ASSERT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::APPLIED);
  ASSERT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::DUPLICATE);
  EXPECT_FLOAT_EQ(PullNow(ps)->values[0][0], 0.5f);
  // A restarted worker (new incarnation) starts its sequence again.
  auto fresh = PushConst(ps, Header(0, 1, 1, 1, /*incarnation=*/8), 1.0f);
  EXPECT_EQ(fresh->outcome(), v1::PushResponse::APPLIED);
  EXPECT_EQ(fresh->global_step(), 2);
  EXPECT_FLOAT_EQ(PullNow(ps)->values[0][0], 0.0f);
}

TEST(ParameterServerTest, MalformedPushesChangeNothing) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  auto expect_bad = [&](absl::Status st, const std::string& fragment) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st;
  };
  auto s = ps.BeginPush(Header(0, 1, 0, 1));
  expect_bad((*s)->AddSlice(Slice(9, 0, {1})), "var_index 9");
  v1::TensorSlice odd = Slice(0, 0, {1});
  odd.mutable_data()->push_back('x');
  expect_bad((*s)->AddSlice(odd), "not a multiple of 4");
  expect_bad((*s)->AddSlice(Slice(0, 2, {1})), "expected 0");
  expect_bad((*s)->AddSlice(Slice(1, 0, {1, 2, 3})), "runs past");
  ASSERT_TRUE((*s)->AddSlice(Slice(0, 0, {1, 1, 1})).ok());
  expect_bad(ps.FinishPush(std::move(*s)).status(), "incomplete");

  auto nan = ps.BeginPush(Header(0, 1, 0, 1));
  ASSERT_TRUE((*nan)->AddSlice(Slice(0, 0, std::vector<float>(6, 1.0f))).ok());
  ASSERT_TRUE((*nan)->AddSlice(
      Slice(1, 0, {1.0f, std::numeric_limits<float>::quiet_NaN()})).ok());
  expect_bad(ps.FinishPush(std::move(*nan)).status(), "NaN");

  expect_bad(ps.BeginPush(Header(3, 1, 0, 1)).status(), "worker_task 3");
  expect_bad(ps.BeginPush(Header(0, 0, 0, 1)).status(), "sequence");
  auto h = Header(0, 1, 0, 1);
  h.set_job_id("nope");
  EXPECT_EQ(ps.BeginPush(h).status().code(), absl::StatusCode::kNotFound);

  auto snap = PullNow(ps);
  EXPECT_EQ(snap->global_step, 0);
  EXPECT_EQ(snap->values[0], std::vector<float>(6, 1.0f));
  // The failed pushes took no sequence number: sequence 1 still applies.
  EXPECT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f)->outcome(), v1::PushResponse::APPLIED);
}

// Finite gradients whose absolute sum overflows a float are finite all the
// same: applied, not refused as "NaN or Inf".
TEST(ParameterServerTest, HugeFiniteGradientsAreApplied) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  const float huge = 1e38f;  // 6 of them sum past FLT_MAX (3.4e38)
  ASSERT_FALSE(std::isfinite(6 * huge));
  auto r = PushConst(ps, Header(0, 1, 0, 1), huge);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
  auto snap = PullNow(ps, 1);
  ASSERT_NE(snap, nullptr);
  for (float x : snap->values[0]) EXPECT_EQ(x, 1.0f - kLr * huge);
  // An infinity among them is still refused, wherever it is.
  auto s = ps.BeginPush(Header(0, 2, 1, 1));
  ASSERT_TRUE(s.ok());
  std::vector<float> g(6, huge);
  g[4] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE((*s)->AddSlice(Slice(0, 0, g)).ok());
  ASSERT_TRUE((*s)->AddSlice(Slice(1, 0, {huge, huge})).ok());
  const absl::Status bad = ps.FinishPush(std::move(*s)).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("variable 0 from worker 0 contains NaN or Inf"), std::string::npos)
      << bad;
}

TEST(ParameterServerTest, PullWaitsForStepAndTimesOutNamingWorkers) {
  ParameterServer ps({.task_index = 0, .max_pull_wait = absl::Milliseconds(300)});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_min_step(1);
  auto timed_out = ps.Pull(r, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out.status().message().find("waits for workers [1]"), std::string::npos)
      << timed_out.status();
  // Worker 1 pushes only once the pull is seen waiting.
  std::thread pusher([&] {
    ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
    ASSERT_TRUE(PushConst(ps, Header(1, 1, 0, 1), 1.0f).ok());
  });
  auto snap = ps.Pull(r, absl::Now() + absl::Seconds(60));
  pusher.join();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ((*snap)->global_step, 1);
  EXPECT_TRUE(WaitForWaitingPulls(ps, 0));  // no longer counted once served
}

TEST(ParameterServerTest, AsyncStalenessBoundMakesFastWorkerWait) {
  ParameterServer ps({.task_index = 0, .max_pull_wait = absl::Milliseconds(200)});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 2, 0, /*max_staleness=*/1)).ok());
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_worker_task(0);
  r.set_worker_iteration(1);  // worker 1 has done 0: within the bound
  EXPECT_TRUE(ps.Pull(r, absl::Now() + absl::Seconds(1)).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 2, 1, 1), 1.0f).ok());
  r.set_worker_iteration(2);  // 2 - 1 > 0 done by worker 1: must wait
  EXPECT_EQ(ps.Pull(r, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(PushConst(ps, Header(1, 1, 0, 1), 1.0f).ok());
  EXPECT_TRUE(ps.Pull(r, absl::Now() + absl::Seconds(1)).ok());
}

TEST(ParameterServerTest, AsyncPullAfterPushWaitsForThatPushOfThatIncarnation) {
  ParameterServer ps({.task_index = 0});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 2)).ok());
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_worker_task(0);
  r.set_worker_iteration(1);
  r.set_after_push(2);
  r.set_incarnation(7);
  auto expect_waits = [&](const char* why) {
    auto st = ps.Pull(r, absl::Now() + absl::Milliseconds(200)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << why << ": " << st;
    EXPECT_NE(st.message().find("for push 2 of worker 0"), std::string::npos) << st;
  };
  expect_waits("nothing pushed");
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  expect_waits("an earlier push");
  ASSERT_TRUE(PushConst(ps, Header(1, 2, 1, 1), 1.0f).ok());
  expect_waits("another worker's push");
  ASSERT_TRUE(PushConst(ps, Header(0, 2, 2, 1, /*incarnation=*/8), 1.0f).ok());
  expect_waits("another incarnation's push");
  // Without after_push, an unbounded ASYNC pull waits for nothing.
  v1::PullRequest plain = r;
  plain.clear_after_push();
  auto now = ps.Pull(plain, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ((*now)->global_step, 3);
  // Its push arrives while it waits (a new incarnation 7 record: the
  // worker's sequence 1, then 2): the answer includes it.
  std::thread pusher([&] {
    ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
    ASSERT_TRUE(PushConst(ps, Header(0, 1, 3, 1), 1.0f).ok());
    ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
    ASSERT_TRUE(PushConst(ps, Header(0, 2, 4, 1), 1.0f).ok());
  });
  auto snap = ps.Pull(r, absl::Now() + absl::Seconds(60));
  pusher.join();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ((*snap)->global_step, 5);
  auto after = PullNow(ps);
  for (size_t v = 0; v < after->values.size(); ++v) {
    (*snap)->AwaitReady(v);
    EXPECT_EQ((*snap)->values[v], after->values[v]) << "variable " << v;
  }
  // A later push of the same incarnation counts too.
  r.set_after_push(1);
  EXPECT_TRUE(ps.Pull(r, absl::Now() + absl::Seconds(10)).ok());
  // A worker the job does not have is named.
  r.set_worker_task(5);
  auto bad = ps.Pull(r, absl::Now() + absl::Seconds(10)).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("worker_task 5"), std::string::npos) << bad;
}

// Liveness: small peer timeouts; the waits below end by the timeout or by
// the awaited push, never by a sleep of the test's own.
v1::RegisterRequest LiveJob(v1::Mode mode, int workers, double peer_timeout_s,
                            int replicas = 0, int max_staleness = 0) {
  v1::RegisterRequest r = TwoVarJob(mode, workers, replicas, max_staleness);
  r.mutable_config()->set_peer_timeout_s(peer_timeout_s);
  r.set_worker_task(0);
  return r;
}

v1::PullRequest PullFor(int worker, int64_t min_step, int64_t iteration = 0) {
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_worker_task(worker);
  r.set_min_step(min_step);
  r.set_worker_iteration(iteration);
  return r;
}

absl::Status Beat(ParameterServer& ps, int worker) {
  v1::HeartbeatRequest h;
  h.set_job_id("j");
  h.set_worker_task(worker);
  return ps.Heartbeat(h).status();
}

TEST(LivenessTest, WorkerThatNeverJoinedFailsTheWaitingPull) {
  ParameterServer ps({.task_index = 3, .max_pull_wait = absl::Seconds(30)});
  ASSERT_TRUE(ps.Register(LiveJob(v1::SYNC, 2, 0.3)).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  const absl::Time start = absl::Now();
  auto r = ps.Pull(PullFor(0, 1), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  const std::string m(r.status().message());
  EXPECT_NE(m.find("job \"j\" on ps 3: step 1 waits for worker 1, not heard from for"),
            std::string::npos) << m;
  EXPECT_NE(m.find("never joined: not started, crashed or unreachable"), std::string::npos) << m;
  EXPECT_NE(m.find("peer_timeout_s=0.3"), std::string::npos) << m;
  // Generous: the bound follows from the 0.3 s timeout, not from max_pull_wait.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(LivenessTest, WorkerGoneSilentIsNamedWithHowItWasLastHeard) {
  ParameterServer ps({.task_index = 0, .max_pull_wait = absl::Seconds(30)});
  ASSERT_TRUE(ps.Register(LiveJob(v1::SYNC, 2, 0.3)).ok());
  ASSERT_TRUE(Beat(ps, 1).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  auto r = ps.Pull(PullFor(0, 1), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("worker 1, not heard from for"), std::string::npos);
  EXPECT_NE(r.status().message().find("last heard by heartbeat"), std::string::npos)
      << r.status();
}

TEST(LivenessTest, HeartbeatingWorkerIsWaitedForAndLostBackupIsNotNeeded) {
  // 3 workers, 2 replicas: worker 2 never joins (lost, but not needed);
  // worker 1 is slow but heartbeats for several timeouts, then pushes.
  ParameterServer ps({.task_index = 0, .max_pull_wait = absl::Seconds(30)});
  // The beats come every 50 ms against a 1 s timeout (a 20x margin for a
  // loaded machine), for 3.5 timeouts.
  ASSERT_TRUE(ps.Register(LiveJob(v1::SYNC, 3, 1.0, /*replicas=*/2)).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  std::thread slow([&] {
    const absl::Time until = absl::Now() + absl::Seconds(3.5);
    while (absl::Now() < until) {
      ASSERT_TRUE(Beat(ps, 1).ok());
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(PushConst(ps, Header(1, 1, 0, 1), 1.0f).ok());
  });
  auto r = ps.Pull(PullFor(0, 1), absl::Now() + absl::Seconds(30));
  slow.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->global_step, 1);
}

TEST(LivenessTest, AsyncStalenessWaitOnALostWorkerFails) {
  ParameterServer ps({.task_index = 0, .max_pull_wait = absl::Seconds(30)});
  ASSERT_TRUE(ps.Register(LiveJob(v1::ASYNC, 2, 0.2, 0, /*max_staleness=*/1)).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  ASSERT_TRUE(PushConst(ps, Header(0, 2, 1, 1), 1.0f).ok());
  auto r = ps.Pull(PullFor(0, 0, /*iteration=*/2), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("worker 0's iteration 2 (max_staleness 1) waits for "
                                      "worker 1"),
            std::string::npos)
      << r.status();
}

TEST(LivenessTest, HeartbeatAnswersStepAndIncarnationOrNotFound) {
  ParameterServer ps({});
  EXPECT_EQ(Beat(ps, 0).code(), absl::StatusCode::kNotFound);
  auto reg = ps.Register(LiveJob(v1::SYNC, 2, 1));
  ASSERT_TRUE(reg.ok());
  v1::HeartbeatRequest h;
  h.set_job_id("j");
  h.set_worker_task(1);
  auto r = ps.Heartbeat(h);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step(), 0);
  EXPECT_EQ(r->incarnation(), ps.Status({}).incarnation());
  EXPECT_EQ(r->incarnation(), reg->incarnation());
  h.set_worker_task(2);
  EXPECT_EQ(ps.Heartbeat(h).status().code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest bad = LiveJob(v1::SYNC, 2, -1);
  bad.set_job_id("k");
  EXPECT_EQ(ps.Register(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace towerps::ps

namespace towerps::ps {
namespace {

v1::RegisterRequest AdamJob() {
  v1::RegisterRequest r = TwoVarJob(v1::SYNC, 1);
  r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(0.1f);
  return r;
}

std::vector<std::vector<float>> PullValues(ParameterServer& ps, int64_t min_step) {
  v1::PullRequest p;
  p.set_job_id("j");
  p.set_min_step(min_step);
  auto snap = ps.Pull(p, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(snap.ok()) << snap.status();
  std::vector<std::vector<float>> out;
  if (snap.ok()) {
    for (const auto& v : (*snap)->values) out.emplace_back(v.begin(), v.end());
  }
  return out;
}

TEST(CheckpointTest, SaveThenRestoreContinuesBitIdentically) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt-0000000002";
  ParameterServer a({});
  ASSERT_TRUE(a.Register(AdamJob()).ok());
  ASSERT_TRUE(PushConst(a, Header(0, 1, 0, 4), 0.5f).ok());
  ASSERT_TRUE(PushConst(a, Header(0, 2, 1, 4), -0.25f).ok());
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_checkpoint_dir(dir);
  save.set_num_ps(1);
  auto saved = a.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->global_step(), 2);
  // The original continues one more step.
  ASSERT_TRUE(PushConst(a, Header(0, 3, 2, 4), 0.75f).ok());

  // A fresh server restores (values, Adam's slots and step) and takes the same step.
  ParameterServer b({});
  v1::RegisterRequest r = AdamJob();
  r.set_restore_from(dir);
  r.set_num_ps(1);
  auto reg = b.Register(r);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->global_step(), 2);
  EXPECT_EQ(reg->restored_step(), 2);
  ASSERT_TRUE(PushConst(b, Header(0, 1, 2, 4, /*incarnation=*/9), 0.75f).ok());
  EXPECT_EQ(PullValues(a, 3), PullValues(b, 3));
  v1::StatusRequest sr;
  const v1::JobStatus st = b.Status(sr).jobs(0);
  EXPECT_EQ(st.restored_step(), 2);
  EXPECT_EQ(st.steps_applied(), 1);  // only the step after the checkpoint
  EXPECT_GT(st.slot_bytes(), 0);
}

// A save writes the job's own memory (no copy) and, when an update lands
// while it writes, keeps the step it began at: the update goes to copies of
// the values and of Adam's slots (copy on write).
TEST(CheckpointTest, SaveWritesTheStepItBeganAtWhileAnUpdateLands) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  ParameterServerOptions o;
  ParameterServer* server = nullptr;
  int interleaved = 0;
  o.after_save_view = [&] {
    if (interleaved++ == 0) {
      ASSERT_TRUE(PushConst(*server, Header(0, 2, 1, 4), -0.25f).ok());
    }
  };
  ParameterServer a(o);
  server = &a;
  ParameterServer reference({});  // the same job, saved with no update landing
  for (ParameterServer* ps : {&a, &reference}) {
    ASSERT_TRUE(ps->Register(AdamJob()).ok());
    ASSERT_TRUE(PushConst(*ps, Header(0, 1, 0, 4), 0.5f).ok());  // step 1
  }
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_num_ps(1);
  // Without an update: the values the server goes on with are the very
  // buffers it had (nothing was copied for the save).
  auto before = PullNow(reference, 1);
  const float* where = before->values[0].data();
  before.reset();
  save.set_checkpoint_dir(tmp + "/quiet");
  ASSERT_TRUE(reference.Save(save).ok());
  EXPECT_EQ(PullNow(reference, 1)->values[0].data(), where);

  save.set_checkpoint_dir(tmp + "/busy");
  auto saved = a.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(interleaved, 1);
  EXPECT_EQ(saved->global_step(), 1);
  EXPECT_EQ(PullNow(a, 2)->global_step, 2);  // the update landed on the server
  auto busy = common::ReadShard(saved->path());
  auto quiet = common::ReadShard(tmp + "/quiet/" + common::ShardFileName(0, 1));
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_EQ(busy->global_step, 1);
  ASSERT_EQ(busy->vars.size(), quiet->vars.size());
  for (size_t v = 0; v < busy->vars.size(); ++v) {
    EXPECT_EQ(busy->vars[v].value, quiet->vars[v].value) << "variable " << v;
    EXPECT_EQ(busy->vars[v].updates, 1);
    ASSERT_EQ(busy->vars[v].slots.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(busy->vars[v].slots[k].values, quiet->vars[v].slots[k].values)
          << "variable " << v << " slot " << busy->vars[v].slots[k].name;
    }
  }
  // And the server went on exactly as one that saved at another time.
  ASSERT_TRUE(PushConst(reference, Header(0, 2, 1, 4), -0.25f).ok());
  EXPECT_EQ(PullValues(a, 2), PullValues(reference, 2));
}

// Deleting a job while a save writes it: the save still writes whole, from
// the buffers the deletion left it.
TEST(CheckpointTest, SaveOfAJobDeletedWhileItWritesStaysWhole) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  ParameterServerOptions o;
  ParameterServer* server = nullptr;
  o.after_save_view = [&] {
    v1::DeleteJobRequest d;
    d.set_job_id("j");
    EXPECT_TRUE(server->DeleteJob(d).existed());
  };
  ParameterServer a(o);
  server = &a;
  ASSERT_TRUE(a.Register(AdamJob()).ok());
  ASSERT_TRUE(PushConst(a, Header(0, 1, 0, 4), 0.5f).ok());
  const std::vector<std::vector<float>> values = PullValues(a, 1);
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_num_ps(1);
  save.set_checkpoint_dir(tmp + "/deleted");
  auto saved = a.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto shard = common::ReadShard(saved->path());
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ(shard->vars.size(), values.size());
  for (size_t v = 0; v < values.size(); ++v) EXPECT_EQ(shard->vars[v].value, values[v]);
}

TEST(CheckpointTest, RestoreRefusesAShardOfAnotherModel) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/other";
  ParameterServer a({});
  ASSERT_TRUE(a.Register(AdamJob()).ok());
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_checkpoint_dir(dir);
  save.set_num_ps(1);
  ASSERT_TRUE(a.Save(save).ok());
  ParameterServer b({});
  v1::RegisterRequest r = AdamJob();
  r.mutable_variables(1)->set_shape(0, 3);  // b is [3] now
  r.set_restore_from(dir);
  r.set_num_ps(1);
  auto reg = b.Register(r);
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kFailedPrecondition) << reg.status();
  EXPECT_NE(reg.status().message().find("\"b\""), std::string::npos) << reg.status();
  EXPECT_EQ(b.Status(v1::StatusRequest()).jobs_size(), 0);  // nothing created
  // A different optimizer (no slots where Adam had two) is refused too.
  v1::RegisterRequest sgd = TwoVarJob(v1::SYNC, 1);
  sgd.set_restore_from(dir);
  sgd.set_num_ps(1);
  EXPECT_EQ(b.Register(sgd).status().code(), absl::StatusCode::kFailedPrecondition);
  // A missing checkpoint is NotFound.
  v1::RegisterRequest missing = AdamJob();
  missing.set_restore_from(dir + "/nope");
  missing.set_num_ps(1);
  EXPECT_EQ(b.Register(missing).status().code(), absl::StatusCode::kNotFound);
}

// A shard whose values or slots hold what no update leaves (NaN or Inf;
// Adam's v below 0, which would make NaNs of the next update) is refused
// at restore, naming the variable and slot; nothing is created.
TEST(CheckpointTest, RestoreRefusesStateNoUpdateLeaves) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  ParameterServer a({});
  ASSERT_TRUE(a.Register(AdamJob()).ok());
  ASSERT_TRUE(PushConst(a, Header(0, 1, 0, 4), 0.5f).ok());
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_checkpoint_dir(tmp + "/good");
  save.set_num_ps(1);
  auto saved = a.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  struct Case {
    std::string name, want;
    std::function<void(common::ShardState&)> spoil;
  };
  const std::vector<Case> cases = {
      {"nan_value", "variable \"a\" holds NaN or Inf",
       [](common::ShardState& s) { s.vars[0].value[2] = NAN; }},
      {"inf_slot", "variable \"b\" slot \"m\" holds NaN or Inf",
       [](common::ShardState& s) { s.vars[1].slots[0].values[1] = -INFINITY; }},
      {"negative_v", "variable \"a\" slot \"v\" holds -0.5 at element 4",
       [](common::ShardState& s) { s.vars[0].slots[1].values[4] = -0.5f; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto shard = common::ReadShard(saved->path());
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_EQ(shard->vars[0].slots.size(), 2u);
    c.spoil(*shard);
    const std::string dir = tmp + "/" + c.name;
    ASSERT_TRUE(common::WriteShard(dir, *shard).ok());
    ParameterServer b({});
    v1::RegisterRequest r = AdamJob();
    r.set_restore_from(dir);
    r.set_num_ps(1);
    auto reg = b.Register(r);
    EXPECT_EQ(reg.status().code(), absl::StatusCode::kFailedPrecondition) << reg.status();
    EXPECT_NE(reg.status().message().find(c.want), std::string::npos) << reg.status();
    EXPECT_EQ(b.Status(v1::StatusRequest()).jobs_size(), 0);
  }
  // The shard as saved restores.
  ParameterServer c({});
  v1::RegisterRequest r = AdamJob();
  r.set_restore_from(tmp + "/good");
  r.set_num_ps(1);
  EXPECT_TRUE(c.Register(r).ok());
}

// Issue 15: Save and restore stay under --state_dir (checkpoint_roots).
TEST(CheckpointTest, SaveAndRestoreOutsideTheStateDirAreRefused) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  const std::string root = tmp + "/confined_state";
  const std::string outside = tmp + "/confined_outside";
  auto roots = common::PathRoots::Create("--state_dir", {root});
  ASSERT_TRUE(roots.ok());
  ParameterServerOptions o;
  o.checkpoint_roots = *roots;
  ParameterServer ps(o);
  ASSERT_TRUE(ps.Register(AdamJob()).ok());
  for (const std::string& dir : {outside + "/ckpt", std::string("../confined_outside/ckpt"),
                                 root + "/../confined_outside/ckpt", std::string("/x/deep/dir")}) {
    v1::SaveRequest save;
    save.set_job_id("j");
    save.set_checkpoint_dir(dir);
    save.set_num_ps(1);
    auto saved = ps.Save(save);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument) << dir;
    EXPECT_NE(saved.status().message().find("save: checkpoint_dir \"" + dir + "\""),
              std::string::npos)
        << saved.status();
    EXPECT_NE(saved.status().message().find("is outside --state_dir"), std::string::npos)
        << saved.status();
  }
  EXPECT_FALSE(std::filesystem::exists(outside));
  EXPECT_FALSE(std::filesystem::exists("/x/deep"));
  // Relative paths go under the root; the shard is written there.
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_checkpoint_dir("jobs/j/ckpt-0000000000");
  save.set_num_ps(1);
  auto saved = ps.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->path().rfind(root + "/jobs/j/ckpt-0000000000/", 0), 0u) << saved->path();
  // Restore: from inside, fine; from outside, refused before anything is read.
  ParameterServer b(o);
  v1::RegisterRequest r = AdamJob();
  r.set_restore_from(outside);
  r.set_num_ps(1);
  auto reg = b.Register(r);
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kInvalidArgument) << reg.status();
  EXPECT_NE(reg.status().message().find("register: restore_from"), std::string::npos);
  EXPECT_EQ(b.Status(v1::StatusRequest()).jobs_size(), 0);
  r.set_restore_from(root + "/jobs/j/ckpt-0000000000");
  EXPECT_TRUE(b.Register(r).ok());
}

// Batch norm's moving statistics beside a trained variable in one job:
// "a" [2x3] (OPTIMIZER, 1.0) and "b" [2] (MOVING_AVERAGE, 2.0). The job's
// SGD has learning rate kLr and weight decay kWd.
constexpr float kWd = 0.1f;
constexpr float kDecay = 0.9f;

v1::RegisterRequest MovingJob(v1::Mode mode, int workers, float decay = kDecay) {
  v1::RegisterRequest r = TwoVarJob(mode, workers);
  r.mutable_config()->mutable_optimizer()->set_weight_decay(kWd);
  v1::VariableDef* b = r.mutable_variables(1);
  b->set_name("bn/moving_mean");
  b->set_update(v1::VariableDef::MOVING_AVERAGE);
  b->set_moving_average_decay(decay);
  b->mutable_initializer()->set_type(v1::Initializer::CONSTANT);
  b->mutable_initializer()->set_value(2.0f);
  return r;
}

// Pushes gradient `g` (everywhere) for "a" and the statistic `stat` for "b".
absl::StatusOr<v1::PushResponse> PushMoving(ParameterServer& ps, const v1::PushHeader& h,
                                            float g, std::vector<float> stat) {
  auto s = ps.BeginPush(h);
  if (!s.ok()) return s.status();
  auto st = (*s)->AddSlice(Slice(0, 0, std::vector<float>(6, g)));
  if (!st.ok()) return st;
  st = (*s)->AddSlice(Slice(1, 0, std::move(stat)));
  if (!st.ok()) return st;
  return ps.FinishPush(std::move(*s));
}

// A few float roundings of the magnitudes of the terms summed.
double Ulps(double a, double b) {
  return 4 * std::numeric_limits<float>::epsilon() * (std::abs(a) + std::abs(b));
}

// value = d * w + (1 - d) * pushed, d the float decay, in double.
void ExpectMoving(float got, double w, double pushed, const std::string& what) {
  const double d = kDecay;
  EXPECT_NEAR(got, d * w + (1 - d) * pushed, Ulps(d * w, (1 - d) * pushed))
      << what << ": w " << w << ", pushed " << pushed;
}

// SGD with weight decay: w - lr * (g + wd * w), in double.
void ExpectSgd(float got, double w, double g, const std::string& what) {
  const double lr = kLr, wd = kWd;
  EXPECT_NEAR(got, w - lr * (g + wd * w), Ulps(w, lr * (std::abs(g) + std::abs(wd * w))))
      << what << ": w " << w << ", g " << g;
}

TEST(MovingAverageServerTest, SyncAveragesTheWorkersPushesThenAppliesTheRule) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(MovingJob(v1::SYNC, 2)).ok());
  // Step 0, weighted like gradients by examples (3 and 1): mean statistic
  // (3 * 4 + 8) / 4 = 5 and (3 * -8 + 0) / 4 = -6; mean gradient 2.
  ASSERT_EQ(PushMoving(ps, Header(0, 1, 0, 3), 1.0f, {4.0f, -8.0f})->global_step(), 0);
  auto snap = PullNow(ps);
  EXPECT_EQ(snap->values[1], (std::vector<float>{2.0f, 2.0f}));  // Nothing before the step.
  ASSERT_EQ(PushMoving(ps, Header(1, 1, 0, 1), 5.0f, {8.0f, 0.0f})->global_step(), 1);
  snap = PullNow(ps, 1);
  ExpectMoving(snap->values[1][0], 2.0, 5.0, "step 1 [0]");   // 2.3
  ExpectMoving(snap->values[1][1], 2.0, -6.0, "step 1 [1]");  // 1.2
  // The trained variable beside it gets SGD with weight decay: 1 - 0.5 * 2.1.
  for (float v : snap->values[0]) ExpectSgd(v, 1.0, 2.0, "a, step 1");
  // Step 1, equal examples: the plain mean (1 + 3) / 2 = 2 and (-1 + -5) / 2 = -3.
  const std::vector<float> before(snap->values[1].begin(), snap->values[1].end());
  ASSERT_TRUE(PushMoving(ps, Header(1, 2, 1, 2), 0.0f, {1.0f, -1.0f}).ok());
  ASSERT_EQ(PushMoving(ps, Header(0, 2, 1, 2), 0.0f, {3.0f, -5.0f})->global_step(), 2);
  snap = PullNow(ps, 2);
  ExpectMoving(snap->values[1][0], before[0], 2.0, "step 2 [0]");
  ExpectMoving(snap->values[1][1], before[1], -3.0, "step 2 [1]");
  // No slots for the statistic; SGD has none either.
  EXPECT_EQ(ps.Status({}).jobs(0).slot_bytes(), 0);
}

TEST(MovingAverageServerTest, AsyncAppliesEachPushAlone) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(MovingJob(v1::ASYNC, 2)).ok());
  ASSERT_EQ(PushMoving(ps, Header(0, 1, 0, 1), 1.0f, {10.0f, 20.0f})->global_step(), 1);
  auto s1 = PullNow(ps, 1);
  ExpectMoving(s1->values[1][0], 2.0, 10.0, "push 1 [0]");  // 2.8
  ExpectMoving(s1->values[1][1], 2.0, 20.0, "push 1 [1]");  // 3.8
  for (float v : s1->values[0]) ExpectSgd(v, 1.0, 1.0, "a, push 1");
  ASSERT_EQ(PushMoving(ps, Header(1, 1, 0, 5), -2.0f, {0.0f, -10.0f})->global_step(), 2);
  auto s2 = PullNow(ps, 2);
  ExpectMoving(s2->values[1][0], s1->values[1][0], 0.0, "push 2 [0]");
  ExpectMoving(s2->values[1][1], s1->values[1][1], -10.0, "push 2 [1]");
  for (size_t i = 0; i < 6; ++i) ExpectSgd(s2->values[0][i], s1->values[0][i], -2.0, "a, push 2");
}

// Adam beside a moving statistic: slots only for the trained variable, in
// Status, DeleteJob and checkpoints.
TEST(MovingAverageServerTest, OnlyTrainedVariablesHoldSlots) {
  ParameterServer ps({});
  v1::RegisterRequest r = MovingJob(v1::SYNC, 1);
  r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  ASSERT_TRUE(ps.Register(r).ok());
  const v1::JobStatus st = ps.Status({}).jobs(0);
  EXPECT_EQ(st.slot_bytes(), 2 * 6 * 4);  // Adam's m and v of "a" only.
  EXPECT_EQ(st.bytes_held(), (6 + 2) * 4);
  v1::DeleteJobRequest d;
  d.set_job_id("j");
  EXPECT_EQ(ps.DeleteJob(d).bytes_freed(), (6 + 2) * 4 + 2 * 6 * 4);
}

TEST(MovingAverageServerTest, NonFiniteStatisticIsRefused) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(MovingJob(v1::ASYNC, 1)).ok());
  auto r = PushMoving(ps, Header(0, 1, 0, 1), 1.0f,
                      {1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("batch statistic of variable 1"), std::string::npos)
      << r.status();
  EXPECT_EQ(PullNow(ps)->values[1], (std::vector<float>{2.0f, 2.0f}));
}

TEST(MovingAverageServerTest, RegisterRefusesBadDecayOrUpdateNamingTheVariable) {
  ParameterServer ps({});
  auto expect_refused = [&](const v1::RegisterRequest& r, const std::string& field) {
    const absl::Status s = ps.Register(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("variable \"bn/moving_mean\""), std::string::npos) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
    EXPECT_EQ(ps.Status({}).jobs_size(), 0) << "a job was created for " << s;
  };
  for (float decay : {1.0f, -0.1f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(decay);
    expect_refused(MovingJob(v1::SYNC, 2, decay), "moving_average_decay");
  }
  v1::RegisterRequest unknown = MovingJob(v1::SYNC, 2);
  unknown.mutable_variables(1)->set_update(static_cast<v1::VariableDef::Update>(3));
  expect_refused(unknown, "update = 3");
  v1::RegisterRequest decay_on_trained = MovingJob(v1::SYNC, 2);
  decay_on_trained.mutable_variables(1)->set_update(v1::VariableDef::OPTIMIZER);
  expect_refused(decay_on_trained, "moving_average_decay");

  // A good one registers; the same job with another decay does not match it.
  ASSERT_TRUE(ps.Register(MovingJob(v1::SYNC, 2)).ok());
  EXPECT_EQ(ps.Register(MovingJob(v1::SYNC, 2, 0.5f)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A bad definition is a bad request even when the job exists: validated
  // before anything is looked up or created.
  const absl::Status s = ps.Register(MovingJob(v1::SYNC, 2, 1.0f)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("variable \"bn/moving_mean\": moving_average_decay = 1"),
            std::string::npos) << s;
}

TEST(MovingAverageServerTest, CheckpointRoundTripsTheStatistic) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/moving";
  auto adam_job = [](float decay = kDecay) {
    v1::RegisterRequest r = MovingJob(v1::SYNC, 1, decay);
    r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
    r.mutable_config()->mutable_optimizer()->set_learning_rate(0.1f);
    return r;
  };
  ParameterServer a({});
  ASSERT_TRUE(a.Register(adam_job()).ok());
  ASSERT_TRUE(PushMoving(a, Header(0, 1, 0, 4), 0.5f, {7.0f, -3.0f}).ok());
  ASSERT_TRUE(PushMoving(a, Header(0, 2, 1, 4), -0.25f, {6.0f, -1.0f}).ok());
  const std::vector<std::vector<float>> at_save = PullValues(a, 2);
  ASSERT_NE(at_save[1], (std::vector<float>{2.0f, 2.0f}));  // It has moved.
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_checkpoint_dir(dir);
  save.set_num_ps(1);
  auto saved = a.Save(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->bytes(), 4 * (6 + 2 + 2 * 6));  // Values, and Adam's slots of "a" only.
  ASSERT_TRUE(PushMoving(a, Header(0, 3, 2, 4), 0.75f, {1.0f, 1.0f}).ok());

  ParameterServer b({});
  v1::RegisterRequest r = adam_job();
  r.set_restore_from(dir);
  r.set_num_ps(1);
  auto reg = b.Register(r);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->restored_step(), 2);
  EXPECT_EQ(PullValues(b, 2), at_save);  // Exactly the saved values.
  ASSERT_TRUE(PushMoving(b, Header(0, 1, 2, 4, /*incarnation=*/9), 0.75f, {1.0f, 1.0f}).ok());
  EXPECT_EQ(PullValues(a, 3), PullValues(b, 3));  // And the same next step, bit for bit.

  // The statistic registered as trained, or the job with another optimizer
  // (its slots differ), is refused, and nothing is created.
  ParameterServer c({});
  v1::RegisterRequest trained = adam_job(0.0f);
  trained.mutable_variables(1)->set_update(v1::VariableDef::OPTIMIZER);
  trained.set_restore_from(dir);
  trained.set_num_ps(1);
  absl::Status st = c.Register(trained).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("\"bn/moving_mean\" has update MOVING_AVERAGE"), std::string::npos)
      << st;
  v1::RegisterRequest momentum = adam_job();
  momentum.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::MOMENTUM);
  momentum.set_restore_from(dir);
  momentum.set_num_ps(1);
  st = c.Register(momentum).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("optimizer slots"), std::string::npos) << st;
  EXPECT_EQ(c.Status({}).jobs_size(), 0);
  // Another decay is the registration's choice: restored from the same values.
  v1::RegisterRequest other_decay = adam_job(0.5f);
  other_decay.set_restore_from(dir);
  other_decay.set_num_ps(1);
  ASSERT_TRUE(c.Register(other_decay).ok());
  EXPECT_EQ(PullValues(c, 2), at_save);
}

// Compressed pushes (issue 16): a slice with raw bytes as its data.
v1::TensorSlice Encoded(uint32_t var, uint64_t offset, std::string data) {
  v1::TensorSlice s;
  s.set_var_index(var);
  s.set_offset(offset);
  s.set_data(std::move(data));
  return s;
}

std::string Halves(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    const uint16_t h = common::FloatToHalf(v);
    out.append(reinterpret_cast<const char*>(&h), 2);
  }
  return out;
}

std::string Bf16(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    const uint16_t b = common::FloatToBfloat16(v);
    out.append(reinterpret_cast<const char*>(&b), 2);
  }
  return out;
}

std::string TopK(uint32_t length, const std::vector<uint32_t>& indices,
                 const std::vector<float>& values) {
  std::string out(reinterpret_cast<const char*>(&length), 4);
  for (uint32_t i : indices) out.append(reinterpret_cast<const char*>(&i), 4);
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

v1::PushHeader Compressed(v1::SliceEncoding encoding, int worker, uint64_t seq, int64_t step) {
  v1::PushHeader h = Header(worker, seq, step, 1);
  h.set_slice_encoding(encoding);
  return h;
}

absl::StatusOr<v1::PushResponse> PushSlices(ParameterServer& ps, const v1::PushHeader& h,
                                            const std::vector<v1::TensorSlice>& slices) {
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<PushSession> s, ps.BeginPush(h));
  for (const auto& slice : slices) TOWERPS_RETURN_IF_ERROR(s->AddSlice(slice));
  return ps.FinishPush(std::move(s));
}

// Every encoding decodes into the same float update: values that the half
// formats hold exactly, a top-k push in two slices with zeros between.
TEST(CompressedPushTest, EachEncodingAppliesTheDecodedGradient) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  const std::vector<float> a = {1, -2, 0.5f, 4, 0, -0.25f}, b = {2, -1};
  ASSERT_EQ(PushSlices(ps, Compressed(v1::SLICE_FLOAT16, 0, 1, 0),
                       {Encoded(0, 0, Halves({1, -2})), Encoded(0, 2, Halves({0.5f, 4, 0, -0.25f})),
                        Encoded(1, 0, Halves(b))})
                ->outcome(),
            v1::PushResponse::APPLIED);
  auto snap = PullNow(ps, 1);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(snap->values[0][i], 1.0f - kLr * a[i]) << i;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(snap->values[1][i], -kLr * b[i]) << i;

  ASSERT_TRUE(PushSlices(ps, Compressed(v1::SLICE_BFLOAT16, 0, 2, 1),
                         {Encoded(0, 0, Bf16(a)), Encoded(1, 0, Bf16(b))})
                  .ok());
  snap = PullNow(ps, 2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(snap->values[0][i], 1.0f - 2 * kLr * a[i]) << i;

  // Top-k: a[1] = -2 and a[3] = 4 in [0, 3) and [3, 6); b[1] = -1 in one.
  ASSERT_TRUE(PushSlices(ps, Compressed(v1::SLICE_TOPK, 0, 3, 2),
                         {Encoded(0, 0, TopK(3, {1}, {-2})), Encoded(0, 3, TopK(3, {0}, {4})),
                          Encoded(1, 0, TopK(2, {1}, {-1}))})
                  .ok());
  snap = PullNow(ps, 3);
  for (int i = 0; i < 6; ++i) {
    const float sent = (i == 1 || i == 3) ? a[i] : 0.0f;
    EXPECT_EQ(snap->values[0][i], 1.0f - 2 * kLr * a[i] - kLr * sent) << i;
  }
  EXPECT_EQ(snap->values[1][0], -2 * kLr * b[0]);
  EXPECT_EQ(snap->values[1][1], -3 * kLr * b[1]);
}

// Batch norm's statistics stay float32 in a compressed push.
TEST(CompressedPushTest, MovingAverageSlicesStayFloat32) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(MovingJob(v1::ASYNC, 1)).ok());
  ASSERT_TRUE(PushSlices(ps, Compressed(v1::SLICE_TOPK, 0, 1, 0),
                         {Encoded(0, 0, TopK(6, {2}, {1.0f})), Slice(1, 0, {10.0f, 20.0f})})
                  .ok());
  auto snap = PullNow(ps, 1);
  ExpectMoving(snap->values[1][0], 2.0, 10.0, "[0]");
  ExpectMoving(snap->values[1][1], 2.0, 20.0, "[1]");
  ExpectSgd(snap->values[0][2], 1.0, 1.0, "a[2], sent");
  ExpectSgd(snap->values[0][0], 1.0, 0.0, "a[0], not sent");
}

TEST(CompressedPushTest, MalformedCompressedPushesNameTheVariableAndChangeNothing) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 1)).ok());
  const v1::TensorSlice good_b = Encoded(1, 0, TopK(2, {0}, {1}));
  struct Case {
    v1::SliceEncoding encoding;
    v1::TensorSlice slice;
    const char* says;
  };
  const std::vector<Case> cases = {
      {v1::SLICE_TOPK, Encoded(0, 0, TopK(7, {0}, {1})),
       "variable 0 from worker 0 at element 0: top-k slice: its length 7 runs past the end "
       "(6 elements left)"},
      {v1::SLICE_TOPK, Encoded(0, 0, TopK(6, {6}, {1})), "index 6 (entry 0) is out of range"},
      {v1::SLICE_TOPK, Encoded(0, 0, TopK(6, {3, 1}, {1, 1})), "not strictly increasing"},
      {v1::SLICE_TOPK, Encoded(0, 0, TopK(6, {3}, {std::numeric_limits<float>::infinity()})),
       "is Inf or NaN"},
      {v1::SLICE_TOPK, Encoded(0, 0, "abc"), "shorter than its 4-byte length"},
      {v1::SLICE_TOPK, Encoded(0, 0, TopK(0, {}, {})), "its length is 0"},
      {v1::SLICE_TOPK, Encoded(0, 1, TopK(5, {0}, {1})), "starts at element 1, expected 0"},
      {v1::SLICE_TOPK, Encoded(7, 0, TopK(5, {0}, {1})), "var_index 7 is out of range"},
      {v1::SLICE_FLOAT16, Encoded(0, 0, Halves({1}) + "x"), "not a whole number of 2-byte"},
      {v1::SLICE_FLOAT16, Encoded(0, 0, Halves(std::vector<float>(7, 1))),
       "7 values run past the end"},
      {v1::SLICE_FLOAT16, Encoded(0, 0, std::string("\x00\x7c", 2)), "value 0 is Inf or NaN"},
      {v1::SLICE_BFLOAT16, Encoded(0, 0, std::string("\xc0\x7f", 2)), "value 0 is Inf or NaN"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<v1::PushResponse> r =
        PushSlices(ps, Compressed(c.encoding, 0, 1, 0), {c.slice, good_b});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status();
  }
  // Covering too little is incomplete, as for float32.
  auto r = PushSlices(ps, Compressed(v1::SLICE_TOPK, 0, 1, 0),
                      {Encoded(0, 0, TopK(5, {0}, {1})), good_b});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("incomplete: variable 0 got 5 of 6"), std::string::npos)
      << r.status();
  v1::PushHeader unknown = Compressed(v1::SLICE_TOPK, 0, 1, 0);
  unknown.set_slice_encoding(static_cast<v1::SliceEncoding>(42));
  EXPECT_EQ(ps.BeginPush(unknown).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ps.BeginPush(unknown).status().message().find("unknown slice_encoding 42"),
            std::string::npos);

  auto snap = PullNow(ps);
  EXPECT_EQ(snap->global_step, 0);
  EXPECT_EQ(snap->values[0], std::vector<float>(6, 1.0f));
  const v1::StatusResponse st = ps.Status({});
  EXPECT_EQ(st.jobs(0).pushes_applied(), 0);
  // Sequence 1 was never taken: it still applies.
  EXPECT_EQ(PushSlices(ps, Compressed(v1::SLICE_TOPK, 0, 1, 0),
                       {Encoded(0, 0, TopK(6, {5}, {2})), good_b})
                ->outcome(),
            v1::PushResponse::APPLIED);
  EXPECT_EQ(PullNow(ps, 1)->values[0][5], 1.0f - kLr * 2);
}

TEST(StopWaitingTest, WakesWaitingPullsWithUnavailableAndServesReadyOnes) {
  ParameterServer ps({.task_index = 3, .max_pull_wait = absl::Seconds(60)});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  absl::Status waited;
  std::thread puller([&] {
    v1::PullRequest p;
    p.set_job_id("j");
    p.set_min_step(1);  // never reached: nobody pushes
    waited = ps.Pull(p, absl::Now() + absl::Seconds(60)).status();
  });
  ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
  const absl::Time start = absl::Now();
  ps.StopWaiting();
  puller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // woken, not timed out at 60 s
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_EQ(waited.message(), "pull: ps 3 is shutting down");
  // A pull that would wait fails at once; one that is ready is served.
  v1::PullRequest later;
  later.set_job_id("j");
  later.set_min_step(1);
  EXPECT_EQ(ps.Pull(later, absl::Now() + absl::Seconds(60)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_NE(PullNow(ps), nullptr);
}

TEST(PullTest, AWaitEndsWhenItsCallIsCancelled) {
  ParameterServer ps({.task_index = 2, .max_pull_wait = absl::Seconds(60)});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  std::atomic<bool> gone{false};
  absl::Status waited;
  std::thread puller([&] {
    v1::PullRequest p;
    p.set_job_id("j");
    p.set_min_step(1);  // never reached: nobody pushes
    waited = ps.Pull(p, absl::Now() + absl::Seconds(60), nullptr, nullptr,
                     [&] { return gone.load(); })
                 .status();
  });
  ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
  // Nothing signals the job: the wait itself looks (else DEADLINE_EXCEEDED
  // at 60 s).
  gone.store(true);
  puller.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_EQ(waited.message(), "pull: job \"j\" on ps 2: the call ended while it waited");
  // The job is untouched: a pull that is ready is served.
  EXPECT_NE(PullNow(ps), nullptr);
  EXPECT_EQ(ps.Status({}).jobs(0).pulls_waiting(), 0);
}

TEST(DeleteJobTest, FreesTheJobAndWakesWaitingPulls) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  absl::Status waited;
  std::thread puller([&] {
    v1::PullRequest p;
    p.set_job_id("j");
    p.set_min_step(1);  // never reached: nobody pushes
    waited = ps.Pull(p, absl::Now() + absl::Seconds(60)).status();
  });
  ASSERT_TRUE(WaitForWaitingPulls(ps, 1));
  v1::DeleteJobRequest d;
  d.set_job_id("j");
  const absl::Time start = absl::Now();
  v1::DeleteJobResponse resp = ps.DeleteJob(d);
  puller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // woken, not timed out at 60 s
  EXPECT_TRUE(resp.existed());
  EXPECT_EQ(resp.bytes_freed(), (6 + 2) * 4);
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_EQ(ps.Status(v1::StatusRequest()).jobs_size(), 0);
  EXPECT_EQ(PushConst(ps, Header(0, 1, 0, 1), 1.0f).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(ps.DeleteJob(d).existed());
  // The id can be used again, from scratch.
  auto again = ps.Register(TwoVarJob(v1::SYNC, 2));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->created());
  EXPECT_EQ(again->global_step(), 0);
}

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// How busy the server process was while a job trained: the clock and the
// process's CPU time from the job's first update to its latest (the step
// breakdown benchmark's `cores`; the ps's logs at delete and exit). Between
// two updates this thread burns CPU the span must count.
TEST(UpdateSpanTest, CountsTheProcessesCpuFromTheFirstUpdateToTheLatest) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  v1::StatusRequest req;
  req.set_job_id("j");
  const absl::Time before = absl::Now();
  const double cpu_before = common::ProcessCpuTime().total_s();
  ASSERT_TRUE(PushConst(ps, Header(0, 1, 0, 1), 1.0f).ok());
  ASSERT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.steps_applied() == 1; }));
  v1::JobStatus one = ps.Status(req).jobs(0);
  EXPECT_EQ(one.update_span_s(), 0);  // one update: no span yet
  EXPECT_EQ(DescribeUpdates(one).find("process cpu"), std::string::npos) << DescribeUpdates(one);

  const absl::Time burn_wall_start = absl::Now();
  const double burn_start = ThreadCpuSeconds();
  volatile double sink = 0;
  while (ThreadCpuSeconds() - burn_start < 0.05) sink = sink + 1;
  const double burnt = ThreadCpuSeconds() - burn_start;
  const double burn_wall = absl::ToDoubleSeconds(absl::Now() - burn_wall_start);
  ASSERT_TRUE(PushConst(ps, Header(0, 2, 1, 1), 1.0f).ok());
  ASSERT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.steps_applied() == 2; }));
  const double cpu_all = common::ProcessCpuTime().total_s() - cpu_before;
  const double wall_all = absl::ToDoubleSeconds(absl::Now() - before);

  const v1::JobStatus two = ps.Status(req).jobs(0);
  // The span holds the burn (between its two updates) and lies inside what
  // was measured around both updates. The process's CPU time comes in whole
  // microseconds, user and system apart: 4 us off at most between two reads.
  constexpr double kRusageError = 4e-6;
  EXPECT_GE(two.update_span_s(), burn_wall);
  EXPECT_LE(two.update_span_s(), wall_all);
  EXPECT_GE(two.update_span_cpu_s(), burnt - kRusageError);
  EXPECT_LE(two.update_span_cpu_s(), cpu_all + kRusageError);
  const std::string described = DescribeUpdates(two);
  EXPECT_NE(described.find(absl::StrFormat("process cpu from its first update to its last %.3f s "
                                           "in %.3f s (%.2f cores)",
                                           two.update_span_cpu_s(), two.update_span_s(),
                                           two.update_span_cpu_s() / two.update_span_s())),
            std::string::npos)
      << described;
}

TEST(RequestRateTest, AJobYoungerThanTheWindowIsRatedOverItsLife) {
  // 30 requests of 2 ms each, then 20 ms: the rate is 30 over the job's age,
  // which lies between those 20 ms and the whole test (not 30 over the age
  // plus a whole empty 10 s window before it).
  const absl::Time before = absl::Now();
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  constexpr int kRequests = 30;
  for (int i = 0; i < kRequests; ++i) ps.RecordRequest("j", absl::Milliseconds(2));
  const absl::Time idle_start = absl::Now();
  absl::SleepFor(absl::Milliseconds(20));
  const double idle = absl::ToDoubleSeconds(absl::Now() - idle_start);
  v1::StatusRequest req;
  req.set_job_id("j");
  const v1::JobStatus st = ps.Status(req).jobs(0);
  const double all = absl::ToDoubleSeconds(absl::Now() - before);
  EXPECT_GE(st.requests_per_s(), kRequests / all);
  EXPECT_LE(st.requests_per_s(), kRequests / idle);
  EXPECT_NEAR(st.mean_latency_ms(), 2.0, 1e-9);
}

}  // namespace
}  // namespace towerps::ps

namespace towerps::ps {
namespace {

TEST(ParameterServerBudgetTest, BudgetIsSummedOverJobsAndReturnedOnDelete) {
  ParameterServer ps({.task_index = 0, .memory_budget_bytes = 300});
  auto job = [](const std::string& id) {
    auto r = TwoVarJob(v1::SYNC, 2);  // 128 bytes with SGD
    r.set_job_id(id);
    return r;
  };
  ASSERT_TRUE(ps.Register(job("j1")).ok());
  ASSERT_TRUE(ps.Register(job("j2")).ok());
  EXPECT_EQ(ps.reserved_bytes(), 256);
  // The same job again is no new memory.
  ASSERT_TRUE(ps.Register(job("j1")).ok());
  EXPECT_EQ(ps.reserved_bytes(), 256);
  const absl::Status refused = ps.Register(job("j3")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  for (const char* part : {"job \"j3\" needs 128 bytes", "variable \"a\"", "96 (4 floats",
                           "256 bytes are already held by 2 jobs", "budget is 300 bytes",
                           "--memory_budget_bytes"}) {
    EXPECT_NE(refused.message().find(part), std::string::npos) << part << " in " << refused;
  }
  EXPECT_EQ(ps.reserved_bytes(), 256);
  v1::DeleteJobRequest del;
  del.set_job_id("j1");
  ASSERT_TRUE(ps.DeleteJob(del).existed());
  EXPECT_EQ(ps.reserved_bytes(), 128);
  ASSERT_TRUE(ps.Register(job("j3")).ok());
  EXPECT_EQ(ps.reserved_bytes(), 256);
  // Status says both, for towerctl cluster; a server without a budget none.
  const v1::StatusResponse st = ps.Status(v1::StatusRequest());
  EXPECT_EQ(st.memory_budget_bytes(), 300);
  EXPECT_EQ(st.memory_reserved_bytes(), 256);
  ParameterServer unlimited({});
  ASSERT_TRUE(unlimited.Register(job("j1")).ok());
  EXPECT_EQ(unlimited.Status(v1::StatusRequest()).memory_budget_bytes(), 0);
  EXPECT_EQ(unlimited.Status(v1::StatusRequest()).memory_reserved_bytes(), 128);
}

// The attack of issue 15: one 7.4 GiB variable with Adam, under the old 8 GiB
// per-job limit that counted only values. Refused before anything is allocated.
// The first variable of a job of one worker has its slots twice (formed
// ahead: FormsSlotsAhead); the second, as large, once.
TEST(ParameterServerBudgetTest, HugeAdamVariableIsRefusedByMaxJobBytes) {
  for (int huge : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("variable ", huge));
    ParameterServer ps({.task_index = 0});
    auto r = TwoVarJob(v1::SYNC, 1);
    r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
    r.mutable_config()->mutable_optimizer()->set_learning_rate(0.001f);
    const int64_t elements = int64_t{7946} << 20;  // 7.4 GiB of floats / 4, roughly
    r.mutable_variables(huge)->clear_shape();
    r.mutable_variables(huge)->add_shape(elements);
    r.mutable_variables(huge)->set_name("huge");
    const absl::Status st = ps.Register(r).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    const int floats = huge == 0 ? 7 : 5;
    for (const std::string& part :
         {std::string("variable \"huge\""), absl::StrCat("alone needs ", elements * floats * 4),
          absl::StrCat(floats, " floats per element"),
          huge == 0 ? std::string("4 optimizer slots (with those its worker's pushes form ahead)")
                    : std::string("2 optimizer slots, 1 push buffers"),
          std::string("--max_job_bytes"), absl::StrCat(int64_t{8} << 30)}) {
      EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st;
    }
    EXPECT_EQ(ps.reserved_bytes(), 0);
  }
}

TEST(ParameterServerBudgetTest, ShapeOverflowingInt64IsRefusedNamingTheVariable) {
  ParameterServer ps({.task_index = 0});
  auto r = TwoVarJob(v1::SYNC, 1);
  r.mutable_variables(1)->clear_shape();
  r.mutable_variables(1)->add_shape(int64_t{1} << 31);
  r.mutable_variables(1)->add_shape((int64_t{1} << 33) - 1);
  const absl::Status st = ps.Register(r).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("variable \"b\" of shape [2147483648, 8589934591]"),
            std::string::npos)
      << st;
  EXPECT_EQ(ps.reserved_bytes(), 0);
}

// --- Commits answered before the update -------------------------------------

v1::RegisterRequest AdamPairJob() {
  v1::RegisterRequest r = TwoVarJob(v1::SYNC, 2);
  r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(0.1f);
  return r;
}

absl::StatusOr<std::string> SaveTo(ParameterServer& ps, const std::string& dir) {
  v1::SaveRequest save;
  save.set_job_id("j");
  save.set_num_ps(1);
  save.set_checkpoint_dir(dir);
  auto saved = ps.Save(save);
  if (!saved.ok()) return saved.status();
  return saved->path();
}

// A server's hooks that hold its first update after the first variable
// is published (until `release`), and note when anyone starts waiting for
// an update.
struct HeldUpdate {
  absl::Notification first_published, release, someone_waits;

  ParameterServerOptions Options() {
    ParameterServerOptions o;
    o.after_publish = [this](size_t count) {
      if (count != 1 || first_published.HasBeenNotified()) return;
      first_published.Notify();
      release.WaitForNotification();
    };
    o.on_commit_wait = [this] {
      if (!someone_waits.HasBeenNotified()) someone_waits.Notify();
    };
    return o;
  }
};

// The push that completes a step can be answered before the update: the
// step advances at once, a pull is served at once and reads each variable
// once it is final (in var_index order), a save waits for the whole step,
// and the values and Adam's slots come out bit-identical to the update done
// inside FinishPush (the same mean, formed variable by variable).
TEST(CommitTest, ADeferredUpdatePublishesEachVariableOnceFinalAndMatchesTheInlineOne) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  ParameterServer ref({});
  ASSERT_TRUE(ref.Register(AdamPairJob()).ok());
  ASSERT_TRUE(PushRamp(ref, Header(0, 1, 0, 3), 0.25f).ok());
  ASSERT_TRUE(PushRamp(ref, Header(1, 1, 0, 5), -1.5f).ok());
  const std::vector<std::vector<float>> want = PullValues(ref, 1);
  auto ref_path = SaveTo(ref, tmp + "/ref");
  ASSERT_TRUE(ref_path.ok()) << ref_path.status();

  HeldUpdate held;
  ParameterServer ps(held.Options());
  ASSERT_TRUE(ps.Register(AdamPairJob()).ok());
  std::unique_ptr<Commit> commit;
  ASSERT_TRUE(PushRamp(ps, Header(0, 1, 0, 3), 0.25f, &commit).ok());
  EXPECT_EQ(commit, nullptr);  // the step is not complete: nothing to update yet
  auto answer = PushRamp(ps, Header(1, 1, 0, 5), -1.5f, &commit);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->outcome(), v1::PushResponse::APPLIED);
  EXPECT_EQ(answer->global_step(), 1);
  ASSERT_NE(commit, nullptr);

  auto snap = PullNow(ps, 1);  // served although nothing is updated yet
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->global_step, 1);
  EXPECT_FALSE(snap->Ready(0));
  std::thread updater([&] { commit->Run(); });
  ASSERT_TRUE(held.first_published.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(snap->Ready(0));
  EXPECT_FALSE(snap->Ready(1));  // held by the test after the first variable
  EXPECT_EQ(std::vector<float>(snap->values[0].begin(), snap->values[0].end()), want[0]);

  absl::StatusOr<std::string> path = absl::UnknownError("not saved");
  std::thread saver([&] { path = SaveTo(ps, tmp + "/deferred"); });
  ASSERT_TRUE(held.someone_waits.WaitForNotificationWithTimeout(absl::Seconds(60)));
  held.release.Notify();
  updater.join();
  saver.join();
  snap->AwaitReady(1);
  EXPECT_EQ(std::vector<float>(snap->values[1].begin(), snap->values[1].end()), want[1]);
  // The save began during the update and holds its whole step.
  ASSERT_TRUE(path.ok()) << path.status();
  auto got = common::ReadShard(*path);
  auto ref_shard = common::ReadShard(*ref_path);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(ref_shard.ok()) << ref_shard.status();
  EXPECT_EQ(got->global_step, 1);
  ASSERT_EQ(got->vars.size(), ref_shard->vars.size());
  for (size_t v = 0; v < got->vars.size(); ++v) {
    EXPECT_EQ(got->vars[v].value, ref_shard->vars[v].value) << "variable " << v;
    ASSERT_EQ(got->vars[v].slots.size(), 2u);  // Adam's m and v
    for (size_t k = 0; k < got->vars[v].slots.size(); ++k) {
      EXPECT_EQ(got->vars[v].slots[k].values, ref_shard->vars[v].slots[k].values)
          << "variable " << v << " slot " << k;
    }
  }
  // The next step, inline on both, stays identical.
  ASSERT_TRUE(PushRamp(ref, Header(0, 2, 1, 3), 0.5f).ok());
  ASSERT_TRUE(PushRamp(ref, Header(1, 2, 1, 5), 0.75f).ok());
  ASSERT_TRUE(PushRamp(ps, Header(0, 2, 1, 3), 0.5f).ok());
  ASSERT_TRUE(PushRamp(ps, Header(1, 2, 1, 5), 0.75f).ok());
  EXPECT_EQ(PullValues(ps, 2), PullValues(ref, 2));
}

// A push of the next step and a deletion wait for an update under way
// (the update writes the variables in place, without the job's lock).
TEST(CommitTest, ThePushOfTheNextStepAndADeletionWaitForTheUpdate) {
  for (const bool delete_it : {false, true}) {
    SCOPED_TRACE(delete_it ? "deletion" : "push");
    HeldUpdate held;
    ParameterServer ps(held.Options());
    ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 2)).ok());
    std::unique_ptr<Commit> commit;
    ASSERT_TRUE(PushRamp(ps, Header(0, 1, 0, 3), 0.25f, &commit).ok());
    ASSERT_NE(commit, nullptr);  // ASYNC: every push updates
    std::thread updater([&] { commit->Run(); });
    ASSERT_TRUE(held.first_published.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::StatusOr<v1::PushResponse> next = absl::UnknownError("not pushed");
    v1::DeleteJobResponse deleted;
    std::thread other([&] {
      if (delete_it) {
        v1::DeleteJobRequest d;
        d.set_job_id("j");
        deleted = ps.DeleteJob(d);
      } else {
        next = PushRamp(ps, Header(1, 1, 0, 5), -1.5f);  // updated inline once it may
      }
    });
    ASSERT_TRUE(held.someone_waits.WaitForNotificationWithTimeout(absl::Seconds(60)));
    held.release.Notify();
    updater.join();
    other.join();
    if (delete_it) {
      EXPECT_TRUE(deleted.existed());
      continue;
    }
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->global_step(), 2);
    // Both pushes applied, in turn: SGD, b = 0 - lr (g0 + g1) exactly as
    // two sequential updates.
    ParameterServer ref({});
    ASSERT_TRUE(ref.Register(TwoVarJob(v1::ASYNC, 2)).ok());
    ASSERT_TRUE(PushRamp(ref, Header(0, 1, 0, 3), 0.25f).ok());
    ASSERT_TRUE(PushRamp(ref, Header(1, 1, 0, 5), -1.5f).ok());
    EXPECT_EQ(PullValues(ps, 2), PullValues(ref, 2));
  }
}

// RunLater: the update runs on one of the server's threads (RunLater
// returns with it held there), readers get each variable once final, and
// the server's end runs an update still scheduled before the job goes.
TEST(CommitTest, RunLaterUpdatesOnTheServersThreadAndItsEndWaitsForIt) {
  ParameterServer ref({});
  ASSERT_TRUE(ref.Register(AdamPairJob()).ok());
  ASSERT_TRUE(PushRamp(ref, Header(0, 1, 0, 3), 0.25f).ok());
  ASSERT_TRUE(PushRamp(ref, Header(1, 1, 0, 5), -1.5f).ok());
  const std::vector<std::vector<float>> want = PullValues(ref, 1);

  HeldUpdate held;
  ParameterServerOptions options = held.Options();
  std::atomic<int> published{0};
  options.after_publish = [&, hold = options.after_publish](size_t count) {
    published.fetch_add(1);
    hold(count);
  };
  auto ps = std::make_unique<ParameterServer>(options);
  ASSERT_TRUE(ps->Register(AdamPairJob()).ok());
  std::unique_ptr<Commit> commit;
  ASSERT_TRUE(PushRamp(*ps, Header(0, 1, 0, 3), 0.25f, &commit).ok());
  ASSERT_TRUE(PushRamp(*ps, Header(1, 1, 0, 5), -1.5f, &commit).ok());
  ASSERT_NE(commit, nullptr);
  ps->RunLater(std::move(commit), absl::Milliseconds(1));
  ASSERT_TRUE(held.first_published.WaitForNotificationWithTimeout(absl::Seconds(60)));
  auto snap = PullNow(*ps, 1);
  ASSERT_NE(snap, nullptr);
  EXPECT_FALSE(snap->Ready(1));  // held on the server's thread after the first variable
  std::vector<float> second;
  std::thread reader([&] {
    snap->AwaitReady(1);
    second.assign(snap->values[1].begin(), snap->values[1].end());
  });
  held.release.Notify();
  reader.join();
  EXPECT_EQ(std::vector<float>(snap->values[0].begin(), snap->values[0].end()), want[0]);
  EXPECT_EQ(second, want[1]);
  snap.reset();

  // The next step's update, scheduled, then the server's end at once.
  ASSERT_TRUE(PushRamp(*ps, Header(0, 2, 1, 3), 0.5f, &commit).ok());
  ASSERT_TRUE(PushRamp(*ps, Header(1, 2, 1, 5), 0.75f, &commit).ok());
  ASSERT_NE(commit, nullptr);
  ps->RunLater(std::move(commit), absl::Milliseconds(1));
  ps.reset();
  EXPECT_EQ(published.load(), 4);  // both variables, twice
}


// --- Updates ahead (one worker, SGD) ----------------------------------------

// Every variable of `snap`, once final.
std::vector<std::vector<float>> Values(const WeightsSnapshot& snap) {
  std::vector<std::vector<float>> out;
  for (size_t v = 0; v < snap.values.size(); ++v) {
    snap.AwaitReady(v);
    out.emplace_back(snap.values[v].begin(), snap.values[v].end());
  }
  return out;
}

// Adds variable `name` of `n` elements, GLOROT_UNIFORM from `seed`, to `r`.
void AddGlorotVariable(v1::RegisterRequest* r, const char* name, int64_t n, int seed) {
  auto* v = r->add_variables();
  v->set_name(name);
  v->add_shape(n);
  v->set_dtype(v1::DT_FLOAT32);
  v->mutable_initializer()->set_type(v1::Initializer::GLOROT_UNIFORM);
  v->mutable_initializer()->set_seed(seed);
  v->mutable_initializer()->set_fan_in(n);
  v->mutable_initializer()->set_fan_out(1);
}

// Job "j" of one worker and one GLOROT_UNIFORM variable of `n` elements,
// trained by `type` (default SGD; lr 0.5, weight decay `wd`).
v1::RegisterRequest OneBigVarJob(v1::Mode mode, int64_t n, float wd,
                                 v1::OptimizerSpec::Type type = v1::OptimizerSpec::SGD) {
  v1::RegisterRequest r;
  r.set_job_id("j");
  r.mutable_config()->set_mode(mode);
  r.mutable_config()->set_num_workers(1);
  r.mutable_config()->mutable_optimizer()->set_type(type);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(kLr);
  r.mutable_config()->mutable_optimizer()->set_weight_decay(wd);
  AddGlorotVariable(&r, "w", n, /*seed=*/3);
  return r;
}

// Options of a server whose same-host pushes form slot rules ahead
// although the worker (here the test itself) runs on its cores.
ParameterServerOptions AheadOnSharedCpus() {
  ParameterServerOptions o;
  o.as_if_on_cores_apart = true;
  return o;
}

// Three steps of OneBigVarJob(mode, n, wd, type) in both modes, with and
// without weight decay, for each of `types` (momentum's and Adam's slots
// are formed ahead too, apart, then adopted: three steps use both sets of
// slot buffers in turn). Each step's push comes from `push` (given the server,
// the step, its gradient and the values before it; it may change the
// gradient once it has handed it over, as a worker would), which returns
// the session to finish. After the finish, the values must be those of the
// update done in place, bit for bit, and formed ahead.
void ExpectFormedAheadEqualsTheUpdateInPlace(
    int64_t n, const std::vector<v1::OptimizerSpec::Type>& types,
    const std::function<std::unique_ptr<PushSession>(ParameterServer&, int64_t step,
                                                     std::vector<float>& g,
                                                     const std::vector<float>& before)>& push) {
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    for (auto type : types) {
      for (float wd : {0.0f, 0.01f}) {
        SCOPED_TRACE(absl::StrCat(v1::Mode_Name(mode), " ", v1::OptimizerSpec::Type_Name(type),
                                  " weight_decay ", wd));
        ParameterServer ps(AheadOnSharedCpus());
        const v1::RegisterRequest job = OneBigVarJob(mode, n, wd, type);
        ASSERT_TRUE(ps.Register(job).ok());
        std::vector<float> want = Values(*PullNow(ps))[0];
        auto optimizer = NewOptimizer(job.config().optimizer(), n);
        ASSERT_TRUE(optimizer.ok());
        for (int64_t step = 0; step < 3; ++step) {
          std::vector<float> g(n);
          for (int64_t i = 0; i < n; ++i) {
            g[i] = 0.001f * static_cast<float>((i * 7919 + step * 31) % 2001 - 1000);
          }
          const std::vector<float> before = want;
          (*optimizer)->Apply(absl::MakeSpan(want), g, step + 1);
          std::unique_ptr<PushSession> s = push(ps, step, g, before);
          ASSERT_NE(s, nullptr);
          auto r = ps.FinishPush(std::move(s));
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
          auto after = PullNow(ps, step + 1);
          ASSERT_EQ(after->global_step, step + 1);
          ASSERT_EQ(Values(*after)[0], want);
          EXPECT_TRUE(WaitForJob(ps, [&](const v1::JobStatus& j) {
            return j.updates_ahead() == step + 1;  // formed ahead indeed
          }));
        }
      }
    }
  }
}

// The new values formed ahead, as the gradient arrives in slices that cut
// Optimizer::kApplyBlock's blocks anywhere, are those of the update done
// in place afterwards; and the job's values do not change before the push
// is finished. (Over gRPC only SGD is formed ahead.)
TEST(UpdateAheadTest, FormedAsTheGradientArrivesEqualsTheUpdateInPlace) {
  const int64_t n = 3 * Optimizer::kApplyBlock + 123;  // and a partial block
  ExpectFormedAheadEqualsTheUpdateInPlace(
      n, {v1::OptimizerSpec::SGD},
      [&](ParameterServer& ps, int64_t step, std::vector<float>& g,
          const std::vector<float>& before) -> std::unique_ptr<PushSession> {
        auto s = ps.BeginPush(Header(0, step + 1, step, 10));
        EXPECT_TRUE(s.ok()) << s.status();
        if (!s.ok()) return nullptr;
        for (int64_t first = 0; first < n; first += 1000) {  // 1000: not a block's divisor
          const int64_t k = std::min<int64_t>(1000, n - first);
          EXPECT_TRUE((*s)->AddSlice(Slice(0, first, std::vector<float>(g.begin() + first,
                                                                        g.begin() + first + k)))
                          .ok());
          EXPECT_TRUE((*s)->CheckFinite().ok());
        }
        // Formed, not applied: the values are the step's until the finish.
        EXPECT_EQ(PullNow(ps, step)->global_step, step);
        EXPECT_EQ(Values(*PullNow(ps, step))[0], before);
        return *std::move(s);
      });
}

// Same host: the new values formed ahead from the gradient read in place in
// the worker's segment (here memory of the test's own) are those of the
// update done in place afterwards, for a variable of several of
// FormAheadFrom's pieces and a partial block. The gradient is read during
// the push: what the worker writes there after AddShared changes nothing.
// A NaN anywhere in it (here the last element, in the last piece) refuses
// the push, and nothing is applied.
TEST(UpdateAheadTest, FormedFromTheSegmentEqualsTheUpdateInPlace) {
  const int64_t n = 9 * Optimizer::kApplyBlock + 123;
  ExpectFormedAheadEqualsTheUpdateInPlace(
      n, {v1::OptimizerSpec::SGD, v1::OptimizerSpec::MOMENTUM, v1::OptimizerSpec::ADAM},
      [&](ParameterServer& ps, int64_t step, std::vector<float>& g,
          const std::vector<float>& before) -> std::unique_ptr<PushSession> {
        v1::PushHeader h = Header(0, 2 * step + 1, step, 10);
        h.mutable_segment()->set_size(1);
        {  // a NaN in the last piece: refused, nothing formed is applied
          std::vector<float> bad = g;
          bad[n - 1] = NAN;
          auto s = ps.BeginPush(h);
          EXPECT_TRUE(s.ok()) << s.status();
          if (!s.ok()) return nullptr;
          EXPECT_TRUE((*s)->CanShare(0));
          const absl::Status st = (*s)->AddShared(0, bad.data(), nullptr);
          EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
          EXPECT_NE(st.message().find("contains NaN or Inf"), std::string::npos) << st;
        }
        EXPECT_EQ(Values(*PullNow(ps, step))[0], before);
        h.set_sequence(2 * step + 2);
        auto s = ps.BeginPush(h);
        EXPECT_TRUE(s.ok()) << s.status();
        if (!s.ok()) return nullptr;
        EXPECT_TRUE((*s)->AddShared(0, g.data(), nullptr).ok());
        std::fill(g.begin(), g.end(), NAN);  // the worker's next use of it
        return *std::move(s);
      });
}

// A same-host push of header `h` naming `g` (variable 0) in place: AddShared
// refuses it, InvalidArgument with `want` in its message.
void ExpectSharedPushRefused(ParameterServer& ps, const v1::PushHeader& h,
                             const std::vector<float>& g, const std::string& want) {
  auto s = ps.BeginPush(h);
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status st = (*s)->AddShared(0, g.data(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(want), std::string::npos) << st;
}

// Same host: the new values formed from a worker's memory are checked too,
// since that memory may change after the gradient's check; a finite
// gradient whose update is not (here it overflows: lr 4, an element of
// 1e38) is refused, naming the variable and worker, and nothing is applied.
TEST(UpdateAheadTest, NewValuesFormedFromTheSegmentThatAreNotFiniteAreRefused) {
  const int64_t n = 5 * Optimizer::kApplyBlock;
  ParameterServer ps(AheadOnSharedCpus());
  v1::RegisterRequest job = OneBigVarJob(v1::SYNC, n, 0.0f);
  job.mutable_config()->mutable_optimizer()->set_learning_rate(4.0f);
  ASSERT_TRUE(ps.Register(job).ok());
  const std::vector<float> before = Values(*PullNow(ps))[0];
  std::vector<float> g(n, 0.0f);
  g[n - 7] = 1e38f;  // finite, in the last piece; 4e38 is not
  v1::PushHeader h = Header(0, 1, 0, 10);
  h.mutable_segment()->set_size(1);
  ExpectSharedPushRefused(ps, h, g,
                          "new values of variable 0 formed from the gradient of worker 0 "
                          "are not finite");
  auto snap = PullNow(ps);
  EXPECT_EQ(snap->global_step, 0);
  EXPECT_EQ(Values(*snap)[0], before);
  g[n - 7] = 1.0f;  // the next push applies
  h.set_sequence(2);
  auto s = ps.BeginPush(h);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr).ok());
  auto r = ps.FinishPush(std::move(*s));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
  EXPECT_EQ(Values(*PullNow(ps, 1))[0][n - 7], before[n - 7] - 4.0f);
}

// Adam's slots formed ahead from the segment are checked as well: a
// gradient element of 1e21 leaves the values finite but overflows the
// second moment (g * g), and such a push is refused; nothing is applied,
// and the next push is the update a server that never saw it makes.
TEST(UpdateAheadTest, SlotsFormedFromTheSegmentThatAreNotFiniteAreRefused) {
  const int64_t n = 5 * Optimizer::kApplyBlock;
  ParameterServer ps(AheadOnSharedCpus()), fresh(AheadOnSharedCpus());
  const v1::RegisterRequest job = OneBigVarJob(v1::SYNC, n, 0.0f, v1::OptimizerSpec::ADAM);
  ASSERT_TRUE(ps.Register(job).ok());
  ASSERT_TRUE(fresh.Register(job).ok());
  const std::vector<float> before = Values(*PullNow(ps))[0];
  std::vector<float> g(n, 0.25f);
  g[n - 7] = 1e21f;
  v1::PushHeader h = Header(0, 1, 0, 10);
  h.mutable_segment()->set_size(1);
  ExpectSharedPushRefused(ps, h, g, "or its optimizer slots are not");
  EXPECT_EQ(PullNow(ps)->global_step, 0);
  EXPECT_EQ(Values(*PullNow(ps))[0], before);
  g[n - 7] = 0.25f;
  for (ParameterServer* server : {&ps, &fresh}) {
    h.set_sequence(server == &ps ? 2 : 1);
    auto s = server->BeginPush(h);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr).ok());
    auto r = server->FinishPush(std::move(*s));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
  }
  EXPECT_EQ(Values(*PullNow(ps, 1))[0], Values(*PullNow(fresh, 1))[0]);
  EXPECT_NE(Values(*PullNow(ps, 1))[0], before);
}

// A push that fails after its first variable was formed ahead (a NaN in
// the second, or the second missing) changes nothing; the next push
// updates from the same values.
// Pulls job "j" at `min_step` as into segment `key` at byte `offset`:
// by variable, whether the segment holds the values there already.
std::vector<char> PullInPlace(ParameterServer& ps, int64_t min_step, const std::string& key,
                              int64_t offset) {
  v1::PullRequest r;
  r.set_job_id("j");
  r.set_min_step(min_step);
  r.mutable_segment()->set_nonce(key);
  r.mutable_segment()->add_offsets(offset);
  std::shared_ptr<void> lease;
  std::vector<char> in_place;
  auto s = ps.Pull(r, absl::Now() + absl::Seconds(5), &lease, &in_place);
  EXPECT_TRUE(s.ok()) << s.status();
  return in_place;
}

// A push from the segment that names where the worker's pulls land
// (here memory of the test's own, as byte 4096 of segment "seg") writes
// the new values there as it forms them, bit for bit the job's; once
// committed, the next pull into that very place need not write them, and
// a pull elsewhere, or any later one, must. A push refused part way has
// written its first pieces there: the next pull must write.
TEST(UpdateAheadTest, NewValuesWrittenWhereThePullsLandAreVouchedForByTheCommit) {
  const int64_t n = 9 * Optimizer::kApplyBlock + 123;
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::ADAM}) {
      SCOPED_TRACE(absl::StrCat(v1::Mode_Name(mode), " ", v1::OptimizerSpec::Type_Name(type)));
      ParameterServer ps(AheadOnSharedCpus());
      ASSERT_TRUE(ps.Register(OneBigVarJob(mode, n, 0.01f, type)).ok());
      std::vector<float> weights(n, -7.0f);
      v1::PushHeader h = Header(0, 1, 0, 10);
      h.mutable_segment()->set_size(1);
      auto push = [&](int64_t step, const std::vector<float>& g) {
        h.set_step(step);
        h.set_sequence(h.sequence() + 1);
        auto s = ps.BeginPush(h);
        EXPECT_TRUE(s.ok()) << s.status();
        if (!s.ok()) return s.status();
        (*s)->SetValuesSegment("seg");
        TOWERPS_RETURN_IF_ERROR((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096));
        return ps.FinishPush(*std::move(s)).status();
      };
      std::vector<float> g(n);
      for (int64_t step = 0; step < 2; ++step) {
        for (int64_t i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>((i * 31 + step) % 997);
        ASSERT_TRUE(push(step, g).ok());
        EXPECT_EQ(weights, Values(*PullNow(ps, step + 1))[0]);
        EXPECT_EQ(PullInPlace(ps, step + 1, "other", 4096), std::vector<char>{0});
        if (step == 0) {
          EXPECT_EQ(PullInPlace(ps, step + 1, "seg", 4096), std::vector<char>{1});
        } else {
          EXPECT_EQ(PullInPlace(ps, step + 1, "seg", 8192), std::vector<char>{0});
        }
        // Only the first pull into that segment: the worker may change that
        // memory once it returned.
        EXPECT_EQ(PullInPlace(ps, step + 1, "seg", 4096), std::vector<char>{0});
      }
      const std::vector<float> values = Values(*PullNow(ps, 2))[0];
      g[n - 1] = NAN;
      EXPECT_EQ(push(2, g).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(Values(*PullNow(ps, 2))[0], values);  // nothing applied
      EXPECT_NE(weights[0], values[0]);  // the first pieces were written
      EXPECT_EQ(PullInPlace(ps, 2, "seg", 4096), std::vector<char>{0});
    }
  }
}

// A pull into a segment of the job between a push's writes there and its
// commit may have written any variable (here: the old values), so the
// commit does not vouch for what the push wrote; the next push does.
// Without SetValuesSegment, nothing is written.
TEST(UpdateAheadTest, APullIntoASegmentBeforeTheCommitLeavesThePlaceToThePull) {
  const int64_t n = 3 * Optimizer::kApplyBlock;
  ParameterServer ps(AheadOnSharedCpus());
  ASSERT_TRUE(ps.Register(OneBigVarJob(v1::SYNC, n, 0.0f)).ok());
  std::vector<float> weights(n, -7.0f);
  const std::vector<float> g(n, 0.5f);
  v1::PushHeader h = Header(0, 1, 0, 10);
  h.mutable_segment()->set_size(1);
  auto s = ps.BeginPush(h);
  ASSERT_TRUE(s.ok()) << s.status();
  (*s)->SetValuesSegment("seg");
  ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096).ok());
  EXPECT_EQ(PullInPlace(ps, 0, "seg", 4096), std::vector<char>{0});
  ASSERT_TRUE(ps.FinishPush(*std::move(s)).ok());
  EXPECT_EQ(PullInPlace(ps, 1, "seg", 4096), std::vector<char>{0});
  // The next push is vouched for again.
  h = Header(0, 2, 1, 10);
  h.mutable_segment()->set_size(1);
  s = ps.BeginPush(h);
  ASSERT_TRUE(s.ok()) << s.status();
  (*s)->SetValuesSegment("seg");
  ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096).ok());
  ASSERT_TRUE(ps.FinishPush(*std::move(s)).ok());
  EXPECT_EQ(PullInPlace(ps, 2, "seg", 4096), std::vector<char>{1});
  EXPECT_EQ(weights, Values(*PullNow(ps, 2))[0]);
  // No segment named: the worker's memory is not written.
  std::fill(weights.begin(), weights.end(), -7.0f);
  h = Header(0, 3, 2, 10);
  h.mutable_segment()->set_size(1);
  s = ps.BeginPush(h);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096).ok());
  ASSERT_TRUE(ps.FinishPush(*std::move(s)).ok());
  EXPECT_EQ(weights, std::vector<float>(n, -7.0f));
  EXPECT_EQ(PullInPlace(ps, 3, "seg", 4096), std::vector<char>{0});
}

// A moving average (batch norm's statistics) is not formed ahead: the
// update of a lone push (one worker) read in place writes the new values
// where the worker's pulls land as it forms them, when the worker's next
// pull into that place waits already; they are bit for bit the job's, and
// that pull need not write them (a later one must). Where the worker's
// memory turned NaN after the push (its statistic is refused by the
// update), the values stay and are written there all the same.
TEST(UpdateAheadTest, TheUpdateOfALonePushWritesTheNewValuesWhereThePullsLand) {
  const int64_t n = 3 * Optimizer::kApplyBlock + 5;
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    for (auto type : {v1::OptimizerSpec::ADAM}) {  // the job's; not the average's
      SCOPED_TRACE(absl::StrCat(v1::Mode_Name(mode), " ", v1::OptimizerSpec::Type_Name(type)));
      ParameterServer ps({});
      v1::RegisterRequest job = OneBigVarJob(mode, n, 0.01f, type);
      job.mutable_variables(0)->set_update(v1::VariableDef::MOVING_AVERAGE);
      job.mutable_variables(0)->set_moving_average_decay(0.9f);
      ASSERT_TRUE(ps.Register(job).ok());
      std::vector<float> weights(n, -7.0f);
      std::vector<float> g(n);
      for (int64_t step = 0; step < 3; ++step) {
        for (int64_t i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>((i * 17 + step) % 991);
        const std::vector<float> before = Values(*PullNow(ps, step))[0];
        v1::PushHeader h = Header(0, step + 1, step, 10);
        h.mutable_segment()->set_size(1);
        auto s = ps.BeginPush(h);
        ASSERT_TRUE(s.ok()) << s.status();
        (*s)->SetValuesSegment("seg");
        ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096).ok());
        // The worker's next pull waits already, as a trainer's does.
        std::vector<char> waited;
        std::thread pull([&] { waited = PullInPlace(ps, step + 1, "seg", 4096); });
        EXPECT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.pulls_waiting() == 1; }));
        std::unique_ptr<Commit> commit;
        EXPECT_TRUE(ps.FinishPush(*std::move(s), &commit).ok());
        if (step == 2) g[0] = NAN;  // the worker broke its word: refused by the update
        if (commit != nullptr) commit->Run();
        pull.join();
        EXPECT_EQ(waited, std::vector<char>{1});
        const std::vector<float> after = Values(*PullNow(ps, step + 1))[0];
        EXPECT_EQ(weights, after);
        if (step == 2) {
          EXPECT_EQ(after, before);  // kept
        } else {
          EXPECT_NE(after, before);
        }
        EXPECT_EQ(PullInPlace(ps, step + 1, "seg", 4096), std::vector<char>{0});  // only the first
      }
      // With no pull waiting, the worker may be done with that memory once
      // the push is answered (it gives it back, moves its weights out):
      // nothing is written there after the answer, nothing vouched for.
      const std::vector<float> kept = weights;
      g.assign(n, 0.25f);
      v1::PushHeader h = Header(0, 4, 3, 10);
      h.mutable_segment()->set_size(1);
      auto s = ps.BeginPush(h);
      ASSERT_TRUE(s.ok()) << s.status();
      (*s)->SetValuesSegment("seg");
      ASSERT_TRUE((*s)->AddShared(0, g.data(), nullptr, weights.data(), 4096).ok());
      ASSERT_TRUE(ps.FinishPush(*std::move(s)).ok());
      EXPECT_NE(Values(*PullNow(ps, 4))[0], kept);
      EXPECT_EQ(weights, kept);
      EXPECT_EQ(PullInPlace(ps, 4, "seg", 4096), std::vector<char>{0});
    }
  }
}

// Two workers' pushes in one SYNC update, for every rule (none forms its
// update ahead with two workers): the new values go into each worker's
// segment where its next pull waits already, bit for bit the job's, and
// that pull takes them as they lie; a worker whose pull does not wait yet
// (step 1: worker 1's) gets nothing written (it may be done with that
// memory), and its pull writes.
TEST(UpdateAheadTest, TheUpdateWritesEachWorkersNewValuesWhereItsPullWaits) {
  const int64_t n = 3 * Optimizer::kApplyBlock + 5;
  for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::ADAM,
                    v1::OptimizerSpec::MOMENTUM}) {
    SCOPED_TRACE(v1::OptimizerSpec::Type_Name(type));
    ParameterServer ps({});
    v1::RegisterRequest job = OneBigVarJob(v1::SYNC, n, 0.0f);
    job.mutable_config()->set_num_workers(2);
    job.mutable_config()->mutable_optimizer()->set_type(type);
    ASSERT_TRUE(ps.Register(job).ok());
    std::vector<float> weights[2] = {std::vector<float>(n, -7.0f), std::vector<float>(n, -7.0f)};
    const std::string key[2] = {"seg0", "seg1"};
    int64_t in_place = 0, named = 0;  // JobStatus's counts, expected
    for (int64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      const std::vector<float> before = Values(*PullNow(ps, step))[0];
      const int waiting = step == 1 ? 1 : 2;  // workers [0, waiting) pull early
      std::vector<float> g[2];
      std::vector<char> waited[2];
      std::vector<std::thread> pulls;
      std::unique_ptr<Commit> commit;
      for (int w = 0; w < 2; ++w) {
        g[w].resize(n);
        for (int64_t i = 0; i < n; ++i) {
          g[w][i] = 0.001f * static_cast<float>((i * 17 + step * 5 + w) % 991);
        }
        v1::PushHeader h = Header(w, step + 1, step, 10 + w);
        h.mutable_segment()->set_size(1);
        auto s = ps.BeginPush(h);
        ASSERT_TRUE(s.ok()) << s.status();
        (*s)->SetValuesSegment(key[w]);
        ASSERT_TRUE((*s)->AddShared(0, g[w].data(), nullptr, weights[w].data(), 4096).ok());
        if (w == 1) {  // the step's last push: the early pulls wait first
          for (int p = 0; p < waiting; ++p) {
            pulls.emplace_back([&, p] { waited[p] = PullInPlace(ps, step + 1, key[p], 4096); });
          }
          EXPECT_TRUE(WaitForJob(
              ps, [&](const v1::JobStatus& j) { return j.pulls_waiting() == waiting; }));
        }
        ASSERT_TRUE(ps.FinishPush(*std::move(s), &commit).ok());
        EXPECT_EQ(commit != nullptr, w == 1);
      }
      commit->Run();
      for (std::thread& t : pulls) t.join();
      const std::vector<float> after = Values(*PullNow(ps, step + 1))[0];
      EXPECT_NE(after, before);
      for (int w = 0; w < 2; ++w) {
        if (w < waiting) {
          EXPECT_EQ(waited[w], std::vector<char>{1}) << "worker " << w;
          EXPECT_EQ(weights[w], after) << "worker " << w;
        } else {
          EXPECT_NE(weights[w], after) << "worker " << w;
        }
        // Only the first pull takes them as they lie.
        EXPECT_EQ(PullInPlace(ps, step + 1, key[w], 4096), std::vector<char>{0});
      }
      // What the test's pulls would have written: the worker's weights now.
      for (int w = 0; w < 2; ++w) weights[w] = after;
      // Counted: the early pulls found their variable there, the two
      // later ones did not.
      in_place += waiting;
      named += waiting + 2;
      v1::StatusRequest req;
      req.set_job_id("j");
      const v1::JobStatus st = ps.Status(req).jobs(0);
      EXPECT_EQ(st.values_in_place(), in_place);
      EXPECT_EQ(st.segment_pull_values(), named);
    }
  }
}

TEST(UpdateAheadTest, APushThatFailsAfterFormingChangesNothing) {
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    SCOPED_TRACE(v1::Mode_Name(mode));
    ParameterServer ps({});
    ASSERT_TRUE(ps.Register(TwoVarJob(mode, 1)).ok());
    {
      auto s = ps.BeginPush(Header(0, 1, 0, 1));
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE((*s)->AddSlice(Slice(0, 0, std::vector<float>(6, 1.0f))).ok());
      ASSERT_TRUE((*s)->CheckFinite().ok());  // a's new values formed: 0.5
      ASSERT_TRUE((*s)->AddSlice(Slice(1, 0, {1.0f, NAN})).ok());
      const absl::Status st = (*s)->CheckFinite();
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    }  // the stream fails: its session is dropped
    {
      auto s = ps.BeginPush(Header(0, 2, 0, 1));
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE((*s)->AddSlice(Slice(0, 0, std::vector<float>(6, 1.0f))).ok());
      ASSERT_TRUE((*s)->CheckFinite().ok());
      auto r = ps.FinishPush(std::move(*s));  // b missing
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    }
    auto snap = PullNow(ps);
    EXPECT_EQ(snap->global_step, 0);
    EXPECT_EQ(snap->values[0], std::vector<float>(6, 1.0f));
    EXPECT_EQ(snap->values[1], std::vector<float>(2, 0.0f));
    snap.reset();
    auto r = PushConst(ps, Header(0, 3, 0, 1), 1.0f);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
    snap = PullNow(ps, 1);
    EXPECT_EQ(snap->values[0], std::vector<float>(6, 0.5f));
    EXPECT_EQ(snap->values[1], std::vector<float>(2, -0.5f));
    EXPECT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.updates_ahead() == 1; }));
  }
}

// Values formed ahead from a step that another push moved on from (a
// second incarnation of the worker, applied first) are never applied: the
// push fails with ABORTED, whether the change comes while it still forms
// values or before it finishes, and the job has the other push's update
// only.
TEST(UpdateAheadTest, ValuesChangedWhileFormingAbortThePush) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  auto forming = ps.BeginPush(Header(0, 1, 0, 1, /*incarnation=*/7));
  auto finishing = ps.BeginPush(Header(0, 2, 0, 1, /*incarnation=*/7));
  ASSERT_TRUE(forming.ok() && finishing.ok());
  ASSERT_TRUE((*forming)->AddSlice(Slice(0, 0, std::vector<float>(6, 4.0f))).ok());
  ASSERT_TRUE((*forming)->CheckFinite().ok());
  ASSERT_TRUE((*finishing)->AddSlice(Slice(0, 0, std::vector<float>(6, 4.0f))).ok());
  ASSERT_TRUE((*finishing)->AddSlice(Slice(1, 0, std::vector<float>(2, 4.0f))).ok());
  ASSERT_TRUE((*finishing)->CheckFinite().ok());  // all formed

  auto other = PushConst(ps, Header(0, 1, 0, 1, /*incarnation=*/8), 1.0f);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->outcome(), v1::PushResponse::APPLIED);

  ASSERT_TRUE((*forming)->AddSlice(Slice(1, 0, std::vector<float>(2, 4.0f))).ok());
  const absl::Status st = (*forming)->CheckFinite();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("changed while the push of worker 0"), std::string::npos) << st;
  auto r = ps.FinishPush(std::move(*finishing));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  forming->reset();

  auto snap = PullNow(ps, 1);
  EXPECT_EQ(snap->global_step, 1);
  EXPECT_EQ(snap->values[0], std::vector<float>(6, 0.5f));
  EXPECT_EQ(snap->values[1], std::vector<float>(2, -0.5f));
}

// Shared pushes (GradientPart): a same-host push's variables read in place
// from the worker's segment, here memory of the test's own.

// Job "j" of `workers` workers and two variables: "w" of `n` elements
// (several of Optimizer::kApplyBlock's blocks and a partial one) and "b" of 5.
v1::RegisterRequest SharedPairJob(v1::Mode mode, int workers, v1::OptimizerSpec::Type type,
                                  int64_t n) {
  v1::RegisterRequest r;
  r.set_job_id("j");
  r.mutable_config()->set_mode(mode);
  r.mutable_config()->set_num_workers(workers);
  r.mutable_config()->mutable_optimizer()->set_type(type);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(kLr);
  AddGlorotVariable(&r, "w", n, /*seed=*/5);
  AddGlorotVariable(&r, "b", 5, /*seed=*/5);
  return r;
}

// Worker `w`'s gradient of `n` elements at `step`: values that round
// differently from element to element and from worker to worker.
std::vector<float> WorkerGradient(int w, int64_t step, int64_t n) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = 0.001f * static_cast<float>((i * 7919 + w * 104729 + step * 31) % 2001 - 1000) +
           1e-4f * static_cast<float>(w + 1);
  }
  return g;
}

// Pushes grads[v] for each variable: as slices (copied in), or, with
// `shared`, read in place where the session may share it (then `grads`
// must stay until the update ran, like a worker's segment).
absl::StatusOr<v1::PushResponse> PushGrads(ParameterServer& ps, v1::PushHeader h,
                                           const std::vector<std::vector<float>>& grads,
                                           bool shared) {
  if (shared) h.mutable_segment()->set_size(1);  // names a segment (the service opens it)
  auto s = ps.BeginPush(h);
  if (!s.ok()) return s.status();
  for (size_t v = 0; v < grads.size(); ++v) {
    absl::Status st;
    if (shared && (*s)->CanShare(v)) {
      st = (*s)->AddShared(v, grads[v].data(), nullptr);
    } else {
      st = (*s)->AddSlice(Slice(static_cast<uint32_t>(v), 0, grads[v]));
    }
    if (!st.ok()) return st;
  }
  return ps.FinishPush(std::move(*s));
}

// Rules with slots (momentum, Adam) form the first variable's slots ahead
// too, apart from the optimizer's: pushes that fail after forming them (a
// NaN in the second variable, a variable missing, values changed by another incarnation's
// push) change neither values nor slots, and the pushes that apply give
// the bits of a server that only ever saw them, step after step (each
// step's values depend on the slots the steps before left, and the slot
// buffers the failed pushes wrote in are used again).
TEST(UpdateAheadTest, PushesThatFailAfterFormingSlotsChangeNoSlot) {
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    for (auto type : {v1::OptimizerSpec::MOMENTUM, v1::OptimizerSpec::ADAM}) {
      SCOPED_TRACE(absl::StrCat(v1::Mode_Name(mode), " ", v1::OptimizerSpec::Type_Name(type)));
      v1::RegisterRequest job = TwoVarJob(mode, 1);
      job.mutable_config()->mutable_optimizer()->set_type(type);
      ParameterServer ps(AheadOnSharedCpus());
      ASSERT_TRUE(ps.Register(job).ok());
      // The reference: the rule itself, applied to the pushes that apply.
      std::vector<std::vector<float>> want = Values(*PullNow(ps));
      std::vector<std::unique_ptr<Optimizer>> rules;
      for (const auto& w : want) {
        auto rule = NewOptimizer(job.config().optimizer(), static_cast<int64_t>(w.size()));
        ASSERT_TRUE(rule.ok());
        rules.push_back(*std::move(rule));
      }
      // Same-host pushes (the gradients read in place, here the test's
      // memory, which stays until the update ran): only they form slots
      // ahead.
      auto header = [](uint64_t sequence, int64_t step, uint64_t incarnation) {
        v1::PushHeader h = Header(0, sequence, step, 1, incarnation);
        h.mutable_segment()->set_size(1);
        return h;
      };
      uint64_t sequence = 0;
      for (int64_t step = 0; step < 3; ++step) {
        const std::vector<float> a9(6, 9.0f), b_nan = {1.0f, NAN}, a3(6, -3.0f), a5(6, 5.0f),
            b5(2, 5.0f);
        {  // a NaN in b, after a was formed
          auto s = ps.BeginPush(header(++sequence, step, 7));
          ASSERT_TRUE(s.ok());
          ASSERT_TRUE((*s)->AddShared(0, a9.data(), nullptr).ok());
          EXPECT_EQ((*s)->AddShared(1, b_nan.data(), nullptr).code(),
                    absl::StatusCode::kInvalidArgument);
        }
        {  // b missing
          auto s = ps.BeginPush(header(++sequence, step, 7));
          ASSERT_TRUE(s.ok());
          ASSERT_TRUE((*s)->AddShared(0, a3.data(), nullptr).ok());
          EXPECT_EQ(ps.FinishPush(std::move(*s)).status().code(),
                    absl::StatusCode::kInvalidArgument);
        }
        // All formed, then another incarnation's push is applied first:
        // this one is refused (ASYNC: ABORTED; SYNC: STALE, its step is
        // over) and the other is the step's update.
        auto late = ps.BeginPush(header(++sequence, step, 7));
        ASSERT_TRUE(late.ok());
        ASSERT_TRUE((*late)->AddShared(0, a5.data(), nullptr).ok());
        ASSERT_TRUE((*late)->AddShared(1, b5.data(), nullptr).ok());
        const float g = 0.25f + static_cast<float>(step);
        auto applied =
            PushGrads(ps, Header(0, ++sequence, step, 1, /*incarnation=*/8),
                      {std::vector<float>(6, g), std::vector<float>(2, g)}, /*shared=*/true);
        ASSERT_TRUE(applied.ok()) << applied.status();
        EXPECT_EQ(applied->outcome(), v1::PushResponse::APPLIED);
        auto refused = ps.FinishPush(std::move(*late));
        if (mode == v1::ASYNC) {
          EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted) << refused.status();
        } else {
          ASSERT_TRUE(refused.ok()) << refused.status();
          EXPECT_EQ(refused->outcome(), v1::PushResponse::STALE);
        }
        for (size_t v = 0; v < want.size(); ++v) {
          rules[v]->Apply(absl::MakeSpan(want[v]), std::vector<float>(want[v].size(), g), step + 1);
        }
        EXPECT_EQ(Values(*PullNow(ps, step + 1)), want);
      }
      // Each step's values depend on the slots the steps before left.
      EXPECT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) {
        return j.updates_ahead() == 3 && j.steps_applied() == 3;
      }));
    }
  }
}

// Runs `push` on a thread pinned to one CPU, given the id of a thread
// pinned to another that waits meanwhile: a worker on cores apart from the
// server's. False, running nothing, where this process may run on one CPU
// only.
bool OnCpusApart(const std::function<void(pid_t worker)>& push) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return false;
  auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one) == 0;
  };
  absl::Notification pinned, done;
  // Atomic: TSan does not see into the system's Abseil (the Notification).
  std::atomic<pid_t> worker{0};
  std::atomic<bool> worker_pinned{false};
  std::thread a([&] {
    worker_pinned = pin(cpus[0]);
    worker = gettid();
    pinned.Notify();
    done.WaitForNotification();
  });
  pinned.WaitForNotification();
  std::thread b([&] {
    if (worker_pinned && pin(cpus[1])) {
      push(worker);
    } else {
      ADD_FAILURE() << "could not pin threads to cpus " << cpus[0] << " and " << cpus[1];
    }
  });
  b.join();
  done.Notify();
  a.join();
  return true;
}

// Only a job of one worker updates ahead: with two workers (each push one
// of the step's parts) the update is done in place after the push, as
// before. From another host (gRPC), SGD only; from the same host (the
// gradient read in place), only where the worker runs on cores apart from
// the server's (its pid, in the segment): SGD, and a rule with slots
// (momentum, Adam) for the first variable. The worker on the server's
// cores is the test's own process; only its pushes, of one worker or two,
// are answered with names_with_commit.
TEST(UpdateAheadTest, OnlyAJobOfOneWorkerFromAnotherHostOrOnCoresApart) {
  enum Where { kGrpc, kSameHostSameCores, kSameHostCoresApart };
  for (int workers : {1, 2}) {
    for (Where where : {kGrpc, kSameHostSameCores, kSameHostCoresApart}) {
      for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::MOMENTUM,
                        v1::OptimizerSpec::ADAM}) {
        SCOPED_TRACE(absl::StrCat(workers, " workers, where ", where, ", ",
                                  v1::OptimizerSpec::Type_Name(type)));
        ParameterServer ps({});
        v1::RegisterRequest job = TwoVarJob(v1::ASYNC, workers);
        job.mutable_config()->mutable_optimizer()->set_type(type);
        ASSERT_TRUE(ps.Register(job).ok());
        const std::vector<std::vector<float>> grads = {std::vector<float>(6, 1.0f),
                                                       std::vector<float>(2, 1.0f)};
        v1::PushHeader h = Header(0, 1, 0, 1);
        absl::StatusOr<v1::PushResponse> r;
        if (where == kSameHostCoresApart) {
          if (!OnCpusApart([&](pid_t worker) {
                h.mutable_segment()->set_pid(worker);
                r = PushGrads(ps, h, grads, /*shared=*/true);
              })) {
            GTEST_LOG_(INFO) << "one CPU only: no cores apart to test";
            continue;
          }
        } else {
          if (where == kSameHostSameCores) h.mutable_segment()->set_pid(getpid());
          r = PushGrads(ps, h, grads, /*shared=*/where != kGrpc);
        }
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
        EXPECT_EQ(r->names_with_commit(), where == kSameHostSameCores);
        const bool ahead =
            workers == 1 && (where == kSameHostCoresApart ||
                             (where == kGrpc && type == v1::OptimizerSpec::SGD));
        EXPECT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.steps_applied() == 1; }));
        v1::StatusRequest req;
        req.set_job_id("j");
        EXPECT_EQ(ps.Status(req).jobs(0).updates_ahead(), ahead ? 1 : 0);
        auto snap = PullNow(ps, 1);
        if (type != v1::OptimizerSpec::ADAM) {  // momentum's first step is SGD's
          EXPECT_EQ(snap->values[0], std::vector<float>(6, 0.5f));
        } else {
          // Adam's first step moves each element by about lr (0.5) against g.
          for (float x : snap->values[0]) EXPECT_NEAR(x, 0.5f, 1e-3f);
        }
      }
    }
  }
}

// Read in place or copied in, by some workers or all, in any order of
// arrival: the same bits, in SYNC (three workers, weighted, two steps, SGD
// and Adam) and ASYNC (two workers, each push applied alone).
TEST(SharedPushTest, ReadInPlaceGivesTheBitsOfACopyInAnyOrder) {
  const int64_t n = 3 * Optimizer::kApplyBlock + 123;
  const int64_t examples[3] = {1, 2, 5};
  for (v1::Mode mode : {v1::SYNC, v1::ASYNC}) {
    for (v1::OptimizerSpec::Type type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::ADAM}) {
      const int workers = mode == v1::SYNC ? 3 : 2;
      std::vector<std::vector<float>> want_w, want_b;
      // Which workers share (bit w), and the order they arrive in.
      for (const auto& [sharing, order] :
           {std::pair<int, std::vector<int>>{0, {0, 1, 2}}, {7, {0, 1, 2}}, {7, {2, 0, 1}},
            {5, {1, 2, 0}}, {2, {2, 1, 0}}}) {
        SCOPED_TRACE(absl::StrCat(v1::Mode_Name(mode), " ", v1::OptimizerSpec::Type_Name(type),
                                  " sharing ", sharing, " order ", order[0], order[1],
                                  order[2]));
        if (mode == v1::ASYNC && order != std::vector<int>{0, 1, 2}) continue;  // order counts
        ParameterServer ps({});
        ASSERT_TRUE(ps.Register(SharedPairJob(mode, workers, type, n)).ok());
        std::vector<std::vector<std::vector<float>>> segments;  // the workers' memory
        segments.reserve(2 * workers);
        for (int64_t step = 0; step < 2; ++step) {
          for (int w : order) {
            if (w >= workers) continue;
            const uint64_t seq = static_cast<uint64_t>(step + 1);
            segments.push_back({WorkerGradient(w, step, n), WorkerGradient(w, step, 5)});
            auto r = PushGrads(ps, Header(w, seq, step, examples[w]), segments.back(),
                               (sharing >> w) & 1);
            ASSERT_TRUE(r.ok()) << r.status();
            ASSERT_EQ(r->outcome(), v1::PushResponse::APPLIED);
          }
        }
        auto snap = PullNow(ps, 2);
        ASSERT_NE(snap, nullptr);
        const std::vector<std::vector<float>> got = Values(*snap);
        if (want_w.empty()) {
          // Each update moved the values (an update not applied would not).
          want_w.push_back(got[0]);
          want_b.push_back(got[1]);
          continue;
        }
        EXPECT_TRUE(got[0] == want_w[0]);
        EXPECT_TRUE(got[1] == want_b[0]);
      }
    }
  }
}

// A shared variable is read when the update runs, not copied when the push
// comes: the worker's memory is what the update uses (which is why a
// worker leaves it unchanged until its next forward has pulled the
// update), and the server holds no copy of it.
TEST(SharedPushTest, TheUpdateReadsTheWorkersMemoryNotACopy) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  std::vector<std::vector<float>> g0 = {std::vector<float>(6, 1.0f), std::vector<float>(2, 1.0f)};
  auto r = PushGrads(ps, Header(0, 1, 0, 1), g0, /*shared=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  g0[0].assign(6, 3.0f);  // after the push was answered, before the step is complete
  r = PushGrads(ps, Header(1, 1, 0, 1), {std::vector<float>(6, 1.0f), std::vector<float>(2, 1.0f)},
                /*shared=*/false);  // copied: the temporary may go
  ASSERT_TRUE(r.ok()) << r.status();
  auto snap = PullNow(ps, 1);
  ASSERT_NE(snap, nullptr);
  const std::vector<std::vector<float>> got = Values(*snap);
  EXPECT_EQ(got[0], std::vector<float>(6, 1.0f - kLr * 2.0f));  // mean of 3 and 1
  EXPECT_EQ(got[1], std::vector<float>(2, 0.0f - kLr * 1.0f));
}

// A worker that writes NaN into its shared gradient after the push was
// checked (or weights whose sum overflows) cannot put a NaN or Inf into the
// values: that variable keeps its values this step, the others are
// updated, and the job goes on.
TEST(SharedPushTest, AMeanThatIsNotFiniteIsNotApplied) {
  const int64_t n = 2 * Optimizer::kApplyBlock + 7;
  for (int64_t bad : {int64_t{0}, n - 1}) {
    SCOPED_TRACE(absl::StrCat("NaN at ", bad));
    ParameterServer ps({});
    ASSERT_TRUE(ps.Register(SharedPairJob(v1::SYNC, 2, v1::OptimizerSpec::SGD, n)).ok());
    const std::vector<std::vector<float>> before = Values(*PullNow(ps, 0));
    std::vector<std::vector<float>> g0 = {WorkerGradient(0, 0, n), WorkerGradient(0, 0, 5)};
    auto r = PushGrads(ps, Header(0, 1, 0, 1), g0, /*shared=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    g0[0][bad] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<std::vector<float>> g1 = {WorkerGradient(1, 0, n), WorkerGradient(1, 0, 5)};
    r = PushGrads(ps, Header(1, 1, 0, 1), g1, /*shared=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
    std::vector<std::vector<float>> after = Values(*PullNow(ps, 1));
    EXPECT_TRUE(after[0] == before[0]) << "the variable with the NaN changed";
    EXPECT_TRUE(after[1] != before[1]) << "the other variable was not updated";
    // The next step is applied as usual.
    std::vector<std::vector<float>> g[2];
    for (int w = 0; w < 2; ++w) {
      g[w] = {WorkerGradient(w, 1, n), WorkerGradient(w, 1, 5)};
      r = PushGrads(ps, Header(w, 2, 1, 1), g[w], /*shared=*/true);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    const std::vector<std::vector<float>> next = Values(*PullNow(ps, 2));
    EXPECT_TRUE(next[0] != after[0]);
    for (float x : next[0]) ASSERT_TRUE(std::isfinite(x));
  }
}

// A variable shared and then sent again (or sent, then shared) is refused
// like a slice that came twice, and nothing of the push is applied; so is
// one whose update is formed ahead from it (one worker, SGD).
TEST(SharedPushTest, AVariableComesOnce) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 2)).ok());
  v1::PushHeader h = Header(0, 1, 0, 1);
  h.mutable_segment()->set_size(1);
  const std::vector<float> a(6, 1.0f);
  {
    auto s = ps.BeginPush(h);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->CanShare(0));
    ASSERT_TRUE((*s)->AddShared(0, a.data(), nullptr).ok());
    const absl::Status again = (*s)->AddShared(0, a.data(), nullptr);
    EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument) << again;
    EXPECT_NE(again.message().find("variable 0 named again"), std::string::npos) << again;
    const absl::Status slice = (*s)->AddSlice(Slice(0, 0, a));
    EXPECT_EQ(slice.code(), absl::StatusCode::kInvalidArgument) << slice;
  }
  {
    auto s = ps.BeginPush(h);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->AddSlice(Slice(0, 0, {1, 1, 1})).ok());
    const absl::Status shared = (*s)->AddShared(0, a.data(), nullptr);
    EXPECT_EQ(shared.code(), absl::StatusCode::kInvalidArgument) << shared;
  }
  EXPECT_EQ(PullNow(ps)->global_step, 0);
  EXPECT_EQ(Values(*PullNow(ps))[0], std::vector<float>(6, 1.0f));

  ParameterServer lone({});
  ASSERT_TRUE(lone.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  auto s = lone.BeginPush(h);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->CanShare(0));  // formed ahead from where it is
  ASSERT_TRUE((*s)->AddShared(0, a.data(), nullptr).ok());
  const absl::Status again = (*s)->AddShared(0, a.data(), nullptr);
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument) << again;
  EXPECT_EQ((*s)->AddSlice(Slice(0, 0, a)).code(), absl::StatusCode::kInvalidArgument);
  s->reset();
  EXPECT_EQ(Values(*PullNow(lone))[0], std::vector<float>(6, 1.0f));
}

// The gradients (or statistics) of each variable, pushed as slices.
absl::StatusOr<v1::PushResponse> PushEach(ParameterServer& ps, const v1::PushHeader& h,
                                          const std::vector<std::vector<float>>& grads) {
  return PushGrads(ps, h, grads, /*shared=*/false);
}

// An update whose new values would overflow a float is not applied, where
// the update runs after the pushes were answered (a step of two workers):
// that variable keeps its values, the other one of the step is updated,
// and the variable trains on at the next step. Before, its values became
// -inf, with nothing said.
TEST(OverflowGuardTest, AStepThatWouldOverflowAVariableLeavesItsValues) {
  std::atomic<int> callbacks{0};
  ParameterServer ps({.on_update_skipped = [&](const std::string& job) {
    EXPECT_EQ(job, "j");
    ++callbacks;
  }});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::SYNC, 2)).ok());
  const float huge = -3e38f;  // lr 0.5: 1 + 1.5e38, 3e38, then 4.5e38 (inf)
  std::vector<float> before;
  for (int64_t step = 0; step < 4; ++step) {
    const float g = step < 3 ? huge : 1e38f;
    for (int worker : {0, 1}) {
      auto r = PushEach(ps, Header(worker, step + 1, step, 1),
                        {std::vector<float>(6, g), std::vector<float>(2, 1.0f)});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
    }
    auto snap = PullNow(ps, step + 1);
    ASSERT_EQ(snap->global_step, step + 1);
    const std::vector<float> a = Values(*snap)[0];
    for (float x : a) EXPECT_TRUE(std::isfinite(x)) << "step " << step;
    EXPECT_EQ(Values(*snap)[1], std::vector<float>(2, -kLr * static_cast<float>(step + 1)));
    v1::StatusRequest req;
    req.set_job_id("j");
    // Counted once the update ran (the pull above waited for that).
    EXPECT_EQ(ps.Status(req).jobs(0).updates_skipped(), step >= 2 ? 1 : 0) << "step " << step;
    EXPECT_EQ(callbacks.load(), step >= 2 ? 1 : 0) << "step " << step;
    if (step == 1) {
      EXPECT_EQ(a, std::vector<float>(6, 3e38f));
    } else if (step == 2) {
      EXPECT_EQ(a, before) << "the update that overflows was not applied";
    } else if (step == 3) {
      EXPECT_EQ(a, std::vector<float>(6, 3e38f - kLr * 1e38f));
    }
    before = a;
  }
}

// Adam's second moment overflows for a gradient past 1.8e19 (g * g) while
// the values stay finite: such an update is not applied either, whether
// it runs for a step of two workers or for a lone worker's push that came
// as slices, so the next update is the one a server that never saw it
// makes, bit for bit. Before, v became +inf and froze those elements: each
// later update moved them by 0.
TEST(OverflowGuardTest, AnUpdateThatWouldOverflowAdamsSlotsLeavesThem) {
  for (int workers : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    auto job = [&] {
      v1::RegisterRequest r = TwoVarJob(v1::SYNC, workers);
      r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
      return r;
    };
    ParameterServer guarded({}), fresh({});
    ASSERT_TRUE(guarded.Register(job()).ok());
    ASSERT_TRUE(fresh.Register(job()).ok());
    const std::vector<std::vector<float>> huge = {std::vector<float>(6, 1e21f),
                                                  std::vector<float>(2, 1.0f)};
    const std::vector<std::vector<float>> usual = {std::vector<float>(6, 0.5f),
                                                   std::vector<float>(2, 1.0f)};
    const std::vector<float> start = Values(*PullNow(guarded))[0];
    for (int worker = 0; worker < workers; ++worker) {
      ASSERT_TRUE(PushEach(guarded, Header(worker, 1, 0, 1), huge).ok());
      ASSERT_TRUE(PushEach(fresh, Header(worker, 1, 0, 1), usual).ok());
    }
    EXPECT_EQ(Values(*PullNow(guarded, 1))[0], start);  // when it came
    for (int worker = 0; worker < workers; ++worker) {
      ASSERT_TRUE(PushEach(guarded, Header(worker, 2, 1, 1), usual).ok());
    }
    const std::vector<float> a = Values(*PullNow(guarded, 2))[0];
    EXPECT_EQ(a, Values(*PullNow(fresh, 1))[0]);
    EXPECT_NE(a, start);
  }
}

// Updates formed ahead as a lone worker's slices arrive (SGD over gRPC)
// are checked alike: a push whose new values would overflow is refused,
// naming the variable and worker, and nothing is applied. Before, it was
// answered APPLIED and the values became -inf.
TEST(OverflowGuardTest, AnUpdateFormedAheadThatWouldOverflowIsRefused) {
  ParameterServer ps({});
  ASSERT_TRUE(ps.Register(TwoVarJob(v1::ASYNC, 1)).ok());
  const std::vector<std::vector<float>> huge = {std::vector<float>(6, -3e38f),
                                                std::vector<float>(2, 1.0f)};
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    auto r = PushEach(ps, Header(0, seq, 0, 1), huge);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::PushResponse::APPLIED);
  }
  EXPECT_TRUE(WaitForJob(ps, [](const v1::JobStatus& j) { return j.updates_ahead() == 2; }));
  const std::shared_ptr<const WeightsSnapshot> before = PullNow(ps, 2);
  EXPECT_EQ(Values(*before)[0], std::vector<float>(6, 3e38f));
  auto r = PushEach(ps, Header(0, 3, 0, 1), huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find(
                "new values of variable 0 formed from the gradient of worker 0 are not finite"),
            std::string::npos)
      << r.status();
  auto after = PullNow(ps, 2);
  EXPECT_EQ(after->global_step, 2);
  EXPECT_EQ(Values(*after), Values(*before));
  // The variable trains on.
  r = PushEach(ps, Header(0, 3, 0, 1), {std::vector<float>(6, 1e38f), std::vector<float>(2, 1.0f)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Values(*PullNow(ps, 3))[0], std::vector<float>(6, 3e38f - kLr * 1e38f));
}

}  // namespace
}  // namespace towerps::ps
