#include "common/gpu_info.h"

#include "absl/strings/str_cat.h"

namespace towerps::common {

std::string DescribeGpus(const GpuInfo& info) {
  if (!info.cuda_built) return "CUDA: not built (CPU-only)";
  std::string out = absl::StrCat("CUDA: ", info.devices.size(), " GPU(s)");
  for (const auto& d : info.devices) {
    absl::StrAppend(&out, " [", d.index, ": ", d.name, ", ", d.memory_bytes >> 20, " MiB]");
  }
  if (info.devices.empty() && !info.note.empty()) absl::StrAppend(&out, " (", info.note, ")");
  absl::StrAppend(&out, "; cuBLAS ", info.cublas_version);
  if (info.nccl_version > 0) {
    absl::StrAppend(&out, "; NCCL ", info.nccl_version);
  } else {
    absl::StrAppend(&out, "; NCCL unavailable (", info.nccl_note, ")");
  }
  return out;
}

}  // namespace towerps::common
