#include "common/storage/checkpoint.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

// A fresh directory under TEST_TMPDIR for the running test.
std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", info->test_suite_name(),
                                       ".", info->name());
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

v1::VariableDef Def(const std::string& name, std::vector<int64_t> shape) {
  v1::VariableDef def;
  def.set_name(name);
  for (int64_t d : shape) def.add_shape(d);
  def.set_dtype(v1::DT_FLOAT32);
  return def;
}

std::vector<float> Ramp(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

// Three variables: a 7x5 kernel with Adam slots (values that must survive
// bit for bit included), a bias with a momentum slot, a scalar without slots.
ShardState MakeState(int task = 1, int num_ps = 3, int64_t step = 1234) {
  ShardState s;
  s.job_id = "job-42";
  s.ps_task = task;
  s.num_ps = num_ps;
  s.global_step = step;
  s.worker_completed = {17, 0, 123456789012LL};

  VariableState kernel;
  kernel.def = Def("dense/kernel", {7, 5});
  kernel.value = Ramp(35, -3.0f);
  kernel.value[0] = -0.0f;
  kernel.value[1] = std::numeric_limits<float>::quiet_NaN();
  kernel.value[2] = std::numeric_limits<float>::infinity();
  kernel.value[3] = std::numeric_limits<float>::denorm_min();
  kernel.value[34] = 0xff;  // 0x437f0000: a byte pattern that stands out in a dump.
  kernel.updates = 99;
  kernel.slots = {{"m", Ramp(35, 1.0f)}, {"v", Ramp(35, 100.0f)}};
  kernel.def.mutable_initializer()->set_type(v1::Initializer::GLOROT_UNIFORM);

  VariableState bias;
  bias.def = Def("dense/bias", {5});
  bias.value = Ramp(5, 7.0f);
  bias.updates = 98;
  bias.slots = {{"velocity", Ramp(5, -1.0f)}};

  VariableState scalar;
  scalar.def = Def("scale", {});
  scalar.value = {2.5f};

  s.vars = {kernel, bias, scalar};
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector, even for 0 bytes.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

void ExpectSameState(const ShardState& a, const ShardState& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.ps_task, b.ps_task);
  EXPECT_EQ(a.num_ps, b.num_ps);
  EXPECT_EQ(a.global_step, b.global_step);
  EXPECT_EQ(a.worker_completed, b.worker_completed);
  ASSERT_EQ(a.vars.size(), b.vars.size());
  for (size_t i = 0; i < a.vars.size(); ++i) {
    SCOPED_TRACE(a.vars[i].def.name());
    EXPECT_EQ(a.vars[i].def.SerializeAsString(), b.vars[i].def.SerializeAsString());
    EXPECT_TRUE(SameBits(a.vars[i].value, b.vars[i].value));
    EXPECT_EQ(a.vars[i].updates, b.vars[i].updates);
    ASSERT_EQ(a.vars[i].slots.size(), b.vars[i].slots.size());
    for (size_t k = 0; k < a.vars[i].slots.size(); ++k) {
      EXPECT_EQ(a.vars[i].slots[k].name, b.vars[i].slots[k].name);
      EXPECT_TRUE(SameBits(a.vars[i].slots[k].values, b.vars[i].slots[k].values));
    }
  }
}

std::vector<std::string> Records(const std::string& contents) {
  std::vector<std::string> out;
  RecordReader r(contents, "mem");
  while (true) {
    absl::StatusOr<absl::string_view> rec = r.Next();
    if (!rec.ok()) {
      EXPECT_TRUE(absl::IsOutOfRange(rec.status())) << rec.status();
      return out;
    }
    out.emplace_back(*rec);
  }
}

// Byte offsets at which records start, plus the file's size.
std::vector<size_t> RecordBoundaries(const std::string& contents) {
  std::vector<size_t> out = {0};
  RecordReader r(contents, "mem");
  while (r.Next().ok()) out.push_back(static_cast<size_t>(r.offset()));
  return out;
}

void WriteRaw(const std::string& path, const std::string& contents) {
  ASSERT_TRUE(WriteFileAtomically(path, contents).ok());
}

std::string ReadRaw(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

TEST(CheckpointTest, Names) {
  EXPECT_EQ(CheckpointDirName(200), "ckpt-0000000200");
  EXPECT_EQ(CheckpointDirName(0), "ckpt-0000000000");
  EXPECT_EQ(CheckpointDirName(12345678901LL), "ckpt-12345678901");
  EXPECT_EQ(ShardFileName(0, 2), "shard-0-of-2");
  EXPECT_EQ(ShardFileName(11, 12), "shard-11-of-12");
}

TEST(CheckpointTest, ShardRoundTripsWithSplitPayloads) {
  const std::string dir = TestDir();
  const ShardState state = MakeState();
  ShardWriteOptions options;
  options.max_record_bytes = 16;  // 4 floats per payload record.
  absl::StatusOr<std::string> path =
      WriteShard(dir + "/" + CheckpointDirName(1234), state, options);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir + "/ckpt-0000001234/shard-1-of-3");

  absl::StatusOr<ShardState> read = ReadShard(*path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameState(state, *read);

  // The layout: header; per variable its header and ceil(4n / 16) payload
  // records per tensor; footer.
  const std::vector<std::string> recs = Records(ReadRaw(*path));
  const size_t kernel = 9 * 3, bias = 2 * 2, scalar = 1;
  ASSERT_EQ(recs.size(), 1 + 3 + kernel + bias + scalar + 1);
  ckpt::ShardHeader header;
  ASSERT_TRUE(header.ParseFromString(recs[0]));
  EXPECT_EQ(header.format_version(), kShardFormatVersion);
  EXPECT_EQ(header.num_variables(), 3);
  ckpt::VariableHeader vh;
  ASSERT_TRUE(vh.ParseFromString(recs[1]));
  EXPECT_EQ(vh.num_elements(), 35);
  ASSERT_EQ(vh.slots_size(), 2);
  EXPECT_EQ(vh.slots(1).name(), "v");
  // Payload records are the raw little-endian float32 bytes.
  EXPECT_EQ(recs[2].size(), 16u);
  EXPECT_EQ(recs[2].substr(0, 4), std::string("\0\0\0\x80", 4));  // -0.0f
  EXPECT_EQ(recs[10].size(), 12u);  // Elements 32..34.
  EXPECT_EQ(recs[10].substr(8), std::string("\0\0\x7f\x43", 4));  // 255.0f, the 35th
  ckpt::ShardFooter footer;
  ASSERT_TRUE(footer.ParseFromString(recs.back()));
  EXPECT_EQ(footer.num_records(), static_cast<int64_t>(recs.size()) - 1);
  EXPECT_EQ(footer.payload_bytes(), 4 * (35 * 3 + 5 * 2 + 1));
}

TEST(CheckpointTest, AnySplitSizeReadsBack) {
  const std::string dir = TestDir();
  const ShardState state = MakeState(0, 1, 5);
  for (int64_t max_bytes : {4, 7, 8, 20, 139, 140, 141, 1 << 20}) {
    SCOPED_TRACE(max_bytes);
    ShardWriteOptions options;
    options.max_record_bytes = max_bytes;
    absl::StatusOr<std::string> path = WriteShard(dir, state, options);
    ASSERT_TRUE(path.ok()) << path.status();
    absl::StatusOr<ShardState> read = ReadShard(*path);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectSameState(state, *read);
    absl::StatusOr<ShardState> verified = VerifyShard(*path);
    ASSERT_TRUE(verified.ok()) << verified.status();
    EXPECT_TRUE(verified->vars.empty());
    EXPECT_EQ(verified->global_step, 5);
  }
  // The default (64 MiB) keeps each tensor in one record: 1 + 3 * 2 + 2 +
  // 1 + 1 records.
  absl::StatusOr<std::string> path = WriteShard(dir, state);
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(Records(ReadRaw(*path)).size(), 11u);
}

TEST(CheckpointTest, EmptyShardAndEmptyTensorsRoundTrip) {
  const std::string dir = TestDir();
  ShardState state;
  state.job_id = "j";
  absl::StatusOr<std::string> path = WriteShard(dir, state);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<ShardState> read = ReadShard(*path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameState(state, *read);

  VariableState empty;
  empty.def = Def("empty", {0, 3});
  empty.slots = {{"m", {}}};
  state.vars = {empty};
  path = WriteShard(dir, state);
  ASSERT_TRUE(path.ok()) << path.status();
  read = ReadShard(*path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameState(state, *read);
}

// A batch norm statistic (VariableDef.update MOVING_AVERAGE) has a value and
// no slots; its def, with the update rule and decay, comes back as written.
TEST(CheckpointTest, MovingAverageVariableRoundTrips) {
  const std::string dir = TestDir();
  ShardState state;
  state.job_id = "bn";
  VariableState kernel;
  kernel.def = Def("conv/kernel", {2, 2});
  kernel.value = Ramp(4, -1.0f);
  kernel.slots = {{"velocity", Ramp(4, 0.5f)}};
  VariableState mean;
  mean.def = Def("bn/moving_mean", {3});
  mean.def.set_update(v1::VariableDef::MOVING_AVERAGE);
  mean.def.set_moving_average_decay(0.99f);
  mean.value = {0.125f, -3.5f, 1e-20f};
  mean.updates = 7;
  state.vars = {kernel, mean};
  absl::StatusOr<std::string> path = WriteShard(dir, state);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<ShardState> read = ReadShard(*path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameState(state, *read);
  ASSERT_EQ(read->vars.size(), 2u);
  EXPECT_EQ(read->vars[1].def.update(), v1::VariableDef::MOVING_AVERAGE);
  EXPECT_EQ(read->vars[1].def.moving_average_decay(), 0.99f);
  EXPECT_TRUE(read->vars[1].slots.empty());
  EXPECT_EQ(read->vars[0].slots.size(), 1u);
}

TEST(CheckpointTest, EveryFlippedByteIsDataLoss) {
  const std::string dir = TestDir();
  ShardWriteOptions options;
  options.max_record_bytes = 40;
  absl::StatusOr<std::string> good_path = WriteShard(dir, MakeState(), options);
  ASSERT_TRUE(good_path.ok());
  const std::string good = ReadRaw(*good_path);
  ASSERT_GT(good.size(), 500u);
  const std::string bad_path = dir + "/flipped";
  // Every offset: header, variable headers, payloads, footer and framing.
  for (size_t i = 0; i < good.size(); ++i) {
    for (const char mask : {'\x01', '\x80'}) {
      std::string bad = good;
      bad[i] ^= mask;
      WriteRaw(bad_path, bad);
      absl::StatusOr<ShardState> read = ReadShard(bad_path);
      ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
          << "byte " << i << " mask " << int{mask} << ": " << read.status();
      ASSERT_THAT(std::string(read.status().message()), HasSubstr(bad_path));
      ASSERT_EQ(VerifyShard(bad_path).status().code(), absl::StatusCode::kDataLoss);
    }
  }
  // A payload flip names the record's offset and the CRC.
  const std::vector<size_t> bounds = RecordBoundaries(good);
  std::string bad = good;
  bad[bounds[3] + 12] ^= 1;  // First payload record of the kernel.
  WriteRaw(bad_path, bad);
  EXPECT_EQ(ReadShard(bad_path).status().message(),
            absl::StrCat(bad_path, ": record at byte ", bounds[3], ": data CRC mismatch"));
}

TEST(CheckpointTest, EveryTruncationIsDataLossNamingTheFile) {
  const std::string dir = TestDir();
  ShardWriteOptions options;
  options.max_record_bytes = 40;
  absl::StatusOr<std::string> good_path = WriteShard(dir, MakeState(), options);
  ASSERT_TRUE(good_path.ok());
  const std::string good = ReadRaw(*good_path);
  const std::vector<size_t> bounds = RecordBoundaries(good);
  ASSERT_EQ(bounds.back(), good.size());
  const std::string cut_path = dir + "/cut";
  // Every length short of the whole file: at record boundaries (a clean end
  // of records, only the footer can tell) and inside records.
  for (size_t len = 0; len < good.size(); ++len) {
    WriteRaw(cut_path, good.substr(0, len));
    absl::StatusOr<ShardState> read = ReadShard(cut_path);
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << "length " << len;
    const std::string msg(read.status().message());
    ASSERT_THAT(msg, HasSubstr(cut_path)) << "length " << len;
    ASSERT_THAT(msg, HasSubstr("truncated")) << "length " << len;
  }
  // At a record boundary every record read is intact: the structure (counts
  // and the footer), not the framing, finds the cut.
  for (size_t b : bounds) {
    if (b == good.size()) continue;
    WriteRaw(cut_path, good.substr(0, b));
    const std::string msg(ReadShard(cut_path).status().message());
    EXPECT_THAT(msg, ::testing::Not(HasSubstr("record at byte"))) << "boundary " << b;
  }
  WriteRaw(cut_path, good.substr(0, bounds[bounds.size() - 2]));
  EXPECT_EQ(ReadShard(cut_path).status().message(),
            absl::StrCat(cut_path, ": truncated: ends after ", bounds.size() - 2, " records (",
                         bounds[bounds.size() - 2], " bytes) where the footer should follow; "
                         "no footer"));
}

// Builds a shard file record by record, for the checks the CRCs cannot make.
struct Crafted {
  ckpt::ShardHeader header;
  std::vector<ckpt::VariableHeader> vars;
  std::vector<std::vector<std::string>> payloads;  // Per variable.
  ckpt::ShardFooter footer;
  bool auto_footer = true;

  Crafted() {
    header.set_magic("towerps-shard");
    header.set_format_version(kShardFormatVersion);
    header.set_num_ps(1);
    ckpt::VariableHeader vh;
    *vh.mutable_def() = Def("w", {2, 3});
    vh.set_num_elements(6);
    vars.push_back(vh);
    payloads.push_back({std::string(24, '\0')});
  }

  std::string Encode() {
    header.set_num_variables(static_cast<int64_t>(vars.size()));
    std::string out;
    AppendRecord(header.SerializeAsString(), &out);
    int64_t records = 1, bytes = 0;
    for (size_t i = 0; i < vars.size(); ++i) {
      AppendRecord(vars[i].SerializeAsString(), &out);
      ++records;
      for (const std::string& p : payloads[i]) {
        AppendRecord(p, &out);
        ++records;
        bytes += static_cast<int64_t>(p.size());
      }
    }
    if (auto_footer) {
      footer.set_num_variables(static_cast<int64_t>(vars.size()));
      footer.set_num_records(records);
      footer.set_payload_bytes(bytes);
    }
    AppendRecord(footer.SerializeAsString(), &out);
    return out;
  }
};

absl::Status ReadCrafted(const std::string& dir, Crafted& c) {
  const std::string path = dir + "/crafted";
  WriteRaw(path, c.Encode());
  return ReadShard(path).status();
}

TEST(CheckpointTest, CraftedFileIsReadable) {
  const std::string dir = TestDir();
  Crafted c;
  EXPECT_TRUE(ReadCrafted(dir, c).ok()) << ReadCrafted(dir, c);
}

TEST(CheckpointTest, WrongFormatVersionIsDataLoss) {
  const std::string dir = TestDir();
  Crafted c;
  c.header.set_format_version(kShardFormatVersion + 1);
  absl::Status s = ReadCrafted(dir, c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), absl::StrCat(dir, "/crafted: format version ", kShardFormatVersion + 1,
                                      ", this build reads version ", kShardFormatVersion));
}

TEST(CheckpointTest, SizesNotMatchingTheShapeAreDataLoss) {
  const std::string dir = TestDir();
  {
    Crafted c;  // Header says 5 elements, shape 2x3 has 6.
    c.vars[0].set_num_elements(5);
    c.payloads[0] = {std::string(20, '\0')};
    absl::Status s = ReadCrafted(dir, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("variable 0 \"w\" has 5 elements, its shape 2x3 has 6"));
  }
  {
    Crafted c;  // Payload one float short, the footer rewritten to match.
    c.payloads[0] = {std::string(20, '\0')};
    absl::Status s = ReadCrafted(dir, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("payload record at byte"));
  }
  {
    Crafted c;  // Payload one float long.
    c.payloads[0] = {std::string(28, '\0')};
    EXPECT_EQ(ReadCrafted(dir, c).code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;  // Not a multiple of 4.
    c.payloads[0] = {std::string(10, '\0'), std::string(14, '\0')};
    EXPECT_EQ(ReadCrafted(dir, c).code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;  // Negative dimension.
    c.vars[0].mutable_def()->set_shape(0, -2);
    c.vars[0].set_num_elements(-6);
    EXPECT_EQ(ReadCrafted(dir, c).code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;  // A huge shape must not be allocated.
    c.vars[0].mutable_def()->set_shape(0, int64_t{1} << 40);
    c.vars[0].set_num_elements(int64_t{3} << 40);
    absl::Status s = ReadCrafted(dir, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("bytes are left in the file"));
  }
  {
    Crafted c;  // Split payload that adds up is fine.
    c.payloads[0] = {std::string(8, '\0'), std::string(16, '\0')};
    EXPECT_TRUE(ReadCrafted(dir, c).ok());
  }
}

TEST(CheckpointTest, BadHeaderFooterAndTrailingDataAreDataLoss) {
  const std::string dir = TestDir();
  {
    Crafted c;
    c.header.set_magic("towerps-manifest");
    absl::Status s = ReadCrafted(dir, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("not a shard file"));
  }
  {
    Crafted c;
    c.header.set_ps_task(1);  // Of num_ps 1.
    EXPECT_EQ(ReadCrafted(dir, c).code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;
    c.vars[0].mutable_def()->set_dtype(v1::DT_INVALID);
    EXPECT_EQ(ReadCrafted(dir, c).code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;
    c.auto_footer = false;
    c.footer.set_num_variables(1);
    c.footer.set_num_records(3);
    c.footer.set_payload_bytes(20);
    absl::Status s = ReadCrafted(dir, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("footer counts"));
  }
  {
    Crafted c;  // A record that is not a protobuf where the header belongs.
    std::string out;
    AppendRecord("\xff\xff\xff", &out);
    WriteRaw(dir + "/garbage", out);
    EXPECT_EQ(ReadShard(dir + "/garbage").status().code(), absl::StatusCode::kDataLoss);
  }
  {
    Crafted c;
    std::string out = c.Encode();
    AppendRecord("more", &out);
    WriteRaw(dir + "/trailing", out);
    absl::Status s = ReadShard(dir + "/trailing").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("trailing record"));
  }
}

TEST(CheckpointTest, MissingShardIsNotFound) {
  const std::string dir = TestDir();
  EXPECT_EQ(ReadShard(dir + "/nope/shard-0-of-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(VerifyShard(dir + "/shard-0-of-1").status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, InconsistentStateIsInvalidArgumentAndWritesNothing) {
  const std::string dir = TestDir();
  auto expect_invalid = [&](const ShardState& s, const ShardWriteOptions& o = {}) {
    EXPECT_EQ(WriteShard(dir + "/ckpt", s, o).status().code(),
              absl::StatusCode::kInvalidArgument);
  };
  ShardState s = MakeState();
  s.vars[1].value.pop_back();
  expect_invalid(s);
  s = MakeState();
  s.ps_task = 3;
  expect_invalid(s);
  s = MakeState();
  s.num_ps = 0;
  s.ps_task = 0;
  expect_invalid(s);
  s = MakeState();
  s.vars[0].def.set_dtype(v1::DT_INVALID);
  expect_invalid(s);
  s = MakeState();
  s.vars[0].slots[1].name = "m";
  expect_invalid(s);
  s = MakeState();
  s.vars[0].slots[1].name = "";
  expect_invalid(s);
  s = MakeState();
  s.vars[0].slots[1].values.pop_back();  // a slot not the value's size
  expect_invalid(s);
  ShardWriteOptions o;
  o.max_record_bytes = 3;
  expect_invalid(MakeState(), o);
  EXPECT_FALSE(Exists(dir + "/ckpt"));
}

// A view of memory held elsewhere (a server's variables) writes the same
// file as the state it views, record by record from that memory.
TEST(CheckpointTest, ViewOfMemoryHeldElsewhereWritesTheSameFile) {
  const std::string dir = TestDir();
  const ShardState state = MakeState();
  ShardWriteOptions o;
  o.max_record_bytes = 24;  // values split over several records
  absl::StatusOr<std::string> a = WriteShard(dir + "/a", state, o);
  ASSERT_TRUE(a.ok()) << a.status();
  // The same values in buffers of their own, viewed.
  std::vector<std::vector<float>> held;
  for (const VariableState& v : state.vars) {
    held.push_back(v.value);
    for (const SlotValues& sl : v.slots) held.push_back(sl.values);
  }
  ShardView view;
  view.job_id = state.job_id;
  view.ps_task = state.ps_task;
  view.num_ps = state.num_ps;
  view.global_step = state.global_step;
  view.worker_completed = state.worker_completed;
  size_t k = 0;
  for (const VariableState& v : state.vars) {
    ShardView::Variable& out = view.vars.emplace_back();
    out.def = v.def;
    out.updates = v.updates;
    out.value = held[k++];
    for (const SlotValues& sl : v.slots) out.slots.push_back({sl.name, held[k++]});
  }
  absl::StatusOr<std::string> b = WriteShard(dir + "/b", view, o);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<std::string> bytes_a = ReadFileToString(*a);
  absl::StatusOr<std::string> bytes_b = ReadFileToString(*b);
  ASSERT_TRUE(bytes_a.ok() && bytes_b.ok());
  EXPECT_EQ(*bytes_a, *bytes_b);
  absl::StatusOr<ShardState> back = ReadShard(*b);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->vars.size(), state.vars.size());
  // Bit for bit (NaN included).
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), 4 * x.size()) == 0;
  };
  for (size_t v = 0; v < state.vars.size(); ++v) {
    EXPECT_TRUE(same(back->vars[v].value, state.vars[v].value)) << "variable " << v;
    ASSERT_EQ(back->vars[v].slots.size(), state.vars[v].slots.size());
    for (size_t j = 0; j < state.vars[v].slots.size(); ++j) {
      EXPECT_TRUE(same(back->vars[v].slots[j].values, state.vars[v].slots[j].values))
          << "variable " << v << " slot " << j;
    }
  }
}

TEST(CheckpointTest, ManifestRoundTrips) {
  const std::string dir = TestDir() + "/job";
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kNotFound);
  const std::vector<ManifestEntry> entries = {
      {100, CheckpointDirName(100), 2, 1700000000.25},
      {200, CheckpointDirName(200), 2, 1700000100.5},
      {300, "custom", 3, 0},
  };
  ASSERT_TRUE(WriteManifest(dir, entries).ok());
  absl::StatusOr<std::vector<ManifestEntry>> read = ReadManifest(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*read)[i].step, entries[i].step);
    EXPECT_EQ((*read)[i].dir_name, entries[i].dir_name);
    EXPECT_EQ((*read)[i].num_ps, entries[i].num_ps);
    EXPECT_EQ((*read)[i].unix_time, entries[i].unix_time);
  }
  ASSERT_TRUE(WriteManifest(dir, {}).ok());
  read = ReadManifest(dir);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
}

TEST(CheckpointTest, BadManifestsAreRefused) {
  const std::string dir = TestDir();
  const std::string path = dir + "/MANIFEST";
  auto invalid = [&](std::vector<ManifestEntry> e) {
    return WriteManifest(dir, e).code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(invalid({{200, "a", 1, 0}, {100, "b", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "a", 1, 0}, {100, "b", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "../elsewhere", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "..", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "MANIFEST", 1, 0}}));
  EXPECT_TRUE(invalid({{100, "a", 0, 0}}));
  EXPECT_FALSE(Exists(path));

  ASSERT_TRUE(WriteManifest(dir, {{100, "a", 1, 0}, {200, "b", 2, 0}}).ok());
  const std::string good = ReadRaw(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    WriteRaw(path, bad);
    absl::Status s = ReadManifest(dir).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i << ": " << s;
    ASSERT_THAT(std::string(s.message()), HasSubstr(path));
  }
  for (size_t len = 0; len < good.size(); ++len) {
    WriteRaw(path, good.substr(0, len));
    ASSERT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss) << len;
  }
  // A well-framed manifest that names a directory outside DIR is corrupt:
  // AddToManifest would remove what it names.
  ckpt::Manifest m;
  m.set_magic("towerps-manifest");
  m.set_format_version(1);
  ckpt::ManifestEntry* e = m.add_entries();
  e->set_step(1);
  e->set_dir_name("../../home");
  e->set_num_ps(1);
  std::string out;
  AppendRecord(m.SerializeAsString(), &out);
  WriteRaw(path, out);
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
  // AddToManifest rebuilds it from the disk instead, never trusting (or
  // removing) what the corrupt one named.
  EXPECT_TRUE(AddToManifest(dir, {5, "x", 1, 0}, 1).ok());
  ASSERT_TRUE(ReadManifest(dir).ok());
  ASSERT_EQ(ReadManifest(dir)->size(), 1u);
  EXPECT_EQ(ReadManifest(dir)->front().dir_name, "x");
  // Trailing record.
  m.mutable_entries(0)->set_dir_name("ok");
  out.clear();
  AppendRecord(m.SerializeAsString(), &out);
  ASSERT_TRUE((WriteRaw(path, out), ReadManifest(dir).ok()));
  AppendRecord("x", &out);
  WriteRaw(path, out);
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
}

// Writes every shard of a checkpoint at `step` under `dir` and records it.
void SaveCheckpoint(const std::string& dir, int64_t step, int num_ps, int keep = 10) {
  for (int task = 0; task < num_ps; ++task) {
    ASSERT_TRUE(WriteShard(dir + "/" + CheckpointDirName(step), MakeState(task, num_ps, step)).ok());
  }
  ASSERT_TRUE(AddToManifest(dir, {step, CheckpointDirName(step), num_ps, 1.0 * step}, keep).ok());
}

TEST(CheckpointTest, FindLatestFallsBackPastBadCheckpoints) {
  const std::string dir = TestDir();
  std::vector<std::string> log;
  auto logger = [&](const std::string& line) { log.push_back(line); };

  EXPECT_EQ(FindLatestValidCheckpoint(dir, logger).status().code(), absl::StatusCode::kNotFound);
  for (int64_t step : {100, 200, 300}) SaveCheckpoint(dir, step, 2);
  absl::StatusOr<ManifestEntry> latest = FindLatestValidCheckpoint(dir, logger);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 300);
  EXPECT_EQ(latest->dir_name, "ckpt-0000000300");
  EXPECT_EQ(latest->num_ps, 2);
  EXPECT_TRUE(log.empty());

  // Newest: one payload byte of shard 1 flipped.
  const std::string shard = dir + "/ckpt-0000000300/shard-1-of-2";
  std::string contents = ReadRaw(shard);
  const std::vector<size_t> bounds = RecordBoundaries(contents);
  contents[bounds[2] + 20] ^= 0x04;
  WriteRaw(shard, contents);
  latest = FindLatestValidCheckpoint(dir, logger);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 200);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], absl::StrCat("checkpoint ckpt-0000000300 skipped: ", shard, ": record at byte ",
                                 bounds[2], ": data CRC mismatch"));

  // Then: a shard missing from 200, the wrong shard under 100's name.
  ASSERT_TRUE(RemoveAll(dir + "/ckpt-0000000200/shard-0-of-2").ok());
  WriteRaw(dir + "/ckpt-0000000100/shard-1-of-2", ReadRaw(dir + "/ckpt-0000000100/shard-0-of-2"));
  log.clear();
  latest = FindLatestValidCheckpoint(dir, logger);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_THAT(log[0], HasSubstr("checkpoint ckpt-0000000300 skipped: "));
  EXPECT_THAT(log[1], HasSubstr("checkpoint ckpt-0000000200 skipped: "));
  EXPECT_THAT(log[1], HasSubstr("shard-0-of-2"));
  EXPECT_EQ(log[2], absl::StrCat("checkpoint ckpt-0000000100 skipped: ", dir,
                                 "/ckpt-0000000100/shard-1-of-2: holds shard 0 of 2"));
  // An empty logger is allowed.
  EXPECT_EQ(FindLatestValidCheckpoint(dir, nullptr).status().code(), absl::StatusCode::kNotFound);

  // A corrupt MANIFEST is rebuilt from the disk, saying so: here nothing on
  // disk is intact.
  std::string manifest = ReadRaw(dir + "/MANIFEST");
  manifest[manifest.size() - 1] ^= 1;
  WriteRaw(dir + "/MANIFEST", manifest);
  log.clear();
  EXPECT_EQ(FindLatestValidCheckpoint(dir, logger).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("MANIFEST damaged ("));
  EXPECT_THAT(log[0], HasSubstr("rebuilt (in memory) from the intact checkpoints on disk: none"));
}

