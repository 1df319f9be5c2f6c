#include "ps/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/lr_schedule.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {
namespace {

std::unique_ptr<Optimizer> Make(const v1::OptimizerSpec& s, int64_t n) {
  auto o = NewOptimizer(s, n);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::move(o).value();
}

std::unique_ptr<Optimizer> Make(v1::OptimizerSpec::Type type, float lr, int64_t n,
                                bool nesterov = false, float weight_decay = 0.0f) {
  v1::OptimizerSpec s;
  s.set_type(type);
  s.set_learning_rate(lr);
  s.set_nesterov(nesterov);
  s.set_weight_decay(weight_decay);
  return Make(s, n);
}

TEST(OptimizerTest, SgdHandComputed) {
  auto o = Make(v1::OptimizerSpec::SGD, 0.1f, 3);
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  std::vector<float> g = {0.5f, 1.0f, -4.0f};
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(w[1], -2.1f);
  EXPECT_FLOAT_EQ(w[2], 0.9f);
  EXPECT_EQ(o->slot_bytes(), 0);
}

TEST(OptimizerTest, MomentumHandComputed) {
  auto o = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1);  // momentum 0.9
  std::vector<float> w = {1.0f};
  std::vector<float> g = {1.0f};
  o->Apply(absl::MakeSpan(w), g, 1);  // v = -0.1, w = 0.9
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  o->Apply(absl::MakeSpan(w), g, 2);  // v = -0.09 - 0.1 = -0.19, w = 0.71
  EXPECT_FLOAT_EQ(w[0], 0.71f);
  EXPECT_EQ(o->slot_bytes(), 4);
  auto n = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1, /*nesterov=*/true);
  std::vector<float> wn = {1.0f};
  n->Apply(absl::MakeSpan(wn), g, 1);  // v = -0.1; w += 0.9*-0.1 - 0.1 = -0.19
  EXPECT_FLOAT_EQ(wn[0], 0.81f);
}

TEST(OptimizerTest, AdamHandComputed) {
  auto o = Make(v1::OptimizerSpec::ADAM, 0.001f, 2);
  std::vector<float> w = {1.0f, 1.0f};
  std::vector<float> g = {0.2f, -3.0f};
  // Step 1: m = 0.1 g, v = 0.001 g^2, lr_t = 0.001 * sqrt(0.001) / 0.1,
  // update = lr_t * m / (sqrt(v) + 1e-7) = 0.001 * sign(g) (up to epsilon).
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_NEAR(w[0], 0.999f, 1e-6);
  EXPECT_NEAR(w[1], 1.001f, 1e-6);
  // Step 2 with the same gradient: m = 0.19 g, v = 0.001999 g^2,
  // lr_t = 0.001 * sqrt(1 - 0.999^2) / (1 - 0.81).
  o->Apply(absl::MakeSpan(w), g, 2);
  const double lr_t = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
  const double step0 = lr_t * 0.19 * 0.2 / (std::sqrt(0.001999 * 0.04) + 1e-7);
  EXPECT_NEAR(w[0], 0.999 - step0, 1e-6);
  EXPECT_EQ(o->slot_bytes(), 16);
}

TEST(OptimizerTest, DefaultsAndValidation) {
  v1::OptimizerSpec adam;
  adam.set_type(v1::OptimizerSpec::ADAM);
  auto d = OptimizerWithDefaults(adam);
  EXPECT_FLOAT_EQ(d.learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(d.epsilon(), 1e-7f);
  EXPECT_EQ(OptimizerWithDefaults(v1::OptimizerSpec()).type(), v1::OptimizerSpec::SGD);
  v1::OptimizerSpec bad;
  bad.set_learning_rate(-1.0f);
  auto s = ValidateOptimizer(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("learning_rate"), std::string::npos);
  v1::OptimizerSpec m;
  m.set_type(v1::OptimizerSpec::MOMENTUM);
  m.set_momentum(1.5f);
  EXPECT_NE(ValidateOptimizer(m).message().find("momentum"), std::string::npos);
  EXPECT_FALSE(NewOptimizer(bad, 3).ok());
}

TEST(OptimizerTest, SgdWeightDecayHandComputed) {
  auto o = Make(v1::OptimizerSpec::SGD, 0.1f, 3, false, /*weight_decay=*/0.5f);
  std::vector<float> w = {1.0f, -2.0f, 4.0f};
  std::vector<float> g = {0.5f, 1.0f, 0.0f};
  // g' = g + 0.5 w = {1, 0, 2}; w -= 0.1 g'.
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[1], -2.0f);
  EXPECT_FLOAT_EQ(w[2], 3.8f);
  EXPECT_EQ(o->slot_bytes(), 0);
}

TEST(OptimizerTest, SgdWeightDecaySpansSeveralScratchBlocks) {
  const int64_t n = 10007;  // Not a multiple of any block size.
  const float lr = 0.05f, wd = 0.01f;
  auto o = Make(v1::OptimizerSpec::SGD, lr, n, false, wd);
  std::vector<float> w(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = 0.001f * static_cast<float>(i) - 3.0f;
    g[i] = std::sin(static_cast<float>(i));
  }
  std::vector<float> want = w;
  for (int64_t i = 0; i < n; ++i) want[i] -= lr * (g[i] + wd * want[i]);
  o->Apply(absl::MakeSpan(w), g, 1);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(w[i], want[i], 1e-6) << i;
}

