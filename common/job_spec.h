// JobSpec presets, defaults and validation on the worker side.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_COMMON_JOB_SPEC_H_
#define TOWERPS_COMMON_JOB_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace towerps::worker {

// "mlp": 784-256(relu)-256(relu)-10, softmax cross-entropy, Adam 1e-3, global
// batch 256, 2 epochs of Fashion-MNIST.
// "dense_stack": Dense 100->1000, ten 1000x1000, 1000->100 (10,211,100
// parameters), MAE, SGD 0.01, 100 "ones" examples, batch 10, 10 epochs.
// "cnn_small": input_shape 1x28x28, Conv2D(32, 3x3, relu) -> MaxPool(2) ->
// Flatten -> Dense(64, relu) -> Dense(10) (347,146 parameters), softmax
// cross-entropy, Adam 1e-3, global batch 64, 1 epoch of Fashion-MNIST.
// "lenet": LeNet-5 (d2l's, ReLU for sigmoid) on Fashion-MNIST, Adam 1e-3,
// batch 256, 10 epochs.
// "resnet18": d2l's ResNet-18 for 1x28x28 images (3x3 stem with batch norm,
// no max-pool, four stages of two residual blocks of 64-512 channels, global
// average pooling, Dense(10)) on Fashion-MNIST, SGD 0.1, batch 256, 10
// epochs.
// "resnet_cifar": ResNet-20 (three stages of three residual blocks of
// 16-64 channels) on CIFAR-10, momentum SGD 0.1, weight decay 1e-4, batch
// 128, 10 epochs.
// NotFound lists the known names.
absl::StatusOr<v1::JobSpec> BuiltinJob(const std::string& name);

// Parses a JobSpec from JSON (if the text starts with '{') or text format.
// InvalidArgument names the problem (a string field that is not UTF-8, as
// proto3 requires, by its path: "job spec: data.dir is not valid UTF-8");
// a spec that sets no field (only comments, or "{}") is refused as "job spec
// sets no field"; empty or whitespace-only text is
// refused as "job spec is empty" (text format would read it as a spec with
// no field set, refused much later for a missing model width).
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text);
// ParseJobSpec on a file's contents. NotFound if it cannot be opened;
// InvalidArgument naming the file otherwise (an empty file: `job spec file
// "PATH" is empty`).
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

// JobSpec.peer_timeout_s when the spec leaves it 0.
constexpr double kDefaultPeerTimeoutS = 60;

// Fills every zero field with its documented default.
v1::JobSpec JobWithDefaults(const v1::JobSpec& job);

// The job as a file for `towerctl submit` (what `worker --print_job_spec`
// prints): JobWithDefaults(job), without its job id unless `keep_job_id`
// (the chief assigns one), and without a model name that only repeated the
// id (the chief names the model after the id it assigns).
v1::JobSpec JobForSubmitFile(const v1::JobSpec& job, bool keep_job_id);

// JobSpec.compression with its defaults: for a type other than NONE,
// error_feedback true when unset, and for TOPK a ratio of 0 becomes
// kDefaultTopKRatio. NONE is returned as given.
constexpr double kDefaultTopKRatio = 0.01;
v1::GradientCompression CompressionWithDefaults(const v1::GradientCompression& c);

// Checks JobSpec.compression (as given or with defaults): a known type; for
// TOPK a ratio of 0 (the default) or in (0, 1]; no ratio for the other types
// and no error_feedback for NONE. InvalidArgument "job spec: compression.FIELD
// = VALUE (...)".
absl::Status ValidateCompression(const v1::GradientCompression& c);

// The worker's --compression flag: "none", "fp16", "bf16", "topk" (the
// default ratio) or "topk:RATIO" with RATIO in (0, 1]. InvalidArgument
// naming the flag and the value otherwise.
absl::StatusOr<v1::GradientCompression> ParseCompressionFlag(const std::string& value);

// Bounds on a job's sizes (issue 15, limits), checked by ValidateJob: a
// refusal names the field and the limit.
constexpr int kMaxGlobalBatchSize = 1 << 20;
constexpr int kMaxEpochs = 100000;
constexpr int kMaxTowers = 256;
constexpr int kMaxMicroBatches = 4096;

// Checks the fields the worker owns (batch size, epochs, mode, data source,
// compression), each within the bounds above.
// The model is checked by Model::Create, the optimizer by the servers.
// `num_workers` bounds replicas_to_aggregate; kAnyWorkerCount when the
// cluster is not known (printing a job).
absl::Status ValidateJob(const v1::JobSpec& job, int num_workers);
constexpr int kAnyWorkerCount = 1 << 30;

}  // namespace towerps::worker

#endif  // TOWERPS_COMMON_JOB_SPEC_H_
