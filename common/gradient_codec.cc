#include "common/gradient_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Little-endian loads and stores (every payload is little-endian, like the
// float32 ones that are copied as they are; the targets are little-endian).
uint32_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t Load16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

bool HalfIsFinite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }
bool Bfloat16IsFinite(uint16_t b) { return (b & 0x7f80) != 0x7f80; }

absl::Status NotFinite(float f, int64_t i, int64_t n) {
  return absl::InvalidArgumentError(absl::StrCat("element ", i, " of ", n, " is ",
                                                 std::isnan(f) ? "NaN" : "Inf",
                                                 ": it cannot be compressed"));
}

absl::Status CheckFinite(absl::Span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return NotFinite(values[i], static_cast<int64_t>(i), static_cast<int64_t>(values.size()));
    }
  }
  return absl::OkStatus();
}

const char* Name(v1::SliceEncoding e) {
  switch (e) {
    case v1::SLICE_FLOAT32: return "float32";
    case v1::SLICE_FLOAT16: return "float16";
    case v1::SLICE_BFLOAT16: return "bfloat16";
    case v1::SLICE_TOPK: return "top-k";
    default: return "unknown";
  }
}

int ValueBytes(v1::SliceEncoding e) { return e == v1::SLICE_FLOAT32 ? 4 : 2; }

// Dense encodings: `per_value(f, out)` writes one value.
template <typename PerValue>
absl::Status EncodeDense(v1::SliceEncoding encoding, absl::Span<const float> values,
                         int64_t max_slice_bytes, std::string* out,
                         std::vector<EncodedSlice>* slices, PerValue per_value) {
  const int width = ValueBytes(encoding);
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t per_slice = max_slice_bytes / width;
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(n * width));
  char* p = out->data() + start;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) return NotFinite(values[i], i, n);
    per_value(values[i], p + i * width);
  }
  for (int64_t first = 0; first < n; first += per_slice) {
    const int64_t m = std::min(per_slice, n - first);
    slices->push_back({first, m, static_cast<int64_t>(start) + first * width, m * width});
  }
  return absl::OkStatus();
}

absl::Status EncodeTopK(absl::Span<const float> values, double ratio, int64_t max_slice_bytes,
                        std::string* out, std::vector<EncodedSlice>* slices,
                        std::vector<uint32_t>* scratch) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return absl::OkStatus();
  if (n > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k compression of ", n, " elements: at most 2^32 - 1 per variable part"));
  }
  if (absl::Status s = CheckFinite(values); !s.ok()) return s;
  const int64_t k = TopKCount(n, ratio);
  std::vector<uint32_t> local;
  std::vector<uint32_t>& idx = scratch != nullptr ? *scratch : local;
  idx.resize(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0u);
  if (k < n) {
    // A strict total order: larger magnitude first, then lower index, so the
    // set kept does not depend on the algorithm's pivots.
    const float* v = values.data();
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), [v](uint32_t a, uint32_t b) {
      const float fa = std::fabs(v[a]), fb = std::fabs(v[b]);
      return fa > fb || (fa == fb && a < b);
    });
    std::sort(idx.begin(), idx.begin() + k);
  }
  const int64_t per_slice = (max_slice_bytes - 4) / 8;
  for (int64_t e = 0; e < k; e += per_slice) {
    const int64_t m = std::min(per_slice, k - e);
    // The first slice starts at element 0, each later one at its first
    // index; each runs to where the next starts (the last one to n).
    const int64_t first = e == 0 ? 0 : idx[e];
    const int64_t end = e + m < k ? idx[e + m] : n;
    const size_t begin = out->size();
    out->resize(begin + 4 + 8 * static_cast<size_t>(m));
    char* p = out->data() + begin;
    const uint32_t length = static_cast<uint32_t>(end - first);
    std::memcpy(p, &length, 4);
    char* indices = p + 4;
    char* vals = p + 4 + 4 * m;
    for (int64_t j = 0; j < m; ++j) {
      const uint32_t i = idx[e + j];
      const uint32_t rel = static_cast<uint32_t>(i - first);
      std::memcpy(indices + 4 * j, &rel, 4);
      std::memcpy(vals + 4 * j, &values[i], 4);
    }
    slices->push_back({first, end - first, static_cast<int64_t>(begin), 4 + 8 * m});
  }
  return absl::OkStatus();
}

