#include "worker/train/gradient_compressor.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gradient_codec.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

bool Compressed(const v1::VariableDef& def) {
  return def.update() != v1::VariableDef::MOVING_AVERAGE;
}

}  // namespace

bool EncodedPush::WriteTo(const std::shared_ptr<const EncodedPush>& push, int s,
                          common::TensorWireWriter* out) {
  const Server& server = push->servers_[s];
  for (const Slice& slice : server.slices) {
    if (!out->AddEncoded(slice.var_index, slice.offset, server.payload.data() + slice.begin,
                         slice.bytes, push)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<GradientCompressor>> GradientCompressor::Create(
    const v1::GradientCompression& spec_in, std::vector<v1::VariableDef> vars,
    const Placement& placement, int64_t max_slice_bytes) {
  TOWERPS_RETURN_IF_ERROR(ValidateCompression(spec_in));
  const v1::GradientCompression spec = CompressionWithDefaults(spec_in);
  if (spec.type() == v1::GradientCompression::NONE) return nullptr;
  if (max_slice_bytes < common::kMinEncodedSliceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient compression: slices of at most ", max_slice_bytes,
                     " bytes (want >= ", common::kMinEncodedSliceBytes, ")"));
  }
  std::unique_ptr<GradientCompressor> c(new GradientCompressor());
  c->spec_ = spec;
  switch (spec.type()) {
    case v1::GradientCompression::FP16: c->encoding_ = v1::SLICE_FLOAT16; break;
    case v1::GradientCompression::BF16: c->encoding_ = v1::SLICE_BFLOAT16; break;
    default: c->encoding_ = v1::SLICE_TOPK;
  }
  c->vars_ = std::move(vars);
  c->parts_ = placement.parts;
  c->max_slice_bytes_ = max_slice_bytes;
  c->residuals_.resize(c->parts_.size());
  for (size_t p = 0; p < c->parts_.size(); ++p) {
    const VariablePart& part = c->parts_[p];
    if (part.var < 0 || part.var >= static_cast<int>(c->vars_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient compression: part ", p, " names variable ", part.var, " of ",
                       c->vars_.size()));
    }
    c->num_servers_ = std::max(c->num_servers_, part.server + 1);
    const v1::VariableDef& def = c->vars_[part.var];
    const bool compressed = Compressed(def);
    if (compressed && c->encoding_ == v1::SLICE_TOPK && part.count > int64_t{UINT32_MAX}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient compression: top-k takes variable parts of fewer than 2^32 elements; \"",
          def.name(), "\" has a part of ", part.count));
    }
    c->uncompressed_bytes_ += 4 * part.count;
    c->compressed_bytes_ +=
        compressed ? common::EncodedGradientBytes(c->encoding_, part.count, spec.ratio(),
                                                  max_slice_bytes)
                   : 4 * part.count;
    if (compressed && spec.error_feedback()) c->residuals_[p].assign(part.count, 0.0f);
  }
  return c;
}

absl::StatusOr<std::shared_ptr<const EncodedPush>> GradientCompressor::Encode(
    const std::vector<const common::Tensor*>& grads) {
  return Encode(grads, 0, static_cast<int>(vars_.size()));
}

