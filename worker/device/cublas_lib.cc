#include "worker/device/cublas_lib.h"

#include <dlfcn.h>

#include "worker/device/dynamic_lib.h"

namespace towerps::worker {

std::string CublasSoname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

bool LoadCublasFrom(const std::string& path, CublasLib* lib, std::string* why) {
  void* handle = OpenLibrary(path, why);
  if (handle == nullptr) return false;
  CublasLib l;
  l.path = path;
  std::string error;
  decltype(&cublasGetProperty) get_property = nullptr;
  const bool ok = Resolve(handle, "cublasGetProperty", &get_property, &error) &&
                  Resolve(handle, "cublasGetStatusName", &l.GetStatusName, &error) &&
                  Resolve(handle, "cublasGetStatusString", &l.GetStatusString, &error) &&
                  Resolve(handle, "cublasCreate_v2", &l.Create, &error) &&
                  Resolve(handle, "cublasDestroy_v2", &l.Destroy, &error) &&
                  Resolve(handle, "cublasSetStream_v2", &l.SetStream, &error) &&
                  Resolve(handle, "cublasSetMathMode", &l.SetMathMode, &error) &&
                  Resolve(handle, "cublasSgemm_v2", &l.Sgemm, &error);
  int major = 0, minor = 0, patch = 0;
  if (ok && (get_property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
             get_property(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
             get_property(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)) {
    error = "cublasGetProperty failed";
  }
  if (!error.empty()) {
    CloseLibrary(handle);
    if (why != nullptr) *why = path + ": " + error;
    return false;
  }
  l.version = major * 10000 + minor * 100 + patch;
  *lib = std::move(l);
  return true;
}

const CublasLib* Cublas(std::string* why) {
  static const std::string* const soname = new std::string(CublasSoname());
  return LoadOnce<CublasLib>(soname->c_str(), &LoadCublasFrom, why);
}

bool CublasLoaded() {
  // RTLD_NOLOAD: only finds a library already in the process (by soname),
  // whoever loaded or linked it; the reference it takes is dropped again.
  void* handle = dlopen(CublasSoname().c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

}  // namespace towerps::worker
