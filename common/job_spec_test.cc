// The job spec parser: JSON and text format, empty input refused as empty,
// and the file form of a job (JobForSubmitFile).
#include "common/job_spec.h"

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

std::string WriteTmp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(ParseJobSpecTest, ReadsJsonAndTextFormat) {
  auto json = ParseJobSpec(R"( {"jobId": "j", "model": {"inputDim": 4}, "max_steps": 3})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->job_id(), "j");
  EXPECT_EQ(json->model().input_dim(), 4);
  EXPECT_EQ(json->max_steps(), 3);
  auto text = ParseJobSpec("job_id: \"t\" model { input_dim: 5 }");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->model().input_dim(), 5);
}

// Found by tests/fuzz:job_spec_fuzzer: text format takes any bytes in a
// string, which proto3 (the chief's parser, the JSON printer) refuses.
TEST(ParseJobSpecTest, StringsThatAreNotUtf8AreRefusedNamingTheField) {
  auto text = ParseJobSpec("data { dir: \"/usr/\\377x\" }");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "job spec: data.dir is not valid UTF-8");
  auto layer = ParseJobSpec("model { layers { name: \"a\" } layers { name: \"\\300\\200\" } }");
  EXPECT_EQ(layer.status().message(), "job spec: model.layers[1].name is not valid UTF-8");
  auto ok = ParseJobSpec("data { dir: \"/d\\303\\251j\\340\\244\\271\\360\\237\\230\\200\" }");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data().dir(), "/d\u00e9j\u0939\U0001F600");
}

// Found by tests/fuzz:job_spec_fuzzer ("#"): such a spec printed back is
// empty text, which is refused.
TEST(ParseJobSpecTest, SpecSettingNoFieldIsRefused) {
  for (const char* text : {"# only a comment\n", "{}", " { } ", "peer_timeout_s: -0",
                           "model {}", "{\"peerTimeoutS\": -0}"}) {
    auto job = ParseJobSpec(text);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(job.status().message(), "job spec sets no field") << text;
  }
}

TEST(ParseJobSpecTest, EmptyTextIsRefusedAsEmpty) {
  for (const std::string text : {"", " \n\t\r\n"}) {
    auto job = ParseJobSpec(text);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(job.status().message(), "job spec is empty");
  }
}

TEST(ParseJobSpecTest, SyntaxErrorsNameTheFormatAndPlace) {
  auto json = ParseJobSpec(R"({"modle": {}})");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(json.status().message(), "JSON")) << json.status();
  auto text = ParseJobSpec("model { input_dim: }");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(text.status().message(), "line 1:")) << text.status();
}

TEST(ReadJobSpecFileTest, EmptyFileIsNamedAndCalledEmpty) {
  for (const std::string text : {"", "\n  \n"}) {
    const std::string path = WriteTmp("empty.json", text);
    auto job = ReadJobSpecFile(path);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(job.status().message(), absl::StrCat("job spec file \"", path, "\" is empty"));
  }
}

TEST(ReadJobSpecFileTest, MissingFileIsNotFoundAndBadOneNamed) {
  const std::string absent = absl::StrCat(getenv("TEST_TMPDIR"), "/absent.json");
  EXPECT_EQ(ReadJobSpecFile(absent).status().code(), absl::StatusCode::kNotFound);
  const std::string bad = WriteTmp("bad.txtpb", "modle {}");
  auto job = ReadJobSpecFile(bad);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(job.status().message(), bad + ": ")) << job.status();
  auto ok = ReadJobSpecFile(WriteTmp("ok.txtpb", "model { input_dim: 3 }"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->model().input_dim(), 3);
}

TEST(JobForSubmitFileTest, FillsDefaultsAndDropsTheIdAndTheNameThatRepeatsIt) {
  auto mlp = BuiltinJob("mlp");
  ASSERT_TRUE(mlp.ok());
  const v1::JobSpec file = JobForSubmitFile(*mlp, /*keep_job_id=*/false);
  EXPECT_EQ(file.job_id(), "");
  EXPECT_EQ(file.model().name(), "");
  EXPECT_EQ(file.mode(), v1::SYNC);
  EXPECT_EQ(file.peer_timeout_s(), kDefaultPeerTimeoutS);
  EXPECT_EQ(file.global_batch_size(), 256);

  v1::JobSpec named = *mlp;
  named.set_job_id("mine");
  const v1::JobSpec kept = JobForSubmitFile(named, /*keep_job_id=*/true);
  EXPECT_EQ(kept.job_id(), "mine");
  EXPECT_EQ(kept.model().name(), "mlp");
}

TEST(ValidateJobTest, AnyWorkerCountLeavesReplicasUnbounded) {
  v1::JobSpec job = JobWithDefaults(*BuiltinJob("mlp"));
  job.set_replicas_to_aggregate(3);
  EXPECT_EQ(ValidateJob(job, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateJob(job, kAnyWorkerCount).ok());
}

// Issue 15 (limits): sizes are bounded, each refusal names the field and limit.
TEST(ValidateJobTest, SizesAreBoundedWithTheFieldNamed) {
  const v1::JobSpec ok = JobWithDefaults(*BuiltinJob("mlp"));
  ASSERT_TRUE(ValidateJob(ok, 2).ok());
  v1::JobSpec job = ok;
  job.set_global_batch_size(kMaxGlobalBatchSize);
  EXPECT_TRUE(ValidateJob(job, 2).ok());
  job.set_global_batch_size(kMaxGlobalBatchSize + 1);
  EXPECT_EQ(ValidateJob(job, 2).message(),
            "job spec: global_batch_size = 1048577 (limit 1048576)");
  job = ok;
  job.set_epochs(2000000000);
  EXPECT_EQ(ValidateJob(job, 2).message(), "job spec: epochs = 2000000000 (limit 100000)");
  job = ok;
  job.set_towers(100000);
  EXPECT_EQ(ValidateJob(job, 2).message(), "job spec: towers = 100000 (limit 256)");
  job = ok;
  job.set_micro_batches(1 << 20);
  EXPECT_EQ(ValidateJob(job, 2).message(), "job spec: micro_batches = 1048576 (limit 4096)");
}

}  // namespace
}  // namespace towerps::worker