absl::StatusOr<std::shared_ptr<const EncodedPush>> GradientCompressor::Encode(
    const std::vector<const common::Tensor*>& grads, int first, int count) {
  if (grads.size() != vars_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient compression: got ", grads.size(), " gradients for ", vars_.size(),
        " variables"));
  }
  if (first < 0 || count < 0 || first + count > static_cast<int>(vars_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("gradient compression: variables [", first,
                                                   ", ", first + count, ") of ", vars_.size()));
  }
  auto chosen = [first, count](int v) { return v >= first && v < first + count; };
  // Every gradient finite before any residual moves (the encoders check
  // what they encode too, but a residual would have taken the NaN by then).
  for (size_t v = first; v < static_cast<size_t>(first + count); ++v) {
    const common::Tensor& g = *grads[v];
    for (const VariablePart& part : parts_) {
      if (part.var != static_cast<int>(v)) continue;
      if (part.offset + part.count > g.num_elements()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gradient compression: the gradient of \"", vars_[v].name(), "\" has ",
            g.num_elements(), " elements, its parts need ", part.offset + part.count));
      }
    }
    if (const int64_t i = common::FirstNonFinite(g.span()); i >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: the gradient of \"", vars_[v].name(), "\" is ",
          std::isnan(g[i]) ? "NaN" : "Inf", " at element ", i, "; nothing sent"));
    }
  }
  auto push = std::make_shared<EncodedPush>();
  push->encoding_ = encoding_;
  push->servers_.resize(num_servers_);
  std::vector<common::EncodedSlice> slices;
  for (size_t p = 0; p < parts_.size(); ++p) {
    const VariablePart& part = parts_[p];
    if (!chosen(part.var)) continue;
    const v1::VariableDef& def = vars_[part.var];
    const float* g = grads[part.var]->data() + part.offset;
    EncodedPush::Server& server = push->servers_[part.server];
    std::vector<float>& r = residuals_[p];
    const bool compressed = Compressed(def);
    const v1::SliceEncoding encoding = compressed ? encoding_ : v1::SLICE_FLOAT32;
    absl::Span<const float> values(g, static_cast<size_t>(part.count));
    slices.clear();
    if (!r.empty() && encoding != v1::SLICE_TOPK) {
      // float16 / bfloat16: e = g + r, its encoding and r = e - decoded, in
      // one pass over memory (the same values as the steps below; a
      // dense-stack step with fp16 took 120-134 ms instead of 262-291).
      absl::Status st = common::EncodeDenseWithResidual(encoding, values, absl::MakeSpan(r),
                                                        max_slice_bytes_, &server.payload,
                                                        &slices);
      if (!st.ok()) return common::Annotate(st, absl::StrCat("push: compressing \"", def.name(), "\""));
      for (const common::EncodedSlice& sl : slices) {
        server.slices.push_back({static_cast<uint32_t>(part.index_on_server),
                                 static_cast<uint64_t>(sl.offset), sl.begin, sl.bytes});
      }
      continue;
    }
    if (!r.empty()) {
      for (int64_t i = 0; i < part.count; ++i) r[i] += g[i];  // e = g + r
      values = r;
    }
    absl::Status st = common::EncodeGradient(encoding, values, spec_.ratio(), max_slice_bytes_,
                                             &server.payload, &slices, &scratch_);
    if (!st.ok()) {
      // Only e = g + r overflowing can get here (g is finite).
      return common::Annotate(st, absl::StrCat("push: compressing \"", def.name(), "\""));
    }
    for (const common::EncodedSlice& s : slices) {
      push->servers_[part.server].slices.push_back(
          {static_cast<uint32_t>(part.index_on_server), static_cast<uint64_t>(s.offset), s.begin,
           s.bytes});
      if (!r.empty()) {
        // r = e - decode(encoded): through the decoder the servers use.
        auto n = common::SubtractDecodedSlice(
            encoding, absl::string_view(server.payload).substr(s.begin, s.bytes),
            absl::MakeSpan(r).subspan(s.offset));
        if (!n.ok() || *n != s.elements) {
          return absl::InternalError(absl::StrCat("gradient compression of \"", def.name(),
                                                  "\" does not decode: ", n.status().message()));
        }
      }
    }
  }
  return std::shared_ptr<const EncodedPush>(std::move(push));
}

std::string GradientCompressor::Describe() const {
  std::string name;
  switch (spec_.type()) {
    case v1::GradientCompression::FP16: name = "fp16"; break;
    case v1::GradientCompression::BF16: name = "bf16"; break;
    default: name = absl::StrCat("topk:", spec_.ratio());
  }
  if (spec_.error_feedback()) absl::StrAppend(&name, ", error feedback");
  return name;
}

std::string GradientCompressor::Summary() const {
  return absl::StrFormat(
      "gradient compression %s: %d payload bytes per push instead of %d (%.2f%%)", Describe(),
      compressed_bytes_, uncompressed_bytes_,
      uncompressed_bytes_ > 0 ? 100.0 * compressed_bytes_ / uncompressed_bytes_ : 100.0);
}

}  // namespace towerps::worker
