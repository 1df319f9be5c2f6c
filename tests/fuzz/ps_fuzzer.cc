// Fuzzes the parameter server's RPC handlers in-process, with no network: a
// fresh ParameterServer per input, fed a sequence of serialized requests.
// Input: records of [op byte][length, 2 bytes little-endian][payload], the
// payload a serialized request picked by op % 7:
//   0 RegisterRequest  (ParameterServiceImpl::RegisterVariables)
//   1 PushRequest      (the raw bytes, as one message of a push stream, cut
//                       into 7-byte gRPC slices, fed to the service's
//                       PushStreamDecoder: BeginPush/Reserve/FinishSlice/
//                       FinishPush; compressed pushes, header.slice_encoding,
//                       decoded too: seed-compressed; a header's shared
//                       segment with pid 1 is this process's own, its
//                       gradients read from there by segment_vars)
//   2 PullRequest      (ParameterServer::Pull with no wait, then the service's
//                       TensorWireWriter chunking, read back by the client's
//                       ReadTensorMessage; a named shared segment opened and
//                       written as the service would: pid 1 stands for this
//                       process's own segment)
//   3 HeartbeatRequest 4 StatusRequest 5 DeleteJobRequest
//   6 SaveRequest      (SaveCheckpoint)
// A payload that does not parse is skipped. Every directory a request names
// (checkpoint_dir, restore_from) is replaced by one under this process's temp
// directory, so the fuzzer never writes elsewhere.
// Invariants: no crash, no exception out of a handler (gRPC would answer
// UNKNOWN), an error code the API documents with a message; a pull's chunks
// cover the snapshot exactly; and every value pulled is finite: no
// registration, push or restore puts a NaN or Inf into a job's values
// (refused gradients, checked initializers and checkpoints, the overflow
// guard of the updates).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/shared_segment.h"
#include "common/tensor_wire.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"
#include "ps/parameter_server.h"
#include "ps/ps_service.h"
#include "ps/segment_gates.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace v1 = towerps::v1;
using towerps::ps::ParameterServer;

constexpr int64_t kMaxJobBytes = int64_t{16} << 20;

void CheckError(grpc::StatusCode code, const std::string& message, const char* what) {
  towerps::fuzz::CheckHandlerError(static_cast<int>(code), message, what);
}

void CheckError(const absl::Status& s, const char* what) {
  towerps::fuzz::CheckHandlerError(static_cast<int>(s.code()), std::string(s.message()), what);
}

// Both the request's directories forced under the temp directory.
std::string CheckpointDir() { return towerps::fuzz::FuzzTempDir() + "/ps/ckpt-0000000001"; }

towerps::common::SharedSegment* OwnSegment() {
  static towerps::common::SharedSegment* const own = [] {
    auto s = towerps::common::SharedSegment::Create(int64_t{1} << 20);
    FUZZ_CHECK(s.ok(), "no segment: %s", s.status().ToString().c_str());
    return s->release();
  }();
  return own;
}

// pid 1 in a fuzzed segment stands for this process's own segment.
void UseOwnSegment(v1::SharedSegment* segment) {
  if (segment->pid() != 1) return;
  segment->set_pid(OwnSegment()->pid());
  segment->set_fd(OwnSegment()->fd());
  segment->set_nonce(OwnSegment()->nonce());
}

void DoPush(ParameterServer& ps, const uint8_t* data, size_t size) {
  // A header that names segment pid 1 gets this process's own segment, so
  // that reading gradients from it (segment_vars) is reached.
  std::string patched;
  v1::PushRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size)) &&
      request.header().segment().pid() == 1) {
    UseOwnSegment(request.mutable_header()->mutable_segment());
    patched = request.SerializeAsString();
    data = reinterpret_cast<const uint8_t*>(patched.data());
    size = patched.size();
  }
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < size; i += 7) slices.emplace_back(data + i, std::min<size_t>(7, size - i));
  towerps::ps::PushStreamDecoder decoder(ps);
  const absl::Status s = decoder.Add(grpc::ByteBuffer(slices.data(), slices.size()));
  if (!s.ok()) return CheckError(s, "PushStreamDecoder::Add");
  auto r = decoder.Finish();
  CheckError(r.status(), "FinishPush");
}

// A pull that names a shared segment: pid 1 stands for this process's own
// segment (its pid, fd and nonce put in; size and offsets as fuzzed), so
// that the checks on size and offsets are reached. Whatever passes them is
// written; the segment's header must come out unchanged.
void PullIntoSegment(v1::SharedSegment segment, const towerps::ps::WeightsSnapshot& w) {
  towerps::common::SharedSegment* const own = OwnSegment();
  UseOwnSegment(&segment);
  const std::string header(own->at(0), 64);
  auto file = towerps::ps::OpenSegment(segment);
  const absl::Status fits =
      file.ok() ? towerps::ps::CheckPullSegment(segment, w, **file) : file.status();
  if (!fits.ok()) {
    const auto code = fits.code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kFailedPrecondition,
               "OpenSegment, CheckPullSegment: %s", fits.ToString().c_str());
    return;
  }
  for (size_t v = 0; v < w.values.size(); ++v) {
    const absl::Status s =
        (*file)->Write(segment.offsets(static_cast<int>(v)), w.values[v].data(),
                    static_cast<int64_t>(w.values[v].size() * sizeof(float)));
    FUZZ_CHECK(s.ok(), "an accepted offset did not fit: %s", s.ToString().c_str());
  }
  FUZZ_CHECK(std::string(own->at(0), 64) == header, "the segment's header was written");
}

