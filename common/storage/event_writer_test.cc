#include "common/storage/event_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "gtest/gtest.h"
#include "proto/tensorboard.pb.h"

namespace towerps::common {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp ? tmp : "/tmp", "/event_writer_test/", name);
  EXPECT_TRUE(RemoveAll(dir).ok());
  return dir;
}

std::vector<tb::Event> ReadEvents(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  EXPECT_TRUE(contents.ok()) << contents.status();
  std::vector<tb::Event> events;
  if (!contents.ok()) return events;
  RecordReader reader(*contents, path);
  while (true) {
    absl::StatusOr<absl::string_view> record = reader.Next();
    if (!record.ok()) {
      EXPECT_EQ(record.status().code(), absl::StatusCode::kOutOfRange)
          << record.status();
      break;
    }
    tb::Event event;
    EXPECT_TRUE(
        event.ParseFromArray(record->data(), static_cast<int>(record->size())));
    events.push_back(std::move(event));
  }
  return events;
}

// TensorFlow's default limits and bucketing, the slow way: the reference.
std::vector<double> TfLimits() {
  std::vector<double> pos, neg;
  for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) {
    pos.push_back(v);
    neg.push_back(-v);
  }
  pos.push_back(DBL_MAX);
  neg.push_back(-DBL_MAX);
  std::reverse(neg.begin(), neg.end());
  std::vector<double> limits = neg;
  limits.push_back(0.0);
  limits.insert(limits.end(), pos.begin(), pos.end());
  return limits;
}

// Expands an encoded histogram back to one count per default bucket.
std::vector<double> Expand(const tb::HistogramProto& h,
                           const std::vector<double>& limits) {
  std::vector<double> counts(limits.size(), 0);
  size_t i = 0;
  for (int k = 0; k < h.bucket_limit_size(); ++k) {
    while (i < limits.size() && limits[i] != h.bucket_limit(k)) ++i;
    EXPECT_LT(i, limits.size())
        << "limit " << h.bucket_limit(k) << " is not a default limit";
    if (i == limits.size()) break;
    counts[i] = h.bucket(k);
  }
  return counts;
}

TEST(MakeHistogramTest, MatchesUpperBoundBucketingOfTensorFlow) {
  const std::vector<double> limits = TfLimits();
  ASSERT_EQ(limits.size() % 2, 1u);
  std::vector<float> values = {
      0.0f,    -0.0f,
      1e-30f,  -1e-30f,
      1.0f,    -1.0f,
      FLT_MAX, -FLT_MAX,
      FLT_MIN, std::numeric_limits<float>::denorm_min(),
      3e25f};
  // Values at and beside every limit that a float can come near.
  for (double l : limits) {
    if (std::fabs(l) > FLT_MAX || (l != 0 && std::fabs(l) < 1e-30)) continue;
    const float f = static_cast<float>(l);
    values.push_back(f);
    values.push_back(std::nextafter(f, -FLT_MAX));
    values.push_back(std::nextafter(f, FLT_MAX));
  }
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> exponent(-40.0, 35.0);
  for (int i = 0; i < 20000; ++i) {
    values.push_back(
        static_cast<float>(normal(rng) * std::pow(10.0, exponent(rng))));
  }

  std::vector<double> want(limits.size(), 0);
  double sum = 0;
  for (float v : values) {
    ++want[std::upper_bound(limits.begin(), limits.end(),
                            static_cast<double>(v)) -
           limits.begin()];
    sum += v;
  }
  absl::StatusOr<tb::HistogramProto> h = MakeHistogram(values);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(Expand(*h, limits), want);
  EXPECT_EQ(h->num(), values.size());
  EXPECT_EQ(h->min(), -FLT_MAX);
  EXPECT_EQ(h->max(), FLT_MAX);
  EXPECT_EQ(h->sum(), sum);
}

