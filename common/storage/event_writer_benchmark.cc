// MakeHistogram's speed on weight-like values (a TensorBoard histogram of
// every variable at each epoch's end runs on the chief's training thread):
// nanoseconds per value for a few sizes, with the count and the sum checked
// against a plain loop in the same run (`wrong`).
//
//   bazel run -c opt //common/storage:event_writer_benchmark
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "common/storage/event_writer.h"

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::printf("%12s %8s %10s %6s\n", "values", "reps", "ns/value", "wrong");
  int wrong_total = 0;
  for (const int n : {1 << 10, 1 << 16, 1 << 20, 10 << 20}) {
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    double sum = 0;
    for (float v : values) sum += v;
    const int reps = std::max(3, (40 << 20) / n);
    int wrong = 0;
    (void)towerps::common::MakeHistogram(values);  // warm: the table, the pages
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      auto h = towerps::common::MakeHistogram(values);
      if (!h.ok() || h->num() != n || h->sum() != sum) ++wrong;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%12d %8d %10.2f %6d\n", n, reps, 1e9 * s / (double(n) * reps), wrong);
    wrong_total += wrong;
  }
  return wrong_total == 0 ? 0 : 1;
}
