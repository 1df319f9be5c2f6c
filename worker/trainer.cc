#include "worker/trainer.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status.h"

namespace towerps::worker {

absl::StatusOr<std::pair<double, double>> EvaluateModel(Model& model, const Dataset& data) {
  constexpr int64_t kEvalBatch = 1000;
  Batch batch;
  std::vector<int64_t> idx;
  double loss = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += kEvalBatch) {
    const int64_t end = std::min(data.size(), start + kEvalBatch);
    idx.resize(end - start);
    std::iota(idx.begin(), idx.end(), start);
    GatherBatch(data, idx, &batch);
    TOWERPS_ASSIGN_OR_RETURN(LossResult r, model.Evaluate(batch));
    loss += r.loss_sum;
    correct += r.correct;
  }
  const double n = std::max<int64_t>(1, data.size());
  const double acc = data.num_classes > 0 ? correct / n
                                          : std::numeric_limits<double>::quiet_NaN();
  return std::make_pair(loss / n, acc);
}

Trainer::Trainer(TrainerOptions options, Towers& towers, ParameterClient& client,
                 const Dataset& train, const Dataset& test)
    : options_(std::move(options)), towers_(towers), client_(client), train_(train),
      test_(test) {}

void Trainer::Progress(const std::string& line) {
  if (options_.progress) {
    options_.progress(line);
  } else {
    TLOG(INFO) << line;
  }
}

absl::Status Trainer::EvalAndReport(int64_t epoch, TrainResult* result) {
  TOWERPS_ASSIGN_OR_RETURN(auto eval, EvaluateModel(towers_.primary(), test_));
  result->test_loss = eval.first;
  result->test_accuracy = eval.second;
  result->evaluated = true;
  const std::string acc = std::isnan(eval.second)
                              ? std::string("n/a")
                              : absl::StrFormat("%.4f", eval.second);
  Progress(absl::StrFormat("epoch %d/%d: test_loss=%.4f test_accuracy=%s lr=%g", epoch,
                           options_.job.epochs(), eval.first, acc,
                           options_.job.optimizer().learning_rate()));
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Trainer::Run() {
  const v1::JobSpec& job = options_.job;
  const int W = options_.num_workers;
  const int w = options_.worker_task;
  const bool sync = job.mode() != v1::ASYNC;
  const int64_t G = job.global_batch_size();
  const int64_t spe = StepsPerEpoch(train_.size(), G);
  if (spe == 0) return absl::InvalidArgumentError("the train set is empty");
  const int64_t total = job.max_steps() > 0 ? job.max_steps() : job.epochs() * spe;
  const absl::Time start = absl::Now();

  v1::TrainingConfig config;
  config.set_mode(job.mode());
  config.set_num_workers(W);
  config.set_replicas_to_aggregate(job.replicas_to_aggregate());
  config.set_max_staleness(job.max_staleness());
  *config.mutable_optimizer() = job.optimizer();
  TOWERPS_ASSIGN_OR_RETURN(int64_t step, client_.Register(config));

  std::vector<common::Tensor*> weights = towers_.weights();
  std::vector<const common::Tensor*> grads;
  for (common::Tensor* g : towers_.gradients()) grads.push_back(g);

  TrainResult result;
  Batch batch;
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  double window_loss = 0;
  int64_t window_examples = 0, window_correct = 0;
  absl::Time window_start = absl::Now();
  int64_t last_eval_epoch = 0;
  const int64_t iterations = sync ? std::numeric_limits<int64_t>::max() : total;

  for (int64_t it = 0; it < iterations; ++it) {
    TOWERPS_ASSIGN_OR_RETURN(
        int64_t pulled, client_.Pull(sync ? step : 0, it, weights));
    if (sync && pulled >= total) {
      step = pulled;
      break;
    }
    // The batch: by global step (SYNC) or by own iteration (ASYNC).
    const int64_t position = sync ? pulled : it;
    const int64_t epoch = position / spe, b = position % spe;
    if (options_.is_chief && b == 0 && epoch > last_eval_epoch && !job.skip_eval()) {
      TOWERPS_RETURN_IF_ERROR(EvalAndReport(epoch, &result));
      last_eval_epoch = epoch;
    }
    if (epoch != perm_epoch) {
      perm = EpochPermutation(train_.size(), job.data().shuffle_seed(), epoch,
                              !job.data().no_shuffle());
      perm_epoch = epoch;
    }
    GatherBatch(train_, WorkerSlice(perm, G, b, W, w), &batch);
    TOWERPS_ASSIGN_OR_RETURN(LossResult r, towers_.ComputeGradients(batch));
    TOWERPS_ASSIGN_OR_RETURN(PushResult pr, client_.Push(pulled, batch.size(), grads));
    ++result.iterations;
    if (pr.stale > 0) ++result.stale_pushes;
    step = pulled + 1;
    window_loss += r.loss_sum;
    window_examples += batch.size();
    window_correct += r.correct;
    const int64_t done = position + 1;
    if ((options_.log_every_steps > 0 && done % options_.log_every_steps == 0) ||
        done % spe == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - window_start);
      const double n = std::max<int64_t>(1, window_examples);
      std::string acc = train_.num_classes > 0
                            ? absl::StrFormat(" acc=%.4f", window_correct / n)
                            : "";
      Progress(absl::StrFormat(
          "worker %d epoch %d/%d step %d/%d loss=%.4f%s examples/s=%.0f", w,
          std::min<int64_t>(epoch + 1, job.epochs()), job.epochs(), done, total,
          window_loss / n, acc, window_examples / std::max(secs, 1e-9)));
      window_loss = 0;
      window_examples = window_correct = 0;
      window_start = absl::Now();
    }
  }
  if (!sync) {
    // Final weights: once every worker's pushes are in (the chief waits).
    if (options_.is_chief) {
      TOWERPS_ASSIGN_OR_RETURN(step, client_.Pull(W * total, total, weights));
    } else {
      step = total;  // own iterations done; the global step is the chief's to report
    }
  }
  result.global_steps = step;
  if (options_.is_chief && !job.skip_eval()) {
    TOWERPS_RETURN_IF_ERROR(EvalAndReport(job.epochs(), &result));
  }
  result.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace towerps::worker