// Every cell of 16 leading bits (sign, exponent, 7 mantissa bits) that
// holds finite floats (MakeHistogram's table is indexed by them): its first
// two floats, its middle and its last two, bucketed as upper_bound over the
// limits would. (The test above has the floats at and beside each limit.)
TEST(MakeHistogramTest, EveryCellOfLeadingBitsMatchesUpperBound) {
  const std::vector<double> limits = TfLimits();
  std::vector<float> values;
  for (uint32_t key = 0; key < (1u << 16); ++key) {
    if ((key & 0x7f80) == 0x7f80) continue;  // infinity and NaN
    for (uint32_t low : {0u, 1u, 0x8000u, 0xfffeu, 0xffffu}) {
      const uint32_t bits = (key << 16) | low;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      values.push_back(f);
    }
  }
  std::vector<double> want(limits.size(), 0);
  for (float v : values) {
    ++want[std::upper_bound(limits.begin(), limits.end(), static_cast<double>(v)) -
           limits.begin()];
  }
  absl::StatusOr<tb::HistogramProto> h = MakeHistogram(values);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(Expand(*h, limits), want);
  EXPECT_EQ(h->num(), values.size());
}

TEST(MakeHistogramTest, CollapsesEmptyRunsKeepingLeftEdges) {
  absl::StatusOr<tb::HistogramProto> h =
      MakeHistogram({1.0f, 1.0f, 2.0f, -3.0f});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->num(), 4);
  EXPECT_EQ(h->min(), -3);
  EXPECT_EQ(h->max(), 2);
  EXPECT_EQ(h->sum(), 1);
  EXPECT_EQ(h->sum_squares(), 15);
  ASSERT_EQ(h->bucket_size(), h->bucket_limit_size());
  double total = 0;
  for (int i = 0; i < h->bucket_size(); ++i) {
    total += h->bucket(i);
    if (i == 0) continue;
    EXPECT_LT(h->bucket_limit(i - 1), h->bucket_limit(i));
    // Never two empty buckets in a row.
    EXPECT_FALSE(h->bucket(i) == 0 && h->bucket(i - 1) == 0) << i;
  }
  EXPECT_EQ(total, 4);
  // Three value groups, separated and surrounded by empty runs: 7 buckets,
  // the last ending at DBL_MAX.
  EXPECT_EQ(h->bucket_size(), 7);
  EXPECT_EQ(h->bucket_limit(h->bucket_limit_size() - 1), DBL_MAX);
  // The bucket holding 1.0 is [limit, next limit) with limit <= 1 < next.
  EXPECT_LE(h->bucket_limit(2), 1.0);
  EXPECT_GT(h->bucket_limit(3), 1.0);
  EXPECT_EQ(h->bucket(3), 2);
}

TEST(MakeHistogramTest, EmptyValuesGiveAnEmptyHistogram) {
  absl::StatusOr<tb::HistogramProto> h = MakeHistogram({});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->num(), 0);
  EXPECT_EQ(h->min(), 0);
  EXPECT_EQ(h->max(), 0);
  EXPECT_EQ(h->bucket_size(), 0);
  EXPECT_EQ(h->bucket_limit_size(), 0);
}

TEST(MakeHistogramTest, NonFiniteValuesAreInvalidArgument) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    absl::StatusOr<tb::HistogramProto> h = MakeHistogram({1.0f, bad, 2.0f});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(h.status().message(), "1 NaN or infinite"))
        << h.status();
  }
}

