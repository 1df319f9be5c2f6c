// StartGrpcPull: a pull from every server, its answers written into the
// weights as they come (ps_streams.h).
#include "worker/train/ps_streams.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/status.h"
#include "common/tensor_wire.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/ps.pb.h"
#include "proto/ps_wire.h"
#include "worker/train/ps_stream_base.h"

namespace towerps::worker::internal {
namespace {

using common::FromGrpcStatus;
using v1::ps_wire::kPullSegmentErrorField;
using v1::ps_wire::kPullSegmentVarField;
using v1::ps_wire::kPullSlicesField;
using v1::ps_wire::kPullStepField;
using v1::ps_wire::kPullWaitedField;

class GrpcPullStream final : public PullStream, private StreamBase {
 public:
  GrpcPullStream(PsPeers& peers, int64_t min_step, int64_t iteration, uint64_t after_push,
                 std::vector<common::Tensor*> weights)
      : StreamBase(peers),
        min_step_(min_step),
        iteration_(iteration),
        after_push_(after_push),
        weights_(std::move(weights)),
        servers_(peers.size()) {
    absl::MutexLock lock(&mu_);
    missing_.resize(weights_.size());
    for (size_t v = 0; v < weights_.size(); ++v) missing_[v] = weights_[v]->num_elements();
    step_.assign(peers.size(), -1);
    waited_.assign(peers.size(), absl::ZeroDuration());
    for (int s = 0; s < peers.size(); ++s) {
      servers_[s].part_done.assign(peers.parts_on(s).size(), false);
    }
  }

  ~GrpcPullStream() override { AbandonAndJoin(); }

  void Start() {
    for (int s = 0; s < peers_.size(); ++s) {
      peers_.pull_executor(s).Schedule([this, s] { Done(s, PullWithRetries(s)); });
    }
  }

  absl::StatusOr<int64_t> Step() override {
    absl::MutexLock lock(&mu_);
    while (!failed_ && running_ > 0 && !AllStepsKnown()) cv_.Wait(&mu_);
    if (AllStepsKnown()) return *std::min_element(step_.begin(), step_.end());
    while (running_ > 0 && !failed_) cv_.Wait(&mu_);
    TOWERPS_RETURN_IF_ERROR(peers_.Combine(results_));
    return absl::InternalError("pull: a server finished without its step");
  }

  absl::Status Wait(int first, int count) override {
    absl::MutexLock lock(&mu_);
    auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (int v = first; v < first + count; ++v) {
        if (missing_[v] > 0) return false;
      }
      return true;
    };
    while (!complete() && !failed_ && running_ > 0) cv_.Wait(&mu_);
    if (complete()) return absl::OkStatus();
    TOWERPS_RETURN_IF_ERROR(peers_.Combine(results_));
    return absl::InternalError("pull: the servers finished without every variable");
  }

  absl::StatusOr<int64_t> Finish() override {
    TOWERPS_RETURN_IF_ERROR(WaitAll());
    absl::MutexLock lock(&mu_);
    return *std::min_element(step_.begin(), step_.end());
  }

  absl::Duration server_wait() const override {
    absl::MutexLock lock(&mu_);
    return *std::max_element(waited_.begin(), waited_.end());
  }

 private:
  // Touched only by server s's call (on its executor).
  struct PerServer {
    std::vector<bool> part_done;  // Complete in the buffers: never written again.
    std::vector<char> discard;    // Where a retry's copy of a done part goes.
  };

  bool AllStepsKnown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(step_.begin(), step_.end(), [](int64_t s) { return s >= 0; });
  }

  absl::Status PullWithRetries(int s) {
    const ParameterClientOptions& o = peers_.options();
    TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
    common::Backoff backoff(peers_.retry().WithDeadline(o.wait_timeout), &abandon_);
    absl::Time next_log = absl::Now() + peers_.LogInterval();
    while (true) {
      const absl::Time attempt = absl::Now();
      absl::Duration server_wait;
      bool channel_broke = false;
      absl::Status st = PullOnce(s, &server_wait, &channel_broke);
      // The same-host channel broke (it was given up): the same pull at
      // once over gRPC, which offers the channel afresh.
      if (channel_broke) {
        TLOG(WARNING) << "worker " << o.worker_task << ": pull from " << peers_.ServerName(s)
                      << " goes over gRPC again: " << st.message();
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        waited_[s] += server_wait;
        // A server-side wait that ran out counts whole.
        if (absl::IsDeadlineExceeded(st)) waited_[s] += absl::Now() - attempt;
      }
      // DEADLINE_EXCEEDED here is the server's step wait (max_wait_ms): it answered.
      if (st.ok() || absl::IsDeadlineExceeded(st)) peers_.NoteReachable(s);
      if (st.ok()) return st;
      if (absl::IsNotFound(st)) peers_.NoteGone(s, st);
      if (absl::IsUnavailable(st)) peers_.NoteUnreachable(s, st);
      TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
      // The server waited already: ask again at once.
      TOWERPS_RETURN_IF_ERROR(absl::IsDeadlineExceeded(st) ? backoff.AgainAtOnce(st)
                                                           : backoff.Wait(st));
      const absl::Time now = absl::Now();
      if (now >= next_log) {
        TLOG(WARNING) << "worker " << o.worker_task << ": still waiting on "
                      << peers_.ServerName(s) << " for step " << min_step_ << ": "
                      << st.message();
        next_log = now + peers_.LogInterval();
      }
    }
  }

