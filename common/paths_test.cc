#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

// A fresh directory per test with a root inside ("root") and a place
// outside it ("outside").
class PathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    base_ = AbsoluteNormalPath(absl::StrCat(::testing::TempDir(), "/paths_", info->name()));
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(system(absl::StrCat("rm -rf '", base_, "'").c_str()), 0);
    MkDir(base_);
    MkDir(root_);
    MkDir(outside_);
    auto roots = PathRoots::Create("--state_dir", {root_});
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = std::make_unique<PathRoots>(*roots);
  }
  static void MkDir(const std::string& p) { ASSERT_EQ(::mkdir(p.c_str(), 0755), 0) << p; }
  static void Link(const std::string& target, const std::string& at) {
    ASSERT_EQ(::symlink(target.c_str(), at.c_str()), 0) << at;
  }
  absl::StatusOr<std::string> Resolve(const std::string& p) {
    return roots_->Resolve("checkpoint.dir", p);
  }
  void ExpectRefused(const std::string& p) {
    auto r = Resolve(p);
    ASSERT_FALSE(r.ok()) << p << " accepted as " << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("checkpoint.dir \"", p, "\"")));
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("--state_dir \"", root_, "\"")));
  }

  std::string base_, root_, outside_;
  std::unique_ptr<PathRoots> roots_;
};

TEST(AbsoluteNormalPathTest, Normalizes) {
  EXPECT_EQ(AbsoluteNormalPath("/a/./b//c/"), "/a/b/c");
  EXPECT_EQ(AbsoluteNormalPath("/a/b/../c"), "/a/c");
  EXPECT_EQ(AbsoluteNormalPath("/../../x"), "/x");
  EXPECT_EQ(AbsoluteNormalPath("/"), "/");
  EXPECT_EQ(AbsoluteNormalPath("//"), "/");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsoluteNormalPath("rel/x"), AbsoluteNormalPath(absl::StrCat(cwd, "/rel/x")));
}

TEST_F(PathsTest, RelativePathsResolveUnderTheFirstRoot) {
  EXPECT_EQ(*Resolve("jobs/a/checkpoints"), root_ + "/jobs/a/checkpoints");
  EXPECT_EQ(*Resolve("./jobs//a/"), root_ + "/jobs/a");
  EXPECT_EQ(*Resolve("jobs/../b"), root_ + "/b");  // ".." that stays inside is fine
}

TEST_F(PathsTest, TheRootItselfAndTrailingSlashes) {
  EXPECT_EQ(*Resolve(root_), root_);
  EXPECT_EQ(*Resolve(root_ + "/"), root_);
  EXPECT_EQ(*Resolve(root_ + "///"), root_);
  EXPECT_EQ(*Resolve("."), root_);
  auto with_slash = PathRoots::Create("--state_dir", {root_ + "/"});
  ASSERT_TRUE(with_slash.ok());
  EXPECT_EQ(with_slash->roots()[0], root_);
  EXPECT_EQ(*with_slash->Resolve("f", root_ + "/x"), root_ + "/x");
}

TEST_F(PathsTest, AbsoluteInsideIsAccepted) {
  EXPECT_EQ(*Resolve(root_ + "/jobs/x"), root_ + "/jobs/x");
}

TEST_F(PathsTest, AbsoluteOutsideIsRefused) {
  ExpectRefused("/etc/x");
  ExpectRefused(outside_);
  ExpectRefused("/");
  // A sibling whose name starts like the root is not under it.
  ExpectRefused(root_ + "x/y");
}

TEST_F(PathsTest, DotDotThatEscapesIsRefused) {
  ExpectRefused("..");
  ExpectRefused("../outside");
  ExpectRefused("jobs/../../outside");
  ExpectRefused(root_ + "/../outside");
  ExpectRefused("state/../../y");
  ExpectRefused("../../../../../../../../../etc");
}

TEST_F(PathsTest, NonExistentTailsAreResolvedAsWritten) {
  EXPECT_EQ(*Resolve("a/b/c/d"), root_ + "/a/b/c/d");
  EXPECT_EQ(*Resolve(root_ + "/missing/deeper"), root_ + "/missing/deeper");
  ExpectRefused(base_ + "/missing/deeper");
}