TEST(OptimizerTest, MomentumWeightDecayHandComputed) {
  auto o = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1, false, /*weight_decay=*/0.5f);
  std::vector<float> w = {1.0f};
  std::vector<float> g = {0.5f};
  o->Apply(absl::MakeSpan(w), g, 1);  // g' = 1, v = -0.1, w = 0.9
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  // g' = 0.5 + 0.45 = 0.95, v = -0.09 - 0.095 = -0.185, w = 0.715
  o->Apply(absl::MakeSpan(w), g, 2);
  EXPECT_FLOAT_EQ(w[0], 0.715f);
  auto n = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1, /*nesterov=*/true, 0.5f);
  std::vector<float> wn = {1.0f};
  n->Apply(absl::MakeSpan(wn), g, 1);  // g' = 1, v = -0.1, w += -0.09 - 0.1
  EXPECT_FLOAT_EQ(wn[0], 0.81f);
}

TEST(OptimizerTest, AdamWeightDecayHandComputed) {
  auto o = Make(v1::OptimizerSpec::ADAM, 0.001f, 2, false, /*weight_decay=*/0.1f);
  std::vector<float> w = {1.0f, -5.0f};
  std::vector<float> g = {0.1f, 0.3f};
  // g' = g + 0.1 w = {0.2, -0.2}: the decay flips the second sign, so the
  // first update is 0.001 * sign(g') (up to epsilon).
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_NEAR(w[0], 0.999f, 1e-6);
  EXPECT_NEAR(w[1], -4.999f, 1e-6);
  // Step 2: g' = {0.1 + 0.0999, 0.3 - 0.4999}.
  o->Apply(absl::MakeSpan(w), g, 2);
  const double lr_t = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
  const double g1[2] = {0.2, -0.2};
  const double g2[2] = {0.1 + 0.1 * 0.999, 0.3 + 0.1 * -4.999};
  const double w1[2] = {0.999, -4.999};
  for (int i = 0; i < 2; ++i) {
    const double m = 0.9 * 0.1 * g1[i] + 0.1 * g2[i];
    const double v = 0.999 * 0.001 * g1[i] * g1[i] + 0.001 * g2[i] * g2[i];
    EXPECT_NEAR(w[i], w1[i] - lr_t * m / (std::sqrt(v) + 1e-7), 2e-6) << i;
  }
}

TEST(OptimizerTest, SgdFollowsStepDecayAndWarmup) {
  v1::OptimizerSpec s;
  s.set_type(v1::OptimizerSpec::SGD);
  s.set_learning_rate(1.0f);
  s.mutable_schedule()->set_type(v1::LearningRateSchedule::STEP_DECAY);
  s.mutable_schedule()->set_decay_steps(2);
  s.mutable_schedule()->set_decay_rate(0.5f);
  auto o = Make(s, 1);
  std::vector<float> w = {0.0f};
  const std::vector<float> g = {1.0f};
  // Updates 1, 2 use lr 1 (schedule steps 0, 1); 3, 4 use 0.5; 5 uses 0.25.
  const float want[] = {-1.0f, -2.0f, -2.5f, -3.0f, -3.25f};
  for (int step = 1; step <= 5; ++step) {
    o->Apply(absl::MakeSpan(w), g, step);
    EXPECT_FLOAT_EQ(w[0], want[step - 1]) << "update " << step;
  }

  v1::OptimizerSpec warm;
  warm.set_learning_rate(0.4f);
  warm.mutable_schedule()->set_warmup_steps(4);
  auto ow = Make(warm, 1);
  w = {0.0f};
  float prev = 0.0f;
  for (int step = 1; step <= 5; ++step) {
    ow->Apply(absl::MakeSpan(w), g, step);
    EXPECT_FLOAT_EQ(prev - w[0], 0.1f * std::min(step, 4)) << "update " << step;
    EXPECT_FLOAT_EQ(prev - w[0], common::LearningRateAt(warm, step - 1));
    prev = w[0];
  }
}

// Adam's moments do not depend on the learning rate (without weight decay),
// so each update of a scheduled Adam is the constant one scaled by
// LearningRateAt(step - 1) / lr. Momentum (Keras form) takes the scheduled lr
// into the velocity: v = m*v - lr(step - 1)*g.
TEST(OptimizerTest, ScheduleDrivesMomentumAndAdam) {
  v1::OptimizerSpec adam;
  adam.set_type(v1::OptimizerSpec::ADAM);
  adam.set_learning_rate(0.01f);
  v1::OptimizerSpec adam_cosine = adam;
  adam_cosine.mutable_schedule()->set_type(v1::LearningRateSchedule::COSINE);
  adam_cosine.mutable_schedule()->set_decay_steps(4);
  adam_cosine.mutable_schedule()->set_warmup_steps(2);
  auto oc = Make(adam, 1);
  auto os = Make(adam_cosine, 1);
  std::vector<float> wc = {1.0f}, ws = {1.0f};
  for (int step = 1; step <= 8; ++step) {
    const std::vector<float> g = {0.3f + 0.1f * step};
    const float before_c = wc[0], before_s = ws[0];
    oc->Apply(absl::MakeSpan(wc), g, step);
    os->Apply(absl::MakeSpan(ws), g, step);
    const double scale = common::LearningRateAt(adam_cosine, step - 1) / 0.01;
    EXPECT_NEAR(ws[0] - before_s, scale * (wc[0] - before_c), 1e-7) << "update " << step;
  }
  // Past the end of the cosine (alpha 0) Adam stops moving.
  EXPECT_EQ(common::LearningRateAt(adam_cosine, 7), 0.0);

  v1::OptimizerSpec mom;
  mom.set_type(v1::OptimizerSpec::MOMENTUM);
  mom.set_learning_rate(0.1f);
  mom.mutable_schedule()->set_type(v1::LearningRateSchedule::STEP_DECAY);
  mom.mutable_schedule()->set_decay_steps(2);
  mom.mutable_schedule()->set_decay_rate(0.5f);
  auto om = Make(mom, 1);
  std::vector<float> w = {1.0f};
  const std::vector<float> g = {1.0f};
  // lr per update: 0.1, 0.1, 0.05, 0.05, 0.025; v = 0.9 v - lr; w += v.
  double v_want = 0.0, w_want = 1.0;
  const double lrs[] = {0.1, 0.1, 0.05, 0.05, 0.025};
  for (int step = 1; step <= 5; ++step) {
    om->Apply(absl::MakeSpan(w), g, step);
    v_want = 0.9 * v_want - lrs[step - 1];
    w_want += v_want;
    EXPECT_NEAR(w[0], w_want, 1e-6) << "update " << step;
    EXPECT_NEAR(om->Slots()[0].second[0], v_want, 1e-6) << "update " << step;
  }
}

