#include "worker/train/placement.h"

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

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
  return {Var("dense/kernel", {784, 256}), Var("dense/bias", {256}),
          Var("dense_1/kernel", {256, 256}), Var("dense_1/bias", {256}),
          Var("dense_2/kernel", {256, 10}), Var("dense_2/bias", {10})};
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

}  // namespace
}  // namespace towerps::worker
