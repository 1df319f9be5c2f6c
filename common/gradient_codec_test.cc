// The gradient codec: exact half-precision conversions (known values, every
// half, every rounding midpoint), top-k selection and its bytes, slicing,
// and the decoder's refusal of every malformed payload.
#include "common/gradient_codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

using v1::SLICE_BFLOAT16;
using v1::SLICE_FLOAT16;
using v1::SLICE_FLOAT32;
using v1::SLICE_TOPK;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

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

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string F32(float v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U16(uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); }

// A top-k payload from its parts.
std::string TopK(uint32_t length, const std::vector<uint32_t>& indices,
                 const std::vector<float>& values) {
  std::string s = U32(length);
  for (uint32_t i : indices) s += U32(i);
  for (float v : values) s += F32(v);
  return s;
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // the largest half
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalf(1023 * 0x1p-24f), 0x03ff);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  // Round to nearest, ties to even.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);                // tie: down to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);            // tie: up to even
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);     // above the tie: up
  EXPECT_EQ(FloatToHalf(2049.0f), 0x6800);                        // tie: 2048
  EXPECT_EQ(FloatToHalf(2051.0f), 0x6802);                        // tie: 2052
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);                       // tie: 0
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);            // above it: up
  EXPECT_EQ(FloatToHalf(1.5f * 0x1p-24f), 0x0002);                // tie: up to even
  EXPECT_EQ(FloatToHalf(2.5f * 0x1p-24f), 0x0002);                // tie: down to even
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);             // into the normals
  EXPECT_EQ(FloatToHalf(0x1p-30f), 0x0000);                       // underflow
  EXPECT_EQ(FloatToHalf(-0x1p-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);                       // below the tie: down
  // Overflow is clamped to the largest finite half, never Inf.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7bff);  // the tie that would round to Inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7bff);
  EXPECT_EQ(FloatToHalf(-1e6f), 0xfbff);
  EXPECT_EQ(FloatToHalf(FLT_MAX), 0x7bff);

  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x2e66), 0.0999755859375f);
  const float neg_zero = HalfToFloat(0x8000);
  EXPECT_EQ(neg_zero, 0.0f);
  EXPECT_TRUE(std::signbit(neg_zero));
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
}

TEST(HalfTest, EveryFiniteHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // Inf, NaN
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// Between every two neighbouring halves: the midpoint goes to the even one,
// one float step either side to the nearer one. (Neighbouring halves and
// their midpoint are exact in float.)
TEST(HalfTest, EveryMidpointRoundsToEven) {
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    const float lo = HalfToFloat(h), hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (lo + hi) / 2;
    ASSERT_GT(mid, lo);
    ASSERT_LT(mid, hi);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
    ASSERT_EQ(FloatToHalf(mid), even) << std::hex << h;
    ASSERT_EQ(FloatToHalf(-mid), even | 0x8000) << std::hex << h;
    ASSERT_EQ(FloatToHalf(FromBits(Bits(mid) - 1)), h) << std::hex << h;
    ASSERT_EQ(FloatToHalf(FromBits(Bits(mid) + 1)), h + 1) << std::hex << h;
  }
}

// The bulk paths (vectorized loops; F16C on CPUs that have it) must give
// exactly what the one-value functions give: every half decoded, and floats
// across every half's range (normals, subnormals, midpoints, the clamp,
// both signs) encoded, through EncodeGradient and DecodeSlice.
TEST(HalfTest, BulkConversionsMatchTheOneValueFunctionsBitForBit) {
  std::vector<float> values;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // Inf, NaN
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    values.push_back(f);
    values.push_back(FromBits(Bits(f) + 1));  // just above, rounds to nearest
    values.push_back(FromBits(Bits(f) + 0x1000));  // the midpoint to the next half
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 1e9f, -65520.0f, -3e38f, 1e-30f, -1e-8f}) {
    values.push_back(f);
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any;
  while (values.size() % 8 != 3) values.push_back(0.5f);  // a scalar tail too
  for (int i = 0; i < 100000; ++i) {
    const float f = FromBits(any(rng));
    if (std::isfinite(f)) values.push_back(f);
  }
  for (auto encoding : {SLICE_FLOAT16, SLICE_BFLOAT16}) {
    std::string out;
    std::vector<EncodedSlice> slices;
    ASSERT_TRUE(EncodeGradient(encoding, values, 0, 1 << 24, &out, &slices).ok());
    ASSERT_EQ(out.size(), 2 * values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, out.data() + 2 * i, 2);
      const uint16_t want =
          encoding == SLICE_FLOAT16 ? FloatToHalf(values[i]) : FloatToBfloat16(values[i]);
      ASSERT_EQ(got, want) << std::hex << Bits(values[i]) << " element " << std::dec << i;
    }
    std::vector<float> decoded(values.size());
    auto n = DecodeSlice(encoding, out, absl::MakeSpan(decoded));
    ASSERT_TRUE(n.ok()) << n.status();
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 2 * i, 2);
      const float want = encoding == SLICE_FLOAT16 ? HalfToFloat(h) : Bfloat16ToFloat(h);
      ASSERT_EQ(Bits(decoded[i]), Bits(want)) << std::hex << h << " element " << std::dec << i;
    }
    // Subtracting goes through the same conversion.
    std::vector<float> rest(values.size(), 1.0f);
    ASSERT_TRUE(SubtractDecodedSlice(encoding, out, absl::MakeSpan(rest)).ok());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(Bits(rest[i]), Bits(1.0f - decoded[i])) << i;
    }
  }
}

