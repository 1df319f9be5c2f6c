#include "common/job_spec.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace towerps::worker {
namespace {

constexpr char kWhitespace[] = " \t\r\n\f\v";

// Whether `s` is well-formed UTF-8 (shortest forms only, no surrogates, at
// most U+10FFFF), which proto3 requires of every string field.
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

// Whether every field is unset or holds its default (-0.0 counts as 0).
bool SetsNoField(const v1::JobSpec& job) {
  return google::protobuf::util::MessageDifferencer::Equivalent(job, v1::JobSpec());
}

// InvalidArgument naming the first string field (e.g. "data.dir") of `m`
// that is not UTF-8. The text format parser takes any bytes (an escape such
// as "\377" makes one); such a spec could not be sent to the chief, whose
// proto3 parser refuses it, nor printed back as JSON.
absl::Status CheckUtf8(const google::protobuf::Message& m, const std::string& prefix) {
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    const std::string name = absl::StrCat(prefix, f->name());
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string item = f->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
        std::string scratch;
        const std::string& v = f->is_repeated() ? r->GetRepeatedStringReference(m, f, i, &scratch)
                                                : r->GetStringReference(m, f, &scratch);
        if (!IsUtf8(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat("job spec: ", item, " is not valid UTF-8"));
        }
      } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        const auto& sub = f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f);
        absl::Status st = CheckUtf8(sub, item + ".");
        if (!st.ok()) return st;
      }
    }
  }
  return absl::OkStatus();
}

void SetImage(v1::ModelSpec* m, int channels, int height, int width) {
  m->set_input_dim(channels * height * width);
  m->mutable_input_shape()->set_channels(channels);
  m->mutable_input_shape()->set_height(height);
  m->mutable_input_shape()->set_width(width);
}

void AddConv(v1::ModelSpec* m, int filters, int kernel, int stride,
             v1::LayerSpec::Padding padding, bool relu) {
  v1::LayerSpec* l = m->add_layers();
  l->set_type(v1::LayerSpec::CONV2D);
  l->set_filters(filters);
  l->set_kernel_size(kernel);
  l->set_strides(stride);
  l->set_padding(padding);
  if (relu) l->set_activation(v1::RELU);
}

void AddBatchNorm(v1::ModelSpec* m, float momentum, float epsilon, bool relu) {
  v1::LayerSpec* l = m->add_layers();
  l->set_type(v1::LayerSpec::BATCH_NORM);
  l->set_momentum(momentum);
  l->set_epsilon(epsilon);
  if (relu) l->set_activation(v1::RELU);
}

void AddResidual(v1::ModelSpec* m, int filters, int stride, float momentum, float epsilon) {
  v1::LayerSpec* l = m->add_layers();
  l->set_type(v1::LayerSpec::RESIDUAL_BLOCK);
  l->set_filters(filters);
  l->set_strides(stride);
  l->set_momentum(momentum);
  l->set_epsilon(epsilon);
}

void AddDense(v1::ModelSpec* m, int units, bool relu) {
  v1::LayerSpec* l = m->add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(units);
  if (relu) l->set_activation(v1::RELU);
}

}  // namespace

