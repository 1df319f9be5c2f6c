// GradientCompressor: what each server receives (read back through the
// wire format and decoded as a server does), error feedback's bookkeeping
// over many pushes, identical bytes for every attempt of a push, batch
// norm's statistics left uncompressed, NaN refused with nothing changed.
#include "worker/train/gradient_compressor.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/gradient_codec.h"
#include "common/tensor.h"
#include "common/tensor_wire.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::worker {
namespace {

v1::VariableDef Var(const std::string& name, int64_t n,
                    v1::VariableDef::Update update = v1::VariableDef::OPTIMIZER) {
  v1::VariableDef v;
  v.set_name(name);
  v.add_shape(n);
  v.set_dtype(v1::DT_FLOAT32);
  v.set_update(update);
  return v;
}

v1::GradientCompression Spec(v1::GradientCompression::Type type, double ratio = 0,
                             bool error_feedback = true) {
  v1::GradientCompression c;
  c.set_type(type);
  c.set_ratio(ratio);
  c.set_error_feedback(error_feedback);
  return c;
}

// A big variable split over the servers (PARTITIONED), a small one, and a
// batch norm statistic.
std::vector<v1::VariableDef> Vars() {
  return {Var("kernel", 3000), Var("bias", 10),
          Var("bn/moving_mean", 4, v1::VariableDef::MOVING_AVERAGE)};
}

struct Grads {
  explicit Grads(const std::vector<v1::VariableDef>& vars) {
    for (const auto& v : vars) tensors.emplace_back(std::vector<int64_t>{v.shape(0)});
    for (const auto& t : tensors) ptrs.push_back(&t);
  }
  std::vector<common::Tensor> tensors;
  std::vector<const common::Tensor*> ptrs;
};

// What the servers receive of `push`, as whole variables (parts put back
// where they belong): each server's messages are written as the client
// does (TensorWireWriter, chunks of `chunk` bytes), read back and decoded as
// PushSession does. Also returns the payload bytes and each server's raw
// message bytes.
struct Received {
  std::vector<std::vector<float>> values;  // by variable
  int64_t payload = 0;
  std::vector<std::string> wire;           // by server
};

Received Receive(const std::shared_ptr<const EncodedPush>& push, const Placement& placement,
                 const std::vector<v1::VariableDef>& vars, int num_ps, int64_t chunk) {
  Received r;
  for (const auto& v : vars) r.values.emplace_back(v.shape(0), std::nanf(""));
  r.wire.resize(num_ps);
  for (int s = 0; s < num_ps; ++s) {
    const std::vector<VariablePart> parts = placement.PartsOn(s);
    std::vector<int64_t> covered(parts.size(), 0);
    std::string scratch;
    uint32_t pending = 0;
    common::TensorWireHandler h;
    h.on_slice = [&](uint32_t var, uint64_t offset, uint64_t bytes) -> absl::StatusOr<char*> {
      EXPECT_LT(var, parts.size());
      EXPECT_EQ(static_cast<int64_t>(offset), covered[var]) << "slices out of order";
      EXPECT_LE(static_cast<int64_t>(bytes), chunk);
      r.payload += static_cast<int64_t>(bytes);
      pending = var;
      scratch.resize(bytes);
      return scratch.data();
    };
    h.on_slice_end = [&]() -> absl::Status {
      const VariablePart& part = parts[pending];
      const bool stat = vars[part.var].update() == v1::VariableDef::MOVING_AVERAGE;
      float* dst = r.values[part.var].data() + part.offset + covered[pending];
      auto n = common::DecodeSlice(stat ? v1::SLICE_FLOAT32 : push->encoding(), scratch,
                                   absl::MakeSpan(dst, part.count - covered[pending]));
      if (!n.ok()) return n.status();
      covered[pending] += *n;
      return absl::OkStatus();
    };
    common::TensorWireWriter out(2, chunk, [&](const grpc::ByteBuffer& m) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(m.Dump(&slices).ok());
      for (const auto& sl : slices) {
        r.wire[s].append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      const absl::Status st = common::ReadTensorMessage(m, 2, h);
      EXPECT_TRUE(st.ok()) << st;
      return true;
    });
    EXPECT_TRUE(EncodedPush::WriteTo(push, s, &out));
    EXPECT_TRUE(out.Finish());
    for (size_t k = 0; k < parts.size(); ++k) {
      EXPECT_EQ(covered[k], parts[k].count) << "server " << s << " part " << k;
    }
  }
  return r;
}

TEST(GradientCompressorTest, NoneIsNoCompressorAndBadSpecsAreRefused) {
  const auto vars = Vars();
  auto placement = PlanPlacement(vars, 2, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  auto none = GradientCompressor::Create(v1::GradientCompression(), vars, *placement, 4096);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  auto bad = GradientCompressor::Create(Spec(v1::GradientCompression::TOPK, 2.0), vars,
                                        *placement, 4096);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "compression.ratio = 2")) << bad.status();
  bad = GradientCompressor::Create(Spec(v1::GradientCompression::FP16), vars, *placement, 8);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GradientCompressorTest, DescribesItselfAndCountsItsBytesExactly) {
  const auto vars = Vars();
  const int num_ps = 2;
  auto placement = PlanPlacement(vars, num_ps, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  v1::GradientCompression topk;
  topk.set_type(v1::GradientCompression::TOPK);  // defaults: 0.01, error feedback
  struct Case {
    v1::GradientCompression spec;
    const char* describe;
  };
  for (const Case& c : {Case{topk, "topk:0.01, error feedback"},
                        Case{Spec(v1::GradientCompression::FP16), "fp16, error feedback"},
                        Case{Spec(v1::GradientCompression::BF16, 0, false), "bf16"}}) {
    auto comp = GradientCompressor::Create(c.spec, vars, *placement, 4096);
    ASSERT_TRUE(comp.ok()) << comp.status();
    EXPECT_EQ((*comp)->Describe(), c.describe);
    EXPECT_EQ((*comp)->uncompressed_bytes(), 4 * 3014);
    Grads g(vars);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& t : g.tensors) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t[i] = normal(rng);
    }
    auto push = (*comp)->Encode(g.ptrs);
    ASSERT_TRUE(push.ok()) << push.status();
    int64_t bytes = 0;
    for (int s = 0; s < num_ps; ++s) bytes += (*push)->bytes(s);
    EXPECT_EQ(bytes, (*comp)->compressed_bytes()) << c.describe;
    EXPECT_EQ(Receive(*push, *placement, vars, num_ps, 4096).payload, bytes);
    EXPECT_TRUE(absl::StrContains((*comp)->Summary(),
                                  absl::StrCat(bytes, " payload bytes per push instead of 12056")))
        << (*comp)->Summary();
  }
}

