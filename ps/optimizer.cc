#include "ps/optimizer.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/lr_schedule.h"
#include "common/optimizer_spec.h"
#include "common/status.h"
#include "ps/update_loops.h"

namespace towerps::ps {

using common::OptimizerWithDefaults;
using common::ValidateOptimizer;

void SetMathThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

namespace {

// Moves `slot`'s buffer out and leaves a copy of it in its place.
std::vector<float> Detach(std::vector<float>& slot) {
  std::vector<float> old = std::move(slot);
  slot.assign(old.begin(), old.end());
  return old;
}

// Copies elements [i, i + k) of `value` to each of `copies`.
void CopyBlock(const float* value, int64_t i, int64_t k, absl::Span<float* const> copies) {
  for (float* copy : copies) {
    std::memcpy(copy + i, value + i, static_cast<size_t>(k) * sizeof(float));
  }
}

// Runs an element-wise update `pass(copying, b, e, copy)` over the `n`
// elements of the values `w`: in one pass with no copies; else a block of
// Optimizer::kApplyBlock at a time, the pass storing each new value to the
// first copy as well (copying: std::true_type), the other copies taken
// from the block while in cache. Element-wise, so the blocks change no bit.
template <typename Pass>
void CopiedPasses(const float* w, size_t n, absl::Span<float* const> copies, Pass pass) {
  const int64_t size = static_cast<int64_t>(n);
  if (copies.empty()) {
    pass(std::false_type(), 0, size, nullptr);
    return;
  }
  for (int64_t b = 0; b < size; b += Optimizer::kApplyBlock) {
    const int64_t e = std::min(size, b + Optimizer::kApplyBlock);
    pass(std::true_type(), b, e, copies[0]);
    CopyBlock(w, b, e - b, copies.subspan(1));
  }
}

// ApplyInto's loop for a rule that forms `n` elements with `form(b, k,
// formed)` (elements [b, b + k) of the range into `formed`): a block of
// Optimizer::kApplyBlock at a time into scratch in L1, then to `out`, so
// that no pointer the rule writes aliases one it reads (`out` may be the
// gradient) and its loop is vectorized.
template <typename Form>
void FormOutOfPlace(int64_t n, float* out, Form form) {
  float formed[Optimizer::kApplyBlock];
  for (int64_t b = 0; b < n; b += Optimizer::kApplyBlock) {
    const int64_t k = std::min(Optimizer::kApplyBlock, n - b);
    form(b, k, formed);
    std::memcpy(out + b, formed, static_cast<size_t>(k) * sizeof(float));
  }
}

// The learning rate of the update numbered `step` (1-based).
double StepLearningRate(const v1::OptimizerSpec& spec, int64_t step) {
  return common::LearningRateAt(spec, step - 1);
}

// The overflow guard's arithmetic (Optimizer::BoundStep), in double: `x`
// raised past any rounding of the few float operations it bounds (each is
// off by at most 2^-24 of its result, or 2^-149 near zero).
double Up(double x) { return x * (1.0 + 1e-5) + 1e-30; }

// Whether the bounds an update starts from are all known: the values',
// the first `slots` slots' and the gradient's. Otherwise BoundStep can
// tell nothing (and 0 * inf would make a NaN of it).
bool Known(const MagnitudeBounds& b, int slots, double grad_abs_sum) {
  bool known = std::isfinite(b.value) && std::isfinite(grad_abs_sum);
  for (int i = 0; i < slots; ++i) known = known && std::isfinite(b.slots[i]);
  return known;
}

// BoundStep's bound on the gradient every rule uses, g + wd * w.
double DecayedGradientBound(double grad_abs_sum, float weight_decay,
                            const MagnitudeBounds& before) {
  return Up(grad_abs_sum + Up(std::abs(weight_decay) * before.value));
}

// |The float learning rate the rules use for update `step`|.
double FloatRate(const v1::OptimizerSpec& spec, int64_t step) {
  return std::abs(static_cast<double>(static_cast<float>(StepLearningRate(spec, step))));
}

// BoundStep for what cannot be bounded.
double Unknown(MagnitudeBounds* after) {
  *after = MagnitudeBounds();
  return MagnitudeBounds::kUnknown;
}

using update_loops::ActiveLoops;
using update_loops::AdamElements;
using update_loops::AdamForm;
using update_loops::CpuHasAvx2;
using update_loops::MomentumElements;
using update_loops::MomentumForm;
using update_loops::RunLoop;

class Sgd : public Optimizer {
 public:
  Sgd(const v1::OptimizerSpec& spec, int64_t n)
      : spec_(spec),
        weight_decay_(spec.weight_decay()),
        scratch_(weight_decay_ > 0.0f ? std::min(n, kBlock) : 0) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t step) override {
    const float lr = static_cast<float>(StepLearningRate(spec_, step));
    const int64_t n = static_cast<int64_t>(value.size());
    if (weight_decay_ == 0.0f) {
      cblas_saxpy(static_cast<int>(n), -lr, grad.data(), 1, value.data(), 1);
      return;
    }
    // g + wd * w is formed one cache-sized block at a time, so w and g stream
    // from memory once; a scratch the size of the variable would cost n more
    // floats and measured ~1.5x slower for large variables. (saxpby with
    // beta = 1 - lr * wd would be one call, but rounds lr * wd < 6e-8 away.)
    for (int64_t i = 0; i < n; i += kBlock) {
      const int k = static_cast<int>(std::min(kBlock, n - i));
      DecayedStep(k, value.data() + i, grad.data() + i, scratch_.data());
      cblas_saxpy(k, -lr, scratch_.data(), 1, value.data() + i, 1);
    }
  }
  void ApplyAndCopy(absl::Span<float> value, absl::Span<const float> grad, int64_t step,
                    absl::Span<float* const> copies) override {
    // Apply's calls, block by block (saxpy works element by element, so
    // the blocks round as the whole-variable call does), each block copied
    // while in cache.
    const float lr = static_cast<float>(StepLearningRate(spec_, step));
    const int64_t n = static_cast<int64_t>(value.size());
    for (int64_t i = 0; i < n; i += kBlock) {
      const int k = static_cast<int>(std::min(kBlock, n - i));
      if (weight_decay_ == 0.0f) {
        cblas_saxpy(k, -lr, grad.data() + i, 1, value.data() + i, 1);
      } else {
        DecayedStep(k, value.data() + i, grad.data() + i, scratch_.data());
        cblas_saxpy(k, -lr, scratch_.data(), 1, value.data() + i, 1);
      }
      CopyBlock(value.data(), i, k, copies);
    }
  }
  bool CanApplyInto() const override { return true; }
  void ApplyInto(int64_t /*first*/, absl::Span<const float> value, absl::Span<const float> grad,
                 absl::Span<float> out, int64_t step,
                 absl::Span<float* const> /*slots_out*/) const override {
    const float lr = static_cast<float>(StepLearningRate(spec_, step));
    const int64_t n = static_cast<int64_t>(value.size());
    // Block by block, in cache: the new values are formed with the same
    // calls (and block boundaries, relative to the variable's start) as
    // Apply's, in `out`, or, where `out` is the gradient itself, in a
    // block of scratch copied over it once the block's gradient is read.
    const bool over_grad = out.data() == grad.data();
    float w[kBlock], s[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int k = static_cast<int>(std::min(kBlock, n - i));
      float* formed = over_grad ? w : out.data() + i;
      cblas_scopy(k, value.data() + i, 1, formed, 1);
      if (weight_decay_ == 0.0f) {
        cblas_saxpy(k, -lr, grad.data() + i, 1, formed, 1);
      } else {
        DecayedStep(k, value.data() + i, grad.data() + i, s);
        cblas_saxpy(k, -lr, s, 1, formed, 1);
      }
      if (over_grad) cblas_scopy(k, w, 1, out.data() + i, 1);
    }
  }
  double BoundStep(const MagnitudeBounds& before, double grad_abs_sum, int64_t step,
                   MagnitudeBounds* after) const override {
    if (!Known(before, 0, grad_abs_sum)) return Unknown(after);
    // g + wd * w, then w - lr * that.
    const double lr = FloatRate(spec_, step);
    const double g = DecayedGradientBound(grad_abs_sum, weight_decay_, before);
    *after = MagnitudeBounds();
    after->value = Up(before.value + Up(lr * g));
    return std::max(g, after->value);
  }
  int64_t slot_bytes() const override { return 0; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {};
  }

