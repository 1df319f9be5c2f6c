#include "worker/device/cpu_gemm.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cpu_threads.h"

namespace towerps::worker {
namespace {

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float beta;
};

struct Operands {
  std::vector<float> a, b, c;
};

Operands Make(const Case& x, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Operands o{std::vector<float>(x.m * x.k), std::vector<float>(x.k * x.n),
             std::vector<float>(x.m * x.n)};
  for (float& v : o.a) v = u(gen);
  for (float& v : o.b) v = u(gen);
  for (float& v : o.c) v = u(gen);
  return o;
}

// C after CpuGemm at `threads`; *blocks gets how many blocks ran at once.
std::vector<float> Compute(const Case& x, const Operands& o, int threads, int* blocks) {
  std::vector<float> c = o.c;
  *blocks = CpuGemm(threads, x.trans_a, x.trans_b, x.m, x.n, x.k, 1.5f, o.a.data(), o.b.data(),
                    x.beta, c.data());
  return c;
}

// The MLP's products (forward, weight gradient, input gradient at batch
// 256 and at a ragged last batch of 100) and ragged shapes around the
// granules, each transpose combination, beta 0 and not.
std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {false, false, 256, 256, 784, 0.0f}, {true, false, 784, 256, 256, 0.0f},
      {false, true, 256, 784, 256, 0.0f},  {false, false, 256, 10, 256, 0.0f},
      {true, false, 256, 10, 256, 0.0f},   {false, true, 256, 256, 10, 0.0f},
      {false, false, 100, 256, 784, 0.0f}, {true, false, 784, 256, 100, 0.0f},
      // The dense stack's at batch 10: too few rows, split by columns.
      {false, false, 10, 1000, 1000, 0.0f}, {false, true, 10, 1000, 1000, 0.0f},
      {true, false, 1000, 1000, 10, 0.0f},  {false, false, 10, 100, 1000, 0.0f},
  };
  for (int64_t n : {1, 15, 17, 25, 63, 65, 257}) {  // few rows: as the transpose
    for (int t = 0; t < 4; ++t) {
      cases.push_back({(t & 1) != 0, (t & 2) != 0, 5, n, 4000, t < 2 ? 0.0f : 0.5f});
    }
  }
  // Taller than OpenBLAS's blocking of C's rows (its GEMM_R, 13,824 rows on
  // Haswell-class kernels).
  cases.push_back({false, false, 14000, 16, 300, 0.0f});
  cases.push_back({true, true, 14000, 16, 300, 0.5f});
  for (int64_t m : {1, 11, 13, 47, 49, 97, 257}) {
    for (int t = 0; t < 4; ++t) {
      cases.push_back({(t & 1) != 0, (t & 2) != 0, m, 67, 300, t < 2 ? 0.0f : 0.5f});
    }
  }
  return cases;
}

TEST(CpuGemmTest, FindsAnExactGranuleOnThisCpu) {
  // 12 rows on the Zen kernels of Debian's OpenBLAS 0.3.21 (CI's machines);
  // should a CPU have none, GEMMs fall back to OpenBLAS's threads and the
  // tests below fail for want of a split: say which kernel.
  const int g = CpuGemmRowGranule();
  EXPECT_TRUE(g == 4 || g == 8 || g == 12 || g == 16 || g == 24 || g == 32 || g == 48 ||
              g == 64)
      << "granule " << g << " for OpenBLAS kernels " << openblas_get_corename();
}

TEST(CpuGemmTest, SameBitsAtEveryThreadCount) {
  ASSERT_EQ(openblas_get_num_threads(), 1);  // the test main's SetCpuMathThreads(1)
  int split_cases = 0;
  unsigned seed = 1;
  for (const Case& x : Cases()) {
    SCOPED_TRACE(testing::Message() << "m=" << x.m << " n=" << x.n << " k=" << x.k
                                    << " trans_a=" << x.trans_a << " trans_b=" << x.trans_b
                                    << " beta=" << x.beta);
    const Operands o = Make(x, seed++);
    int blocks = 0;
    const std::vector<float> one = Compute(x, o, 1, &blocks);
    EXPECT_EQ(blocks, 1);
    bool split = false;
    for (int threads : {2, 3, 4, 7}) {
      const std::vector<float> many = Compute(x, o, threads, &blocks);
      EXPECT_LE(blocks, threads);
      split = split || blocks > 1;
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
          << threads << " threads in " << blocks << " blocks";
    }
    split_cases += split;
  }
  // Every case ran split but those below kMinSplitMacs (1, 11 or 13 rows of
  // 67 columns) and those with under two granules of rows and of columns
  // (5 rows of 1, 15 or 17 columns), 4 transpose combinations each.
  EXPECT_EQ(split_cases, static_cast<int>(Cases().size()) - 24);
}

