#include "tests/bench/echo_service.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace towerps::bench {

namespace {

constexpr char kSlotKey[] = "echo-slot";

}  // namespace

EchoServiceImpl::EchoServiceImpl(int64_t capacity_bytes, int slots) {
  for (int i = 0; i < slots; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    absl::MutexLock lock(&slots_.back()->mu);
    slots_.back()->stored.assign(static_cast<size_t>(capacity_bytes / 4), 0.0f);
  }
}

EchoServiceImpl::Slot* EchoServiceImpl::SlotOf(const grpc::ServerContext& context) {
  int slot = 0;
  const auto& md = context.client_metadata();
  if (auto it = md.find(kSlotKey); it != md.end()) {
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &slot)) {
      return nullptr;
    }
  }
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return nullptr;
  return slots_[slot].get();
}

bool EchoServiceImpl::Store(Slot& slot, int64_t offset, const void* data, int64_t n) {
  absl::MutexLock lock(&slot.mu);
  if (offset < 0 || n < 0 || offset + n > static_cast<int64_t>(slot.stored.size()) * 4) {
    return false;
  }
  std::memcpy(reinterpret_cast<char*>(slot.stored.data()) + offset, data, n);
  return true;
}

bool EchoServiceImpl::Load(Slot& slot, int64_t offset, void* data, int64_t n) {
  absl::MutexLock lock(&slot.mu);
  if (offset < 0 || n < 0 || offset + n > static_cast<int64_t>(slot.stored.size()) * 4) {
    return false;
  }
  std::memcpy(data, reinterpret_cast<const char*>(slot.stored.data()) + offset, n);
  return true;
}

namespace {

const grpc::Status kBadSlot(grpc::StatusCode::INVALID_ARGUMENT, "echo: no such slot");

}  // namespace

// The lock is taken per chunk copy, never across a Read or Write.
grpc::Status EchoServiceImpl::UploadBytes(grpc::ServerContext* context,
                                          grpc::ServerReader<BytesChunk>* reader,
                                          UploadAck* response) {
  Slot* slot = SlotOf(*context);
  if (slot == nullptr) return kBadSlot;
  BytesChunk msg;
  int64_t off = 0;
  while (reader->Read(&msg)) {
    const int64_t n = static_cast<int64_t>(msg.data().size());
    if (!Store(*slot, off, msg.data().data(), n)) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "echo: upload too large");
    }
    off += n;
  }
  response->set_bytes(off);
  return grpc::Status::OK;
}

grpc::Status EchoServiceImpl::UploadFloats(grpc::ServerContext* context,
                                           grpc::ServerReader<FloatChunk>* reader,
                                           UploadAck* response) {
  Slot* slot = SlotOf(*context);
  if (slot == nullptr) return kBadSlot;
  FloatChunk msg;
  int64_t off = 0;
  while (reader->Read(&msg)) {
    const int64_t n = static_cast<int64_t>(msg.data_size()) * 4;
    if (!Store(*slot, off, msg.data().data(), n)) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "echo: upload too large");
    }
    off += n;
  }
  response->set_bytes(off);
  return grpc::Status::OK;
}

namespace {

int64_t ChunkOf(const DownloadRequest& request) {
  return std::max<int64_t>(4, request.chunk_bytes() / 4 * 4);
}

}  // namespace

grpc::Status EchoServiceImpl::DownloadBytes(grpc::ServerContext* context,
                                            const DownloadRequest* request,
                                            grpc::ServerWriter<BytesChunk>* writer) {
  Slot* slot = SlotOf(*context);
  if (slot == nullptr) return kBadSlot;
  const int64_t chunk = ChunkOf(*request);
  BytesChunk msg;  // reused: the string keeps its capacity
  for (int64_t off = 0; off < request->bytes(); off += chunk) {
    const int64_t n = std::min(chunk, request->bytes() - off);
    std::string* s = msg.mutable_data();
    s->resize(n);
    if (!Load(*slot, off, s->data(), n)) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "echo: download past the end");
    }
    if (!writer->Write(msg)) break;  // client gone
  }
  return grpc::Status::OK;
}

grpc::Status EchoServiceImpl::DownloadFloats(grpc::ServerContext* context,
                                             const DownloadRequest* request,
                                             grpc::ServerWriter<FloatChunk>* writer) {
  Slot* slot = SlotOf(*context);
  if (slot == nullptr) return kBadSlot;
  const int64_t chunk = ChunkOf(*request);
  FloatChunk msg;  // reused: the repeated field keeps its capacity
  for (int64_t off = 0; off < request->bytes(); off += chunk) {
    const int64_t n = std::min(chunk, request->bytes() - off);
    msg.mutable_data()->Resize(static_cast<int>(n / 4), 0.0f);
    if (!Load(*slot, off, msg.mutable_data()->mutable_data(), n)) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "echo: download past the end");
    }
    if (!writer->Write(msg)) break;
  }
  return grpc::Status::OK;
}

