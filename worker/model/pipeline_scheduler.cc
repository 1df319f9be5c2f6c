#include "worker/model/pipeline_scheduler.h"

#include <thread>

#include "common/status.h"

namespace towerps::worker {

PipelineScheduler::PipelineScheduler(int num_stages, int num_micro_batches)
    : num_stages_(num_stages), num_micro_batches_(num_micro_batches) {}

absl::Status PipelineScheduler::Run(const Step& forward, const Step& backward) {
  if (num_stages_ == 1 || num_micro_batches_ == 1) {
    return RunOnCaller(forward, backward);
  }
  {
    absl::MutexLock lock(&mu_);
    forward_done_.assign(num_stages_, 0);
    backward_done_.assign(num_stages_, 0);
    failed_ = false;
    status_.assign(num_stages_, absl::OkStatus());
  }
  std::vector<std::thread> threads;
  threads.reserve(num_stages_);
  for (int s = 0; s < num_stages_; ++s) {
    threads.emplace_back([this, s, &forward, &backward] {
      StageLoop(s, forward, backward);
    });
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu_);
  for (const absl::Status& st : status_) TOWERPS_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

absl::Status PipelineScheduler::RunOnCaller(const Step& forward,
                                            const Step& backward) {
  for (int k = 0; k < num_micro_batches_; ++k) {
    for (int s = 0; s < num_stages_; ++s) {
      TOWERPS_RETURN_IF_ERROR(forward(s, k));
    }
    if (!backward) continue;
    for (int s = num_stages_; s-- > 0;) {
      TOWERPS_RETURN_IF_ERROR(backward(s, k));
    }
  }
  return absl::OkStatus();
}

void PipelineScheduler::StageLoop(int s, const Step& forward,
                                  const Step& backward) {
  for (int k = 0; k < num_micro_batches_; ++k) {
    if (s > 0 && !WaitFor(Pass::kForward, s - 1, k)) return;
    const absl::Status st = forward(s, k);
    Finish(Pass::kForward, s, st);
    if (!st.ok()) return;
  }
  if (!backward) return;
  for (int k = 0; k < num_micro_batches_; ++k) {
    if (s + 1 < num_stages_ && !WaitFor(Pass::kBackward, s + 1, k)) return;
    const absl::Status st = backward(s, k);
    Finish(Pass::kBackward, s, st);
    if (!st.ok()) return;
  }
}

bool PipelineScheduler::WaitFor(Pass pass, int s, int k) {
  absl::MutexLock lock(&mu_);
  while (Done(pass)[s] <= k && !failed_) progress_.Wait(&mu_);
  return !failed_;
}

void PipelineScheduler::Finish(Pass pass, int s, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    failed_ = true;
    status_[s] = status;
  }
  ++Done(pass)[s];
  progress_.SignalAll();
}

std::vector<int>& PipelineScheduler::Done(Pass pass) {
  return pass == Pass::kForward ? forward_done_ : backward_done_;
}

}  // namespace towerps::worker