TEST(OptimizerTest, SlotsNamesAndSizes) {
  auto sgd = Make(v1::OptimizerSpec::SGD, 0.1f, 5, false, 0.1f);
  EXPECT_TRUE(sgd->Slots().empty());

  auto mom = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 5);
  auto slots = mom->Slots();
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].first, "velocity");
  EXPECT_EQ(slots[0].second.size(), 5u);
  std::vector<float> w(5, 0.0f), g(5, 2.0f);
  mom->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_FLOAT_EQ(mom->Slots()[0].second[3], -0.2f);  // v = -lr * g

  auto adam = Make(v1::OptimizerSpec::ADAM, 0.1f, 7);
  slots = adam->Slots();
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].first, "m");
  EXPECT_EQ(slots[1].first, "v");
  EXPECT_EQ(slots[0].second.size(), 7u);
  EXPECT_EQ(slots[1].second.size(), 7u);
  int64_t bytes = 0;
  for (const auto& [name, span] : slots) bytes += span.size() * sizeof(float);
  EXPECT_EQ(bytes, adam->slot_bytes());
}

// A checkpoint being written keeps its view of the slots when an update
// comes (ParameterServer::Save): DetachSlots hands over the very buffers the
// earlier spans view, and the optimizer continues on copies exactly as it
// would have on the originals.
TEST(OptimizerTest, DetachedSlotsKeepTheirValuesAndTheRuleContinuesTheSame) {
  for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::MOMENTUM,
                    v1::OptimizerSpec::ADAM}) {
    SCOPED_TRACE(v1::OptimizerSpec::Type_Name(type));
    auto a = Make(type, 0.1f, 9), b = Make(type, 0.1f, 9);
    std::vector<float> wa(9, 1.0f), wb(9, 1.0f), g(9);
    for (int i = 0; i < 9; ++i) g[i] = 0.25f * static_cast<float>(i - 4);
    a->Apply(absl::MakeSpan(wa), g, 1);
    b->Apply(absl::MakeSpan(wb), g, 1);
    const auto viewed = a->Slots();  // what a save would be writing
    std::vector<std::vector<float>> at_step_1;
    for (const auto& [name, span] : viewed) at_step_1.emplace_back(span.begin(), span.end());
    std::vector<std::vector<float>> detached = a->DetachSlots();
    ASSERT_EQ(detached.size(), viewed.size());
    for (size_t k = 0; k < detached.size(); ++k) {
      EXPECT_EQ(detached[k].data(), viewed[k].second.data()) << "the same memory";
    }
    a->Apply(absl::MakeSpan(wa), g, 2);
    b->Apply(absl::MakeSpan(wb), g, 2);
    for (size_t k = 0; k < viewed.size(); ++k) {
      EXPECT_EQ(std::vector<float>(viewed[k].second.begin(), viewed[k].second.end()),
                at_step_1[k])
          << "the view changed with the update";
    }
    EXPECT_EQ(wa, wb);
    const auto now_a = a->Slots(), now_b = b->Slots();
    for (size_t k = 0; k < now_a.size(); ++k) {
      EXPECT_EQ(std::vector<float>(now_a[k].second.begin(), now_a[k].second.end()),
                std::vector<float>(now_b[k].second.begin(), now_b[k].second.end()));
    }
  }
}