namespace {

void SetSlot(grpc::ClientContext& ctx, int slot) {
  if (slot != 0) ctx.AddMetadata(kSlotKey, absl::StrCat(slot));
}

template <typename Chunk>
absl::Status Upload(Echo::Stub& stub, int64_t chunk_bytes, absl::Span<const float> data,
                    int slot);

template <>
absl::Status Upload<BytesChunk>(Echo::Stub& stub, int64_t chunk_bytes,
                                absl::Span<const float> data, int slot) {
  grpc::ClientContext ctx;
  SetSlot(ctx, slot);
  UploadAck ack;
  auto writer = stub.UploadBytes(&ctx, &ack);
  const char* p = reinterpret_cast<const char*>(data.data());
  const int64_t total = static_cast<int64_t>(data.size()) * 4;
  BytesChunk msg;
  for (int64_t off = 0; off < total; off += chunk_bytes) {
    msg.mutable_data()->assign(p + off, std::min(chunk_bytes, total - off));
    if (!writer->Write(msg)) break;
  }
  writer->WritesDone();
  TOWERPS_RETURN_IF_ERROR(common::FromGrpcStatus(writer->Finish()));
  if (ack.bytes() != total) {
    return absl::DataLossError(absl::StrCat("echo: server stored ", ack.bytes(), " of ", total));
  }
  return absl::OkStatus();
}

template <>
absl::Status Upload<FloatChunk>(Echo::Stub& stub, int64_t chunk_bytes,
                                absl::Span<const float> data, int slot) {
  grpc::ClientContext ctx;
  SetSlot(ctx, slot);
  UploadAck ack;
  auto writer = stub.UploadFloats(&ctx, &ack);
  const int64_t per_msg = chunk_bytes / 4;
  const int64_t total = static_cast<int64_t>(data.size());
  FloatChunk msg;
  for (int64_t off = 0; off < total; off += per_msg) {
    msg.clear_data();
    msg.mutable_data()->Add(data.data() + off, data.data() + std::min(total, off + per_msg));
    if (!writer->Write(msg)) break;
  }
  writer->WritesDone();
  TOWERPS_RETURN_IF_ERROR(common::FromGrpcStatus(writer->Finish()));
  if (ack.bytes() != total * 4) {
    return absl::DataLossError(
        absl::StrCat("echo: server stored ", ack.bytes(), " of ", total * 4));
  }
  return absl::OkStatus();
}

const std::string& DataOf(const BytesChunk& m) { return m.data(); }

absl::Status Download(Echo::Stub& stub, Payload payload, int64_t chunk_bytes,
                      absl::Span<float> out, int slot) {
  DownloadRequest req;
  req.set_bytes(static_cast<int64_t>(out.size()) * 4);
  req.set_chunk_bytes(chunk_bytes);
  grpc::ClientContext ctx;
  SetSlot(ctx, slot);
  char* dst = reinterpret_cast<char*>(out.data());
  const int64_t total = req.bytes();
  int64_t off = 0;
  bool overflow = false;
  auto take = [&](const void* src, int64_t n) {
    if (off + n > total) {
      overflow = true;
      return;
    }
    std::memcpy(dst + off, src, n);
    off += n;
  };
  grpc::Status st;
  if (payload == Payload::kBytes) {
    auto reader = stub.DownloadBytes(&ctx, req);
    BytesChunk msg;
    while (reader->Read(&msg)) take(DataOf(msg).data(), DataOf(msg).size());
    st = reader->Finish();
  } else {
    auto reader = stub.DownloadFloats(&ctx, req);
    FloatChunk msg;
    while (reader->Read(&msg)) take(msg.data().data(), int64_t{msg.data_size()} * 4);
    st = reader->Finish();
  }
  TOWERPS_RETURN_IF_ERROR(common::FromGrpcStatus(st));
  if (overflow || off != total) {
    return absl::DataLossError(absl::StrCat("echo: got ", off, " bytes back of ", total));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EchoRoundTrip(Echo::Stub& stub, Payload payload, int64_t chunk_bytes,
                           absl::Span<const float> data, absl::Span<float> out, int slot) {
  if (out.size() != data.size()) {
    return absl::InvalidArgumentError("echo: output size differs from input size");
  }
  chunk_bytes = std::max<int64_t>(4, chunk_bytes / 4 * 4);
  if (payload == Payload::kBytes) {
    TOWERPS_RETURN_IF_ERROR(Upload<BytesChunk>(stub, chunk_bytes, data, slot));
  } else {
    TOWERPS_RETURN_IF_ERROR(Upload<FloatChunk>(stub, chunk_bytes, data, slot));
  }
  return Download(stub, payload, chunk_bytes, out, slot);
}

}  // namespace towerps::bench
