// A RegisterRequest on a server: what it must hold to be accepted
// (ValidateRegister), the defaults its job's config gets (NormalizedConfig),
// and the bytes the job it makes will hold there (RegisterFootprintBytes),
// which the server counts against its limits (ParameterServerOptions).
// Pure functions of their arguments; thread-safe.
#ifndef TOWERPS_PS_REGISTER_REQUEST_H_
#define TOWERPS_PS_REGISTER_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"

namespace towerps::ps {

// TrainingConfig.peer_timeout_s when a job leaves it 0.
constexpr double kDefaultPeerTimeoutS = 60;

// The most workers a job may have (TrainingConfig.num_workers); Register
// refuses more with InvalidArgument.
constexpr int kMaxWorkers = 10000;

// InvalidArgument unless 0 <= task < num_workers; `what` names the request.
absl::Status CheckWorkerTask(const char* what, int64_t task, int num_workers);

// OK, or the first thing wrong with `r`, named: InvalidArgument for an empty
// job id, counts out of range (num_workers 1..kMaxWorkers,
// replicas_to_aggregate, max_staleness, peer_timeout_s, worker_task), an
// unknown mode, a bad optimizer, update rule or initializer, a variable
// without a name, named twice, not float32 or with a dimension below 1;
// ResourceExhausted for a shape whose bytes overflow int64 (naming
// `max_bytes`, the server's --max_job_bytes).
absl::Status ValidateRegister(const v1::RegisterRequest& r, int64_t max_bytes);

// `c` with its defaults: SYNC where the mode is unset, kDefaultPeerTimeoutS
// where peer_timeout_s is 0, the optimizer's (OptimizerWithDefaults).
v1::TrainingConfig NormalizedConfig(v1::TrainingConfig c);

// The elements of `def`'s shape, saturating at INT64_MAX.
int64_t ElementsOf(const v1::VariableDef& def);

// Floats a job holds on a server per element of variable `def`, given the
// job's normalized `config`: the value, the pull snapshot (a copy of the
// values, made only while a pull sending them over gRPC or a checkpoint
// holds them as they change; pulls into shared memory make a push wait
// instead), the optimizer's
// slots (ADAM 2, MOMENTUM 1, SGD none; a MOVING_AVERAGE variable none),
// twice in a job of one worker where FormsSlotsAhead(index, its elements)
// (its same-host pushes may form those slots' new values ahead, apart:
// push_session.h, "Updates ahead"; `index`: the variable's in the job, -1 for
// none), and one push staging buffer per
// worker (SYNC stages each worker's gradient until its step is complete and
// sums them into the first one; ASYNC has at most one push per worker in
// flight). An upper bound: a same-host push
// read in place (GradientPart) stages nothing, and its update needs at most
// one variable's scratch.
int64_t FloatsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config,
                         int index = -1);

// Whether a job of one worker's same-host pushes form the new values of
// the optimizer slots of its variable `index`, of `elements`, ahead
// (push_session.h, "Updates ahead"; where the server has cores of its own), at the cost of
// a second set of them (counted whether or not it does). After the push,
// the Commit updates the variables in order, each published once final,
// so the next forward waits for the first one's update (the first layer's
// kernel, or this server's part of it) and the rest overlaps that
// forward: the first variable's is formed ahead, overlapping the worker's
// backward instead (a worker announces a larger first layer early:
// Model::StepEvents), and so is that of every small one (at most
// kSlotsAheadMaxElements), whose update costs the next pull less formed
// ahead than handed to the Commit's thread. The large ones' would double
// their slots for nothing measurable (a dense stack with Adam: +120 MB a
// server, ms/step within noise; issue 16).
inline constexpr int64_t kSlotsAheadMaxElements = 64 * 1024;
bool FormsSlotsAhead(int index, int64_t elements);

// Bytes the job of `request` will hold on this server (FloatsPerElement times
// 4 bytes times the elements, summed over its variables), saturating at
// INT64_MAX. REQUIRES: shapes positive; `config` normalized.
int64_t RegisterFootprintBytes(const v1::RegisterRequest& request,
                               const v1::TrainingConfig& config);

// Why a register is refused for its size: "job "ID" needs `need` bytes",
// then its largest variable, what that one alone needs and what each of its
// elements costs (floats per element: value, pull snapshot, slots, push
// buffers). REQUIRES: `config` normalized.
std::string FootprintDetail(const v1::RegisterRequest& r, const v1::TrainingConfig& config,
                            int64_t need);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_REGISTER_REQUEST_H_
