// ValidateSubmission: each bad spec the chief must refuse at submit time,
// with the field named.
#include "worker/chief/submission.h"

#include <sys/stat.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"

namespace towerps::worker {
namespace {

v1::JobSpec Mlp() { return JobWithDefaults(*BuiltinJob("mlp")); }

void ExpectRejected(const v1::JobSpec& job, const std::string& want) {
  absl::Status s = ValidateSubmission(JobWithDefaults(job), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
}

TEST(ValidateSubmissionTest, TheBuiltInJobsAreValid) {
  EXPECT_TRUE(ValidateSubmission(Mlp(), 2).ok()) << ValidateSubmission(Mlp(), 2);
  auto stack = JobWithDefaults(*BuiltinJob("dense_stack"));
  EXPECT_TRUE(ValidateSubmission(stack, 2).ok()) << ValidateSubmission(stack, 2);
  auto cnn = JobWithDefaults(*BuiltinJob("cnn_small"));
  EXPECT_TRUE(ValidateSubmission(cnn, 2).ok()) << ValidateSubmission(cnn, 2);
}

// Issue 15 (limits): the built-in mlp on 2 workers holds (269322 parameters x
// 2 + 2068 x 128 examples) floats = 3213392 bytes per worker: per example,
// two 256-unit layers' outputs, their ReLUs' and the 10 logits, each with
// its gradient (model_limits.h).
TEST(ValidateSubmissionTest, AModelOverTheWorkerBudgetIsResourceExhausted) {
  EXPECT_TRUE(ValidateSubmission(Mlp(), 2, 3213392).ok());
  const absl::Status s = ValidateSubmission(Mlp(), 2, 3213391);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "job spec: the model needs about 3213392 bytes on each worker (269322 parameters, "
            "2068 activation floats per example x 128 examples x 1 towers, weights and "
            "gradients); a worker's budget is 3213391 bytes (--memory_budget_bytes)");
  // In 2 micro-batches, each layer's bias gradient is also computed apart
  // before it is added up: 256 + 256 + 10 floats more.
  v1::JobSpec micro = Mlp();
  micro.set_micro_batches(2);
  EXPECT_TRUE(ValidateSubmission(micro, 2, 3213392 + 522 * 4).ok());
  const absl::Status m = ValidateSubmission(micro, 2, 3213392 + 522 * 4 - 1);
  EXPECT_EQ(m.code(), absl::StatusCode::kResourceExhausted) << m;
  EXPECT_NE(m.message().find("about 3215480 bytes on each worker"), absl::string_view::npos) << m;
  EXPECT_NE(m.message().find("weights and gradients, and what adds up 2 micro-batches)"),
            absl::string_view::npos)
      << m;
  // A 10^9-unit layer: the field, before anything is built.
  v1::JobSpec huge = Mlp();
  huge.mutable_model()->mutable_layers(1)->set_units(1000000000);
  ExpectRejected(huge, "job spec: model.layers[1].units = 1000000000 (limit 1048576)");
}

TEST(ValidateSubmissionTest, ImageShapeMustBeTheDataSets) {
  v1::JobSpec j = JobWithDefaults(*BuiltinJob("cnn_small"));
  // 784 elements, so the model builds, but not Fashion-MNIST's image.
  j.mutable_model()->mutable_input_shape()->set_height(14);
  j.mutable_model()->mutable_input_shape()->set_width(56);
  ExpectRejected(j, "model.input_shape = 1x14x56 but Fashion-MNIST images are 1x28x28");

  j = JobWithDefaults(*BuiltinJob("cnn_small"));
  j.mutable_model()->mutable_input_shape()->set_channels(3);
  ExpectRejected(j, "input_dim is 784");

  j = JobWithDefaults(*BuiltinJob("cnn_small"));
  j.mutable_model()->clear_input_shape();
  ExpectRejected(j, "input_shape is unset");
}

TEST(ValidateSubmissionTest, EachBadFieldIsNamed) {
  v1::JobSpec j = Mlp();
  j.mutable_model()->mutable_layers(1)->set_type(static_cast<v1::LayerSpec::Type>(99));
  ExpectRejected(j, "layer 1");

  j = Mlp();
  j.mutable_model()->mutable_layers(2)->set_units(11);
  ExpectRejected(j, "units = 11");

  j = Mlp();
  j.mutable_model()->set_input_dim(100);
  ExpectRejected(j, "input_dim = 100");

  j = Mlp();
  j.set_micro_batches(-2);
  ExpectRejected(j, "micro_batches = -2");

  j = Mlp();
  j.set_towers(3);
  j.add_tower_devices("GPU:0");
  j.add_tower_devices("GPU:1");
  ExpectRejected(j, "towers = 3 but tower_devices names 2 devices");

  j = Mlp();
  j.set_global_batch_size(-5);
  ExpectRejected(j, "global_batch_size = -5");

  j = Mlp();
  j.mutable_optimizer()->set_type(static_cast<v1::OptimizerSpec::Type>(9));
  ExpectRejected(j, "optimizer.type");

  j = Mlp();
  j.mutable_optimizer()->set_weight_decay(-1);
  ExpectRejected(j, "weight_decay");

  j = Mlp();
  j.mutable_data()->set_dir("/no/such/dir");
  ExpectRejected(j, "data.dir = \"/no/such/dir\": Fashion-MNIST: neither /no/such/dir/train-images");

  j = Mlp();
  j.mutable_checkpoint()->set_every_steps(-3);
  ExpectRejected(j, "checkpoint.every_steps = -3");

  j = Mlp();
  j.set_replicas_to_aggregate(3);
  ExpectRejected(j, "replicas_to_aggregate = 3");

  j = JobWithDefaults(*BuiltinJob("dense_stack"));
  j.mutable_data()->set_ones_target_dim(7);
  ExpectRejected(j, "ones_target_dim = 7");
}

// An mlp for CIFAR-10 reading `dir`.
v1::JobSpec CifarMlp(const std::string& dir) {
  v1::JobSpec j = *BuiltinJob("mlp");
  j.mutable_model()->set_input_dim(3072);
  j.mutable_data()->set_source(v1::DataSpec::CIFAR10);
  j.mutable_data()->set_dir(dir);
  return j;
}

TEST(ValidateSubmissionTest, Cifar10) {
  // The submit-time check only looks for the files; their contents are the
  // worker's to check when it loads them.
  const std::string dir = testing::TempDir() + "/cifar";
  ::mkdir(dir.c_str(), 0755);
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                           "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"}) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << name;
    std::fclose(f);
  }
  const v1::JobSpec ok = JobWithDefaults(CifarMlp(dir));
  EXPECT_TRUE(ValidateSubmission(ok, 2).ok()) << ValidateSubmission(ok, 2);

  ExpectRejected(CifarMlp(""), "data.dir is required for CIFAR10");

  ExpectRejected(CifarMlp("/no/such/dir"),
                 "data.dir = \"/no/such/dir\": CIFAR-10: /no/such/dir/data_batch_1.bin "
                 "does not exist");

  v1::JobSpec j = CifarMlp(dir);
  j.mutable_model()->set_input_dim(784);
  ExpectRejected(j, "input_dim = 784 but CIFAR-10 examples have 3072 features (3x32x32)");

  j = CifarMlp(dir);
  j.mutable_model()->mutable_layers(2)->set_units(11);
  ExpectRejected(j, "but CIFAR-10 has 10 classes");

  std::remove((dir + "/test_batch.bin").c_str());
  ExpectRejected(CifarMlp(dir), dir + "/test_batch.bin does not exist");
}

