// CRC-32C (Castagnoli), as used by TFRecord framing, TensorBoard event files
// and our checkpoint and job-store records.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_COMMON_STORAGE_CRC32C_H_
#define TOWERPS_COMMON_STORAGE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace towerps::common {

// CRC-32C of `data`, continuing from `crc` (the CRC of the bytes before it;
// 0 for none). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32cExtend(uint32_t crc, absl::string_view data);
inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data); }

// The masking TFRecord applies to stored CRCs, so that a CRC of data that
// itself contains CRCs is not degenerate: rotate right 15, add a constant.
inline uint32_t MaskCrc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
inline uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_STORAGE_CRC32C_H_