TEST(EventWriterTest, WritesVersionScalarsAndHistograms) {
  const std::string dir =
      TestDir("basic") + "/a/b";  // created with its parents
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::StatusOr<std::unique_ptr<EventWriter>> w = EventWriter::Create(dir);
  ASSERT_TRUE(w.ok()) << w.status();

  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string name = (*w)->path().substr(dir.size() + 1);
  ASSERT_TRUE(absl::StartsWith((*w)->path(), dir + "/events.out.tfevents."))
      << (*w)->path();
  const std::string seconds = name.substr(strlen("events.out.tfevents."), 10);
  EXPECT_TRUE(std::all_of(seconds.begin(), seconds.end(), ::isdigit)) << name;
  EXPECT_EQ(name.substr(strlen("events.out.tfevents.") + 10),
            absl::StrCat(".", host));

  // The version record is on disk before anything else is flushed.
  std::vector<tb::Event> events = ReadEvents((*w)->path());
  ASSERT_EQ(events.size(), 1u);

  for (int s = 0; s < 5; ++s)
    ASSERT_TRUE((*w)->AddScalar("loss", s, 1.0 / (s + 1)).ok());
  const std::vector<float> values = {-2.5f, -0.001f, 0.0f, 0.5f,
                                     0.5f,  3.0f,    1e6f};
  ASSERT_TRUE((*w)->AddHistogram("dense/kernel", 7, values).ok());
  ASSERT_TRUE((*w)->AddHistogram("empty", 8, {}).ok());
  ASSERT_TRUE((*w)->Flush().ok());

  events = ReadEvents((*w)->path());
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GE(events[0].wall_time(), std::floor(before));
  EXPECT_EQ(static_cast<int64_t>(events[0].wall_time()), std::stoll(seconds));
  for (int s = 0; s < 5; ++s) {
    const tb::Event& e = events[1 + s];
    EXPECT_EQ(e.step(), s);
    EXPECT_GE(e.wall_time(), events[0].wall_time());
    ASSERT_EQ(e.summary().value_size(), 1);
    EXPECT_EQ(e.summary().value(0).tag(), "loss");
    EXPECT_EQ(e.summary().value(0).simple_value(),
              static_cast<float>(1.0 / (s + 1)));
  }
  const tb::Event& he = events[6];
  EXPECT_EQ(he.step(), 7);
  ASSERT_EQ(he.summary().value_size(), 1);
  EXPECT_EQ(he.summary().value(0).tag(), "dense/kernel");
  const tb::HistogramProto& h = he.summary().value(0).histo();
  EXPECT_EQ(h.num(), 7);
  EXPECT_EQ(h.min(), -2.5);
  EXPECT_EQ(h.max(), 1e6);
  double sum = 0, sum_squares = 0, total = 0;
  for (float v : values) sum += v, sum_squares += double{v} * v;
  EXPECT_DOUBLE_EQ(h.sum(), sum);
  EXPECT_DOUBLE_EQ(h.sum_squares(), sum_squares);
  for (double c : h.bucket()) total += c;
  EXPECT_EQ(total, h.num());

  const tb::HistogramProto& empty = events[7].summary().value(0).histo();
  EXPECT_TRUE(events[7].summary().value(0).has_histo());
  EXPECT_EQ(empty.num(), 0);
  EXPECT_EQ(empty.bucket_size(), 0);

  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->AddScalar("loss", 9, 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Flush().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EventWriterTest, NonFiniteHistogramWritesNothing) {
  absl::StatusOr<std::unique_ptr<EventWriter>> w =
      EventWriter::Create(TestDir("nan"));
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Status s =
      (*w)->AddHistogram("w", 1, std::vector<float>{1.0f, NAN});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "tag w")) << s;
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(ReadEvents((*w)->path()).size(), 1u);
}

TEST(EventWriterTest, TwoWritersInOneDirectoryGetTwoFiles) {
  const std::string dir = TestDir("two");
  absl::StatusOr<std::unique_ptr<EventWriter>> a = EventWriter::Create(dir);
  absl::StatusOr<std::unique_ptr<EventWriter>> b = EventWriter::Create(dir);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  ASSERT_TRUE((*a)->AddScalar("x", 1, 1).ok());
  ASSERT_TRUE((*a)->Close().ok());
  ASSERT_TRUE((*b)->Close().ok());
  EXPECT_EQ(ReadEvents((*a)->path()).size(), 2u);
  EXPECT_EQ(ReadEvents((*b)->path()).size(), 1u);
}

TEST(EventWriterTest, CreateFailsWhereTheDirectoryCannotBe) {
  const std::string dir = TestDir("blocked");
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  absl::StatusOr<std::unique_ptr<EventWriter>> w =
      EventWriter::Create(dir + "/file/logs");
  EXPECT_FALSE(w.ok());
  EXPECT_TRUE(absl::StrContains(w.status().message(), dir + "/file"))
      << w.status();
}

TEST(EventWriterTest, ConcurrentWritersAppendWholeRecords) {
  absl::StatusOr<std::unique_ptr<EventWriter>> w =
      EventWriter::Create(TestDir("threads"));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<std::thread> threads;
  const std::vector<float> values(1000, 0.25f);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int s = 0; s < 200; ++s) {
        EXPECT_TRUE((*w)->AddScalar(absl::StrCat("t", t), s, s).ok());
        if (s % 50 == 0) {
          EXPECT_TRUE((*w)->AddHistogram(absl::StrCat("h", t), s, values).ok());
          EXPECT_TRUE((*w)->Flush().ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(ReadEvents((*w)->path()).size(), 1u + 4 * 200 + 4 * 4);
}

}  // namespace
}  // namespace towerps::common
