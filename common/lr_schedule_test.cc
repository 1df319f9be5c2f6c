#include "common/lr_schedule.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "proto/job.pb.h"

namespace towerps::common {
namespace {

using Schedule = v1::LearningRateSchedule;

v1::OptimizerSpec Spec(float lr, Schedule::Type type, int64_t decay_steps = 0,
                       float decay_rate = 0.0f, int64_t warmup_steps = 0,
                       float alpha = 0.0f) {
  v1::OptimizerSpec s;
  s.set_learning_rate(lr);
  s.mutable_schedule()->set_type(type);
  s.mutable_schedule()->set_decay_steps(decay_steps);
  s.mutable_schedule()->set_decay_rate(decay_rate);
  s.mutable_schedule()->set_warmup_steps(warmup_steps);
  s.mutable_schedule()->set_alpha(alpha);
  return s;
}

// The spec's fields are floats (0.1f is not 0.1): compare to 1e-6 relative.
void ExpectLr(const v1::OptimizerSpec& spec, int64_t step, double want) {
  EXPECT_NEAR(LearningRateAt(spec, step), want, 1e-6 * std::abs(want) + 1e-12)
      << "step " << step;
}

TEST(LrScheduleTest, ConstantAndUnspecified) {
  for (auto type : {Schedule::CONSTANT, Schedule::SCHEDULE_UNSPECIFIED}) {
    const auto s = Spec(0.25f, type);
    EXPECT_EQ(LearningRateAt(s, 0), 0.25);
    EXPECT_EQ(LearningRateAt(s, 1000000), 0.25);
  }
  v1::OptimizerSpec no_schedule;
  no_schedule.set_learning_rate(0.5f);
  EXPECT_EQ(LearningRateAt(no_schedule, 7), 0.5);
}

TEST(LrScheduleTest, StepDecayIsStaircase) {
  const auto s = Spec(0.5f, Schedule::STEP_DECAY, /*decay_steps=*/100, /*decay_rate=*/0.1f);
  ExpectLr(s, 0, 0.5);
  ExpectLr(s, 99, 0.5);
  ExpectLr(s, 100, 0.05);
  ExpectLr(s, 199, 0.05);
  ExpectLr(s, 200, 0.005);
  ExpectLr(s, 250, 0.005);
}

TEST(LrScheduleTest, ExponentialDecayIsSmooth) {
  const auto s = Spec(1.0f, Schedule::EXPONENTIAL_DECAY, 100, 0.5f);
  ExpectLr(s, 0, 1.0);
  ExpectLr(s, 50, std::sqrt(0.5));
  ExpectLr(s, 100, 0.5);
  ExpectLr(s, 150, 0.5 * std::sqrt(0.5));
  ExpectLr(s, 200, 0.25);
}

TEST(LrScheduleTest, CosineReachesAlphaAndStays) {
  const auto s = Spec(2.0f, Schedule::COSINE, 100, 0.0f, 0, /*alpha=*/0.1f);
  ExpectLr(s, 0, 2.0);
  // 2 * (0.1 + 0.9 * (1 + cos(pi / 4)) / 2)
  ExpectLr(s, 25, 2.0 * (0.1 + 0.9 * (1.0 + std::sqrt(0.5)) / 2.0));
  ExpectLr(s, 50, 2.0 * 0.55);
  ExpectLr(s, 100, 0.2);
  ExpectLr(s, 101, 0.2);
  ExpectLr(s, 100000, 0.2);
  const auto to_zero = Spec(2.0f, Schedule::COSINE, 100);
  ExpectLr(to_zero, 50, 1.0);
  EXPECT_NEAR(LearningRateAt(to_zero, 100), 0.0, 1e-15);
}

TEST(LrScheduleTest, CosineWithoutDecayStepsIsConstantAfterWarmup) {
  const auto s = Spec(1.0f, Schedule::COSINE, /*decay_steps=*/0, 0.0f,
                      /*warmup_steps=*/2, /*alpha=*/0.5f);
  ExpectLr(s, 0, 0.5);
  ExpectLr(s, 1, 1.0);
  ExpectLr(s, 2, 1.0);
  ExpectLr(s, 1000, 1.0);
}

TEST(LrScheduleTest, WarmupRampsLinearlyThenDecayStartsAtZero) {
  const auto constant = Spec(0.4f, Schedule::CONSTANT, 0, 0.0f, /*warmup_steps=*/4);
  ExpectLr(constant, 0, 0.1);
  ExpectLr(constant, 1, 0.2);
  ExpectLr(constant, 2, 0.3);
  ExpectLr(constant, 3, 0.4);
  ExpectLr(constant, 4, 0.4);
  ExpectLr(constant, -5, 0.1);  // Negative steps count as step 0.

  const auto step = Spec(1.0f, Schedule::STEP_DECAY, 100, 0.1f, /*warmup_steps=*/10);
  ExpectLr(step, 0, 0.1);
  ExpectLr(step, 9, 1.0);
  ExpectLr(step, 10, 1.0);
  ExpectLr(step, 109, 1.0);
  ExpectLr(step, 110, 0.1);

  const auto cosine = Spec(1.0f, Schedule::COSINE, 100, 0.0f, /*warmup_steps=*/10);
  ExpectLr(cosine, 4, 0.5);
  ExpectLr(cosine, 10, 1.0);
  ExpectLr(cosine, 60, 0.5);
  EXPECT_NEAR(LearningRateAt(cosine, 110), 0.0, 1e-15);
}

void ExpectInvalid(const v1::OptimizerSpec& spec, const std::string& message) {
  const absl::Status s = ValidateSchedule(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), message);
}

TEST(LrScheduleTest, ValidationAcceptsGoodSpecs) {
  EXPECT_TRUE(ValidateSchedule(v1::OptimizerSpec()).ok());
  EXPECT_TRUE(ValidateSchedule(Spec(0.1f, Schedule::STEP_DECAY, 100, 1.0f, 5)).ok());
  EXPECT_TRUE(ValidateSchedule(Spec(0.1f, Schedule::EXPONENTIAL_DECAY, 1, 0.01f)).ok());
  // COSINE's decay_steps 0 is filled in at job start; alpha 0 and 1 are fine.
  EXPECT_TRUE(ValidateSchedule(Spec(0.1f, Schedule::COSINE, 0, 0.0f, 0, 0.0f)).ok());
  EXPECT_TRUE(ValidateSchedule(Spec(0.1f, Schedule::COSINE, 10, 0.0f, 0, 1.0f)).ok());
  // A field the type does not read is not checked.
  EXPECT_TRUE(ValidateSchedule(Spec(0.1f, Schedule::CONSTANT, 0, 7.0f)).ok());
  v1::OptimizerSpec wd;
  wd.set_weight_decay(1e-4f);
  EXPECT_TRUE(ValidateSchedule(wd).ok());
}

TEST(LrScheduleTest, ValidationNamesTheField) {
  ExpectInvalid(Spec(0.1f, Schedule::STEP_DECAY, 0, 0.1f),
                "optimizer.schedule.decay_steps must be > 0 for STEP_DECAY, got 0");
  ExpectInvalid(Spec(0.1f, Schedule::EXPONENTIAL_DECAY, -3, 0.1f),
                "optimizer.schedule.decay_steps must be > 0 for EXPONENTIAL_DECAY, got -3");
  ExpectInvalid(Spec(0.1f, Schedule::STEP_DECAY, 10, 1.5f),
                "optimizer.schedule.decay_rate must be in (0, 1], got 1.5");
  ExpectInvalid(Spec(0.1f, Schedule::EXPONENTIAL_DECAY, 10, 0.0f),
                "optimizer.schedule.decay_rate must be in (0, 1], got 0");
  ExpectInvalid(Spec(0.1f, Schedule::CONSTANT, 0, 0.0f, -1),
                "optimizer.schedule.warmup_steps must be >= 0, got -1");
  ExpectInvalid(Spec(0.1f, Schedule::COSINE, 10, 0.0f, 0, 1.5f),
                "optimizer.schedule.alpha must be in [0, 1], got 1.5");
  ExpectInvalid(Spec(0.1f, Schedule::COSINE, 10, 0.0f, 0, -0.5f),
                "optimizer.schedule.alpha must be in [0, 1], got -0.5");
  ExpectInvalid(Spec(0.1f, Schedule::COSINE, -1),
                "optimizer.schedule.decay_steps must be >= 0 for COSINE, got -1");
  ExpectInvalid(Spec(0.1f, static_cast<Schedule::Type>(42)),
                "optimizer.schedule.type 42 is unknown");
  v1::OptimizerSpec wd;
  wd.set_weight_decay(-0.5f);
  ExpectInvalid(wd, "optimizer.weight_decay must be >= 0, got -0.5");
  wd.set_weight_decay(std::nanf(""));
  EXPECT_EQ(ValidateSchedule(wd).code(), absl::StatusCode::kInvalidArgument);
  wd.set_weight_decay(INFINITY);
  ExpectInvalid(wd, "optimizer.weight_decay must be finite, got inf");
}

}  // namespace
}  // namespace towerps::common