// A checkpoint is the value, the slots and the step: a fresh optimizer with
// them restored must continue bit for bit like the original.
TEST(OptimizerTest, RestoredSlotsContinueBitIdentically) {
  for (auto type : {v1::OptimizerSpec::MOMENTUM, v1::OptimizerSpec::ADAM}) {
    for (bool nesterov : {false, true}) {
      SCOPED_TRACE(v1::OptimizerSpec::Type_Name(type) +
                   (nesterov ? " nesterov" : ""));
      v1::OptimizerSpec spec;
      spec.set_type(type);
      spec.set_nesterov(nesterov);
      spec.set_weight_decay(1e-3f);
      spec.mutable_schedule()->set_type(v1::LearningRateSchedule::EXPONENTIAL_DECAY);
      spec.mutable_schedule()->set_decay_steps(3);
      spec.mutable_schedule()->set_decay_rate(0.7f);
      spec.mutable_schedule()->set_warmup_steps(2);
      const int64_t n = 33;
      std::mt19937 rng(7);
      std::normal_distribution<float> normal;
      auto gradient = [&] {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        return g;
      };
      auto original = Make(spec, n);
      std::vector<float> w(n);
      for (float& x : w) x = normal(rng);
      int64_t step = 0;
      for (; step < 5; ++step) original->Apply(absl::MakeSpan(w), gradient(), step + 1);

      // Save.
      std::vector<std::vector<float>> saved;
      for (const auto& [name, span] : original->Slots()) {
        saved.emplace_back(span.begin(), span.end());
      }
      std::vector<float> w_restored = w;
      // Restore into a fresh optimizer.
      auto restored = Make(spec, n);
      auto slots = restored->Slots();
      ASSERT_EQ(slots.size(), saved.size());
      for (size_t i = 0; i < slots.size(); ++i) {
        ASSERT_EQ(slots[i].second.size(), saved[i].size());
        std::copy(saved[i].begin(), saved[i].end(), slots[i].second.begin());
      }
      for (; step < 10; ++step) {
        const std::vector<float> g = gradient();
        original->Apply(absl::MakeSpan(w), g, step + 1);
        restored->Apply(absl::MakeSpan(w_restored), g, step + 1);
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(w[i], w_restored[i]) << i;  // Exact: bit-identical.
      }
      auto a = original->Slots(), b = restored->Slots();
      for (size_t s = 0; s < a.size(); ++s) {
        EXPECT_TRUE(std::equal(a[s].second.begin(), a[s].second.end(),
                               b[s].second.begin()))
            << a[s].first;
      }
    }
  }
}

// ApplyAndCopy leaves the values and slots of Apply, bit for bit, and the
// same values in each copy, for every rule (momentum and Adam copy in their
// own pass, block by block; SGD block by block; the moving average after
// it), over steps with no copy and with one, two and three, of a variable
// of several of the rules' blocks and a partial one.
TEST(OptimizerTest, ApplyAndCopyIsApplyBitForBitWithTheValuesCopied) {
  const int64_t n = 2 * Optimizer::kApplyBlock + 77;
  struct Rule {
    std::string name;
    std::function<std::unique_ptr<Optimizer>()> make;
  };
  std::vector<Rule> rules;
  for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::MOMENTUM,
                    v1::OptimizerSpec::ADAM}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && type != v1::OptimizerSpec::MOMENTUM) continue;
      rules.push_back({v1::OptimizerSpec::Type_Name(type) + (nesterov ? " nesterov" : ""),
                       [=] { return Make(type, 0.01f, n, nesterov, 1e-3f); }});
    }
  }
  rules.push_back({"SGD without weight decay",
                   [=] { return Make(v1::OptimizerSpec::SGD, 0.01f, n, false, 0.0f); }});
  v1::VariableDef average;
  average.set_name("bn/moving_mean");
  average.set_update(v1::VariableDef::MOVING_AVERAGE);
  average.set_moving_average_decay(0.9f);
  rules.push_back({"moving average", [&] {
                     auto o = NewVariableUpdater(average, v1::OptimizerSpec(), n);
                     EXPECT_TRUE(o.ok()) << o.status();
                     return std::move(o).value();
                   }});
  for (const Rule& rule : rules) {
    SCOPED_TRACE(rule.name);
    std::unique_ptr<Optimizer> plain = rule.make(), copying = rule.make();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> a(n);
    for (float& x : a) x = normal(rng);
    std::vector<float> b = a;
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      std::vector<std::vector<float>> copies(step - 1, std::vector<float>(n, -1.0f));
      std::vector<float*> to;
      for (auto& c : copies) to.push_back(c.data());
      plain->Apply(absl::MakeSpan(a), g, step);
      copying->ApplyAndCopy(absl::MakeSpan(b), g, step, to);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "step " << step;
      for (size_t c = 0; c < copies.size(); ++c) {
        ASSERT_EQ(0, std::memcmp(a.data(), copies[c].data(), n * sizeof(float)))
            << "step " << step << ", copy " << c;
      }
    }
    auto sa = plain->Slots(), sb = copying->Slots();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k) {
      EXPECT_EQ(0, std::memcmp(sa[k].second.data(), sb[k].second.data(), n * sizeof(float)))
          << sa[k].first;
    }
  }
}

