#include "worker/train/trainer.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <limits>
#include <numeric>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/lr_schedule.h"
#include "common/optimizer_spec.h"
#include "common/process_cpu.h"
#include "common/rpc.h"
#include "common/status.h"
#include "worker/model/model_limits.h"

namespace towerps::worker {

absl::StatusOr<std::pair<double, double>> EvaluateModel(Model& model, const Dataset& data,
                                                        int64_t eval_batch) {
  const int64_t per_pass = std::max<int64_t>(1, eval_batch);
  Batch batch;
  std::vector<int64_t> idx;
  double loss = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += per_pass) {
    const int64_t end = std::min(data.size(), start + per_pass);
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

v1::OptimizerSpec TrainingOptimizer(const v1::JobSpec& job, int64_t total_steps) {
  v1::OptimizerSpec opt = common::OptimizerWithDefaults(job.optimizer());
  auto* sched = opt.mutable_schedule();
  if (sched->type() == v1::LearningRateSchedule::COSINE && sched->decay_steps() == 0) {
    sched->set_decay_steps(std::max<int64_t>(1, total_steps - sched->warmup_steps()));
  }
  if (opt.schedule().type() == v1::LearningRateSchedule::SCHEDULE_UNSPECIFIED &&
      opt.schedule().warmup_steps() == 0) {
    opt.clear_schedule();  // the servers see the same config as before schedules existed
  }
  return opt;
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

absl::Status Trainer::CheckCancelled() const {
  if (options_.cancel != nullptr && options_.cancel->cancelled()) {
    return options_.cancel->Check();
  }
  return absl::OkStatus();
}

absl::Status Trainer::EvalAndReport(int64_t epoch, int64_t step, TrainResult* result) {
  const int64_t per_pass =
      TowerBatch(options_.job.global_batch_size(), options_.num_workers, towers_.num_towers());
  TOWERPS_ASSIGN_OR_RETURN(auto eval, EvaluateModel(towers_.primary(), test_, per_pass));
  result->test_loss = eval.first;
  result->test_accuracy = eval.second;
  result->evaluated = true;
  const std::string acc = std::isnan(eval.second)
                              ? std::string("n/a")
                              : absl::StrFormat("%.4f", eval.second);
  const double lr = common::LearningRateAt(optimizer_, std::max<int64_t>(0, step - 1));
  Progress(absl::StrFormat("epoch %d/%d: test_loss=%.4f test_accuracy=%s lr=%g", epoch,
                           options_.job.epochs(), eval.first, acc, lr));
  if (options_.on_metrics) {
    v1::Metrics m;
    m.set_step(step);
    m.set_epoch(static_cast<int32_t>(epoch));
    m.set_epochs(options_.job.epochs());
    m.set_test_loss(eval.first);
    m.set_has_test(true);
    m.set_has_accuracy(!std::isnan(eval.second));
    if (m.has_accuracy()) m.set_test_accuracy(eval.second);
    m.set_learning_rate(lr);
    options_.on_metrics(m, /*epoch_end=*/true);
  }
  if (options_.on_epoch) options_.on_epoch(step, towers_.weights());
  return absl::OkStatus();
}

std::string StepBreakdown::Describe() const {
  const double n = std::max<int64_t>(1, steps);
  auto ms = [n](double s) { return 1e3 * s / n; };
  return absl::StrFormat(
      "%d steps, per step %.2f ms: compute %.2f (%.0f%%), pull %.2f (servers held it %.2f, "
      "under the compute or not), push %.2f, other %.2f (batches %.2f, eval %.2f); "
      "process cpu %.2f cores",
      steps, ms(loop_s), ms(compute_s), loop_s > 0 ? 100 * compute_s / loop_s : 0.0, ms(pull_s),
      ms(pull_wait_s), ms(push_s), ms(other_s), ms(batches_s), ms(eval_s),
      loop_s > 0 ? cpu_s / loop_s : 0.0);
}

absl::StatusOr<TrainResult> Trainer::Run() {
  const v1::JobSpec& job = options_.job;
  const int W = options_.num_workers;
  const int w = options_.worker_task;
  const bool sync = job.mode() != v1::ASYNC;
  const int64_t G = job.global_batch_size();
  // A sharded set (DataSpec.shard) holds this worker's examples; the
  // steps per epoch are the whole set's.
  const bool sharded = job.data().shard();
  const int64_t n = train_.whole_size();
  const int64_t spe = StepsPerEpoch(n, G);
  if (spe == 0) return absl::InvalidArgumentError("the train set is empty");
  const int64_t total = job.max_steps() > 0 ? job.max_steps() : job.epochs() * spe;
  const absl::Time start = absl::Now();

  v1::TrainingConfig config;
  config.set_mode(job.mode());
  config.set_num_workers(W);
  config.set_replicas_to_aggregate(job.replicas_to_aggregate());
  config.set_max_staleness(job.max_staleness());
  config.set_peer_timeout_s(job.peer_timeout_s());
  *config.mutable_optimizer() = TrainingOptimizer(job, total);
  optimizer_ = config.optimizer();
  TOWERPS_ASSIGN_OR_RETURN(int64_t step, client_.Register(config));
  const int64_t start_step = step;
  // Same host: the weights and gradients live in the client's shared memory
  // while training, where the servers write pulls and read pushes, so that
  // neither is copied on this side; back in their own memory when Run
  // returns (the client's may go before the towers), unless
  // options_.tensors_stay_shared. Each variable's old memory goes back to
  // the system as it moves, either way, so that the worker never holds the
  // weights twice; the gradients' pages in the segment stay until the
  // client goes, since a server may still read the last push there
  // (ParameterClient::ReleaseShared). Their values are not copied in: the
  // weights are read only once the first pull has written every variable
  // there, and the gradients once backward has, so the segment's pages are
  // touched first by those writes (copying the model's initial values and
  // zeros in held every variable twice for a moment: the dense stack's
  // worker peaked at 120 MB against 111 MB while training).
  const size_t num_vars = towers_.weights().size();
  bool shared = false;
  for (size_t v = 0; v < num_vars; ++v) {
    float* values = client_.SharedValues(static_cast<int>(v));
    if (values == nullptr) continue;
    towers_.PlaceHostTensors(v, values, client_.SharedGradients(static_cast<int>(v)),
                             /*keep_values=*/false);
    common::ReleaseFreeMemory();
    shared = true;
  }
  absl::Cleanup own_memory = [&] {
    if (!shared || options_.tensors_stay_shared) return;
    for (size_t v = 0; v < num_vars; ++v) {
      towers_.PlaceHostTensors(v, nullptr, nullptr);
      client_.ReleaseShared(static_cast<int>(v));
    }
  };

  std::vector<common::Tensor*> weights = towers_.weights();
  std::vector<const common::Tensor*> grads;
  for (common::Tensor* g : towers_.gradients()) grads.push_back(g);

  TrainResult result;
  if (options_.restoring) {
    Progress(absl::StrFormat("worker %d: servers at step %d (restored); continuing", w, start_step));
  }
  Batch batch;
  int64_t batch_position = -1;  // the position `batch` holds; -1: none
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  // Fills `batch` with the batch at `position` (by global step in SYNC, own
  // iteration in ASYNC), unless it holds it already.
  auto gather = [&](int64_t position) {
    if (position == batch_position) return;
    const absl::Time gather_start = absl::Now();
    absl::Cleanup timed = [&] {
      result.breakdown.batches_s += absl::ToDoubleSeconds(absl::Now() - gather_start);
    };
    const int64_t epoch = position / spe, b = position % spe;
    if (epoch != perm_epoch) {
      // Sharded: each worker shuffles its own shard, with its own stream
      // (worker 0's is the unsharded one, so one worker trains as unsharded).
      perm = EpochPermutation(train_.size(), job.data().shuffle_seed() + (sharded ? w : 0),
                              epoch, !job.data().no_shuffle());
      perm_epoch = epoch;
    }
    GatherBatch(train_,
                sharded ? ShardSlice(perm, n, G, b, W, w) : WorkerSlice(perm, G, b, W, w), &batch);
    batch_position = position;
  };
  double window_loss = 0;
  int64_t window_examples = 0, window_correct = 0;
  absl::Time window_start = absl::Now();
  // The chief's evaluations and checkpoints inside a window are not
  // training: the window's examples/s leaves them out.
  double window_pause_s = 0;
  // The whole job's examples in the window (Metrics.job_examples_per_s),
  // from the servers' step at its start: SYNC, every global step's batch
  // (steps the chief sat out with backup workers too); ASYNC, each push.
  int64_t window_global_start = start_step;
  const int R = job.replicas_to_aggregate() > 0 ? std::min(job.replicas_to_aggregate(), W) : W;
  // Evaluation happens when the first batch of a new epoch is reached; after
  // a restore, the epochs already evaluated are not repeated.
  int64_t last_eval_epoch = start_step / spe;
  const int64_t iterations = sync ? std::numeric_limits<int64_t>::max() : total;
  // ASYNC after a restore: each worker did about its share of the steps.
  const int64_t first_it =
      sync || !options_.restoring ? 0 : std::min(total, start_step / W);

  StepBreakdown& bd = result.breakdown;
  auto seconds_since = [](absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); };
  const absl::Time loop_start = absl::Now();
  const double cpu_start = common::ProcessCpuTime().total_s();
  // Communication overlaps compute: a step's pull is under way before the
  // step starts (in SYNC from the end of the previous step's compute, while
  // its push finishes: the servers answer once that step is complete); the
  // step waits for each layer's weights only when forward reaches the layer,
  // and pushes each layer's gradients as soon as backward produced them.
  std::unique_ptr<PullStream> pull;
  if (first_it < iterations) {
    TOWERPS_ASSIGN_OR_RETURN(pull, client_.StartPull(sync ? step : 0, first_it, weights));
  }
  for (int64_t it = first_it; it < iterations; ++it) {
    TOWERPS_RETURN_IF_ERROR(CheckCancelled());
    absl::Time pull_start = absl::Now();
    TOWERPS_ASSIGN_OR_RETURN(int64_t pulled, pull->Step());
    bd.pull_s += seconds_since(pull_start);
    if (options_.last_step != nullptr) options_.last_step->store(pulled);
    if (sync && pulled >= total) {
      pull_start = absl::Now();
      TOWERPS_RETURN_IF_ERROR(pull->Finish().status());  // the final weights, whole
      bd.pull_s += seconds_since(pull_start);
      step = pulled;
      break;
    }
    if (options_.is_chief && options_.after_pull) {
      const absl::Time hook_start = absl::Now();  // checkpoints
      TOWERPS_RETURN_IF_ERROR(options_.after_pull(pulled));
      window_pause_s += seconds_since(hook_start);
    }
    // The batch: by global step (SYNC) or by own iteration (ASYNC).
    const int64_t position = sync ? pulled : it;
    const int64_t epoch = position / spe, b = position % spe;
    if (options_.is_chief && b == 0 && epoch > last_eval_epoch && !job.skip_eval()) {
      pull_start = absl::Now();
      TOWERPS_RETURN_IF_ERROR(pull->Finish().status());  // evaluation reads every weight
      bd.pull_s += seconds_since(pull_start);
      const absl::Time eval_start = absl::Now();
      TOWERPS_RETURN_IF_ERROR(EvalAndReport(epoch, pulled, &result));
      const double eval_s = seconds_since(eval_start);
      bd.eval_s += eval_s;
      window_pause_s += eval_s;
      last_eval_epoch = epoch;
    }
    gather(position);  // gathered already while the last step's push finished, as a rule
    TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<PushStream> push,
                             client_.StartPush(pulled, batch.size(), grads));
    // Time blocked on weights inside the compute: pull time, not compute
    // (pipeline stages may wait at the same time; their sum is counted).
    std::atomic<int64_t> weights_wait_ns{0};
    // The next step's pull goes out once forward is done, at the first
    // gradients backward announces (every weight was needed before them),
    // or after the step if none is announced during it: SYNC, the servers
    // hold it until this step is complete; ASYNC, until they have taken
    // this push, whose gradient the next weights then include (as without
    // overlap). Out before the push's last gradient, it waits in the
    // servers when the push completes, so that a server with one worker
    // writes the update's new values where it lands as it forms them
    // (ps/push_session.h) instead of copying them for it afterwards.
    absl::Mutex next_mu;
    bool next_started = false;
    absl::Status next_status;
    std::unique_ptr<PullStream> next_pull;
    auto start_next_pull = [&]() -> absl::Status {
      absl::MutexLock lock(&next_mu);
      if (next_started) return next_status;
      next_started = true;
      next_status = [&]() -> absl::Status {
        const absl::Time t = absl::Now();
        const absl::Status st = pull->Finish().status();  // its errors, if any
        weights_wait_ns += absl::ToInt64Nanoseconds(absl::Now() - t);
        TOWERPS_RETURN_IF_ERROR(st);
        bd.pull_wait_s += absl::ToDoubleSeconds(pull->server_wait());
        if (sync) {
          TOWERPS_ASSIGN_OR_RETURN(next_pull, client_.StartPull(pulled + 1, it + 1, weights));
        } else if (it + 1 < iterations) {
          TOWERPS_ASSIGN_OR_RETURN(next_pull, client_.StartPullAfterPush(0, it + 1, weights));
        }
        return absl::OkStatus();
      }();
      return next_status;
    };
    Model::StepEvents events;
    events.weights_needed = [&](int first, int count) {
      const absl::Time t = absl::Now();
      const absl::Status st = pull->Wait(first, count);
      weights_wait_ns += absl::ToInt64Nanoseconds(absl::Now() - t);
      return st;
    };
    events.gradients_ready = [&](int first, int count) {
      TOWERPS_RETURN_IF_ERROR(start_next_pull());
      return push->Send(first, count);
    };
    const absl::Time compute_start = absl::Now();
    absl::StatusOr<LossResult> computed = towers_.ComputeGradients(batch, events);
    const double weights_wait_s = weights_wait_ns.load() * 1e-9;
    const double step_compute_s = seconds_since(compute_start) - weights_wait_s;
    bd.compute_s += step_compute_s;
    bd.pull_s += weights_wait_s;
    TOWERPS_RETURN_IF_ERROR(computed.status());
    const LossResult r = *std::move(computed);
    pull_start = absl::Now();
    TOWERPS_RETURN_IF_ERROR(start_next_pull());
    bd.pull_s += seconds_since(pull_start);
    pull = std::move(next_pull);
    const int64_t examples = batch.size();
    // The next batch, while the servers take this step's push (the worker
    // would wait): at the next position, as it will be unless the servers'
    // step moved past this worker's (SYNC), when it is gathered again once
    // known.
    if (position + 1 < total) gather(position + 1);
    const absl::Time push_start = absl::Now();
    TOWERPS_ASSIGN_OR_RETURN(PushResult pr, push->Finish());
    bd.push_s += seconds_since(push_start);
    push.reset();
    if (options_.after_step) options_.after_step(step_compute_s);
    ++bd.steps;
    ++result.iterations;
    if (options_.iterations != nullptr) options_.iterations->store(result.iterations);
    if (options_.on_iteration) options_.on_iteration(examples);
    if (pr.stale > 0) ++result.stale_pushes;
    step = pulled + 1;
    window_loss += r.loss_sum;
    window_examples += examples;
    window_correct += r.correct;
    const int64_t done = position + 1;
    if ((options_.log_every_steps > 0 && done % options_.log_every_steps == 0) ||
        done % spe == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - window_start);
      const double window_n = std::max<int64_t>(1, window_examples);
      std::string acc = train_.num_classes > 0
                            ? absl::StrFormat(" acc=%.4f", window_correct / window_n)
                            : "";
      const double lr = common::LearningRateAt(config.optimizer(), position);
      const double train_s = std::max(secs - window_pause_s, 1e-9);
      const double rate = window_examples / train_s;
      double job_examples = 0;
      if (sync) {
        for (int64_t p = window_global_start; p <= position; ++p) {
          job_examples += std::min(G, n - (p % spe) * G) * static_cast<double>(R) / W;
        }
        window_global_start = position + 1;
      } else {
        job_examples = std::max<int64_t>(0, pr.global_step - window_global_start) *
                       static_cast<double>(G) / W;
        window_global_start = std::max(window_global_start, pr.global_step);
      }
      const double job_rate = job_examples / train_s;
      const int64_t shown_epoch = std::min<int64_t>(epoch + 1, job.epochs());
      Progress(absl::StrFormat(
          "worker %d epoch %d/%d step %d/%d loss=%.4f%s examples/s=%.0f lr=%g", w,
          shown_epoch, job.epochs(), done, total, window_loss / window_n, acc, rate, lr));
      if (options_.on_metrics && options_.is_chief) {
        v1::Metrics m;
        m.set_step(done);
        m.set_total_steps(total);
        m.set_epoch(static_cast<int32_t>(shown_epoch));
        m.set_epochs(job.epochs());
        m.set_loss(window_loss / window_n);
        m.set_has_accuracy(train_.num_classes > 0);
        if (m.has_accuracy()) m.set_accuracy(window_correct / window_n);
        m.set_examples_per_s(rate);
        m.set_job_examples_per_s(job_rate);
        m.set_learning_rate(lr);
        m.set_wall_s(absl::ToDoubleSeconds(absl::Now() - start));
        options_.on_metrics(m, /*epoch_end=*/false);
      }
      window_loss = 0;
      window_examples = window_correct = 0;
      window_pause_s = 0;
      window_start = absl::Now();
    }
  }
  bd.loop_s = absl::ToDoubleSeconds(absl::Now() - loop_start);
  bd.cpu_s = common::ProcessCpuTime().total_s() - cpu_start;
  bd.other_s = std::max(0.0, bd.loop_s - bd.pull_s - bd.compute_s - bd.push_s);
  Progress(absl::StrCat("worker ", w, ": ", bd.Describe()));
  if (!sync) {
    // Final weights: once every worker's pushes are in (the chief waits).
    if (options_.is_chief) {
      TOWERPS_RETURN_IF_ERROR(CheckCancelled());
      TOWERPS_ASSIGN_OR_RETURN(step, client_.Pull(W * total, total, weights));
    } else {
      step = total;  // own iterations done; the global step is the chief's to report
    }
  }
  result.global_steps = step;
  if (options_.last_step != nullptr) options_.last_step->store(step);
  if (options_.is_chief && !job.skip_eval()) {
    TOWERPS_RETURN_IF_ERROR(EvalAndReport(job.epochs(), step, &result));
  }
  result.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace towerps::worker