 private:
  static constexpr int64_t kBlock = kApplyBlock;
  // s = g + wd * w for k elements (k <= kBlock).
  void DecayedStep(int k, const float* w, const float* g, float* s) const {
    cblas_scopy(k, g, 1, s, 1);
    cblas_saxpy(k, weight_decay_, w, 1, s, 1);
  }
  const v1::OptimizerSpec spec_;
  const float weight_decay_;
  std::vector<float> scratch_;  // Empty without weight decay.
};

// Keras/TF semantics: v = m*v - lr*g; w += v (Nesterov: w += m*v - lr*g),
// with g + wd*w for g.
class Momentum : public Optimizer {
 public:
  Momentum(const v1::OptimizerSpec& spec, int64_t n)
      : spec_(spec),
        m_(spec.momentum()),
        weight_decay_(spec.weight_decay()),
        nesterov_(spec.nesterov()),
        velocity_(n, 0.0f) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t step) override {
    Update(value, grad, step, {});
  }
  void ApplyAndCopy(absl::Span<float> value, absl::Span<const float> grad, int64_t step,
                    absl::Span<float* const> copies) override {
    Update(value, grad, step, copies);
  }
  double BoundStep(const MagnitudeBounds& before, double grad_abs_sum, int64_t step,
                   MagnitudeBounds* after) const override {
    if (!Known(before, 1, grad_abs_sum)) return Unknown(after);
    // MomentumElements' expressions, term by term.
    const double lr = FloatRate(spec_, step);
    const double g = DecayedGradientBound(grad_abs_sum, weight_decay_, before);
    const double mom = std::abs(m_);
    const double v = Up(Up(mom * before.slots[0]) + Up(lr * g));
    const double dw = nesterov_ ? Up(Up(mom * v) + Up(lr * g)) : v;
    *after = MagnitudeBounds();
    after->value = Up(before.value + dw);
    after->slots[0] = v;
    return std::max({g, v, dw, after->value, Up(lr * g)});
  }
  int64_t slot_bytes() const override { return velocity_.size() * sizeof(float); }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {{"velocity", absl::MakeSpan(velocity_)}};
  }
  bool CanApplyInto() const override { return true; }
  int num_slots() const override { return 1; }
  void ApplyInto(int64_t first, absl::Span<const float> value, absl::Span<const float> grad,
                 absl::Span<float> out, int64_t step,
                 absl::Span<float* const> slots_out) const override {
    // Update's expressions, each result stored out of place.
    const float lr = static_cast<float>(StepLearningRate(spec_, step));
    FormOutOfPlace(static_cast<int64_t>(value.size()), out.data(),
                   [&](int64_t b, int64_t k, float* formed) {
                     FormBlock(k, lr, value.data() + b, grad.data() + b,
                               velocity_.data() + first + b, formed, slots_out[0] + first + b);
                   });
  }
  void AdoptSlots(std::vector<std::vector<float>>* staged) override {
    velocity_.swap((*staged)[0]);
  }
  std::vector<std::vector<float>> DetachSlots() override {
    std::vector<std::vector<float>> out;
    out.push_back(Detach(velocity_));
    return out;
  }

 private:
  // ApplyInto's k elements (Update's expressions, out of place).
  void FormBlock(int64_t k, float lr, const float* w, const float* g, const float* v, float* wo,
                 float* vo) const {
    if (nesterov_) {
      RunLoop<&MomentumForm<true>>(k, lr, m_, weight_decay_, w, g, v, wo, vo);
    } else {
      RunLoop<&MomentumForm<false>>(k, lr, m_, weight_decay_, w, g, v, wo, vo);
    }
  }
  // One pass over memory, weight decay folded in; the new values also to
  // `copies` (the same expressions, so the same bits; see CopiedPasses).
  void Update(absl::Span<float> value, absl::Span<const float> grad, int64_t step,
              absl::Span<float* const> copies) {
    const float lr = static_cast<float>(StepLearningRate(spec_, step));
    const float mom = m_, wd = weight_decay_;
    float* v = velocity_.data();
    float* w = value.data();
    const float* g = grad.data();
    CopiedPasses(w, value.size(), copies, [&](auto copying, int64_t b, int64_t e, float* c) {
      constexpr bool kCopy = decltype(copying)::value;
      if (nesterov_) {
        RunLoop<&MomentumElements<true, kCopy>>(b, e, lr, mom, wd, v, w, g, c);
      } else {
        RunLoop<&MomentumElements<false, kCopy>>(b, e, lr, mom, wd, v, w, g, c);
      }
    });
  }

  const v1::OptimizerSpec spec_;
  const float m_, weight_decay_;
  const bool nesterov_;
  std::vector<float> velocity_;
};