// The sum of what the servers received over T pushes, plus the residual
// left, is the sum of the true gradients; the only error is the rounding of
// e = g + r, at most 2^-24 |e| per push and element (r = e - decoded is
// exact for these values: decoded is within a factor 2 of e, or 0).
TEST(GradientCompressorTest, ErrorFeedbackLosesNothingOverManyPushes) {
  const auto vars = Vars();
  const int num_ps = 3;
  auto placement = PlanPlacement(vars, num_ps, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  for (const auto& spec :
       {Spec(v1::GradientCompression::TOPK, 0.05), Spec(v1::GradientCompression::FP16),
        Spec(v1::GradientCompression::BF16), Spec(v1::GradientCompression::TOPK, 0.001)}) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto comp = GradientCompressor::Create(spec, vars, *placement, 4096);
    ASSERT_TRUE(comp.ok()) << comp.status();
    std::mt19937 rng(5);
    // Small gradients, so that fp16 underflows some of them (subnormals, 0).
    std::normal_distribution<float> normal(0.0f, 1e-4f);
    std::vector<std::vector<double>> sum_true, sum_sent, bound;
    for (const auto& v : vars) {
      sum_true.emplace_back(v.shape(0), 0.0);
      sum_sent.emplace_back(v.shape(0), 0.0);
      bound.emplace_back(v.shape(0), 0.0);
    }
    const int kPushes = 30;
    for (int t = 0; t < kPushes; ++t) {
      Grads g(vars);
      for (size_t v = 0; v < vars.size(); ++v) {
        for (int64_t i = 0; i < g.tensors[v].num_elements(); ++i) {
          g.tensors[v][i] = normal(rng) * (i % 7 == 0 ? 100.0f : 1.0f);
          sum_true[v][i] += g.tensors[v][i];
        }
      }
      auto push = (*comp)->Encode(g.ptrs);
      ASSERT_TRUE(push.ok()) << push.status();
      const Received r = Receive(*push, *placement, vars, num_ps, 4096);
      for (size_t p = 0; p < placement->parts.size(); ++p) {
        const VariablePart& part = placement->parts[p];
        const std::vector<float>& res = (*comp)->residual(static_cast<int>(p));
        for (int64_t i = 0; i < part.count; ++i) {
          const double d = r.values[part.var][part.offset + i];
          const double e = d + (res.empty() ? 0.0 : res[i]);  // e = decoded + r, exactly
          sum_sent[part.var][part.offset + i] += d;
          bound[part.var][part.offset + i] += std::ldexp(std::fabs(e), -24);
        }
      }
    }
    for (size_t p = 0; p < placement->parts.size(); ++p) {
      const VariablePart& part = placement->parts[p];
      const std::vector<float>& res = (*comp)->residual(static_cast<int>(p));
      const bool stat = vars[part.var].update() == v1::VariableDef::MOVING_AVERAGE;
      EXPECT_EQ(res.empty(), stat) << "a residual for every trained part, only for them";
      for (int64_t i = 0; i < part.count; ++i) {
        const int64_t at = part.offset + i;
        const double total = sum_sent[part.var][at] + (res.empty() ? 0.0 : res[i]);
        // The sums themselves are in double: 1e-12 of slack for them.
        ASSERT_NEAR(total, sum_true[part.var][at], bound[part.var][at] + 1e-12)
            << vars[part.var].name() << "[" << at << "]";
      }
    }
  }
}