// Error feedback in one pass gives what the steps do one by one: the
// encoding of e = g + r and r = e - decode(encoded), bit for bit.
TEST(EncodeTest, DenseWithResidualEqualsEncodeThenSubtract) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  for (auto encoding : {SLICE_FLOAT16, SLICE_BFLOAT16}) {
    const int n = 5003;  // several blocks and a tail
    std::vector<float> g(n), r(n);
    for (int i = 0; i < n; ++i) {
      g[i] = normal(rng);
      r[i] = normal(rng) * 1e-3f;
    }
    std::vector<float> e(n);
    for (int i = 0; i < n; ++i) e[i] = g[i] + r[i];
    std::string want;
    std::vector<EncodedSlice> want_slices;
    ASSERT_TRUE(EncodeGradient(encoding, e, 0, 4096, &want, &want_slices).ok());
    std::vector<float> want_r = e;
    for (const EncodedSlice& sl : want_slices) {
      ASSERT_TRUE(SubtractDecodedSlice(encoding, absl::string_view(want).substr(sl.begin, sl.bytes),
                                       absl::MakeSpan(want_r).subspan(sl.offset))
                      .ok());
    }
    std::string got = "prefix";
    std::vector<EncodedSlice> got_slices;
    ASSERT_TRUE(
        EncodeDenseWithResidual(encoding, g, absl::MakeSpan(r), 4096, &got, &got_slices).ok());
    EXPECT_EQ(got.substr(6), want);
    ASSERT_EQ(got_slices.size(), want_slices.size());
    for (size_t k = 0; k < got_slices.size(); ++k) {
      EXPECT_EQ(got_slices[k].offset, want_slices[k].offset);
      EXPECT_EQ(got_slices[k].elements, want_slices[k].elements);
      EXPECT_EQ(got_slices[k].begin, want_slices[k].begin + 6);
      EXPECT_EQ(got_slices[k].bytes, want_slices[k].bytes);
    }
    for (int i = 0; i < n; ++i) ASSERT_EQ(Bits(r[i]), Bits(want_r[i])) << i;
    // A NaN in g: refused naming it, the residual untouched.
    g[77] = std::nanf("");
    const std::vector<float> before = r;
    std::vector<EncodedSlice> none;
    const absl::Status st = EncodeDenseWithResidual(encoding, g, absl::MakeSpan(r), 4096, &got, &none);
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(st.message(), "element 77")) << st;
    EXPECT_EQ(r, before);
  }
}

TEST(Bfloat16Test, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBfloat16(1.0f + 0x1p-8f), 0x3f80);             // tie: down to even
  EXPECT_EQ(FloatToBfloat16(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie: up to even
  EXPECT_EQ(FloatToBfloat16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above it: up
  EXPECT_EQ(FloatToBfloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x00010000)), 0x0001);       // a subnormal float
  EXPECT_EQ(FloatToBfloat16(FromBits(0x00018000)), 0x0002);       // its tie: up to even
  // Finite values that round to Inf are clamped to the largest bfloat16.
  EXPECT_EQ(FloatToBfloat16(FLT_MAX), 0x7f7f);
  EXPECT_EQ(FloatToBfloat16(-FLT_MAX), 0xff7f);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7f7f7fff)), 0x7f7f);       // rounds down anyway
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bfloat16ToFloat(0x7f7f), FromBits(0x7f7f0000));
  EXPECT_TRUE(std::signbit(Bfloat16ToFloat(0x8000)));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7f80) == 0x7f80) continue;
    ASSERT_EQ(FloatToBfloat16(Bfloat16ToFloat(static_cast<uint16_t>(b))), b) << std::hex << b;
  }
}

