// State a layer keeps from a Forward call for the Backward call of the same
// micro-batch. The Layer contract gives Backward the very input tensor of its
// Forward, and with micro-batches several Forwards run before their
// Backwards, each on its own input buffer: so the state is found by the
// input's address. States are reused from pass to pass (Reset() at the start
// of one frees them all for the next), so buffers are allocated once and the
// number kept is the largest number of micro-batches in one pass.
//
// Not thread-safe, as the layer that owns it.
#ifndef TOWERPS_WORKER_MODEL_PER_INPUT_STATE_H_
#define TOWERPS_WORKER_MODEL_PER_INPUT_STATE_H_

#include <functional>
#include <memory>
#include <vector>

#include "worker/device/device_tensor.h"

namespace towerps::worker {

template <typename T>
class PerInputState {
 public:
  // Forgets which input each state belongs to; keeps them for reuse.
  void Reset() {
    for (Entry& e : entries_) e.key = nullptr;
  }

  // The state for a Forward on `x`: the one already bound to x in this pass,
  // else a free one, else a new one made by `make`.
  T& Bind(const DeviceTensor& x, const std::function<T()>& make) {
    if (T* found = Find(x)) return *found;
    for (Entry& e : entries_) {
      if (e.key == nullptr) {
        e.key = x.data();
        return *e.state;
      }
    }
    entries_.push_back({x.data(), std::make_unique<T>(make())});
    return *entries_.back().state;
  }

  // The state the Forward on `x` bound in this pass; nullptr if none.
  T* Find(const DeviceTensor& x) {
    for (Entry& e : entries_) {
      if (e.key != nullptr && e.key == x.data()) return e.state.get();
    }
    return nullptr;
  }

 private:
  struct Entry {
    const float* key = nullptr;
    std::unique_ptr<T> state;
  };
  std::vector<Entry> entries_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_PER_INPUT_STATE_H_
