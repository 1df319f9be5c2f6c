#include "common/cluster_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

void ExpectRejected(const absl::StatusOr<ClusterSpec>& s,
                    const std::string& fragment) {
  ASSERT_FALSE(s.ok()) << "accepted, wanted an error containing: " << fragment;
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(fragment), std::string::npos)
      << "message was: " << s.status().message();
}

TEST(ClusterSpecTest, FlagsParse) {
  auto s = ClusterSpecFromFlags("h1:2222,h2:2222", "h3:2222,h4:2222", "worker", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ps.size(), 2u);
  EXPECT_EQ(s->worker[1], "h4:2222");
  EXPECT_FALSE(s->is_chief());
  EXPECT_EQ(s->self_address(), "h4:2222");
  EXPECT_EQ(s->TaskName(), "/job:worker/replica:0/task:1");
  EXPECT_TRUE(ClusterSpecFromFlags("a:1", "b:2", "worker", 0)->is_chief());
  EXPECT_TRUE(ClusterSpecFromFlags("[::1]:5", "b:2", "ps", 0).ok());
}

TEST(ClusterSpecTest, BadFlagsAreRejectedWithTheirProblemNamed) {
  ExpectRejected(ClusterSpecFromFlags("a:1", "b:2", "", 0), "missing job name");
  ExpectRejected(ClusterSpecFromFlags("a:1", "b:2", "chef", 0), "unknown job name \"chef\"");
  ExpectRejected(ClusterSpecFromFlags("", "b:2", "worker", 0), "no ps tasks");
  ExpectRejected(ClusterSpecFromFlags("a:1", "", "ps", 0), "no worker tasks");
  ExpectRejected(ClusterSpecFromFlags("a:1", "b:2", "worker", 1), "task index 1 is out of range");
  ExpectRejected(ClusterSpecFromFlags("a:1", "b:2", "ps", -1), "task index -1 is out of range");
  ExpectRejected(ClusterSpecFromFlags("a", "b:2", "ps", 0), "malformed address \"a\"");
  ExpectRejected(ClusterSpecFromFlags("a:x", "b:2", "ps", 0), "invalid port \"x\"");
  ExpectRejected(ClusterSpecFromFlags("a:70000", "b:2", "ps", 0), "invalid port");
  ExpectRejected(ClusterSpecFromFlags(":1", "b:2", "ps", 0), "has no host");
  ExpectRejected(ClusterSpecFromFlags("a:1,,c:3", "b:2", "ps", 0), "empty entry");
  ExpectRejected(ClusterSpecFromFlags("a:1", "a:1", "ps", 0), "duplicate address \"a:1\"");
}

TEST(ClusterSpecTest, WorkersOnSameHostCountsWorkersByHostWithLoopbackAsOne) {
  auto spec = ClusterSpecFromFlags("127.0.0.1:1,10.0.0.9:2",
                                   "localhost:3,127.0.0.2:4,10.0.0.9:5,[::1]:6,w7:7", "worker", 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->WorkersOnSameHost(), 3);  // localhost, 127.0.0.2, ::1
  spec->task_index = 4;
  EXPECT_EQ(spec->WorkersOnSameHost(), 1);  // w7 alone
  spec->job_name = "ps";
  spec->task_index = 1;
  EXPECT_EQ(spec->WorkersOnSameHost(), 1);  // a ps beside worker 10.0.0.9:5
}

TEST(ClusterSpecTest, PsOnSameHostCountsServersByHostWithLoopbackAsOne) {
  auto spec = ClusterSpecFromFlags("127.0.0.1:1,10.0.0.9:2,localhost:3,[::1]:4",
                                   "127.0.0.5:5,10.0.0.9:6,w7:7", "worker", 0);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->PsOnSameHost(), 3);  // 127.0.0.1, localhost, ::1
  spec->task_index = 1;
  EXPECT_EQ(spec->PsOnSameHost(), 1);  // 10.0.0.9:2
  spec->task_index = 2;
  EXPECT_EQ(spec->PsOnSameHost(), 0);  // w7 has no server
  spec->job_name = "ps";
  spec->task_index = 1;
  EXPECT_EQ(spec->PsOnSameHost(), 1);  // itself
}

TEST(ClusterSpecTest, TfConfigParses) {
  auto s = ClusterSpecFromTfConfig(
      R"({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"]},
          "task": {"type": "worker", "index": 1}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->job_name, "worker");
  EXPECT_EQ(s->task_index, 1);
  EXPECT_EQ(s->worker.size(), 2u);
}

TEST(ClusterSpecTest, TfConfigChiefBecomesWorkerZero) {
  const std::string cluster =
      R"("cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w0:1"]})";
  auto chief = ClusterSpecFromTfConfig("{" + cluster + R"(, "task": {"type": "chief", "index": 0}})");
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_TRUE(chief->is_chief());
  EXPECT_EQ(chief->self_address(), "c:1");
  auto w = ClusterSpecFromTfConfig("{" + cluster + R"(, "task": {"type": "worker", "index": 0}})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->task_index, 1);
  EXPECT_EQ(w->self_address(), "w0:1");
}

TEST(ClusterSpecTest, BadTfConfigIsRejected) {
  ExpectRejected(ClusterSpecFromTfConfig("{not json"), "not valid JSON");
  ExpectRejected(ClusterSpecFromTfConfig(R"({"task": {"type": "ps"}})"), "no \"cluster\"");
  ExpectRejected(ClusterSpecFromTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}})"),
                 "no \"task\"");
  ExpectRejected(ClusterSpecFromTfConfig(
                     R"({"cluster": {"ps": "a:1", "worker": ["b:1"]}, "task": {"type": "ps"}})"),
                 "cluster.ps must be a list");
  ExpectRejected(ClusterSpecFromTfConfig(
                     R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "ps", "index": 3}})"),
                 "out of range");
  ExpectRejected(ClusterSpecFromTfConfig(
                     R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"], "gpu": []}, "task": {"type": "ps"}})"),
                 "unknown job \"gpu\"");
}

TEST(ClusterSpecTest, FlagsWinOverTfConfig) {
  const std::string tf = R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps"}})";
  auto from_env = ResolveClusterSpec("", "", "", 0, tf);
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->job_name, "ps");
  auto from_flags = ResolveClusterSpec("a:1", "b:1", "worker", 0, tf);
  ASSERT_TRUE(from_flags.ok());
  EXPECT_EQ(from_flags->job_name, "worker");
  ExpectRejected(ResolveClusterSpec("", "", "", 0, ""), "missing job name");
}

TEST(ClusterSpecTest, RoleMustMatchTheBinary) {
  EXPECT_TRUE(ClusterSpecForRole("ps", "a:1", "b:1", "ps", 0, "").ok());
  ExpectRejected(ClusterSpecForRole("ps", "a:1", "b:1", "worker", 0, ""),
                 "this binary runs ps tasks, but the job name is \"worker\"");
}

}  // namespace
}  // namespace towerps::common

namespace towerps::common {
namespace {

// Found by tests/fuzz:cluster_spec_fuzzer: an index such as 1e53 was
// converted to int before its range was checked (undefined behaviour).
TEST(ClusterSpecTest, TfConfigIndexOutOfIntRangeIsRefused) {
  for (const char* index : {"1e53", "-1e53", "2147483648", "-1", "1.5", "\"0\""}) {
    auto s = ClusterSpecFromTfConfig(
        absl::StrCat(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "ps", "index": )",
                     index, "}}"));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << index;
    EXPECT_NE(s.status().message().find("task.index must be an integer"), std::string::npos)
        << s.status();
  }
}

}  // namespace
}  // namespace towerps::common
