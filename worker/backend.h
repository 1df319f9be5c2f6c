// The worker's math: the handful of dense kernels a multilayer perceptron
// needs, on raw row-major float32 buffers.
//
// The interface names no CPU-specific type so that a CUDA implementation can
// sit behind it later; for that one every pointer is a device pointer. Layers
// hold a `Backend&` and never touch the math library directly.
#ifndef TOWERPS_WORKER_BACKEND_H_
#define TOWERPS_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>

namespace towerps::worker {

// Not thread-safe: an implementation may keep scratch buffers (the CPU one
// keeps a vector of ones), so each thread needs its own Backend. Calls are
// synchronous on the CPU backend; buffers may be reused as soon as a call
// returns.
//
// Buffers are row-major and not owned. Unless stated otherwise, input and
// output buffers must not overlap. All sizes must be >= 0; a zero size is a
// no-op (apart from scaling C by beta in Gemm when k == 0).
class Backend {
 public:
  virtual ~Backend() = default;

  // C[m,n] = alpha * op(A) * op(B) + beta * C, where op(A) is [m,k] and op(B)
  // is [k,n]. A is stored [m,k] (or [k,m] when trans_a); B is stored [k,n]
  // (or [n,k] when trans_b). With beta == 0, C's prior contents are ignored
  // (NaNs in it do not propagate).
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) = 0;

  // x[r, :] += bias for every row r of x[rows, cols].
  virtual void AddBiasRows(int64_t rows, int64_t cols, const float* bias,
                           float* x) = 0;

  // out[j] = sum_r x[r, j] (column sums of x[rows, cols]; the bias gradient).
  // out has `cols` elements and is overwritten.
  virtual void SumRows(int64_t rows, int64_t cols, const float* x,
                       float* out) = 0;

  // out[i] = max(in[i], 0). `in` and `out` may be the same buffer.
  virtual void Relu(int64_t n, const float* in, float* out) = 0;

  // dx[i] = dy[i] if y[i] > 0 else 0, where y is ReLU's output (its input
  // gives the same mask). `dx` may alias `dy`.
  virtual void ReluGrad(int64_t n, const float* y, const float* dy,
                        float* dx) = 0;

  // y += alpha * x (n elements).
  virtual void Axpy(int64_t n, float alpha, const float* x, float* y) = 0;

  // x *= alpha (n elements).
  virtual void Scale(int64_t n, float alpha, float* x) = 0;
};

// A Backend on the host CPU through CBLAS (OpenBLAS). Never fails.
std::unique_ptr<Backend> NewCpuBackend();

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_BACKEND_H_
