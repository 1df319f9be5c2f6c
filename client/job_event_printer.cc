#include "client/job_event_printer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/text_table.h"
#include "google/protobuf/util/json_util.h"

namespace towerps::client {
namespace {

constexpr double kRateWindowS = 30;
// Erases the rest of the terminal line (ANSI "erase in line").
constexpr char kClearLine[] = "\r\x1b[K";

std::string StepOfTotal(const v1::Metrics& m) {
  if (m.total_steps() > 0) return absl::StrCat(m.step(), "/", m.total_steps());
  return absl::StrCat(m.step());
}

std::string ClockTime(double unix_seconds) {
  if (unix_seconds == 0) return "--:--:--";
  return absl::FormatTime("%H:%M:%S",
                          absl::FromUnixMicros(static_cast<int64_t>(unix_seconds * 1e6)),
                          absl::LocalTimeZone());
}

// The whole job's rate (every worker's), or the chief's from a worker that
// reports only its own.
double JobExamplesPerS(const v1::Metrics& m) {
  return m.job_examples_per_s() > 0 ? m.job_examples_per_s() : m.examples_per_s();
}

}  // namespace

std::string MetricsSummary(const v1::Metrics& m) {
  std::string s;
  if (m.epochs() > 0) absl::StrAppend(&s, "epoch ", m.epoch(), "/", m.epochs(), "  ");
  absl::StrAppend(&s, "step ", StepOfTotal(m));
  absl::StrAppend(&s, absl::StrFormat("  loss %.4f", m.loss()));
  if (m.has_accuracy()) absl::StrAppend(&s, absl::StrFormat("  acc %.4f", m.accuracy()));
  if (m.has_test()) {
    absl::StrAppend(&s, absl::StrFormat("  test_loss %.4f", m.test_loss()));
    if (m.has_accuracy())
      absl::StrAppend(&s, absl::StrFormat("  test_acc %.4f", m.test_accuracy()));
  }
  if (JobExamplesPerS(m) > 0) {
    absl::StrAppend(&s, absl::StrFormat("  %.0f ex/s", JobExamplesPerS(m)));
  }
  if (m.learning_rate() > 0) absl::StrAppend(&s, absl::StrFormat("  lr %.3g", m.learning_rate()));
  return s;
}

std::string EventLine(const v1::JobEvent& e) {
  std::string line = absl::StrCat(ClockTime(e.time()), " ");
  switch (e.kind()) {
    case v1::JobEvent::LOG:
      absl::StrAppend(&line, "LOG       ", e.message());
      break;
    case v1::JobEvent::PROGRESS:
      absl::StrAppend(&line, "PROGRESS  ", MetricsSummary(e.metrics()));
      break;
    case v1::JobEvent::EPOCH:
      absl::StrAppend(&line, "EPOCH     ", MetricsSummary(e.metrics()));
      if (!e.message().empty()) absl::StrAppend(&line, "  ", e.message());
      break;
    case v1::JobEvent::STATE:
      absl::StrAppend(&line, "STATE     ", v1::JobState_Name(e.state()));
      if (!e.message().empty()) absl::StrAppend(&line, ": ", e.message());
      break;
    default:
      absl::StrAppend(&line, "EVENT ", static_cast<int>(e.kind()), "  ", e.message());
  }
  std::replace(line.begin(), line.end(), '\r', ' ');
  return line;
}

std::string ProgressBar(const v1::Metrics& m, double eta_s, int bar_width) {
  std::string s;
  if (m.epochs() > 0) absl::StrAppend(&s, "epoch ", m.epoch(), "/", m.epochs(), " ");
  double frac = m.total_steps() > 0 ? static_cast<double>(m.step()) / m.total_steps() : 0;
  frac = std::clamp(frac, 0.0, 1.0);
  const int filled = static_cast<int>(std::lround(frac * bar_width));
  absl::StrAppend(&s, "[", std::string(filled, '#'), std::string(bar_width - filled, '.'), "] ",
                  StepOfTotal(m));
  absl::StrAppend(&s, absl::StrFormat("  loss %.4f", m.loss()));
  if (m.has_accuracy()) absl::StrAppend(&s, absl::StrFormat("  acc %.4f", m.accuracy()));
  absl::StrAppend(&s, absl::StrFormat("  %.0f ex/s", JobExamplesPerS(m)));
  absl::StrAppend(&s, absl::StrFormat("  lr %.3g", m.learning_rate()));
  absl::StrAppend(&s, "  ETA ", eta_s < 0 ? "?" : HumanDuration(eta_s));
  return s;
}

JobEventPrinter::JobEventPrinter(std::ostream& out, Style style) : out_(out), style_(style) {}

double JobEventPrinter::EtaSeconds() const {
  if (!have_metrics_ || last_.total_steps() <= 0 || window_.size() < 2) return -1;
  const double dt = window_.back().first - window_.front().first;
  const int64_t dsteps = window_.back().second - window_.front().second;
  if (dt <= 0 || dsteps <= 0) return -1;
  return std::max<int64_t>(0, last_.total_steps() - last_.step()) * dt / dsteps;
}

void JobEventPrinter::DrawBar() {
  out_ << kClearLine << ProgressBar(last_, EtaSeconds()) << std::flush;
  bar_shown_ = true;
}

void JobEventPrinter::Print(const v1::JobEvent& e) {
  if (style_ == Style::kJson) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(e, &json, options);
    out_ << json << "\n" << std::flush;
    return;
  }
  const bool has_metrics = e.kind() == v1::JobEvent::PROGRESS || e.kind() == v1::JobEvent::EPOCH;
  if (has_metrics) {
    last_ = e.metrics();
    have_metrics_ = true;
    if (!window_.empty() && e.metrics().step() < window_.back().second)
      window_.clear();  // A restart.
    window_.emplace_back(e.time(), e.metrics().step());
    while (window_.size() > 2 && window_.back().first - window_.front().first > kRateWindowS) {
      window_.pop_front();
    }
  }
  if (style_ == Style::kPlain) {
    out_ << EventLine(e) << "\n" << std::flush;
    return;
  }
  // Terminal: progress only moves the bar; everything else goes above it.
  if (e.kind() != v1::JobEvent::PROGRESS) {
    if (bar_shown_) out_ << kClearLine;
    out_ << EventLine(e) << "\n";
    bar_shown_ = false;
  }
  if (have_metrics_) {
    DrawBar();
  } else {
    out_ << std::flush;
  }
}

void JobEventPrinter::Finish() {
  if (bar_shown_) out_ << "\n" << std::flush;
  bar_shown_ = false;
}

}  // namespace towerps::client