TEST(CheckpointTest, ADamagedManifestIsRebuiltFromTheIntactCheckpoints) {
  const std::string dir = TestDir();
  std::vector<std::string> log;
  auto logger = [&](const std::string& line) { log.push_back(line); };
  for (int64_t step : {100, 200, 300}) SaveCheckpoint(dir, step, 2, /*keep=*/3);
  // 200: a damaged shard. 400: half-written (one shard of two, never listed).
  const std::string shard = dir + "/ckpt-0000000200/shard-1-of-2";
  std::string contents = ReadRaw(shard);
  contents[contents.size() / 2] ^= 0x10;
  WriteRaw(shard, contents);
  ASSERT_TRUE(WriteShard(dir + "/" + CheckpointDirName(400), MakeState(0, 2, 400)).ok());
  // One flipped byte in the MANIFEST.
  std::string manifest = ReadRaw(dir + "/MANIFEST");
  manifest[manifest.size() / 2] ^= 0x01;
  WriteRaw(dir + "/MANIFEST", manifest);
  ASSERT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);

  absl::StatusOr<RebuiltManifest> rebuilt = RebuildManifest(dir);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  ASSERT_EQ(rebuilt->entries.size(), 2u);
  EXPECT_EQ(rebuilt->entries[0].dir_name, "ckpt-0000000100");
  EXPECT_EQ(rebuilt->entries[1].dir_name, "ckpt-0000000300");
  EXPECT_EQ(rebuilt->entries[1].step, 300);
  EXPECT_EQ(rebuilt->entries[1].num_ps, 2);
  EXPECT_GT(rebuilt->entries[1].unix_time, 1e9);
  ASSERT_EQ(rebuilt->skipped.size(), 2u);
  EXPECT_THAT(rebuilt->skipped[0], HasSubstr("ckpt-0000000200: "));
  EXPECT_THAT(rebuilt->skipped[1], HasSubstr("ckpt-0000000400: "));
  EXPECT_THAT(rebuilt->skipped[1], HasSubstr("shard-1-of-2"));  // the missing one

  // A restore finds the newest intact one, and says the MANIFEST was rebuilt.
  absl::StatusOr<ManifestEntry> latest = FindLatestValidCheckpoint(dir, logger);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 300);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("MANIFEST damaged ("));
  EXPECT_THAT(log[0], HasSubstr("from the intact checkpoints on disk: ckpt-0000000100, "
                                "ckpt-0000000300; skipped ckpt-0000000200: "));

  // Checkpointing goes on: the next one rewrites the MANIFEST and keep:N
  // prunes again.
  log.clear();
  for (int task = 0; task < 2; ++task) {
    ASSERT_TRUE(WriteShard(dir + "/" + CheckpointDirName(500), MakeState(task, 2, 500)).ok());
  }
  ASSERT_TRUE(AddToManifest(dir, {500, CheckpointDirName(500), 2, 500.0}, /*keep=*/2, logger).ok());
  ASSERT_EQ(log.size(), 2u);
  EXPECT_THAT(log[0], HasSubstr("rebuilt from the intact checkpoints on disk: ckpt-0000000100, "
                                "ckpt-0000000300, ckpt-0000000500; skipped"));
  // The damaged 200, unlisted and older than every one kept, goes too; the
  // half-written 400 is newer than the oldest kept, and stays for now.
  EXPECT_THAT(log[1], HasSubstr("removed ckpt-0000000200"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000200"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000400"));
  absl::StatusOr<std::vector<ManifestEntry>> m = ReadManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].step, 300);
  EXPECT_EQ((*m)[1].step, 500);
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000100"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000300/shard-1-of-2"));
}

