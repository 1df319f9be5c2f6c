#include "worker/device/cpu_thread_tuner.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace towerps::worker {
namespace {

double Median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t mid = xs.size() / 2;
  return xs.size() % 2 == 1 ? xs[mid] : (xs[mid - 1] + xs[mid]) / 2;
}

}  // namespace

CpuThreadTuner::CpuThreadTuner(int max_threads, Options options)
    : max_threads_(std::max(1, max_threads)),
      options_([&] {
        options.warmup = std::max(0, options.warmup);
        options.window = std::max(1, options.window);
        options.first_interval = std::max<int64_t>(1, options.first_interval);
        options.max_interval = std::max(options.first_interval, options.max_interval);
        return options;
      }()),
      chosen_(max_threads_),
      candidate_(max_threads_),
      running_(max_threads_),
      interval_(options_.first_interval),
      steps_at_(max_threads_ + 1, 0) {
  left_ = options_.warmup;
  if (left_ == 0) StartRound();
}

void CpuThreadTuner::StartRound() {
  if (chosen_ > 1) {
    Compare(std::max(1, chosen_ / 2));
  } else if (chosen_ < max_threads_) {
    Compare(std::min(max_threads_, chosen_ * 2));
  } else {
    phase_ = Phase::kIdle;  // one thread at most: nothing to compare, ever
    left_ = INT64_MAX;
  }
}

void CpuThreadTuner::Compare(int candidate) {
  phase_ = Phase::kCompare;
  candidate_ = candidate;
  pos_ = 0;
  chosen_samples_.clear();
  candidate_samples_.clear();
  running_ = CountAt(0);
}

void CpuThreadTuner::Idle() {
  phase_ = Phase::kIdle;
  running_ = chosen_;
  left_ = interval_;
  interval_ = std::min(options_.max_interval, interval_ * 2);
}

int CpuThreadTuner::CountAt(int64_t pos) const {
  return (pos / 2) % 2 == 0 ? candidate_ : chosen_;
}

std::string CpuThreadTuner::StepsPerCount() const {
  std::vector<std::string> parts;
  for (int t = max_threads_; t >= 1; --t) {
    if (steps_at_[t] == 0) continue;
    parts.push_back(absl::StrFormat("%d thread%s %d step%s", t, t == 1 ? "" : "s", steps_at_[t],
                                    steps_at_[t] == 1 ? "" : "s"));
  }
  return parts.empty() ? "no steps" : absl::StrJoin(parts, ", ");
}

CpuThreadTuner::Decision CpuThreadTuner::OnStep(double compute_s) {
  Decision d;
  ++steps_at_[running_];
  switch (phase_) {
    case Phase::kWarmup:
    case Phase::kIdle:
      if (left_ != INT64_MAX && --left_ <= 0) StartRound();
      break;
    case Phase::kCompare: {
      // The second step of each block counts.
      if (pos_ % 2 == 1) {
        (running_ == candidate_ ? candidate_samples_ : chosen_samples_).push_back(compute_s);
      }
      ++pos_;
      const size_t n = static_cast<size_t>(options_.window);
      if (chosen_samples_.size() < n || candidate_samples_.size() < n) {
        running_ = CountAt(pos_);
        break;
      }
      const double current = Median(chosen_samples_);
      const double tried = Median(candidate_samples_);
      const bool down = candidate_ < chosen_;
      if (tried < options_.margin * current) {
        d.change = absl::StrFormat(
            "%d CPU math thread(s) instead of %d: a step's compute took %.3g ms against %.3g "
            "(medians of %d steps each, the two alternating)",
            candidate_, chosen_, tried * 1e3, current * 1e3, options_.window);
        chosen_ = candidate_;
        interval_ = options_.first_interval;
        // Further the same way while it helps.
        if (down && chosen_ > 1) {
          Compare(std::max(1, chosen_ / 2));
        } else if (!down && chosen_ < max_threads_) {
          Compare(std::min(max_threads_, chosen_ * 2));
        } else {
          Idle();
        }
      } else if (down && chosen_ < max_threads_) {
        Compare(std::min(max_threads_, chosen_ * 2));
      } else {
        Idle();
      }
      break;
    }
  }
  d.threads = running_;
  return d;
}

}  // namespace towerps::worker
