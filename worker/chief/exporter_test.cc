// Export refuses a job without a usable checkpoint, naming it, and
// reassembles variables split across servers.
#include "worker/chief/exporter.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/storage/checkpoint.h"
#include "gtest/gtest.h"
#include "worker/train/job_runner.h"
#include "worker/train/placement.h"

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

// A job placed PARTITIONED (the default) on 2 servers: each shard holds its
// server's parts, under their part names (as the servers register them).
// Export gives every variable whole, under its own name and shape, with its
// values in order; a missing part is DataLoss naming it.
TEST(ExporterTest, ReassemblesPartitionedVariablesFromTheShards) {
  auto job = BuiltinJob("mlp");
  ASSERT_TRUE(job.ok()) << job.status();
  job->set_job_id("pj");
  auto defs = JobVariables(*job);
  ASSERT_TRUE(defs.ok()) << defs.status();
  auto plan = PlanPlacement(*defs, 2, job->placement());
  ASSERT_TRUE(plan.ok()) << plan.status();
  int split = 0;
  for (const auto& part : plan->parts) split += part.num_parts > 1;
  ASSERT_GE(split, 2) << "the MLP's first kernel is split over both servers";
  // Whole values: element k of variable i is i * 1e6 + k.
  std::vector<std::vector<float>> whole;
  for (size_t i = 0; i < defs->size(); ++i) {
    whole.emplace_back(VariableBytes((*defs)[i]) / 4);
    for (size_t k = 0; k < whole[i].size(); ++k) whole[i][k] = i * 1e6f + k;
  }
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/pj-checkpoints");
  const std::string name = common::CheckpointDirName(1);
  auto write_shards = [&](int drop_server) {
    for (int s = 0; s < 2; ++s) {
      common::ShardState shard;
      shard.job_id = "pj";
      shard.ps_task = s;
      shard.num_ps = 2;
      shard.global_step = 1;
      for (const auto& part : plan->PartsOn(s)) {
        if (s == drop_server && part.num_parts > 1) continue;
        common::VariableState v;
        v.def = PartDef((*defs)[part.var], part);
        v.value.assign(whole[part.var].begin() + part.offset,
                       whole[part.var].begin() + part.offset + part.count);
        shard.vars.push_back(std::move(v));
      }
      ASSERT_TRUE(common::WriteShard(absl::StrCat(dir, "/", name), shard).ok());
    }
  };
  write_shards(/*drop_server=*/-1);
  common::ManifestEntry entry;
  entry.step = 1;
  entry.dir_name = name;
  entry.num_ps = 2;
  ASSERT_TRUE(common::AddToManifest(dir, entry, /*keep=*/1).ok());

  v1::JobRecord record;
  record.set_job_id("pj");
  record.set_checkpoint_dir(dir);
  *record.mutable_spec() = *job;
  std::map<std::string, std::vector<float>> exported;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string current;
  auto collect = [&](const v1::ExportChunk& c) {
    if (c.has_def()) {
      current = c.def().name();
      shapes[current].assign(c.def().shape().begin(), c.def().shape().end());
    }
    auto& v = exported[current];
    EXPECT_EQ(static_cast<int64_t>(v.size()), c.offset()) << current;
    const size_t n = c.data().size() / 4;
    v.resize(v.size() + n);
    std::memcpy(v.data() + v.size() - n, c.data().data(), c.data().size());
    return true;
  };
  absl::Status st = ExportJob(record, 4096, collect);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(exported.size(), defs->size());
  for (size_t i = 0; i < defs->size(); ++i) {
    const v1::VariableDef& d = (*defs)[i];
    EXPECT_EQ(shapes[d.name()], std::vector<int64_t>(d.shape().begin(), d.shape().end()));
    EXPECT_EQ(exported[d.name()], whole[i]) << d.name();
  }

  // Server 1's shard without its split parts: the export names what is missing.
  write_shards(/*drop_server=*/1);
  exported.clear();
  st = ExportJob(record, 4096, collect);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("/part-1-of-2\""), std::string::npos) << st;
}

}  // namespace
}  // namespace towerps::worker
