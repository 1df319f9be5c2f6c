// A feed-forward model built from a v1::ModelSpec: its variables, a training
// step's gradients and an evaluation pass.
//
// Lifecycle: Create() -> (load weights(), e.g. from a pull, or
// InitializeWeights()) -> ComputeGradients() / Evaluate(), repeatedly. The
// model owns its weights, gradients and activation buffers; buffers are reused
// from step to step.
#ifndef TOWERPS_WORKER_MODEL_MODEL_H_
#define TOWERPS_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"
#include "worker/model/batch.h"
#include "worker/model/layers.h"
#include "worker/model/losses.h"

namespace towerps::worker {

// Not thread-safe: one Model per thread (each with its own Backend).
class Model {
 public:
  // Validates `spec` and builds the layers, with all weights zero.
  //
  // Layer names default like Keras' ("dense", "dense_1", ...; "re_lu",
  // "re_lu_1", ... for RELU_LAYER), skipping names given explicitly. A DENSE
  // layer with activation RELU becomes a Dense layer followed by a ReLU layer
  // ("<name>/relu"); Summary() shows them as one row, as Keras does.
  //
  // Image layers (CONV2D, MAX_POOL2D, AVG_POOL2D, GLOBAL_AVG_POOL2D,
  // FLATTEN; worker/model/conv_layers.h) keep activations as rows [n, C*H*W]
  // in CHW order; the image shape flows from spec.input_shape through them
  // and ends at FLATTEN, GLOBAL_AVG_POOL2D or a DENSE (which takes the
  // flattened width). Default names as Keras' ("conv2d", "max_pooling2d",
  // "average_pooling2d", "global_average_pooling2d", "flatten"); a CONV2D
  // with activation RELU gets a "<name>/relu" layer, one summary row.
  // Summary() shows image outputs channels first: "(None, 32, 26, 26)".
  //
  // Returns InvalidArgument, naming the layer (index and name) and the field,
  // when: input_dim <= 0; input_shape is set but not positive or its
  // C*H*W is not input_dim; there are no layers; a layer type is unset or
  // unknown; a DENSE layer has units <= 0 or an unknown activation; an image
  // layer has no image input (input_shape unset, or after a DENSE/FLATTEN);
  // a CONV2D or pooling field is out of range, its kernel does not fit, or
  // its SAME padding would be uneven; two layers share a name or a name
  // contains '/'; the loss type is unknown.
  // `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const v1::ModelSpec& spec, Backend& backend);

  // Where one spec layer computes: its device's backend (not owned; must
  // outlive the model) and the device's name, for logs and Summary().
  struct LayerPlacement {
    Backend* backend = nullptr;
    std::string device;
  };
  // Called once per spec layer with its final name and its `device` field
  // (may be empty); an error aborts Create and is returned as is.
  using LayerPlacer = std::function<absl::StatusOr<LayerPlacement>(
      const std::string& layer_name, const std::string& requested_device)>;

  // As above, with each layer on the device `placer` picks (model
  // parallelism). Virtual CPU devices share host memory, so activations and
  // their gradients cross devices without a copy; a GPU backend copies them.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const v1::ModelSpec& spec, const LayerPlacer& placer);

  // Bytes of each spec layer's weights and their gradients (its activation
  // buffers are allocated on its device as they are needed; see
  // PrepareBuffers).
  struct LayerMemory {
    std::string layer;
    int64_t bytes = 0;
  };
  std::vector<LayerMemory> ParamMemory() const;

  // Allocates the activation buffers for a batch of `max_batch` examples
  // now (with micro-batches, each micro-batch's for its part), so that a
  // device too small fails at start with its allocator's error (prefixed
  // with the layer) instead of in the first step. Call after
  // set_micro_batches.
  absl::Status PrepareBuffers(int64_t max_batch);

