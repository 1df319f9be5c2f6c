#include "common/storage/event_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/storage/file_util.h"

namespace towerps::common {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";

// TensorFlow's default bucket limits, positive half: 1e-12 growing by 10%
// while below 1e20, then DBL_MAX. Built by repeated multiplication exactly as
// TensorFlow does, so that our limits are bit-identical to its.
//
// Finding a value's bucket without a search: a float's top 16 bits (sign,
// exponent, 7 mantissa bits) name a cell [lo, hi) of values of one sign
// with hi / lo <= 129/128 (exponent 0: all below FLT_MIN, far below the
// first limit). Limits grow by 10% > 1/128, so at most one limit lies inside
// a cell: the cell's entry holds the bucket of the values below that limit
// (`base`), the limit as the smallest float a value must reach to pass it
// (`pass`), and where passing it moves the bucket (`step`: +1 for positive
// values, -1 for negative ones, whose buckets count down from zero). One
// load and one compare per value, no branch on its sign; NaN and infinity
// (exponent 255) land in a bucket of their own past the real ones.
struct BucketTable {
  struct Cell {
    float pass;
    int16_t base;
    int16_t step;
  };
  std::vector<double> positive;
  std::vector<Cell> cells;  // 1 << 16, by the float's top 16 bits
  int non_finite;           // the bucket NaN and infinity are counted in
};

// The smallest float >= v (strict: > v) for v >= 0; +inf where no finite
// float is.
float FloatAtLeast(double v, bool strict) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (v > FLT_MAX || (strict && v == FLT_MAX)) return kInf;
  float f = static_cast<float>(v);  // the nearest: the float below it is < v
  if (f < v || (strict && f == v)) f = std::nextafter(f, kInf);
  return f;
}

const BucketTable& Table() {
  static const BucketTable* const table = [] {
    auto* t = new BucketTable;
    std::vector<double>& p = t->positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) p.push_back(v);
    p.push_back(DBL_MAX);
    const int n = static_cast<int>(p.size()) - 1;
    const int zero = n + 1;  // as in MakeHistogram
    t->non_finite = 2 * n + 3;
    t->cells.resize(1 << 16);
    for (uint32_t key = 0; key < (1u << 16); ++key) {
      BucketTable::Cell& c = t->cells[key];
      const bool negative = (key & 0x8000) != 0;
      if ((key & 0x7f80) == 0x7f80) {  // exponent 255: infinity or NaN
        c = {std::numeric_limits<float>::infinity(), static_cast<int16_t>(t->non_finite), 0};
        continue;
      }
      const uint32_t lo_bits = (key & 0x7fff) << 16;
      float lo;
      std::memcpy(&lo, &lo_bits, sizeof(lo));
      // Limits already passed at lo: <= lo for positive values (bucket i
      // holds [limit(i-1), limit(i))), < |lo| for negative ones.
      const int below = static_cast<int>(
          negative ? std::lower_bound(p.begin(), p.end(), double{lo}) - p.begin()
                   : std::upper_bound(p.begin(), p.end(), double{lo}) - p.begin());
      c.pass = FloatAtLeast(p[below], /*strict=*/negative);
      c.base = static_cast<int16_t>(negative ? zero - below : zero + 1 + below);
      c.step = static_cast<int16_t>(negative ? -1 : 1);
    }
    return t;
  }();
  return *table;
}

