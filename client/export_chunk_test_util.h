// Test helpers for ExportChunk streams (safetensors export): float payloads
// as bytes and one chunk of a variable.
#ifndef TOWERPS_CLIENT_EXPORT_CHUNK_TEST_UTIL_H_
#define TOWERPS_CLIENT_EXPORT_CHUNK_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "proto/job_service.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::client {

// The floats' bytes, as a payload carries them.
inline std::string Floats(std::initializer_list<float> v) {
  std::string s(v.size() * sizeof(float), '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

// A chunk at `offset` bytes of global step `step`; an empty `name`
// continues the previous variable (no definition), as the stream does.
inline v1::ExportChunk Chunk(const std::string& name, std::vector<int64_t> shape,
                             int64_t offset, std::string data, int64_t step = 7) {
  v1::ExportChunk c;
  if (!name.empty()) {
    c.mutable_def()->set_name(name);
    for (int64_t d : shape) c.mutable_def()->add_shape(d);
    c.mutable_def()->set_dtype(v1::DT_FLOAT32);
  }
  c.set_offset(offset);
  c.set_data(std::move(data));
  c.set_global_step(step);
  return c;
}

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_EXPORT_CHUNK_TEST_UTIL_H_