// The updates ahead (ParameterServer) form a step's new values and slots out
// of place, in ranges cut at kApplyBlock, while the gradient arrives; then
// the slots are adopted. That must be Apply, bit for bit, step after step,
// whether the new values go over the gradient or apart, and leave the
// optimizer as it was until AdoptSlots.
TEST(OptimizerTest, ApplyIntoInRangesThenAdoptSlotsIsApplyBitForBit) {
  const int64_t n = 3 * Optimizer::kApplyBlock + 77;
  struct Rule {
    std::string name;
    std::function<std::unique_ptr<Optimizer>()> make;
    int slots;
  };
  std::vector<Rule> rules;
  for (auto type : {v1::OptimizerSpec::SGD, v1::OptimizerSpec::MOMENTUM,
                    v1::OptimizerSpec::ADAM}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && type != v1::OptimizerSpec::MOMENTUM) continue;
      for (float wd : {0.0f, 1e-3f}) {
        rules.push_back({v1::OptimizerSpec::Type_Name(type) + (nesterov ? " nesterov" : "") +
                             (wd > 0 ? " decay" : ""),
                         [=] { return Make(type, 0.01f, n, nesterov, wd); },
                         type == v1::OptimizerSpec::ADAM       ? 2
                         : type == v1::OptimizerSpec::MOMENTUM ? 1
                                                               : 0});
      }
    }
  }
  for (const Rule& rule : rules) {
    SCOPED_TRACE(rule.name);
    std::unique_ptr<Optimizer> plain = rule.make(), ahead = rule.make();
    ASSERT_TRUE(ahead->CanApplyInto());
    ASSERT_EQ(rule.slots, ahead->num_slots());
    std::mt19937 rng(13);
    std::normal_distribution<float> normal;
    std::vector<float> a(n);
    for (float& x : a) x = normal(rng);
    std::vector<float> b = a;
    std::vector<std::vector<float>> staged(rule.slots, std::vector<float>(n, -7.0f));
    for (int64_t step = 1; step <= 5; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      // Odd steps: over the gradient; even steps: apart.
      const bool over_grad = step % 2 == 1;
      std::vector<float> formed = over_grad ? g : std::vector<float>(n, -5.0f);
      std::vector<float*> slots_out;
      for (auto& s : staged) slots_out.push_back(s.data());
      std::vector<std::vector<float>> before;
      for (const auto& [name, slot] : ahead->Slots()) before.emplace_back(slot.begin(), slot.end());
      // Ranges of 1, 2 and the rest of the blocks.
      const int64_t cuts[] = {0, Optimizer::kApplyBlock, 3 * Optimizer::kApplyBlock, n};
      for (int r = 0; r < 3; ++r) {
        const int64_t first = cuts[r], k = cuts[r + 1] - cuts[r];
        ahead->ApplyInto(first, absl::MakeConstSpan(b).subspan(first, k),
                         absl::MakeConstSpan(over_grad ? formed : g).subspan(first, k),
                         absl::MakeSpan(formed).subspan(first, k), step, slots_out);
      }
      auto now = ahead->Slots();
      for (size_t k = 0; k < now.size(); ++k) {
        ASSERT_EQ(0, std::memcmp(before[k].data(), now[k].second.data(), n * sizeof(float)))
            << "ApplyInto changed slot " << now[k].first;
      }
      ahead->AdoptSlots(&staged);
      b = formed;
      plain->Apply(absl::MakeSpan(a), g, step);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "step " << step;
      auto sa = plain->Slots(), sb = ahead->Slots();
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t k = 0; k < sa.size(); ++k) {
        ASSERT_EQ(0, std::memcmp(sa[k].second.data(), sb[k].second.data(), n * sizeof(float)))
            << "step " << step << ", slot " << sa[k].first;
      }
    }
  }
}

// Momentum's and Adam's loops run in either instruction set (UpdateLoops)
// with the same bits: Apply, ApplyAndCopy and ApplyInto, several steps, over
// a length with a tail no vector fills and values over many magnitudes.
TEST(OptimizerTest, EveryUpdateLoopsGivesTheSameBits) {
  const UpdateLoops was = ActiveUpdateLoops();
  absl::Cleanup restore = [was] { ASSERT_TRUE(SetUpdateLoops(was).ok()); };
  std::vector<UpdateLoops> all = {UpdateLoops::kBaseline};
  const absl::Status avx2 = SetUpdateLoops(UpdateLoops::kAvx2);
  if (avx2.ok()) {
    all.push_back(UpdateLoops::kAvx2);
    EXPECT_EQ(ActiveUpdateLoops(), UpdateLoops::kAvx2);
  } else {
    EXPECT_EQ(avx2.code(), absl::StatusCode::kFailedPrecondition) << avx2;
    EXPECT_EQ(ActiveUpdateLoops(), was);
  }
  const int64_t n = 2 * Optimizer::kApplyBlock + 77;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-20, 6);
  auto draw = [&] {
    std::vector<float> x(n);
    for (float& v : x) v = std::ldexp(normal(rng), exponent(rng));
    return x;
  };
  const std::vector<float> w0 = draw();
  std::vector<std::vector<float>> grads;
  for (int step = 0; step < 4; ++step) grads.push_back(draw());
  for (auto type : {v1::OptimizerSpec::MOMENTUM, v1::OptimizerSpec::ADAM}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && type != v1::OptimizerSpec::MOMENTUM) continue;
      for (float wd : {0.0f, 1e-3f}) {
        SCOPED_TRACE(v1::OptimizerSpec::Type_Name(type) + (nesterov ? " nesterov" : "") +
                     (wd > 0 ? " decay" : ""));
        // Per instruction set: the values of Apply, of ApplyAndCopy and its
        // copy, of ApplyInto, then every slot of each.
        std::vector<std::vector<std::vector<float>>> results;
        for (UpdateLoops loops : all) {
          ASSERT_TRUE(SetUpdateLoops(loops).ok());
          auto plain = Make(type, 0.01f, n, nesterov, wd);
          auto copying = Make(type, 0.01f, n, nesterov, wd);
          auto ahead = Make(type, 0.01f, n, nesterov, wd);
          std::vector<float> a = w0, b = w0, c = w0, copy(n);
          for (int64_t step = 1; step <= 4; ++step) {
            const std::vector<float>& g = grads[step - 1];
            plain->Apply(absl::MakeSpan(a), g, step);
            copying->ApplyAndCopy(absl::MakeSpan(b), g, step, {copy.data()});
            std::vector<std::vector<float>> staged(ahead->num_slots(), std::vector<float>(n));
            std::vector<float*> slots_out;
            for (auto& st : staged) slots_out.push_back(st.data());
            std::vector<float> formed(n);
            ahead->ApplyInto(0, c, g, absl::MakeSpan(formed), step, slots_out);
            ahead->AdoptSlots(&staged);
            c = formed;
          }
          std::vector<std::vector<float>> r = {a, b, copy, c};
          for (Optimizer* o : {plain.get(), copying.get(), ahead.get()}) {
            for (const auto& [name, slot] : o->Slots()) r.emplace_back(slot.begin(), slot.end());
          }
          results.push_back(std::move(r));
        }
        const size_t slots = type == v1::OptimizerSpec::ADAM ? 2 : 1;
        for (size_t l = 0; l < results.size(); ++l) {
          const auto& r = results[l];
          ASSERT_EQ(r.size(), 4 + 3 * slots);
          // Within one instruction set, the three paths agree: values (and
          // the copy), and each slot.
          for (size_t k = 0; k < r.size(); ++k) {
            const std::vector<float>& want = k < 4 ? r[0] : r[4 + (k - 4) % slots];
            EXPECT_EQ(0, std::memcmp(want.data(), r[k].data(), n * sizeof(float)))
                << UpdateLoopsName(all[l]) << ", result " << k;
          }
          // And every set with the baseline.
          for (size_t k = 0; k < r.size(); ++k) {
            EXPECT_EQ(0, std::memcmp(results[0][k].data(), r[k].data(), n * sizeof(float)))
                << UpdateLoopsName(all[l]) << " against the baseline, result " << k;
          }
        }
      }
    }
  }
}

