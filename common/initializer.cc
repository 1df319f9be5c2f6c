#include "common/initializer.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace towerps::common {

void InitializeValues(const v1::Initializer& init, absl::Span<float> out) {
  switch (init.type()) {
    case v1::Initializer::GLOROT_UNIFORM: {
      const double fan = std::max<int64_t>(1, init.fan_in() + init.fan_out());
      const float limit = static_cast<float>(std::sqrt(6.0 / fan));
      std::mt19937_64 gen(init.seed());
      std::uniform_real_distribution<float> dist(-limit, limit);
      for (float& v : out) v = dist(gen);
      break;
    }
    case v1::Initializer::CONSTANT:
      std::fill(out.begin(), out.end(), init.value());
      break;
    default:
      std::fill(out.begin(), out.end(), 0.0f);
  }
}

}  // namespace towerps::common