TEST(TopKCountTest, CeilOfRatioTimesNAtLeastOne) {
  EXPECT_EQ(TopKCount(100, 0.01), 1);
  EXPECT_EQ(TopKCount(1000, 0.01), 10);
  EXPECT_EQ(TopKCount(1001, 0.01), 11);
  EXPECT_EQ(TopKCount(30, 0.1), 3);  // 0.1 x 30 is 3.0000000000000004 in double
  EXPECT_EQ(TopKCount(5, 0.01), 1);
  EXPECT_EQ(TopKCount(3, 0.5), 2);
  EXPECT_EQ(TopKCount(7, 1.0), 7);
  EXPECT_EQ(TopKCount(0, 0.5), 0);
}

TEST(EncodeTest, TopKKeepsTheLargestMagnitudesInIndexOrderWithExactBytes) {
  const std::vector<float> g = {0.5f, -3.0f, 1.0f, 3.0f, 0.0f, -2.0f};
  std::string out;
  std::vector<EncodedSlice> slices;
  ASSERT_TRUE(EncodeGradient(SLICE_TOPK, g, 0.5, 1 << 20, &out, &slices).ok());
  EXPECT_EQ(out, TopK(6, {1, 3, 5}, {-3.0f, 3.0f, -2.0f}));
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].offset, 0);
  EXPECT_EQ(slices[0].elements, 6);
  EXPECT_EQ(slices[0].begin, 0);
  EXPECT_EQ(slices[0].bytes, 4 + 3 * 8);
  EXPECT_EQ(EncodedGradientBytes(SLICE_TOPK, 6, 0.5, 1 << 20), 28);

  std::vector<float> back(6, 9.0f);
  auto n = DecodeSlice(SLICE_TOPK, out, absl::MakeSpan(back));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 6);
  EXPECT_EQ(back, std::vector<float>({0, -3, 0, 3, 0, -2}));
}

TEST(EncodeTest, TopKTiesGoToTheLowerIndex) {
  const std::vector<float> g = {1.0f, -1.0f, 1.0f, -1.0f, 0.5f, 1.0f};
  std::string out;
  std::vector<EncodedSlice> slices;
  ASSERT_TRUE(EncodeGradient(SLICE_TOPK, g, 0.5, 1 << 20, &out, &slices).ok());
  EXPECT_EQ(out, TopK(6, {0, 1, 2}, {1.0f, -1.0f, 1.0f}));
}

TEST(EncodeTest, DenseHalvesAreTwoBytesPerElementInOrder) {
  const std::vector<float> g = {1.0f, -2.0f, 65504.0f, 1e9f, -0.0f};
  std::string out;
  std::vector<EncodedSlice> slices;
  ASSERT_TRUE(EncodeGradient(SLICE_FLOAT16, g, 0, 1 << 20, &out, &slices).ok());
  EXPECT_EQ(out, U16(0x3c00) + U16(0xc000) + U16(0x7bff) + U16(0x7bff) + U16(0x8000));
  out.clear();
  slices.clear();
  ASSERT_TRUE(EncodeGradient(SLICE_BFLOAT16, g, 0, 1 << 20, &out, &slices).ok());
  EXPECT_EQ(out.substr(0, 4), U16(0x3f80) + U16(0xc000));
  EXPECT_EQ(EncodedGradientBytes(SLICE_BFLOAT16, 5, 0, 1 << 20), 10);
}

TEST(EncodeTest, NaNAndInfAreRefusedNamingTheElement) {
  for (auto encoding : {SLICE_FLOAT16, SLICE_BFLOAT16, SLICE_TOPK, SLICE_FLOAT32}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      std::string out;
      std::vector<EncodedSlice> slices;
      const absl::Status s =
          EncodeGradient(encoding, {1.0f, 2.0f, bad, 4.0f}, 0.5, 1 << 20, &out, &slices);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << encoding;
      EXPECT_TRUE(absl::StrContains(s.message(), "element 2 of 4 is")) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), std::isnan(bad) ? "NaN" : "Inf")) << s;
    }
  }
}

