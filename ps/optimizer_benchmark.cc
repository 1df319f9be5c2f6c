// The server's update rules, alone: nanoseconds per element of Apply() for
// each rule at a cache-sized and a memory-sized variable. The rules we loop
// ourselves (momentum, Nesterov, Adam) run once with each instruction set
// their loops are compiled for (`loops`: baseline SSE2, and AVX2 where the
// CPU has it; ps::UpdateLoops), each checked in the same run against a
// plain one-element-at-a-time loop of the same formula (`wrong`: elements
// whose bits differ after the timed updates); SGD is OpenBLAS's saxpy.
//
//   bazel run -c opt //ps:optimizer_benchmark [-- --elements=1048576,10485760]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ps/optimizer.h"

namespace {

using towerps::v1::OptimizerSpec;

struct Case {
  const char* name;
  OptimizerSpec spec;
  bool checked;
};

// The reference: each formula of ps/optimizer.cc, one element at a time.
void Reference(const OptimizerSpec& s, int64_t step, std::vector<float>& w,
               const std::vector<float>& g, std::vector<float>& a, std::vector<float>& b) {
  const float lr = s.learning_rate(), wd = s.weight_decay();
  for (size_t i = 0; i < w.size(); ++i) {
    const float gi = g[i] + wd * w[i];
    if (s.type() == OptimizerSpec::MOMENTUM) {
      const float m = s.momentum();
      a[i] = m * a[i] - lr * gi;
      w[i] += s.nesterov() ? m * a[i] - lr * gi : a[i];
    } else if (s.type() == OptimizerSpec::ADAM) {
      const double t = static_cast<double>(step);
      const float lr_t = static_cast<float>(static_cast<double>(lr) *
                                            std::sqrt(1.0 - std::pow(s.beta2(), t)) /
                                            (1.0 - std::pow(s.beta1(), t)));
      a[i] = s.beta1() * a[i] + (1.0f - s.beta1()) * gi;
      b[i] = s.beta2() * b[i] + (1.0f - s.beta2()) * gi * gi;
      w[i] -= lr_t * a[i] / (std::sqrt(b[i]) + s.epsilon());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1 << 20, 10 << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--elements=", 0) == 0) {
      sizes.clear();
      for (absl::string_view v : absl::StrSplit(arg.substr(11), ',')) {
        int64_t n;
        if (!absl::SimpleAtoi(v, &n) || n <= 0) {
          std::fprintf(stderr, "optimizer_benchmark: bad --elements value \"%s\"\n",
                       std::string(v).c_str());
          return 2;
        }
        sizes.push_back(n);
      }
    } else {
      std::fprintf(stderr, "usage: optimizer_benchmark [--elements=N,N...]\n");
      return 2;
    }
  }
  std::vector<Case> cases;
  auto add = [&](const char* name, OptimizerSpec::Type type, float wd, bool nesterov,
                 bool checked) {
    OptimizerSpec s;
    s.set_type(type);
    s.set_weight_decay(wd);
    s.set_nesterov(nesterov);
    cases.push_back({name, towerps::ps::OptimizerWithDefaults(s), checked});
  };
  add("sgd", OptimizerSpec::SGD, 0, false, false);
  add("sgd+wd", OptimizerSpec::SGD, 1e-4f, false, false);
  add("momentum", OptimizerSpec::MOMENTUM, 0, false, true);
  add("nesterov+wd", OptimizerSpec::MOMENTUM, 1e-4f, true, true);
  add("adam", OptimizerSpec::ADAM, 0, false, true);
  add("adam+wd", OptimizerSpec::ADAM, 1e-4f, false, true);

  std::vector<towerps::ps::UpdateLoops> all_loops = {towerps::ps::UpdateLoops::kBaseline};
  if (towerps::ps::SetUpdateLoops(towerps::ps::UpdateLoops::kAvx2).ok()) {
    all_loops.push_back(towerps::ps::UpdateLoops::kAvx2);
  }
  std::printf("%-12s %-16s %10s %6s %10s %8s\n", "rule", "loops", "elements", "reps", "ns/elem",
              "wrong");
  int64_t wrong_total = 0;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const int64_t n : sizes) {
    std::vector<float> w0(n), g(n);
    for (float& x : w0) x = normal(rng);
    for (float& x : g) x = normal(rng);
    const int reps = static_cast<int>(std::max<int64_t>(3, (64 << 20) / n));
    for (const Case& c : cases) {
      for (const towerps::ps::UpdateLoops loops : all_loops) {
        if (!c.checked && loops != all_loops.back()) continue;  // OpenBLAS's: one row
        if (!towerps::ps::SetUpdateLoops(loops).ok()) return 1;
        auto opt = towerps::ps::NewOptimizer(c.spec, n);
        if (!opt.ok()) {
          std::fprintf(stderr, "%s: %s\n", c.name, std::string(opt.status().message()).c_str());
          return 1;
        }
        std::vector<float> w = w0;
        (*opt)->Apply(absl::MakeSpan(w), g, 1);  // warm: pages, slots
        const auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) (*opt)->Apply(absl::MakeSpan(w), g, 2 + r);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        int64_t wrong = 0;
        if (c.checked) {
          std::vector<float> rw = w0, a(n, 0.0f), b(n, 0.0f);
          for (int r = 0; r <= reps; ++r) Reference(c.spec, 1 + r, rw, g, a, b);
          for (int64_t i = 0; i < n; ++i) wrong += std::memcmp(&rw[i], &w[i], sizeof(float)) != 0;
        }
        wrong_total += wrong;
        std::printf("%-12s %-16s %10lld %6d %10.3f %8s\n", c.name,
                    c.checked ? towerps::ps::UpdateLoopsName(loops) : "OpenBLAS",
                    static_cast<long long>(n), reps, 1e9 * s / (static_cast<double>(n) * reps),
                    c.checked ? std::to_string(wrong).c_str() : "-");
      }
    }
  }
  return wrong_total == 0 ? 0 : 1;
}