TEST(ValidJobIdTest, Names) {
  EXPECT_TRUE(ValidJobId("mnist-2.run_1"));
  EXPECT_FALSE(ValidJobId(""));
  EXPECT_FALSE(ValidJobId(".hidden"));
  EXPECT_FALSE(ValidJobId("a/b"));
  EXPECT_FALSE(ValidJobId(std::string(65, 'a')));
}

// Issue 15: the dirs a spec names are resolved under the chief's roots.
TEST(ConfineJobPathsTest, RelativeDirsGoUnderTheStateDirAndOutsideOnesAreRefused) {
  const std::string tmp = std::string(getenv("TEST_TMPDIR"));
  auto state = common::PathRoots::Create("--state_dir", {tmp + "/state"});
  auto data = common::PathRoots::Create("--data_root", {"/usr/share/datasets", tmp + "/state"});
  ASSERT_TRUE(state.ok() && data.ok());
  v1::JobSpec j = Mlp();
  j.mutable_checkpoint()->set_dir("mine/ckpt/");
  j.set_tensorboard_dir(tmp + "/state/./tb");
  ASSERT_TRUE(ConfineJobPaths(*state, *data, &j).ok());
  EXPECT_EQ(j.checkpoint().dir(), common::AbsoluteNormalPath(tmp + "/state/mine/ckpt"));
  EXPECT_EQ(j.tensorboard_dir(), common::AbsoluteNormalPath(tmp + "/state/tb"));
  EXPECT_EQ(j.data().dir(), "/usr/share/datasets/fashion-mnist");  // the default, inside

  // Empty dirs stay empty: the store fills in its defaults.
  v1::JobSpec e = Mlp();
  e.mutable_checkpoint()->clear_dir();
  ASSERT_TRUE(ConfineJobPaths(*state, *data, &e).ok());
  EXPECT_TRUE(e.checkpoint().dir().empty());

  struct Case {
    std::function<void(v1::JobSpec&)> set;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](v1::JobSpec& s) { s.mutable_checkpoint()->set_dir("/etc/x"); },
       "job spec: checkpoint.dir \"/etc/x\" is outside --state_dir"},
      {[](v1::JobSpec& s) { s.mutable_checkpoint()->set_dir("../../y"); },
       "job spec: checkpoint.dir \"../../y\" (it resolves to \""},
      {[](v1::JobSpec& s) { s.set_tensorboard_dir("/tmp"); },
       "job spec: tensorboard_dir \"/tmp\" is outside --state_dir"},
      {[](v1::JobSpec& s) { s.mutable_data()->set_dir("/etc"); },
       "job spec: data.dir \"/etc\" is outside --data_root \"/usr/share/datasets\""},
  };
  for (const Case& c : cases) {
    v1::JobSpec bad = Mlp();
    c.set(bad);
    absl::Status st = ConfineJobPaths(*state, *data, &bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(c.want), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("is outside --"), std::string::npos) << st.message();
  }
  // A synthetic data set names no files: its dir is not looked at.
  v1::JobSpec ones = Mlp();
  ones.mutable_data()->set_source(v1::DataSpec::ONES);
  ones.mutable_data()->set_dir("/etc");
  EXPECT_TRUE(ConfineJobPaths(*state, *data, &ones).ok());
}

}  // namespace
}  // namespace towerps::worker
