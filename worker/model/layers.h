// Layers of a feed-forward network: Dense (affine map) and ReLU.
//
// A layer computes y = f(x) for a batch x [n, in] and, given dL/dy, fills its
// parameter gradients and dL/dx. All math goes through a Backend, held by
// reference: it must outlive the layer. Every tensor a layer sees lives in
// its backend's memory (the Model moves activations between devices).
// Output buffers are reused across calls (DeviceTensor::Resize keeps the
// allocation).
//
// Layers are not thread-safe: one model (and its layers) per thread.
#ifndef TOWERPS_WORKER_MODEL_LAYERS_H_
#define TOWERPS_WORKER_MODEL_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"

namespace towerps::worker {

class Layer {
 public:
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  // "Dense", "ReLU" (the Keras class names).
  virtual std::string TypeName() const = 0;
  // Width of the output for an input of width `input_dim`.
  virtual int64_t OutputDim(int64_t input_dim) const = 0;

  // y = f(x). x is [n, in]; y is resized to [n, OutputDim(in)] and
  // overwritten. `y` must not be `x`. Returns InvalidArgument when x is not
  // rank 2 or its width does not fit the layer; the backend's error when y
  // cannot be allocated.
  virtual absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) = 0;

  // Backpropagates dy = dL/dy, where x and y are the tensors of the matching
  // Forward call. Writes grads() with dL/dparams, overwriting them, or adding
  // to them when `accumulate` (micro-batches of one batch), and, when `dx` is
  // non-null, resizes it to x's shape and writes dL/dx into it. Pass dx =
  // nullptr for the first layer, whose input gradient nobody needs. `dx` must
  // not alias x, y or dy. Returns InvalidArgument on shape mismatch.
  virtual absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y,
                                const DeviceTensor& dy, DeviceTensor* dx,
                                bool accumulate = false) = 0;

  // Backward in two halves, so that a Model may backpropagate through every
  // layer first and form the parameters' gradients after, the first
  // layer's first (Model::StepEvents): BackwardInput writes only dx (as
  // Backward would), BackwardParams only grads() (as Backward would, with
  // `accumulate`); the two, in either order, are Backward bit for bit. Only
  // where SplitsBackward(); a layer without parameters needs neither (its
  // Backward writes only dx).
  virtual bool SplitsBackward() const { return false; }
  virtual absl::Status BackwardInput(const DeviceTensor& x, const DeviceTensor& y,
                                     const DeviceTensor& dy, DeviceTensor* dx);
  virtual absl::Status BackwardParams(const DeviceTensor& x, const DeviceTensor& y,
                                      const DeviceTensor& dy, bool accumulate);

  // The layer's parameters and their gradients, in the same order and with
  // the same shapes, in the backend's memory. The Model sets them up (a view
  // of its host tensors, or device buffers) before the first Forward.
  // Pointers stay valid for the layer's lifetime. Empty for layers without
  // parameters.
  virtual std::vector<DeviceTensor*> params() { return {}; }
  virtual std::vector<DeviceTensor*> grads() { return {}; }
  // What each of params() is, in order: its name within the layer (the
  // variable is "<layer>/<name>"), shape and initializer. Model names,
  // initializes and counts the variables from this alone (no RTTI). Empty for
  // layers without parameters.
  struct ParamSpec {
    enum class Init {
      kGlorotUniform,  // fan_in and fan_out are set
      kZeros,
      kOnes,
    };
    std::string name;  // e.g. "kernel", "bias"
    std::vector<int64_t> shape;
    Init init = Init::kZeros;
    int64_t fan_in = 0;
    int64_t fan_out = 0;
    // Not trainable (batch norm's moving statistics): the matching grads()
    // entry holds this step's batch statistic, weighted so that micro-batches
    // add up to the whole batch's (like gradients), and the servers keep
    // value = decay * value + (1 - decay) * pushed (VariableDef
    // MOVING_AVERAGE).
    bool moving_average = false;
    float decay = 0.0f;
  };
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  // Called by the Model before every pass (a training step or an
  // evaluation), before any Forward of it: `training` selects batch
  // statistics and dropout (true) or moving statistics and the identity
  // (false); `batch_rows` is the whole batch's size (micro-batches are
  // parts of it); `seed` is new for every pass (dropout masks). Layers that
  // keep state from a Forward for its Backward forget the previous pass's
  // here. Composite layers pass it on to their parts.
  virtual void BeginPass(bool training, int64_t batch_rows, uint64_t seed) {
    training_ = training;
    batch_rows_ = batch_rows;
    pass_seed_ = seed;
  }

  // Shapes of params(), in order (from param_specs()).
  std::vector<std::vector<int64_t>> param_shapes() const;
  // Elements of all params() together (from param_specs()).
  int64_t num_params() const;

  Backend& backend() const { return backend_; }

 protected:
  Layer(Backend& backend, std::string name)
      : backend_(backend), name_(std::move(name)) {}

  Backend& backend_;
  bool training_ = true;
  int64_t batch_rows_ = 0;
  uint64_t pass_seed_ = 0;

 private:
  const std::string name_;
};

// y = x * kernel + bias, kernel [in, units], bias [units] (absent with
// no_bias). params() order is kernel, then bias; they have no storage until
// the Model gives them some.
class Dense : public Layer {
 public:
  // REQUIRES: input_dim > 0, units > 0 (Model::Create validates the spec).
  Dense(Backend& backend, std::string name, int64_t input_dim, int64_t units,
        bool use_bias);

  std::string TypeName() const override { return "Dense"; }
  int64_t OutputDim(int64_t input_dim) const override { return units_; }
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y,
                        const DeviceTensor& dy, DeviceTensor* dx,
                        bool accumulate) override;
  bool SplitsBackward() const override { return true; }
  // dx = dy W^T.
  absl::Status BackwardInput(const DeviceTensor& x, const DeviceTensor& y,
                             const DeviceTensor& dy, DeviceTensor* dx) override;
  // dW (+)= x^T dy; db (+)= column sums of dy.
  absl::Status BackwardParams(const DeviceTensor& x, const DeviceTensor& y,
                              const DeviceTensor& dy, bool accumulate) override;
  std::vector<DeviceTensor*> params() override;
  std::vector<DeviceTensor*> grads() override;
  // "kernel" [in, units] (Glorot uniform, fan_in = in, fan_out = units),
  // then, with a bias, "bias" [units] (zeros).
  std::vector<ParamSpec> param_specs() const override;

  int64_t input_dim() const { return input_dim_; }
  int64_t units() const { return units_; }
  bool use_bias() const { return use_bias_; }

 private:
  const int64_t input_dim_;
  const int64_t units_;
  const bool use_bias_;
  DeviceTensor kernel_;       // [in, units]
  DeviceTensor bias_;         // [units], or empty without a bias.
  DeviceTensor kernel_grad_;  // Shaped as kernel_.
  DeviceTensor bias_grad_;    // Shaped as bias_.
  DeviceTensor bias_scratch_;  // Column sums of one micro-batch.
};

// y = max(x, 0), elementwise. No parameters.
class ReLU : public Layer {
 public:
  ReLU(Backend& backend, std::string name) : Layer(backend, std::move(name)) {}

  std::string TypeName() const override { return "ReLU"; }
  int64_t OutputDim(int64_t input_dim) const override { return input_dim; }
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y,
                        const DeviceTensor& dy, DeviceTensor* dx,
                        bool accumulate) override;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_LAYERS_H_
