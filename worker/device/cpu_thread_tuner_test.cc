#include "worker/device/cpu_thread_tuner.h"

#include <cstdint>
#include <functional>
#include <random>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

using ::testing::HasSubstr;

// Runs `steps` steps whose compute takes cost(threads, step); returns the
// steps run at each count (index = threads) and the changes logged.
struct Driven {
  std::vector<int64_t> steps_at;
  std::vector<std::string> changes;
};
Driven Drive(CpuThreadTuner& tuner, int64_t steps, int max_threads,
          const std::function<double(int, int64_t)>& cost) {
  Driven run;
  run.steps_at.assign(max_threads + 1, 0);
  for (int64_t s = 0; s < steps; ++s) {
    const int t = tuner.threads();
    ++run.steps_at[t];
    CpuThreadTuner::Decision d = tuner.OnStep(cost(t, s));
    EXPECT_EQ(d.threads, tuner.threads());
    EXPECT_GE(d.threads, 1);
    EXPECT_LE(d.threads, max_threads);
    if (!d.change.empty()) run.changes.push_back(d.change);
  }
  return run;
}

TEST(CpuThreadTunerTest, IdleHostKeepsEveryThreadAndProbesRarely) {
  CpuThreadTuner::Options o;
  CpuThreadTuner tuner(2, o);
  // Two threads compute a step in 1 ms, one in 1.8 (the MLP on 2 cores).
  Driven run = Drive(tuner, 20000, 2, [](int t, int64_t) { return t == 2 ? 1e-3 : 1.8e-3; });
  EXPECT_TRUE(run.changes.empty());
  EXPECT_EQ(tuner.chosen(), 2);
  // Two windows of one thread per round (every other block of two steps),
  // rounds 128, 256, ... 4096 steps apart.
  const int64_t rounds = run.steps_at[1] / (2 * o.window);
  EXPECT_GE(rounds, 5);
  EXPECT_LE(rounds, 10);
  EXPECT_LT(run.steps_at[1], 20000 / 50);  // under 2% of the steps
}

TEST(CpuThreadTunerTest, BusyHostMovesToFewerThreadsAndLogsWhy) {
  CpuThreadTuner::Options o;
  CpuThreadTuner tuner(2, o);
  // A busy process beside the worker: 2 threads 5 ms, 1 thread 1.5 ms.
  Driven run = Drive(tuner, o.warmup + 4 * o.window, 2,
                  [](int t, int64_t) { return t == 2 ? 5e-3 : 1.5e-3; });
  EXPECT_EQ(tuner.chosen(), 1);
  EXPECT_EQ(tuner.threads(), 1);
  ASSERT_EQ(run.changes.size(), 1u);
  EXPECT_THAT(run.changes[0], HasSubstr("1 CPU math thread(s) instead of 2"));
  EXPECT_THAT(run.changes[0], HasSubstr("took 1.5 ms against 5 (medians of 16 steps each"));
}

TEST(CpuThreadTunerTest, GoesBackUpWhenTheLoadLeaves) {
  CpuThreadTuner::Options o;
  CpuThreadTuner tuner(2, o);
  const int64_t load_ends = 200;
  auto cost = [&](int t, int64_t s) {
    if (s < load_ends) return t == 2 ? 5e-3 : 1.5e-3;
    return t == 2 ? 1e-3 : 1.8e-3;
  };
  Driven before = Drive(tuner, load_ends, 2, cost);
  EXPECT_EQ(tuner.chosen(), 1);
  // The next round starts within the longest wait and takes four windows
  // (1 and 2 threads alternating, half the steps counted).
  int64_t s = load_ends;
  while (tuner.chosen() != 2 && s < load_ends + o.max_interval + 4 * o.window) {
    tuner.OnStep(cost(tuner.threads(), s++));
  }
  EXPECT_EQ(tuner.chosen(), 2);
}

TEST(CpuThreadTunerTest, NoisyStepsDoNotMoveACountThatIsClearlyBest) {
  CpuThreadTuner tuner(2);
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> noise(0.7, 1.3);  // +-30% per step
  Driven run = Drive(tuner, 50000, 2, [&](int t, int64_t) {
    return (t == 2 ? 1e-3 : 1.8e-3) * noise(gen);
  });
  EXPECT_TRUE(run.changes.empty()) << run.changes[0];
  EXPECT_EQ(tuner.chosen(), 2);
}

TEST(CpuThreadTunerTest, WalksDownToTheFastestCountAndStops) {
  CpuThreadTuner tuner(8);
  // Fastest at 2: 8 -> 4 -> 2, and 1 is slower.
  auto cost = [](int t, int64_t) {
    switch (t) {
      case 8: return 9e-3;
      case 4: return 4e-3;
      case 2: return 2e-3;
      default: return 3e-3;
    }
  };
  Driven run = Drive(tuner, 2000, 8, cost);
  EXPECT_EQ(tuner.chosen(), 2);
  ASSERT_EQ(run.changes.size(), 2u);
  EXPECT_THAT(run.changes[0], HasSubstr("4 CPU math thread(s) instead of 8"));
  EXPECT_THAT(run.changes[1], HasSubstr("2 CPU math thread(s) instead of 4"));
  EXPECT_EQ(run.steps_at[8], 4 + 32);  // the warm-up and one comparison, never again
  // Most steps at the fastest count; the others only in comparisons.
  EXPECT_GT(run.steps_at[2], 1500);
  EXPECT_EQ(tuner.StepsPerCount(),
            absl::StrFormat("8 threads 36 steps, 4 threads %d steps, 2 threads %d steps, "
                            "1 thread %d steps",
                            run.steps_at[4], run.steps_at[2], run.steps_at[1]));
}

TEST(CpuThreadTunerTest, OneThreadHasNothingToTry) {
  CpuThreadTuner tuner(1);
  Driven run = Drive(tuner, 1000, 1, [](int, int64_t) { return 1e-3; });
  EXPECT_EQ(run.steps_at[1], 1000);
  EXPECT_TRUE(run.changes.empty());
  EXPECT_EQ(tuner.StepsPerCount(), "1 thread 1000 steps");
  EXPECT_EQ(CpuThreadTuner(4).StepsPerCount(), "no steps");
}

}  // namespace
}  // namespace towerps::worker
