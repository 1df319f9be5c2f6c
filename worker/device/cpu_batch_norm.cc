#include "worker/device/cpu_batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

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
// elements [0, len) of a plane (len > 1): vec(k, t) writes elements k..k+7's
// terms to t[0, K), one(k, t) element k's, computed as the lanes of vec's
// would be.
template <int K, typename Vec, typename One>
void AddPlane(int64_t len, Vec vec, One one, double* sums) {
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

// Calls run(begin, end) for contiguous runs of channels [begin, end) that
// cover them all, the runs shared out over up to `threads` team members.
template <typename F>
void ForEachChannelRun(const BatchNormShape& s, int threads, F run) {
  const int64_t team = s.x_size() < kMinSplitElements ? 1 : std::min<int64_t>(threads, s.c);
  RunOnTeam(static_cast<int>(team), [&](int part, int parts) {
    const int64_t begin = s.c * part / parts;
    const int64_t end = s.c * (part + 1) / parts;
    if (begin < end) run(begin, end);
  });
}

// Channels [begin, end) of one pass over x (and dy, dx, y at the same
// offsets), image by image: a run's planes lie side by side in an image, so
// each pass streams through memory. (Channel by channel, a channel's planes
// lie a whole image apart, at ResNet's shapes a power-of-two stride, which
// crowds them into a few cache sets: batch_norm_benchmark found this order
// 1.1-1.5x faster on ResNet-20's shapes.) Each channel still sees its planes
// in image order, so the sums are the same.
//
// With planes of more than one element, calls plane(j, at) for channel
// begin + j's plane at offset `at`. A dense layer's planes are single
// features, so there it calls row(at, width) once an image, for the run's
// width features at [at, at + width): a loop across channels, which
// vectorizes (4-5x faster than a plane call per feature).
template <typename Plane, typename Row>
void Sweep(const BatchNormShape& s, int64_t begin, int64_t end, Plane plane, Row row) {
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t at = (i * s.c + begin) * s.spatial;
    if (s.spatial == 1) {
      row(at, end - begin);
    } else {
      for (int64_t j = 0; j < end - begin; ++j) plane(j, at + j * s.spatial);
    }
  }
}

// 1 / sqrt(var + epsilon), in double.
inline double InvStd(const BatchNormShape& s, float var) {
  return 1.0 / std::sqrt(static_cast<double>(var) + static_cast<double>(s.epsilon));
}

// y = (x - mean) * scale + beta over channels [begin, end), given channel
// begin + j's mean, scale and beta at [j].
void Normalize(const BatchNormShape& s, int64_t begin, int64_t end, const float* x,
               const float* mean, const float* scale, const float* beta, float* y) {
  Sweep(
      s, begin, end,
      [&](int64_t j, int64_t at) {
        const float m = mean[j], sc = scale[j], b = beta[j];
        for (int64_t k = 0; k < s.spatial; ++k) y[at + k] = (x[at + k] - m) * sc + b;
      },
      [&](int64_t at, int64_t width) {
        for (int64_t j = 0; j < width; ++j) y[at + j] = (x[at + j] - mean[j]) * scale[j] + beta[j];
      });
}

}  // namespace

void CpuBatchNormForwardTraining(const BatchNormShape& s, const float* x, const float* gamma,
                                 const float* beta, float* y, float* mean, float* var,
                                 int threads) {
  const double count = static_cast<double>(s.n) * static_cast<double>(s.spatial);
  ForEachChannelRun(s, threads, [&](int64_t begin, int64_t end) {
    const int64_t c = end - begin;
    std::vector<double> sums(c, 0.0);
    Sweep(
        s, begin, end,
        [&](int64_t j, int64_t at) {
          const float* p = x + at;
          AddPlane<1>(
              s.spatial, [&](int64_t k, F8* t) { Load(p + k, &t[0]); },
              [&](int64_t k, float* t) { t[0] = p[k]; }, &sums[j]);
        },
        [&](int64_t at, int64_t width) {
          for (int64_t j = 0; j < width; ++j) sums[j] += x[at + j];
        });
    std::vector<float> m(c), scale(c);
    for (int64_t j = 0; j < c; ++j) m[j] = static_cast<float>(sums[j] / count);
    std::fill(sums.begin(), sums.end(), 0.0);
    Sweep(
        s, begin, end,
        [&](int64_t j, int64_t at) {
          const float* p = x + at;
          const float mj = m[j];
          AddPlane<1>(
              s.spatial,
              [&](int64_t k, F8* t) {
                F8 d;
                Load(p + k, &d);
                d -= mj;
                t[0] = d * d;
              },
              [&](int64_t k, float* t) {
                const float d = p[k] - mj;
                t[0] = d * d;
              },
              &sums[j]);
        },
        [&](int64_t at, int64_t width) {
          for (int64_t j = 0; j < width; ++j) {
            const float d = x[at + j] - m[j];
            sums[j] += d * d;
          }
        });
    for (int64_t j = 0; j < c; ++j) {
      mean[begin + j] = m[j];
      var[begin + j] = static_cast<float>(sums[j] / count);
      scale[j] = static_cast<float>(gamma[begin + j] * InvStd(s, var[begin + j]));
    }
    Normalize(s, begin, end, x, m.data(), scale.data(), beta + begin, y);
  });
}

