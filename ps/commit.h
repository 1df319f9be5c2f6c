// A step's update on a parameter server, run after the push that completed
// the step was answered (ParameterServer::FinishPush, RunLater).
#ifndef TOWERPS_PS_COMMIT_H_
#define TOWERPS_PS_COMMIT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ps/gradient_part.h"
#include "ps/publication.h"

namespace towerps::ps {

namespace internal {
class Job;
struct Variable;
}

// The update a push completes, handed to the caller of
// ParameterServer::FinishPush so that it can answer the push first: the
// step has already advanced (the push is answered APPLIED, pulls of the new
// step are served), and Run updates the variables one by one in var_index
// order (the order forward needs them), publishing each as soon as it is
// final, so that a worker's next forward starts on its first layers while
// the server still updates the last. Until Run returns, the job's other
// writers wait for it: pushes, saves and its deletion. Thread-compatible:
// run it once, at once (ParameterServer::RunLater does, on its updater
// thread); the destructor runs it if nobody did.
class Commit {
 public:
  ~Commit();
  Commit(const Commit&) = delete;
  Commit& operator=(const Commit&) = delete;

  void Run();

 private:
  friend class ParameterServer;
  Commit() = default;
  // Variable `v`'s weighted mean of parts_, formed, and the sum of its
  // |elements| in *abs_sum; empty when it is not finite (logged; the
  // variable keeps its values this step).
  absl::Span<const float> FormMean(size_t v, double* abs_sum);
  // Applies `mean` (of `abs_sum`) to variable `v` and writes its new
  // values to copies_: in place where its bounds show that nothing can
  // overflow (the rule: measured afresh where the bounds grew too large);
  // else on the values and slots with a copy of them kept, which they go
  // back to (logged) if anything came out not finite. Returns whether the
  // update was applied.
  bool Update(size_t v, internal::Variable& var, absl::Span<const float> mean, double abs_sum);
  std::shared_ptr<internal::Job> job_;
  std::shared_ptr<Publication> publication_;
  // The gradients to average, by ascending worker, with their weights
  // (examples over the step's total): the mean is formed variable by
  // variable, just before that variable is updated, in the first one's
  // buffer where it has one, else in the job's scratch buffer (one
  // variable's size).
  std::vector<GradientPart> parts_;
  // By var_index: 1 where the new values were formed ahead in parts_[0]
  // (then parts_ has that one part, of weight 1) and already swapped in by
  // Job::BeginCommitLocked, so that parts_[0] holds the old ones: Run only
  // publishes them.
  std::vector<char> prepared_;
  std::vector<float*> copies_;  // Run's: where one variable's new values go as well
  std::function<void(size_t)> after_publish_;
  std::function<void(const std::string&)> on_update_skipped_;
  bool done_ = false;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_COMMIT_H_
