#include "common/storage/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

// Bit-at-a-time reference, independent of the table code.
uint32_t SlowCrc32c(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32cTest, MatchesBitwiseReferenceAndExtends) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 999, 1000}) {
    const std::string part = s.substr(0, len);
    EXPECT_EQ(Crc32c(part), SlowCrc32c(part)) << len;
    for (size_t cut : {size_t{0}, len / 3, len}) {
      EXPECT_EQ(Crc32cExtend(Crc32c(part.substr(0, cut)), part.substr(cut)), Crc32c(part));
    }
  }
}

TEST(Crc32cTest, MaskRoundTripsAndChangesValue) {
  for (uint32_t c : {0u, 1u, 0xE3069283u, 0xffffffffu}) {
    EXPECT_EQ(UnmaskCrc(MaskCrc(c)), c);
    EXPECT_NE(MaskCrc(c), c);
  }
}

}  // namespace
}  // namespace towerps::common
