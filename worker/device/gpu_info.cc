#include "worker/device/gpu_info.h"

#include "absl/strings/str_cat.h"

namespace towerps::worker {

std::string DescribeGpus(const GpuInfo& info) {
  if (!info.cuda_built) return "CUDA: not built (CPU-only)";
  if (info.devices.empty()) {
    // The runtime's own words ("CUDA driver version is insufficient for CUDA
    // runtime version") mislead where there is no GPU at all.
    if (!info.driver_loaded) return "CUDA: no GPU found, running on CPU";
    return absl::StrCat("CUDA: no usable GPU (", info.note.empty() ? "no devices" : info.note,
                        "), running on CPU");
  }
  std::string out = absl::StrCat("CUDA: ", info.devices.size(), " GPU(s)");
  for (const auto& d : info.devices) {
    absl::StrAppend(&out, " [", d.index, ": ", d.name, ", ", d.memory_bytes >> 20, " MiB]");
  }
  if (info.cublas_version > 0) {
    absl::StrAppend(&out, "; cuBLAS ", info.cublas_version);
  } else {
    absl::StrAppend(&out, "; cuBLAS unavailable (", info.cublas_note, ")");
  }
  if (info.nccl_version > 0) {
    absl::StrAppend(&out, "; NCCL ", info.nccl_version);
  } else {
    absl::StrAppend(&out, "; NCCL unavailable (", info.nccl_note, ")");
  }
  return out;
}

}  // namespace towerps::worker