// Without error feedback, what is not sent is gone: top-k sends exactly the
// largest magnitudes of each push's own gradient, per part.
TEST(GradientCompressorTest, WithoutErrorFeedbackEachPushStandsAlone) {
  const std::vector<v1::VariableDef> vars = {Var("w", 10)};
  auto placement = PlanPlacement(vars, 1, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  auto comp = GradientCompressor::Create(Spec(v1::GradientCompression::TOPK, 0.2, false), vars,
                                         *placement, 4096);
  ASSERT_TRUE(comp.ok()) << comp.status();
  EXPECT_TRUE((*comp)->residual(0).empty());
  Grads g(vars);
  for (int i = 0; i < 10; ++i) g.tensors[0][i] = static_cast<float>(i % 2 ? i : -i);
  for (int t = 0; t < 2; ++t) {
    auto push = (*comp)->Encode(g.ptrs);
    ASSERT_TRUE(push.ok());
    const Received r = Receive(*push, *placement, vars, 1, 4096);
    EXPECT_EQ(r.values[0], std::vector<float>({0, 0, 0, 0, 0, 0, 0, 0, -8, 9}));
  }
}

// Every attempt of a push sends the same bytes, and attempts do not move the
// residual: only Encode does.
TEST(GradientCompressorTest, EveryAttemptOfAPushSendsTheSameBytes) {
  const auto vars = Vars();
  auto placement = PlanPlacement(vars, 2, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  auto comp =
      GradientCompressor::Create(Spec(v1::GradientCompression::TOPK, 0.1), vars, *placement, 4096);
  ASSERT_TRUE(comp.ok());
  Grads g(vars);
  for (auto& t : g.tensors) {
    for (int64_t i = 0; i < t.num_elements(); ++i) t[i] = std::sin(static_cast<float>(i));
  }
  auto push = (*comp)->Encode(g.ptrs);
  ASSERT_TRUE(push.ok());
  const std::vector<float> residual = (*comp)->residual(0);
  const Received first = Receive(*push, *placement, vars, 2, 4096);
  const Received retry = Receive(*push, *placement, vars, 2, 4096);
  EXPECT_EQ(first.wire, retry.wire);
  EXPECT_EQ((*comp)->residual(0), residual);
  auto next = (*comp)->Encode(g.ptrs);  // the next push: the residual moves
  ASSERT_TRUE(next.ok());
  EXPECT_NE((*comp)->residual(0), residual);
  EXPECT_NE(Receive(*next, *placement, vars, 2, 4096).wire, first.wire);
}

TEST(GradientCompressorTest, StatisticsTravelAsFloat32) {
  const auto vars = Vars();
  auto placement = PlanPlacement(vars, 1, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  auto comp = GradientCompressor::Create(Spec(v1::GradientCompression::FP16), vars, *placement,
                                         4096);
  ASSERT_TRUE(comp.ok());
  Grads g(vars);
  g.tensors[2][0] = 1e-9f;  // 0 in fp16; exact in float32
  g.tensors[2][3] = 1e9f;   // beyond fp16's range
  auto push = (*comp)->Encode(g.ptrs);
  ASSERT_TRUE(push.ok());
  EXPECT_EQ((*push)->encoding(), v1::SLICE_FLOAT16);
  const Received r = Receive(*push, *placement, vars, 1, 4096);
  EXPECT_EQ(r.values[2], std::vector<float>({1e-9f, 0, 0, 1e9f}));
  EXPECT_EQ(r.payload, 2 * 3010 + 4 * 4);
}

TEST(GradientCompressorTest, NaNIsRefusedNamingTheVariableAndChangesNothing) {
  const auto vars = Vars();
  auto placement = PlanPlacement(vars, 2, v1::PARTITIONED);
  ASSERT_TRUE(placement.ok());
  auto comp =
      GradientCompressor::Create(Spec(v1::GradientCompression::TOPK, 0.1), vars, *placement, 4096);
  ASSERT_TRUE(comp.ok());
  Grads g(vars);
  for (auto& t : g.tensors) t.Fill(0.5f);
  ASSERT_TRUE((*comp)->Encode(g.ptrs).ok());
  std::vector<std::vector<float>> before;
  for (size_t p = 0; p < placement->parts.size(); ++p) {
    before.push_back((*comp)->residual(static_cast<int>(p)));
  }
  g.tensors[1][7] = std::numeric_limits<float>::quiet_NaN();
  auto push = (*comp)->Encode(g.ptrs);
  EXPECT_EQ(push.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(push.status().message(), "\"bias\" is NaN at element 7"))
      << push.status();
  g.tensors[1][7] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(absl::StrContains((*comp)->Encode(g.ptrs).status().message(), "is Inf"));
  for (size_t p = 0; p < placement->parts.size(); ++p) {
    EXPECT_EQ((*comp)->residual(static_cast<int>(p)), before[p]) << p;
  }
  g.ptrs.pop_back();
  EXPECT_EQ((*comp)->Encode(g.ptrs).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace towerps::worker
