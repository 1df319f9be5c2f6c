// Loading a GPU library at run time (NCCL, cuDNN) instead of linking it, so
// that binaries start on machines without it: open, resolve symbols, and
// find it by its soname or in the CUDA toolkit's library folders.
//
// CUDA builds only. Plain C++ (no Abseil in the header). Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_DYNAMIC_LIB_H_
#define TOWERPS_WORKER_DEVICE_DYNAMIC_LIB_H_

#include <functional>
#include <mutex>
#include <string>

namespace towerps::worker {

// dlopen(path, RTLD_NOW | RTLD_LOCAL); nullptr with `why` (if not null) set
// to the loader's message.
void* OpenLibrary(const std::string& path, std::string* why);

// dlclose(handle), for a library found wanting after it was opened.
void CloseLibrary(void* handle);

// dlsym(handle, name) as a function pointer of type F. False with `why` =
// "<name>: <loader's message>" when the symbol is missing.
bool ResolveSymbol(void* handle, const char* name, void** out, std::string* why);
template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* why) {
  void* p = nullptr;
  if (!ResolveSymbol(handle, name, &p, why)) return false;
  *out = reinterpret_cast<F>(p);
  return true;
}

// Calls `load(path, &why)` on `soname` (the dynamic loader's own search:
// LD_LIBRARY_PATH, the ld cache), then on "<dir>/<soname>" for each of the
// toolkit's library folders found at build time, until one returns true.
// False when none did; then `why` (if not null) holds the first attempt's
// reason (the telling one: the soname's).
bool LoadFirstCandidate(const std::string& soname,
                        const std::function<bool(const std::string& path, std::string* why)>& load,
                        std::string* why);

// The process's one copy of a library's entry points `Lib`, loaded on the
// first call (thread-safe, once per Lib type) by LoadFirstCandidate(soname,
// `load`), and kept for the life of the process. nullptr when it cannot be
// loaded; then `why` (if not null) says why, on every call.
template <typename Lib>
const Lib* LoadOnce(const char* soname, bool (*load)(const std::string&, Lib*, std::string*),
                    std::string* why) {
  static std::once_flag once;
  static Lib* lib = nullptr;
  static std::string* error = new std::string();
  std::call_once(once, [&] {
    auto* l = new Lib();
    if (LoadFirstCandidate(
            soname, [&](const std::string& path, std::string* err) { return load(path, l, err); },
            error)) {
      lib = l;
    } else {
      delete l;
    }
  });
  if (lib == nullptr && why != nullptr) *why = *error;
  return lib;
}

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_DYNAMIC_LIB_H_
