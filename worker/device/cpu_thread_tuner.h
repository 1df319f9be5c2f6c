// CpuThreadTuner: the CPU math thread count that runs a worker's steps
// fastest now, found by trying fewer (and again more) between steps.
//
// On a host where other processes keep cores busy, an OpenBLAS team as wide
// as the worker's share of the cores loses members to them in nearly every
// call and waits for them: on 2 cores with one busy process beside it, the
// MLP's compute alone ran 15-18k examples/s with 2 threads and 46-51k with
// 1 (tests/bench/worker_throughput, 2026-12-02). The thread count that
// CpuThreadsPerTower picks at the start cannot see such load, nor load that
// comes and goes, so the worker may let a tuner move it (--adapt_blas_threads).
//
// The tuner only decides; the caller measures each step's compute and
// applies the count (SetCpuMathThreads) between steps. A round compares the
// current count with half as many threads (then, below the most, with twice
// as many), the two alternating in blocks of two steps, so that both see
// the same load as it drifts; the first step of each block is not counted
// (a team that grew wakes threads that slept). A count is taken when its
// median over `window` steps is below `margin` times the current one's (a
// step disturbed once does not decide). A round that changes nothing waits
// `interval` steps before the next, doubled each time up to `max_interval`
// (an idle machine pays for a comparison rarely); a change starts the next
// round at once.
//
// OpenBLAS's GEMMs give other bits with another thread count, so a job whose
// count moves ends on other bits than one whose count stays; the worker logs
// each move.
//
// Thread-compatible.
#ifndef TOWERPS_WORKER_DEVICE_CPU_THREAD_TUNER_H_
#define TOWERPS_WORKER_DEVICE_CPU_THREAD_TUNER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace towerps::worker {

class CpuThreadTuner {
 public:
  struct Options {
    int warmup = 4;    // steps not measured at the start (caches, allocations)
    int window = 16;   // steps measured per count tried
    double margin = 0.9;  // a count is taken when its median is below margin x the current one's
    int64_t first_interval = 128;  // steps between rounds after a change
    int64_t max_interval = 4096;   // the longest wait between rounds
  };
  struct Decision {
    int threads = 1;  // the count for the next step
    // Set when the count just moved: what was measured, for the log.
    std::string change;
  };

  // Counts from 1 to `max_threads` (at least 1), starting at `max_threads`.
  explicit CpuThreadTuner(int max_threads) : CpuThreadTuner(max_threads, Options()) {}
  CpuThreadTuner(int max_threads, Options options);

  // One step ran at threads() and its compute took `compute_s` seconds;
  // returns the count for the next step.
  Decision OnStep(double compute_s);

  // The count the next step runs at (a probe's, while one runs).
  int threads() const { return running_; }
  // The count the tuner holds as best.
  int chosen() const { return chosen_; }
  // The steps run at each count so far, e.g. "2 threads 450 steps, 1 thread
  // 20 steps" (most threads first; probes included).
  std::string StepsPerCount() const;

 private:
  enum class Phase { kWarmup, kCompare, kIdle };

  // A round: compares chosen_ with half as many threads, or, where none,
  // with twice as many; idle where there is neither.
  void StartRound();
  // Compares chosen_ with `candidate` (below chosen_: down).
  void Compare(int candidate);
  // The round ended with no change: wait, longer each time.
  void Idle();
  // The count step `pos` of a comparison runs at, and whether it counts.
  int CountAt(int64_t pos) const;

  const int max_threads_;
  const Options options_;
  Phase phase_ = Phase::kWarmup;
  int chosen_;     // the best count known
  int candidate_;  // the count a comparison tries
  int running_;    // the count the next step runs at
  int64_t pos_ = 0;   // steps into the comparison
  int64_t left_ = 0;  // steps left in the warm-up or the idle wait
  int64_t interval_;
  std::vector<double> chosen_samples_;
  std::vector<double> candidate_samples_;
  std::vector<int64_t> steps_at_;  // index: threads
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_THREAD_TUNER_H_
