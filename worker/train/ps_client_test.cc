// ParameterClient against real parameter servers (ps/ and its gRPC adapter)
// on loopback: registration split by placement, exact push/pull round trips,
// duplicate pushes, waiting for a server that is not up yet, a restarted
// server, cancellation of a blocked pull, bad input.
#include "worker/train/ps_client.h"

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/initializer.h"
#include "common/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/local_ps_cluster.h"
#include "worker/train/ps_client_testing.h"

namespace towerps::worker {
namespace {

using testing_ps::Buffers;
using testing_ps::Config;
using testing_ps::Grad;
using testing_ps::Grads;
using testing_ps::kLr;
using testing_ps::NewClient;
using testing_ps::Options;
using testing_ps::Var;
using testing_ps::Vars;
using testing_ps::WaitFor;

using ::testing::HasSubstr;

TEST(PsClientTest, RegisterSplitsVariablesByPlacementAndReturnsTheStep) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_NE(client, nullptr);
  auto step = client->Register(Config(v1::ASYNC, 1));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);  // a new job

  // Each server holds exactly the variables the placement put on it, in its
  // order.
  const Placement& placement = client->placement();
  const std::vector<v1::VariableDef> vars = Vars();
  int held = 0;
  for (int s = 0; s < 2; ++s) {
    auto on_server = cluster.server(s).Variables("j");
    ASSERT_TRUE(on_server.ok()) << on_server.status();
    const std::vector<int> expected = placement.VariablesOn(s);
    ASSERT_EQ(on_server->size(), expected.size()) << "ps " << s;
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ((*on_server)[k].name(), vars[expected[k]].name()) << "ps " << s;
    }
    EXPECT_FALSE(expected.empty()) << "ps " << s << " got no variable";
    held += static_cast<int>(on_server->size());
  }
  EXPECT_EQ(held, 3);
  EXPECT_EQ(placement.server[0], 0);  // "big" alone on ps 0
  EXPECT_EQ(placement.server[1], 1);
  EXPECT_EQ(placement.server[2], 1);

  // One update, then a second worker process registering the same job sees it.
  Buffers g = Grads();
  auto pushed = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  auto again = NewClient(Options(cluster, "j"));
  auto step2 = again->Register(Config(v1::ASYNC, 1));
  ASSERT_TRUE(step2.ok()) << step2.status();
  EXPECT_EQ(*step2, 1);
}

TEST(PsClientTest, PushThenPullRoundTripsExactly) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());

  Buffers w(Vars());
  auto step = client->Pull(0, 0, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  for (const auto& t : w.tensors) {
    for (int64_t i = 0; i < t.num_elements(); ++i)
      ASSERT_EQ(t[i], 1.0f);  // CONSTANT 1
  }

  Buffers g = Grads();
  auto r = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 2);
  EXPECT_EQ(r->stale, 0);
  EXPECT_EQ(r->duplicate, 0);
  EXPECT_EQ(r->global_step, 1);

  step = client->Pull(1, 1, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      // Exact: lr and the gradients are chosen so (see kLr).
      ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(v, i))
          << "variable " << v << " element " << i;
    }
  }
}

// PARTITIONED over 3 servers: "big" (2560 of the 2603 elements) is split
// across all of them; a pull reassembles it exactly as the whole variable
// would be initialized (GLOROT with its parts' offsets), and a push's
// gradient lands on the right elements of every part.
TEST(PsClientTest, PartitionedVariablesRoundTripExactlyAcrossServers) {
  LocalPsCluster cluster(3);
  std::vector<v1::VariableDef> vars = Vars();
  auto* init = vars[0].mutable_initializer();
  init->set_type(v1::Initializer::GLOROT_UNIFORM);
  init->set_seed(5);
  init->set_fan_in(64);
  init->set_fan_out(40);
  auto c = NewGrpcParameterClient(Options(cluster, "p"), vars, v1::PARTITIONED);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& client = *c;
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  int big_parts = 0;
  for (const auto& part : client->placement().parts) big_parts += part.var == 0;
  EXPECT_EQ(big_parts, 3);
  for (int s = 0; s < 3; ++s) {
    auto on = cluster.server(s).Variables("p");
    ASSERT_TRUE(on.ok());
    EXPECT_EQ((*on)[0].name(), absl::StrCat("big/part-", s, "-of-3"));
  }

  std::vector<float> whole(64 * 40);
  common::InitializeValues(vars[0].initializer(), absl::MakeSpan(whole));
  Buffers w(vars);
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());
  for (int64_t i = 0; i < 64 * 40; ++i) ASSERT_EQ(w.tensors[0][i], whole[i]) << i;

  Buffers g = Grads();
  auto r = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 3);
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  for (int64_t i = 0; i < 64 * 40; ++i) {
    ASSERT_EQ(w.tensors[0][i], whole[i] - kLr * Grad(0, i)) << i;
  }
  for (size_t v = 1; v < vars.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(v, i)) << v << " " << i;
    }
  }
}

