// Packs tensors into messages of TensorSlices, at most `chunk_bytes` of
// payload per message, each slice one contiguous memcpy. Shared by the ps's
// Pull stream and the worker's Push stream.
//
// Thread-compatible. `Message` is any proto with `repeated TensorSlice slices`.
#ifndef TOWERPS_COMMON_SLICE_WRITER_H_
#define TOWERPS_COMMON_SLICE_WRITER_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "proto/tensor.pb.h"

namespace towerps::common {

template <typename Message>
class SliceWriter {
 public:
  // `flush` sends `*msg` and returns false if the stream broke. `msg` is
  // reused after each flush (its slices keep their string capacity), so the
  // caller may preset other fields once. REQUIRES: chunk_bytes >= 4.
  SliceWriter(Message* msg, int64_t chunk_bytes, std::function<bool(const Message&)> flush)
      : msg_(msg), chunk_(chunk_bytes / 4 * 4), flush_(std::move(flush)) {}

  // Adds `n` floats of variable `var` (starting at element 0). Returns false
  // once a flush has failed.
  bool Add(uint32_t var, const float* data, int64_t n) {
    const int64_t total = n * 4;
    for (int64_t off = 0; ok_ && off < total;) {
      const int64_t len = std::min(total - off, chunk_ - in_msg_);
      v1::TensorSlice* s = msg_->add_slices();
      s->set_var_index(var);
      s->set_offset(static_cast<uint64_t>(off / 4));
      s->mutable_data()->assign(reinterpret_cast<const char*>(data) + off, len);
      off += len;
      in_msg_ += len;
      if (in_msg_ >= chunk_) Flush();
    }
    return ok_;
  }

  // Sends what is left; with `even_if_empty`, sends an empty message too (so a
  // stream always carries at least one). Returns false if any flush failed.
  bool Finish(bool even_if_empty = false) {
    if (ok_ && (msg_->slices_size() > 0 || even_if_empty)) Flush();
    msg_->mutable_slices()->Clear();
    return ok_;
  }

 private:
  void Flush() {
    ok_ = flush_(*msg_);
    msg_->mutable_slices()->Clear();
    in_msg_ = 0;
  }

  Message* const msg_;
  const int64_t chunk_;
  const std::function<bool(const Message&)> flush_;
  int64_t in_msg_ = 0;
  bool ok_ = true;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SLICE_WRITER_H_