  // The device of each spec layer, in order ("" without a placer).
  const std::vector<std::string>& layer_devices() const { return layer_devices_; }

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  // The trainable variables, in a fixed order: for each Dense layer,
  // "<layer>/kernel" [in, out] (GLOROT_UNIFORM, fan_in = in, fan_out = out)
  // then, unless no_bias, "<layer>/bias" [out] (ZEROS); all DT_FLOAT32.
  // Variable i's Glorot seed is VariableSeed(spec.init_seed or 1, i).
  std::vector<v1::VariableDef> VariableDefs() const;

  // The weight tensors and their gradients, in VariableDefs() order, in host
  // memory: pulls write weights() and pushes read gradients(). The pointers
  // stay valid for the model's lifetime. Layers on a host-memory device
  // (CPU) compute on these very buffers; layers on a GPU keep device copies
  // (ComputeGradients uploads weights() first and downloads the gradients).
  std::vector<common::Tensor*> weights();
  std::vector<common::Tensor*> gradients();
  // Moves host weight and gradient `v` to `weight` and `grad` (Tensor::MoveTo:
  // each holds the variable's elements and outlives its use here; null: back
  // into the tensor's own allocation), keeping their values, or with
  // `keep_values` false taking those already there (Tensor::LiveAt: nothing
  // copied, for memory written before it is read); layers on host memory
  // then compute on them there. For a worker's shared memory
  // (ParameterClient::SharedValues), where the servers' pulls land and
  // pushes are read, so that neither is copied on the worker. Between steps
  // only. REQUIRES: `keep_values` unless both are non-null.
  void PlaceHostTensors(size_t v, float* weight, float* grad, bool keep_values = true);

  // Splits every ComputeGradients batch into `m` micro-batches (sizes differ
  // by at most one). When the layers sit on several devices, each run of
  // layers on one device is a pipeline stage, and a PipelineScheduler
  // (worker/model/pipeline_scheduler.h) drives the stages' steps, a thread
  // per stage, so the devices work on different micro-batches at the same
  // time (GPipe: every micro-batch forward, then every one backward,
  // gradients accumulated on each device). The result is the whole batch's gradient (up to float
  // summation order). REQUIRES: m >= 1. Default 1.
  void set_micro_batches(int m) { micro_batches_ = m < 1 ? 1 : m; }
  int micro_batches() const { return micro_batches_; }
  // Pipeline stages: runs of consecutive layers on the same device.
  int num_stages() const { return static_cast<int>(stages_.size()); }

  // Fills every weight from its VariableDef's initializer with
  // common::InitializeValues, the function the parameter server uses, so the
  // values equal a fresh server's without one (for tests and local runs).
  void InitializeWeights();

  // Forward pass, loss and backward pass. Overwrites gradients() with
  // d(mean over the batch of per-example losses)/d(weights). Returns the SUM
  // of per-example losses and the number of correct predictions. A batch of
  // size 0 gives zero gradients and a zero result.
  // Returns InvalidArgument when the features are not [n, input_dim()] or the
  // labels/targets do not fit (see ComputeLoss); gradients are then
  // unspecified.
  absl::StatusOr<LossResult> ComputeGradients(const Batch& batch);

  // What a training step tells its caller as it goes, so that the caller
  // can move weights and gradients while the step computes (worker/train
  // pushes each layer's gradients as soon as backward produces them, and
  // each layer waits only for its own weights). Either may be null.
  struct StepEvents {
    // Before anything reads weights()[first, first + count): blocks until
    // they hold the step's values. An error stops the step and is returned.
    std::function<absl::Status(int first, int count)> weights_needed;
    // Once gradients()[first, first + count) are final for this step (in
    // host memory): the step does not write them again, nor read
    // weights()[first, first + count) again (a server on the same host may
    // write the next step's values there from then on: worker/train/
    // ps_client.h, SharedValues). An error stops the step and is returned.
    std::function<absl::Status(int first, int count)> gradients_ready;
  };
  // ComputeGradients that announces, through `events`, every variable
  // exactly once to each callback, layer by layer: weights in forward order,
  // before the layer's first micro-batch; gradients after its last one (a
  // layer on a GPU uploads its weights after the wait and downloads its
  // gradients before the announcement), in backward order, except that a
  // stage's first layer with parameters comes before its second when it
  // has more elements and both are dense (Layer::SplitsBackward): the last
  // micro-batch backpropagates through the second before forming its
  // gradients, so that a server updating ahead (same host, cores of its
  // own: ps/push_session.h) updates the larger first
  // layer, which the next forward needs first, while the worker still
  // forms the smaller second one, rather than after the push (an MLP's
  // 784x256 first layer: issue 16). The same gradients, bit for bit,
  // either way. An empty batch
  // announces every variable at once. With several pipeline stages the
  // callbacks run on the stages' threads, at the same time: they must be
  // thread-safe. On error, announcements may stop part way.
  absl::StatusOr<LossResult> ComputeGradients(const Batch& batch, const StepEvents& events);