absl::Status Malformed(v1::SliceEncoding e, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(Name(e), " slice: ", what));
}

enum class Op { kAssign, kSubtract };

template <Op op>
void Put(float* dst, float v) {
  if constexpr (op == Op::kAssign) {
    *dst = v;
  } else {
    *dst -= v;
  }
}

template <Op op>
absl::StatusOr<int64_t> Decode(v1::SliceEncoding encoding, absl::string_view payload,
                               absl::Span<float> dst) {
  const int64_t size = static_cast<int64_t>(payload.size());
  const int64_t room = static_cast<int64_t>(dst.size());
  const char* p = payload.data();
  switch (encoding) {
    case v1::SLICE_FLOAT32:
    case v1::SLICE_FLOAT16:
    case v1::SLICE_BFLOAT16: {
      const int width = ValueBytes(encoding);
      if (size % width != 0) {
        return Malformed(encoding, absl::StrCat(size, " bytes are not a whole number of ", width,
                                                "-byte values"));
      }
      const int64_t n = size / width;
      if (n > room) {
        return Malformed(encoding, absl::StrCat(n, " values run past the end (", room,
                                                " elements left)"));
      }
      for (int64_t i = 0; i < n; ++i) {
        float v;
        bool finite;
        if (encoding == v1::SLICE_FLOAT32) {
          std::memcpy(&v, p + 4 * i, 4);
          finite = std::isfinite(v);
        } else if (encoding == v1::SLICE_FLOAT16) {
          const uint16_t h = Load16(p + 2 * i);
          finite = HalfIsFinite(h);
          v = HalfToFloat(h);
        } else {
          const uint16_t b = Load16(p + 2 * i);
          finite = Bfloat16IsFinite(b);
          v = Bfloat16ToFloat(b);
        }
        if (!finite) return Malformed(encoding, absl::StrCat("value ", i, " is Inf or NaN"));
        Put<op>(&dst[i], v);
      }
      return n;
    }
    case v1::SLICE_TOPK: {
      if (size < 4) {
        return Malformed(encoding,
                         absl::StrCat(size, " bytes are shorter than its 4-byte length"));
      }
      if ((size - 4) % 8 != 0) {
        return Malformed(encoding, absl::StrCat(size, " bytes do not hold a length and whole "
                                                      "(index, value) pairs of 8 bytes"));
      }
      const int64_t length = Load32(p);
      const int64_t m = (size - 4) / 8;
      if (length == 0) return Malformed(encoding, "its length is 0 (it covers no element)");
      if (length > room) {
        return Malformed(encoding, absl::StrCat("its length ", length, " runs past the end (",
                                                room, " elements left)"));
      }
      const char* indices = p + 4;
      const char* vals = p + 4 + 4 * m;
      int64_t prev = -1;
      for (int64_t j = 0; j < m; ++j) {
        const int64_t i = Load32(indices + 4 * j);
        if (i >= length) {
          return Malformed(encoding, absl::StrCat("index ", i, " (entry ", j,
                                                  ") is out of range (length ", length, ")"));
        }
        if (i <= prev) {
          return Malformed(encoding, absl::StrCat("indices are not strictly increasing: entry ",
                                                  j, " is ", i, " after ", prev));
        }
        prev = i;
        float v;
        std::memcpy(&v, vals + 4 * j, 4);
        if (!std::isfinite(v)) {
          return Malformed(encoding, absl::StrCat("the value of entry ", j, " (index ", i,
                                                  ") is Inf or NaN"));
        }
      }
      if constexpr (op == Op::kAssign) std::fill(dst.begin(), dst.begin() + length, 0.0f);
      for (int64_t j = 0; j < m; ++j) {
        float v;
        std::memcpy(&v, vals + 4 * j, 4);
        Put<op>(&dst[Load32(indices + 4 * j)], v);
      }
      return length;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown slice encoding ", static_cast<int>(encoding)));
  }
}

}  // namespace

