#include "worker/device/nccl_lib.h"

#include "worker/device/dynamic_lib.h"

namespace towerps::worker {

bool LoadNcclFrom(const std::string& path, NcclLib* lib, std::string* why) {
  std::string error;
  void* handle = OpenLibrary(path, why);
  if (handle == nullptr) return false;
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
    CloseLibrary(handle);
    if (why != nullptr) *why = path + ": " + error;
    return false;
  }
  *lib = std::move(l);
  return true;
}

const NcclLib* Nccl(std::string* why) {
  return LoadOnce<NcclLib>("libnccl.so.2", &LoadNcclFrom, why);
}

}  // namespace towerps::worker