TEST(OptimizerTest, ValidatesWeightDecayAndSchedule) {
  v1::OptimizerSpec wd;
  wd.set_weight_decay(-0.1f);
  auto s = ValidateOptimizer(wd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "optimizer.weight_decay must be >= 0, got -0.1");
  EXPECT_EQ(NewOptimizer(wd, 3).status().code(), absl::StatusCode::kInvalidArgument);

  v1::OptimizerSpec sched;
  sched.set_type(v1::OptimizerSpec::ADAM);
  sched.mutable_schedule()->set_type(v1::LearningRateSchedule::STEP_DECAY);
  sched.mutable_schedule()->set_decay_rate(0.5f);
  s = ValidateOptimizer(sched);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "optimizer.schedule.decay_steps must be > 0 for STEP_DECAY, got 0");

  v1::OptimizerSpec cosine;
  cosine.mutable_schedule()->set_type(v1::LearningRateSchedule::COSINE);
  cosine.set_weight_decay(1e-4f);
  EXPECT_TRUE(ValidateOptimizer(cosine).ok());
}

// Batch norm's moving statistics (VariableDef.update = MOVING_AVERAGE).

v1::VariableDef MovingDef(float decay, const std::string& name = "bn/moving_mean") {
  v1::VariableDef def;
  def.set_name(name);
  def.set_dtype(v1::DT_FLOAT32);
  def.set_update(v1::VariableDef::MOVING_AVERAGE);
  def.set_moving_average_decay(decay);
  return def;
}

std::unique_ptr<Optimizer> MakeMoving(float decay, int64_t n,
                                      const v1::OptimizerSpec& spec = v1::OptimizerSpec()) {
  auto o = NewVariableUpdater(MovingDef(decay), spec, n);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? std::move(o).value() : nullptr;
}

// |got - want| within a few float roundings of the terms d * w and
// (1 - d) * p: the rule is two products and a sum (and 1 - d rounded to
// float when d < 0.5), each within half an ulp.
void ExpectMovingAverage(float got, double w, double p, float decay, const std::string& what) {
  const double d = decay;
  const double want = d * w + (1.0 - d) * p;
  const double tol =
      4 * std::numeric_limits<float>::epsilon() * (std::abs(d * w) + std::abs((1.0 - d) * p));
  EXPECT_NEAR(got, want, tol) << what << ": w " << w << ", pushed " << p << ", decay " << decay;
}

TEST(MovingAverageTest, HandComputedExact) {
  // Every number here is exact in float: 0.75 * 4 + 0.25 * 8 = 5.
  auto o = MakeMoving(0.75f, 3);
  std::vector<float> w = {4.0f, -2.0f, 0.0f};
  o->Apply(absl::MakeSpan(w), std::vector<float>{8.0f, 2.0f, -16.0f}, 1);
  EXPECT_EQ(w, (std::vector<float>{5.0f, -1.0f, -4.0f}));
}

TEST(MovingAverageTest, FollowsTheRuleOverManyStepsAndMagnitudes) {
  const int64_t n = 1031;  // Past any BLAS unrolling, not a multiple of it.
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  for (float decay : {0.99f, 0.9f, 0.5f, 0.3f, 1e-3f}) {
    auto o = MakeMoving(decay, n);
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = std::ldexp(normal(rng), static_cast<int>(i % 41) - 20);
    for (int step = 1; step <= 5; ++step) {
      std::vector<float> p(n);
      for (int64_t i = 0; i < n; ++i) p[i] = std::ldexp(normal(rng), static_cast<int>(i % 37) - 18);
      const std::vector<float> before = w;
      o->Apply(absl::MakeSpan(w), p, step);
      for (int64_t i = 0; i < n; ++i) {
        ExpectMovingAverage(w[i], before[i], p[i], decay,
                            "element " + std::to_string(i) + " step " + std::to_string(step));
        if (HasFailure()) return;
      }
    }
  }
}

