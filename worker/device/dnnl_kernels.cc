#include "worker/device/dnnl_kernels.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "worker/device/cpu_threads.h"

namespace towerps::worker {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

enum class Op : int64_t {
  kConvForward,
  kConvForwardBias,
  kConvBackwardData,
  kConvBackwardWeights,
  kConvBackwardWeightsBias,
  kMaxPoolForward,
  kMaxPoolBackward,
  kAvgPoolForward,
  kAvgPoolBackward,
  kBatchNormTraining,
  kBatchNormInference,
  kBatchNormBackward,
};

// The direction, every shape field and the thread count (oneDNN splits the
// work for the team size it sees when it creates a primitive): one cached
// primitive per key.
using Key = std::array<int64_t, 13>;

Key ConvKey(Op op, const Conv2DShape& s) {
  return {static_cast<int64_t>(op), s.n, s.c, s.h, s.w, s.k, s.r, s.s,
          s.stride_h, s.stride_w, s.pad_h, s.pad_w, CpuMathThreads()};
}

Key PoolKey(Op op, const Pool2DShape& s) {
  return {static_cast<int64_t>(op), s.n, s.c, s.h, s.w, /*k=*/0, s.r, s.s,
          s.stride_h, s.stride_w, s.pad_h, s.pad_w, CpuMathThreads()};
}

// Convolutions with at least this many input channels run in oneDNN's
// blocked layouts (DnnlKernelsImpl::Blocked).
constexpr int64_t kMinBlockedChannels = 4;

// oneDNN's memory objects take non-const handles even for inputs; it does
// not write inputs.
void* In(const float* p) { return const_cast<float*>(p); }

// Batch norm's key holds epsilon's bits: the primitive bakes epsilon in.
Key BatchNormKey(Op op, const BatchNormShape& s) {
  uint32_t epsilon_bits;
  static_assert(sizeof(epsilon_bits) == sizeof(s.epsilon));
  std::memcpy(&epsilon_bits, &s.epsilon, sizeof(epsilon_bits));
  return {static_cast<int64_t>(op), s.n, s.c, s.spatial, epsilon_bits,
          0, 0, 0, 0, 0, 0, 0, CpuMathThreads()};
}

// Runs `f` with the calling thread's OpenMP team sized as the worker set it
// (worker/device/cpu_threads.h), turning oneDNN's (and the standard
// library's) exceptions into a Status: none may cross the Backend interface.
template <typename F>
absl::Status Guard(const char* op, F&& f) {
  ApplyCpuMathThreadsToThisThread();
  try {
    return f();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(op, ": oneDNN error ",
                                            static_cast<int>(e.status), ": ",
                                            e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": out of host memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op, ": ", e.what()));
  }
}

class DnnlKernelsImpl final : public DnnlKernels {
 public:
  DnnlKernelsImpl()
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    attr_.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  }

  absl::Status Conv2DForward(const Conv2DShape& shape, const float* x,
                             const float* w, const float* b,
                             float* y) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("Conv2DForward", [&]() {
      const bool bias = b != nullptr;
      const Entry& e = Conv(bias ? Op::kConvForwardBias : Op::kConvForward,
                            shape);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_WEIGHTS, dnnl::memory(WDesc(shape), engine_, In(w))},
          {DNNL_ARG_DST, dnnl::memory(YDesc(shape), engine_, y)},
      };
      if (bias) {
        args[DNNL_ARG_BIAS] = dnnl::memory(BDesc(shape), engine_, In(b));
      }
      return Run(e, args);
    });
  }

  absl::Status Conv2DBackwardData(const Conv2DShape& shape, const float* dy,
                                  const float* w, float* dx) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("Conv2DBackwardData", [&]() {
      const Entry& e = Conv(Op::kConvBackwardData, shape);
      return Run(e, {
          {DNNL_ARG_DIFF_DST, dnnl::memory(YDesc(shape), engine_, In(dy))},
          {DNNL_ARG_WEIGHTS, dnnl::memory(WDesc(shape), engine_, In(w))},
          {DNNL_ARG_DIFF_SRC, dnnl::memory(XDesc(shape), engine_, dx)},
      });
    });
  }

  absl::Status Conv2DBackwardWeights(const Conv2DShape& shape, const float* x,
                                     const float* dy, float* dw,
                                     float* db) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("Conv2DBackwardWeights", [&]() {
      const bool bias = db != nullptr;
      const Entry& e = Conv(
          bias ? Op::kConvBackwardWeightsBias : Op::kConvBackwardWeights,
          shape);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_DIFF_DST, dnnl::memory(YDesc(shape), engine_, In(dy))},
          {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(WDesc(shape), engine_, dw)},
      };
      if (bias) {
        args[DNNL_ARG_DIFF_BIAS] = dnnl::memory(BDesc(shape), engine_, db);
      }
      return Run(e, args);
    });
  }

  absl::Status MaxPool2DForward(const Pool2DShape& shape, const float* x,
                                float* y, float* workspace) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("MaxPool2DForward", [&]() {
      const Entry& e = Pool(Op::kMaxPoolForward, shape);
      return Run(e, {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_DST, dnnl::memory(YDesc(shape), engine_, y)},
          {DNNL_ARG_WORKSPACE, dnnl::memory(e.workspace, engine_, workspace)},
      });
    });
  }

  absl::Status MaxPool2DBackward(const Pool2DShape& shape,
                                 const float* workspace, const float* dy,
                                 float* dx) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("MaxPool2DBackward", [&]() {
      const Entry& e = Pool(Op::kMaxPoolBackward, shape);
      return Run(e, {
          {DNNL_ARG_DIFF_DST, dnnl::memory(YDesc(shape), engine_, In(dy))},
          {DNNL_ARG_DIFF_SRC, dnnl::memory(XDesc(shape), engine_, dx)},
          {DNNL_ARG_WORKSPACE,
           dnnl::memory(e.workspace, engine_, In(workspace))},
      });
    });
  }

  absl::Status AvgPool2DForward(const Pool2DShape& shape, const float* x,
                                float* y) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("AvgPool2DForward", [&]() {
      const Entry& e = Pool(Op::kAvgPoolForward, shape);
      return Run(e, {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_DST, dnnl::memory(YDesc(shape), engine_, y)},
      });
    });
  }

  absl::Status AvgPool2DBackward(const Pool2DShape& shape, const float* dy,
                                 float* dx) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("AvgPool2DBackward", [&]() {
      const Entry& e = Pool(Op::kAvgPoolBackward, shape);
      return Run(e, {
          {DNNL_ARG_DIFF_DST, dnnl::memory(YDesc(shape), engine_, In(dy))},
          {DNNL_ARG_DIFF_SRC, dnnl::memory(XDesc(shape), engine_, dx)},
      });
    });
  }

  absl::Status BatchNormForwardTraining(const BatchNormShape& shape,
                                        const float* x, const float* gamma,
                                        const float* beta, float* y,
                                        float* mean, float* var) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("BatchNormForwardTraining", [&]() {
      const Entry& e = BatchNorm(Op::kBatchNormTraining, shape);
      return Run(e, {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_SCALE, dnnl::memory(CDesc(shape), engine_, In(gamma))},
          {DNNL_ARG_SHIFT, dnnl::memory(CDesc(shape), engine_, In(beta))},
          {DNNL_ARG_DST, dnnl::memory(XDesc(shape), engine_, y)},
          {DNNL_ARG_MEAN, dnnl::memory(CDesc(shape), engine_, mean)},
          {DNNL_ARG_VARIANCE, dnnl::memory(CDesc(shape), engine_, var)},
      });
    });
  }

  absl::Status BatchNormForwardInference(const BatchNormShape& shape,
                                         const float* x, const float* gamma,
                                         const float* beta, const float* mean,
                                         const float* var, float* y) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("BatchNormForwardInference", [&]() {
      const Entry& e = BatchNorm(Op::kBatchNormInference, shape);
      return Run(e, {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_SCALE, dnnl::memory(CDesc(shape), engine_, In(gamma))},
          {DNNL_ARG_SHIFT, dnnl::memory(CDesc(shape), engine_, In(beta))},
          {DNNL_ARG_MEAN, dnnl::memory(CDesc(shape), engine_, In(mean))},
          {DNNL_ARG_VARIANCE, dnnl::memory(CDesc(shape), engine_, In(var))},
          {DNNL_ARG_DST, dnnl::memory(XDesc(shape), engine_, y)},
      });
    });
  }

  absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x,
                                 const float* dy, const float* gamma,
                                 const float* mean, const float* var,
                                 float* dx, float* dgamma,
                                 float* dbeta) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    return Guard("BatchNormBackward", [&]() {
      const Entry& e = BatchNorm(Op::kBatchNormBackward, shape);
      // oneDNN 2.6's backward with use_shift (for diff_shift) requires a
      // shift argument although the gradients do not depend on it (no fused
      // ReLU here); the Backend call has no beta, so it gets zeros.
      if (static_cast<int64_t>(zero_shift_.size()) < shape.c) {
        zero_shift_.assign(shape.c, 0.0f);
      }
      return Run(e, {
          {DNNL_ARG_SRC, dnnl::memory(XDesc(shape), engine_, In(x))},
          {DNNL_ARG_DIFF_DST, dnnl::memory(XDesc(shape), engine_, In(dy))},
          {DNNL_ARG_SCALE, dnnl::memory(CDesc(shape), engine_, In(gamma))},
          {DNNL_ARG_SHIFT,
           dnnl::memory(CDesc(shape), engine_, zero_shift_.data())},
          {DNNL_ARG_MEAN, dnnl::memory(CDesc(shape), engine_, In(mean))},
          {DNNL_ARG_VARIANCE, dnnl::memory(CDesc(shape), engine_, In(var))},
          {DNNL_ARG_DIFF_SRC, dnnl::memory(XDesc(shape), engine_, dx)},
          {DNNL_ARG_DIFF_SCALE, dnnl::memory(CDesc(shape), engine_, dgamma)},
          {DNNL_ARG_DIFF_SHIFT, dnnl::memory(CDesc(shape), engine_, dbeta)},
      });
    });
  }

  int64_t cached_primitives() const override { return cache_.size(); }

 private:
  // An argument the primitive takes in another layout than the caller's
  // (a convolution's blocked layout): reordered into a buffer of this
  // object's before the primitive runs (an input) or out of it after (an
  // output).
  struct Relayout {
    int arg;
    bool input;
    dnnl::memory::desc plain, chosen;
    dnnl::reorder reorder;  // plain -> chosen for an input, chosen -> plain for an output
    dnnl::memory::desc scratchpad;  // the reorder's; may be empty
  };
  struct Entry {
    dnnl::primitive primitive;
    dnnl::memory::desc workspace;   // Max pooling only.
    dnnl::memory::desc scratchpad;  // What the primitive needs; may be empty.
    std::vector<Relayout> relayouts;
  };

  // Caches `e` with its scratchpad's size.
  const Entry& Store(const Key& key, Entry e) {
    const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(
        e.primitive.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
    if (md != nullptr) e.scratchpad = dnnl::memory::desc(*md);
    return cache_.emplace(key, std::move(e)).first->second;
  }

  // The caller's layouts (nchw, oihw).
  static dnnl::memory::desc XDesc(const Conv2DShape& s) {
    return {{s.n, s.c, s.h, s.w}, dt::f32, tag::nchw};
  }
  static dnnl::memory::desc WDesc(const Conv2DShape& s) {
    return {{s.k, s.c, s.r, s.s}, dt::f32, tag::oihw};
  }
  static dnnl::memory::desc BDesc(const Conv2DShape& s) {
    return {{s.k}, dt::f32, tag::x};
  }
  static dnnl::memory::desc YDesc(const Conv2DShape& s) {
    return {{s.n, s.k, s.out_h(), s.out_w()}, dt::f32, tag::nchw};
  }
  static dnnl::memory::desc XDesc(const Pool2DShape& s) {
    return {{s.n, s.c, s.h, s.w}, dt::f32, tag::nchw};
  }
  static dnnl::memory::desc YDesc(const Pool2DShape& s) {
    return {{s.n, s.c, s.out_h(), s.out_w()}, dt::f32, tag::nchw};
  }

  // Batch norm's x [n, c, spatial] as NCHW with w = 1; per-channel vectors
  // (gamma, beta, mean, variance and their gradients) as [c].
  static dnnl::memory::desc XDesc(const BatchNormShape& s) {
    return {{s.n, s.c, s.spatial, 1}, dt::f32, tag::nchw};
  }
  static dnnl::memory::desc CDesc(const BatchNormShape& s) {
    return {{s.c}, dt::f32, tag::x};
  }

  // Runs `e` with this object's scratchpad. oneDNN's default scratchpad is
  // the creating thread's: towers get new threads every step, and a primitive
  // created by one and run by the next had none (a crash seen with 2 towers
  // of a convolutional model).
  absl::Status Run(const Entry& e, std::unordered_map<int, dnnl::memory> args) {
    const size_t need = e.scratchpad.get_size();
    if (need > 0) {
      args.insert({DNNL_ARG_SCRATCHPAD,
                   dnnl::memory(e.scratchpad, engine_, Grown(&scratch_, need))});
    }
    // The arguments in the primitive's own layouts: inputs reordered in
    // before, outputs reordered out after.
    std::vector<std::pair<const Relayout*, dnnl::memory>> outputs;
    for (size_t i = 0; i < e.relayouts.size(); ++i) {
      const Relayout& r = e.relayouts[i];
      if (i >= relayout_buffers_.size()) relayout_buffers_.emplace_back();
      dnnl::memory chosen(r.chosen, engine_,
                          Grown(&relayout_buffers_[i], r.chosen.get_size()));
      dnnl::memory& user = args.at(r.arg);
      if (r.input) {
        Reorder(r, user, chosen);
      } else {
        outputs.emplace_back(&r, user);
      }
      user = chosen;
    }
    e.primitive.execute(stream_, args);
    for (auto& [r, user] : outputs) Reorder(*r, args.at(r->arg), user);
    stream_.wait();
    return absl::OkStatus();
  }

  // Runs relayout r's reorder from `from` to `to`, with its scratchpad (the
  // stream runs in order: after what came before, before what comes after).
  void Reorder(const Relayout& r, const dnnl::memory& from, const dnnl::memory& to) {
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    const size_t need = r.scratchpad.get_size();
    if (need > 0) {
      args.insert({DNNL_ARG_SCRATCHPAD,
                   dnnl::memory(r.scratchpad, engine_, Grown(&reorder_scratch_, need))});
    }
    r.reorder.execute(stream_, args);
  }

  // A buffer of this object's, 64-byte aligned, grown to at least `bytes`.
  struct Buffer {
    struct Free {
      void operator()(char* p) const { std::free(p); }
    };
    std::unique_ptr<char, Free> data;
    size_t bytes = 0;
  };
  static char* Grown(Buffer* b, size_t bytes) {
    if (bytes > b->bytes) {
      b->data.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      if (b->data == nullptr) throw std::bad_alloc();
      b->bytes = bytes;
    }
    return b->data.get();
  }

  // Whether a convolution runs in the layouts oneDNN picks for it (blocked
  // by 8 channels on AVX2, reordered to and from the caller's) rather than
  // in the caller's plain ones. For the plain layouts oneDNN 2.6 has only its
  // im2col + GEMM kernel; its direct JIT kernels want blocked ones and ran
  // ResNet-20's 16-channel 3x3 convolutions in 40 ms instead of 150 (the
  // three directions, batch 128, one Zen core; the reorders about 3 ms a
  // call), LeNet's 6-channel 5x5 in 11 instead of 26. With one input
  // channel (the first layer of a Fashion-MNIST model) the JIT backward
  // took 11 ms instead of 5.5, so few input channels stay plain
  // (conv_layout_benchmark measures both). Shape alone decides, so a layer
  // always runs the same kernel.
  static bool Blocked(const Conv2DShape& s) { return s.c >= kMinBlockedChannels; }

  // The cached primitive for a convolution direction; creates it on first
  // use (may throw dnnl::error, caught by Guard).
  const Entry& Conv(Op op, const Conv2DShape& s) {
    const Key key = ConvKey(op, s);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;

    const dnnl::memory::dims strides = {s.stride_h, s.stride_w};
    const dnnl::memory::dims pad = {s.pad_h, s.pad_w};
    const bool fwd_bias =
        op == Op::kConvForwardBias || op == Op::kConvBackwardWeightsBias;
    // What the primitive is created with: the caller's layouts, or `any`.
    const bool blocked = Blocked(s);
    auto pick = [blocked](dnnl::memory::desc plain) {
      return blocked ? dnnl::memory::desc(plain.dims(), dt::f32, tag::any) : plain;
    };
    const dnnl::memory::desc x = pick(XDesc(s)), w = pick(WDesc(s)), y = pick(YDesc(s));
    const auto fwd_desc =
        fwd_bias ? dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_training,
                       dnnl::algorithm::convolution_direct, x, w, BDesc(s), y, strides, pad, pad)
                 : dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_training,
                       dnnl::algorithm::convolution_direct, x, w, y, strides, pad, pad);
    const dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr_, engine_);
    Entry e;
    // Each argument the primitive wants in another layout than the caller's.
    auto relayout = [&](int arg, bool input, const dnnl::memory::desc& plain,
                        const dnnl::memory::desc& chosen) {
      if (chosen == plain) return;
      const dnnl::reorder::primitive_desc pd(engine_, input ? plain : chosen, engine_,
                                             input ? chosen : plain, attr_);
      e.relayouts.push_back({arg, input, plain, chosen, dnnl::reorder(pd), pd.scratchpad_desc()});
    };
    switch (op) {
      case Op::kConvForward:
      case Op::kConvForwardBias:
        e.primitive = dnnl::convolution_forward(fwd_pd);
        relayout(DNNL_ARG_SRC, true, XDesc(s), fwd_pd.src_desc());
        relayout(DNNL_ARG_WEIGHTS, true, WDesc(s), fwd_pd.weights_desc());
        relayout(DNNL_ARG_DST, false, YDesc(s), fwd_pd.dst_desc());
        break;
      case Op::kConvBackwardData: {
        const dnnl::convolution_backward_data::desc d(
            dnnl::algorithm::convolution_direct, x, w, y, strides, pad, pad);
        const dnnl::convolution_backward_data::primitive_desc pd(d, attr_, engine_, fwd_pd);
        e.primitive = dnnl::convolution_backward_data(pd);
        relayout(DNNL_ARG_DIFF_DST, true, YDesc(s), pd.diff_dst_desc());
        relayout(DNNL_ARG_WEIGHTS, true, WDesc(s), pd.weights_desc());
        relayout(DNNL_ARG_DIFF_SRC, false, XDesc(s), pd.diff_src_desc());
        break;
      }
      case Op::kConvBackwardWeights:
      case Op::kConvBackwardWeightsBias: {
        const auto d =
            fwd_bias ? dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, x, w, BDesc(s), y, strides,
                           pad, pad)
                     : dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, x, w, y, strides, pad, pad);
        const dnnl::convolution_backward_weights::primitive_desc pd(d, attr_, engine_, fwd_pd);
        e.primitive = dnnl::convolution_backward_weights(pd);
        relayout(DNNL_ARG_SRC, true, XDesc(s), pd.src_desc());
        relayout(DNNL_ARG_DIFF_DST, true, YDesc(s), pd.diff_dst_desc());
        relayout(DNNL_ARG_DIFF_WEIGHTS, false, WDesc(s), pd.diff_weights_desc());
        break;
      }
      default:
        throw dnnl::error(dnnl_runtime_error, "not a convolution op");
    }
    return Store(key, std::move(e));
  }

  // The cached primitive for a pooling direction.
  const Entry& Pool(Op op, const Pool2DShape& s) {
    const Key key = PoolKey(op, s);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;

    const bool max = op == Op::kMaxPoolForward || op == Op::kMaxPoolBackward;
    // Exclude padding: a window's mean is over its pixels inside the image
    // (the contract in backend.h), and max pooling never picks padding.
    const dnnl::algorithm alg =
        max ? dnnl::algorithm::pooling_max
            : dnnl::algorithm::pooling_avg_exclude_padding;
    const dnnl::memory::dims strides = {s.stride_h, s.stride_w};
    const dnnl::memory::dims kernel = {s.r, s.s};
    const dnnl::memory::dims pad = {s.pad_h, s.pad_w};
    const dnnl::pooling_forward::desc fwd_desc(
        dnnl::prop_kind::forward_training, alg, XDesc(s), YDesc(s), strides,
        kernel, pad, pad);
    const dnnl::pooling_forward::primitive_desc fwd_pd(fwd_desc, attr_, engine_);
    Entry e;
    if (max) {
      e.workspace = fwd_pd.workspace_desc();
      // The contract gives the workspace one float per output element; a
      // larger oneDNN workspace would be our bug, reported, not overrun.
      if (e.workspace.get_size() >
          static_cast<size_t>(s.workspace_size()) * sizeof(float)) {
        throw dnnl::error(
            dnnl_runtime_error,
            "max pooling workspace larger than Pool2DShape::workspace_size()");
      }
    }
    if (op == Op::kMaxPoolForward || op == Op::kAvgPoolForward) {
      e.primitive = dnnl::pooling_forward(fwd_pd);
    } else {
      const dnnl::pooling_backward::desc d(alg, XDesc(s), YDesc(s), strides,
                                           kernel, pad, pad);
      e.primitive = dnnl::pooling_backward(
          dnnl::pooling_backward::primitive_desc(d, attr_, engine_, fwd_pd));
    }
    return Store(key, std::move(e));
  }

  // The cached primitive for a batch-norm direction. oneDNN's training
  // forward writes the batch mean and the BIASED variance (divided by
  // n * spatial), the backend's contract; the backward takes them back with
  // gamma (use_scale) and gives diff_src, diff_scale and diff_shift.
  const Entry& BatchNorm(Op op, const BatchNormShape& s) {
    const Key key = BatchNormKey(op, s);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;

    const dnnl::normalization_flags scale_shift =
        dnnl::normalization_flags::use_scale |
        dnnl::normalization_flags::use_shift;
    Entry e;
    if (op == Op::kBatchNormInference) {
      const dnnl::batch_normalization_forward::desc d(
          dnnl::prop_kind::forward_inference, XDesc(s), s.epsilon,
          scale_shift | dnnl::normalization_flags::use_global_stats);
      e.primitive = dnnl::batch_normalization_forward(
          dnnl::batch_normalization_forward::primitive_desc(d, attr_, engine_));
      return Store(key, std::move(e));
    }
    const dnnl::batch_normalization_forward::desc fwd_desc(
        dnnl::prop_kind::forward_training, XDesc(s), s.epsilon, scale_shift);
    const dnnl::batch_normalization_forward::primitive_desc fwd_pd(fwd_desc, attr_,
                                                                   engine_);
    switch (op) {
      case Op::kBatchNormTraining:
        e.primitive = dnnl::batch_normalization_forward(fwd_pd);
        break;
      case Op::kBatchNormBackward: {
        const dnnl::batch_normalization_backward::desc d(
            dnnl::prop_kind::backward, XDesc(s), XDesc(s), s.epsilon,
            scale_shift);
        e.primitive = dnnl::batch_normalization_backward(
            dnnl::batch_normalization_backward::primitive_desc(d, attr_, engine_,
                                                               fwd_pd));
        break;
      }
      default:
        throw dnnl::error(dnnl_runtime_error, "not a batch-norm op");
    }
    return Store(key, std::move(e));
  }

  // Constant after construction.
  dnnl::engine engine_;
  dnnl::stream stream_;
  // Every primitive's attributes: a scratchpad the caller (Run) provides.
  dnnl::primitive_attr attr_;
  Buffer scratch_;
  // The arguments reordered to and from a primitive's own layouts, by their
  // place in its Entry::relayouts.
  std::vector<Buffer> relayout_buffers_;
  Buffer reorder_scratch_;
  // Every primitive created, by direction and shape. Grows with the number
  // of distinct layer shapes (a handful per model).
  std::map<Key, Entry> cache_;
  // Zeros for the batch-norm backward's shift argument; grows to the most
  // channels seen.
  std::vector<float> zero_shift_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DnnlKernels>> NewDnnlKernels() {
  std::unique_ptr<DnnlKernels> k;
  absl::Status st = Guard("NewDnnlKernels", [&]() {
    k = std::make_unique<DnnlKernelsImpl>();
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return k;
}

}  // namespace towerps::worker
