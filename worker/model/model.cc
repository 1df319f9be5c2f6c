#include "worker/model/model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/initializer.h"
#include "common/status.h"
#include "worker/model/losses.h"
#include "worker/model/pipeline_scheduler.h"

namespace towerps::worker {
namespace {

// Rows of micro-batch k when n rows are cut into m: sizes differ by at most
// one, the larger first (Run's cut, which PrepareBuffers reserves for).
int64_t MicroBatchRows(int64_t n, int m, int k) { return n / m + (k < n % m ? 1 : 0); }

// "269322" -> "269,322".
std::string WithThousands(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace

uint64_t VariableSeed(uint64_t base_seed, int64_t index) {
  uint64_t z =
      base_seed + static_cast<uint64_t>(index + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Model::Model(std::string name, v1::LossType loss, LossKind loss_kind,
             int64_t input_dim, uint64_t init_seed)
    : name_(std::move(name)),
      loss_(loss),
      loss_kind_(loss_kind),
      input_dim_(input_dim),
      init_seed_(init_seed) {}

Model::~Model() = default;

std::vector<v1::VariableDef> Model::VariableDefs() const {
  std::vector<v1::VariableDef> defs;
  for (const auto& layer : layers_) {
    for (const Layer::ParamSpec& p : layer->param_specs()) {
      v1::VariableDef def;
      def.set_name(absl::StrCat(layer->name(), "/", p.name));
      for (int64_t d : p.shape) def.add_shape(d);
      def.set_dtype(v1::DT_FLOAT32);
      v1::Initializer* init = def.mutable_initializer();
      switch (p.init) {
        case Layer::ParamSpec::Init::kGlorotUniform:
          init->set_type(v1::Initializer::GLOROT_UNIFORM);
          init->set_seed(VariableSeed(init_seed_, static_cast<int64_t>(defs.size())));
          init->set_fan_in(p.fan_in);
          init->set_fan_out(p.fan_out);
          break;
        case Layer::ParamSpec::Init::kZeros:
          init->set_type(v1::Initializer::ZEROS);
          break;
        case Layer::ParamSpec::Init::kOnes:
          init->set_type(v1::Initializer::CONSTANT);
          init->set_value(1.0f);
          break;
      }
      if (p.moving_average) {
        def.set_update(v1::VariableDef::MOVING_AVERAGE);
        def.set_moving_average_decay(p.decay);
      }
      defs.push_back(std::move(def));
    }
  }
  return defs;
}

std::vector<common::Tensor*> Model::weights() {
  std::vector<common::Tensor*> out;
  for (common::Tensor& t : host_weights_) out.push_back(&t);
  return out;
}

std::vector<common::Tensor*> Model::gradients() {
  std::vector<common::Tensor*> out;
  for (common::Tensor& t : host_grads_) out.push_back(&t);
  return out;
}

void Model::PlaceHostTensors(size_t v, float* weight, float* grad, bool keep_values) {
  if (keep_values) {
    host_weights_[v].MoveTo(weight);
    host_grads_[v].MoveTo(grad);
  } else {
    host_weights_[v].LiveAt(weight);
    host_grads_[v].LiveAt(grad);
  }
  // Views of the old buffers follow (the weights' also at the next
  // LoadWeights or OwnWeight; the gradients' only here).
  DeviceTensor* w = device_weights_[v];
  if (w->backend()->host_memory()) {
    w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    device_grads_[v]->ViewHost(host_grads_[v].shape(), host_grads_[v].data());
  }
}

std::vector<DeviceTensor*> Model::device_gradients() { return device_grads_; }

void Model::InitializeWeights() {
  const std::vector<v1::VariableDef> defs = VariableDefs();
  for (size_t i = 0; i < defs.size(); ++i) {
    common::InitializeValues(defs[i].initializer(), host_weights_[i].span());
  }
}

absl::Status Model::OwnWeight(size_t v) {
  DeviceTensor* w = device_weights_[v];
  if (w->backend()->host_memory()) {
    if (w->data() != host_weights_[v].data()) {
      w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    }
    return absl::OkStatus();
  }
  if (w->is_view()) return w->Resize(host_weights_[v].shape());
  return absl::OkStatus();
}

absl::Status Model::LoadWeights(const std::vector<common::Tensor*>& host) {
  if (host.size() != device_weights_.size()) {
    return absl::InternalError(absl::StrCat("model '", name_, "': ", host.size(),
                                            " weight tensors for ",
                                            device_weights_.size(), " variables"));
  }
  for (size_t v = 0; v < host.size(); ++v) {
    DeviceTensor* w = device_weights_[v];
    if (host[v]->num_elements() != host_weights_[v].num_elements()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': weight ", v,
                                              " has shape ", host[v]->ShapeString(),
                                              ", want ", host_weights_[v].ShapeString()));
    }
    if (w->backend()->host_memory()) {
      if (w->data() != host[v]->data()) w->ViewHost(host[v]->shape(), host[v]->data());
    } else {
      TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
      w->backend()->CopyFromHost(host[v]->data(), host[v]->num_elements(), w->data());
    }
  }
  return absl::OkStatus();
}

absl::Status Model::ShareWeights(const std::vector<Model*>& from) {
  for (const Model* m : from) {
    if (m->device_weights_.size() != device_weights_.size()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': cannot share the weights of '",
                                              m->name_, "': different variables"));
    }
  }
  for (size_t v = 0; v < device_weights_.size(); ++v) {
    DeviceTensor* w = device_weights_[v];
    DeviceTensor* src = from[0]->device_weights_[v];
    for (const Model* m : from) {
      if (m->device_weights_[v]->backend()->memory_space() == w->backend()->memory_space()) {
        src = m->device_weights_[v];
        break;
      }
    }
    if (src->num_elements() != host_weights_[v].num_elements()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': weight ", v, " has shape ",
                                              src->ShapeString(), ", want ",
                                              host_weights_[v].ShapeString()));
    }
    if (w->backend()->memory_space() == src->backend()->memory_space()) {
      if (w->data() != src->data()) w->View(src->shape(), src->data());
    } else {
      TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
      TOWERPS_RETURN_IF_ERROR(
          w->backend()->CopyFrom(*src->backend(), src->data(), src->num_elements(), w->data()));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::SynchronizeDevices() {
  for (const Stage& stage : stages_) {
    TOWERPS_RETURN_IF_ERROR(layers_[stage.first]->backend().Synchronize());
  }
  return absl::OkStatus();
}

absl::Status Model::DownloadGradients() {
  for (size_t v = 0; v < device_grads_.size(); ++v) {
    DeviceTensor* g = device_grads_[v];
    if (g->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(
        g->backend()->CopyToHost(g->data(), g->num_elements(), host_grads_[v].data()));
  }
  return absl::OkStatus();
}

bool Model::SameSpace(size_t a, size_t b) const {
  Backend& x = layers_[a]->backend();
  Backend& y = layers_[b]->backend();
  return &x == &y || x.memory_space() == y.memory_space();
}

void Model::EnsureFlows(size_t n) {
  while (flows_.size() < n) {
    Flow f;
    for (const auto& layer : layers_) {
      Backend* b = &layer->backend();
      f.in.emplace_back(b);
      f.out.emplace_back(b);
      f.dout.emplace_back(b);
      f.din.emplace_back(b);
    }
    f.x.assign(layers_.size(), nullptr);
    f.labels = DeviceTensor(&layers_.back()->backend());
    f.targets = DeviceTensor(&layers_.back()->backend());
    flows_.push_back(std::move(f));
  }
}

absl::StatusOr<const DeviceTensor*> Model::Input(const Batch& batch, Flow& flow,
                                                 size_t i) {
  Backend& b = layers_[i]->backend();
  DeviceTensor& in = flow.in[i];
  if (i == 0) {
    const float* rows = batch.features.data() + flow.begin * input_dim_;
    if (b.host_memory()) {
      in.ViewHost({flow.rows, input_dim_}, rows);
    } else {
      TOWERPS_RETURN_IF_ERROR(in.Resize({flow.rows, input_dim_}));
      b.CopyFromHost(rows, flow.rows * input_dim_, in.data());
    }
    return &in;
  }
  const DeviceTensor& prev = flow.out[i - 1];
  if (SameSpace(i - 1, i)) return &prev;
  TOWERPS_RETURN_IF_ERROR(in.Resize(prev.shape()));
  TOWERPS_RETURN_IF_ERROR(
      b.CopyFrom(layers_[i - 1]->backend(), prev.data(), prev.num_elements(), in.data()));
  return &in;
}

absl::Status Model::LayerWeightsNeeded(size_t i) {
  const int first = layer_vars_[i], end = layer_vars_[i + 1];
  if (first == end) return absl::OkStatus();
  if (events_->weights_needed) {
    TOWERPS_RETURN_IF_ERROR(events_->weights_needed(first, end - first));
  }
  // Host-memory layers read weights() in place (their views were set before
  // the step); a GPU layer uploads its own now.
  for (int v = first; v < end; ++v) {
    DeviceTensor* w = device_weights_[v];
    if (w->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
    w->backend()->CopyFromHost(host_weights_[v].data(), host_weights_[v].num_elements(),
                               w->data());
  }
  return absl::OkStatus();
}

absl::Status Model::LayerGradientsReady(size_t i) {
  const int first = layer_vars_[i], end = layer_vars_[i + 1];
  if (first == end) return absl::OkStatus();
  for (int v = first; v < end; ++v) {
    DeviceTensor* g = device_grads_[v];
    if (g->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(
        g->backend()->CopyToHost(g->data(), g->num_elements(), host_grads_[v].data()));
  }
  if (!events_->gradients_ready) return absl::OkStatus();
  return events_->gradients_ready(first, end - first);
}

absl::Status Model::StageForward(const Batch& batch, size_t s, Flow& flow, int k,
                                 int64_t grad_count) {
  const Stage& stage = stages_[s];
  for (size_t i = stage.first; i < stage.end; ++i) {
    if (events_ != nullptr && k == 0) TOWERPS_RETURN_IF_ERROR(LayerWeightsNeeded(i));
    TOWERPS_ASSIGN_OR_RETURN(const DeviceTensor* x, Input(batch, flow, i));
    flow.x[i] = x;
    TOWERPS_RETURN_IF_ERROR(layers_[i]->Forward(*x, &flow.out[i]));
    // Sized by its owner now, so that the next device writes into it in
    // place during the backward pass.
    if (grad_count > 0) TOWERPS_RETURN_IF_ERROR(flow.dout[i].Resize(flow.out[i].shape()));
  }
  Backend& b = layers_[stage.end - 1]->backend();
  if (s + 1 < stages_.size()) return b.Synchronize();

  // The last stage: the loss of this micro-batch.
  const size_t last = layers_.size() - 1;
  const int64_t n = flow.rows;
  const int64_t d = output_dim_;
  const float* labels = nullptr;
  const float* targets = nullptr;
  if (loss_kind_ != LossKind::kSoftmaxCrossEntropy) {
    const float* rows = batch.targets.data() + flow.begin * d;
    if (b.host_memory()) {
      targets = rows;
    } else {
      TOWERPS_RETURN_IF_ERROR(flow.targets.Resize({n, d}));
      b.CopyFromHost(rows, n * d, flow.targets.data());
      targets = flow.targets.data();
    }
  } else {
    flow.host_labels.assign(batch.labels.begin() + flow.begin,
                            batch.labels.begin() + flow.begin + n);
    if (b.host_memory()) {
      labels = flow.host_labels.data();
    } else {
      TOWERPS_RETURN_IF_ERROR(flow.labels.Resize({n}));
      b.CopyFromHost(flow.host_labels.data(), n, flow.labels.data());
      labels = flow.labels.data();
    }
  }
  TOWERPS_ASSIGN_OR_RETURN(
      flow.loss, b.Loss(loss_kind_, n, d, flow.out[last].data(), labels, targets,
                        grad_count > 0 ? flow.dout[last].data() : nullptr,
                        grad_count > 0 ? grad_count : n));
  return absl::OkStatus();
}

absl::Status Model::StageBackward(const Batch& batch, size_t s, Flow& flow, int k,
                                  int m) {
  // Micro-batches after the first add to the gradients; the last one
  // finishes them.
  const bool accumulate = k > 0;
  const bool last = events_ != nullptr && k == m - 1;
  const Stage& stage = stages_[s];
  // The gradient of this stage's output, if it came from another device.
  const size_t top = stage.end - 1;
  if (top + 1 < layers_.size() && !SameSpace(top, top + 1)) {
    const DeviceTensor& g = flow.din[top + 1];
    TOWERPS_RETURN_IF_ERROR(flow.dout[top].Resize(g.shape()));
    TOWERPS_RETURN_IF_ERROR(layers_[top]->backend().CopyFrom(
        layers_[top + 1]->backend(), g.data(), g.num_elements(), flow.dout[top].data()));
  }
  for (size_t i = stage.end; i-- > stage.first;) {
    const DeviceTensor* x = flow.x[i];  // as in the forward pass
    DeviceTensor* dx = nullptr;
    if (i > 0) dx = SameSpace(i - 1, i) ? &flow.dout[i - 1] : &flow.din[i];
    if (static_cast<int>(i) == stage.deferred) {
      // Only backpropagated here; its gradients after the early layer's
      // (its own output gradient, dout, stays as it is until then).
      TOWERPS_RETURN_IF_ERROR(layers_[i]->BackwardInput(*x, flow.out[i], flow.dout[i], dx));
      continue;
    }
    TOWERPS_RETURN_IF_ERROR(
        layers_[i]->Backward(*x, flow.out[i], flow.dout[i], dx, accumulate));
    if (last) TOWERPS_RETURN_IF_ERROR(LayerGradientsReady(i));
    if (static_cast<int>(i) == stage.early) {
      const size_t d = static_cast<size_t>(stage.deferred);
      TOWERPS_RETURN_IF_ERROR(
          layers_[d]->BackwardParams(*flow.x[d], flow.out[d], flow.dout[d], accumulate));
      if (last) TOWERPS_RETURN_IF_ERROR(LayerGradientsReady(d));
    }
  }
  return layers_[stage.first]->backend().Synchronize();
}

absl::StatusOr<LossResult> Model::Run(const Batch& batch, bool train,
                                      const StepEvents* events) {
  if (batch.features.rank() != 2 || batch.features.dim(1) != input_dim_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name_, "': features have shape ",
                     batch.features.ShapeString(), ", want [n,", input_dim_, "]"));
  }
  const int64_t n = batch.features.dim(0);
  TOWERPS_RETURN_IF_ERROR(ValidateLossInputs(loss_, n, output_dim_, batch));
  // An evaluation is cut into micro-batches as training is: the same
  // buffers (PrepareBuffers), none larger.
  const int m = static_cast<int>(std::min<int64_t>(micro_batches_, n));
  EnsureFlows(m);
  int64_t begin = 0;
  for (int k = 0; k < m; ++k) {
    flows_[k].begin = begin;
    flows_[k].rows = MicroBatchRows(n, m, k);
    begin += flows_[k].rows;
  }
  const int64_t grad_count = train ? n : 0;
  const uint64_t seed = VariableSeed(init_seed_ ^ VariableSeed(random_stream_, 0),
                                     static_cast<int64_t>(passes_++));
  for (const auto& layer : layers_) layer->BeginPass(train, n, seed);
  // The scheduler decides when each stage runs which micro-batch (and on
  // which thread); the stages' steps are ours.
  PipelineScheduler pipeline(static_cast<int>(stages_.size()), m);
  const PipelineScheduler::Step forward = [&](int s, int k) {
    return StageForward(batch, s, flows_[k], k, grad_count);
  };
  const PipelineScheduler::Step backward = [&](int s, int k) {
    return StageBackward(batch, s, flows_[k], k, m);
  };
  events_ = events;
  const absl::Status run = pipeline.Run(forward, train ? backward : nullptr);
  events_ = nullptr;
  TOWERPS_RETURN_IF_ERROR(run);
  LossResult total;
  for (int k = 0; k < m; ++k) {
    total.loss_sum += flows_[k].loss.loss_sum;
    total.correct += flows_[k].loss.correct;
  }
  return total;
}

absl::StatusOr<LossResult> Model::ComputeDeviceGradients(const Batch& batch) {
  if (batch.size() == 0) {
    for (DeviceTensor* g : device_grads_) g->backend()->Zero(g->num_elements(), g->data());
    for (const auto& layer : layers_) TOWERPS_RETURN_IF_ERROR(layer->backend().Synchronize());
    return LossResult();
  }
  return Run(batch, /*train=*/true);
}

absl::StatusOr<LossResult> Model::ComputeGradients(const Batch& batch) {
  TOWERPS_RETURN_IF_ERROR(LoadWeights(weights()));
  TOWERPS_ASSIGN_OR_RETURN(LossResult r, ComputeDeviceGradients(batch));
  TOWERPS_RETURN_IF_ERROR(DownloadGradients());
  return r;
}

absl::StatusOr<LossResult> Model::ComputeGradients(const Batch& batch,
                                                   const StepEvents& events) {
  const int all = static_cast<int>(host_weights_.size());
  if (batch.size() == 0) {
    if (events.weights_needed) TOWERPS_RETURN_IF_ERROR(events.weights_needed(0, all));
    TOWERPS_ASSIGN_OR_RETURN(LossResult r, ComputeDeviceGradients(batch));
    TOWERPS_RETURN_IF_ERROR(DownloadGradients());
    if (events.gradients_ready) TOWERPS_RETURN_IF_ERROR(events.gradients_ready(0, all));
    return r;
  }
  // Host-memory layers read weights() in place: point them there now (no
  // values are read until each layer's wait).
  for (int v = 0; v < all; ++v) {
    DeviceTensor* w = device_weights_[v];
    if (w->backend()->host_memory() && w->data() != host_weights_[v].data()) {
      w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    }
  }
  return Run(batch, /*train=*/true, &events);
}

absl::StatusOr<LossResult> Model::Evaluate(const Batch& batch) {
  if (batch.size() == 0) return LossResult();
  TOWERPS_RETURN_IF_ERROR(LoadWeights(weights()));
  return Run(batch, /*train=*/false);
}

absl::Status Model::PrepareBuffers(int64_t max_batch) {
  if (max_batch <= 0) return absl::OkStatus();
  // One flow per micro-batch, each for its rows of the batch (Run's cut).
  const int m = static_cast<int>(std::min<int64_t>(micro_batches_, max_batch));
  EnsureFlows(m);
  for (int k = 0; k < m; ++k) {
    Flow& f = flows_[k];
    const int64_t rows = MicroBatchRows(max_batch, m, k);
    int64_t width = input_dim_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const int64_t out = layers_[i]->OutputDim(width);
      absl::Status st = f.out[i].Resize({rows, out});
      if (st.ok()) st = f.dout[i].Resize({rows, out});
      if (st.ok() && i == 0 && !layers_[i]->backend().host_memory()) {
        st = f.in[i].Resize({rows, width});
      }
      if (st.ok() && i > 0 && !SameSpace(i - 1, i)) {
        st = f.in[i].Resize({rows, width});
        if (st.ok()) st = f.din[i].Resize({rows, width});
      }
      if (!st.ok()) {
        return common::Annotate(st, absl::StrCat("layer \"", layers_[i]->name(), "\""));
      }
      width = out;
    }
  }
  return absl::OkStatus();
}

std::string Model::Summary() const {
  constexpr int kWidth = 65;
  // Column starts as in Keras' print_summary for sequential models.
  auto row = [](const std::string& a, const std::string& b,
                const std::string& c) {
    std::string line = " " + a;
    line.resize(std::max<size_t>(29, line.size() + 1), ' ');
    line += b;
    line.resize(std::max<size_t>(55, line.size() + 1), ' ');
    line += c;
    return line + "\n";
  };
  std::string out = absl::StrCat("Model: \"", name_, "\"\n");
  out += std::string(kWidth, '_') + "\n";
  out += row("Layer (type)", "Output Shape", "Param #");
  out += std::string(kWidth, '=') + "\n";
  for (const SummaryRow& r : summary_rows_) {
    out +=
        row(absl::StrCat(r.name, " (", r.type, ")"),
            r.output_shape, absl::StrCat(r.params));
  }
  out += std::string(kWidth, '=') + "\n";
  out += absl::StrCat("Total params: ", WithThousands(num_parameters_), "\n");
  out += absl::StrCat("Trainable params: ", WithThousands(num_trainable_), "\n");
  out += absl::StrCat("Non-trainable params: ", WithThousands(num_parameters_ - num_trainable_),
                      "\n");
  out += std::string(kWidth, '_') + "\n";
  return out;
}

std::vector<Model::LayerMemory> Model::ParamMemory() const {
  std::vector<LayerMemory> out;
  for (const SummaryRow& r : summary_rows_) {
    out.push_back({r.name, 2 * r.params * static_cast<int64_t>(sizeof(float))});
  }
  return out;
}

}  // namespace towerps::worker
