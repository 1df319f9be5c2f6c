#include "worker/device/dynamic_lib.h"

#include <dlfcn.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace towerps::worker {

void* OpenLibrary(const std::string& path, std::string* why) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr && why != nullptr) {
    const char* err = dlerror();
    *why = err != nullptr ? err : path + ": cannot be loaded";
  }
  return handle;
}

void CloseLibrary(void* handle) { dlclose(handle); }

bool ResolveSymbol(void* handle, const char* name, void** out, std::string* why) {
  *out = dlsym(handle, name);
  if (*out != nullptr) return true;
  if (why != nullptr) {
    const char* err = dlerror();
    *why = std::string(name) + ": " + (err != nullptr ? err : "not found");
  }
  return false;
}

bool LoadFirstCandidate(const std::string& soname,
                        const std::function<bool(const std::string& path, std::string* why)>& load,
                        std::string* why) {
  std::vector<std::string> paths = {soname};
  // Colon-separated, from the toolkit found at build time (worker/device/BUILD).
  for (absl::string_view dir : absl::StrSplit(TOWERPS_CUDA_LIBDIRS, ':', absl::SkipEmpty())) {
    paths.push_back(absl::StrCat(dir, "/", soname));
  }
  std::string first;
  for (const std::string& p : paths) {
    std::string err;
    if (load(p, &err)) return true;
    if (first.empty()) first = err;
  }
  if (why != nullptr) *why = first;
  return false;
}

}  // namespace towerps::worker