int64_t TopKCount(int64_t n, double ratio) {
  if (n <= 0) return 0;
  const double want = std::ceil(ratio * static_cast<double>(n) - 1e-6);
  return std::clamp<int64_t>(static_cast<int64_t>(want), 1, n);
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  constexpr uint16_t kMaxHalf = 0x7bff;  // 65504
  if (ax >= 0x47800000u) return sign | kMaxHalf;  // |f| >= 65536: clamped
  if (ax < 0x38800000u) {
    // Below 2^-14, the smallest normal half: a subnormal m x 2^-24 (or 0).
    // |f| = mant x 2^(e - 150) with the implicit bit in mant, so
    // m = mant x 2^(e - 126), rounded to nearest even.
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;  // |f| < 2^-25: rounds to 0
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 .. 24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1))) ++m;  // 0x400 is the smallest normal: right too
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 bits dropped;
  // a carry runs into the exponent as it should.
  uint32_t h = (ax >> 13) - (112u << 10);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  if (h >= 0x7c00u) h = kMaxHalf;  // rounded up to Inf: clamped
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f;
  const uint32_t m = h & 0x3ff;
  if (e == 0x1f) return FromBits(sign | 0x7f800000u | (m << 13));  // Inf, NaN
  if (e == 0) {
    // Zero or subnormal: m x 2^-24, exact in float.
    const float v = static_cast<float>(m) * 0x1p-24f;
    return FromBits(sign | Bits(v));
  }
  return FromBits(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t FloatToBfloat16(float f) {
  const uint32_t x = Bits(f);
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1);
  uint16_t b = static_cast<uint16_t>(rounded >> 16);
  if (!Bfloat16IsFinite(b)) b = static_cast<uint16_t>((x >> 16) & 0x8000) | 0x7f7f;  // clamped
  return b;
}

float Bfloat16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

absl::Status EncodeGradient(v1::SliceEncoding encoding, absl::Span<const float> values,
                            double topk_ratio, int64_t max_slice_bytes, std::string* out,
                            std::vector<EncodedSlice>* slices, std::vector<uint32_t>* scratch) {
  if (max_slice_bytes < kMinEncodedSliceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("encoded slices of at most ", max_slice_bytes,
                                                   " bytes (want >= ", kMinEncodedSliceBytes,
                                                   ")"));
  }
  switch (encoding) {
    case v1::SLICE_FLOAT32:
      return EncodeDense(encoding, values, max_slice_bytes, out, slices,
                         [](float f, char* p) { std::memcpy(p, &f, 4); });
    case v1::SLICE_FLOAT16:
      return EncodeDense(encoding, values, max_slice_bytes, out, slices, [](float f, char* p) {
        const uint16_t h = FloatToHalf(f);
        std::memcpy(p, &h, 2);
      });
    case v1::SLICE_BFLOAT16:
      return EncodeDense(encoding, values, max_slice_bytes, out, slices, [](float f, char* p) {
        const uint16_t b = FloatToBfloat16(f);
        std::memcpy(p, &b, 2);
      });
    case v1::SLICE_TOPK:
      if (!(topk_ratio > 0 && topk_ratio <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("top-k ratio ", topk_ratio, " (want a fraction in (0, 1])"));
      }
      return EncodeTopK(values, topk_ratio, max_slice_bytes, out, slices, scratch);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown slice encoding ", static_cast<int>(encoding)));
  }
}

int64_t EncodedGradientBytes(v1::SliceEncoding encoding, int64_t n, double topk_ratio,
                             int64_t max_slice_bytes) {
  if (n <= 0) return 0;
  if (encoding != v1::SLICE_TOPK) return n * ValueBytes(encoding);
  const int64_t k = TopKCount(n, topk_ratio);
  const int64_t per_slice = (max_slice_bytes - 4) / 8;
  const int64_t num_slices = (k + per_slice - 1) / per_slice;
  return 8 * k + 4 * num_slices;
}

absl::StatusOr<int64_t> DecodeSlice(v1::SliceEncoding encoding, absl::string_view payload,
                                    absl::Span<float> dst) {
  return Decode<Op::kAssign>(encoding, payload, dst);
}

absl::StatusOr<int64_t> SubtractDecodedSlice(v1::SliceEncoding encoding,
                                             absl::string_view payload, absl::Span<float> dst) {
  return Decode<Op::kSubtract>(encoding, payload, dst);
}

}  // namespace towerps::common
