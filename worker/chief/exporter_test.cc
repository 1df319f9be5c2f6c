// Export refuses a job without a usable checkpoint, naming it.
#include "worker/chief/exporter.h"

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

TEST(ExporterTest, NoCheckpointIsFailedPrecondition) {
  v1::JobRecord record;
  record.set_job_id("j");
  record.set_checkpoint_dir(std::string(getenv("TEST_TMPDIR")) + "/none");
  int chunks = 0;
  absl::Status st = ExportJob(record, 1 << 20, [&](const v1::ExportChunk&) {
    ++chunks;
    return true;
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("job \"j\" has no usable checkpoint to export"), std::string::npos)
      << st;
  EXPECT_EQ(chunks, 0);
}

}  // namespace
}  // namespace towerps::worker