TEST(EncodeTest, BadArgumentsAreInvalidArgument) {
  std::string out;
  std::vector<EncodedSlice> slices;
  const std::vector<float> g = {1, 2};
  for (double ratio : {0.0, -0.5, 1.5, std::nan("")}) {
    EXPECT_EQ(EncodeGradient(SLICE_TOPK, g, ratio, 4096, &out, &slices).code(),
              absl::StatusCode::kInvalidArgument)
        << ratio;
  }
  EXPECT_EQ(EncodeGradient(SLICE_FLOAT16, g, 0, 11, &out, &slices).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeGradient(static_cast<v1::SliceEncoding>(9), g, 0, 4096, &out, &slices).code(),
            absl::StatusCode::kInvalidArgument);
}

// Slices of at most max_slice_bytes cover the span in order, exactly once,
// and decode (each from its own offset) to what one slice would.
TEST(EncodeTest, SlicesFitTheirLimitAndCoverEverythingOnce) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(1000);
  for (float& x : g) x = normal(rng);
  for (auto encoding : {SLICE_FLOAT32, SLICE_FLOAT16, SLICE_BFLOAT16, SLICE_TOPK}) {
    for (int64_t max_bytes : {int64_t{12}, int64_t{28}, int64_t{100}, int64_t{1} << 20}) {
      SCOPED_TRACE(testing::Message() << encoding << " " << max_bytes);
      std::string out = "prefix";  // appended to
      std::vector<EncodedSlice> slices;
      ASSERT_TRUE(EncodeGradient(encoding, g, 0.2, max_bytes, &out, &slices).ok());
      EXPECT_EQ(static_cast<int64_t>(out.size()) - 6,
                EncodedGradientBytes(encoding, 1000, 0.2, max_bytes));
      std::vector<float> one(1000, -1.0f);
      int64_t covered = 0, begin = 6;
      for (const EncodedSlice& s : slices) {
        ASSERT_EQ(s.offset, covered);
        ASSERT_EQ(s.begin, begin);
        ASSERT_LE(s.bytes, max_bytes);
        auto n = DecodeSlice(encoding, absl::string_view(out).substr(s.begin, s.bytes),
                             absl::MakeSpan(one).subspan(s.offset));
        ASSERT_TRUE(n.ok()) << n.status();
        ASSERT_EQ(*n, s.elements);
        covered += s.elements;
        begin += s.bytes;
      }
      EXPECT_EQ(covered, 1000);
      std::string whole;
      std::vector<EncodedSlice> unused;
      ASSERT_TRUE(EncodeGradient(encoding, g, 0.2, 1 << 20, &whole, &unused).ok());
      std::vector<float> ref(1000, -1.0f);
      ASSERT_TRUE(DecodeSlice(encoding, whole, absl::MakeSpan(ref)).ok());
      EXPECT_EQ(one, ref);
    }
  }
}

// Decoded values against the definitions: halves within half an ulp,
// top-k exactly the k largest magnitudes (a full sort as the reference).
TEST(EncodeTest, RandomGradientsDecodeAsDefined) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 3000);
    std::vector<float> g(n);
    for (float& x : g) x = normal(rng);
    if (trial % 2) g[rng() % n] = g[rng() % n];  // a tie now and then
    for (auto encoding : {SLICE_FLOAT16, SLICE_BFLOAT16, SLICE_TOPK}) {
      std::string out;
      std::vector<EncodedSlice> slices;
      ASSERT_TRUE(EncodeGradient(encoding, g, 0.03, 1 << 20, &out, &slices).ok());
      std::vector<float> d(n, 5.0f);
      ASSERT_TRUE(DecodeSlice(encoding, out, absl::MakeSpan(d)).ok());
      if (encoding == SLICE_TOPK) {
        std::vector<int> order(n);
        for (int i = 0; i < n; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return std::fabs(g[a]) > std::fabs(g[b]) ||
                 (std::fabs(g[a]) == std::fabs(g[b]) && a < b);
        });
        std::vector<float> want(n, 0.0f);
        for (int j = 0; j < TopKCount(n, 0.03); ++j) want[order[j]] = g[order[j]];
        ASSERT_EQ(d, want);
        continue;
      }
      for (int i = 0; i < n; ++i) {
        const double x = g[i];
        // Half: 11 significant bits, subnormal steps of 2^-24.
        const double bound = encoding == SLICE_FLOAT16
                                 ? std::max(std::fabs(x) * 0x1p-11, 0x1p-25)
                                 : std::fabs(x) * 0x1p-8;
        ASSERT_LE(std::fabs(d[i] - x), bound) << i << " " << x;
      }
    }
  }
}

