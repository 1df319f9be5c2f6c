// Test-only helpers shared by the ParameterClient tests (ps_client_test,
// ps_streams_test): a small three-variable job whose pushes and pulls are
// exact in float, its buffers, and a state-polling wait with a deadline.
#ifndef TOWERPS_WORKER_TRAIN_PS_CLIENT_TESTING_H_
#define TOWERPS_WORKER_TRAIN_PS_CLIENT_TESTING_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/local_ps_cluster.h"
#include "worker/train/ps_client.h"

namespace towerps::worker::testing_ps {

// Generous: only reached when something is broken.
inline constexpr absl::Duration kStateDeadline = absl::Seconds(30);

// Polls `done` (cheap, state-based) until it holds or kStateDeadline passes.
template <typename Fn>
bool WaitFor(Fn done) {
  const absl::Time deadline = absl::Now() + kStateDeadline;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

inline v1::VariableDef Var(const std::string& name, std::vector<int64_t> shape) {
  v1::VariableDef v;
  v.set_name(name);
  for (int64_t d : shape) v.add_shape(d);
  v.set_dtype(v1::DT_FLOAT32);
  v.mutable_initializer()->set_type(v1::Initializer::CONSTANT);
  v.mutable_initializer()->set_value(1.0f);
  return v;
}

// Three variables of different sizes: GREEDY_BYTES over two servers puts the
// largest alone on ps 0 and the two others on ps 1.
inline std::vector<v1::VariableDef> Vars() {
  return {Var("big", {64, 40}), Var("mid", {40}), Var("small", {3})};
}

// lr and gradients are powers of two and small integers: w0 - lr * g is exact
// in float, so pulled values can be compared with ==.
inline constexpr float kLr = 0.25f;

inline v1::TrainingConfig Config(v1::Mode mode, int num_workers) {
  v1::TrainingConfig c;
  c.set_mode(mode);
  c.set_num_workers(num_workers);
  c.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
  c.mutable_optimizer()->set_learning_rate(kLr);
  c.set_peer_timeout_s(60);  // the servers' patience with silent workers
  return c;
}

inline ParameterClientOptions Options(const LocalPsCluster& cluster,
                               const std::string& job) {
  ParameterClientOptions o;
  o.ps_addresses = cluster.addresses();
  o.job_id = job;
  // The smallest allowed: "big" (10 KiB) travels in several messages each
  // way.
  o.chunk_bytes = 4096;
  // Short server-side waits (peer_timeout / 4 = 1 s) so that waits in these
  // tests re-check cancellation and liveness often.
  o.peer_timeout = absl::Seconds(4);
  return o;
}

inline std::unique_ptr<ParameterClient> NewClient(
    ParameterClientOptions o, std::vector<v1::VariableDef> vars = Vars()) {
  auto c =
      NewGrpcParameterClient(std::move(o), std::move(vars), v1::GREEDY_BYTES);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// Tensors shaped like `vars`, and pointers to them as Pull/Push take them.
struct Buffers {
  explicit Buffers(const std::vector<v1::VariableDef>& vars,
                   float fill = -7.0f) {
    for (const auto& v : vars) {
      tensors.emplace_back(
          std::vector<int64_t>(v.shape().begin(), v.shape().end()));
      tensors.back().Fill(fill);
    }
    for (auto& t : tensors) {
      ptrs.push_back(&t);
      const_ptrs.push_back(&t);
    }
  }
  std::vector<common::Tensor> tensors;
  std::vector<common::Tensor*> ptrs;
  std::vector<const common::Tensor*> const_ptrs;
};

// Gradient of variable v, element i: small integers, distinct per variable.
inline float Grad(int v, int64_t i) { return static_cast<float>((i % 5) + 1 + 2 * v); }

inline Buffers Grads() {
  Buffers g(Vars());
  for (size_t v = 0; v < g.tensors.size(); ++v) {
    for (int64_t i = 0; i < g.tensors[v].num_elements(); ++i)
      g.tensors[v][i] = Grad(v, i);
  }
  return g;
}

}  // namespace towerps::worker::testing_ps

#endif  // TOWERPS_WORKER_TRAIN_PS_CLIENT_TESTING_H_
