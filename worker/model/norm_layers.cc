#include "worker/model/norm_layers.h"

#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

std::string Label(const char* type, const std::string& name) {
  return absl::StrCat(type, " layer '", name, "'");
}

absl::Status CheckImage(const ImageDims& in, const std::string& label) {
  if (in.channels <= 0 || in.height <= 0 || in.width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": input shape must be positive, got ", in.channels, "x", in.height,
                     "x", in.width, " (channels x height x width)"));
  }
  return absl::OkStatus();
}

// SplitMix64's finalizer: mixes the pass seed, the layer and the call into
// one dropout seed.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// FNV-1a of the layer's name: the same on every worker and tower.
uint64_t NameSalt(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

// ---- BatchNorm -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<BatchNorm>> BatchNorm::Create(Backend& backend, std::string name,
                                                             ImageDims input,
                                                             const Options& options) {
  const std::string label = Label("BatchNormalization", name);
  TOWERPS_RETURN_IF_ERROR(CheckImage(input, label));
  if (!(options.momentum >= 0.0f && options.momentum < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": momentum must be in [0, 1), got ", options.momentum));
  }
  if (!(options.epsilon > 0.0f) || !std::isfinite(options.epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": epsilon must be > 0 and finite, got ", options.epsilon));
  }
  return std::unique_ptr<BatchNorm>(new BatchNorm(backend, std::move(name), input, options));
}

BatchNorm::BatchNorm(Backend& backend, std::string name, ImageDims input, const Options& options)
    : ImageLayer(backend, std::move(name), input, input),
      options_(options),
      gamma_(&backend),
      beta_(&backend),
      moving_mean_(&backend),
      moving_var_(&backend),
      gamma_grad_(&backend),
      beta_grad_(&backend),
      mean_out_(&backend),
      var_out_(&backend),
      gamma_scratch_(&backend),
      beta_scratch_(&backend),
      dx_scratch_(&backend) {}

BatchNormShape BatchNorm::ShapeFor(int64_t n) const {
  BatchNormShape shape;
  shape.n = n;
  shape.c = input_image().channels;
  shape.spatial = input_image().height * input_image().width;
  shape.epsilon = options_.epsilon;
  return shape;
}

std::vector<DeviceTensor*> BatchNorm::params() {
  return {&gamma_, &beta_, &moving_mean_, &moving_var_};
}

std::vector<DeviceTensor*> BatchNorm::grads() {
  return {&gamma_grad_, &beta_grad_, &mean_out_, &var_out_};
}

std::vector<Layer::ParamSpec> BatchNorm::param_specs() const {
  const int64_t c = input_image().channels;
  ParamSpec mean{"moving_mean", {c}, ParamSpec::Init::kZeros};
  mean.moving_average = true;
  mean.decay = options_.momentum;
  ParamSpec var{"moving_variance", {c}, ParamSpec::Init::kOnes};
  var.moving_average = true;
  var.decay = options_.momentum;
  return {{"gamma", {c}, ParamSpec::Init::kOnes}, {"beta", {c}, ParamSpec::Init::kZeros}, mean,
          var};
}

void BatchNorm::BeginPass(bool training, int64_t batch_rows, uint64_t seed) {
  Layer::BeginPass(training, batch_rows, seed);
  stats_.Reset();
}

absl::Status BatchNorm::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(y->Resize({n, output_image().size()}));
  if (n == 0) return absl::OkStatus();
  const std::string where = Label("BatchNormalization", name());
  if (!training_) {
    return common::Annotate(
        backend_.BatchNormForwardInference(ShapeFor(n), x.data(), gamma_.data(), beta_.data(),
                                           moving_mean_.data(), moving_var_.data(), y->data()),
        where);
  }
  Backend* b = &backend_;
  Stats& st = stats_.Bind(x, [b] { return Stats{DeviceTensor(b), DeviceTensor(b)}; });
  const int64_t c = input_image().channels;
  TOWERPS_RETURN_IF_ERROR(st.mean.Resize({c}));
  TOWERPS_RETURN_IF_ERROR(st.var.Resize({c}));
  return common::Annotate(
      backend_.BatchNormForwardTraining(ShapeFor(n), x.data(), gamma_.data(), beta_.data(),
                                        y->data(), st.mean.data(), st.var.data()),
      where);
}

