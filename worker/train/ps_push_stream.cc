// StartGrpcPush: a push to every server, each gradient sent as backward
// forms it (ps_streams.h).
#include "worker/train/ps_streams.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
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
using v1::ps_wire::kPushSlicesField;

class GrpcPushStream final : public PushStream, private StreamBase {
 public:
  GrpcPushStream(PsPeers& peers, GradientCompressor* compressor, uint64_t sequence, int64_t step,
                 int64_t num_examples, std::vector<const common::Tensor*> grads)
      : StreamBase(peers),
        compressor_(compressor),
        sequence_(sequence),
        step_(step),
        num_examples_(num_examples),
        grads_(std::move(grads)),
        parts_of_(peers.size()),
        all_at_once_(peers.size(), false),
        responses_(peers.size()) {
    for (int s = 0; s < peers.size(); ++s) {
      parts_of_[s].resize(grads_.size());
      const std::vector<VariablePart>& parts = peers.parts_on(s);
      for (size_t k = 0; k < parts.size(); ++k) parts_of_[s][parts[k].var].push_back(k);
      // A server that holds none waits for every gradient anyway.
      all_at_once_[s] =
          parts.empty() || (compressor_ == nullptr && peers.names_with_commit(s));
      if (!all_at_once_[s]) any_as_ready_ = true;
    }
    absl::MutexLock lock(&mu_);
    sent_.assign(grads_.size(), false);
    unsent_ = grads_.size();
  }

  ~GrpcPushStream() override { AbandonAndJoin(); }

  void Start() {
    for (int s = 0; s < peers_.size(); ++s) {
      peers_.push_executor(s).Schedule([this, s] { Done(s, PushWithRetries(s)); });
    }
  }

  absl::Status Send(int first, int count) override {
    Batch batch;
    {
      absl::MutexLock lock(&mu_);
      if (!send_error_.ok()) return send_error_;
      for (int v = first; v < first + count; ++v) {
        if (sent_[v]) continue;
        sent_[v] = true;
        batch.vars.push_back(v);
      }
    }
    if (batch.vars.empty()) return absl::OkStatus();
    if (compressor_ != nullptr) {
      // Encoded once, here: every attempt sends these bytes. One encoder at
      // a time (it keeps the residuals); each run of consecutive variables
      // is one piece.
      absl::MutexLock lock(&encode_mu_);
      for (size_t i = 0; i < batch.vars.size();) {
        size_t j = i + 1;
        while (j < batch.vars.size() && batch.vars[j] == batch.vars[j - 1] + 1) ++j;
        absl::StatusOr<std::shared_ptr<const EncodedPush>> piece =
            compressor_->Encode(grads_, batch.vars[i], static_cast<int>(j - i));
        if (!piece.ok()) {
          {
            absl::MutexLock state(&mu_);
            if (send_error_.ok()) send_error_ = piece.status();
          }
          Abandon(piece.status().message());
          return piece.status();
        }
        batch.pieces.push_back(*std::move(piece));
        i = j;
      }
    }
    absl::MutexLock lock(&mu_);
    unsent_ -= batch.vars.size();
    batches_.push_back(std::move(batch));
    // Where every server takes the gradients all at once, nobody is woken
    // before the last.
    if (any_as_ready_ || unsent_ == 0) cv_.SignalAll();
    return absl::OkStatus();
  }

  absl::StatusOr<PushResult> Finish() override {
    int unsent = -1;
    absl::Status send_error;
    {
      absl::MutexLock lock(&mu_);
      send_error = send_error_;
      for (size_t v = 0; v < sent_.size() && unsent < 0; ++v) {
        if (!sent_[v]) unsent = static_cast<int>(v);
      }
    }
    if (!send_error.ok()) {  // abandoned by Send already
      WaitAll().IgnoreError();
      return send_error;
    }
    if (unsent >= 0) {
      Abandon("push finished before every gradient was sent");
      WaitAll().IgnoreError();
      return absl::FailedPreconditionError(
          absl::StrCat("push: the gradient of ", peers_.vars()[unsent].name(),
                       " was never sent; the push was abandoned"));
    }
    TOWERPS_RETURN_IF_ERROR(WaitAll());
    PushResult r;
    r.global_step = INT64_MAX;
    for (const v1::PushResponse& resp : responses_) {
      switch (resp.outcome()) {
        case v1::PushResponse::STALE: ++r.stale; break;
        case v1::PushResponse::DUPLICATE: ++r.duplicate; break;
        default: ++r.applied;
      }
      r.global_step = std::min(r.global_step, resp.global_step());
    }
    return r;
  }

