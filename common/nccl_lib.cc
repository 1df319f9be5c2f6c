#include "common/nccl_lib.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace towerps::common {
namespace {

template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* why) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) {
    const char* err = dlerror();
    *why = std::string(name) + ": " + (err != nullptr ? err : "not found");
    return false;
  }
  return true;
}

}  // namespace

bool LoadNcclFrom(const std::string& path, NcclLib* lib, std::string* why) {
  std::string error;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    if (why != nullptr) *why = err != nullptr ? err : path + ": cannot be loaded";
    return false;
  }
  NcclLib l;
  l.path = path;
  decltype(&ncclGetVersion) get_version = nullptr;
  const bool ok = Resolve(handle, "ncclGetVersion", &get_version, &error) &&
                  Resolve(handle, "ncclGetErrorString", &l.GetErrorString, &error) &&
                  Resolve(handle, "ncclCommInitAll", &l.CommInitAll, &error) &&
                  Resolve(handle, "ncclCommDestroy", &l.CommDestroy, &error) &&
                  Resolve(handle, "ncclGroupStart", &l.GroupStart, &error) &&
                  Resolve(handle, "ncclGroupEnd", &l.GroupEnd, &error) &&
                  Resolve(handle, "ncclAllReduce", &l.AllReduce, &error);
  if (ok && get_version(&l.version) != ncclSuccess) {
    error = "ncclGetVersion failed";
  }
  if (!error.empty()) {
    dlclose(handle);
    if (why != nullptr) *why = path + ": " + error;
    return false;
  }
  *lib = std::move(l);
  return true;
}

const NcclLib* Nccl(std::string* why) {
  static std::once_flag once;
  static NcclLib* lib = nullptr;
  static std::string* error = new std::string();
  std::call_once(once, [] {
    std::vector<std::string> paths = {"libnccl.so.2"};
#ifdef TOWERPS_CUDA_LIBDIRS
    // Colon-separated, from the toolkit found at build time.
    const std::string dirs = TOWERPS_CUDA_LIBDIRS;
    for (size_t b = 0; b <= dirs.size();) {
      size_t e = dirs.find(':', b);
      if (e == std::string::npos) e = dirs.size();
      if (e > b) paths.push_back(dirs.substr(b, e - b) + "/libnccl.so.2");
      b = e + 1;
    }
#endif
    auto* l = new NcclLib();
    for (const std::string& p : paths) {
      std::string err;
      if (LoadNcclFrom(p, l, &err)) {
        lib = l;
        return;
      }
      if (error->empty()) *error = err;  // the first try's reason is the telling one
    }
    delete l;
  });
  if (lib == nullptr && why != nullptr) *why = *error;
  return lib;
}

}  // namespace towerps::common