TEST(PsClientTest, SyncStepAdvancesOncePerStepAndAveragesByExamples) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 1)).ok());
  Buffers g = Grads();
  // 4 examples (a power of two): the server's weighted mean n*g/n is exact.
  auto r = client->Push(0, 4, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  // A second gradient for the step already applied is dropped as stale.
  r = client->Push(0, 4, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stale, 2);
  EXPECT_EQ(r->applied, 0);
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(v, i));
    }
  }
}

TEST(PsClientTest, RepeatedSequenceFromTheSameIncarnationIsNotAppliedTwice) {
  // A push's identity is (worker_task, incarnation, sequence). Two clients with
  // the same incarnation each number their first push 1: the second one is
  // what a retry of the first looks like to the servers.
  LocalPsCluster cluster(2);
  ParameterClientOptions o = Options(cluster, "j");
  o.incarnation = 42;
  auto first = NewClient(o);
  auto retry = NewClient(o);
  ASSERT_TRUE(first->Register(Config(v1::ASYNC, 1)).ok());
  ASSERT_TRUE(retry->Register(Config(v1::ASYNC, 1)).ok());
  Buffers g = Grads();
  auto r = first->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 2);
  r = retry->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->duplicate, 2);
  EXPECT_EQ(r->applied, 0);
  EXPECT_EQ(r->global_step, 1);

  Buffers w(Vars());
  auto step = first->Pull(0, 0, w.ptrs);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(v, i)) << "applied twice?";
    }
  }
}

TEST(PsClientTest, RegisterWaitsForAServerThatIsNotUpYet) {
  LocalPsCluster cluster(2, /*start=*/false);
  ASSERT_TRUE(cluster.Start(0).ok());
  auto client = NewClient(Options(cluster, "j"));  // peer_timeout 4 s
  auto registered = std::async(std::launch::async, [&] {
    return client->Register(Config(v1::ASYNC, 1));
  });
  // Registration is under way: ps 0 holds the job while ps 1 is still down.
  ASSERT_TRUE(WaitFor([&] { return cluster.server(0).Variables("j").ok(); }));
  ASSERT_EQ(registered.wait_for(std::chrono::seconds(0)),
            std::future_status::timeout)
      << "Register returned with ps 1 down";
  ASSERT_TRUE(cluster.Start(1).ok());
  auto step = registered.get();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  EXPECT_TRUE(cluster.server(1).Variables("j").ok());
}

TEST(PsClientTest, RegisterGivesUpOnAServerThatNeverComesUp) {
  LocalPsCluster cluster(2, /*start=*/false);
  ASSERT_TRUE(cluster.Start(0).ok());
  ParameterClientOptions o = Options(cluster, "j");
  o.peer_timeout = absl::Seconds(1);
  auto client = NewClient(o);
  auto step = client->Register(Config(v1::ASYNC, 1));
  ASSERT_EQ(step.status().code(), absl::StatusCode::kUnavailable)
      << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr(absl::StrCat("ps 1 at ", cluster.addresses()[1])));
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("peer_timeout_s=1"));
}

TEST(PsClientTest, PullFromARestartedServerFailsWithNotFound) {
  LocalPsCluster cluster(2);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());

  ASSERT_TRUE(cluster.Restart(1).ok());  // a new incarnation, without the job
  auto step = client->Pull(0, 0, w.ptrs);
  ASSERT_EQ(step.status().code(), absl::StatusCode::kNotFound) << step.status();
  EXPECT_THAT(
      std::string(step.status().message()),
      HasSubstr(absl::StrCat("ps 1 at ", cluster.addresses()[1],
                             " restarted and no longer holds job \"j\"")));
  // And it stays lost: a push fails the same way.
  Buffers g = Grads();
  auto r = client->Push(0, 1, g.const_ptrs);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("restarted"));
}

