// A residual block (He et al. 2015, in d2l's form): a composite layer of two
// 3x3 convolutions with batch norms, and a shortcut.
//
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//
// conv1 has `filters` and `stride`, conv2 stride 1, both with one row and
// column of zero padding on every side (PyTorch's padding=1; Keras' SAME
// would be uneven at stride 2 on even sizes). The
// shortcut is x itself, or a 1x1 convolution with `stride` (with a bias, no
// batch norm, as d2l) when the stride is not 1 or the channel count
// changes. Rows are images in CHW order (worker/model/conv_layers.h).
//
// params() are the parts' in the order conv1, bn1, conv2, bn2, then the
// shortcut's convolution; param_specs() names them "conv1/kernel",
// "bn1/gamma", ..., "shortcut/kernel", so the variables are
// "<block>/conv1/kernel" and so on. Intermediate activations of each
// micro-batch are kept from its Forward for its Backward (by its input, as
// worker/model/per_input_state.h says). Not thread-safe, as every Layer.
#ifndef TOWERPS_WORKER_MODEL_RESIDUAL_H_
#define TOWERPS_WORKER_MODEL_RESIDUAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"
#include "worker/model/conv_layers.h"
#include "worker/model/norm_layers.h"
#include "worker/model/per_input_state.h"

namespace towerps::worker {

class ResidualBlock : public ImageLayer {
 public:
  struct Options {
    int64_t filters = 0;  // REQUIRED > 0.
    int stride = 1;       // >= 1.
    bool use_bias = true;  // of the convolutions
    BatchNorm::Options batch_norm;
  };
  // InvalidArgument naming the block (and the part) for a bad option or an
  // input the convolutions do not fit.
  static absl::StatusOr<std::unique_ptr<ResidualBlock>> Create(Backend& backend, std::string name,
                                                               ImageDims input,
                                                               const Options& options);

  std::string TypeName() const override { return "Residual"; }
  void BeginPass(bool training, int64_t batch_rows, uint64_t seed) override;
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;
  std::vector<DeviceTensor*> params() override;
  std::vector<DeviceTensor*> grads() override;
  std::vector<ParamSpec> param_specs() const override;

  bool has_projection() const { return shortcut_ != nullptr; }

 private:
  ResidualBlock(Backend& backend, std::string name, ImageDims input, ImageDims output);

  // The parts, each with a role name used in param_specs().
  std::vector<std::pair<std::string, Layer*>> Parts() const;

  // One micro-batch's intermediates, those its Backward reads (bn2's
  // output and the projection's are formed in the block's output).
  struct Acts {
    DeviceTensor c1, a1, c2;  // conv1, relu(bn1), conv2
  };

  std::unique_ptr<Conv2D> conv1_, conv2_, shortcut_;
  std::unique_ptr<BatchNorm> bn1_, bn2_;
  PerInputState<Acts> acts_;
  // Backward scratch (g_ also holds the projection's output in Forward).
  DeviceTensor g_, g_c2_, g_a1_, g_s_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_RESIDUAL_H_
