// Test helpers for checking float32 kernels against a double-precision
// reference within a DERIVED bound instead of a picked tolerance.
//
// A result computed in float from N roundings (a sum of N terms in any
// order, a product chain, ...) satisfies |computed - exact| <= gamma_N *
// magnitude, where magnitude is the same computation over absolute values
// and gamma_N = N u / (1 - N u), u = 2^-24 (Higham, "Accuracy and Stability
// of Numerical Algorithms", 3.1; the same bound as
// worker/model/reference_model.h). Tests count N per op.
//
// Header-only, testonly; pure functions, thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_FLOAT_BOUNDS_TESTING_H_
#define TOWERPS_WORKER_DEVICE_FLOAT_BOUNDS_TESTING_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace towerps::worker {

// gamma_n for float32: the relative error bound of n roundings.
inline double FloatGamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

// `n` floats uniform in [lo, hi), the same sequence for the same seed.
inline std::vector<float> RandomVector(int64_t n, uint64_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_FLOAT_BOUNDS_TESTING_H_