TEST(PsClientTest, AServerDownLongerThanPeerTimeoutFailsPullWithUnavailable) {
  LocalPsCluster cluster(2);
  ParameterClientOptions o = Options(cluster, "j");
  o.peer_timeout = absl::Seconds(1);
  auto client = NewClient(o);
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(0, 0, w.ptrs).ok());

  cluster.Stop(1);  // and never back
  const absl::Time start = absl::Now();
  auto step = client->Pull(0, 0, w.ptrs);
  ASSERT_EQ(step.status().code(), absl::StatusCode::kUnavailable)
      << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr(absl::StrCat("ps 1 at ", cluster.addresses()[1],
                                     " unreachable for")));
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("peer_timeout_s=1"));
  // Not before the peer timeout (the pull retried until then).
  EXPECT_GE(absl::Now() - start, o.peer_timeout);
}

TEST(PsClientTest, PullWaitingOnALostWorkerIsAbortedNamingIt) {
  LocalPsCluster cluster(1);
  v1::TrainingConfig config = Config(v1::SYNC, 2);
  config.set_peer_timeout_s(1);  // the server's patience with worker 1
  ParameterClientOptions o0 = Options(cluster, "j");
  ParameterClientOptions o1 = o0;
  o1.worker_task = 1;
  auto worker0 = NewClient(o0);
  {
    auto worker1 = NewClient(o1);
    ASSERT_TRUE(worker1->Register(config).ok());
  }  // worker 1 goes away: no more heartbeats from it
  ASSERT_TRUE(worker0->Register(config).ok());
  Buffers g = Grads();
  ASSERT_TRUE(worker0->Push(0, 1, g.const_ptrs).ok());
  Buffers w(Vars());
  auto step = worker0->Pull(1, 1, w.ptrs);
  ASSERT_EQ(step.status().code(), absl::StatusCode::kAborted) << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("job \"j\" on ps 0: step 1 waits for worker 1"));
}

TEST(PsClientTest, CancellingABlockedPullReturnsCancelledPromptly) {
  LocalPsCluster cluster(2);
  common::CancellationToken cancel;
  ParameterClientOptions o = Options(cluster, "j");
  o.cancel = &cancel;
  auto client = NewClient(o);
  // SYNC with 2 workers; worker 1 never pushes, so step 1 never comes.
  ASSERT_TRUE(client->Register(Config(v1::SYNC, 2)).ok());
  Buffers g = Grads();
  auto r = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 0);

  Buffers w(Vars());
  auto pulled = std::async(std::launch::async,
                           [&] { return client->Pull(1, 1, w.ptrs); });
  // Blocked: both servers hold a pull waiting for the step.
  auto waiting = [&](int s) {
    v1::StatusRequest req;
    req.set_job_id("j");
    const v1::StatusResponse resp = cluster.server(s).Status(req);
    return resp.jobs_size() == 1 && resp.jobs(0).pulls_waiting() > 0;
  };
  ASSERT_TRUE(WaitFor([&] { return waiting(0) && waiting(1); }));
  ASSERT_EQ(pulled.wait_for(std::chrono::seconds(0)),
            std::future_status::timeout);

  const absl::Time cancelled_at = absl::Now();
  cancel.Cancel("test stops the job");
  auto step = pulled.get();
  const absl::Duration latency = absl::Now() - cancelled_at;
  ASSERT_EQ(step.status().code(), absl::StatusCode::kCancelled)
      << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("test stops the job"));
  // The pull notices at the end of one server-side wait (peer_timeout / 4)
  // at the latest: well within the peer timeout, and the server would only
  // have given up on worker 1 after the job's 60 s.
  EXPECT_LT(latency, o.peer_timeout) << "cancellation took " << latency;
}

TEST(PsClientTest, WrongNumberOfBuffersIsInvalidArgument) {
  LocalPsCluster cluster(1);
  auto client = NewClient(Options(cluster, "j"));
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers w(Vars());
  std::vector<common::Tensor*> two(w.ptrs.begin(), w.ptrs.begin() + 2);
  auto step = client->Pull(0, 0, two);
  ASSERT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument)
      << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("got 2 buffers for 3 variables"));

  std::vector<const common::Tensor*> four = w.const_ptrs;
  four.push_back(w.const_ptrs[0]);
  auto r = client->Push(0, 1, four);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("got 4 gradients for 3 variables"));
  // Nothing was applied.
  auto status = cluster.server(0).Status(v1::StatusRequest());
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).global_step(), 0);
}

