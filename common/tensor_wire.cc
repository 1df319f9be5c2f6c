#include "common/tensor_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

constexpr int kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5;
// TensorSlice's fields (proto/tensor.proto).
constexpr int kVarIndex = 1, kOffset = 2, kData = 3;
constexpr uint64_t kMaxSmallField = 1 << 20;

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

int VarintSize(uint64_t v) {
  int n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint32_t Tag(int field, int wire_type) { return (static_cast<uint32_t>(field) << 3) | wire_type; }

void ReleaseKeepAlive(void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }

// Reads across the slices of a received buffer. Every read checks what is left.
class Cursor {
 public:
  explicit Cursor(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) {
    for (const auto& s : slices_) left_ += s.size();
    Skip0();
  }

  uint64_t consumed() const { return consumed_; }
  uint64_t left() const { return left_; }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed tensor message: ", what, " at byte ", consumed_));
  }

  absl::Status Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (left_ == 0) return Error("truncated varint");
      const uint8_t b = Byte();
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return absl::OkStatus();
    }
    return Error("varint longer than 10 bytes");
  }

  // Copies `n` bytes to `dst` (null: skips them). REQUIRES: n <= left().
  void Copy(char* dst, uint64_t n) {
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - pos_);
      if (dst != nullptr) {
        std::memcpy(dst, s.begin() + pos_, take);
        dst += take;
      }
      Advance(take);
      n -= take;
    }
  }

 private:
  uint8_t Byte() {
    const uint8_t b = slices_[index_].begin()[pos_];
    Advance(1);
    return b;
  }
  void Advance(uint64_t n) {
    pos_ += n;
    left_ -= n;
    consumed_ += n;
    Skip0();
  }
  // Moves past exhausted (and empty) slices.
  void Skip0() {
    while (index_ < slices_.size() && pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  std::vector<grpc::Slice> slices_;
  size_t index_ = 0;
  uint64_t pos_ = 0;
  uint64_t left_ = 0;
  uint64_t consumed_ = 0;
};

// Skips one field of `wire_type` whose tag was read.
absl::Status SkipField(Cursor& c, int wire_type, uint64_t limit) {
  uint64_t n = 0;
  switch (wire_type) {
    case kVarint:
      return c.Varint(&n);
    case kFixed64:
      n = 8;
      break;
    case kFixed32:
      n = 4;
      break;
    case kLen: {
      absl::Status s = c.Varint(&n);
      if (!s.ok()) return s;
      break;
    }
    default:
      return c.Error(absl::StrCat("unsupported wire type ", wire_type));
  }
  if (n > limit - std::min(limit, c.consumed()) || n > c.left()) return c.Error("truncated field");
  c.Copy(nullptr, n);
  return absl::OkStatus();
}

// One TensorSlice of `len` bytes.
absl::Status ReadSlice(Cursor& c, uint64_t len, const TensorWireHandler& h) {
  const uint64_t end = c.consumed() + len;
  uint64_t var = 0, offset = 0;
  bool seen_data = false;
  while (c.consumed() < end) {
    uint64_t tag = 0;
    absl::Status s = c.Varint(&tag);
    if (!s.ok()) return s;
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if ((field == kVarIndex || field == kOffset) && type == kVarint) {
      if (seen_data) return c.Error("TensorSlice var_index/offset after its data");
      uint64_t v = 0;
      if (!(s = c.Varint(&v)).ok()) return s;
      if (field == kVarIndex) {
        if (v > UINT32_MAX) return c.Error("TensorSlice var_index above 2^32");
        var = v;
      } else {
        offset = v;
      }
    } else if (field == kData && type == kLen) {
      if (seen_data) return c.Error("TensorSlice with two data fields");
      uint64_t n = 0;
      if (!(s = c.Varint(&n)).ok()) return s;
      if (c.consumed() > end || n > end - c.consumed())
        return c.Error("data runs past its TensorSlice");
      absl::StatusOr<char*> dst = h.on_slice(static_cast<uint32_t>(var), offset, n);
      if (!dst.ok()) return dst.status();
      c.Copy(*dst, n);
      seen_data = true;
      if (h.on_slice_end && !(s = h.on_slice_end()).ok()) return s;
    } else {
      if (!(s = SkipField(c, type, end)).ok()) return s;
    }
  }
  if (c.consumed() != end) return c.Error("field runs past its TensorSlice");
  if (!seen_data) {  // A slice without data: no elements.
    absl::StatusOr<char*> dst = h.on_slice(static_cast<uint32_t>(var), offset, 0);
    if (!dst.ok()) return dst.status();
    if (h.on_slice_end) return h.on_slice_end();
  }
  return absl::OkStatus();
}

}  // namespace

void AppendVarintField(int field, uint64_t value, std::string* out) {
  AppendVarint(Tag(field, kVarint), out);
  AppendVarint(value, out);
}

