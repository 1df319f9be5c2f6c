#include "worker/device/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "worker/device/cpu_team.h"

namespace towerps::worker {
namespace {

// Below this many multiply-adds one thread is as fast: waking the team
// costs a few microseconds, which a product of 256x10x256 (about 30 us on
// one core) barely repays. Shape alone decides whether a product is
// transposed, so this bound does too, whatever the thread count.
constexpr int64_t kMinSplitMacs = int64_t{1} << 18;

// The largest C computed as its transpose (its scratch, per calling thread,
// is kept for the next call): 16 MB.
constexpr int64_t kMaxTransposed = int64_t{1} << 22;

struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  const float* b;
  float beta;
  float* c;
};

// Rows [m0, m1) of C: one single-threaded cblas_sgemm.
void Rows(const Product& p, int64_t m0, int64_t m1) {
  if (m1 <= m0) return;
  const int lda = static_cast<int>(p.trans_a ? p.m : p.k);
  const int ldb = static_cast<int>(p.trans_b ? p.k : p.n);
  const float* a = p.trans_a ? p.a + m0 : p.a + m0 * p.k;
  cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans,
              p.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m1 - m0),
              static_cast<int>(p.n), static_cast<int>(p.k), p.alpha, a, lda, p.b, ldb, p.beta,
              p.c + m0 * p.n, static_cast<int>(p.n));
}

// Block `i` of `parts`: an even share of the `units` granules of rows.
void Part(const Product& p, int64_t granule, int64_t units, int64_t i, int64_t parts) {
  Rows(p, units * i / parts * granule, std::min(p.m, units * (i + 1) / parts * granule));
}

// Computes `p` on up to `threads` blocks of whole granules; returns how many.
int SplitRows(const Product& p, int threads, int64_t granule) {
  const int64_t units = (p.m + granule - 1) / granule;
  const int64_t team = std::min<int64_t>(threads, units);
  if (team < 2 || p.m * p.n * p.k < kMinSplitMacs) {
    Rows(p, 0, p.m);
    return 1;
  }
  int used = 0;
  RunOnTeam(static_cast<int>(team), [&](int part, int parts) {
    Part(p, granule, units, part, parts);
    if (part == 0) used = parts;
  });
  return used;
}

// Whether blocks of `granule` rows each give the unsplit bits for every probe.
bool GranuleIsExact(int64_t granule) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Rows: tails of every size class. Columns and k: a k past OpenBLAS's K
  // blocking (its Q, a few hundred) and a tiny one; a product large enough
  // for OpenBLAS's general kernels while its blocks are small (a build
  // whose small-matrix kernels took the blocks would differ).
  const int64_t shapes[][3] = {{3 * granule + 5, 37, 300},
                               {2 * granule + 1, 19, 7},
                               {4 * granule - 1, 64, 520},
                               {granule + 7, 5, 33},
                               {8 * granule + 3, 128, 1100}};
  for (const auto& shape : shapes) {
    for (int t = 0; t < 4; ++t) {
      if (shape[2] > 1000 && t > 0) break;  // the large one once
      const int64_t m = shape[0], n = shape[1], k = shape[2];
      std::vector<float> a(m * k), b(k * n), c0(m * n), c1(m * n);
      for (float& x : a) x = u(gen);
      for (float& x : b) x = u(gen);
      for (float& x : c0) x = u(gen);
      c1 = c0;
      const float beta = t == 1 || t == 2 ? 0.75f : 0.0f;
      Product p{(t & 1) != 0, (t & 2) != 0, m, n, k, 1.25f, a.data(), b.data(), beta, c0.data()};
      Rows(p, 0, m);
      p.c = c1.data();
      const int64_t units = (m + granule - 1) / granule;
      for (int64_t i = 0; i < units; ++i) Part(p, granule, units, i, units);
      if (std::memcmp(c0.data(), c1.data(), c0.size() * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

int FindGranule() {
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(1);
  int found = 0;
  for (int g : {4, 8, 12, 16, 24, 32, 48, 64}) {
    if (GranuleIsExact(g)) {
      found = g;
      break;
    }
  }
  openblas_set_num_threads(saved);
  return found;
}

}  // namespace

int CpuGemmRowGranule() {
  static const int granule = FindGranule();
  return granule;
}

int CpuGemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const float* a, const float* b, float beta, float* c) {
  const int64_t granule = CpuGemmRowGranule();
  const Product p{trans_a, trans_b, m, n, k, alpha, a, b, beta, c};
  if (granule == 0) {
    Rows(p, 0, m);
    return 1;
  }
  // Shape alone decides (see the header): too few rows, enough columns.
  if (m >= 2 * granule || n < 2 * granule || m * n * k < kMinSplitMacs ||
      m * n > kMaxTransposed) {
    return SplitRows(p, threads, granule);
  }
  // C^T [n, m] = op(B)^T [n, k] op(A)^T [k, m]: op(B)^T is B as stored
  // read the other way, and so is op(A)^T.
  thread_local std::vector<float> transposed;
  transposed.resize(static_cast<size_t>(n * m));
  const Product t{!trans_b, !trans_a, n, m, k, 1.0f, b, a, 0.0f, transposed.data()};
  const int blocks = SplitRows(t, threads, granule);
  const float* ct = transposed.data();
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * n;
    if (beta == 0.0f) {  // C is not read: it may hold NaN
      for (int64_t j = 0; j < n; ++j) row[j] = alpha * ct[j * m + i];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = alpha * ct[j * m + i] + beta * row[j];
    }
  }
  return blocks;
}

}  // namespace towerps::worker