void DoPull(ParameterServer& ps, const v1::PullRequest& request) {
  auto snap = ps.Pull(request, absl::Now());
  if (!snap.ok()) {
    const auto code = snap.status().code();
    FUZZ_CHECK(code != absl::StatusCode::kUnknown && code != absl::StatusCode::kInternal,
               "Pull: %s", snap.status().ToString().c_str());
    return;
  }
  const towerps::ps::WeightsSnapshot& w = **snap;
  for (size_t v = 0; v < w.values.size(); ++v) {
    for (size_t i = 0; i < w.values[v].size(); ++i) {
      FUZZ_CHECK(std::isfinite(w.values[v][i]), "variable %zu element %zu is %g", v, i,
                 static_cast<double>(w.values[v][i]));
    }
  }
  const int64_t chunk =
      std::clamp<int64_t>(request.chunk_bytes() > 0 ? request.chunk_bytes() : 4096, 4096,
                          int64_t{32} << 20) /
      4 * 4;
  std::vector<std::vector<float>> seen(w.values.size());
  for (size_t v = 0; v < w.values.size(); ++v) seen[v].assign(w.values[v].size(), -1.0f);
  std::vector<int64_t> covered(w.values.size(), 0);
  towerps::common::TensorWireHandler h;
  h.on_slice = [&](uint32_t var, uint64_t offset, uint64_t n) -> absl::StatusOr<char*> {
    FUZZ_CHECK(var < seen.size(), "slice of variable %u", var);
    FUZZ_CHECK(static_cast<int64_t>(offset) == covered[var] && n % 4 == 0 &&
                   offset + n / 4 <= seen[var].size(),
               "slice out of order");
    covered[var] += static_cast<int64_t>(n / 4);
    return reinterpret_cast<char*>(seen[var].data() + offset);
  };
  towerps::common::TensorWireWriter out(2, chunk, [&](const grpc::ByteBuffer& m) {
    const absl::Status s = towerps::common::ReadTensorMessage(m, 2, h);
    FUZZ_CHECK(s.ok(), "pull message does not read back: %s", s.ToString().c_str());
    return true;
  });
  for (size_t v = 0; v < w.values.size(); ++v) {
    out.Add(static_cast<uint32_t>(v), w.values[v].data(), static_cast<int64_t>(w.values[v].size()),
            0, *snap);
  }
  FUZZ_CHECK(out.Finish(/*even_if_empty=*/w.values.empty()), "pull chunks not written");
  if (request.has_segment()) PullIntoSegment(request.segment(), w);
  for (size_t v = 0; v < w.values.size(); ++v) {
    FUZZ_CHECK(covered[v] == static_cast<int64_t>(w.values[v].size()) &&
                   (seen[v].empty() ||
                    std::memcmp(seen[v].data(), w.values[v].data(), seen[v].size() * 4) == 0),
               "pulled variable %zu differs from the snapshot", v);
  }
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

// Protobuf's own log line for each string that is not UTF-8 would drown the
// output (the parse fails and the record is skipped, as gRPC would).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  towerps::ps::ParameterServerOptions options;
  options.max_pull_wait = absl::ZeroDuration();
  options.max_job_bytes = kMaxJobBytes;
  // Same-host pushes here come from this very process: update them ahead
  // all the same (SGD, and slot rules), to reach that path too.
  options.as_if_on_cores_apart = true;
  ParameterServer ps(options);
  towerps::ps::ParameterServiceImpl service(ps, /*default_chunk_bytes=*/4096);
  grpc::ServerContext context;

  towerps::fuzz::ForEachRecord(data, size, 7, [&](int op, const uint8_t* payload, size_t len) {
    grpc::Status s;
    switch (op) {
      case 0: {
        v1::RegisterRequest r;
        if (!Parse(payload, len, &r)) return;
        if (!r.restore_from().empty()) r.set_restore_from(CheckpointDir());
        v1::RegisterResponse out;
        s = service.RegisterVariables(&context, &r, &out);
        break;
      }
      case 1: {
        DoPush(ps, payload, len);
        return;
      }
      case 2: {
        v1::PullRequest r;
        if (Parse(payload, len, &r)) DoPull(ps, r);
        return;
      }
      case 3: {
        v1::HeartbeatRequest r;
        if (!Parse(payload, len, &r)) return;
        v1::HeartbeatResponse out;
        s = service.Heartbeat(&context, &r, &out);
        break;
      }
      case 4: {
        v1::StatusRequest r;
        if (!Parse(payload, len, &r)) return;
        v1::StatusResponse out;
        s = service.GetStatus(&context, &r, &out);
        break;
      }
      case 5: {
        v1::DeleteJobRequest r;
        if (!Parse(payload, len, &r)) return;
        v1::DeleteJobResponse out;
        s = service.DeleteJob(&context, &r, &out);
        FUZZ_CHECK(out.bytes_freed() >= 0, "freed %lld bytes",
                   static_cast<long long>(out.bytes_freed()));
        break;
      }
      case 6: {
        v1::SaveRequest r;
        if (!Parse(payload, len, &r)) return;
        if (!r.checkpoint_dir().empty()) r.set_checkpoint_dir(CheckpointDir());
        v1::SaveResponse out;
        s = service.SaveCheckpoint(&context, &r, &out);
        break;
      }
    }
    if (!s.ok()) CheckError(s.error_code(), s.error_message(), "handler");
  });
  return 0;
}