  // One call. Parts complete from an earlier call are not written again
  // (someone may be reading them): a retry's copy of them is discarded.
  // Through the server's same-host channel when it is ready (*channel_broke:
  // it broke part way; parts complete stay complete).
  absl::Status PullOnce(int s, absl::Duration* server_wait, bool* channel_broke) {
    const ParameterClientOptions& o = peers_.options();
    v1::PullRequest req;
    req.set_job_id(o.job_id);
    req.set_min_step(min_step_);
    req.set_worker_task(o.worker_task);
    req.set_worker_iteration(iteration_);
    if (after_push_ > 0) {
      req.set_after_push(after_push_);
      req.set_incarnation(o.incarnation);
    }
    req.set_chunk_bytes(o.chunk_bytes);
    // Short server-side waits, so that a lost peer elsewhere is noticed
    // between them.
    req.set_max_wait_ms(absl::ToInt64Milliseconds(
        std::clamp(o.peer_timeout / 4, absl::Milliseconds(250), absl::Seconds(5))));
    // Same host: the server may write the values into our segment instead:
    // where the weights may live, or, once parts are complete (a retry), in
    // the landing region, from which the rest is copied.
    const std::vector<VariablePart>& parts = peers_.parts_on(s);
    PerServer& me = servers_[s];
    const bool retry = std::find(me.part_done.begin(), me.part_done.end(), true) !=
                       me.part_done.end();
    v1::SharedSegment segment;
    const bool offered = peers_.SegmentFor(s, retry, &segment);
    if (offered) *req.mutable_segment() = std::move(segment);
    ShmCallClient* const channel = offered ? peers_.pull_channel(s) : nullptr;
    const bool via_channel = channel != nullptr && channel->Ready();
    if (channel != nullptr && !via_channel) channel->Offer(req.mutable_segment());
    std::vector<int64_t> got(parts.size(), 0);  // elements this call delivered, by part
    std::vector<uint32_t> touched;              // parts the current message reached
    common::TensorWireHandler handler;
    bool first = true;
    int64_t step = -1;
    absl::Duration wait;
    int64_t in_place = 0;       // bytes the server wrote into the segment
    std::string segment_error;  // why it did not
    handler.on_varint = [&](int field, uint64_t value) -> absl::Status {
      if (field == kPullStepField && first) step = static_cast<int64_t>(value);
      if (field == kPullWaitedField && first) {
        wait = absl::Microseconds(static_cast<int64_t>(value));
      }
      if (field == kPullSegmentVarField) {
        if (!offered || value >= parts.size() || got[value] != 0) {
          return absl::DataLossError(
              absl::StrCat("pull: the server says it wrote variable ", value,
                           offered ? " into the segment out of turn" : " into no segment"));
        }
        const size_t k = static_cast<size_t>(value);
        const VariablePart& part = parts[k];
        const int64_t bytes = part.count * static_cast<int64_t>(sizeof(float));
        float* to = weights_[part.var]->data() + part.offset;
        const char* from = peers_.segment().at(req.segment().offsets(static_cast<int>(k)));
        // No copy when the weight lives in the segment (PlaceHostTensors).
        if (!me.part_done[k] && reinterpret_cast<const char*>(to) != from) {
          std::memcpy(to, from, bytes);
        }
        got[k] = part.count;
        touched.push_back(static_cast<uint32_t>(k));
        in_place += bytes;
      }
      return absl::OkStatus();
    };
    handler.on_bytes = [&](int field, std::string bytes) {
      if (field == kPullSegmentErrorField) segment_error = std::move(bytes);
      return absl::OkStatus();
    };
    handler.on_slice = [&](uint32_t k, uint64_t offset, uint64_t bytes) -> absl::StatusOr<char*> {
      if (k >= parts.size()) return absl::DataLossError(absl::StrCat("pull: bad var_index ", k));
      const VariablePart& part = parts[k];
      const uint64_t count = bytes / 4;
      if (bytes % 4 != 0 || offset != static_cast<uint64_t>(got[k]) ||
          count > static_cast<uint64_t>(part.count - got[k])) {
        return absl::DataLossError(absl::StrCat(
            "pull: slice of ", peers_.vars()[part.var].name(), " at element ", offset,
            " does not fit ", weights_[part.var]->ShapeString(), " in order"));
      }
      got[k] += static_cast<int64_t>(count);
      touched.push_back(k);
      if (me.part_done[k]) {
        me.discard.resize(std::max<size_t>(me.discard.size(), bytes));
        return me.discard.data();
      }
      return reinterpret_cast<char*>(weights_[part.var]->data() + part.offset + offset);
    };
    absl::Status bad;
    std::vector<std::pair<int, int64_t>> finished;  // (variable, elements) completed now
    auto take = [&](const grpc::ByteBuffer& msg) {
      if (!bad.ok()) return;  // drain the stream, then report
      touched.clear();
      bad = common::ReadTensorMessage(msg, kPullSlicesField, handler);
      if (absl::IsInvalidArgument(bad)) bad = absl::DataLossError(bad.message());
      if (!bad.ok()) return;
      finished.clear();
      for (uint32_t k : touched) {
        if (!me.part_done[k] && got[k] == parts[k].count) {
          me.part_done[k] = true;
          finished.emplace_back(parts[k].var, parts[k].count);
        }
      }
      if (first || !finished.empty()) {
        absl::MutexLock lock(&mu_);
        if (first && step_[s] < 0) step_[s] = step;
        for (const auto& [v, n] : finished) missing_[v] -= n;
        cv_.SignalAll();
      }
      first = false;
    };
    absl::Status call_status;
    if (via_channel && channel->Start(common::ShmMethod::kPull, o.rpc_timeout,
                                      req.SerializeAsString(), /*last=*/true)) {
      call_status = ReceiveShm(
          channel, s, "Pull",
          [&take](const std::string& bytes) {
            grpc::Slice slice(bytes);
            take(grpc::ByteBuffer(&slice, 1));
            return absl::OkStatus();
          },
          channel_broke);
      if (*channel_broke) return call_status;
    } else if (via_channel && !channel->Ready()) {  // it broke before the call started
      *channel_broke = true;
      return absl::UnavailableError("same-host call: the channel broke");
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
      const common::ScopedCancellationCallback cancel_call(&abandon_,
                                                           [&ctx] { ctx.TryCancel(); });
      // Payload goes from gRPC's receive buffers (or the segment) straight
      // into the tensors.
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
              &peers_.channel(s), peers_.pull_method(s), &ctx, req));
      grpc::ByteBuffer msg;
      while (reader->Read(&msg)) take(msg);
      call_status = FromGrpcStatus(reader->Finish(), peers_.Call("Pull", s));
    }
    TOWERPS_RETURN_IF_ERROR(call_status);
    TOWERPS_RETURN_IF_ERROR(bad);
    if (in_place > 0) peers_.NoteInPlace(s, in_place);
    // A server that cannot use the segment is not offered it again (one
    // that ignores the field, from before it, sends slices without a word).
    if (!segment_error.empty()) peers_.NoteSegmentRefused(s, segment_error);
    *server_wait = wait;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (got[k] != parts[k].count) {
        return absl::DataLossError(absl::StrCat(
            "pull: variable ", peers_.vars()[parts[k].var].name(), " came back incomplete"));
      }
    }
    if (first) {  // No message at all, yet OK: the server broke the protocol.
      return absl::DataLossError("pull: the server answered without its step");
    }
    return absl::OkStatus();
  }

  // Constant after construction.
  const int64_t min_step_;
  const int64_t iteration_;
  const uint64_t after_push_;  // 0: none
  const std::vector<common::Tensor*> weights_;
  std::vector<PerServer> servers_;  // [s]: touched only by server s's call

  std::vector<int64_t> missing_ ABSL_GUARDED_BY(mu_);  // elements not yet in place, by variable
  std::vector<int64_t> step_ ABSL_GUARDED_BY(mu_);     // by server; -1: not answered yet
  std::vector<absl::Duration> waited_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<PullStream> StartGrpcPull(PsPeers& peers, int64_t min_step, int64_t iteration,
                                          uint64_t after_push,
                                          std::vector<common::Tensor*> weights) {
  auto stream = std::make_unique<GrpcPullStream>(peers, min_step, iteration, after_push,
                                                 std::move(weights));
  stream->Start();
  return stream;
}

}  // namespace towerps::worker::internal
