// The gRPC streams behind ParameterClient::StartPull and StartPush
// (ps_client.h): each server's call runs on that server's SerialExecutor in
// PsPeers, with the retry and liveness rules of ps_client.h.
//
// Internal to worker/train.
#ifndef TOWERPS_WORKER_TRAIN_PS_STREAMS_H_
#define TOWERPS_WORKER_TRAIN_PS_STREAMS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor.h"
#include "worker/train/gradient_compressor.h"
#include "worker/train/ps_client.h"
#include "worker/train/ps_peers.h"

namespace towerps::worker::internal {

// REQUIRES: weights match peers.vars() in number and element counts.
// `peers` and the buffers must outlive the stream. `after_push` > 0: each
// server answers once it has taken this client's push of that sequence too.
std::unique_ptr<PullStream> StartGrpcPull(PsPeers& peers, int64_t min_step, int64_t iteration,
                                          uint64_t after_push,
                                          std::vector<common::Tensor*> weights);

// REQUIRES: grads match peers.vars(). `sequence` is the push's (new for each
// push, repeated by its retries). `compressor` (may be null: float32) encodes
// each batch of gradients as it is sent. `peers`, the compressor and the
// buffers must outlive the stream; one push at a time uses the compressor.
std::unique_ptr<PushStream> StartGrpcPush(PsPeers& peers, GradientCompressor* compressor,
                                          uint64_t sequence, int64_t step, int64_t num_examples,
                                          std::vector<const common::Tensor*> grads);

}  // namespace towerps::worker::internal

#endif  // TOWERPS_WORKER_TRAIN_PS_STREAMS_H_