void CpuBatchNormForwardInference(const BatchNormShape& s, const float* x, const float* gamma,
                                  const float* beta, const float* mean, const float* var,
                                  float* y, int threads) {
  ForEachChannelRun(s, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> scale(end - begin);
    for (int64_t ch = begin; ch < end; ++ch) {
      scale[ch - begin] = static_cast<float>(gamma[ch] * InvStd(s, var[ch]));
    }
    Normalize(s, begin, end, x, mean + begin, scale.data(), beta + begin, y);
  });
}

// With d = x - mean, inv = 1 / sqrt(var + epsilon) and count = n * spatial:
// dbeta = sum(dy), dgamma = sum(dy * d) * inv, and
// dx = gamma * inv * (dy - dbeta / count - d * inv^2 * sum(dy * d) / count).
void CpuBatchNormBackward(const BatchNormShape& s, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* var, float* dx,
                          float* dgamma, float* dbeta, int threads) {
  const double count = static_cast<double>(s.n) * static_cast<double>(s.spatial);
  ForEachChannelRun(s, threads, [&](int64_t begin, int64_t end) {
    const int64_t c = end - begin;
    const float* m = mean + begin;
    std::vector<double> sums(2 * c, 0.0);  // channel begin + j's sum(dy), sum(dy * d) at 2 j
    Sweep(
        s, begin, end,
        [&](int64_t j, int64_t at) {
          const float* xp = x + at;
          const float* gp = dy + at;
          const float mj = m[j];
          AddPlane<2>(
              s.spatial,
              [&](int64_t k, F8* t) {
                F8 d;
                Load(gp + k, &t[0]);
                Load(xp + k, &d);
                t[1] = t[0] * (d - mj);
              },
              [&](int64_t k, float* t) {
                t[0] = gp[k];
                t[1] = gp[k] * (xp[k] - mj);
              },
              &sums[2 * j]);
        },
        [&](int64_t at, int64_t width) {
          for (int64_t j = 0; j < width; ++j) {
            sums[2 * j] += dy[at + j];
            sums[2 * j + 1] += dy[at + j] * (x[at + j] - m[j]);
          }
        });
    // Per channel: dy's mean, d's factor and the overall scale.
    std::vector<float> dy_mean(c), d_scale(c), scale(c);
    for (int64_t j = 0; j < c; ++j) {
      const double inv = InvStd(s, var[begin + j]);
      dbeta[begin + j] = static_cast<float>(sums[2 * j]);
      dgamma[begin + j] = static_cast<float>(sums[2 * j + 1] * inv);
      dy_mean[j] = static_cast<float>(sums[2 * j] / count);
      d_scale[j] = static_cast<float>(inv * inv * sums[2 * j + 1] / count);
      scale[j] = static_cast<float>(gamma[begin + j] * inv);
    }
    // dx = scale * (dy - dy_mean - d * d_scale), with channel j's factors
    // in locals (dx may not alias them, but the compiler cannot know).
    Sweep(
        s, begin, end,
        [&](int64_t j, int64_t at) {
          const float mj = m[j], gm = dy_mean[j], ds = d_scale[j], sc = scale[j];
          for (int64_t k = at; k < at + s.spatial; ++k) {
            dx[k] = sc * (dy[k] - gm - (x[k] - mj) * ds);
          }
        },
        [&](int64_t at, int64_t width) {
          for (int64_t j = 0; j < width; ++j) {
            dx[at + j] = scale[j] * (dy[at + j] - dy_mean[j] - (x[at + j] - m[j]) * d_scale[j]);
          }
        });
  });
}

}  // namespace towerps::worker