absl::StatusOr<v1::JobSpec> BuiltinJob(const std::string& name) {
  v1::JobSpec job;
  job.set_job_id(name);
  v1::ModelSpec* m = job.mutable_model();
  m->set_name(name);
  if (name == "mlp") {
    m->set_input_dim(784);
    for (int units : {256, 256, 10}) {
      v1::LayerSpec* l = m->add_layers();
      l->set_type(v1::LayerSpec::DENSE);
      l->set_units(units);
      if (units != 10) l->set_activation(v1::RELU);
    }
    m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
    job.mutable_optimizer()->set_learning_rate(1e-3f);
    job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
    job.set_global_batch_size(256);
    job.set_epochs(2);
    return job;
  }
  if (name == "dense_stack") {
    m->set_input_dim(100);
    for (int i = 0; i < 12; ++i) {
      v1::LayerSpec* l = m->add_layers();
      l->set_type(v1::LayerSpec::DENSE);
      l->set_units(i == 11 ? 100 : 1000);
    }
    m->set_loss(v1::MAE);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
    job.mutable_optimizer()->set_learning_rate(0.01f);
    job.mutable_data()->set_source(v1::DataSpec::ONES);
    job.mutable_data()->set_ones_examples(100);
    job.set_global_batch_size(10);
    job.set_epochs(10);
    return job;
  }
  if (name == "cnn_small") {
    // Keras: Conv2D(32, 3, relu) -> MaxPooling2D(2) -> Flatten -> Dense(64,
    // relu) -> Dense(10) on 1x28x28 Fashion-MNIST images.
    m->set_input_dim(28 * 28);
    m->mutable_input_shape()->set_channels(1);
    m->mutable_input_shape()->set_height(28);
    m->mutable_input_shape()->set_width(28);
    v1::LayerSpec* l = m->add_layers();
    l->set_type(v1::LayerSpec::CONV2D);
    l->set_filters(32);
    l->set_kernel_size(3);
    l->set_activation(v1::RELU);
    l = m->add_layers();
    l->set_type(v1::LayerSpec::MAX_POOL2D);
    l->set_pool_size(2);
    m->add_layers()->set_type(v1::LayerSpec::FLATTEN);
    l = m->add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(64);
    l->set_activation(v1::RELU);
    l = m->add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(10);
    m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
    job.mutable_optimizer()->set_learning_rate(1e-3f);
    job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
    job.set_global_batch_size(64);
    job.set_epochs(1);
    return job;
  }
  if (name == "lenet") {
    // LeNet-5 as d2l builds it, with ReLU for its sigmoids: Conv2D(6, 5x5,
    // SAME) -> AvgPool(2) -> Conv2D(16, 5x5) -> AvgPool(2) -> Flatten ->
    // Dense(120) -> Dense(84) -> Dense(10).
    SetImage(m, 1, 28, 28);
    AddConv(m, 6, 5, 1, v1::LayerSpec::PADDING_SAME, true);
    m->add_layers()->set_type(v1::LayerSpec::AVG_POOL2D);
    AddConv(m, 16, 5, 1, v1::LayerSpec::PADDING_VALID, true);
    m->add_layers()->set_type(v1::LayerSpec::AVG_POOL2D);
    m->add_layers()->set_type(v1::LayerSpec::FLATTEN);
    AddDense(m, 120, true);
    AddDense(m, 84, true);
    AddDense(m, 10, false);
    m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
    job.mutable_optimizer()->set_learning_rate(1e-3f);
    job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
    job.set_global_batch_size(256);
    job.set_epochs(10);
    return job;
  }
  if (name == "resnet18") {
    // d2l's ResNet-18 for small 1-channel images: a 3x3 stem (stride 1,
    // batch norm, ReLU, no max-pool), four stages of two residual blocks
    // (64, 128, 256, 512 channels; stages 2-4 start at stride 2 with a 1x1
    // projection), global average pooling, Dense(10). Batch norm as
    // PyTorch's: moving statistics' momentum 0.9, epsilon 1e-5.
    SetImage(m, 1, 28, 28);
    AddConv(m, 64, 3, 1, v1::LayerSpec::PADDING_SAME, false);
    AddBatchNorm(m, 0.9f, 1e-5f, true);
    for (int stage = 0; stage < 4; ++stage) {
      const int filters = 64 << stage;
      AddResidual(m, filters, stage == 0 ? 1 : 2, 0.9f, 1e-5f);
      AddResidual(m, filters, 1, 0.9f, 1e-5f);
    }
    m->add_layers()->set_type(v1::LayerSpec::GLOBAL_AVG_POOL2D);
    AddDense(m, 10, false);
    m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
    job.mutable_optimizer()->set_learning_rate(0.1f);
    job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
    job.set_global_batch_size(256);
    job.set_epochs(10);
    return job;
  }
  if (name == "resnet_cifar") {
    // ResNet-20 for 3x32x32 CIFAR-10 (He et al. 2015, section 4.2, with 1x1
    // projections): a 3x3 stem of 16 channels, three stages of three
    // residual blocks (16, 32, 64 channels; stages 2-3 start at stride 2),
    // global average pooling, Dense(10); SGD with momentum 0.9, lr 0.1,
    // weight decay 1e-4, batch 128.
    SetImage(m, 3, 32, 32);
    AddConv(m, 16, 3, 1, v1::LayerSpec::PADDING_SAME, false);
    AddBatchNorm(m, 0.9f, 1e-5f, true);
    for (int stage = 0; stage < 3; ++stage) {
      for (int b = 0; b < 3; ++b) {
        AddResidual(m, 16 << stage, stage > 0 && b == 0 ? 2 : 1, 0.9f, 1e-5f);
      }
    }
    m->add_layers()->set_type(v1::LayerSpec::GLOBAL_AVG_POOL2D);
    AddDense(m, 10, false);
    m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
    job.mutable_optimizer()->set_type(v1::OptimizerSpec::MOMENTUM);
    job.mutable_optimizer()->set_learning_rate(0.1f);
    job.mutable_optimizer()->set_momentum(0.9f);
    job.mutable_optimizer()->set_weight_decay(1e-4f);
    job.mutable_data()->set_source(v1::DataSpec::CIFAR10);
    job.set_global_batch_size(128);
    job.set_epochs(10);
    return job;
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model \"", name,
      "\" (known: mlp, dense_stack, cnn_small, lenet, resnet18, resnet_cifar)"));
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text) {
  v1::JobSpec job;
  const size_t first = text.find_first_not_of(kWhitespace);
  if (first == std::string::npos) return absl::InvalidArgumentError("job spec is empty");
  if (first != std::string::npos && text[first] == '{') {
    auto st = google::protobuf::util::JsonStringToMessage(text, &job);
    if (!st.ok()) {
      std::string why = st.message().as_string();
      return absl::InvalidArgumentError(
          absl::StrCat("job spec (JSON): ", why.substr(0, why.find('\n'))));
    }
    absl::Status utf8 = CheckUtf8(job, "");
    if (!utf8.ok()) return utf8;
    if (SetsNoField(job)) return absl::InvalidArgumentError("job spec sets no field");
    return job;
  }
  struct Collector : google::protobuf::io::ErrorCollector {
    std::string first;
    void AddError(int line, int col, const std::string& msg) override {
      if (first.empty()) first = absl::StrCat("line ", line + 1, ":", col + 1, ": ", msg);
    }
  } errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &job)) {
    return absl::InvalidArgumentError(absl::StrCat("job spec (text format): ", errors.first));
  }
  absl::Status utf8 = CheckUtf8(job, "");
  if (!utf8.ok()) return utf8;
  if (SetsNoField(job)) {
    // Only comments, or "{}": refused here for the same reason as empty
    // text (and it would print back as empty text).
    return absl::InvalidArgumentError("job spec sets no field");
  }
  return job;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("job spec file \"", path, "\" not found"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find_first_not_of(kWhitespace) == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("job spec file \"", path, "\" is empty"));
  }
  auto job = ParseJobSpec(ss.str());
  if (!job.ok()) {
    return absl::Status(job.status().code(),
                        absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

v1::JobSpec JobWithDefaults(const v1::JobSpec& in) {
  v1::JobSpec j = in;
  if (j.job_id().empty()) j.set_job_id("default");
  if (j.mode() == v1::MODE_UNSPECIFIED) j.set_mode(v1::SYNC);
  if (j.global_batch_size() == 0) j.set_global_batch_size(256);
  if (j.epochs() == 0) j.set_epochs(1);
  if (j.towers() == 0) j.set_towers(1);
  if (j.placement() == v1::PLACEMENT_UNSPECIFIED) j.set_placement(v1::PARTITIONED);
  v1::ModelSpec* m = j.mutable_model();
  if (m->loss() == v1::LOSS_UNSPECIFIED) m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  if (m->init_seed() == 0) m->set_init_seed(1);
  if (m->name().empty()) m->set_name(j.job_id());
  v1::DataSpec* d = j.mutable_data();
  if (d->source() == v1::DataSpec::SOURCE_UNSPECIFIED) d->set_source(v1::DataSpec::FASHION_MNIST);
  // CIFAR-10 has no default: it is not installed here (ValidateJob says so).
  if (d->dir().empty() && d->source() == v1::DataSpec::FASHION_MNIST) {
    d->set_dir("/usr/share/datasets/fashion-mnist");
  }
  if (d->ones_examples() == 0) d->set_ones_examples(100);
  if (d->shuffle_seed() == 0) d->set_shuffle_seed(1);
  if (j.log_every_steps() == 0) j.set_log_every_steps(50);
  if (j.max_restarts() == 0) j.set_max_restarts(3);
  if (j.peer_timeout_s() == 0) j.set_peer_timeout_s(kDefaultPeerTimeoutS);
  if (j.checkpoint().keep() == 0) j.mutable_checkpoint()->set_keep(3);
  if (j.compression().type() != v1::GradientCompression::NONE) {
    *j.mutable_compression() = CompressionWithDefaults(j.compression());
  }
  return j;
}

v1::GradientCompression CompressionWithDefaults(const v1::GradientCompression& in) {
  v1::GradientCompression c = in;
  if (c.type() == v1::GradientCompression::NONE) return c;
  if (!c.has_error_feedback()) c.set_error_feedback(true);
  if (c.type() == v1::GradientCompression::TOPK && c.ratio() == 0) c.set_ratio(kDefaultTopKRatio);
  return c;
}

absl::Status ValidateCompression(const v1::GradientCompression& c) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("job spec: compression." + what);
  };
  if (!v1::GradientCompression::Type_IsValid(c.type())) {
    return bad(absl::StrCat("type = ", static_cast<int>(c.type()),
                            " (want NONE, FP16, BF16 or TOPK)"));
  }
  const std::string type = v1::GradientCompression::Type_Name(c.type());
  if (c.type() == v1::GradientCompression::TOPK) {
    if (!(c.ratio() >= 0 && c.ratio() <= 1)) {
      return bad(absl::StrCat("ratio = ", c.ratio(),
                              " (want a fraction in (0, 1], or 0 for the default of ",
                              kDefaultTopKRatio, ")"));
    }
  } else if (c.ratio() != 0) {
    return bad(absl::StrCat("ratio = ", c.ratio(), " is for TOPK only (type is ", type, ")"));
  }
  if (c.type() == v1::GradientCompression::NONE && c.has_error_feedback()) {
    return bad("error_feedback is set but type is NONE (nothing is compressed)");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GradientCompression> ParseCompressionFlag(const std::string& value) {
  v1::GradientCompression c;
  auto bad = [&value](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compression must be none, fp16, bf16, topk or topk:RATIO with RATIO in (0, 1], got \"",
        value, "\"", why));
  };
  if (value == "none") return c;
  if (value == "fp16") {
    c.set_type(v1::GradientCompression::FP16);
  } else if (value == "bf16") {
    c.set_type(v1::GradientCompression::BF16);
  } else if (value == "topk" || absl::StartsWith(value, "topk:")) {
    c.set_type(v1::GradientCompression::TOPK);
    if (value != "topk") {
      double ratio = 0;
      if (!absl::SimpleAtod(value.substr(5), &ratio)) return bad(" (RATIO is not a number)");
      if (!(ratio > 0 && ratio <= 1)) return bad("");
      c.set_ratio(ratio);
    }
  } else {
    return bad("");
  }
  return c;
}

