// Sums of gradient buffers across the GPUs of this process with NCCL
// all-reduce: the reduction between towers that sit on different physical
// GPUs.
//
// Two implementations, chosen in worker/BUILD: nccl_reduce_cuda.cc (NCCL,
// loaded at run time by common/nccl_lib, so a machine without it still runs
// everything else) and nccl_reduce_none.cc (CPU-only builds: Create fails
// with Unavailable). NCCL allows one rank per GPU, so towers that share a GPU
// (virtual devices) reduce among themselves first, by other means.
#ifndef TOWERPS_WORKER_DEVICE_NCCL_REDUCE_H_
#define TOWERPS_WORKER_DEVICE_NCCL_REDUCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace towerps::worker {

// One NCCL communicator per physical GPU in this process (ncclCommInitAll),
// plus one stream per rank owned by the group, so towers on different GPUs
// reduce with all-reduce.
//
// Not thread-safe: one thread calls AllReduceSum at a time (NCCL requires a
// single thread to issue a grouped call over all ranks).
class NcclGroup {
 public:
  // A group over `gpus` (physical GPU indices; rank r is gpus[r]). Returns
  // InvalidArgument for an empty list, a negative index or a duplicate ("NCCL
  // does not allow two ranks on one GPU"), NCCL's or CUDA's error when the
  // communicators cannot be created, and Unavailable in CPU-only builds or
  // where libnccl.so.2 cannot be loaded.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(
      const std::vector<int>& gpus);

  // Whether NCCL can be used: this binary was built with CUDA and NCCL
  // loads. If not, `why` (if not null) says why.
  static bool Available(std::string* why = nullptr);

  // Waits for pending reductions, then destroys communicators and streams.
  virtual ~NcclGroup() = default;

  // One all-reduce: buffers[r] is rank r's buffer (device memory on
  // gpus[r]) of n floats.
  struct Op {
    std::vector<float*> buffers;
    int64_t n = 0;
  };

  // In place: for every op, buffers[r] becomes the elementwise sum over all
  // ranks. All ops go out in one NCCL group (NCCL aggregates them: one
  // launch per rank instead of one per op). REQUIRES: the caller has
  // finished writing the buffers (synchronized the streams that wrote them)
  // and does not touch them until this returns. Blocks until the sums are
  // complete. Returns InvalidArgument when an op's buffers.size() != size()
  // or n < 0, before anything runs; else the first NCCL or CUDA error. Ops
  // with n == 0 are skipped.
  virtual absl::Status AllReduceSum(const std::vector<Op>& ops) = 0;

  // A single op.
  absl::Status AllReduceSum(const std::vector<float*>& buffers, int64_t n) {
    return AllReduceSum(std::vector<Op>{Op{buffers, n}});
  }

  // Number of ranks (GPUs).
  virtual int size() const = 0;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_NCCL_REDUCE_H_
