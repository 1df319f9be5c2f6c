#include "client/safetensors_writer.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "client/export_chunk_test_util.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace towerps::client {
namespace {

struct Parsed {
  google::protobuf::Struct header;
  std::string data;
};

Parsed Parse(const std::string& file) {
  Parsed p;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_LE(8 + n, file.size());
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(file.substr(8, n), &p.header).ok())
      << file.substr(8, n);
  p.data = file.substr(8 + n);
  return p;
}

TEST(SafetensorsWriterTest, HeaderParsesAndOffsetsTileTheData) {
  SafetensorsWriter w("mnist");
  ASSERT_TRUE(w.Add(Chunk("dense/w", {2, 2}, 0, Floats({1, 2}))).ok());
  ASSERT_TRUE(w.Add(Chunk("", {}, 2, Floats({3, 4}))).ok());
  ASSERT_TRUE(w.Add(Chunk("dense/\"b\"", {1}, 0, Floats({5}))).ok());
  absl::StatusOr<std::string> file = w.Serialize();
  ASSERT_TRUE(file.ok()) << file.status();
  Parsed p = Parse(*file);
  EXPECT_EQ(p.data, Floats({1, 2, 3, 4, 5}));
  const auto& f = p.header.fields();
  const auto& wdef = f.at("dense/w").struct_value().fields();
  EXPECT_EQ(wdef.at("dtype").string_value(), "F32");
  EXPECT_EQ(wdef.at("shape").list_value().values_size(), 2);
  EXPECT_EQ(wdef.at("data_offsets").list_value().values(1).number_value(), 16);
  const auto& bdef = f.at("dense/\"b\"").struct_value().fields();
  EXPECT_EQ(bdef.at("data_offsets").list_value().values(0).number_value(), 16);
  EXPECT_EQ(bdef.at("data_offsets").list_value().values(1).number_value(), 20);
  const auto& meta = f.at("__metadata__").struct_value().fields();
  EXPECT_EQ(meta.at("job_id").string_value(), "mnist");
  EXPECT_EQ(meta.at("global_step").string_value(), "7");
}

TEST(SafetensorsWriterTest, GapOverlapAndShortStreamAreErrors) {
  {
    SafetensorsWriter w("j");
    ASSERT_TRUE(w.Add(Chunk("a", {4}, 0, Floats({1}))).ok());
    absl::Status s = w.Add(Chunk("", {}, 2, Floats({3})));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("a gap"), std::string::npos) << s;
  }
  {
    SafetensorsWriter w("j");
    ASSERT_TRUE(w.Add(Chunk("a", {4}, 0, Floats({1, 2}))).ok());
    EXPECT_NE(w.Add(Chunk("", {}, 1, Floats({3}))).message().find("an overlap"), std::string::npos);
  }
  {
    SafetensorsWriter w("j");
    ASSERT_TRUE(w.Add(Chunk("a", {4}, 0, Floats({1, 2}))).ok());
    absl::Status s = w.Add(Chunk("b", {1}, 0, Floats({3})));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("[2, 4) are missing"), std::string::npos) << s;
  }
  {
    SafetensorsWriter w("j");
    ASSERT_TRUE(w.Add(Chunk("a", {4}, 0, Floats({1, 2}))).ok());
    EXPECT_EQ(w.Serialize().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    SafetensorsWriter w("j");
    EXPECT_EQ(w.Add(Chunk("", {}, 0, Floats({1}))).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(w.Serialize().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    SafetensorsWriter w("j");
    EXPECT_EQ(w.Add(Chunk("a", {1}, 0, Floats({1, 2}))).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    SafetensorsWriter w("j");
    ASSERT_TRUE(w.Add(Chunk("a", {1}, 0, Floats({1}))).ok());
    EXPECT_EQ(w.Add(Chunk("a", {1}, 0, Floats({1}))).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(SafetensorsWriterTest, WriteFileReplacesThePathAtomically) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/w.safetensors";
  SafetensorsWriter w("j");
  ASSERT_TRUE(w.Add(Chunk("a", {}, 0, Floats({42}))).ok());  // A scalar.
  ASSERT_TRUE(w.WriteFile(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(Parse(ss.str()).data, Floats({42}));
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  EXPECT_EQ(w.WriteFile("/nonexistent-dir/x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace towerps::client