TEST(MovingAverageTest, DecayZeroGivesExactlyThePushedValue) {
  auto o = MakeMoving(0.0f, 6);
  std::vector<float> w = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<float> p = {-0.0f, std::numeric_limits<float>::denorm_min(), 3e38f, -1e-30f,
                                0.1f, 7.0f};
  o->Apply(absl::MakeSpan(w), p, 1);
  EXPECT_EQ(std::memcmp(w.data(), p.data(), sizeof(float) * p.size()), 0);  // Bit for bit.
  EXPECT_TRUE(std::signbit(w[0]));
}

// The job's optimizer settings (learning rate, its schedule, weight decay,
// momentum) do not touch a moving statistic, and neither does the step.
TEST(MovingAverageTest, IgnoresLearningRateWeightDecayScheduleAndStep) {
  v1::OptimizerSpec spec;
  spec.set_type(v1::OptimizerSpec::MOMENTUM);
  spec.set_learning_rate(3.0f);
  spec.set_weight_decay(0.5f);
  spec.mutable_schedule()->set_type(v1::LearningRateSchedule::STEP_DECAY);
  spec.mutable_schedule()->set_decay_steps(1);
  spec.mutable_schedule()->set_decay_rate(0.5f);
  auto with_spec = MakeMoving(0.9f, 4, spec);
  auto plain = MakeMoving(0.9f, 4);
  std::vector<float> a = {1.0f, -3.0f, 10.0f, 0.5f}, b = a;
  const std::vector<float> p = {2.0f, 2.0f, -1.0f, 0.25f};
  with_spec->Apply(absl::MakeSpan(a), p, 1000);
  plain->Apply(absl::MakeSpan(b), p, 1);
  EXPECT_EQ(a, b);
  for (int i = 0; i < 4; ++i) {
    ExpectMovingAverage(a[i], i == 0 ? 1.0 : i == 1 ? -3.0 : i == 2 ? 10.0 : 0.5, p[i], 0.9f,
                        "element " + std::to_string(i));
  }
}

TEST(MovingAverageTest, HasNoSlots) {
  auto o = MakeMoving(0.99f, 128);
  EXPECT_TRUE(o->Slots().empty());
  EXPECT_EQ(o->slot_bytes(), 0);
}

TEST(MovingAverageTest, OptimizerVariablesGetTheJobsOptimizer) {
  v1::VariableDef def;
  def.set_name("dense/kernel");
  v1::OptimizerSpec spec;
  spec.set_type(v1::OptimizerSpec::ADAM);
  auto o = NewVariableUpdater(def, spec, 5);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ((*o)->Slots().size(), 2u);  // Adam's m and v.
  EXPECT_EQ((*o)->slot_bytes(), 2 * 5 * 4);
  // SGD with lr 0.1: w - 0.1 g (not the moving average).
  spec.set_type(v1::OptimizerSpec::SGD);
  spec.set_learning_rate(0.1f);
  auto sgd = NewVariableUpdater(def, spec, 1);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  std::vector<float> w = {1.0f};
  (*sgd)->Apply(absl::MakeSpan(w), std::vector<float>{2.0f}, 1);
  EXPECT_FLOAT_EQ(w[0], 0.8f);
}

TEST(MovingAverageTest, BadDefinitionsAreInvalidArgumentNamingVariableAndField) {
  auto expect_bad = [](const v1::VariableDef& def, const std::string& field) {
    const absl::Status s = ValidateVariableUpdate(def);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("\"" + def.name() + "\""), std::string::npos) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
    EXPECT_EQ(NewVariableUpdater(def, v1::OptimizerSpec(), 3).status().code(),
              absl::StatusCode::kInvalidArgument);
  };
  expect_bad(MovingDef(1.0f, "bn1/mean"), "moving_average_decay");
  expect_bad(MovingDef(-0.1f, "bn2/var"), "moving_average_decay");
  expect_bad(MovingDef(std::numeric_limits<float>::quiet_NaN(), "bn3/mean"),
             "moving_average_decay");
  expect_bad(MovingDef(std::numeric_limits<float>::infinity(), "bn4/mean"),
             "moving_average_decay");
  expect_bad(MovingDef(1.5f, "bn5/mean"), "moving_average_decay");
  v1::VariableDef unknown = MovingDef(0.9f, "bn6/mean");
  unknown.set_update(static_cast<v1::VariableDef::Update>(7));
  expect_bad(unknown, "update = 7");
  v1::VariableDef trained_with_decay = MovingDef(0.9f, "dense/bias");
  trained_with_decay.set_update(v1::VariableDef::OPTIMIZER);
  expect_bad(trained_with_decay, "moving_average_decay");

  EXPECT_TRUE(ValidateVariableUpdate(MovingDef(0.0f)).ok());
  EXPECT_TRUE(ValidateVariableUpdate(MovingDef(std::nextafter(1.0f, 0.0f))).ok());
  EXPECT_TRUE(ValidateVariableUpdate(v1::VariableDef()).ok());
}