// Kingma & Ba with TF's formulation of the bias correction:
// lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t * m / (sqrt(v) + eps),
// with g + wd*w for g (coupled L2, not AdamW).
class Adam : public Optimizer {
 public:
  Adam(const v1::OptimizerSpec& spec, int64_t n)
      : spec_(spec),
        b1_(spec.beta1()),
        b2_(spec.beta2()),
        eps_(spec.epsilon()),
        weight_decay_(spec.weight_decay()),
        m_(n, 0.0f),
        v_(n, 0.0f) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t step) override {
    Update(value, grad, step, {});
  }
  void ApplyAndCopy(absl::Span<float> value, absl::Span<const float> grad, int64_t step,
                    absl::Span<float* const> copies) override {
    Update(value, grad, step, copies);
  }
  double BoundStep(const MagnitudeBounds& before, double grad_abs_sum, int64_t step,
                   MagnitudeBounds* after) const override {
    if (!Known(before, 2, grad_abs_sum)) return Unknown(after);
    // AdamElements' expressions, term by term; sqrt(v) + eps >= eps for
    // the v >= 0 every update leaves.
    const double lr_t = std::abs(static_cast<double>(StepRate(step)));
    const double b1 = b1_, b2 = b2_;
    const double g = DecayedGradientBound(grad_abs_sum, weight_decay_, before);
    const double m = Up(Up(b1 * before.slots[0]) + Up(Up(1.0 - b1) * g));
    const double g2 = Up(Up(Up(1.0 - b2) * g) * g);
    const double v = Up(Up(b2 * before.slots[1]) + g2);
    const double step_num = Up(lr_t * m);
    const double dw = Up(step_num / eps_);
    *after = MagnitudeBounds();
    after->value = Up(before.value + dw);
    after->slots[0] = m;
    after->slots[1] = v;
    return std::max({g, m, g2, v, step_num, dw, after->value});
  }
  int64_t slot_bytes() const override {
    return (m_.size() + v_.size()) * sizeof(float);
  }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {{"m", absl::MakeSpan(m_)}, {"v", absl::MakeSpan(v_)}};
  }
  std::vector<std::vector<float>> DetachSlots() override {
    std::vector<std::vector<float>> out;
    out.push_back(Detach(m_));
    out.push_back(Detach(v_));
    return out;
  }
  absl::Status CheckRestoredSlots() const override {
    for (size_t i = 0; i < v_.size(); ++i) {
      if (v_[i] < 0.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot \"v\" holds ", v_[i], " at element ", i,
                         " (Adam's second moment is never below 0)"));
      }
    }
    return absl::OkStatus();
  }
  bool CanApplyInto() const override { return true; }
  int num_slots() const override { return 2; }
  void ApplyInto(int64_t first, absl::Span<const float> value, absl::Span<const float> grad,
                 absl::Span<float> out, int64_t step,
                 absl::Span<float* const> slots_out) const override {
    // Update's expressions, each result stored out of place.
    const float lr_t = StepRate(step);
    FormOutOfPlace(static_cast<int64_t>(value.size()), out.data(),
                   [&](int64_t b, int64_t k, float* formed) {
                     FormBlock(k, lr_t, value.data() + b, grad.data() + b, m_.data() + first + b,
                               v_.data() + first + b, formed, slots_out[0] + first + b,
                               slots_out[1] + first + b);
                   });
  }
  void AdoptSlots(std::vector<std::vector<float>>* staged) override {
    m_.swap((*staged)[0]);
    v_.swap((*staged)[1]);
  }

 private:
  // ApplyInto's k elements (Update's expressions, out of place).
  void FormBlock(int64_t k, float lr_t, const float* w, const float* g, const float* m,
                 const float* v, float* wo, float* mo, float* vo) const {
    RunLoop<&AdamForm>(k, lr_t, b1_, b2_, eps_, weight_decay_, w, g, m, v, wo, mo, vo);
  }
  // The bias-corrected learning rate of update `step`.
  float StepRate(int64_t step) const {
    const double t = static_cast<double>(step);
    return static_cast<float>(StepLearningRate(spec_, step) * std::sqrt(1.0 - std::pow(b2_, t)) /
                              (1.0 - std::pow(b1_, t)));
  }
  // One pass over memory, weight decay folded in; the new values also to
  // `copies` (the same expressions, so the same bits; see CopiedPasses).
  void Update(absl::Span<float> value, absl::Span<const float> grad, int64_t step,
              absl::Span<float* const> copies) {
    const float lr_t = StepRate(step);
    float* m = m_.data();
    float* v = v_.data();
    float* w = value.data();
    const float* g = grad.data();
    const float b1 = b1_, b2 = b2_, eps = eps_, wd = weight_decay_;
    auto pass = [&](auto copying, int64_t b, int64_t e, float* copy) {
      RunLoop<&AdamElements<decltype(copying)::value>>(b, e, lr_t, b1, b2, eps, wd, m, v, w, g,
                                                       copy);
    };
    CopiedPasses(w, value.size(), copies, pass);
  }

  const v1::OptimizerSpec spec_;
  const float b1_, b2_, eps_, weight_decay_;
  std::vector<float> m_, v_;
};

