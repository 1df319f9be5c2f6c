// Gradient compression on the wire (issue 16): encoding a float gradient into
// the payloads of TensorSlices as proto/tensor.proto's SliceEncoding says,
// and decoding such a payload back into floats. The worker encodes
// (worker/train/gradient_compressor), the parameter server decodes each slice
// of a push straight into its float staging buffer (ps/parameter_server).
//
// Encodings (exact bytes in proto/tensor.proto, all little-endian):
//   SLICE_FLOAT32   4 bytes per element, as is.
//   SLICE_FLOAT16   IEEE binary16, rounded to nearest even; a finite value
//                   beyond +-65504 becomes +-65504 (clamped, never Inf).
//   SLICE_BFLOAT16  the upper half of the float32, rounded to nearest even;
//                   a finite value that would round to Inf becomes the
//                   largest finite bfloat16 of its sign.
//   SLICE_TOPK      [uint32 length][m x uint32 index][m x float32 value]: the
//                   k = TopKCount(n, ratio) elements of largest magnitude of
//                   the n encoded, ties to the lower index, indices
//                   ascending; a slice covers `length` elements.
// The encoders refuse NaN and Inf (InvalidArgument naming the element): the
// servers would refuse the push anyway, and a clamp must not hide them.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_COMMON_GRADIENT_CODEC_H_
#define TOWERPS_COMMON_GRADIENT_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace towerps::common {

// One encoded slice: it covers `elements` elements from `offset` (counted
// from the first element encoded) and its payload is bytes [begin, begin +
// bytes) of the output buffer.
struct EncodedSlice {
  int64_t offset = 0;
  int64_t elements = 0;
  int64_t begin = 0;
  int64_t bytes = 0;
};

// The smallest slice EncodeGradient can write: room for one top-k entry.
constexpr int64_t kMinEncodedSliceBytes = 12;

// Elements SLICE_TOPK keeps of `n`: max(1, ceil(ratio x n)), at most n (0
// when n is 0). A product within 1e-6 above an integer counts as that
// integer, so that 0.1 x 30 keeps 3, not 4. REQUIRES: 0 < ratio <= 1.
int64_t TopKCount(int64_t n, double ratio);

// Encodes `values` as `encoding`, appending the payloads to `*out` and one
// EncodedSlice per slice to `*slices`. No slice's payload is over
// `max_slice_bytes` (so a slice fits a message of that size); slices cover
// `values` in order, each element exactly once. `topk_ratio` is used by
// SLICE_TOPK only. `scratch` (may be null) is reused between calls by
// SLICE_TOPK for its index work. InvalidArgument naming the element for a
// NaN or Inf value (what was appended is then incomplete), or for a bad
// encoding, ratio or max_slice_bytes (< kMinEncodedSliceBytes), or a span
// of 2^32 elements or more for SLICE_TOPK.
absl::Status EncodeGradient(v1::SliceEncoding encoding, absl::Span<const float> values,
                            double topk_ratio, int64_t max_slice_bytes, std::string* out,
                            std::vector<EncodedSlice>* slices,
                            std::vector<uint32_t>* scratch = nullptr);

// SLICE_FLOAT16 or SLICE_BFLOAT16 with error feedback, in one pass over
// memory: appends what EncodeGradient appends for e = values + residual
// (element by element) and leaves residual = e - decode(encoded), exactly
// what SubtractDecodedSlice would leave. REQUIRES residual.size() ==
// values.size(). InvalidArgument naming the element for a NaN or Inf in
// `values` (checked first: the residual is unchanged then), for an e that
// overflows (the residual may have moved then), or for a bad encoding or
// max_slice_bytes.
absl::Status EncodeDenseWithResidual(v1::SliceEncoding encoding, absl::Span<const float> values,
                                     absl::Span<float> residual, int64_t max_slice_bytes,
                                     std::string* out, std::vector<EncodedSlice>* slices);

// The index of the first NaN or Inf in `values`, or -1 (a vectorized pass
// when there is none).
int64_t FirstNonFinite(absl::Span<const float> values);

// Bytes of payload EncodeGradient appends for `n` elements (exactly; for
// SLICE_TOPK independent of the values). Same REQUIRES as EncodeGradient's
// arguments being valid.
int64_t EncodedGradientBytes(v1::SliceEncoding encoding, int64_t n, double topk_ratio,
                             int64_t max_slice_bytes);

// Decodes one slice's payload into `dst`, which starts at the slice's first
// element and runs to the end of the variable (or of the part being
// received); returns how many elements the slice covers (`dst`'s first ones:
// all of them written, zeros included). InvalidArgument naming what was
// wrong: a length that is not a whole number of values, a slice that runs
// past `dst`, a top-k slice covering no element, an index out of range or not
// strictly increasing, a value that is Inf or NaN. `dst` may be partly
// written then.
absl::StatusOr<int64_t> DecodeSlice(v1::SliceEncoding encoding, absl::string_view payload,
                                    absl::Span<float> dst);

// The same checks, and dst[i] -= decoded[i] for the elements covered (for
// error feedback: what compression left out of `dst`'s values).
absl::StatusOr<int64_t> SubtractDecodedSlice(v1::SliceEncoding encoding,
                                             absl::string_view payload, absl::Span<float> dst);

// The conversions themselves. REQUIRES: `f` finite (Inf and NaN are the
// encoders' to refuse). Overflow clamps as described at the top.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);  // Inf and NaN decode as such.
uint16_t FloatToBfloat16(float f);
float Bfloat16ToFloat(uint16_t b);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_GRADIENT_CODEC_H_
