#include "common/skipped_updates.h"

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(SkippedUpdatesNoteTest, NamesEachServerThatSkippedAndNoneElse) {
  EXPECT_EQ(SkippedUpdatesNote({}), "");
  EXPECT_EQ(SkippedUpdatesNote({{0, 0}, {1, 0}}), "");
  const std::string note = SkippedUpdatesNote({{0, 0}, {1, 2}, {3, 1}});
  EXPECT_EQ(note.rfind("Variable updates not applied, their values not finite", 0), 0u) << note;
  EXPECT_NE(note.find("): ps 1 skipped 2, ps 3 skipped 1."), std::string::npos) << note;
  EXPECT_EQ(note.find("ps 0"), std::string::npos) << note;
}

}  // namespace
}  // namespace towerps::common
