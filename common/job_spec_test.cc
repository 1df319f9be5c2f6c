// The job spec parser: JSON and text format, empty input refused as empty,
// and the file form of a job (JobForSubmitFile).
#include "common/job_spec.h"

#include <cmath>
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

// Issue 16: gradient compression is off unless asked for; its defaults
// fill in only when it is on, so jobs without it print as before.
TEST(CompressionTest, OffByDefaultAndDefaultsFillOnlyWhenOn) {
  const v1::JobSpec plain = JobWithDefaults(*BuiltinJob("mlp"));
  EXPECT_FALSE(plain.has_compression());
  EXPECT_EQ(plain.compression().type(), v1::GradientCompression::NONE);

  v1::JobSpec job = *BuiltinJob("mlp");
  job.mutable_compression()->set_type(v1::GradientCompression::TOPK);
  v1::JobSpec full = JobWithDefaults(job);
  EXPECT_EQ(full.compression().ratio(), kDefaultTopKRatio);
  EXPECT_TRUE(full.compression().has_error_feedback());
  EXPECT_TRUE(full.compression().error_feedback());
  EXPECT_TRUE(ValidateJob(full, 2).ok());

  job.mutable_compression()->set_type(v1::GradientCompression::FP16);
  job.mutable_compression()->set_error_feedback(false);
  full = JobWithDefaults(job);
  EXPECT_EQ(full.compression().ratio(), 0);
  EXPECT_FALSE(full.compression().error_feedback());  // as given
  EXPECT_TRUE(ValidateJob(full, 2).ok());
}

TEST(CompressionTest, ParsesFromJsonAndTextFormat) {
  auto json = ParseJobSpec(
      R"({"model": {"inputDim": 4}, "compression": {"type": "TOPK", "ratio": 0.05,)"
      R"( "errorFeedback": false}})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->compression().type(), v1::GradientCompression::TOPK);
  EXPECT_EQ(json->compression().ratio(), 0.05);
  EXPECT_TRUE(json->compression().has_error_feedback());
  EXPECT_FALSE(json->compression().error_feedback());
  auto text = ParseJobSpec("model { input_dim: 4 } compression { type: BF16 }");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->compression().type(), v1::GradientCompression::BF16);
  EXPECT_FALSE(text->compression().has_error_feedback());
}

TEST(CompressionTest, BadSettingsAreRefusedNamingTheFieldAndValue) {
  const v1::JobSpec ok = JobWithDefaults(*BuiltinJob("mlp"));
  struct Case {
    v1::GradientCompression::Type type;
    double ratio;
    int error_feedback;  // -1: unset
    const char* message;
  };
  const Case cases[] = {
      {v1::GradientCompression::TOPK, 1.5, -1,
       "job spec: compression.ratio = 1.5 (want a fraction in (0, 1], or 0 for the default of "
       "0.01)"},
      {v1::GradientCompression::TOPK, -0.1, -1, "job spec: compression.ratio = -0.1 (want"},
      {v1::GradientCompression::TOPK, std::nan(""), -1, "job spec: compression.ratio = nan"},
      {v1::GradientCompression::FP16, 0.1, -1,
       "job spec: compression.ratio = 0.1 is for TOPK only (type is FP16)"},
      {v1::GradientCompression::NONE, 0.5, -1,
       "job spec: compression.ratio = 0.5 is for TOPK only (type is NONE)"},
      {v1::GradientCompression::NONE, 0, 1,
       "job spec: compression.error_feedback is set but type is NONE"},
      {static_cast<v1::GradientCompression::Type>(9), 0, -1,
       "job spec: compression.type = 9 (want NONE, FP16, BF16 or TOPK)"},
  };
  for (const Case& c : cases) {
    v1::JobSpec job = ok;
    job.mutable_compression()->set_type(c.type);
    job.mutable_compression()->set_ratio(c.ratio);
    if (c.error_feedback >= 0) job.mutable_compression()->set_error_feedback(c.error_feedback);
    const absl::Status s = ValidateJob(job, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(absl::StartsWith(s.message(), c.message)) << s;
  }
  v1::JobSpec whole = ok;
  whole.mutable_compression()->set_type(v1::GradientCompression::TOPK);
  whole.mutable_compression()->set_ratio(1.0);
  EXPECT_TRUE(ValidateJob(whole, 2).ok());
}

TEST(CompressionTest, FlagNamesTheTypeAndRatio) {
  auto none = ParseCompressionFlag("none");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->type(), v1::GradientCompression::NONE);
  EXPECT_EQ(ParseCompressionFlag("fp16")->type(), v1::GradientCompression::FP16);
  EXPECT_EQ(ParseCompressionFlag("bf16")->type(), v1::GradientCompression::BF16);
  auto topk = ParseCompressionFlag("topk");
  ASSERT_TRUE(topk.ok());
  EXPECT_EQ(topk->type(), v1::GradientCompression::TOPK);
  EXPECT_EQ(topk->ratio(), 0);  // the default, filled by JobWithDefaults
  auto ratio = ParseCompressionFlag("topk:0.1");
  ASSERT_TRUE(ratio.ok());
  EXPECT_EQ(ratio->ratio(), 0.1);
  EXPECT_EQ(ParseCompressionFlag("topk:1")->ratio(), 1.0);
  for (const std::string bad : {"", "FP16", "int8", "topk:", "topk:0", "topk:1.5", "topk:-1",
                                "topk:x", "topk:nan", "topk:0.1:2"}) {
    auto c = ParseCompressionFlag(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--compression must be")) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), "got \"" + bad + "\"")) << c.status();
  }
}

}  // namespace
}  // namespace towerps::worker
