// Fuzzes record files and TensorBoard event files (common/storage): the
// input is read as TFRecord-framed records, each parsed as a tb::Event; the
// same bytes, taken as float32 values, go through MakeHistogram.
// Invariants: the reader stops with OutOfRange at a clean end or DataLoss
// naming the offset, and the records it returned, framed again, are exactly
// the bytes it consumed; a histogram is refused iff a value is not finite,
// and otherwise counts every value once in increasing buckets.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/storage/event_writer.h"
#include "common/storage/record_io.h"
#include "proto/tensorboard.pb.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view buffer(reinterpret_cast<const char*>(data), size);
  towerps::common::RecordReader reader(buffer, "events.out.tfevents.fuzz");
  std::string reframed;
  while (true) {
    const int64_t before = reader.offset();
    auto record = reader.Next();
    if (!record.ok()) {
      const absl::Status& s = record.status();
      FUZZ_CHECK(s.code() == absl::StatusCode::kOutOfRange || s.code() == absl::StatusCode::kDataLoss,
                 "%s", s.ToString().c_str());
      if (s.code() == absl::StatusCode::kOutOfRange) {
        FUZZ_CHECK(before == static_cast<int64_t>(size), "OutOfRange at %lld of %zu",
                   static_cast<long long>(before), size);
      } else {
        FUZZ_CHECK(s.message().find("events.out.tfevents.fuzz") != std::string::npos,
                   "not naming the file: %s", s.ToString().c_str());
      }
      break;
    }
    FUZZ_CHECK(reader.offset() > before && reader.offset() <= static_cast<int64_t>(size),
               "offset went from %lld to %lld", static_cast<long long>(before),
               static_cast<long long>(reader.offset()));
    towerps::common::AppendRecord(*record, &reframed);
    towerps::tb::Event event;
    if (event.ParseFromArray(record->data(), static_cast<int>(record->size()))) {
      (void)event.ByteSizeLong();
    }
  }
  FUZZ_CHECK(reframed == buffer.substr(0, reframed.size()) &&
                 static_cast<int64_t>(reframed.size()) == reader.offset(),
             "records framed again differ from the bytes read");

  std::vector<float> values(size / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), data, values.size() * sizeof(float));
  bool finite = true;
  for (float v : values) finite = finite && std::isfinite(v);
  auto histogram = towerps::common::MakeHistogram(values);
  FUZZ_CHECK(histogram.ok() == finite, "%s", histogram.status().ToString().c_str());
  if (histogram.ok()) {
    FUZZ_CHECK(histogram->num() == static_cast<double>(values.size()), "num %f",
               histogram->num());
    FUZZ_CHECK(histogram->bucket_size() == histogram->bucket_limit_size(), "bucket counts");
    double counted = 0;
    for (int i = 0; i < histogram->bucket_size(); ++i) {
      counted += histogram->bucket(i);
      FUZZ_CHECK(i == 0 || histogram->bucket_limit(i) > histogram->bucket_limit(i - 1),
                 "bucket limits do not increase at %d", i);
    }
    FUZZ_CHECK(counted == histogram->num(), "buckets count %f of %f values", counted,
               histogram->num());
    FUZZ_CHECK(values.empty() || histogram->min() <= histogram->max(), "min > max");
  }
  return 0;
}
