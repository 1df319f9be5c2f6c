// cuBLAS, loaded at run time with dlopen instead of linked.
//
// Linking libcublas made every CUDA-built worker pay for it at start, GPU or
// not: its libcublasLt.so.13 dependency alone brought ~88 MB of .bss and
// ~62 MB of relocated data into the resident set of an idle worker on a
// machine without a GPU (181 MB in all; /proc/<pid>/smaps). Loading it on
// the first GPU backend instead leaves CPU-only runs of the same binary at
// the size of their work, and turns a missing library into a clear answer
// ("cuBLAS unavailable: ..."). As nccl_lib.h and cudnn_lib.h do for NCCL and
// cuDNN.
//
// CUDA builds only. The header is plain C++ (no Abseil): nvcc compiles a
// file that includes it. Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_CUBLAS_LIB_H_
#define TOWERPS_WORKER_DEVICE_CUBLAS_LIB_H_

#include <cublas_v2.h>

#include <string>

namespace towerps::worker {

// The cuBLAS entry points this project uses, resolved from one library. The
// v2 API's names are macros for the "_v2" symbols (cublasCreate is
// cublasCreate_v2); the library exports those.
struct CublasLib {
  std::string path;  // as passed to dlopen
  int version = 0;   // major * 10000 + minor * 100 + patch, e.g. 130100
  decltype(&cublasGetStatusName) GetStatusName = nullptr;
  decltype(&cublasGetStatusString) GetStatusString = nullptr;
  decltype(&cublasCreate_v2) Create = nullptr;
  decltype(&cublasDestroy_v2) Destroy = nullptr;
  decltype(&cublasSetStream_v2) SetStream = nullptr;
  decltype(&cublasSetMathMode) SetMathMode = nullptr;
  decltype(&cublasSgemm_v2) Sgemm = nullptr;
};

// The soname of the cuBLAS this binary was built against, e.g.
// "libcublas.so.13".
std::string CublasSoname();

// The process's cuBLAS: loaded once, on first call, as CublasSoname() (the
// dynamic loader's search: LD_LIBRARY_PATH, the ld cache), else from the
// toolkit's library folders. nullptr when it cannot be loaded; then `why`
// (if not null) says what failed. The library stays loaded for the life of
// the process. Loading needs no GPU.
const CublasLib* Cublas(std::string* why = nullptr);

// True once Cublas() has loaded the library (does not load it).
bool CublasLoaded();

// Loads the library at `path` now (not cached; for tests). False, with
// `why` set, when it cannot be opened or lacks an entry point.
bool LoadCublasFrom(const std::string& path, CublasLib* lib, std::string* why);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CUBLAS_LIB_H_