TEST_F(PathsTest, SymlinkInsideTheRootIsAccepted) {
  MkDir(root_ + "/real");
  Link(root_ + "/real", root_ + "/abs_link");
  Link("real", root_ + "/rel_link");
  EXPECT_EQ(*Resolve("abs_link/ckpt"), root_ + "/abs_link/ckpt");
  EXPECT_EQ(*Resolve("rel_link/ckpt"), root_ + "/rel_link/ckpt");
}

TEST_F(PathsTest, SymlinkThatEscapesIsRefused) {
  Link(outside_, root_ + "/abs_out");
  Link("../outside", root_ + "/rel_out");
  ExpectRefused("abs_out");
  ExpectRefused("abs_out/x/y");
  ExpectRefused("rel_out/x");
  ExpectRefused(root_ + "/rel_out");
  auto r = Resolve("abs_out/x");
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("resolves to \"", outside_, "/x\"")));
}

TEST_F(PathsTest, DanglingSymlinkThatEscapesIsRefused) {
  // The target does not exist yet: a write through the link would create it
  // outside.
  Link(outside_ + "/not_yet/deeper", root_ + "/dangling");
  ExpectRefused("dangling");
  ExpectRefused("dangling/x");
}

TEST_F(PathsTest, DotDotAfterASymlinkFollowsTheLink) {
  // root/deep -> outside/a/b; "deep/../../x" is outside/x for the kernel,
  // although it reads as root/x.
  MkDir(outside_ + "/a");
  MkDir(outside_ + "/a/b");
  Link(outside_ + "/a/b", root_ + "/deep");
  EXPECT_EQ(*ResolveSymlinks(root_ + "/deep/../x"), outside_ + "/a/x");
  // The path handed back is the lexically normal one, which is what was
  // checked: root/x, inside.
  EXPECT_EQ(*Resolve("deep/../x"), root_ + "/x");
}

TEST_F(PathsTest, SymlinkedRootIsComparedByItsResolution) {
  // The root itself is a link: paths through either name are inside.
  Link(root_, base_ + "/root_link");
  auto roots = PathRoots::Create("--state_dir", {base_ + "/root_link"});
  ASSERT_TRUE(roots.ok());
  EXPECT_EQ(*roots->Resolve("f", root_ + "/x"), root_ + "/x");
  EXPECT_EQ(*roots->Resolve("f", "x"), base_ + "/root_link/x");
  EXPECT_FALSE(roots->Resolve("f", outside_).ok());
}

TEST_F(PathsTest, SymlinkLoopIsRefused) {
  Link(root_ + "/loop_b", root_ + "/loop_a");
  Link(root_ + "/loop_a", root_ + "/loop_b");
  auto r = Resolve("loop_a/x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("too many levels of symbolic links"));
  EXPECT_THAT(r.status().message(), HasSubstr("checkpoint.dir \"loop_a/x\""));
}

TEST_F(PathsTest, EmptyAndNulAreRefused) {
  auto r = Resolve("");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("checkpoint.dir is empty"));
  auto nul = Resolve(std::string("a\0b", 3));
  ASSERT_FALSE(nul.ok());
  EXPECT_EQ(nul.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PathsTest, SeveralRoots) {
  MkDir(outside_ + "/data");
  auto roots = PathRoots::Create("--data_root", {root_, outside_ + "/data"});
  ASSERT_TRUE(roots.ok());
  EXPECT_EQ(*roots->Resolve("data.dir", outside_ + "/data/fmnist"), outside_ + "/data/fmnist");
  EXPECT_EQ(*roots->Resolve("data.dir", "fmnist"), root_ + "/fmnist");  // the first root
  auto r = roots->Resolve("data.dir", outside_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("data.dir \"", outside_, "\" is outside --data_root \"",
                                     root_, "\", \"", outside_, "/data\"")));
}

TEST(PathRootsTest, CreateRefusesBadRoots) {
  EXPECT_EQ(PathRoots::Create("--state_dir", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = PathRoots::Create("--data_root", {""});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("--data_root"));
}

TEST(PathRootsTest, RootSlashAcceptsEverything) {
  auto roots = PathRoots::Create("--state_dir", {"/"});
  ASSERT_TRUE(roots.ok());
  EXPECT_EQ(*roots->Resolve("f", "/etc/x"), "/etc/x");
}

}  // namespace
}  // namespace towerps::common
