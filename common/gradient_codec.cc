#include "common/gradient_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

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

// --- Bulk conversions (issue 16: a dense-stack push is 10M elements, and
// one call per element with branches cost ~170 ms a step). Each loop is
// branch-free so that the compiler vectorizes it; float16 uses the CPU's
// F16C conversions where it has them (round to nearest even, like
// FloatToHalf; gradient_codec_test checks both against FloatToHalf and
// HalfToFloat bit for bit). ---

// Whether every value is finite (exponent not all ones).
bool AllFinite(const float* v, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, v + i, 4);
    bad |= static_cast<uint32_t>((x & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// Whether every 16-bit value's exponent (`mask`) is not all ones.
bool AllFinite16(const char* p, int64_t n, uint16_t mask) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    bad |= static_cast<uint32_t>((h & mask) == mask);
  }
  return bad == 0;
}

bool HaveF16c() {
#if defined(__x86_64__) && defined(__GNUC__)
  // CPUID leaf 1: ECX bit 27 OSXSAVE, 28 AVX, 29 F16C; and the OS saves the
  // YMM registers (XCR0 bits 1 and 2). (clang 14 has no
  // __builtin_cpu_supports("f16c").)
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    constexpr unsigned kNeed = (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & kNeed) != kNeed) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
  }();
  return have;
