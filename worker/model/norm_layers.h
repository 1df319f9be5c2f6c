// Batch normalization and dropout: layers whose training pass differs from
// their evaluation pass (Layer::BeginPass says which).
//
// Both take rows [n, C*H*W] of images in CHW order (worker/model/conv_layers.h)
// or plain feature rows [n, d] (as an image d x 1 x 1), and give rows of the
// same shape. Not thread-safe, as every Layer.
#ifndef TOWERPS_WORKER_MODEL_NORM_LAYERS_H_
#define TOWERPS_WORKER_MODEL_NORM_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"
#include "worker/model/conv_layers.h"
#include "worker/model/per_input_state.h"

namespace towerps::worker {

// Keras BatchNormalization over the channels of an image (each channel
// normalized over the batch and its pixels) or the features of a row.
// params() order: gamma [C] (ones), beta [C] (zeros), moving_mean [C]
// (zeros) and moving_variance [C] (ones); the last two are not trainable
// (ParamSpec::moving_average with decay = momentum): in training, their
// grads() entries receive the batch's mean and biased variance, weighted by
// the micro-batch's share of the batch, and the servers fold them into the
// moving averages. Training normalizes with the batch's statistics;
// evaluation with the moving ones.
class BatchNorm : public ImageLayer {
 public:
  struct Options {
    float momentum = 0.99f;  // [0, 1): the moving statistics' decay.
    float epsilon = 1e-3f;   // > 0.
  };
  // InvalidArgument naming the layer and the field for a bad option or an
  // empty input.
  static absl::StatusOr<std::unique_ptr<BatchNorm>> Create(Backend& backend, std::string name,
                                                           ImageDims input,
                                                           const Options& options);

  std::string TypeName() const override { return "BatchNormalization"; }
  void BeginPass(bool training, int64_t batch_rows, uint64_t seed) override;
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  // Training mode only: Internal when no training Forward ran on x in this
  // pass.
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;
  std::vector<DeviceTensor*> params() override;
  std::vector<DeviceTensor*> grads() override;
  std::vector<ParamSpec> param_specs() const override;

  BatchNormShape ShapeFor(int64_t n) const;

 private:
  BatchNorm(Backend& backend, std::string name, ImageDims input, const Options& options);

  // The batch statistics of one training Forward, for its Backward.
  struct Stats {
    DeviceTensor mean;
    DeviceTensor var;
  };

  const Options options_;
  DeviceTensor gamma_, beta_, moving_mean_, moving_var_;
  DeviceTensor gamma_grad_, beta_grad_, mean_out_, var_out_;
  DeviceTensor gamma_scratch_, beta_scratch_, dx_scratch_;
  PerInputState<Stats> stats_;
};

// Keras Dropout (inverted): in training, each input is zeroed with
// probability `rate` and the others scaled by 1 / (1 - rate), with a mask
// drawn anew for every micro-batch of every pass (Backend::DropoutForward,
// seeded from the pass's seed, the layer's name and the micro-batch);
// evaluation is the identity. No parameters.
class Dropout : public ImageLayer {
 public:
  // InvalidArgument naming the layer when rate is not in [0, 1).
  static absl::StatusOr<std::unique_ptr<Dropout>> Create(Backend& backend, std::string name,
                                                         ImageDims input, float rate);

  std::string TypeName() const override { return "Dropout"; }
  void BeginPass(bool training, int64_t batch_rows, uint64_t seed) override;
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;

 private:
  Dropout(Backend& backend, std::string name, ImageDims input, float rate);

  const float rate_;
  const uint64_t name_salt_;
  int64_t calls_ = 0;  // training Forwards in this pass
  PerInputState<DeviceTensor> masks_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_NORM_LAYERS_H_