  // The steps ComputeGradients is made of, for towers that reduce their
  // gradients on the devices before one download:
  //  - LoadWeights: the next step uses the values of `host` (VariableDefs()
  //    order and shapes; e.g. another tower's weights()). Host-memory layers
  //    read them in place (no copy: they must stay unchanged until the step
  //    ends); GPU layers copy them to the device.
  //  - ComputeDeviceGradients: forward, loss and backward; the gradients are
  //    left in device_gradients() and every device is synchronized.
  //  - DownloadGradients: copies device gradients into gradients() (nothing
  //    to do for host-memory layers, whose gradients are gradients()).
  absl::Status LoadWeights(const std::vector<common::Tensor*>& host);
  //  - ShareWeights: the next step uses the weights `from` holds on its
  //    devices now (after its LoadWeights; `from` has the same spec and must
  //    not change them until the step ends). A layer in the same memory
  //    space as `from`'s reads them in place (towers on one GPU or on the
  //    host: no copy, and the layer's own weight buffer is given back); others
  //    copy them device to device. So towers upload the weights once per
  //    step, not once per tower.
  absl::Status ShareWeights(Model& from) { return ShareWeights(std::vector<Model*>{&from}); }
  // As above, each weight read in place from the first of `from` in the
  // same memory space, else copied from from[0].
  absl::Status ShareWeights(const std::vector<Model*>& from);
  absl::StatusOr<LossResult> ComputeDeviceGradients(const Batch& batch);
  std::vector<DeviceTensor*> device_gradients();
  absl::Status DownloadGradients();
  // Waits for every device of the model.
  absl::Status SynchronizeDevices();

  // Forward pass and loss only; gradients() are untouched. loss_sum is the
  // sum over the batch, so callers can average across batches. Errors as for
  // ComputeGradients.
  absl::StatusOr<LossResult> Evaluate(const Batch& batch);

  const std::string& name() const { return name_; }
  v1::LossType loss() const { return loss_; }
  int64_t input_dim() const { return input_dim_; }
  int64_t output_dim() const { return output_dim_; }
  // Total number of weight elements, and those trained by the optimizer (all
  // but batch norm's moving statistics).
  int64_t num_parameters() const { return num_parameters_; }
  int64_t num_trainable_parameters() const { return num_trainable_; }

