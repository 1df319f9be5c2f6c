#include "common/blas_kernels.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

extern char** environ;

namespace towerps::common {
namespace {

constexpr CpuVectorFeatures kSse{false, false};
constexpr CpuVectorFeatures kAvx2{true, false};
constexpr CpuVectorFeatures kAvx512{true, true};

TEST(BetterBlasCoreTest, OldKernelsOnANewerCpuAreReplaced) {
  // The case measured on a 16-core Xeon with AVX-512: OpenBLAS 0.3.21 chose
  // Prescott.
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx512, nullptr), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx2, nullptr), "Haswell");
  EXPECT_EQ(BetterBlasCore("Nehalem", kAvx2, nullptr), "Haswell");
  EXPECT_EQ(BetterBlasCore("Sandybridge", kAvx512, nullptr), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Unknown", kAvx2, nullptr), "Haswell");
  EXPECT_EQ(BetterBlasCore("", kAvx2, nullptr), "Haswell");
  EXPECT_EQ(BetterBlasCore("prescott", kAvx512, ""), "SkylakeX");  // an empty variable is unset
}

TEST(BetterBlasCoreTest, AModernChoiceIsKept) {
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids",
                           "Excavator", "haswell", "ZEN"}) {
    EXPECT_EQ(BetterBlasCore(core, kAvx512, nullptr), "") << core;
    EXPECT_EQ(BetterBlasCore(core, kAvx2, nullptr), "") << core;
  }
}

TEST(BetterBlasCoreTest, ACpuWithoutAvx2KeepsWhatTheLibraryChose) {
  EXPECT_EQ(BetterBlasCore("Prescott", kSse, nullptr), "");
  EXPECT_EQ(BetterBlasCore("Sandybridge", kSse, nullptr), "");
}

TEST(BetterBlasCoreTest, TheUsersChoiceIsAlwaysKept) {
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx512, "Prescott"), "");
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx512, "Haswell"), "");
}

// A core chosen in the environment is kept, and named where the CPU runs
// newer kernels than it; a restart's choice, or the best one, is not.
TEST(KeptCoreNoteTest, NamesAnOlderCoreChosenInTheEnvironment) {
  EXPECT_EQ(internal::KeptCoreNote("Haswell", kAvx512, "Haswell"),
            "OPENBLAS_CORETYPE=Haswell from the environment, kept: this CPU has AVX-512, whose "
            "SkylakeX kernels may be faster");
  EXPECT_EQ(internal::KeptCoreNote("Prescott", kAvx2, "prescott"),
            "OPENBLAS_CORETYPE=prescott from the environment, kept: this CPU has AVX2 and FMA, "
            "whose Haswell kernels may be faster");
  EXPECT_NE(internal::KeptCoreNote("Zen", kAvx512, "Zen"), "");
  // The best the CPU runs, or newer than it (the library's own fallback then).
  EXPECT_EQ(internal::KeptCoreNote("SkylakeX", kAvx512, "SkylakeX"), "");
  EXPECT_EQ(internal::KeptCoreNote("Cooperlake", kAvx512, "Cooperlake"), "");
  EXPECT_EQ(internal::KeptCoreNote("Haswell", kAvx2, "Haswell"), "");
  EXPECT_EQ(internal::KeptCoreNote("Prescott", kSse, "Prescott"), "");
  // Nothing set: the library's own choice (RestartWithBetterBlasKernels's case).
  EXPECT_EQ(internal::KeptCoreNote("Haswell", kAvx512, nullptr), "");
  EXPECT_EQ(internal::KeptCoreNote("Haswell", kAvx512, ""), "");
}

TEST(BlasDescriptionTest, NamesTheLibrary) {
  EXPECT_NE(BlasDescription().find("OpenBLAS"), std::string::npos) << BlasDescription();
}

struct HelperRun {
  pid_t pid = 0;
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs the helper (a data dependency, beside the test in its runfiles) with
// `args`, and OPENBLAS_CORETYPE set to `coretype` unless null.
HelperRun RunHelper(const std::vector<std::string>& args, const char* coretype) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("OPENBLAS_CORETYPE=", 0) != 0) env_strings.push_back(*e);
  }
  if (coretype != nullptr) env_strings.push_back(absl::StrCat("OPENBLAS_CORETYPE=", coretype));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {"common/blas_kernels_restart_helper"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int fds[2];
  HelperRun run;
  if (pipe(fds) != 0) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  const int rc = posix_spawn(&run.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    run.output = absl::StrCat("posix_spawn failed: ", rc);
    return run;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) run.output.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(run.pid, &status, 0);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

TEST(RestartTest, OldKernelsRestartTheSameProcessWithTheBetterOnes) {
  const CpuVectorFeatures cpu = DetectCpuVectorFeatures();
  const std::string want = BetterBlasCore("Prescott", cpu, nullptr);
  const HelperRun run = RunHelper({"Prescott"}, nullptr);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The line the run that stays prints: the same pid (exec, not a child).
  const std::string last = absl::StrCat("pid=", run.pid, " coretype_env=", want, " corename=");
  ASSERT_NE(run.output.find(last), std::string::npos) << run.output;
  if (want.empty()) {
    GTEST_SKIP() << "this CPU has no AVX2/FMA: nothing better to restart with";
  }
  const std::string corename =
      absl::AsciiStrToLower(run.output.substr(run.output.find(last) + last.size()));
  EXPECT_EQ(corename.rfind(absl::AsciiStrToLower(want), 0), 0u) << run.output;
  // Nothing printed before the restart; the run that stays says why.
  EXPECT_EQ(run.output.rfind("note=OpenBLAS picked the Prescott kernels for this CPU, so this "
                             "run started again with OPENBLAS_CORETYPE=" + want + "\n",
                             0),
            0u)
      << run.output;
}

TEST(RestartTest, TheUsersOpenblasCoretypeIsKept) {
  const HelperRun run = RunHelper({"Prescott"}, "Haswell");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("started again"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.rfind("note=\n", 0), 0u) << run.output;
  EXPECT_NE(run.output.find(absl::StrCat("pid=", run.pid, " coretype_env=Haswell corename=")),
            std::string::npos)
      << run.output;
}

TEST(RestartTest, TheLibrarysOwnChoiceHereRunsWithoutRestartWhenModern) {
  // Whatever OpenBLAS picks on this machine: a restart happens exactly when
  // BetterBlasCore says so.
  const HelperRun run = RunHelper({}, nullptr);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const bool restarted = run.output.find("started again") != std::string::npos;
  const size_t at = run.output.find("corename=");
  ASSERT_NE(at, std::string::npos) << run.output;
  std::string final_core = run.output.substr(at + 9);
  final_core = final_core.substr(0, final_core.find('\n'));
  // After a restart the library runs the kernels asked for: modern ones.
  EXPECT_EQ(BetterBlasCore(final_core, DetectCpuVectorFeatures(), nullptr), "") << run.output;
  if (!restarted) {
    EXPECT_NE(run.output.find("coretype_env= "), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace towerps::common
