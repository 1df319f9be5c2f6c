#include "common/storage/file_util.h"

#include <dirent.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", info->name());
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

TEST(AtomicFileWriterTest, PiecesSmallAndLargeMakeTheFileOnCommit) {
  const std::string dir = TestDir();
  const std::string path = dir + "/f";
  auto w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string expected;
  // Small pieces are gathered, large ones written directly: both in order.
  for (int i = 0; i < 50; ++i) {
    const std::string piece(i % 7 == 0 ? 100000 + i : 13 + i, static_cast<char>('a' + i % 26));
    ASSERT_TRUE((*w)->Append(piece).ok());
    expected += piece;
  }
  // Nothing at the path until the commit.
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre(::testing::StartsWith("f.tmp.")));
  ASSERT_TRUE((*w)->Commit().ok());
  auto read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, expected);
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre("f"));
  EXPECT_EQ((*w)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AtomicFileWriterTest, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string dir = TestDir();
  const std::string path = dir + "/f";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    auto w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(std::string(200000, 'n')).ok());
  }
  auto read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "old");
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre("f"));
}

TEST(AtomicFileWriterTest, MissingDirectoryIsNotFoundNamingTheFile) {
  const std::string dir = TestDir();
  auto w = AtomicFileWriter::Create(dir + "/no/such/f");
  ASSERT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir + "/no/such/f.tmp."));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("create"));
}

TEST(JoinPathTest, OneSlashBetweenDirAndName) {
  EXPECT_EQ(JoinPath("a/b", "MANIFEST"), "a/b/MANIFEST");
  EXPECT_EQ(JoinPath("a/b/", "MANIFEST"), "a/b/MANIFEST");
  EXPECT_EQ(JoinPath("/", "ckpt-0000000001"), "/ckpt-0000000001");
  EXPECT_EQ(JoinPath("", "shard-0-of-2"), "shard-0-of-2");
}

}  // namespace
}  // namespace towerps::common
