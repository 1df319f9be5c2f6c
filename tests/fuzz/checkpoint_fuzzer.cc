// Fuzzes checkpoint shards (common/storage/checkpoint): the input is a shard
// file, read by ReadShard and VerifyShard.
// Invariants: a refusal is DataLoss with a message naming the file; both
// readers agree; a shard that reads back is written again by WriteShard and
// reads back the same (header, definitions, values bit for bit, slots).
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "common/storage/checkpoint.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using towerps::common::ShardState;

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void CheckSame(const ShardState& a, const ShardState& b) {
  FUZZ_CHECK(a.job_id == b.job_id && a.ps_task == b.ps_task && a.num_ps == b.num_ps &&
                 a.global_step == b.global_step && a.worker_completed == b.worker_completed,
             "header changed");
  FUZZ_CHECK(a.vars.size() == b.vars.size(), "%zu vs %zu variables", a.vars.size(), b.vars.size());
  for (size_t i = 0; i < a.vars.size(); ++i) {
    const auto& x = a.vars[i];
    const auto& y = b.vars[i];
    FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(x.def, y.def), "def %zu", i);
    FUZZ_CHECK(x.updates == y.updates && SameFloats(x.value, y.value), "variable %zu", i);
    FUZZ_CHECK(x.slots.size() == y.slots.size(), "slots of %zu", i);
    for (size_t k = 0; k < x.slots.size(); ++k) {
      FUZZ_CHECK(x.slots[k].name == y.slots[k].name && SameFloats(x.slots[k].values, y.slots[k].values),
                 "slot %zu of %zu", k, i);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& tmp = towerps::fuzz::FuzzTempDir();
  const std::string path = tmp + "/in/ckpt-0000000001/shard-0-of-1";
  towerps::fuzz::WriteFuzzFile(path, data, size);

  auto read = towerps::common::ReadShard(path);
  auto verified = towerps::common::VerifyShard(path);
  FUZZ_CHECK(read.ok() == verified.ok(), "ReadShard %s but VerifyShard %s",
             read.status().ToString().c_str(), verified.status().ToString().c_str());
  if (!read.ok()) {
    for (const absl::Status& s : {read.status(), verified.status()}) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss, "%s", s.ToString().c_str());
      FUZZ_CHECK(s.message().find(path) != std::string::npos, "not naming the file: %s",
                 s.ToString().c_str());
    }
    return 0;
  }
  FUZZ_CHECK(verified->vars.empty() && verified->job_id == read->job_id &&
                 verified->global_step == read->global_step && verified->num_ps == read->num_ps,
             "VerifyShard's header differs from ReadShard's");

  // What was read must be writable (it passed the same rules) and read back.
  auto written = towerps::common::WriteShard(tmp + "/out/ckpt-0000000001", *read);
  FUZZ_CHECK(written.ok(), "a shard that reads back cannot be written: %s",
             written.status().ToString().c_str());
  auto again = towerps::common::ReadShard(*written);
  FUZZ_CHECK(again.ok(), "a written shard does not read back: %s",
             again.status().ToString().c_str());
  CheckSame(*read, *again);
  return 0;
}
