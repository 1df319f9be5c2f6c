// The CPU backend's pooling kernels against their definition written here
// with plain loops: max pooling exactly (the max is one of the inputs, the
// first of equal maxima wins, a NaN wins; the backward adds in output
// order), and the bits of both kinds at every thread count.
// backend_conv_test checks both kinds against a double-precision reference
// through the Backend interface.
#include "worker/device/cpu_pool.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/conv_shape.h"

namespace towerps::worker {
namespace {

Pool2DShape Pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t r, int64_t s, int stride_h,
                 int stride_w, int pad_h, int pad_w) {
  Pool2DShape p;
  p.n = n, p.c = c, p.h = h, p.w = w, p.r = r, p.s = s;
  p.stride_h = stride_h, p.stride_w = stride_w, p.pad_h = pad_h, p.pad_w = pad_w;
  return p;
}

// 2x2 at stride 2 (the SIMD path: 13 columns are 3 blocks of 4 and one
// more; 2 columns none), clipped windows, overlapping ones, uneven ones,
// global pooling.
std::vector<Pool2DShape> Shapes() {
  return {Pool(2, 3, 26, 26, 2, 2, 2, 2, 0, 0), Pool(2, 3, 7, 5, 2, 2, 2, 2, 0, 0),
          Pool(2, 3, 9, 17, 2, 2, 2, 2, 0, 0),  Pool(2, 3, 7, 5, 3, 3, 2, 2, 1, 1),
          Pool(2, 3, 7, 5, 3, 3, 1, 1, 1, 1),   Pool(2, 3, 7, 5, 3, 2, 1, 2, 0, 1),
          Pool(2, 3, 7, 5, 2, 2, 1, 1, 0, 0),   Pool(2, 3, 7, 5, 7, 5, 1, 1, 0, 0)};
}

// Few distinct values, so that windows often hold equal maxima (as ReLU's
// zeros do), and now and then a NaN.
std::vector<float> TiedValues(int64_t n, unsigned seed, bool nans) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, 40);
  std::vector<float> v(n);
  for (float& x : v) {
    const int k = pick(gen);
    x = nans && k == 40 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(k % 4);
  }
  return v;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The definition: each window's pixels in the image in row-major order; a
// pixel replaces the max if greater, or if it is a NaN and the max is not.
void DefinedMax(const Pool2DShape& s, const std::vector<float>& x, std::vector<float>* y,
                std::vector<int64_t>* arg) {
  y->assign(s.y_size(), 0);
  arg->assign(s.y_size(), -1);
  for (int64_t p = 0; p < s.n * s.c; ++p) {
    for (int64_t i = 0; i < s.out_h(); ++i) {
      for (int64_t j = 0; j < s.out_w(); ++j) {
        const int64_t o = (p * s.out_h() + i) * s.out_w() + j;
        for (int64_t u = 0; u < s.r; ++u) {
          for (int64_t v = 0; v < s.s; ++v) {
            const int64_t h = i * s.stride_h - s.pad_h + u, w = j * s.stride_w - s.pad_w + v;
            if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
            const int64_t at = (p * s.h + h) * s.w + w;
            const float m = (*y)[o], e = x[at];
            if ((*arg)[o] < 0 || e > m || (std::isnan(e) && !std::isnan(m))) {
              (*y)[o] = e;
              (*arg)[o] = at;
            }
          }
        }
      }
    }
  }
}

TEST(CpuPoolTest, MaxIsTheFirstOfEqualMaximaAndNaNWins) {
  for (const Pool2DShape& s : Shapes()) {
    ASSERT_TRUE(s.Validate().ok()) << s.DebugString();
    for (bool nans : {false, true}) {
      const std::string what = s.DebugString() + (nans ? " with NaNs" : "");
      const std::vector<float> x = TiedValues(s.x_size(), 5, nans);
      std::vector<float> want_y;
      std::vector<int64_t> arg;
      DefinedMax(s, x, &want_y, &arg);
      std::vector<float> y(s.y_size(), -7.0f), ws(s.workspace_size());
      CpuMaxPool2DForward(s, x.data(), y.data(), ws.data(), 1);
      int64_t nan_outputs = 0;
      for (int64_t o = 0; o < s.y_size(); ++o) {
        ASSERT_TRUE(SameBits(y[o], want_y[o])) << what << " output " << o << ": " << y[o]
                                                << ", defined " << want_y[o];
        nan_outputs += std::isnan(y[o]);
      }
      EXPECT_EQ(nan_outputs > 0, nans) << what;

      // The backward routes each dy to the winner the forward recorded,
      // adding in output order.
      const std::vector<float> dy = TiedValues(s.y_size(), 6, false);
      std::vector<float> want_dx(s.x_size(), 0.0f);
      for (int64_t o = 0; o < s.y_size(); ++o) want_dx[arg[o]] += dy[o] + 0.5f;
      std::vector<float> shifted(dy);
      for (float& d : shifted) d += 0.5f;
      std::vector<float> dx(s.x_size(), -7.0f);
      CpuMaxPool2DBackward(s, ws.data(), shifted.data(), dx.data(), 1);
      for (int64_t i = 0; i < s.x_size(); ++i) {
        ASSERT_TRUE(SameBits(dx[i], want_dx[i])) << what << " dx " << i << ": " << dx[i]
                                                  << ", defined " << want_dx[i];
      }
    }
  }
}