void AppendBytesField(int field, absl::string_view bytes, std::string* out) {
  AppendVarint(Tag(field, kLen), out);
  AppendVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

TensorWireWriter::TensorWireWriter(int slices_field, int64_t chunk_bytes,
                                   std::function<bool(const grpc::ByteBuffer&)> flush)
    : slices_tag_(Tag(slices_field, kLen)),
      chunk_(std::max<int64_t>(4, chunk_bytes / 4 * 4)),
      flush_(std::move(flush)) {}

void TensorWireWriter::AppendSlice(uint32_t var, uint64_t element, const char* data,
                                   int64_t len, const std::shared_ptr<const void>& keep_alive) {
  std::string head;
  if (pending_.empty() && !prefix_.empty()) head = prefix_;
  const uint64_t inner = 1 + VarintSize(var) + 1 + VarintSize(element) + 1 +
                         VarintSize(static_cast<uint64_t>(len)) + static_cast<uint64_t>(len);
  AppendVarint(slices_tag_, &head);
  AppendVarint(inner, &head);
  AppendVarintField(kVarIndex, var, &head);
  AppendVarintField(kOffset, element, &head);
  AppendVarint(Tag(kData, kLen), &head);
  AppendVarint(static_cast<uint64_t>(len), &head);
  pending_.emplace_back(head);
  if (len > 0) {
    char* p = const_cast<char*>(data);
    if (keep_alive != nullptr) {
      pending_.emplace_back(p, static_cast<size_t>(len), &ReleaseKeepAlive,
                            new std::shared_ptr<const void>(keep_alive));
    } else {
      pending_.emplace_back(p, static_cast<size_t>(len), grpc::Slice::STATIC_SLICE);
    }
  }
  has_slices_ = true;
  in_msg_ += len;
}

bool TensorWireWriter::Add(uint32_t var, const float* data, int64_t n, uint64_t first,
                           const std::shared_ptr<const void>& keep_alive) {
  const int64_t total = n * 4;
  for (int64_t off = 0; ok_ && off < total;) {
    const int64_t len = std::min(total - off, chunk_ - in_msg_);
    AppendSlice(var, first + static_cast<uint64_t>(off / 4),
                reinterpret_cast<const char*>(data) + off, len, keep_alive);
    off += len;
    if (in_msg_ >= chunk_) Flush();
  }
  return ok_;
}

bool TensorWireWriter::AddEncoded(uint32_t var, uint64_t first, const char* data, int64_t bytes,
                                  const std::shared_ptr<const void>& keep_alive) {
  if (!ok_) return false;
  if (in_msg_ > 0 && in_msg_ + bytes > chunk_) Flush();
  if (!ok_) return false;
  AppendSlice(var, first, data, bytes, keep_alive);
  if (in_msg_ >= chunk_) Flush();
  return ok_;
}

bool TensorWireWriter::Finish(bool even_if_empty) {
  if (ok_ && (has_slices_ || even_if_empty)) {
    if (pending_.empty() && !prefix_.empty()) pending_.emplace_back(prefix_);
    Flush();
  }
  pending_.clear();
  return ok_;
}

void TensorWireWriter::Flush() {
  const grpc::ByteBuffer buffer(pending_.data(), pending_.size());
  ok_ = flush_(buffer);
  pending_.clear();
  in_msg_ = 0;
  has_slices_ = false;
}

absl::Status ReadTensorMessage(const grpc::ByteBuffer& buffer, int slices_field,
                               const TensorWireHandler& h) {
  std::vector<grpc::Slice> slices;
  if (buffer.Valid()) {
    const grpc::Status dumped = buffer.Dump(&slices);
    if (!dumped.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor message cannot be read: ", dumped.error_message()));
    }
  }
  Cursor c(std::move(slices));
  const uint64_t all = c.left();
  while (c.left() > 0) {
    uint64_t tag = 0;
    absl::Status s = c.Varint(&tag);
    if (!s.ok()) return s;
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if (field == 0) return c.Error("field number 0");
    if (field == slices_field && type == kLen) {
      uint64_t len = 0;
      if (!(s = c.Varint(&len)).ok()) return s;
      if (len > c.left()) return c.Error("truncated TensorSlice");
      if (!(s = ReadSlice(c, len, h)).ok()) return s;
    } else if (type == kVarint && h.on_varint) {
      uint64_t v = 0;
      if (!(s = c.Varint(&v)).ok()) return s;
      if (!(s = h.on_varint(field, v)).ok()) return s;
    } else if (type == kLen && h.on_bytes) {
      uint64_t len = 0;
      if (!(s = c.Varint(&len)).ok()) return s;
      if (len > c.left()) return c.Error("truncated field");
      if (len > kMaxSmallField) return c.Error(absl::StrCat("field ", field, " over 1 MiB"));
      std::string bytes(len, '\0');
      c.Copy(bytes.data(), len);
      if (!(s = h.on_bytes(field, std::move(bytes))).ok()) return s;
    } else {
      if (!(s = SkipField(c, type, all)).ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace towerps::common