// Batch norm's moving statistics: value = d * value + (1 - d) * pushed, the
// pushed statistic already averaged over the workers like a gradient. No
// learning rate, weight decay or slots.
class MovingAverage : public Optimizer {
 public:
  explicit MovingAverage(float decay)
      : decay_(decay),
        // 1 - d is exact in float for d in [0.5, 1) (the usual decays);
        // below that it is the nearest float.
        one_minus_decay_(static_cast<float>(1.0 - static_cast<double>(decay))) {}
  void Apply(absl::Span<float> value, absl::Span<const float> pushed,
             int64_t /*step*/) override {
    const int n = static_cast<int>(value.size());
    if (decay_ == 0.0f) {
      // Exactly the pushed value (not 1 * x + 0 * y, which turns a pushed
      // -0 into +0 and depends on the BLAS special-casing beta = 0).
      cblas_scopy(n, pushed.data(), 1, value.data(), 1);
      return;
    }
    cblas_saxpby(n, one_minus_decay_, pushed.data(), 1, decay_, value.data(), 1);
  }
  double BoundStep(const MagnitudeBounds& before, double pushed_abs_sum, int64_t /*step*/,
                   MagnitudeBounds* after) const override {
    if (!Known(before, 0, pushed_abs_sum)) return Unknown(after);
    *after = MagnitudeBounds();
    after->value = Up(Up(one_minus_decay_ * pushed_abs_sum) + Up(decay_ * before.value));
    return std::max(after->value, pushed_abs_sum);
  }
  int64_t slot_bytes() const override { return 0; }
  std::vector<std::pair<std::string, absl::Span<float>>> Slots() override {
    return {};
  }

