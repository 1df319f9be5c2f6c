#include "ps/segment_gates.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"
#include "common/process_memory.h"
#include "common/status.h"

namespace towerps::ps {

absl::StatusOr<std::shared_ptr<common::SegmentFile>> OpenSegment(
    const v1::SharedSegment& segment) {
  TOWERPS_ASSIGN_OR_RETURN(
      common::SegmentFile file,
      common::SegmentFile::Open(segment.pid(), segment.fd(), segment.nonce(), segment.size()));
  return std::make_shared<common::SegmentFile>(std::move(file));
}

SegmentGates::SegmentGates() {
  // Sampled while mapped: a worker gives its pages back at its end, before
  // the server would look.
  janitor_ = std::thread([this] {
    for (;;) {
      absl::Duration period;
      {
        absl::MutexLock lock(&mu_);
        period = std::clamp(idle_release_ / 2, absl::Milliseconds(10), absl::Milliseconds(100));
      }
      if (stop_janitor_.WaitForNotificationWithTimeout(period)) return;
      ReleaseIdle();
    }
  });
}

SegmentGates::~SegmentGates() {
  stop_janitor_.Notify();
  janitor_.join();
}

void SegmentGates::set_idle_release(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  idle_release_ = d;
}

std::vector<std::shared_ptr<SegmentGates::Gate>> SegmentGates::All() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Gate>> gates;
  for (const auto& [nonce, gate] : gates_) gates.push_back(gate);
  return gates;
}

int SegmentGates::mapped() {
  int n = 0;
  for (const auto& gate : All()) {
    absl::MutexLock lock(&gate->mu);
    n += gate->file != nullptr;
  }
  return n;
}

void SegmentGates::NoteSharedResident() {
  const int64_t now = common::SharedResidentBytes();
  int64_t peak = peak_shared_resident_.load();
  while (now > peak && !peak_shared_resident_.compare_exchange_weak(peak, now)) {
  }
}

int64_t SegmentGates::PeakSharedResidentBytes() {
  NoteSharedResident();
  return peak_shared_resident_.load();
}

void SegmentGates::ReleaseIdle() {
  absl::Duration idle_release;
  {
    absl::MutexLock lock(&mu_);
    idle_release = idle_release_;
  }
  const absl::Time now = absl::Now();
  bool mapped = false;
  std::vector<std::shared_ptr<common::SegmentFile>> idle;  // unmapped after the locks
  for (const auto& gate : All()) {
    absl::MutexLock lock(&gate->mu);
    mapped |= gate->file != nullptr;
    if (gate->file != nullptr && now - gate->used > idle_release) {
      idle.push_back(std::move(gate->file));
      gate->file = nullptr;
    }
  }
  if (mapped) NoteSharedResident();
}

std::shared_ptr<SegmentGates::Gate> SegmentGates::GateFor(const std::string& nonce) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Gate>& gate = gates_[nonce];
  if (gate == nullptr) {
    gate = std::make_shared<Gate>();
    if (gates_.size() > 256) {  // workers come and go: forget the quiet ones
      for (auto it = gates_.begin(); it != gates_.end();) {
        bool quiet = false;
        if (it->second.use_count() == 1) {
          absl::MutexLock l(&it->second->mu);
          quiet = now - it->second->used > absl::Minutes(1);
        }
        it = quiet ? gates_.erase(it) : std::next(it);
      }
    }
  }
  return gate;
}

absl::StatusOr<std::shared_ptr<common::SegmentFile>> SegmentGates::Map(
    const v1::SharedSegment& segment, std::shared_ptr<Gate>* gate) {
  {
    absl::MutexLock lock(&mu_);
    auto it = gates_.find(segment.nonce());
    if (it != gates_.end()) *gate = it->second;
  }
  if (*gate != nullptr) {
    absl::MutexLock lock(&(*gate)->mu);
    if ((*gate)->file != nullptr && (*gate)->pid == segment.pid() &&
        (*gate)->fd == segment.fd() && (*gate)->file->size() == segment.size()) {
      (*gate)->used = absl::Now();
      return (*gate)->file;
    }
  }
  // Not mapped yet, or named another way (a new process at that pid would
  // not know the nonce: the open checks it).
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<common::SegmentFile> file, OpenSegment(segment));
  *gate = GateFor(segment.nonce());
  absl::MutexLock lock(&(*gate)->mu);
  (*gate)->file = file;
  (*gate)->pid = segment.pid();
  (*gate)->fd = segment.fd();
  (*gate)->used = absl::Now();
  return file;
}

}  // namespace towerps::ps
