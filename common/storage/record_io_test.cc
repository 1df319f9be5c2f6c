#include "common/storage/record_io.h"

#include <string>

#include "common/storage/crc32c.h"
#include "common/storage/file_util.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(RecordIoTest, RoundTripsAndEndsCleanly) {
  std::string buf;
  AppendRecord("hello", &buf);
  AppendRecord("", &buf);
  AppendRecord(std::string(100000, 'x'), &buf);
  EXPECT_EQ(buf.size(), 3 * 16 + 5 + 100000u);
  RecordReader r(buf, "mem");
  EXPECT_EQ(*r.Next(), "hello");
  EXPECT_EQ(*r.Next(), "");
  EXPECT_EQ(r.Next()->size(), 100000u);
  EXPECT_EQ(r.Next().status().code(), absl::StatusCode::kOutOfRange);
}

TEST(RecordIoTest, FramingIsTfRecord) {
  std::string buf;
  AppendRecord("abc", &buf);
  // length 3, little-endian u64
  EXPECT_EQ(buf.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  uint32_t stored;
  memcpy(&stored, buf.data() + 15, 4);
  EXPECT_EQ(UnmaskCrc(stored), Crc32c("abc"));
}

TEST(RecordIoTest, EveryFlippedByteIsDetected) {
  std::string good;
  AppendRecord("first record", &good);
  AppendRecord("second", &good);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    RecordReader r(bad, "f");
    absl::Status s = absl::OkStatus();
    for (int k = 0; k < 3 && s.ok(); ++k) s = r.Next().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
}

TEST(RecordIoTest, TruncationIsDataLossNamingTheOffset) {
  std::string buf;
  AppendRecord("aaaa", &buf);
  AppendRecord("bbbbbbbb", &buf);
  for (size_t cut = 21; cut < buf.size(); ++cut) {
    RecordReader r(absl::string_view(buf).substr(0, cut), "ckpt");
    ASSERT_TRUE(r.Next().ok());
    absl::Status s = r.Next().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_NE(s.message().find("ckpt: record at byte 20"), std::string::npos) << s.message();
  }
}

TEST(RecordIoTest, WriterAppendsAndSyncs) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/records";
  {
    auto w = RecordWriter::Open(path, /*append=*/false);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write("one").ok());
    ASSERT_TRUE((*w)->Sync().ok());
  }
  {
    auto w = RecordWriter::Open(path, /*append=*/true);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write("two").ok());
  }
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  RecordReader r(*text, path);
  EXPECT_EQ(*r.Next(), "one");
  EXPECT_EQ(*r.Next(), "two");
  EXPECT_EQ(r.Next().status().code(), absl::StatusCode::kOutOfRange);
}

TEST(FileUtilTest, AtomicWriteReplacesWholeFile) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/a/b";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = dir + "/f";
  ASSERT_TRUE(WriteFileAtomically(path, "old contents").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(*ReadFileToString(path), "new");
  EXPECT_EQ(ReadFileToString(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteFileAtomically(dir + "/no/such/dir/f", "x").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(RemoveAll(std::string(getenv("TEST_TMPDIR")) + "/a").ok());
  EXPECT_EQ(ReadFileToString(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace towerps::common
