#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/device/cuda_util.h"
#include "worker/device/nccl_lib.h"
#include "worker/device/nccl_reduce.h"

namespace towerps::worker {
namespace {

// Only constructed once NCCL has loaded (Create checks).
struct NcclCommDeleter {
  void operator()(ncclComm_t comm) const { Nccl()->CommDestroy(comm); }
};
using NcclComm =
    std::unique_ptr<std::remove_pointer_t<ncclComm_t>, NcclCommDeleter>;

// One rank: its GPU, its communicator and the stream its reductions run on.
// Members are destroyed in reverse order: the communicator before the stream.
struct Rank {
  int gpu = 0;
  CudaStream stream;
  NcclComm comm;
};

class CudaNcclGroup final : public NcclGroup {
 public:
  CudaNcclGroup(const NcclLib* nccl, std::vector<Rank> ranks)
      : nccl_(nccl), ranks_(std::move(ranks)) {}

  ~CudaNcclGroup() override {
    // A failed AllReduceSum may have left work queued; finish it before the
    // communicators and streams go.
    for (Rank& rank : ranks_) {
      if (cudaSetDevice(rank.gpu) == cudaSuccess) {
        cudaStreamSynchronize(rank.stream.get());
      }
    }
    for (Rank& rank : ranks_) {
      cudaSetDevice(rank.gpu);
      rank.comm.reset();
      rank.stream.reset();
    }
  }

  using NcclGroup::AllReduceSum;

  absl::Status AllReduceSum(const std::vector<Op>& ops) override {
    bool any = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (static_cast<int64_t>(ops[i].buffers.size()) != size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("NCCL all-reduce op ", i, ": ", ops[i].buffers.size(),
                         " buffers for ", size(), " ranks"));
      }
      if (ops[i].n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("NCCL all-reduce op ", i, ": ", ops[i].n, " floats"));
      }
      any = any || ops[i].n > 0;
    }
    if (!any) return absl::OkStatus();
    // One grouped call over all ranks and ops from this thread: without the
    // group, the first rank's ncclAllReduce would wait for the others
    // forever; with it, NCCL also fuses the ops into one launch per rank.
    TOWERPS_RETURN_IF_GPU_ERROR(nccl_->GroupStart(), "ncclGroupStart");
    absl::Status status;
    for (const Op& op : ops) {
      if (op.n == 0) continue;
      for (size_t r = 0; r < ranks_.size() && status.ok(); ++r) {
        status = GpuStatus(
            nccl_->AllReduce(op.buffers[r], op.buffers[r],
                          static_cast<size_t>(op.n), ncclFloat, ncclSum,
                          ranks_[r].comm.get(), ranks_[r].stream.get()),
            absl::StrCat("ncclAllReduce on GPU ", ranks_[r].gpu));
      }
      if (!status.ok()) break;
    }
    // ncclGroupEnd must follow ncclGroupStart even when a call failed.
    const absl::Status end = GpuStatus(nccl_->GroupEnd(), "ncclGroupEnd");
    TOWERPS_RETURN_IF_ERROR(status);
    TOWERPS_RETURN_IF_ERROR(end);
    for (const Rank& rank : ranks_) {
      const std::string where =
          absl::StrCat("NCCL all-reduce on GPU ", rank.gpu);
      TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(rank.gpu),
                                  where + ": cudaSetDevice");
      TOWERPS_RETURN_IF_GPU_ERROR(cudaStreamSynchronize(rank.stream.get()),
                                  where + ": cudaStreamSynchronize");
    }
    return absl::OkStatus();
  }

  int size() const override { return static_cast<int>(ranks_.size()); }

 private:
  const NcclLib* const nccl_;
  std::vector<Rank> ranks_;  // Constant after construction.
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(
    const std::vector<int>& gpus) {
  std::string why;
  const NcclLib* nccl = Nccl(&why);
  if (nccl == nullptr) {
    return absl::UnavailableError(absl::StrCat("NCCL unavailable: ", why));
  }
  if (gpus.empty()) {
    return absl::InvalidArgumentError("NCCL group: no GPUs");
  }
  std::set<int> seen;
  for (int gpu : gpus) {
    if (gpu < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL group: bad GPU index ", gpu));
    }
    if (!seen.insert(gpu).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL group: GPU ", gpu, " listed twice in [",
                       absl::StrJoin(gpus, ", "),
                       "]: NCCL does not allow two ranks on one GPU"));
    }
  }
  std::vector<Rank> ranks(gpus.size());
  for (size_t r = 0; r < gpus.size(); ++r) {
    ranks[r].gpu = gpus[r];
    const std::string where = absl::StrCat("NCCL group: GPU ", gpus[r]);
    TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpus[r]),
                                where + ": cudaSetDevice");
    cudaStream_t stream = nullptr;
    TOWERPS_RETURN_IF_GPU_ERROR(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        where + ": cudaStreamCreateWithFlags");
    ranks[r].stream.reset(stream);
  }
  std::vector<ncclComm_t> comms(gpus.size(), nullptr);
  TOWERPS_RETURN_IF_GPU_ERROR(
      nccl->CommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data()),
      absl::StrCat("NCCL group: ncclCommInitAll over GPUs [",
                   absl::StrJoin(gpus, ", "), "]"));
  for (size_t r = 0; r < gpus.size(); ++r) ranks[r].comm.reset(comms[r]);
  return std::unique_ptr<NcclGroup>(new CudaNcclGroup(nccl, std::move(ranks)));
}

bool NcclGroup::Available(std::string* why) {
  return Nccl(why) != nullptr;
}

}  // namespace towerps::worker