v1::JobSpec JobForSubmitFile(const v1::JobSpec& job, bool keep_job_id) {
  v1::JobSpec out = JobWithDefaults(job);
  if (out.model().name() == out.job_id()) out.mutable_model()->clear_name();
  if (!keep_job_id) out.clear_job_id();
  return out;
}

absl::Status ValidateJob(const v1::JobSpec& j, int num_workers) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("job spec: " + what); };
  if (j.global_batch_size() <= 0) {
    return bad(absl::StrCat("global_batch_size = ", j.global_batch_size(), " (want > 0)"));
  }
  if (j.global_batch_size() > kMaxGlobalBatchSize) {
    return bad(absl::StrCat("global_batch_size = ", j.global_batch_size(), " (limit ",
                            kMaxGlobalBatchSize, ")"));
  }
  if (j.epochs() <= 0) return bad(absl::StrCat("epochs = ", j.epochs(), " (want > 0)"));
  if (j.epochs() > kMaxEpochs) {
    return bad(absl::StrCat("epochs = ", j.epochs(), " (limit ", kMaxEpochs, ")"));
  }
  if (j.max_steps() < 0) return bad("max_steps is negative");
  if (j.towers() < 1) return bad(absl::StrCat("towers = ", j.towers(), " (want >= 1)"));
  if (j.towers() > kMaxTowers) {
    return bad(absl::StrCat("towers = ", j.towers(), " (limit ", kMaxTowers, ")"));
  }
  if (j.micro_batches() > kMaxMicroBatches) {
    return bad(absl::StrCat("micro_batches = ", j.micro_batches(), " (limit ",
                            kMaxMicroBatches, ")"));
  }
  if (j.tower_devices_size() > 0 && j.towers() > 1 && j.towers() != j.tower_devices_size()) {
    return bad(absl::StrCat("towers = ", j.towers(), " but tower_devices names ",
                            j.tower_devices_size(), " devices"));
  }
  if (j.micro_batches() < 0) {
    return bad(absl::StrCat("micro_batches = ", j.micro_batches(), " (want >= 1, or 0 for 1)"));
  }
  if (!v1::Mode_IsValid(j.mode())) return bad("mode is unknown");
  if (j.replicas_to_aggregate() < 0 || j.replicas_to_aggregate() > num_workers) {
    return bad(absl::StrCat("replicas_to_aggregate = ", j.replicas_to_aggregate(),
                            " (want 0..", num_workers, " workers)"));
  }
  if (j.max_staleness() < 0) return bad("max_staleness is negative");
  if (!(j.peer_timeout_s() >= 0) || j.peer_timeout_s() > 86400) {
    return bad(absl::StrCat("peer_timeout_s = ", j.peer_timeout_s(),
                            " (want 0 for the default of 60, or up to 86400 s)"));
  }
  const v1::DataSpec& d = j.data();
  if (d.max_train_examples() < 0 || d.max_test_examples() < 0) {
    return bad("data.max_train_examples/max_test_examples is negative");
  }
  if (d.source() == v1::DataSpec::ONES && d.ones_examples() <= 0) {
    return bad("data.ones_examples must be > 0");
  }
  if (!v1::DataSpec::Source_IsValid(d.source())) return bad("data.source is unknown");
  if (d.source() == v1::DataSpec::CIFAR10 && d.dir().empty()) {
    return bad("data.dir is required for CIFAR10 (the folder holding data_batch_1.bin .. "
               "data_batch_5.bin and test_batch.bin)");
  }
  if (j.log_every_steps() < 0) return bad("log_every_steps is negative");
  const v1::CheckpointSpec& c = j.checkpoint();
  if (c.every_steps() < 0) {
    return bad(absl::StrCat("checkpoint.every_steps = ", c.every_steps(), " (want >= 0)"));
  }
  if (c.every_seconds() < 0) {
    return bad(absl::StrCat("checkpoint.every_seconds = ", c.every_seconds(), " (want >= 0)"));
  }
  if (c.keep() < 0) return bad(absl::StrCat("checkpoint.keep = ", c.keep(), " (want >= 1)"));
  return ValidateCompression(j.compression());
}

}  // namespace towerps::worker