TEST(CheckpointTest, FindLatestSkipsATruncatedNewestShard) {
  const std::string dir = TestDir();
  std::vector<std::string> log;
  SaveCheckpoint(dir, 10, 1);
  SaveCheckpoint(dir, 20, 1);
  const std::string shard = dir + "/ckpt-0000000020/shard-0-of-1";
  const std::string contents = ReadRaw(shard);
  const std::vector<size_t> bounds = RecordBoundaries(contents);
  WriteRaw(shard, contents.substr(0, bounds[bounds.size() - 2]));  // Footer cut off.
  absl::StatusOr<ManifestEntry> latest =
      FindLatestValidCheckpoint(dir, [&](const std::string& l) { log.push_back(l); });
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 10);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("checkpoint ckpt-0000000020 skipped: "));
  EXPECT_THAT(log[0], HasSubstr("no footer"));
}

TEST(CheckpointTest, AddToManifestKeepsTheNewestAndRemovesOldDirs) {
  const std::string dir = TestDir();
  for (int64_t step : {100, 200, 300, 400, 500}) SaveCheckpoint(dir, step, 2, /*keep=*/3);
  absl::StatusOr<std::vector<ManifestEntry>> m = ReadManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].step, 300);
  EXPECT_EQ((*m)[1].step, 400);
  EXPECT_EQ((*m)[2].step, 500);
  EXPECT_EQ((*m)[2].unix_time, 500.0);
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000100"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000200"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000300/shard-1-of-2"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000500/shard-0-of-2"));

  // Saving the same step again (a retry) replaces the entry, keeps its dir.
  ASSERT_TRUE(AddToManifest(dir, {500, CheckpointDirName(500), 2, 501.0}, 3).ok());
  m = ReadManifest(dir);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ(m->back().unix_time, 501.0);
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000500/shard-0-of-2"));

  // After a restore from 300, a checkpoint at 350 supersedes 400 and 500.
  SaveCheckpoint(dir, 350, 2, /*keep=*/3);
  m = ReadManifest(dir);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].step, 300);
  EXPECT_EQ((*m)[1].step, 350);
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000300"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000400"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000500"));

  // keep = 1.
  SaveCheckpoint(dir, 600, 2, /*keep=*/1);
  m = ReadManifest(dir);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].step, 600);
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000300"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000350"));

  EXPECT_EQ(AddToManifest(dir, {700, "ckpt-0000000700", 2, 0}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddToManifest(dir, {700, "../x", 2, 0}, 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadManifest(dir)->size(), 1u);
}

// A chief killed while pruning leaves a dropped checkpoint half-removed (and
// one killed while saving, a half-written one): no MANIFEST lists them. The
// next AddToManifest removes those older than the oldest entry kept, and
// leaves a newer unlisted one alone (a save may be in flight there).
TEST(CheckpointTest, AddToManifestRemovesUnlistedLeftoversOlderThanTheKeptOnes) {
  const std::string dir = TestDir();
  for (int64_t step : {100, 200, 300}) SaveCheckpoint(dir, step, 2, /*keep=*/2);
  ASSERT_FALSE(Exists(dir + "/ckpt-0000000100"));
  // The leftovers: one shard of a pruned checkpoint, an empty dir, a newer one.
  std::filesystem::create_directories(dir + "/ckpt-0000000050");
  WriteRaw(dir + "/ckpt-0000000050/shard-0-of-2", "half");
  std::filesystem::create_directories(dir + "/ckpt-0000000150");
  std::filesystem::create_directories(dir + "/ckpt-0000000900");
  WriteRaw(dir + "/ckpt-0000000900/shard-1-of-2", "in flight");
  std::filesystem::create_directories(dir + "/not-a-ckpt-0000000001");

  SaveCheckpoint(dir, 400, 2, /*keep=*/2);  // keeps 300, 400: drops 200
  absl::StatusOr<std::vector<ManifestEntry>> m = ReadManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].step, 300);
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000050"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000150"));
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000200"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000300/shard-0-of-2"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000400/shard-1-of-2"));
  EXPECT_TRUE(Exists(dir + "/ckpt-0000000900/shard-1-of-2"));
  EXPECT_TRUE(Exists(dir + "/not-a-ckpt-0000000001"));

  // The log names what goes.
  std::vector<std::string> lines;
  std::filesystem::create_directories(dir + "/ckpt-0000000250");
  ASSERT_TRUE(AddToManifest(dir, {400, CheckpointDirName(400), 2, 401.0}, 2,
                            [&](const std::string& l) { lines.push_back(l); })
                  .ok());
  EXPECT_FALSE(Exists(dir + "/ckpt-0000000250"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("removed ckpt-0000000250"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace towerps::common
