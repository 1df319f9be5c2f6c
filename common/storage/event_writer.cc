#include "common/storage/event_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
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
// Finding a value's bucket: a float's exponent names its octave [2^e,
// 2^(e+1)), and at most 8 limits (1.1^8 > 2) lie in one octave, so starting
// from the first limit at or above 2^e a short linear walk finds the bucket;
// no binary search over the ~770 limits per value.
struct BucketTable {
  std::vector<double> positive;
  // first[b]: the number of positive limits below 2^(b - 127), the smallest
  // float with biased exponent b (b >= 1); first[0] = 0 (zero, subnormals).
  std::array<int, 256> first;
};

const BucketTable& Table() {
  static const BucketTable* const table = [] {
    auto* t = new BucketTable;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) t->positive.push_back(v);
    t->positive.push_back(DBL_MAX);
    t->first[0] = 0;
    for (int b = 1; b < 256; ++b) {
      const double octave_start = std::ldexp(1.0, b - 127);
      int j = 0;
      while (t->positive[j] < octave_start) ++j;  // DBL_MAX stops it.
      t->first[b] = j;
    }
    return t;
  }();
  return *table;
}

int BiasedExponent(float magnitude) {
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  return static_cast<int>((bits >> 23) & 0xff);
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
  // Full limits: -p[n] .. -p[0], 0, p[0] .. p[n]; zero sits at index n + 1.
  // upper_bound(limits, x) is the bucket of x:
  //   x >= 0: n + 2 + #{j : p[j] <= x}
  //   x < 0:  n + 1 - #{j : p[j] < -x}
  const int zero = n + 1;
  std::vector<int64_t> counts(2 * n + 3, 0);
  double min = DBL_MAX, max = -DBL_MAX, sum = 0, sum_squares = 0;
  int64_t non_finite = 0;
  for (const float x : values) {
    if (!std::isfinite(x)) {
      ++non_finite;
      continue;
    }
    const double a = std::fabs(static_cast<double>(x));
    int j = table.first[BiasedExponent(std::fabs(x))];
    if (x >= 0) {
      while (p[j] <= a) ++j;
      ++counts[zero + 1 + j];
    } else {
      while (p[j] < a) ++j;
      ++counts[zero - j];
    }
    const double d = x;
    min = std::min(min, d);
    max = std::max(max, d);
    sum += d;
    sum_squares += d * d;
  }
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