#else
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) void HalvesFromFloatsF16c(const float* in, int64_t n,
                                                                char* out) {
  // Clamping to +-65504 first is FloatToHalf's clamp: everything beyond it
  // would round to 65504 or to Inf.
  const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(in + i), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

__attribute__((target("avx,f16c"))) void FloatsFromHalvesF16c(const char* in, int64_t n,
                                                                float* out) {
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
}
#endif

// out[i] = float16 of in[i] (finite inputs), 2 bytes each.
void HalvesFromFloats(const float* in, int64_t n, char* out) {
  int64_t done = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (HaveF16c()) {
    HalvesFromFloatsF16c(in, n, out);
    done = n / 8 * 8;
  }
#endif
  for (int64_t i = done; i < n; ++i) {
    const uint16_t h = FloatToHalf(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void FloatsFromHalves(const char* in, int64_t n, float* out) {
  int64_t done = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (HaveF16c()) {
    FloatsFromHalvesF16c(in, n, out);
    done = n / 8 * 8;
  }
#endif
  for (int64_t i = done; i < n; ++i) out[i] = HalfToFloat(Load16(in + 2 * i));
}

// bfloat16: the top 16 bits, rounded to nearest even; a value that would
// round to Inf is clamped to the largest finite one (as FloatToBfloat16).
void Bfloat16sFromFloats(const float* in, int64_t n, char* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, in + i, 4);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    // All ones where it rounded to Inf: then the largest finite value.
    const uint32_t inf = 0u - static_cast<uint32_t>((rounded & 0x7f80u) == 0x7f80u);
    const uint32_t clamped = ((x >> 16) & 0x8000u) | 0x7f7fu;
    const uint16_t b = static_cast<uint16_t>((rounded & ~inf) | (clamped & inf));
    std::memcpy(out + 2 * i, &b, 2);
  }
}

void FloatsFromBfloat16s(const char* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(Load16(in + 2 * i)) << 16;
    std::memcpy(out + i, &x, 4);
  }
}

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

// Dense encodings: `per_value(values, n, out)` writes them all.
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
  if (!AllFinite(values.data(), n)) {
    out->resize(start);
    return CheckFinite(values);  // names the first bad element
  }
  per_value(values.data(), n, p);
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
      // Checked whole first (nothing is written for a bad slice), then
      // converted in blocks (for kSubtract, through a small buffer).
      bool finite;
      if (encoding == v1::SLICE_FLOAT32) {
        finite = true;
        for (int64_t i = 0; i < n; ++i) {
          uint32_t x = Load32(p + 4 * i);
          finite &= (x & 0x7f800000u) != 0x7f800000u;
        }
      } else {
        finite = AllFinite16(p, n, encoding == v1::SLICE_FLOAT16 ? 0x7c00 : 0x7f80);
      }
      if (!finite) {
        for (int64_t i = 0; i < n; ++i) {
          const bool ok = encoding == v1::SLICE_FLOAT32 ? std::isfinite(FromBits(Load32(p + 4 * i)))
                          : encoding == v1::SLICE_FLOAT16 ? HalfIsFinite(Load16(p + 2 * i))
                                                          : Bfloat16IsFinite(Load16(p + 2 * i));
          if (!ok) return Malformed(encoding, absl::StrCat("value ", i, " is Inf or NaN"));
        }
      }
      constexpr int64_t kBlock = 2048;
      float block[kBlock];
      for (int64_t first = 0; first < n; first += kBlock) {
        const int64_t m = std::min(kBlock, n - first);
        float* to = op == Op::kAssign ? dst.data() + first : block;
        const char* from = p + width * first;
        if (encoding == v1::SLICE_FLOAT32) {
          std::memcpy(to, from, 4 * m);
        } else if (encoding == v1::SLICE_FLOAT16) {
          FloatsFromHalves(from, m, to);
        } else {
          FloatsFromBfloat16s(from, m, to);
        }
        if constexpr (op == Op::kSubtract) {
          float* d = dst.data() + first;
          for (int64_t i = 0; i < m; ++i) d[i] -= block[i];
        }
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
                         [](const float* in, int64_t n, char* p) { std::memcpy(p, in, 4 * n); });
    case v1::SLICE_FLOAT16:
      return EncodeDense(encoding, values, max_slice_bytes, out, slices, HalvesFromFloats);
    case v1::SLICE_BFLOAT16:
      return EncodeDense(encoding, values, max_slice_bytes, out, slices, Bfloat16sFromFloats);
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

int64_t FirstNonFinite(absl::Span<const float> values) {
  if (AllFinite(values.data(), static_cast<int64_t>(values.size()))) return -1;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

absl::Status EncodeDenseWithResidual(v1::SliceEncoding encoding, absl::Span<const float> values,
                                     absl::Span<float> residual, int64_t max_slice_bytes,
                                     std::string* out, std::vector<EncodedSlice>* slices) {
  if (encoding != v1::SLICE_FLOAT16 && encoding != v1::SLICE_BFLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error feedback in one pass takes float16 or bfloat16, not ", Name(encoding)));
  }
  if (max_slice_bytes < kMinEncodedSliceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("encoded slices of at most ", max_slice_bytes,
                                                   " bytes (want >= ", kMinEncodedSliceBytes,
                                                   ")"));
  }
  if (residual.size() != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a residual of ", residual.size(),
                                                   " elements for ", values.size(), " values"));
  }
  const int64_t n = static_cast<int64_t>(values.size());
  if (const int64_t bad = FirstNonFinite(values); bad >= 0) return NotFinite(values[bad], bad, n);
  const int64_t per_slice = max_slice_bytes / 2;
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(2 * n));
  char* p = out->data() + start;
  // Block by block, while the block is in cache: e = g + r, encode e,
  // decode it back, r = e - decoded.
  constexpr int64_t kBlock = 2048;
  float e[kBlock], back[kBlock];
  for (int64_t first = 0; first < n; first += kBlock) {
    const int64_t m = std::min(kBlock, n - first);
    const float* g = values.data() + first;
    float* r = residual.data() + first;
    for (int64_t i = 0; i < m; ++i) e[i] = g[i] + r[i];
    if (!AllFinite(e, m)) {
      for (int64_t i = 0; i < m; ++i) {
        if (!std::isfinite(e[i])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "element ", first + i, " of ", n, " overflows with its residual (", g[i], " + ",
              r[i], "): it cannot be compressed"));
        }
      }
    }
    char* to = p + 2 * first;
    if (encoding == v1::SLICE_FLOAT16) {
      HalvesFromFloats(e, m, to);
      FloatsFromHalves(to, m, back);
    } else {
      Bfloat16sFromFloats(e, m, to);
      FloatsFromBfloat16s(to, m, back);
    }
    for (int64_t i = 0; i < m; ++i) r[i] = e[i] - back[i];
  }
  for (int64_t first = 0; first < n; first += per_slice) {
    const int64_t m = std::min(per_slice, n - first);
    slices->push_back({first, m, static_cast<int64_t>(start) + 2 * first, 2 * m});
  }
  return absl::OkStatus();
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
