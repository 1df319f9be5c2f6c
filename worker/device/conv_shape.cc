#include "worker/device/conv_shape.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace towerps::worker {
namespace {

absl::Status Bad(const char* type, const char* field, int64_t value,
                 const std::string& need) {
  return absl::InvalidArgumentError(
      absl::StrCat(type, ".", field, " = ", value, ": must be ", need));
}

// Checks shared by convolution and pooling: the image, the window, stride
// and padding.
absl::Status ValidateWindow(const char* type, int64_t n, int64_t c, int64_t h,
                            int64_t w, int64_t r, int64_t s, int stride_h,
                            int stride_w, int pad_h, int pad_w) {
  const struct {
    const char* name;
    int64_t value;
  } positive[] = {{"n", n}, {"c", c}, {"h", h}, {"w", w}, {"r", r},
                  {"s", s}, {"stride_h", stride_h}, {"stride_w", stride_w}};
  for (const auto& f : positive) {
    if (f.value < 1) return Bad(type, f.name, f.value, ">= 1");
  }
  if (pad_h < 0 || pad_h >= r) {
    return Bad(type, "pad_h", pad_h, absl::StrCat("in [0, r = ", r, ")"));
  }
  if (pad_w < 0 || pad_w >= s) {
    return Bad(type, "pad_w", pad_w, absl::StrCat("in [0, s = ", s, ")"));
  }
  if (h + 2 * pad_h < r) {
    return Bad(type, "r", r, absl::StrCat("<= h + 2 * pad_h = ", h + 2 * pad_h));
  }
  if (w + 2 * pad_w < s) {
    return Bad(type, "s", s, absl::StrCat("<= w + 2 * pad_w = ", w + 2 * pad_w));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Conv2DShape::Validate() const {
  if (k < 1) return Bad("Conv2DShape", "k", k, ">= 1");
  return ValidateWindow("Conv2DShape", n, c, h, w, r, s, stride_h, stride_w,
                        pad_h, pad_w);
}

std::string Conv2DShape::DebugString() const {
  return absl::StrCat("n=", n, " c=", c, " h=", h, " w=", w, " k=", k,
                      " r=", r, " s=", s, " stride=", stride_h, "x", stride_w,
                      " pad=", pad_h, "x", pad_w);
}

absl::Status BatchNormShape::Validate() const {
  const struct {
    const char* name;
    int64_t value;
  } positive[] = {{"n", n}, {"c", c}, {"spatial", spatial}};
  for (const auto& f : positive) {
    if (f.value < 1) return Bad("BatchNormShape", f.name, f.value, ">= 1");
  }
  if (!(epsilon > 0.0f) || !std::isfinite(epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchNormShape.epsilon = ", epsilon, ": must be > 0 and finite"));
  }
  return absl::OkStatus();
}

std::string BatchNormShape::DebugString() const {
  return absl::StrCat("n=", n, " c=", c, " spatial=", spatial, " epsilon=", epsilon);
}

absl::Status Pool2DShape::Validate() const {
  return ValidateWindow("Pool2DShape", n, c, h, w, r, s, stride_h, stride_w,
                        pad_h, pad_w);
}

std::string Pool2DShape::DebugString() const {
  return absl::StrCat("n=", n, " c=", c, " h=", h, " w=", w, " r=", r,
                      " s=", s, " stride=", stride_h, "x", stride_w,
                      " pad=", pad_h, "x", pad_w);
}

}  // namespace towerps::worker
