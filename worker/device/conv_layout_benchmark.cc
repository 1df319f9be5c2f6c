// Micro-benchmark: oneDNN's convolutions in the caller's plain layouts
// (nchw, oihw: oneDNN 2.6 has only its im2col + GEMM kernel for them)
// against the layouts oneDNN picks (format_tag::any: blocked by 8 channels
// for its direct JIT kernels on AVX2), forward, backward data and backward
// weights, on the built-in models' convolutions, with the cost of reordering
// the input and output to and from the blocked layouts. The CPU backend
// (dnnl_kernels.cc) runs a convolution blocked where this showed it faster:
// 4 or more input channels.
//
//   OMP_NUM_THREADS=1 bazel run -c opt //worker/device:conv_layout_benchmark
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using md = dnnl::memory::desc;

// The fastest of 5 calls after one untimed, in ms.
template <typename F>
double Best(F f) {
  f();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start)
                              .count());
  }
  return best;
}

struct Shape {
  const char* name;
  int64_t n, c, hw, k, r, stride, pad;
};

void Run(const Shape& s, dnnl::engine& eng, dnnl::stream& st) {
  const int64_t o = (s.hw + 2 * s.pad - s.r) / s.stride + 1;
  const md x_plain({s.n, s.c, s.hw, s.hw}, dt::f32, tag::nchw);
  const md w_plain({s.k, s.c, s.r, s.r}, dt::f32, tag::oihw);
  const md y_plain({s.n, s.k, o, o}, dt::f32, tag::nchw);
  const md b({s.k}, dt::f32, tag::x);
  const dnnl::memory::dims strides = {s.stride, s.stride}, pad = {s.pad, s.pad};
  for (bool any : {false, true}) {
    auto pick = [any](const md& plain) {
      return any ? md(plain.dims(), dt::f32, tag::any) : plain;
    };
    const md x = pick(x_plain), w = pick(w_plain), y = pick(y_plain);
    const auto alg = dnnl::algorithm::convolution_direct;
    const dnnl::convolution_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, alg, x, w, b, y, strides, pad, pad}, eng);
    const dnnl::convolution_backward_data::primitive_desc bwd_d({alg, x, w, y, strides, pad, pad},
                                                                eng, fwd);
    const dnnl::convolution_backward_weights::primitive_desc bwd_w(
        {alg, x, w, b, y, strides, pad, pad}, eng, fwd);
    auto zeroed = [&](const md& d) {
      dnnl::memory m(d, eng);
      std::memset(m.get_data_handle(), 0, d.get_size());
      return m;
    };
    dnnl::memory fx = zeroed(fwd.src_desc()), fw = zeroed(fwd.weights_desc()), fb = zeroed(b),
                 fy = zeroed(fwd.dst_desc()), ddy = zeroed(bwd_d.diff_dst_desc()),
                 dw = zeroed(bwd_d.weights_desc()), ddx = zeroed(bwd_d.diff_src_desc()),
                 wx = zeroed(bwd_w.src_desc()), wdy = zeroed(bwd_w.diff_dst_desc()),
                 wdw = zeroed(bwd_w.diff_weights_desc()), wdb = zeroed(b);
    const dnnl::convolution_forward f(fwd);
    const dnnl::convolution_backward_data d(bwd_d);
    const dnnl::convolution_backward_weights g(bwd_w);
    const double tf = Best([&] {
      f.execute(st, {{DNNL_ARG_SRC, fx}, {DNNL_ARG_WEIGHTS, fw}, {DNNL_ARG_BIAS, fb},
                     {DNNL_ARG_DST, fy}});
      st.wait();
    });
    const double td = Best([&] {
      d.execute(st, {{DNNL_ARG_DIFF_DST, ddy}, {DNNL_ARG_WEIGHTS, dw}, {DNNL_ARG_DIFF_SRC, ddx}});
      st.wait();
    });
    const double tw = Best([&] {
      g.execute(st, {{DNNL_ARG_SRC, wx}, {DNNL_ARG_DIFF_DST, wdy}, {DNNL_ARG_DIFF_WEIGHTS, wdw},
                     {DNNL_ARG_DIFF_BIAS, wdb}});
      st.wait();
    });
    // The input in and the output out, as the backend reorders a forward.
    double reorders = 0;
    if (fwd.src_desc() != x_plain) {
      dnnl::memory plain = zeroed(x_plain);
      const dnnl::reorder r(plain, fx);
      reorders += Best([&] { r.execute(st, plain, fx); st.wait(); });
    }
    if (fwd.dst_desc() != y_plain) {
      dnnl::memory plain = zeroed(y_plain);
      const dnnl::reorder r(fy, plain);
      reorders += Best([&] { r.execute(st, fy, plain); st.wait(); });
    }
    std::printf("%-36s %-6s %-13s %8.2f %8.2f %8.2f %8.2f %8.2f\n", s.name, any ? "any" : "plain",
                fwd.impl_info_str(), tf, td, tw, tf + td + tw, reorders);
  }
}

}  // namespace

int main() {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  std::printf("fastest of 5 calls after one untimed; ms; reorders: the input in and the output "
              "out, once\n");
  std::printf("%-36s %-6s %-13s %8s %8s %8s %8s %8s\n", "convolution", "layout", "kernel", "fwd",
              "bwd_data", "bwd_wt", "total", "reorders");
  const Shape shapes[] = {
      {"cnn_small 1->32 3x3 28x28 n64", 64, 1, 28, 32, 3, 1, 0},
      {"lenet 6->16 5x5 14x14 n256", 256, 6, 14, 16, 5, 1, 0},
      {"resnet_cifar 16->16 3x3 32x32 n128", 128, 16, 32, 16, 3, 1, 1},
      {"resnet_cifar 32->32 3x3 16x16 n128", 128, 32, 16, 32, 3, 1, 1},
      {"resnet_cifar 64->64 3x3 8x8 n128", 128, 64, 8, 64, 3, 1, 1},
      {"resnet18 64->64 3x3 28x28 n32", 32, 64, 28, 64, 3, 1, 1},
  };
  for (const Shape& s : shapes) Run(s, eng, st);
  return 0;
}