// Average pooling as cpu_pool.h defines it, in float: each window's pixels
// in the image summed from 0 in row-major order, divided by their count;
// the backward adds each dy / count to its window's pixels, windows in
// output order. The 2x2 SIMD paths must give these bits too.
TEST(CpuPoolTest, AvgIsTheDefinitionBitForBit) {
  for (const Pool2DShape& s : Shapes()) {
    std::mt19937 gen(11);
    std::normal_distribution<float> normal;
    std::vector<float> x(s.x_size()), dy(s.y_size());
    for (float& v : x) v = normal(gen);
    for (float& v : dy) v = normal(gen);
    std::vector<float> want_y(s.y_size()), want_dx(s.x_size(), 0.0f);
    for (int64_t p = 0; p < s.n * s.c; ++p) {
      for (int64_t i = 0; i < s.out_h(); ++i) {
        for (int64_t j = 0; j < s.out_w(); ++j) {
          const int64_t o = (p * s.out_h() + i) * s.out_w() + j;
          std::vector<int64_t> pixels;
          for (int64_t u = 0; u < s.r; ++u) {
            for (int64_t v = 0; v < s.s; ++v) {
              const int64_t h = i * s.stride_h - s.pad_h + u, w = j * s.stride_w - s.pad_w + v;
              if (h >= 0 && h < s.h && w >= 0 && w < s.w) pixels.push_back((p * s.h + h) * s.w + w);
            }
          }
          const float count = static_cast<float>(pixels.size());
          float sum = 0.0f;
          for (int64_t at : pixels) sum += x[at];
          want_y[o] = sum / count;
          for (int64_t at : pixels) want_dx[at] += dy[o] / count;
        }
      }
    }
    std::vector<float> y(s.y_size(), -7.0f), dx(s.x_size(), -7.0f);
    CpuAvgPool2DForward(s, x.data(), y.data(), 1);
    CpuAvgPool2DBackward(s, dy.data(), dx.data(), 1);
    for (int64_t o = 0; o < s.y_size(); ++o) {
      ASSERT_TRUE(SameBits(y[o], want_y[o]))
          << s.DebugString() << " output " << o << ": " << y[o] << ", defined " << want_y[o];
    }
    for (int64_t i = 0; i < s.x_size(); ++i) {
      ASSERT_TRUE(SameBits(dx[i], want_dx[i]))
          << s.DebugString() << " dx " << i << ": " << dx[i] << ", defined " << want_dx[i];
    }
  }
}

// Each plane is pooled by one thread in a fixed order, so the thread count
// moves no bit (a shape large enough to be shared out).
TEST(CpuPoolTest, SameBitsAtEveryThreadCount) {
  std::vector<Pool2DShape> shapes = Shapes();
  for (Pool2DShape& s : shapes) s.n = 64;
  for (const Pool2DShape& s : shapes) {
    std::mt19937 gen(9);
    std::normal_distribution<float> normal;
    std::vector<float> x(s.x_size()), dy(s.y_size());
    for (float& v : x) v = normal(gen);
    for (float& v : dy) v = normal(gen);
    struct Out {
      std::vector<float> max_y, ws, max_dx, avg_y, avg_dx;
    };
    auto run = [&](int threads) {
      Out o{std::vector<float>(s.y_size()), std::vector<float>(s.workspace_size()),
            std::vector<float>(s.x_size()), std::vector<float>(s.y_size()),
            std::vector<float>(s.x_size())};
      CpuMaxPool2DForward(s, x.data(), o.max_y.data(), o.ws.data(), threads);
      CpuMaxPool2DBackward(s, o.ws.data(), dy.data(), o.max_dx.data(), threads);
      CpuAvgPool2DForward(s, x.data(), o.avg_y.data(), threads);
      CpuAvgPool2DBackward(s, dy.data(), o.avg_dx.data(), threads);
      return o;
    };
    const Out one = run(1);
    for (int threads : {2, 3, 4, 7}) {
      const Out o = run(threads);
      const std::string what = s.DebugString() + " at " + std::to_string(threads) + " threads";
      EXPECT_EQ(0, std::memcmp(o.max_y.data(), one.max_y.data(), s.y_size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(o.ws.data(), one.ws.data(), s.y_size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(o.max_dx.data(), one.max_dx.data(), s.x_size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(o.avg_y.data(), one.avg_y.data(), s.y_size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(o.avg_dx.data(), one.avg_dx.data(), s.x_size() * 4)) << what;
    }
  }
}

}  // namespace
}  // namespace towerps::worker