// The overflow guard's bounds (Optimizer::BoundStep) hold for what each
// rule leaves in the values and slots, over magnitudes from 1e-3 to 1e30,
// with the largest value, slot and gradient on one element and signs that
// add up there (the worst case): nothing measured afterwards is above its
// bound. Where the values, slots and gradients are of training's usual
// sizes, the bound is safe (the guard's fast path); from bounds that are
// not known, nothing is claimed.
TEST(OptimizerTest, BoundStepBoundsWhatEachRuleLeaves) {
  const int64_t n = 1000;
  struct Rule {
    std::string name;
    std::function<std::unique_ptr<Optimizer>()> make;
  };
  std::vector<Rule> rules;
  for (float wd : {0.0f, 0.01f}) {
    const std::string decay = wd > 0.0f ? " with weight decay" : "";
    rules.push_back(
        {"SGD" + decay, [=] { return Make(v1::OptimizerSpec::SGD, 0.5f, n, false, wd); }});
    for (bool nesterov : {false, true}) {
      rules.push_back({(nesterov ? "Nesterov" : "momentum") + decay, [=] {
                         return Make(v1::OptimizerSpec::MOMENTUM, 0.5f, n, nesterov, wd);
                       }});
    }
    rules.push_back(
        {"Adam" + decay, [=] { return Make(v1::OptimizerSpec::ADAM, 0.01f, n, false, wd); }});
  }
  for (float d : {0.0f, 0.9f}) {
    rules.push_back({"moving average " + std::to_string(d), [=] { return MakeMoving(d, n); }});
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  int safe_cases = 0;
  for (const Rule& rule : rules) {
    for (double scale_w : {1e-3, 1.0, 1e10, 1e30}) {
      for (double scale_g : {1e-3, 1.0, 1e15}) {
        for (double scale_s : {0.0, 1e-2, 1e12}) {
          SCOPED_TRACE(rule.name + ", values " + std::to_string(scale_w) + ", gradients " +
                       std::to_string(scale_g) + ", slots " + std::to_string(scale_s));
          std::unique_ptr<Optimizer> o = rule.make();
          std::vector<float> w(n), g(n);
          for (int64_t i = 0; i < n; ++i) {
            w[i] = static_cast<float>(scale_w * unit(rng));
            g[i] = static_cast<float>(scale_g * unit(rng));
          }
          auto slots = o->Slots();
          for (size_t k = 0; k < slots.size(); ++k) {
            absl::Span<float> slot = slots[k].second;
            // Adam's v (its second slot) is never negative.
            for (float& x : slot) {
              x = static_cast<float>(scale_s * (k == 1 ? std::abs(unit(rng)) : unit(rng)));
            }
            slot[0] = static_cast<float>(scale_s);
            slot[1] = static_cast<float>(k == 1 ? scale_s : -scale_s);
          }
          w[0] = w[1] = static_cast<float>(scale_w);
          g[0] = g[1] = static_cast<float>(-scale_g);
          for (int64_t step = 1; step <= 3; ++step) {
            const MagnitudeBounds before = MeasureBounds(w, *o);
            double abs_sum = 0.0;
            for (float x : g) abs_sum += std::abs(x);
            MagnitudeBounds after;
            const double peak = o->BoundStep(before, abs_sum, step, &after);
            o->Apply(absl::MakeSpan(w), g, step);
            if (!(peak < kSafeMagnitude)) break;  // the guard would check instead
            ++safe_cases;
            const MagnitudeBounds measured = MeasureBounds(w, *o);
            EXPECT_LE(measured.value, after.value) << "step " << step;
            EXPECT_LE(after.value, peak) << "step " << step;
            for (size_t k = 0; k < o->Slots().size(); ++k) {
              EXPECT_LE(measured.slots[k], after.slots[k]) << "slot " << k << ", step " << step;
              EXPECT_LE(after.slots[k], peak) << "slot " << k << ", step " << step;
            }
            if (scale_w <= 1.0 && scale_g <= 1.0 && scale_s <= 1e-2) {
              EXPECT_LT(peak, 1e20) << "step " << step;  // far from the guard's slow path
            }
            if (HasFailure()) return;
          }
          MagnitudeBounds unknown_after;
          EXPECT_FALSE(o->BoundStep(MagnitudeBounds(), 1.0, 1, &unknown_after) < kSafeMagnitude);
          EXPECT_FALSE(std::isfinite(unknown_after.value));
        }
      }
    }
  }
  EXPECT_GT(safe_cases, 200);
}

// MaxAbs and MeasureBounds: the exact largest magnitudes, infinity kept.
TEST(OptimizerTest, MeasureBoundsIsTheLargestMagnitude) {
  const std::vector<float> x = {1.0f, -7.5f, 3.0f, 7.0f};
  EXPECT_EQ(MaxAbs(x.data(), 4), 7.5);
  EXPECT_EQ(MaxAbs(x.data(), 0), 0.0);
  const std::vector<float> inf = {1.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(MaxAbs(inf.data(), 2), std::numeric_limits<double>::infinity());
  auto adam = Make(v1::OptimizerSpec::ADAM, 0.01f, 4);
  adam->Slots()[0].second[2] = -5.0f;
  adam->Slots()[1].second[3] = 0.25f;
  const MagnitudeBounds b = MeasureBounds(x, *adam);
  EXPECT_EQ(b.value, 7.5);
  EXPECT_EQ(b.slots[0], 5.0);
  EXPECT_EQ(b.slots[1], 0.25);
}

}  // namespace
}  // namespace towerps::ps
