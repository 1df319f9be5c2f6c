#include "worker/model/residual.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {

absl::StatusOr<std::unique_ptr<ResidualBlock>> ResidualBlock::Create(Backend& backend,
                                                                     std::string name,
                                                                     ImageDims input,
                                                                     const Options& options) {
  const std::string label = absl::StrCat("Residual layer '", name, "'");
  Conv2D::Options c;
  c.filters = options.filters;
  c.kernel_h = c.kernel_w = 3;
  c.stride = options.stride;
  c.explicit_pad = 1;
  c.use_bias = options.use_bias;
  auto conv1 = Conv2D::Create(backend, absl::StrCat(name, "/conv1"), input, c);
  if (!conv1.ok()) return common::Annotate(conv1.status(), label);
  c.stride = 1;
  auto conv2 = Conv2D::Create(backend, absl::StrCat(name, "/conv2"), (*conv1)->output_image(), c);
  if (!conv2.ok()) return common::Annotate(conv2.status(), label);
  auto bn1 = BatchNorm::Create(backend, absl::StrCat(name, "/bn1"), (*conv1)->output_image(),
                               options.batch_norm);
  if (!bn1.ok()) return common::Annotate(bn1.status(), label);
  auto bn2 = BatchNorm::Create(backend, absl::StrCat(name, "/bn2"), (*conv2)->output_image(),
                               options.batch_norm);
  if (!bn2.ok()) return common::Annotate(bn2.status(), label);
  const ImageDims output = (*conv2)->output_image();
  auto block = std::unique_ptr<ResidualBlock>(
      new ResidualBlock(backend, std::move(name), input, output));
  if (options.stride != 1 || input.channels != options.filters) {
    Conv2D::Options p;
    p.filters = options.filters;
    p.kernel_h = p.kernel_w = 1;
    p.stride = options.stride;
    p.use_bias = options.use_bias;
    auto shortcut = Conv2D::Create(backend, absl::StrCat(block->name(), "/shortcut"), input, p);
    if (!shortcut.ok()) return common::Annotate(shortcut.status(), label);
    if (!((*shortcut)->output_image() == output)) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": the shortcut gives ", (*shortcut)->output_image().ShapeString(),
          " but the convolutions ", output.ShapeString(), " (odd input size with stride ",
          options.stride, ")"));
    }
    block->shortcut_ = std::move(*shortcut);
  }
  block->conv1_ = std::move(*conv1);
  block->conv2_ = std::move(*conv2);
  block->bn1_ = std::move(*bn1);
  block->bn2_ = std::move(*bn2);
  return block;
}

ResidualBlock::ResidualBlock(Backend& backend, std::string name, ImageDims input,
                             ImageDims output)
    : ImageLayer(backend, std::move(name), input, output),
      g_(&backend),
      g_c2_(&backend),
      g_a1_(&backend),
      g_s_(&backend) {}

std::vector<std::pair<std::string, Layer*>> ResidualBlock::Parts() const {
  std::vector<std::pair<std::string, Layer*>> parts = {
      {"conv1", conv1_.get()}, {"bn1", bn1_.get()}, {"conv2", conv2_.get()}, {"bn2", bn2_.get()}};
  if (shortcut_) parts.emplace_back("shortcut", shortcut_.get());
  return parts;
}

std::vector<DeviceTensor*> ResidualBlock::params() {
  std::vector<DeviceTensor*> out;
  for (auto& [role, part] : Parts()) {
    for (DeviceTensor* p : part->params()) out.push_back(p);
  }
  return out;
}

std::vector<DeviceTensor*> ResidualBlock::grads() {
  std::vector<DeviceTensor*> out;
  for (auto& [role, part] : Parts()) {
    for (DeviceTensor* g : part->grads()) out.push_back(g);
  }
  return out;
}

std::vector<Layer::ParamSpec> ResidualBlock::param_specs() const {
  std::vector<ParamSpec> out;
  for (const auto& [role, part] : Parts()) {
    for (ParamSpec s : part->param_specs()) {
      s.name = absl::StrCat(role, "/", s.name);
      out.push_back(std::move(s));
    }
  }
  return out;
}

