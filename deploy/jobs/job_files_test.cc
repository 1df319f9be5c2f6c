// deploy/jobs/NAME.json must be the built-in job NAME as `worker
// --print_job_spec --model=NAME` prints it (JobForSubmitFile), so that a file
// cannot drift from the model it is named after. Regenerate a file with
//   bazel-bin/worker/worker --model=NAME --print_job_spec > deploy/jobs/NAME.json
// (resnet_cifar: add --data_dir=/path/to/cifar-10-batches-bin).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"

namespace towerps::worker {
namespace {

// The placeholder in resnet_cifar.json: CIFAR-10 is not installed here.
constexpr char kCifarPlaceholderDir[] = "/path/to/cifar-10-batches-bin";

class JobFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(JobFileTest, EqualsItsBuiltin) {
  const std::string& name = GetParam();
  auto file = ReadJobSpecFile(absl::StrCat("deploy/jobs/", name, ".json"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto builtin = BuiltinJob(name);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  if (name == "resnet_cifar") builtin->mutable_data()->set_dir(kCifarPlaceholderDir);
  const v1::JobSpec want = JobForSubmitFile(*builtin, /*keep_job_id=*/false);

  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(want, *file))
      << "deploy/jobs/" << name << ".json differs from BuiltinJob(\"" << name
      << "\") (first the built-in's value, then the file's):\n"
      << diff;
  EXPECT_EQ(ValidateJob(*file, kAnyWorkerCount), absl::OkStatus());
}

INSTANTIATE_TEST_SUITE_P(BuiltinModels, JobFileTest,
                         ::testing::Values("mlp", "dense_stack", "cnn_small", "lenet", "resnet18",
                                           "resnet_cifar"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace towerps::worker
