#include "worker/device/cpu_batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "worker/device/cpu_team.h"

namespace towerps::worker {
namespace {

// Eight floats: two SSE2 registers on x86-64 (the vector extensions GCC and
// clang share); each lane's adds and multiplies round as the scalar ones do.
using F8 = float __attribute__((vector_size(32)));

// (Through a pointer: a 32-byte vector returned by value changes the ABI
// where AVX is off, and GCC warns.)
inline void Load(const float* p, F8* v) { std::memcpy(v, p, sizeof(*v)); }

// The lanes' total in the order cpu_batch_norm.h defines.
inline float Fold(const float (&l)[8]) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Adds to sums[0, K) the block sums (cpu_batch_norm.h) of K terms over
// elements [0, len) of a plane: vec(k, t) writes elements k..k+7's terms to
// t[0, K), one(k, t) element k's, computed as the lanes of vec's would be.
template <int K, typename Vec, typename One>
void AddPlane(int64_t len, Vec vec, One one, double* sums) {
  if (len == 1) {  // a dense layer's feature: the lanes' total is the term
    float t[K];
    one(0, t);
    for (int j = 0; j < K; ++j) sums[j] += t[j];
    return;
  }
  for (int64_t begin = 0; begin < len; begin += kCpuBatchNormBlock) {
    const int64_t end = std::min(len, begin + kCpuBatchNormBlock);
    F8 acc[K] = {};
    int64_t k = begin;
    for (; k + 8 <= end; k += 8) {
      F8 t[K];
      vec(k, t);
      for (int j = 0; j < K; ++j) acc[j] += t[j];
    }
    float lanes[K][8];
    std::memcpy(lanes, acc, sizeof(lanes));
    for (int l = 0; k < end; ++k, ++l) {
      float t[K];
      one(k, t);
      for (int j = 0; j < K; ++j) lanes[j][l] += t[j];
    }
    for (int j = 0; j < K; ++j) sums[j] += Fold(lanes[j]);
  }
}

// Below this many elements, one thread is as fast as waking the team.
constexpr int64_t kMinSplitElements = int64_t{1} << 15;

// Calls channel(ch) for every channel, the channels shared out in contiguous
// runs over up to `threads` team members.
template <typename F>
void ForEachChannel(const BatchNormShape& s, int threads, F channel) {
  const int64_t team = s.x_size() < kMinSplitElements ? 1 : std::min<int64_t>(threads, s.c);
  RunOnTeam(static_cast<int>(team), [&](int part, int parts) {
    const int64_t end = s.c * (part + 1) / parts;
    for (int64_t ch = s.c * part / parts; ch < end; ++ch) channel(ch);
  });
}

// Channel ch's plane in image i.
inline int64_t Plane(const BatchNormShape& s, int64_t i, int64_t ch) {
  return (i * s.c + ch) * s.spatial;
}

// 1 / sqrt(var + epsilon), in double.
inline double InvStd(const BatchNormShape& s, float var) {
  return 1.0 / std::sqrt(static_cast<double>(var) + static_cast<double>(s.epsilon));
}

// y = (x - mean) * scale + beta over channel ch's planes.
void Normalize(const BatchNormShape& s, int64_t ch, const float* x, float mean, float scale,
               float beta, float* y) {
  for (int64_t i = 0; i < s.n; ++i) {
    const float* xp = x + Plane(s, i, ch);
    float* yp = y + Plane(s, i, ch);
    for (int64_t k = 0; k < s.spatial; ++k) yp[k] = (xp[k] - mean) * scale + beta;
  }
}

}  // namespace

void CpuBatchNormForwardTraining(const BatchNormShape& s, const float* x, const float* gamma,
                                 const float* beta, float* y, float* mean, float* var,
                                 int threads) {
  const double count = static_cast<double>(s.n) * static_cast<double>(s.spatial);
  ForEachChannel(s, threads, [&](int64_t ch) {
    double sum = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      const float* p = x + Plane(s, i, ch);
      AddPlane<1>(
          s.spatial, [&](int64_t k, F8* t) { Load(p + k, &t[0]); },
          [&](int64_t k, float* t) { t[0] = p[k]; }, &sum);
    }
    const float m = static_cast<float>(sum / count);
    double squares = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      const float* p = x + Plane(s, i, ch);
      AddPlane<1>(
          s.spatial,
          [&](int64_t k, F8* t) {
            F8 d;
            Load(p + k, &d);
            d -= m;
            t[0] = d * d;
          },
          [&](int64_t k, float* t) {
            const float d = p[k] - m;
            t[0] = d * d;
          },
          &squares);
    }
    mean[ch] = m;
    var[ch] = static_cast<float>(squares / count);
    const float scale = static_cast<float>(gamma[ch] * InvStd(s, var[ch]));
    Normalize(s, ch, x, m, scale, beta[ch], y);
  });
}

void CpuBatchNormForwardInference(const BatchNormShape& s, const float* x, const float* gamma,
                                  const float* beta, const float* mean, const float* var,
                                  float* y, int threads) {
  ForEachChannel(s, threads, [&](int64_t ch) {
    const float scale = static_cast<float>(gamma[ch] * InvStd(s, var[ch]));
    Normalize(s, ch, x, mean[ch], scale, beta[ch], y);
  });
}

// With d = x - mean, inv = 1 / sqrt(var + epsilon) and count = n * spatial:
// dbeta = sum(dy), dgamma = sum(dy * d) * inv, and
// dx = gamma * inv * (dy - dbeta / count - d * inv^2 * sum(dy * d) / count).
void CpuBatchNormBackward(const BatchNormShape& s, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* var, float* dx,
                          float* dgamma, float* dbeta, int threads) {
  const double count = static_cast<double>(s.n) * static_cast<double>(s.spatial);
  ForEachChannel(s, threads, [&](int64_t ch) {
    const float m = mean[ch];
    double sums[2] = {0, 0};  // sum(dy), sum(dy * d)
    for (int64_t i = 0; i < s.n; ++i) {
      const float* xp = x + Plane(s, i, ch);
      const float* gp = dy + Plane(s, i, ch);
      AddPlane<2>(
          s.spatial,
          [&](int64_t k, F8* t) {
            F8 d;
            Load(gp + k, &t[0]);
            Load(xp + k, &d);
            t[1] = t[0] * (d - m);
          },
          [&](int64_t k, float* t) {
            t[0] = gp[k];
            t[1] = gp[k] * (xp[k] - m);
          },
          sums);
    }
    const double inv = InvStd(s, var[ch]);
    dbeta[ch] = static_cast<float>(sums[0]);
    dgamma[ch] = static_cast<float>(sums[1] * inv);
    const float dy_mean = static_cast<float>(sums[0] / count);
    const float d_scale = static_cast<float>(inv * inv * sums[1] / count);
    const float scale = static_cast<float>(gamma[ch] * inv);
    for (int64_t i = 0; i < s.n; ++i) {
      const float* xp = x + Plane(s, i, ch);
      const float* gp = dy + Plane(s, i, ch);
      float* out = dx + Plane(s, i, ch);
      for (int64_t k = 0; k < s.spatial; ++k) {
        out[k] = scale * (gp[k] - dy_mean - (xp[k] - m) * d_scale);
      }
    }
  });
}

}  // namespace towerps::worker