// Issue 16: compressed pushes against real servers. The gradients are small
// integers, exact in float16 and bfloat16, and top-k with ratio 1 sends
// everything: the round trip stays exact across PARTITIONED servers.
TEST(PsClientTest, CompressedPushesRoundTripExactlyAcrossServers) {
  for (auto type : {v1::GradientCompression::FP16, v1::GradientCompression::BF16,
                    v1::GradientCompression::TOPK}) {
    SCOPED_TRACE(v1::GradientCompression::Type_Name(type));
    LocalPsCluster cluster(3);
    ParameterClientOptions o = Options(cluster, "c");
    o.compression.set_type(type);
    if (type == v1::GradientCompression::TOPK) o.compression.set_ratio(1.0);
    auto c = NewGrpcParameterClient(o, Vars(), v1::PARTITIONED);
    ASSERT_TRUE(c.ok()) << c.status();
    auto& client = *c;
    ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
    Buffers g = Grads();
    auto r = client->Push(0, 1, g.const_ptrs);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->applied, 3);
    Buffers w(Vars());
    ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
    for (size_t v = 0; v < w.tensors.size(); ++v) {
      for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
        ASSERT_EQ(w.tensors[v][i], 1.0f - kLr * Grad(v, i)) << v << " " << i;
      }
    }
  }
}

// Top-k without error feedback, ratio 0.5: exactly the larger half of each
// variable (ties to the lower index) moves, by its own gradient; the rest is
// sent as zeros. (Error feedback's bookkeeping: gradient_compressor_test.)
TEST(PsClientTest, TopKMovesOnlyTheLargestHalfOfEachVariable) {
  LocalPsCluster cluster(2);
  ParameterClientOptions o = Options(cluster, "k");
  o.compression.set_type(v1::GradientCompression::TOPK);
  o.compression.set_ratio(0.5);
  o.compression.set_error_feedback(false);
  auto client = NewClient(o);
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers g = Grads();
  ASSERT_TRUE(client->Push(0, 1, g.const_ptrs).ok());
  Buffers w(Vars());
  ASSERT_TRUE(client->Pull(1, 1, w.ptrs).ok());
  for (size_t v = 0; v < w.tensors.size(); ++v) {
    int moved = 0;
    for (int64_t i = 0; i < w.tensors[v].num_elements(); ++i) {
      const float x = w.tensors[v][i];
      ASSERT_TRUE(x == 1.0f || x == 1.0f - kLr * Grad(v, i)) << v << " " << i << " " << x;
      moved += x != 1.0f;
    }
    EXPECT_EQ(moved, (w.tensors[v].num_elements() + 1) / 2) << v;
  }
}

TEST(PsClientTest, NaNGradientWithCompressionFailsAndSendsNothing) {
  LocalPsCluster cluster(2);
  ParameterClientOptions o = Options(cluster, "n");
  o.compression.set_type(v1::GradientCompression::FP16);
  auto client = NewClient(o);
  ASSERT_TRUE(client->Register(Config(v1::ASYNC, 1)).ok());
  Buffers g = Grads();
  g.tensors[1][3] = std::nanf("");
  auto r = client->Push(0, 1, g.const_ptrs);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"mid\" is NaN at element 3"));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(cluster.server(s).Status(v1::StatusRequest()).jobs(0).global_step(), 0);
  }
  // Nothing reached the servers: the next push applies.
  g.tensors[1][3] = 1.0f;
  r = client->Push(0, 1, g.const_ptrs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->applied, 2);
}

TEST(PsClientTest, BadCompressionIsInvalidArgumentNamingTheField) {
  LocalPsCluster cluster(1, /*start=*/false);
  ParameterClientOptions o = Options(cluster, "j");
  o.compression.set_type(v1::GradientCompression::TOPK);
  o.compression.set_ratio(3);
  auto c = NewGrpcParameterClient(o, Vars(), v1::GREEDY_BYTES);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("compression.ratio = 3"));
}

TEST(PsClientTest, BadOptionsAreInvalidArgument) {
  ParameterClientOptions o;
  o.job_id = "j";
  auto c = NewGrpcParameterClient(o, Vars(), v1::GREEDY_BYTES);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("no ps addresses"));
  o.ps_addresses = {"127.0.0.1:1"};
  o.job_id = "";
  c = NewGrpcParameterClient(o, Vars(), v1::GREEDY_BYTES);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("no job id"));
  o.job_id = "j";
  o.chunk_bytes = 100;
  c = NewGrpcParameterClient(o, Vars(), v1::GREEDY_BYTES);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("chunk_bytes"));
}

}  // namespace
}  // namespace towerps::worker