double WallTimeNow(absl::Time now) {
  return absl::ToDoubleSeconds(now - absl::UnixEpoch());
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<tb::HistogramProto> MakeHistogram(
    absl::Span<const float> values) {
  const BucketTable& table = Table();
  const std::vector<double>& p = table.positive;
  const int n = static_cast<int>(p.size()) - 1;  // p[n] == DBL_MAX
  // Full limits: -p[n] .. -p[0], 0, p[0] .. p[n]; zero sits at index n + 1,
  // and counts[table.non_finite] (past them) counts NaN and infinity.
  const int zero = n + 1;
  std::vector<int64_t> counts(2 * n + 4, 0);
  const BucketTable::Cell* cells = table.cells.data();
  float min = FLT_MAX, max = -FLT_MAX;
  double sum = 0, sum_squares = 0;
  for (const float x : values) {
    const float y = x + 0.0f;  // -0 is +0 (in bucket [0, 1e-12)); the rest unchanged
    uint32_t bits;
    std::memcpy(&bits, &y, sizeof(bits));
    const BucketTable::Cell& c = cells[bits >> 16];
    ++counts[c.base + (std::fabs(y) >= c.pass ? c.step : 0)];
    min = std::min(min, x);
    max = std::max(max, x);
    const double d = x;
    sum += d;
    sum_squares += d * d;
  }
  const int64_t non_finite = counts[table.non_finite];
  counts.pop_back();
  if (non_finite > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("histogram of ", values.size(), " values has ", non_finite,
                     " NaN or infinite"));
  }

  tb::HistogramProto h;
  h.set_num(static_cast<double>(values.size()));
  if (values.empty()) return h;  // min = max = 0, no buckets.
  h.set_min(min);
  h.set_max(max);
  h.set_sum(sum);
  h.set_sum_squares(sum_squares);
  auto limit = [&](int i) {
    return i < zero ? -p[n - i] : i == zero ? 0.0 : p[i - zero - 1];
  };
  const int size = static_cast<int>(counts.size());
  for (int i = 0; i < size;) {
    double end = limit(i);
    const int64_t count = counts[i++];
    if (count == 0) {
      // One zero bucket for the whole run of empty ones, ending where the run
      // ends, so that the next bucket's left edge stays right.
      while (i < size && counts[i] == 0) end = limit(i++);
    }
    h.add_bucket_limit(end);
    h.add_bucket(static_cast<double>(count));
  }
  return h;
}

EventWriter::EventWriter(std::string path, std::unique_ptr<RecordWriter> writer)
    : path_(std::move(path)), writer_(std::move(writer)) {}

EventWriter::~EventWriter() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(
    const std::string& log_dir) {
  TOWERPS_RETURN_IF_ERROR(MakeDirs(log_dir));
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    return absl::InternalError(absl::StrCat("gethostname: ", strerror(errno)));
  }
  const absl::Time now = absl::Now();
  const std::string base =
      absl::StrFormat("%s/events.out.tfevents.%010d.%s", log_dir,
                      absl::ToUnixSeconds(now), host);
  std::string path = base;
  for (int k = 1; Exists(path); ++k) path = absl::StrCat(base, ".", k);

  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<RecordWriter> writer,
                           RecordWriter::Open(path, /*append=*/false));
  std::unique_ptr<EventWriter> event_writer(
      new EventWriter(path, std::move(writer)));
  tb::Event version;
  version.set_wall_time(WallTimeNow(now));
  version.set_file_version(kFileVersion);
  TOWERPS_RETURN_IF_ERROR(event_writer->WriteEvent(version));
  TOWERPS_RETURN_IF_ERROR(event_writer->Flush());
  return event_writer;
}

absl::Status EventWriter::AddScalar(const std::string& tag, int64_t step,
                                    double value) {
  tb::Event event;
  event.set_wall_time(WallTimeNow(absl::Now()));
  event.set_step(step);
  tb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  return WriteEvent(event);
}

absl::Status EventWriter::AddHistogram(const std::string& tag, int64_t step,
                                       absl::Span<const float> values) {
  absl::StatusOr<tb::HistogramProto> histo = MakeHistogram(values);
  if (!histo.ok())
    return Annotate(histo.status(), absl::StrCat(path_, ": tag ", tag));
  tb::Event event;
  event.set_wall_time(WallTimeNow(absl::Now()));
  event.set_step(step);
  tb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  *v->mutable_histo() = *std::move(histo);
  return WriteEvent(event);
}

absl::Status EventWriter::WriteEvent(const tb::Event& event) {
  const std::string bytes = event.SerializeAsString();
  absl::MutexLock lock(&mu_);
  return writer_->Write(bytes);
}

absl::Status EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  return writer_->Flush();
}

absl::Status EventWriter::Close() {
  absl::MutexLock lock(&mu_);
  return writer_->Close();
}

}  // namespace towerps::common
