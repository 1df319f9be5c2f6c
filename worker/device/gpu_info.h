// What the CUDA side of this build can see: GPUs and library versions.
//
// Two implementations, chosen in common/BUILD: gpu_info_cuda.cu (compiled by
// nvcc where the toolkit is installed; links cudart and cuBLAS, loads NCCL) and
// gpu_info_none.cc (CPU-only builds). No GPU is a normal answer, not an error.
// Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_GPU_INFO_H_
#define TOWERPS_WORKER_DEVICE_GPU_INFO_H_

#include <string>
#include <vector>

namespace towerps::worker {

struct GpuDevice {
  int index = 0;
  std::string name;
  long long memory_bytes = 0;
};

struct GpuInfo {
  bool cuda_built = false;       // This binary was built with the toolkit.
  std::vector<GpuDevice> devices;  // Empty where there is no GPU or driver.
  std::string note;              // Why there are none, e.g. the driver's answer.
  // The NVIDIA kernel driver is loaded (/proc/driver/nvidia exists): with no
  // devices, that is a broken setup worth the runtime's words; without it
  // there is simply no GPU.
  bool driver_loaded = false;
  // The libraries are loaded (dlopen) only where there are devices: 0
  // without CUDA, without a GPU, or when not loadable (then the note says
  // why).
  int cublas_version = 0;
  std::string cublas_note;
  int nccl_version = 0;
  std::string nccl_note;
};

GpuInfo QueryGpus();

// One line: "CUDA: 2 GPU(s) [NVIDIA H100 ...]; cuBLAS 130000; NCCL 22703"
// ("NCCL unavailable (<why>)" without it), "CUDA: not built (CPU-only)",
// "CUDA: no GPU found, running on CPU" where no NVIDIA driver is loaded, or
// "CUDA: no usable GPU (<the runtime's error>), running on CPU" where one is.
std::string DescribeGpus(const GpuInfo& info);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_GPU_INFO_H_