 private:
  const float decay_;
  const float one_minus_decay_;
};

}  // namespace

UpdateLoops ActiveUpdateLoops() { return ActiveLoops().load(); }

absl::Status SetUpdateLoops(UpdateLoops loops) {
  if (loops == UpdateLoops::kAvx2 && !CpuHasAvx2()) {
    return absl::FailedPreconditionError("update loops: this CPU (or build) has no AVX2");
  }
  ActiveLoops().store(loops);
  return absl::OkStatus();
}

const char* UpdateLoopsName(UpdateLoops loops) {
  return loops == UpdateLoops::kAvx2 ? "AVX2" : "baseline (SSE2)";
}

double MaxAbs(const float* x, int64_t n) {
  constexpr int64_t kMaxCall = int64_t{1} << 30;  // isamax counts in int
  double max = 0.0;
  for (int64_t first = 0; first < n; first += kMaxCall) {
    const int k = static_cast<int>(std::min(kMaxCall, n - first));
    const float* at = x + first + cblas_isamax(k, x + first, 1);
    max = std::max(max, static_cast<double>(std::abs(*at)));
  }
  return max;
}

MagnitudeBounds MeasureBounds(absl::Span<const float> value, Optimizer& optimizer) {
  MagnitudeBounds b;
  b.value = MaxAbs(value.data(), static_cast<int64_t>(value.size()));
  const auto slots = optimizer.Slots();
  for (size_t i = 0; i < slots.size() && i < 2; ++i) {
    b.slots[i] = MaxAbs(slots[i].second.data(), static_cast<int64_t>(slots[i].second.size()));
  }
  return b;
}