TEST(CpuGemmTest, SplitsIntoWholeGranulesAndNeverMoreBlocksThanThreads) {
  const int g = CpuGemmRowGranule();
  ASSERT_GT(g, 0);
  int blocks = 0;
  // Two granules of rows: two blocks, however many threads.
  const Case rows{false, false, 2 * g, 8, 8192, 0.0f};
  const Operands o = Make(rows, 99);
  Compute(rows, o, 8, &blocks);
  EXPECT_EQ(blocks, 2);
  // Fewer rows than two granules: the transpose's rows, one block per thread.
  const Case few{false, false, 2 * g - 1, 8 * g, 2048, 0.0f};
  const Operands of = Make(few, 100);
  Compute(few, of, 4, &blocks);
  EXPECT_EQ(blocks, 4);
  Compute(few, of, 16, &blocks);
  EXPECT_EQ(blocks, 8);
  // Too little work to wake a team.
  const Case small{false, false, 4 * g, 4, 4, 0.0f};
  const Operands os = Make(small, 101);
  Compute(small, os, 4, &blocks);
  EXPECT_EQ(blocks, 1);
}

void CheckAgainstDoubles(const Case& x) {
  SCOPED_TRACE(testing::Message() << "m=" << x.m << " n=" << x.n << " k=" << x.k);
  const Operands o = Make(x, 5);
  int blocks = 0;
  const std::vector<float> c = Compute(x, o, 3, &blocks);
  EXPECT_GT(blocks, 1);
  // Each element is a sum of k products in float: |error| <= (k + 2) * eps
  // * (sum of |alpha a b| + |beta c|), up to second-order terms.
  const double eps = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < x.m; ++i) {
    for (int64_t j = 0; j < x.n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t l = 0; l < x.k; ++l) {
        const double p = 1.5 * (x.trans_a ? o.a[l * x.m + i] : o.a[i * x.k + l]) *
                         (x.trans_b ? o.b[j * x.k + l] : o.b[l * x.n + j]);
        exact += p;
        magnitude += std::fabs(p);
      }
      const double old = x.beta * o.c[i * x.n + j];
      exact += old;
      magnitude += std::fabs(old);
      ASSERT_NEAR(c[i * x.n + j], exact, (x.k + 2) * eps * magnitude * 1.01)
          << "C[" << i << "][" << j << "]";
    }
  }
}

TEST(CpuGemmTest, MatchesADoubleReferenceWithinItsRoundingBound) {
  for (const Case& x : {Case{true, true, 97, 45, 300, 0.5f},  // by rows
                        Case{true, true, 7, 300, 200, 0.5f},  // as the transpose
                        Case{false, false, 7, 300, 200, 0.0f}}) {
    CheckAgainstDoubles(x);
  }
}

TEST(CpuGemmTest, ConcurrentCallersEachGetTheirOwnTeamAndTheSameBits) {
  const Case x{false, false, 256, 256, 784, 0.0f};
  const Operands o = Make(x, 11);
  int blocks = 0;
  const std::vector<float> one = Compute(x, o, 1, &blocks);
  std::vector<float> c1, c2;
  int b1 = 0, b2 = 0;
  std::thread t1([&] { c1 = Compute(x, o, 2, &b1); });
  std::thread t2([&] { c2 = Compute(x, o, 3, &b2); });
  t1.join();
  t2.join();
  EXPECT_GT(b1, 1);
  EXPECT_GT(b2, 1);
  EXPECT_EQ(std::memcmp(one.data(), c1.data(), one.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.data(), c2.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace towerps::worker