 private:
  absl::Status PushWithRetries(int s) {
    const ParameterClientOptions& o = peers_.options();
    TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
    common::Backoff backoff(peers_.retry(), &abandon_);
    int timeouts = 0;
    bool segment_refused = false;
    while (true) {
      bool channel_broke = false;
      absl::Status st = PushOnce(s, &responses_[s], &channel_broke);
      // The same-host channel broke (it was given up): the same push (same
      // sequence: applied once) at once over gRPC, which offers it afresh.
      if (channel_broke) {
        TLOG(WARNING) << "worker " << o.worker_task << ": push to " << peers_.ServerName(s)
                      << " goes over gRPC again: " << st.message();
        continue;
      }
      if (st.ok()) peers_.NoteReachable(s);
      if (st.ok()) return st;
      if (!segment_refused && absl::IsFailedPrecondition(st) &&
          absl::StrContains(st.message(), v1::ps_wire::kPushSegmentRefused)) {
        segment_refused = true;  // PushOnce noted it: the next call sends slices
        continue;
      }
      if (abandon_.cancelled()) return abandon_.Check("push");
      if (absl::IsNotFound(st)) peers_.NoteGone(s, st);
      if (absl::IsUnavailable(st)) peers_.NoteUnreachable(s, st);
      TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
      // Unreachable: retried until the server is lost (peer_timeout);
      // timed out while connected: max_push_attempts times.
      if (absl::IsDeadlineExceeded(st) && ++timeouts >= o.max_push_attempts) return st;
      TOWERPS_RETURN_IF_ERROR(backoff.Wait(st));
      TLOG(WARNING) << "worker " << o.worker_task << ": push to " << peers_.ServerName(s)
                    << " failed (attempt " << backoff.attempts() << "), retrying: "
                    << st.message();
    }
  }

  // What one Send added: its variables (not sent before) and, with
  // compression, their encoding.
  struct Batch {
    std::vector<int> vars;
    std::vector<std::shared_ptr<const EncodedPush>> pieces;
  };