  // Dropout masks differ between passes and between models with different
  // streams (give each tower of each worker its own); default 0.
  void set_random_stream(uint64_t stream) { random_stream_ = stream; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  // A Keras-like table:
  //   Model: "mlp"
  //   _______________________________________________________________
  //    Layer (type)                Output Shape              Param #
  //   ===============================================================
  //    dense (Dense)               (None, 256)               200960
  //   ...
  //   Total params: 269,322
  //   Trainable params: 269,322
  //   Non-trainable params: 0
  std::string Summary() const;

 private:
  // One row of Summary(): a spec layer (a Dense and its fused ReLU are one).
  struct SummaryRow {
    std::string name;
    std::string type;
    std::string output_shape;  // "(None, 10)"; images "(None, C, H, W)".
    int64_t params;
  };

  Model(std::string name, v1::LossType loss, LossKind loss_kind,
        int64_t input_dim, uint64_t init_seed);

  // One micro-batch's buffers, each on its layer's device.
  struct Flow {
    std::vector<DeviceTensor> in;    // in[i]: layer i's input when it is a copy
    std::vector<DeviceTensor> out;   // out[i]: layer i's output
    std::vector<DeviceTensor> dout;  // dout[i]: dL/d out[i]
    std::vector<DeviceTensor> din;   // din[i]: dL/d input of layer i, before
                                     // its copy to the previous device
    std::vector<const DeviceTensor*> x;  // x[i]: layer i's input in the
                                         // forward pass, reused backward
    DeviceTensor labels;             // on the last layer's device
    DeviceTensor targets;
    std::vector<float> host_labels;
    int64_t begin = 0, rows = 0;     // rows of the batch
    LossResult loss;
  };
  struct Stage {
    size_t first = 0, end = 0;  // layers [first, end)
    // The stage's first two layers with parameters, when the first one's
    // gradients are formed before the second one's (see StepEvents): both
    // split their backward (Layer::SplitsBackward) and the first has more
    // elements. -1: backward order.
    int early = -1, deferred = -1;
  };

  void EnsureFlows(size_t n);
  // Layer i's input for `flow`: the features (i == 0), the previous layer's
  // output, or a copy of it on layer i's device.
  absl::StatusOr<const DeviceTensor*> Input(const Batch& batch, Flow& flow,
                                            size_t i);
  // The per-stage steps Run hands to the PipelineScheduler; steps of
  // different stages may run at the same time on different threads (they
  // touch only their stage's layers and the flow's buffers of those layers).
  // Runs stage `s` forward on `flow` (and the loss, with its gradient when
  // `grad_count` > 0, if `s` is the last stage).
  // `k` is the micro-batch; the events (when set) fire on the first
  // micro-batch's forward and the last one's backward.
  absl::Status StageForward(const Batch& batch, size_t s, Flow& flow, int k,
                            int64_t grad_count);
  absl::Status StageBackward(const Batch& batch, size_t s, Flow& flow, int k,
                             int m);
  absl::StatusOr<LossResult> Run(const Batch& batch, bool train,
                                 const StepEvents* events = nullptr);
  // Layer i's variables: [layer_vars_[i], layer_vars_[i + 1]).
  absl::Status LayerWeightsNeeded(size_t i);
  absl::Status LayerGradientsReady(size_t i);
  bool SameSpace(size_t a, size_t b) const;
  // Makes weight v its own again (a view of host_weights_[v] on host memory,
  // an owned device buffer elsewhere), so it can be written.
  absl::Status OwnWeight(size_t v);

  // Constant after construction. The layers hold the Backend.
  const std::string name_;
  const v1::LossType loss_;
  const LossKind loss_kind_;  // loss_ in the backends' words
  const int64_t input_dim_;
  const uint64_t init_seed_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<SummaryRow> summary_rows_;
  int64_t output_dim_ = 0;
  std::vector<std::string> layer_devices_;
  int64_t num_parameters_ = 0;
  int64_t num_trainable_ = 0;
  uint64_t random_stream_ = 0;
  uint64_t passes_ = 0;  // Runs so far: each gets its own seed.
  std::vector<Stage> stages_;
  int micro_batches_ = 1;

  // Host weights and gradients (VariableDefs order), and where each lives
  // in the layers.
  std::vector<common::Tensor> host_weights_;
  std::vector<common::Tensor> host_grads_;
  std::vector<DeviceTensor*> device_weights_;
  std::vector<DeviceTensor*> device_grads_;

  // Where each layer's variables start (VariableDefs order), plus the end.
  std::vector<int> layer_vars_;

  // Per-step scratch, reused: one Flow per micro-batch.
  std::vector<Flow> flows_;
  // The events of the step under way (ComputeGradients with events).
  const StepEvents* events_ = nullptr;  // Not owned.
};

// The Glorot seed of variable `index`: SplitMix64's finalizer applied to
// base_seed + (index + 1) * 0x9E3779B97F4A7C15, so that every variable draws
// an independent-looking stream that is the same on every worker.
uint64_t VariableSeed(uint64_t base_seed, int64_t index);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_MODEL_H_
