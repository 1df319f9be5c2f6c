#include "ps/register_request.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/initializer.h"
#include "common/status.h"
#include "ps/optimizer.h"

namespace towerps::ps {
namespace {

// Optimizer slots per element of `def` (ADAM 2, MOMENTUM 1; none for SGD
// and a MOVING_AVERAGE variable).
int64_t SlotsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config) {
  int64_t slots = 0;
  if (def.update() != v1::VariableDef::MOVING_AVERAGE) {
    switch (config.optimizer().type()) {
      case v1::OptimizerSpec::ADAM:
        slots = 2;
        break;
      case v1::OptimizerSpec::MOMENTUM:
        slots = 1;
        break;
      default:
        slots = 0;
    }
  }
  return slots;
}

}  // namespace

absl::Status CheckWorkerTask(const char* what, int64_t task, int num_workers) {
  if (task >= 0 && task < num_workers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": worker_task ", task,
                                                 " is out of range (job has ", num_workers,
                                                 " workers)"));
}

absl::Status ValidateRegister(const v1::RegisterRequest& r, int64_t max_bytes) {
  if (r.job_id().empty()) return absl::InvalidArgumentError("register: job_id is empty");
  const auto& c = r.config();
  if (c.num_workers() < 1 || c.num_workers() > kMaxWorkers) {
    // The server keeps a record per worker: an unbounded count is a memory
    // bomb in one request (found by tests/fuzz:ps_fuzzer).
    return absl::InvalidArgumentError(absl::StrCat("register: config.num_workers = ",
                                                   c.num_workers(), " (want 1..", kMaxWorkers,
                                                   ")"));
  }
  if (c.replicas_to_aggregate() < 0 || c.replicas_to_aggregate() > c.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: config.replicas_to_aggregate = ", c.replicas_to_aggregate(),
        " (want 0..num_workers = ", c.num_workers(), ")"));
  }
  if (c.max_staleness() < 0) {
    return absl::InvalidArgumentError("register: config.max_staleness is negative");
  }
  if (!(c.peer_timeout_s() >= 0) || c.peer_timeout_s() > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: config.peer_timeout_s = ", c.peer_timeout_s(), " (want 0..86400)"));
  }
  if (r.has_worker_task()) {
    TOWERPS_RETURN_IF_ERROR(CheckWorkerTask("register", r.worker_task(), c.num_workers()));
  }
  if (!v1::Mode_IsValid(c.mode())) {
    return absl::InvalidArgumentError("register: config.mode is unknown");
  }
  TOWERPS_RETURN_IF_ERROR(common::Annotate(ValidateOptimizer(c.optimizer()), "register"));
  std::set<std::string> names;
  for (const auto& v : r.variables()) {
    if (v.name().empty()) return absl::InvalidArgumentError("register: a variable has no name");
    if (!names.insert(v.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("register: variable \"", v.name(), "\" appears twice"));
    }
    if (v.dtype() != v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: variable \"", v.name(), "\" has unsupported dtype ", v.dtype()));
    }
    // Before anything is created: a bad update rule must never reach CreateJob.
    TOWERPS_RETURN_IF_ERROR(common::Annotate(ValidateVariableUpdate(v), "register"));
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        common::ValidateInitializer(v.initializer()),
        absl::StrCat("register: variable \"", v.name(), "\"")));
    int64_t n = 1;
    for (int64_t d : v.shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "register: variable \"", v.name(), "\" has invalid dimension ", d));
      }
      // Shapes such as [2^31, 2^33 - 1] would overflow int64.
      std::optional<int64_t> product = common::CheckedMul(n, d);
      if (!product.has_value() || !common::CheckedMul(*product, sizeof(float)).has_value()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "register: variable \"", v.name(), "\" of shape [", absl::StrJoin(v.shape(), ", "),
            "] overflows int64 (elements x 4 bytes); this server's limit is ", max_bytes,
            " bytes per job (--max_job_bytes)"));
      }
      n = *product;
    }
  }
  return absl::OkStatus();
}

v1::TrainingConfig NormalizedConfig(v1::TrainingConfig c) {
  if (c.mode() == v1::MODE_UNSPECIFIED) c.set_mode(v1::SYNC);
  if (c.peer_timeout_s() == 0) c.set_peer_timeout_s(kDefaultPeerTimeoutS);
  *c.mutable_optimizer() = OptimizerWithDefaults(c.optimizer());
  return c;
}

int64_t ElementsOf(const v1::VariableDef& def) {
  int64_t n = 1;
  for (int64_t d : def.shape()) n = common::SaturatingMul(n, d);
  return n;
}

std::string FootprintDetail(const v1::RegisterRequest& r, const v1::TrainingConfig& config,
                            int64_t need) {
  int largest = 0;
  int64_t largest_bytes = -1;
  for (int i = 0; i < r.variables_size(); ++i) {
    const int64_t b = common::SaturatingMul(
        common::SaturatingMul(ElementsOf(r.variables(i)),
                              FloatsPerElement(r.variables(i), config, i)),
        sizeof(float));
    if (b > largest_bytes) {
      largest = i;
      largest_bytes = b;
    }
  }
  std::string detail = absl::StrCat("job \"", r.job_id(), "\" needs ", need, " bytes");
  if (r.variables_size() == 0) return detail;
  const v1::VariableDef& v = r.variables(largest);
  const int64_t floats = FloatsPerElement(v, config, largest);
  const int64_t slots = floats - 2 - config.num_workers();
  return absl::StrCat(detail, "; variable \"", v.name(), "\" of shape [",
                      absl::StrJoin(v.shape(), ", "), "] alone needs ", largest_bytes, " (",
                      floats, " floats per element: value, pull snapshot, ", slots,
                      " optimizer slots", slots > SlotsPerElement(v, config)
                          ? " (with those its worker's pushes form ahead)" : "",
                      ", ", config.num_workers(), " push buffers)");
}

bool FormsSlotsAhead(int index, int64_t elements) {
  return index == 0 || elements <= kSlotsAheadMaxElements;
}

int64_t FloatsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config,
                         int index) {
  const int64_t slots = SlotsPerElement(def, config);
  // One worker: its pushes stage these slots' new values (updates ahead).
  const bool staged =
      index >= 0 && config.num_workers() == 1 && FormsSlotsAhead(index, ElementsOf(def));
  return 2 + (staged ? 2 * slots : slots) + std::max(0, config.num_workers());
}

int64_t RegisterFootprintBytes(const v1::RegisterRequest& request,
                               const v1::TrainingConfig& config) {
  int64_t total = 0;
  for (int i = 0; i < request.variables_size(); ++i) {
    const v1::VariableDef& v = request.variables(i);
    const int64_t floats =
        common::SaturatingMul(ElementsOf(v), FloatsPerElement(v, config, i));
    total = common::SaturatingAdd(total, common::SaturatingMul(floats, sizeof(float)));
  }
  return total;
}

}  // namespace towerps::ps
