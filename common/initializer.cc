#include "common/initializer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace towerps::common {

void InitializeValues(const v1::Initializer& init, absl::Span<float> out) {
  switch (init.type()) {
    case v1::Initializer::GLOROT_UNIFORM: {
      const double fan = std::max<int64_t>(1, init.fan_in() + init.fan_out());
      const float limit = static_cast<float>(std::sqrt(6.0 / fan));
      // Our own mapping from the generator's bits (not std::uniform_real_
      // distribution, whose output differs between standard libraries), so
      // every machine initializes identically.
      std::mt19937_64 gen(init.seed());
      if (init.offset() > 0) gen.discard(static_cast<uint64_t>(init.offset()));
      for (float& v : out) {
        const float u = static_cast<float>(gen() >> 40) * (1.0f / 16777216.0f);
        v = (2.0f * u - 1.0f) * limit;
      }
      break;
    }
    case v1::Initializer::CONSTANT:
      std::fill(out.begin(), out.end(), init.value());
      break;
    default:
      std::fill(out.begin(), out.end(), 0.0f);
  }
}

absl::Status ValidateInitializer(const v1::Initializer& init) {
  if (!v1::Initializer::Type_IsValid(init.type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer.type = ", static_cast<int>(init.type()), " is unknown"));
  }
  if (init.type() == v1::Initializer::CONSTANT && !std::isfinite(init.value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer.value = ", init.value(), " (want a finite number)"));
  }
  for (const auto& [field, x] : {std::pair<const char*, int64_t>{"fan_in", init.fan_in()},
                                 {"fan_out", init.fan_out()},
                                 {"offset", init.offset()}}) {
    if (x < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("initializer.", field, " = ", x, " (want >= 0)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace towerps::common
