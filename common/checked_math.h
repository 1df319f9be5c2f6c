// Overflow-safe arithmetic for sizes (element counts, bytes): every place that
// multiplies or adds sizes taken from a request or a spec uses these, so that
// a huge shape is refused by a limit check instead of wrapping around.
//
// Thread-safe (pure functions).
#ifndef TOWERPS_COMMON_CHECKED_MATH_H_
#define TOWERPS_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

namespace towerps::common {

// a * b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b, saturating at INT64_MAX for non-negative operands: for limit checks
// where "too big" is all that matters (`SaturatingMul(n, 4) > limit`).
// REQUIRES: a >= 0, b >= 0.
inline int64_t SaturatingMul(int64_t a, int64_t b) {
  return CheckedMul(a, b).value_or(INT64_MAX);
}

// a + b, saturating at INT64_MAX. REQUIRES: a >= 0, b >= 0.
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  return CheckedAdd(a, b).value_or(INT64_MAX);
}

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_CHECKED_MATH_H_
