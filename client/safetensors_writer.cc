#include "client/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace towerps::client {
namespace {

constexpr int64_t kF32Bytes = 4;

// JSON string literal for arbitrary bytes (names are UTF-8 in practice).
std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string job_id) : job_id_(std::move(job_id)) {}

absl::Status SafetensorsWriter::CheckLastComplete() const {
  if (vars_.empty()) return absl::OkStatus();
  const Var& v = vars_.back();
  if (v.received != v.elements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "variable \"%s\": received elements [0, %d) of %d: elements [%d, %d) are missing", v.name,
        v.received, v.elements, v.received, v.elements));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Add(const v1::ExportChunk& chunk) {
  if (chunk.global_step() != 0) {
    if (have_step_ && chunk.global_step() != global_step_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chunks from two checkpoints: global step %d and %d", global_step_, chunk.global_step()));
    }
    global_step_ = chunk.global_step();
    have_step_ = true;
  }
  if (chunk.has_def() && !chunk.def().name().empty()) {
    if (absl::Status s = CheckLastComplete(); !s.ok()) return s;
    const v1::VariableDef& def = chunk.def();
    for (const Var& v : vars_) {
      if (v.name == def.name()) {
        return absl::InvalidArgumentError(absl::StrCat("variable \"", def.name(), "\" sent twice"));
      }
    }
    if (def.dtype() != v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat("variable \"", def.name(), "\": dtype ",
                                                     v1::DataType_Name(def.dtype()),
                                                     " (only DT_FLOAT32 is exported)"));
    }
    Var v;
    v.name = def.name();
    v.elements = 1;
    for (int64_t d : def.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", def.name(), "\": negative dimension ", d));
      }
      v.shape.push_back(d);
      v.elements *= d;
    }
    v.begin = static_cast<int64_t>(data_.size());
    vars_.push_back(std::move(v));
  } else if (vars_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at element ", chunk.offset(), " before any variable definition"));
  }
  Var& v = vars_.back();
  if (chunk.data().size() % kF32Bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("variable \"%s\": chunk at element %d has %d bytes, not a multiple of 4",
                        v.name, chunk.offset(), chunk.data().size()));
  }
  const int64_t n = static_cast<int64_t>(chunk.data().size()) / kF32Bytes;
  if (chunk.offset() != v.received) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "variable \"%s\": chunk at element %d, expected %d (%s)", v.name, chunk.offset(),
        v.received, chunk.offset() > v.received ? "a gap" : "an overlap"));
  }
  if (v.received + n > v.elements) {
    return absl::InvalidArgumentError(
        absl::StrFormat("variable \"%s\": chunk ends at element %d, past its %d elements", v.name,
                        v.received + n, v.elements));
  }
  data_.append(chunk.data());
  v.received += n;
  return absl::OkStatus();
}

absl::StatusOr<std::string> SafetensorsWriter::Serialize() const {
  if (vars_.empty()) {
    return absl::FailedPreconditionError("the export stream held no variable");
  }
  if (absl::Status s = CheckLastComplete(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("stream ended early: ", s.message()));
  }
  std::string header = "{";
  for (const Var& v : vars_) {
    absl::StrAppend(&header, JsonQuote(v.name), ":{\"dtype\":\"F32\",\"shape\":[",
                    absl::StrJoin(v.shape, ","), "],\"data_offsets\":[", v.begin, ",",
                    v.begin + v.elements * kF32Bytes, "]},");
  }
  // safetensors metadata is a map of strings to strings.
  absl::StrAppend(&header, "\"__metadata__\":{\"job_id\":", JsonQuote(job_id_),
                  ",\"global_step\":\"", global_step_, "\"}}");
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + header.size() + data_.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out += data_;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  absl::StatusOr<std::string> bytes = Serialize();
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  const char* p = bytes->data();
  size_t left = bytes->size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      absl::Status s = ErrnoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = ErrnoError("cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::close(fd) != 0) {
    absl::Status s = ErrnoError("cannot close", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError(absl::StrCat("cannot rename ", tmp, " to"), path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace towerps::client
