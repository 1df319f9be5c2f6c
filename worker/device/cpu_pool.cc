#include "worker/device/cpu_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/device/cpu_team.h"

namespace towerps::worker {
namespace {

// Output column j's window columns [w0[j], w1[j]), clipped to the image;
// output row i's are found as they come (RowsOf).
struct ColumnWindows {
  std::vector<int64_t> w0, w1;
};

ColumnWindows ColumnsOf(const Pool2DShape& s) {
  ColumnWindows c;
  for (int64_t j = 0; j < s.out_w(); ++j) {
    const int64_t left = j * s.stride_w - s.pad_w;
    c.w0.push_back(std::max<int64_t>(left, 0));
    c.w1.push_back(std::min(left + s.s, s.w));
  }
  return c;
}

struct Rows {
  int64_t h0, h1;
};

Rows RowsOf(const Pool2DShape& s, int64_t i) {
  const int64_t top = i * s.stride_h - s.pad_h;
  return {std::max<int64_t>(top, 0), std::min(top + s.r, s.h)};
}

// Below this many input and output elements in all, one thread is as fast
// as waking the team.
constexpr int64_t kMinSplitElements = int64_t{1} << 15;

// Calls plane(p) for every plane p in [0, n * c), the planes shared out in
// contiguous runs over up to `threads` team members.
template <typename F>
void ForEachPlane(const Pool2DShape& s, int threads, F plane) {
  const int64_t planes = s.n * s.c;
  const int64_t elements = s.x_size() + s.y_size();
  const int64_t team = elements < kMinSplitElements ? 1 : std::min<int64_t>(threads, planes);
  RunOnTeam(static_cast<int>(team), [&](int part, int parts) {
    const int64_t end = planes * (part + 1) / parts;
    for (int64_t p = planes * part / parts; p < end; ++p) plane(p);
  });
}

// Four floats or int32s (SSE2 registers on x86-64).
using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

// Columns 0, 2, 4, 6 and 1, 3, 5, 7 of eight consecutive floats a, b.
inline F4 Even(F4 a, F4 b) { return __builtin_shufflevector(a, b, 0, 2, 4, 6); }
inline F4 Odd(F4 a, F4 b) { return __builtin_shufflevector(a, b, 1, 3, 5, 7); }

// Whether candidate x replaces the running max m: strictly greater, so
// the first of equal maxima stays; a NaN replaces anything but a NaN (no
// comparison with it is true).
inline bool Replaces(float x, float m) { return x > m || (x != x && m == m); }

// One output row of 2x2 windows at stride 2, whole in the image, from image
// rows r0 and r1 (at plane offsets start0, start0 + w), output columns
// [0, count): 4 columns at a time in SIMD (the vector extensions GCC and
// clang share: SSE2 on x86-64), the rest one by one; the same comparisons
// in the same order either way.
void Max2x2Row(const float* r0, const float* r1, int32_t start0, int32_t w, int64_t count,
               float* y, float* workspace) {
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    const int64_t c = 2 * j;
    F4 a0, b0, a1, b1;
    std::memcpy(&a0, r0 + c, 16);
    std::memcpy(&b0, r0 + c + 4, 16);
    std::memcpy(&a1, r1 + c, 16);
    std::memcpy(&b1, r1 + c + 4, 16);
    const F4 cand[4] = {Even(a0, b0), Odd(a0, b0), Even(a1, b1), Odd(a1, b1)};
    const int32_t at = start0 + static_cast<int32_t>(c);
    const I4 base = {at, at + 2, at + 4, at + 6};
    const I4 offset[4] = {base, base + 1, base + w, base + w + 1};
    F4 m = cand[0];
    I4 best = offset[0];
    for (int k = 1; k < 4; ++k) {
      const I4 take = (cand[k] > m) | ((cand[k] != cand[k]) & (m == m));
      m = take ? cand[k] : m;
      best = take ? offset[k] : best;
    }
    std::memcpy(y + j, &m, 16);
    std::memcpy(workspace + j, &best, 16);
  }
  for (; j < count; ++j) {
    const int64_t c = 2 * j;
    const float cand[4] = {r0[c], r0[c + 1], r1[c], r1[c + 1]};
    const int32_t at = start0 + static_cast<int32_t>(c);
    const int32_t offset[4] = {at, at + 1, at + w, at + w + 1};
    float m = cand[0];
    int32_t best = offset[0];
    for (int k = 1; k < 4; ++k) {
      if (Replaces(cand[k], m)) {
        m = cand[k];
        best = offset[k];
      }
    }
    y[j] = m;
    std::memcpy(workspace + j, &best, sizeof(best));
  }
}

// Average pooling of one output row of 2x2 windows at stride 2, whole in
// the image, from image rows r0 and r1, output columns [0, count): each
// window summed from 0 in row-major order and divided by 4, as the general
// loop does, 4 columns at a time in SIMD, the rest one by one.
void Avg2x2Row(const float* r0, const float* r1, int64_t count, float* y) {
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    F4 a0, b0, a1, b1;
    std::memcpy(&a0, r0 + 2 * j, 16);
    std::memcpy(&b0, r0 + 2 * j + 4, 16);
    std::memcpy(&a1, r1 + 2 * j, 16);
    std::memcpy(&b1, r1 + 2 * j + 4, 16);
    const F4 zero = {0.0f, 0.0f, 0.0f, 0.0f}, four = {4.0f, 4.0f, 4.0f, 4.0f};
    const F4 sum = (((zero + Even(a0, b0)) + Odd(a0, b0)) + Even(a1, b1)) + Odd(a1, b1);
    const F4 mean = sum / four;
    std::memcpy(y + j, &mean, 16);
  }
  for (; j < count; ++j) {
    y[j] = ((((0.0f + r0[2 * j]) + r0[2 * j + 1]) + r1[2 * j]) + r1[2 * j + 1]) / 4.0f;
  }
}

