#include "worker/train/placement.h"

#include <map>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/job_runner.h"

namespace towerps::worker {
namespace {

v1::VariableDef Var(const std::string& name, std::vector<int64_t> shape) {
  v1::VariableDef v;
  v.set_name(name);
  for (int64_t d : shape) v.add_shape(d);
  v.set_dtype(v1::DT_FLOAT32);
  return v;
}

std::vector<v1::VariableDef> Mlp() {
  return {Var("dense/kernel", {784, 256}),   Var("dense/bias", {256}),
          Var("dense_1/kernel", {256, 256}), Var("dense_1/bias", {256}),
          Var("dense_2/kernel", {256, 10}),  Var("dense_2/bias", {10})};
}

TEST(PlacementTest, RoundRobinAlternates) {
  auto p = PlanPlacement(Mlp(), 2, v1::ROUND_ROBIN);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->server, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(p->index_on_server, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(p->VariablesOn(1), (std::vector<int>{1, 3, 5}));
}

TEST(PlacementTest, GreedyBalancesBytes) {
  auto vars = Mlp();
  auto p = PlanPlacement(vars, 2, v1::GREEDY_BYTES);
  ASSERT_TRUE(p.ok());
  // The 784x256 kernel alone outweighs everything else: it sits alone.
  EXPECT_EQ(p->VariablesOn(p->server[0]), std::vector<int>{0});
  EXPECT_EQ(p->bytes[p->server[0]], 784 * 256 * 4);
  EXPECT_EQ(p->bytes[0] + p->bytes[1], (784 * 256 + 256 + 256 * 256 + 256 + 2560 + 10) * 4);
  auto rr = PlanPlacement(vars, 2, v1::ROUND_ROBIN);
  auto imbalance = [](const Placement& q) { return std::abs(q.bytes[0] - q.bytes[1]); };
  EXPECT_LE(imbalance(*p), imbalance(*rr));
}

TEST(PlacementTest, GreedyOnEqualSizesSpreadsEvenly) {
  std::vector<v1::VariableDef> vars;
  for (int i = 0; i < 10; ++i) vars.push_back(Var("l" + std::to_string(i), {1000, 1000}));
  auto p = PlanPlacement(vars, 3, v1::GREEDY_BYTES);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->VariablesOn(0).size(), 4u);
  EXPECT_EQ(p->VariablesOn(1).size(), 3u);
  EXPECT_EQ(p->VariablesOn(2).size(), 3u);
}

TEST(PlacementTest, DeterministicAndDescribed) {
  auto a = PlanPlacement(Mlp(), 2, v1::GREEDY_BYTES);
  auto b = PlanPlacement(Mlp(), 2, v1::GREEDY_BYTES);
  EXPECT_EQ(a->server, b->server);
  std::string d = a->Describe(Mlp());
  EXPECT_NE(d.find("ps 0:"), std::string::npos);
  EXPECT_NE(d.find("dense/kernel"), std::string::npos);
}

TEST(PlacementTest, RejectsBadInput) {
  EXPECT_EQ(PlanPlacement(Mlp(), 0, v1::ROUND_ROBIN).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = PlanPlacement({Var("x", {3, 0})}, 1, v1::ROUND_ROBIN);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"x\""), std::string::npos);
}

// Every element of every variable is in exactly one part, the parts of each
// server are numbered 0, 1, ... and `bytes` counts them.
void ExpectCoversExactly(const Placement& p, const std::vector<v1::VariableDef>& vars, int num_ps) {
  std::vector<int64_t> next(vars.size(), 0), bytes(num_ps, 0);
  for (const auto& part : p.parts) {  // by variable, then offset
    ASSERT_LT(part.var, static_cast<int>(vars.size()));
    EXPECT_EQ(part.offset, next[part.var]) << vars[part.var].name();
    EXPECT_GT(part.count, 0);
    next[part.var] += part.count;
    bytes[part.server] += part.count * 4;
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_EQ(next[i] * 4, VariableBytes(vars[i])) << vars[i].name();
  }
  EXPECT_EQ(bytes, p.bytes);
  for (int s = 0; s < num_ps; ++s) {
    const auto on = p.PartsOn(s);
    for (size_t k = 0; k < on.size(); ++k) EXPECT_EQ(on[k].index_on_server, static_cast<int>(k));
  }
}

// Issue 16, done-when 2: with PARTITIONED (the default) no ps holds more than
// 1/n + 10% of the bytes of the MLP and dense-stack jobs.
TEST(PlacementTest, PartitionedBalancesTheBuiltInModels) {
  for (const char* model : {"mlp", "dense_stack"}) {
    auto job = BuiltinJob(model);
    ASSERT_TRUE(job.ok()) << job.status();
    auto vars = JobVariables(*job);
    ASSERT_TRUE(vars.ok()) << vars.status();
    int64_t total = 0;
    for (const auto& v : *vars) total += VariableBytes(v);
    for (int n : {2, 3, 4, 5}) {
      for (auto strategy : {v1::PARTITIONED, v1::PLACEMENT_UNSPECIFIED}) {
        auto p = PlanPlacement(*vars, n, strategy);
        ASSERT_TRUE(p.ok()) << p.status();
        ExpectCoversExactly(*p, *vars, n);
        const int64_t most = *std::max_element(p->bytes.begin(), p->bytes.end());
        EXPECT_LE(static_cast<double>(most) / total, 1.0 / n + 0.10)
            << model << " on " << n << " ps: " << p->Describe(*vars);
      }
    }
  }
  // Without it, the MLP's first kernel alone is 75% of the bytes.
  auto mlp = PlanPlacement(Mlp(), 2, v1::GREEDY_BYTES);
  EXPECT_GT(*std::max_element(mlp->bytes.begin(), mlp->bytes.end()),
            0.7 * (mlp->bytes[0] + mlp->bytes[1]));
}

TEST(PlacementTest, PartitionedSplitsOnlyLargeVariablesIntoNamedOneDimensionalParts) {
  auto vars = Mlp();
  vars[0].mutable_initializer()->set_type(v1::Initializer::GLOROT_UNIFORM);
  vars[0].mutable_initializer()->set_seed(3);
  auto p = PlanPlacement(vars, 2, v1::PARTITIONED);
  ASSERT_TRUE(p.ok());
  std::map<int, std::vector<VariablePart>> by_var;
  for (const auto& part : p->parts) by_var[part.var].push_back(part);
  ASSERT_EQ(by_var[0].size(), 2u);  // 784x256: 75% of the model
  EXPECT_NE(by_var[0][0].server, by_var[0][1].server);
  EXPECT_EQ(by_var[1].size(), 1u);  // a bias stays whole, under its own name
  EXPECT_EQ(PartDef(vars[1], by_var[1][0]).name(), "dense/bias");
  const v1::VariableDef second = PartDef(vars[0], by_var[0][1]);
  EXPECT_EQ(second.name(), "dense/kernel/part-1-of-2");
  ASSERT_EQ(second.shape_size(), 1);
  EXPECT_EQ(second.shape(0), by_var[0][1].count);
  EXPECT_EQ(second.initializer().offset(), by_var[0][1].offset);
  EXPECT_EQ(second.initializer().seed(), 3u);
  // The registered lists are the parts, in var_index order.
  const auto defs = p->DefsOn(vars, by_var[0][1].server);
  EXPECT_EQ(defs[by_var[0][1].index_on_server].name(), "dense/kernel/part-1-of-2");
  // A single server, or no variable above the threshold: nothing is split,
  // and the plan is GREEDY_BYTES's.
  auto one = PlanPlacement(vars, 1, v1::PARTITIONED);
  EXPECT_EQ(one->parts.size(), vars.size());
  std::vector<v1::VariableDef> even;
  for (int i = 0; i < 10; ++i) even.push_back(Var("l" + std::to_string(i), {100, 100}));
  auto a = PlanPlacement(even, 2, v1::PARTITIONED);  // each 10% < 1/8
  auto g = PlanPlacement(even, 2, v1::GREEDY_BYTES);
  EXPECT_EQ(a->server, g->server);
  EXPECT_EQ(a->parts.size(), even.size());
}

TEST(PlacementTest, EveryStrategyCoversEveryElementOnce) {
  for (auto strategy : {v1::ROUND_ROBIN, v1::GREEDY_BYTES, v1::PARTITIONED}) {
    for (int n : {1, 2, 3, 7}) {
      auto p = PlanPlacement(Mlp(), n, strategy);
      ASSERT_TRUE(p.ok());
      ExpectCoversExactly(*p, Mlp(), n);
    }
  }
}

}  // namespace
}  // namespace towerps::worker
