// NCCL, loaded at run time with dlopen instead of linked.
//
// NCCL is not part of the CUDA toolkit and is needed only for all-reduce
// between physical GPUs; linking it would stop every CUDA binary (worker, ps,
// the GPU tests) from starting on a machine without libnccl.so.2. Loading it
// on first use leaves the rest working and turns its absence into a clear
// answer ("NCCL unavailable: ...") that callers can fall back from.
//
// CUDA builds only. The header is plain C++ (no Abseil): nvcc compiles a
// file that includes it. Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_NCCL_LIB_H_
#define TOWERPS_WORKER_DEVICE_NCCL_LIB_H_

#include <nccl.h>

#include <string>

namespace towerps::worker {

// The NCCL entry points this project uses, resolved from one library.
struct NcclLib {
  std::string path;  // as passed to dlopen
  int version = 0;   // ncclGetVersion's answer, e.g. 22809
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclCommInitAll) CommInitAll = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
};

// The process's NCCL: loaded once, on first call, as "libnccl.so.2" (the
// dynamic loader's search: LD_LIBRARY_PATH, the ld cache), else from the
// toolkit's library folders. nullptr when it cannot be loaded; then `why`
// (if not null) says what failed, e.g. "libnccl.so.2: cannot open shared
// object file". The library stays loaded for the life of the process.
const NcclLib* Nccl(std::string* why = nullptr);

// Loads the library at `path` now (not cached; for tests). False, with
// `why` set, when it cannot be opened or lacks an entry point.
bool LoadNcclFrom(const std::string& path, NcclLib* lib, std::string* why);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_NCCL_LIB_H_