  // Waits until there are batches past batches_[*next] (or the stream is
  // abandoned: false); returns them and moves *next past them.
  bool NextSent(size_t* next, std::vector<Batch>* out) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (batches_.size() <= *next && !abandon_.cancelled()) cv_.Wait(&mu_);
    if (abandon_.cancelled()) return false;
    out->assign(batches_.begin() + *next, batches_.end());
    *next = batches_.size();
    return true;
  }
  // NextSent once every gradient was sent.
  bool AllSent(size_t* next, std::vector<Batch>* out) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (unsent_ > 0 && !abandon_.cancelled()) cv_.Wait(&mu_);
    if (abandon_.cancelled()) return false;
    out->assign(batches_.begin() + *next, batches_.end());
    *next = batches_.size();
    return true;
  }

  // One call, opened when the first gradient this server holds a part of is
  // sent (a server that holds none, or asked for them with the commit:
  // when every gradient is), so that the call does not wait out the forward
  // pass; each batch of sent gradients goes out at once in messages
  // pointing into the gradients (no copy); the call ends when every
  // gradient was sent.
  // Through the server's same-host channel when it is ready and the push
  // goes in place (*channel_broke: it broke; nothing was answered).
  absl::Status PushOnce(int s, v1::PushResponse* response, bool* channel_broke) {
    const ParameterClientOptions& o = peers_.options();
    const std::vector<VariablePart>& parts = peers_.parts_on(s);
    const std::vector<std::vector<int>>& parts_of = parts_of_[s];
    size_t next = 0, sent_vars = 0;
    std::vector<Batch> batches;
    auto holds_any = [&] {
      for (const Batch& b : batches) {
        for (int v : b.vars) {
          if (!parts_of[v].empty()) return true;
        }
      }
      return false;
    };
    if (all_at_once_[s]) {
      if (!AllSent(&next, &batches)) return abandon_.Check("push");
      sent_vars = grads_.size();
    } else {
      do {
        if (!NextSent(&next, &batches)) return abandon_.Check("push");
        for (const Batch& b : batches) sent_vars += b.vars.size();
      } while (!holds_any());
    }

    v1::PushRequest msg;
    v1::PushHeader* h = msg.mutable_header();
    h->set_job_id(o.job_id);
    h->set_worker_task(o.worker_task);
    h->set_incarnation(o.incarnation);
    h->set_sequence(sequence_);
    h->set_step(step_);
    h->set_num_examples(num_examples_);
    if (compressor_ != nullptr) h->set_slice_encoding(compressor_->encoding());
    // The server applies the push only on its commit message, sent once the
    // whole push was announced: a push abandoned part way is applied nowhere,
    // not on the servers whose parts happened to be complete.
    h->set_ends_with_commit(true);
    // Same host, uncompressed: the gradients go into the segment (copied
    // here, on this server's push executor) and the messages name them.
    // Only this call writes the push region: the next push's call starts
    // after this one ended, and a call of this push abandoned part way
    // commits nowhere.
    v1::SharedSegment segment;
    const bool in_place = compressor_ == nullptr && peers_.PushSegmentFor(s, &segment);
    if (in_place) *h->mutable_segment() = std::move(segment);
    ShmCallClient* const channel = in_place ? peers_.push_channel(s) : nullptr;
    bool via_channel = channel != nullptr && channel->Ready();
    if (channel != nullptr && !via_channel) channel->Offer(h->mutable_segment());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
    const common::ScopedCancellationCallback cancel_call(&abandon_, [&ctx, channel] {
      ctx.TryCancel();
      if (channel != nullptr) channel->Wake();
    });
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer;
    auto open_grpc = [&] {
      writer.reset(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          &peers_.channel(s), peers_.push_method(s), &ctx, response));
    };
    if (!via_channel) open_grpc();
    bool started = false;  // through the channel
    // One message in place (names, the header, the commit): through the
    // channel, or the gRPC call.
    auto send_named = [&](const std::string& bytes, bool last) -> bool {
      if (via_channel && !started) {
        started = channel->Start(common::ShmMethod::kPush, o.rpc_timeout, bytes, last);
        if (started) return true;
        if (!channel->Ready()) {
          *channel_broke = true;
          return false;
        }
        via_channel = false;  // too long for the channel: this push goes over gRPC
        open_grpc();
      }
      if (via_channel) {
        if (channel->Send(bytes, last)) return true;
        *channel_broke = true;
        return false;
      }
      grpc::Slice slice(bytes);
      grpc::WriteOptions options;
      if (last) options.set_last_message();  // with the end of the stream
      return writer->Write(grpc::ByteBuffer(&slice, 1), options);
    };
    int64_t bytes_in_place = 0;
    // In place, each message only names variables: the header goes with
    // the first batch's names, the commit and the end of the stream with
    // the last's (each message is a write and a wake-up on both sides).
    std::string named;
    bool ok = true;
    if (in_place) {
      named = msg.SerializeAsString();
    } else {
      ok = writer->Write(common::ToByteBuffer(msg));
    }
    bool closed = false;  // the last message carried the end of the stream
    // The messages point into the gradients (or their encoding, which they
    // hold), which stay unchanged until the stream finished: gRPC is done
    // with them when Finish returns.
    common::TensorWireWriter out(
        kPushSlicesField, o.chunk_bytes,
        [&writer](const grpc::ByteBuffer& m) { return writer->Write(m); });
    size_t left = parts.size();
    while (ok) {
      for (const Batch& b : batches) {
        for (int v : b.vars) left -= parts_of[v].size();
        if (compressor_ != nullptr) {
          for (const auto& piece : b.pieces) ok = ok && EncodedPush::WriteTo(piece, s, &out);
          continue;
        }
        if (in_place) {
          for (int v : b.vars) {
            for (int k : parts_of[v]) {
              const int64_t bytes = parts[k].count * static_cast<int64_t>(sizeof(float));
              char* to = peers_.mutable_segment().mutable_at(peers_.push_offset(s, k));
              const float* from = grads_[v]->data() + parts[k].offset;
              if (to != reinterpret_cast<const char*>(from)) std::memcpy(to, from, bytes);
              common::AppendVarintField(v1::ps_wire::kPushSegmentVarField,
                                        static_cast<uint64_t>(k), &named);
              bytes_in_place += bytes;
            }
          }
          continue;
        }
        for (int v : b.vars) {
          for (int k : parts_of[v]) {
            ok = ok && out.Add(static_cast<uint32_t>(k), grads_[v]->data() + parts[k].offset,
                               parts[k].count);
          }
        }
      }
      const bool last = left == 0 && sent_vars == grads_.size();
      if (in_place && ok && !named.empty()) {
        if (last) common::AppendVarintField(v1::ps_wire::kPushCommitField, 1, &named);
        ok = send_named(named, last);
        named.clear();
        closed = last;
      }
      if (ok) ok = out.Finish();  // what was added goes now, not when a chunk fills
      if (last || !ok) break;
      if (!NextSent(&next, &batches)) {  // abandoned: no commit, the call is cancelled
        ok = false;
        ctx.TryCancel();
        if (started) channel->GiveUp();
        break;
      }
      for (const Batch& b : batches) sent_vars += b.vars.size();
    }
    if (ok && !closed) {
      std::string commit;
      common::AppendVarintField(v1::ps_wire::kPushCommitField, 1, &commit);
      ok = send_named(commit, /*last=*/true);
    }
    absl::Status st;
    if (*channel_broke) return absl::UnavailableError("same-host call: the channel broke");
    if (via_channel && !started) {  // abandoned before its first message
      return abandon_.Check("push");
    }
    if (via_channel) {
      if (!ok) return abandon_.Check("push");  // given up above
      st = ReceiveShm(
          channel, s, "Push",
          [response](const std::string& bytes) {
            return response->ParseFromString(bytes)
                       ? absl::OkStatus()
                       : absl::DataLossError("same-host call: the push's answer does not parse");
          },
          channel_broke);
      if (*channel_broke) return st;
    } else {
      st = FromGrpcStatus(writer->Finish(), peers_.Call("Push", s));
    }
    if (st.ok() && in_place) {
      peers_.NotePushedInPlace(s, bytes_in_place, response->names_with_commit());
    }
    if (in_place && absl::IsFailedPrecondition(st) &&
        absl::StrContains(st.message(), v1::ps_wire::kPushSegmentRefused)) {
      // The server cannot open the segment (after all): never again (the
      // caller sends this push again at once, as slices).
      peers_.NoteSegmentRefused(s, st.message());
    }
    return st;
  }

  // Constant after construction.
  GradientCompressor* const compressor_;  // Not owned; null: float32.
  const uint64_t sequence_;
  const int64_t step_;
  const int64_t num_examples_;
  const std::vector<const common::Tensor*> grads_;
  // parts_of_[s][v]: the indices (on server s) of variable v's parts there.
  std::vector<std::vector<std::vector<int>>> parts_of_;
  // [s]: server s takes every gradient in one go, once all are sent (it
  // holds none, or its last answer asked for them with the commit:
  // PsPeers::names_with_commit); any_as_ready_: some server takes each as
  // it is sent.
  std::vector<bool> all_at_once_;
  bool any_as_ready_ = false;
  std::vector<v1::PushResponse> responses_;  // [s]: written by server s's call

  absl::Mutex encode_mu_;  // one Encode at a time (the compressor's residuals)

  std::vector<bool> sent_ ABSL_GUARDED_BY(mu_);      // by variable
  size_t unsent_ ABSL_GUARDED_BY(mu_) = 0;           // of sent_, those false
  std::vector<Batch> batches_ ABSL_GUARDED_BY(mu_);  // in the order they were sent
  absl::Status send_error_ ABSL_GUARDED_BY(mu_);     // a batch that could not be encoded
};

}  // namespace

std::unique_ptr<PushStream> StartGrpcPush(PsPeers& peers, GradientCompressor* compressor,
                                          uint64_t sequence, int64_t step, int64_t num_examples,
                                          std::vector<const common::Tensor*> grads) {
  auto stream = std::make_unique<GrpcPushStream>(peers, compressor, sequence, step, num_examples,
                                                 std::move(grads));
  stream->Start();
  return stream;
}

}  // namespace towerps::worker::internal
