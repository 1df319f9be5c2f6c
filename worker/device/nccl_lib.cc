#include "worker/device/nccl_lib.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace towerps::worker {
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
    // Colon-separated, from the toolkit found at build time (common/BUILD).
    for (absl::string_view dir : absl::StrSplit(TOWERPS_CUDA_LIBDIRS, ':', absl::SkipEmpty())) {
      paths.push_back(absl::StrCat(dir, "/libnccl.so.2"));
    }
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

}  // namespace towerps::worker
