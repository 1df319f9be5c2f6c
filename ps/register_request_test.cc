#include "ps/register_request.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/optimizer_spec.h"
#include "gtest/gtest.h"
#include "ps/register_request_testing.h"

namespace towerps::ps {
namespace {

TEST(RegisterRequestTest, AWellFormedRequestIsAccepted) {
  EXPECT_TRUE(ValidateRegister(TwoVarJob(v1::SYNC, 2), 1 << 20).ok());
  EXPECT_TRUE(ValidateRegister(TwoVarJob(v1::ASYNC, kMaxWorkers), 1 << 20).ok());
}

// Every refusal names the field at fault, with the code a caller can act on.
TEST(RegisterRequestTest, EachBadFieldIsNamed) {
  struct Case {
    std::string what;
    void (*spoil)(v1::RegisterRequest*);
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no job id", [](v1::RegisterRequest* r) { r->clear_job_id(); },
       absl::StatusCode::kInvalidArgument, "register: job_id is empty"},
      {"no workers", [](v1::RegisterRequest* r) { r->mutable_config()->set_num_workers(0); },
       absl::StatusCode::kInvalidArgument, "config.num_workers = 0 (want 1..10000)"},
      {"too many replicas",
       [](v1::RegisterRequest* r) { r->mutable_config()->set_replicas_to_aggregate(3); },
       absl::StatusCode::kInvalidArgument,
       "config.replicas_to_aggregate = 3 (want 0..num_workers = 2)"},
      {"negative staleness",
       [](v1::RegisterRequest* r) { r->mutable_config()->set_max_staleness(-1); },
       absl::StatusCode::kInvalidArgument, "config.max_staleness is negative"},
      {"peer timeout over a day",
       [](v1::RegisterRequest* r) { r->mutable_config()->set_peer_timeout_s(86401); },
       absl::StatusCode::kInvalidArgument, "config.peer_timeout_s = 86401 (want 0..86400)"},
      {"peer timeout NaN",
       [](v1::RegisterRequest* r) { r->mutable_config()->set_peer_timeout_s(NAN); },
       absl::StatusCode::kInvalidArgument, "config.peer_timeout_s = nan"},
      {"worker task out of range", [](v1::RegisterRequest* r) { r->set_worker_task(2); },
       absl::StatusCode::kInvalidArgument,
       "register: worker_task 2 is out of range (job has 2 workers)"},
      {"unknown mode",
       [](v1::RegisterRequest* r) { r->mutable_config()->set_mode(static_cast<v1::Mode>(7)); },
       absl::StatusCode::kInvalidArgument, "config.mode is unknown"},
      {"bad learning rate",
       [](v1::RegisterRequest* r) {
         r->mutable_config()->mutable_optimizer()->set_learning_rate(-1);
       },
       absl::StatusCode::kInvalidArgument, "learning_rate"},
      {"no name", [](v1::RegisterRequest* r) { r->mutable_variables(1)->clear_name(); },
       absl::StatusCode::kInvalidArgument, "a variable has no name"},
      {"a name twice", [](v1::RegisterRequest* r) { r->mutable_variables(1)->set_name("a"); },
       absl::StatusCode::kInvalidArgument, "variable \"a\" appears twice"},
      {"not float32",
       [](v1::RegisterRequest* r) { r->mutable_variables(1)->set_dtype(v1::DT_INVALID); },
       absl::StatusCode::kInvalidArgument, "variable \"b\" has unsupported dtype 0"},
      {"a dimension of 0", [](v1::RegisterRequest* r) { r->mutable_variables(0)->set_shape(1, 0); },
       absl::StatusCode::kInvalidArgument, "variable \"a\" has invalid dimension 0"},
      {"a bad initializer",
       [](v1::RegisterRequest* r) {
         r->mutable_variables(0)->mutable_initializer()->set_value(INFINITY);
       },
       absl::StatusCode::kInvalidArgument, "variable \"a\": initializer.value = inf"},
      {"bytes past int64",
       [](v1::RegisterRequest* r) {
         r->mutable_variables(1)->set_shape(0, int64_t{1} << 40);
         r->mutable_variables(1)->add_shape(int64_t{1} << 22);
       },
       absl::StatusCode::kResourceExhausted,
       "variable \"b\" of shape [1099511627776, 4194304] overflows int64 (elements x 4 bytes);"
       " this server's limit is 1048576 bytes per job (--max_job_bytes)"},
  };
  for (const Case& c : cases) {
    v1::RegisterRequest r = TwoVarJob(v1::SYNC, 2);
    c.spoil(&r);
    const absl::Status st = ValidateRegister(r, 1 << 20);
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.what << ": " << st;
  }
}

TEST(RegisterRequestTest, CheckWorkerTaskAcceptsExactlyTheJobsWorkers) {
  EXPECT_TRUE(CheckWorkerTask("push", 0, 3).ok());
  EXPECT_TRUE(CheckWorkerTask("push", 2, 3).ok());
  for (int64_t task : {int64_t{-1}, int64_t{3}, int64_t{1} << 40}) {
    const absl::Status st = CheckWorkerTask("push", task, 3);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << task;
    EXPECT_EQ(st.message(), "push: worker_task " + std::to_string(task) +
                                " is out of range (job has 3 workers)");
  }
}

TEST(RegisterRequestTest, NormalizedConfigFillsOnlyWhatIsUnset) {
  v1::TrainingConfig c = TwoVarJob(v1::MODE_UNSPECIFIED, 2).config();
  const v1::TrainingConfig n = NormalizedConfig(c);
  EXPECT_EQ(n.mode(), v1::SYNC);
  EXPECT_EQ(n.peer_timeout_s(), kDefaultPeerTimeoutS);
  EXPECT_EQ(n.optimizer().SerializeAsString(),
            common::OptimizerWithDefaults(c.optimizer()).SerializeAsString());
  EXPECT_EQ(n.num_workers(), 2);
  c.set_mode(v1::ASYNC);
  c.set_peer_timeout_s(5);
  const v1::TrainingConfig kept = NormalizedConfig(c);
  EXPECT_EQ(kept.mode(), v1::ASYNC);
  EXPECT_EQ(kept.peer_timeout_s(), 5);
}

TEST(RegisterRequestTest, ElementsSaturate) {
  v1::VariableDef def;
  EXPECT_EQ(ElementsOf(def), 1);  // a scalar
  def.add_shape(3);
  def.add_shape(5);
  EXPECT_EQ(ElementsOf(def), 15);
  def.add_shape(int64_t{1} << 62);
  EXPECT_EQ(ElementsOf(def), INT64_MAX);
}

// Issue 15 (limits): everything a job holds is counted, per element of each
// variable: value + pull snapshot + optimizer slots + one push buffer per
// worker (issue 16: no accumulator; SYNC sums into the first worker's
// buffer). TwoVarJob has 6 + 2 elements and 2 workers.
TEST(RegisterRequestTest, FootprintCountsValuesSnapshotsSlotsAndBuffers) {
  auto r = TwoVarJob(v1::SYNC, 2);
  auto footprint = [](v1::RegisterRequest req, v1::OptimizerSpec::Type type) {
    req.mutable_config()->mutable_optimizer()->set_type(type);
    return RegisterFootprintBytes(req, req.config());
  };
  EXPECT_EQ(footprint(r, v1::OptimizerSpec::SGD), 8 * (2 + 0 + 2) * 4);       // 128
  EXPECT_EQ(footprint(r, v1::OptimizerSpec::MOMENTUM), 8 * (2 + 1 + 2) * 4);  // 160
  EXPECT_EQ(footprint(r, v1::OptimizerSpec::ADAM), 8 * (2 + 2 + 2) * 4);      // 192
  // A moving statistic has no slots.
  r.mutable_variables(1)->set_update(v1::VariableDef::MOVING_AVERAGE);
  EXPECT_EQ(footprint(r, v1::OptimizerSpec::ADAM), 6 * 6 * 4 + 2 * 4 * 4);  // 176
  // One worker: its same-host pushes form the slots' new values of the
  // first and of the small variables ahead, apart (a second set of their
  // slots); a large variable after the first has one set.
  auto one = TwoVarJob(v1::SYNC, 1);
  EXPECT_EQ(footprint(one, v1::OptimizerSpec::SGD), 8 * (2 + 0 + 1) * 4);
  EXPECT_EQ(footprint(one, v1::OptimizerSpec::MOMENTUM), 8 * (2 + 2 + 1) * 4);
  EXPECT_EQ(footprint(one, v1::OptimizerSpec::ADAM), 8 * (2 + 4 + 1) * 4);
  const int64_t big = kSlotsAheadMaxElements + 1;
  one.mutable_variables(1)->set_shape(0, big);
  EXPECT_EQ(footprint(one, v1::OptimizerSpec::ADAM), 6 * (2 + 4 + 1) * 4 + big * (2 + 2 + 1) * 4);
  EXPECT_EQ(footprint(one, v1::OptimizerSpec::MOMENTUM),
            6 * (2 + 2 + 1) * 4 + big * (2 + 1 + 1) * 4);
}

// A refusal for size names the largest variable and what each of its
// elements costs, in the terms of FloatsPerElement.
TEST(RegisterRequestTest, FootprintDetailNamesTheLargestVariable) {
  v1::RegisterRequest r = TwoVarJob(v1::SYNC, 2);
  r.mutable_variables(1)->set_shape(0, 100);
  r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  const v1::TrainingConfig config = NormalizedConfig(r.config());
  const int64_t need = RegisterFootprintBytes(r, config);
  EXPECT_EQ(need, (6 + 100) * (2 + 2 + 2) * 4);
  EXPECT_EQ(FootprintDetail(r, config, need),
            "job \"j\" needs 2544 bytes; variable \"b\" of shape [100] alone needs 2400 (6 "
            "floats per element: value, pull snapshot, 2 optimizer slots, 2 push buffers)");
  // One worker: the first variable's slots are formed ahead, twice over.
  r.mutable_config()->set_num_workers(1);
  r.mutable_variables(0)->set_shape(0, 200);
  const v1::TrainingConfig one = NormalizedConfig(r.config());
  EXPECT_NE(FootprintDetail(r, one, 1).find("variable \"a\" of shape [200, 3] alone needs 16800 "
                                            "(7 floats per element: value, pull snapshot, 4 "
                                            "optimizer slots (with those its worker's pushes "
                                            "form ahead), 1 push buffers)"),
            std::string::npos)
      << FootprintDetail(r, one, 1);
  r.clear_variables();
  EXPECT_EQ(FootprintDetail(r, one, 0), "job \"j\" needs 0 bytes");
}

}  // namespace
}  // namespace towerps::ps