void Optimizer::ApplyAndCopy(absl::Span<float> value, absl::Span<const float> grad,
                             int64_t step, absl::Span<float* const> copies) {
  Apply(value, grad, step);
  for (int64_t i = 0; i < static_cast<int64_t>(value.size()); i += kApplyBlock) {
    CopyBlock(value.data(), i, std::min<int64_t>(kApplyBlock, value.size() - i), copies);
  }
}

absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const v1::OptimizerSpec& in, int64_t num_elements) {
  TOWERPS_RETURN_IF_ERROR(ValidateOptimizer(in));
  const v1::OptimizerSpec s = OptimizerWithDefaults(in);
  switch (s.type()) {
    case v1::OptimizerSpec::MOMENTUM:
      return std::unique_ptr<Optimizer>(new Momentum(s, num_elements));
    case v1::OptimizerSpec::ADAM:
      return std::unique_ptr<Optimizer>(new Adam(s, num_elements));
    default:
      return std::unique_ptr<Optimizer>(new Sgd(s, num_elements));
  }
}

absl::Status ValidateVariableUpdate(const v1::VariableDef& def) {
  const std::string var = absl::StrCat("variable \"", def.name(), "\"");
  const float d = def.moving_average_decay();
  switch (def.update()) {
    case v1::VariableDef::OPTIMIZER:
      if (d != 0.0f) {  // NaN included.
        return absl::InvalidArgumentError(absl::StrCat(
            var, ": moving_average_decay = ", d,
            " is set but update is OPTIMIZER (set update = MOVING_AVERAGE for a "
            "moving statistic)"));
      }
      return absl::OkStatus();
    case v1::VariableDef::MOVING_AVERAGE:
      if (!(d >= 0.0f && d < 1.0f)) {  // NaN fails both.
        return absl::InvalidArgumentError(absl::StrCat(
            var, ": moving_average_decay = ", d, " for MOVING_AVERAGE (want finite, in [0, 1))"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(var, ": update = ", static_cast<int>(def.update()),
                       " is unknown (want OPTIMIZER or MOVING_AVERAGE)"));
  }
}

absl::StatusOr<std::unique_ptr<Optimizer>> NewVariableUpdater(
    const v1::VariableDef& def, const v1::OptimizerSpec& spec, int64_t num_elements) {
  TOWERPS_RETURN_IF_ERROR(ValidateVariableUpdate(def));
  if (def.update() == v1::VariableDef::MOVING_AVERAGE) {
    return std::unique_ptr<Optimizer>(new MovingAverage(def.moving_average_decay()));
  }
  return NewOptimizer(spec, num_elements);
}

}  // namespace towerps::ps