// Keras' MaxPooling2D(2) and AveragePooling2D(2): every window whole, 2x2
// at stride 2 (the image's last row or column dropped where odd).
bool TwoByTwo(const Pool2DShape& s) {
  return s.r == 2 && s.s == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
         s.pad_w == 0;
}

}  // namespace

void CpuMaxPool2DForward(const Pool2DShape& s, const float* x, float* y, float* workspace,
                         int threads) {
  const int64_t oh = s.out_h(), ow = s.out_w(), in_plane = s.h * s.w, out_plane = oh * ow;
  const ColumnWindows cols = ColumnsOf(s);
  const bool two_by_two = TwoByTwo(s);
  ForEachPlane(s, threads, [&](int64_t p) {
    const float* xp = x + p * in_plane;
    float* yp = y + p * out_plane;
    float* wp = workspace + p * out_plane;
    for (int64_t i = 0; i < oh; ++i) {
      if (two_by_two) {
        const int64_t h = 2 * i;
        Max2x2Row(xp + h * s.w, xp + (h + 1) * s.w, static_cast<int32_t>(h * s.w),
                  static_cast<int32_t>(s.w), ow, yp + i * ow, wp + i * ow);
        continue;
      }
      const Rows rows = RowsOf(s, i);
      for (int64_t j = 0; j < ow; ++j) {
        // The window's pixels in the image, in row-major order.
        int32_t best = static_cast<int32_t>(rows.h0 * s.w + cols.w0[j]);
        float max = xp[best];
        for (int64_t h = rows.h0; h < rows.h1; ++h) {
          for (int64_t w = cols.w0[j]; w < cols.w1[j]; ++w) {
            if (Replaces(xp[h * s.w + w], max)) {
              max = xp[h * s.w + w];
              best = static_cast<int32_t>(h * s.w + w);
            }
          }
        }
        yp[i * ow + j] = max;
        std::memcpy(wp + i * ow + j, &best, sizeof(best));
      }
    }
  });
}

