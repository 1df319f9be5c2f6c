// For unit tests only: a Backend that behaves like a GPU's as far as the code
// around it can tell, on a machine without one. Its memory is its own
// "memory space" ("fake:<id>", not host memory), so Models and reducers take
// their device paths (uploads, downloads, copies between devices), and it
// checks that they do: fresh allocations are filled with NaN (data that was
// never copied in poisons the result), and every kernel argument must lie in
// this backend's own allocations (a host pointer or another device's buffer
// passed to a kernel is recorded as a violation). The math is the CPU
// backend's.
#ifndef TOWERPS_WORKER_DEVICE_FAKE_DEVICE_BACKEND_H_
#define TOWERPS_WORKER_DEVICE_FAKE_DEVICE_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/device/backend.h"

namespace towerps::worker {

class FakeDeviceBackend;

// `space`: backends with the same id share a memory space (like two virtual
// devices of one GPU). Violations are appended to `violations` (not owned;
// may be shared by several backends; must outlive them; not thread-safe
// unless each backend has its own).
std::unique_ptr<Backend> NewFakeDeviceBackend(int space,
                                              std::vector<std::string>* violations);

// Floats every fake backend has copied in from the host (CopyFromHost) and
// from another device (CopyFrom), since the process started. Thread-safe.
int64_t FakeHostToDeviceFloats();
int64_t FakeDeviceToDeviceFloats();

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_FAKE_DEVICE_BACKEND_H_