absl::Status BatchNorm::Backward(const DeviceTensor& x, const DeviceTensor& y,
                                 const DeviceTensor& dy, DeviceTensor* dx, bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, n));
  const std::string where = Label("BatchNormalization", name());
  const int64_t c = input_image().channels;
  if (dx != nullptr) TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
  if (!accumulate) {
    for (DeviceTensor* g : grads()) backend_.Zero(g->num_elements(), g->data());
  }
  if (n == 0) return absl::OkStatus();
  const Stats* st = stats_.Find(x);
  if (st == nullptr) {
    return absl::InternalError(
        absl::StrCat(where, ": Backward without a training Forward on its input in this pass"));
  }
  DeviceTensor* dx_out = dx;
  if (dx_out == nullptr) {
    TOWERPS_RETURN_IF_ERROR(dx_scratch_.Resize(x.shape()));
    dx_out = &dx_scratch_;
  }
  TOWERPS_RETURN_IF_ERROR(gamma_scratch_.Resize({c}));
  TOWERPS_RETURN_IF_ERROR(beta_scratch_.Resize({c}));
  TOWERPS_RETURN_IF_ERROR(common::Annotate(
      backend_.BatchNormBackward(ShapeFor(n), x.data(), dy.data(), gamma_.data(),
                                 st->mean.data(), st->var.data(), dx_out->data(),
                                 gamma_scratch_.data(), beta_scratch_.data()),
      where));
  backend_.Axpy(c, 1.0f, gamma_scratch_.data(), gamma_grad_.data());
  backend_.Axpy(c, 1.0f, beta_scratch_.data(), beta_grad_.data());
  // The batch statistics, weighted by this micro-batch's share of the batch,
  // so that the micro-batches (and the towers, whose reducer weighs them by
  // their examples) add up to the whole batch's statistics.
  const float share =
      static_cast<float>(n) / static_cast<float>(batch_rows_ > 0 ? batch_rows_ : n);
  backend_.Axpy(c, share, st->mean.data(), mean_out_.data());
  backend_.Axpy(c, share, st->var.data(), var_out_.data());
  return absl::OkStatus();
}

// ---- Dropout --------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Dropout>> Dropout::Create(Backend& backend, std::string name,
                                                         ImageDims input, float rate) {
  const std::string label = Label("Dropout", name);
  TOWERPS_RETURN_IF_ERROR(CheckImage(input, label));
  if (!(rate >= 0.0f && rate < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": rate must be in [0, 1), got ", rate));
  }
  return std::unique_ptr<Dropout>(new Dropout(backend, std::move(name), input, rate));
}

Dropout::Dropout(Backend& backend, std::string name, ImageDims input, float rate)
    : ImageLayer(backend, name, input, input), rate_(rate), name_salt_(NameSalt(name)) {}

void Dropout::BeginPass(bool training, int64_t batch_rows, uint64_t seed) {
  Layer::BeginPass(training, batch_rows, seed);
  calls_ = 0;
  masks_.Reset();
}

absl::Status Dropout::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.num_elements();
  TOWERPS_RETURN_IF_ERROR(y->Resize(x.shape()));
  if (n == 0) return absl::OkStatus();
  if (!training_) {
    return common::Annotate(backend_.CopyFrom(backend_, x.data(), n, y->data()),
                            Label("Dropout", name()));
  }
  Backend* b = &backend_;
  DeviceTensor& mask = masks_.Bind(x, [b] { return DeviceTensor(b); });
  TOWERPS_RETURN_IF_ERROR(mask.Resize(x.shape()));
  const uint64_t seed = Mix(pass_seed_ ^ Mix(name_salt_ + static_cast<uint64_t>(calls_++)));
  backend_.DropoutForward(n, rate_, seed, x.data(), y->data(), mask.data());
  return absl::OkStatus();
}

absl::Status Dropout::Backward(const DeviceTensor& x, const DeviceTensor& y,
                               const DeviceTensor& dy, DeviceTensor* dx, bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, x.dim(0)));
  if (dx == nullptr) return absl::OkStatus();
  TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
  if (x.num_elements() == 0) return absl::OkStatus();
  const DeviceTensor* mask = masks_.Find(x);
  if (mask == nullptr) {
    return absl::InternalError(absl::StrCat(
        Label("Dropout", name()), ": Backward without a training Forward on its input in this pass"));
  }
  backend_.Mul(x.num_elements(), dy.data(), mask->data(), dx->data());
  return absl::OkStatus();
}

}  // namespace towerps::worker
