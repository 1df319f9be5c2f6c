// Dropout's mask as a pure function of (seed, element index): a counter-based
// generator (SplitMix64's finalizer over seed + golden-ratio steps), so the
// CPU backend's loop and a GPU kernel (this header compiles under nvcc too)
// draw the same mask, and no generator state is kept between calls.
#ifndef TOWERPS_WORKER_DEVICE_DROPOUT_MASK_H_
#define TOWERPS_WORKER_DEVICE_DROPOUT_MASK_H_

#include <cstdint>

#ifdef __CUDACC__
#define TOWERPS_HOST_DEVICE __host__ __device__
#else
#define TOWERPS_HOST_DEVICE
#endif

namespace towerps::worker {

// A uniform value in [0, 1) with 24 random bits for element `i` under `seed`.
TOWERPS_HOST_DEVICE inline float DropoutUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// Element i's mask value: 0 (dropped, with probability `rate`) or
// 1 / (1 - rate). REQUIRES: 0 <= rate < 1.
TOWERPS_HOST_DEVICE inline float DropoutMaskValue(uint64_t seed, uint64_t i, float rate) {
  return DropoutUniform(seed, i) < rate ? 0.0f : 1.0f / (1.0f - rate);
}

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_DROPOUT_MASK_H_