void ResidualBlock::BeginPass(bool training, int64_t batch_rows, uint64_t seed) {
  Layer::BeginPass(training, batch_rows, seed);
  for (auto& [role, part] : Parts()) part->BeginPass(training, batch_rows, seed);
  acts_.Reset();
}

absl::Status ResidualBlock::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  Backend* b = &backend_;
  Acts& a = acts_.Bind(x, [b] { return Acts{DeviceTensor(b), DeviceTensor(b), DeviceTensor(b)}; });
  TOWERPS_RETURN_IF_ERROR(conv1_->Forward(x, &a.c1));
  TOWERPS_RETURN_IF_ERROR(bn1_->Forward(a.c1, &a.a1));
  backend_.Relu(a.a1.num_elements(), a.a1.data(), a.a1.data());
  TOWERPS_RETURN_IF_ERROR(conv2_->Forward(a.a1, &a.c2));
  // bn2's output is the sum's first term, formed in y itself: no backward
  // reads it (a batch norm's Backward needs its input and statistics).
  TOWERPS_RETURN_IF_ERROR(bn2_->Forward(a.c2, y));
  if (n == 0) return absl::OkStatus();
  const int64_t size = y->num_elements();
  if (shortcut_) {
    // The projection's output is needed only for the sum (its Backward
    // reads its input): formed in g_, which only a Backward uses otherwise.
    TOWERPS_RETURN_IF_ERROR(shortcut_->Forward(x, &g_));
    backend_.Axpy(size, 1.0f, g_.data(), y->data());
  } else {
    backend_.Axpy(size, 1.0f, x.data(), y->data());
  }
  backend_.Relu(size, y->data(), y->data());
  return absl::OkStatus();
}

absl::Status ResidualBlock::Backward(const DeviceTensor& x, const DeviceTensor& y,
                                     const DeviceTensor& dy, DeviceTensor* dx, bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output", y, n));
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, n));
  Acts* a = acts_.Find(x);
  if (a == nullptr) {
    return absl::InternalError(absl::StrCat("Residual layer '", name(),
                                            "': Backward without a Forward on its input in this pass"));
  }
  // g = dL/d(sum before the last ReLU): the gradient of both branches.
  TOWERPS_RETURN_IF_ERROR(g_.Resize(y.shape()));
  backend_.ReluGrad(y.num_elements(), y.data(), dy.data(), g_.data());
  // (A batch norm's and a convolution's Backward read no output: `y`
  // stands for bn2's and the projection's, which are not kept.)
  TOWERPS_RETURN_IF_ERROR(bn2_->Backward(a->c2, y, g_, &g_c2_, accumulate));
  TOWERPS_RETURN_IF_ERROR(conv2_->Backward(a->a1, a->c2, g_c2_, &g_a1_, accumulate));
  backend_.ReluGrad(a->a1.num_elements(), a->a1.data(), g_a1_.data(), g_a1_.data());
  // dL/d(conv1's output) in g_c2_, whose values conv2's Backward consumed.
  DeviceTensor& g_c1 = g_c2_;
  TOWERPS_RETURN_IF_ERROR(bn1_->Backward(a->c1, a->a1, g_a1_, &g_c1, accumulate));
  TOWERPS_RETURN_IF_ERROR(conv1_->Backward(x, a->c1, g_c1, dx, accumulate));
  if (shortcut_) {
    TOWERPS_RETURN_IF_ERROR(shortcut_->Backward(x, y, g_, dx ? &g_s_ : nullptr, accumulate));
    if (dx != nullptr && n > 0) backend_.Axpy(dx->num_elements(), 1.0f, g_s_.data(), dx->data());
  } else if (dx != nullptr && n > 0) {
    backend_.Axpy(dx->num_elements(), 1.0f, g_.data(), dx->data());
  }
  return absl::OkStatus();
}

}  // namespace towerps::worker