void CpuMaxPool2DBackward(const Pool2DShape& s, const float* workspace, const float* dy,
                          float* dx, int threads) {
  const int64_t in_plane = s.h * s.w, out_plane = s.out_h() * s.out_w();
  ForEachPlane(s, threads, [&](int64_t p) {
    float* dxp = dx + p * in_plane;
    const float* dyp = dy + p * out_plane;
    const float* wp = workspace + p * out_plane;
    std::fill(dxp, dxp + in_plane, 0.0f);
    for (int64_t o = 0; o < out_plane; ++o) {
      int32_t at;
      std::memcpy(&at, wp + o, sizeof(at));
      dxp[at] += dyp[o];
    }
  });
}

void CpuAvgPool2DForward(const Pool2DShape& s, const float* x, float* y, int threads) {
  const int64_t oh = s.out_h(), ow = s.out_w(), in_plane = s.h * s.w, out_plane = oh * ow;
  const ColumnWindows cols = ColumnsOf(s);
  const bool two_by_two = TwoByTwo(s);
  ForEachPlane(s, threads, [&](int64_t p) {
    const float* xp = x + p * in_plane;
    float* yp = y + p * out_plane;
    for (int64_t i = 0; i < oh; ++i) {
      if (two_by_two) {
        Avg2x2Row(xp + 2 * i * s.w, xp + (2 * i + 1) * s.w, ow, yp + i * ow);
        continue;
      }
      const Rows rows = RowsOf(s, i);
      for (int64_t j = 0; j < ow; ++j) {
        float sum = 0.0f;  // in row-major order
        for (int64_t h = rows.h0; h < rows.h1; ++h) {
          for (int64_t w = cols.w0[j]; w < cols.w1[j]; ++w) sum += xp[h * s.w + w];
        }
        yp[i * ow + j] = sum / static_cast<float>((rows.h1 - rows.h0) * (cols.w1[j] - cols.w0[j]));
      }
    }
  });
}

void CpuAvgPool2DBackward(const Pool2DShape& s, const float* dy, float* dx, int threads) {
  const int64_t oh = s.out_h(), ow = s.out_w(), in_plane = s.h * s.w, out_plane = oh * ow;
  const ColumnWindows cols = ColumnsOf(s);
  const bool two_by_two = TwoByTwo(s);
  // 2x2 windows at stride 2 do not overlap: each pixel in one gets 0 + its
  // dy / 4 (what the general loop adds it up to), written once; the
  // dropped last row or column, zero.
  const bool every_pixel_once = two_by_two && s.h % 2 == 0 && s.w % 2 == 0;
  ForEachPlane(s, threads, [&](int64_t p) {
    float* dxp = dx + p * in_plane;
    const float* dyp = dy + p * out_plane;
    if (!every_pixel_once) std::fill(dxp, dxp + in_plane, 0.0f);
    for (int64_t i = 0; i < oh; ++i) {
      if (two_by_two) {
        float* d0 = dxp + 2 * i * s.w;
        float* d1 = d0 + s.w;
        for (int64_t j = 0; j < ow; ++j) {
          const float g = 0.0f + dyp[i * ow + j] / 4.0f;
          d0[2 * j] = d0[2 * j + 1] = d1[2 * j] = d1[2 * j + 1] = g;
        }
        continue;
      }
      const Rows rows = RowsOf(s, i);
      for (int64_t j = 0; j < ow; ++j) {
        const float g =
            dyp[i * ow + j] / static_cast<float>((rows.h1 - rows.h0) * (cols.w1[j] - cols.w0[j]));
        for (int64_t h = rows.h0; h < rows.h1; ++h) {
          for (int64_t w = cols.w0[j]; w < cols.w1[j]; ++w) dxp[h * s.w + w] += g;
        }
      }
    }
  });
}

}  // namespace towerps::worker