TEST(DecodeTest, SubtractTakesTheDecodedValuesAway) {
  std::vector<float> dst = {1, 2, 3, 4};
  auto n = SubtractDecodedSlice(SLICE_TOPK, TopK(3, {0, 2}, {0.5f, 3.0f}), absl::MakeSpan(dst));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
  EXPECT_EQ(dst, std::vector<float>({0.5f, 2, 0, 4}));
  n = SubtractDecodedSlice(SLICE_FLOAT16, U16(0x3c00) + U16(0xc000), absl::MakeSpan(dst));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(dst, std::vector<float>({-0.5f, 4, 0, 4}));
}

TEST(DecodeTest, MalformedPayloadsAreInvalidArgumentSayingWhat) {
  struct Case {
    v1::SliceEncoding encoding;
    std::string payload;
    const char* says;
  };
  const std::vector<Case> cases = {
      {SLICE_TOPK, "", "0 bytes are shorter than its 4-byte length"},
      {SLICE_TOPK, std::string("\x01\x00\x00", 3), "3 bytes are shorter"},
      {SLICE_TOPK, U32(4) + U32(1) + "abc", "do not hold a length and whole (index, value)"},
      {SLICE_TOPK, U32(0), "its length is 0"},
      {SLICE_TOPK, U32(9), "its length 9 runs past the end (8 elements left)"},
      {SLICE_TOPK, TopK(4, {1, 4}, {1, 1}), "index 4 (entry 1) is out of range (length 4)"},
      {SLICE_TOPK, TopK(4, {2, 2}, {1, 1}), "not strictly increasing: entry 1 is 2 after 2"},
      {SLICE_TOPK, TopK(4, {2, 1}, {1, 1}), "entry 1 is 1 after 2"},
      {SLICE_TOPK, TopK(4, {0, 3}, {1, kNaN}), "entry 1 (index 3) is Inf or NaN"},
      {SLICE_TOPK, TopK(4, {0}, {-kInf}), "entry 0 (index 0) is Inf or NaN"},
      {SLICE_FLOAT16, "abc", "float16 slice: 3 bytes are not a whole number of 2-byte values"},
      {SLICE_FLOAT16, std::string(18, '\0'), "9 values run past the end (8 elements left)"},
      {SLICE_FLOAT16, U16(0) + U16(0x7c00), "value 1 is Inf or NaN"},
      {SLICE_FLOAT16, U16(0xfe00), "value 0 is Inf or NaN"},
      {SLICE_BFLOAT16, U16(0x7fc0), "bfloat16 slice: value 0 is Inf or NaN"},
      {SLICE_FLOAT32, F32(1) + F32(kInf), "float32 slice: value 1 is Inf or NaN"},
      {static_cast<v1::SliceEncoding>(7), "", "unknown slice encoding 7"},
  };
  for (const Case& c : cases) {
    std::vector<float> dst(8, 0.0f);
    auto n = DecodeSlice(c.encoding, c.payload, absl::MakeSpan(dst));
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_TRUE(absl::StrContains(n.status().message(), c.says)) << n.status();
    auto m = SubtractDecodedSlice(c.encoding, c.payload, absl::MakeSpan(dst));
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
  }
}

// Random bytes never crash the decoder, and what it accepts stays within
// its destination.
TEST(DecodeTest, RandomBytesAreDecodedOrRefusedSafely) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string payload(rng() % 40, '\0');
    for (char& c : payload) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 8);
    const auto encoding = static_cast<v1::SliceEncoding>(rng() % 4);
    std::vector<float> dst(1 + rng() % 10, 0.0f);
    std::vector<float> guard(dst.size() + 8, 0.0f);
    std::copy(dst.begin(), dst.end(), guard.begin());
    auto n = DecodeSlice(encoding, payload, absl::MakeSpan(guard.data(), dst.size()));
    if (n.ok()) {
      ASSERT_LE(*n, static_cast<int64_t>(dst.size()));
      for (size_t i = dst.size(); i < guard.size(); ++i) ASSERT_EQ(guard[i], 0.0f);
    } else {
      ASSERT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace towerps::common
