#include "client/text_table.h"

#include "gtest/gtest.h"

namespace towerps::client {
namespace {

TEST(TextTableTest, ColumnsStartAtTheSameOffsetInEveryRow) {
  TextTable t({"JOB", "STATE", "STEP"});
  t.AddRow({"a-much-longer-name", "RUNNING", "1/2"});
  t.AddRow({"b", "QUEUED"});  // Short row: padded.
  EXPECT_EQ(t.Render("  "),
            "  JOB                 STATE    STEP\n"
            "  a-much-longer-name  RUNNING  1/2\n"
            "  b                   QUEUED\n");
}

TEST(TextTableTest, HumanUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(12 << 20), "12.0 MiB");
  EXPECT_EQ(HumanBytes(int64_t{300} << 30), "300 GiB");
  EXPECT_EQ(HumanDuration(12.34), "12.3s");
  EXPECT_EQ(HumanDuration(245), "4m05s");
  EXPECT_EQ(HumanDuration(3720), "1h02m");
  EXPECT_EQ(HumanDuration(2 * 86400 + 3 * 3600), "2d03h");
  EXPECT_EQ(HumanDuration(-1), "-");
  EXPECT_EQ(LocalTime(0), "-");
  EXPECT_EQ(LocalTime(1.7e9).size(), 19u);
}

TEST(TextTableTest, TruncateKeepsOneLine) {
  EXPECT_EQ(Truncate("short", 10), "short");
  EXPECT_EQ(Truncate("0123456789abc", 10), "0123456...");
  EXPECT_EQ(Truncate("a\nb", 10), "a b");
}

}  // namespace
}  // namespace towerps::client
