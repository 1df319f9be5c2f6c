#include "ps/apply_log.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace towerps::ps {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ApplyLogTest, AppendsLinesAcrossOpens) {
  const std::string path = ::testing::TempDir() + "/apply_log_test.log";
  std::remove(path.c_str());
  {
    auto log = ApplyLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status();
    (*log)->Append(0xab, "create mlp 0");
    (*log)->Append(0xab, "apply mlp 1 0");
  }
  {
    auto log = ApplyLog::Open(path);  // a restarted ps appends, never truncates
    ASSERT_TRUE(log.ok()) << log.status();
    (*log)->Append(0xcd, "restore mlp 5");
  }
  EXPECT_EQ(ReadAll(path), "ab create mlp 0\nab apply mlp 1 0\ncd restore mlp 5\n");
}

TEST(ApplyLogTest, OpenErrorNamesThePath) {
  auto log = ApplyLog::Open("/nonexistent-dir/x/apply.log");
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("/nonexistent-dir/x/apply.log"), std::string::npos);
  EXPECT_FALSE(ApplyLog::Open("").ok());
}

}  // namespace
}  // namespace towerps::ps
