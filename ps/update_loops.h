// The update rules' element loops (momentum's and Adam's) and the choice of
// the instruction set they run in (UpdateLoops, optimizer.h). Private to
// :optimizer; internal.
#ifndef TOWERPS_PS_UPDATE_LOOPS_H_
#define TOWERPS_PS_UPDATE_LOOPS_H_

#include <atomic>
#include <cmath>
#include <cstdint>

#include "ps/optimizer.h"

namespace towerps::ps::update_loops {

// The rules' element loops (momentum's and Adam's, below) are compiled for
// two instruction sets: the baseline x86-64 (SSE2, 4 floats a vector) and
// AVX2 (8). Each loop is an always-inlined function that RunLoop instantiates
// inside a function of either target, and runs in the one UpdateLoops()
// names. No loop uses a fused multiply-add (-ffp-contract=off; AVX2 alone
// has none), and the rest (+, -, *, /, sqrt) is exact per element, so both
// give the same bits. Elsewhere (another architecture, or a compiler with
// no target attribute) the baseline is the only one.
#if defined(__x86_64__) && defined(__GNUC__)
#define TOWERPS_AVX2_LOOPS 1
#define TOWERPS_LOOP_INLINE __attribute__((always_inline)) inline
#else
#define TOWERPS_AVX2_LOOPS 0
#define TOWERPS_LOOP_INLINE inline
#endif

inline bool CpuHasAvx2() {
#if TOWERPS_AVX2_LOOPS
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

inline std::atomic<UpdateLoops>& ActiveLoops() {
  static std::atomic<UpdateLoops> loops(CpuHasAvx2() ? UpdateLoops::kAvx2 : UpdateLoops::kBaseline);
  return loops;
}

#if TOWERPS_AVX2_LOOPS
template <auto kLoop, typename... Args>
__attribute__((target("avx2"))) void RunAvx2(Args... args) {
  kLoop(args...);
}
#endif

// Runs kLoop(args...) compiled for the instruction set UpdateLoops() names.
template <auto kLoop, typename... Args>
void RunLoop(Args... args) {
#if TOWERPS_AVX2_LOOPS
  if (ActiveLoops().load(std::memory_order_relaxed) == UpdateLoops::kAvx2) {
    RunAvx2<kLoop>(args...);
    return;
  }
#endif
  kLoop(args...);
}

// Momentum's elements [b, e) in place (Keras/TF: v = m*v - lr*g; w += v,
// Nesterov: w += m*v - lr*g; g + wd*w for g); with kCopy, each new value
// also to `copy`. No pointer is restrict: any may alias (the compiler checks).
template <bool kNesterov, bool kCopy>
TOWERPS_LOOP_INLINE void MomentumElements(int64_t b, int64_t e, float lr, float mom, float wd,
                                          float* v, float* w, const float* g, float* copy) {
  for (int64_t i = b; i < e; ++i) {
    const float gi = g[i] + wd * w[i];
    v[i] = mom * v[i] - lr * gi;
    if constexpr (kNesterov) {
      w[i] += mom * v[i] - lr * gi;
    } else {
      w[i] += v[i];
    }
    if constexpr (kCopy) copy[i] = w[i];
  }
}

// MomentumElements' expressions for k elements, out of place.
template <bool kNesterov>
TOWERPS_LOOP_INLINE void MomentumForm(int64_t k, float lr, float mom, float wd,
                                      const float* __restrict w, const float* __restrict g,
                                      const float* __restrict v, float* __restrict wo,
                                      float* __restrict vo) {
  for (int64_t i = 0; i < k; ++i) {
    const float gi = g[i] + wd * w[i];
    const float vi = mom * v[i] - lr * gi;
    vo[i] = vi;
    if constexpr (kNesterov) {
      wo[i] = w[i] + (mom * vi - lr * gi);
    } else {
      wo[i] = w[i] + vi;
    }
  }
}

// Adam's elements [b, e) in place (see class Adam); with kCopy, each new
// value also to `copy`. Any pointer may alias.
template <bool kCopy>
TOWERPS_LOOP_INLINE void AdamElements(int64_t b, int64_t e, float lr_t, float b1, float b2,
                                      float eps, float wd, float* m, float* v, float* w,
                                      const float* g, float* copy) {
  for (int64_t i = b; i < e; ++i) {
    const float gi = g[i] + wd * w[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    if constexpr (kCopy) copy[i] = w[i];
  }
}

// AdamElements' expressions for k elements, out of place.
TOWERPS_LOOP_INLINE void AdamForm(int64_t k, float lr_t, float b1, float b2, float eps, float wd,
                                  const float* __restrict w, const float* __restrict g,
                                  const float* __restrict m, const float* __restrict v,
                                  float* __restrict wo, float* __restrict mo,
                                  float* __restrict vo) {
  for (int64_t i = 0; i < k; ++i) {
    const float gi = g[i] + wd * w[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    mo[i] = mi;
    vo[i] = vi;
    wo[i] = w[i] - lr_t * mi / (std::sqrt(vi) + eps);
  }
}

}  // namespace towerps::ps::update_loops

#endif  // TOWERPS_PS_UPDATE_LOOPS_H_
