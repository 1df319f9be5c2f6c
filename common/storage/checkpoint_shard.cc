// A checkpoint shard's file: its encoding (records of the header, each
// variable's definition and its values and slots as float32 payloads) and
// its decoding, which checks every field before it is trusted. The
// manifest and the checkpoint directories are in checkpoint.cc.
#include "common/storage/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <utility>

#include "absl/base/config.h"
#include "absl/base/internal/endian.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "proto/checkpoint.pb.h"

namespace towerps::common {
namespace {

constexpr char kShardMagic[] = "towerps-shard";

// Elements of a tensor of shape `def.shape()`, or a message saying why there
// is no such count (a negative dimension, overflow).
absl::StatusOr<int64_t> NumElements(const v1::VariableDef& def) {
  int64_t n = 1;
  for (const int64_t d : def.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable \"", def.name(), "\" has shape ",
                                                     absl::StrJoin(def.shape(), "x")));
    }
    // Bytes (4 per element) must fit in int64 as well.
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) {
      return absl::InvalidArgumentError(absl::StrCat("variable \"", def.name(), "\" shape ",
                                                     absl::StrJoin(def.shape(), "x"),
                                                     " overflows"));
    }
    n *= d;
  }
  return n;
}

// Where an encoder's bytes go, in order.
using ByteSink = std::function<absl::Status(absl::string_view)>;

// Writes one record of `data` to `sink`, the data from where it lies.
absl::Status WriteRecord(absl::string_view data, const ByteSink& sink) {
  std::string head, tail;
  RecordFraming(data, &head, &tail);
  TOWERPS_RETURN_IF_ERROR(sink(head));
  TOWERPS_RETURN_IF_ERROR(sink(data));
  return sink(tail);
}

// Writes `values` as raw little-endian float32 records of at most
// `max_record_bytes` (a multiple of 4) each; none for an empty tensor.
// Adds the number of records to `*records`.
absl::Status WriteFloatRecords(absl::Span<const float> values, int64_t max_record_bytes,
                               const ByteSink& sink, int64_t* records) {
  const size_t per_record = static_cast<size_t>(max_record_bytes / 4);
#if !defined(ABSL_IS_LITTLE_ENDIAN)
  std::string le;
#endif
  for (size_t begin = 0; begin < values.size(); begin += per_record) {
    const size_t n = std::min(per_record, values.size() - begin);
#if defined(ABSL_IS_LITTLE_ENDIAN)
    TOWERPS_RETURN_IF_ERROR(WriteRecord(
        absl::string_view(reinterpret_cast<const char*>(values.data() + begin), 4 * n), sink));
#else
    le.resize(4 * n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[begin + i], 4);
      absl::little_endian::Store32(&le[4 * i], bits);
    }
    TOWERPS_RETURN_IF_ERROR(WriteRecord(le, sink));
#endif
    ++*records;
  }
  return absl::OkStatus();
}

void CopyFloats(absl::string_view le, float* dst) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  std::memcpy(dst, le.data(), le.size());
#else
  for (size_t i = 0; i < le.size() / 4; ++i) {
    const uint32_t bits = absl::little_endian::Load32(le.data() + 4 * i);
    std::memcpy(&dst[i], &bits, 4);
  }
#endif
}

absl::Status ValidateShard(const ShardView& state, const ShardWriteOptions& options) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("write shard of job \"", state.job_id,
                                                   "\" task ", state.ps_task, ": ", what));
  };
  if (options.max_record_bytes < 4) {
    return bad(absl::StrCat("max_record_bytes ", options.max_record_bytes, " < 4"));
  }
  if (state.num_ps < 1 || state.ps_task < 0 || state.ps_task >= state.num_ps) {
    return bad(absl::StrCat("ps_task ", state.ps_task, " not in [0, num_ps ", state.num_ps, ")"));
  }
  for (const ShardView::Variable& v : state.vars) {
    if (v.def.dtype() != v1::DT_FLOAT32) {
      return bad(absl::StrCat("variable \"", v.def.name(), "\" has dtype ", v.def.dtype(),
                              ", only DT_FLOAT32 is supported"));
    }
    absl::StatusOr<int64_t> n = NumElements(v.def);
    if (!n.ok()) return bad(std::string(n.status().message()));
    if (static_cast<int64_t>(v.value.size()) != *n) {
      return bad(absl::StrCat("variable \"", v.def.name(), "\" has ", v.value.size(),
                              " values, its shape ", absl::StrJoin(v.def.shape(), "x"),
                              " has ", *n, " elements"));
    }
    std::set<absl::string_view> names;
    for (const ShardView::Slot& slot : v.slots) {
      if (slot.name.empty() || !names.insert(slot.name).second) {
        return bad(absl::StrCat("variable \"", v.def.name(), "\" has an empty or duplicate slot "
                                "name \"", slot.name, "\""));
      }
      if (slot.values.size() != v.value.size()) {
        return bad(absl::StrCat("variable \"", v.def.name(), "\" slot \"", slot.name, "\" has ",
                                slot.values.size(), " values for ", v.value.size(), " elements"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EncodeShard(const ShardView& state, const ShardWriteOptions& options,
                         const ByteSink& sink) {
  size_t payload = 0;
  for (const ShardView::Variable& v : state.vars) {
    payload += 4 * v.value.size();
    for (const ShardView::Slot& s : v.slots) payload += 4 * s.values.size();
  }
  int64_t records = 0;
  ckpt::ShardHeader header;
  header.set_magic(kShardMagic);
  header.set_format_version(kShardFormatVersion);
  header.set_job_id(state.job_id);
  header.set_ps_task(state.ps_task);
  header.set_num_ps(state.num_ps);
  header.set_global_step(state.global_step);
  header.set_num_variables(static_cast<int64_t>(state.vars.size()));
  header.mutable_worker_completed()->Add(state.worker_completed.begin(),
                                         state.worker_completed.end());
  TOWERPS_RETURN_IF_ERROR(WriteRecord(header.SerializeAsString(), sink));
  ++records;

  for (const ShardView::Variable& v : state.vars) {
    ckpt::VariableHeader vh;
    *vh.mutable_def() = v.def;
    vh.set_updates(v.updates);
    vh.set_num_elements(static_cast<int64_t>(v.value.size()));
    for (const ShardView::Slot& s : v.slots) {
      ckpt::SlotHeader* sh = vh.add_slots();
      sh->set_name(s.name);
      sh->set_num_elements(static_cast<int64_t>(s.values.size()));
    }
    TOWERPS_RETURN_IF_ERROR(WriteRecord(vh.SerializeAsString(), sink));
    ++records;
    TOWERPS_RETURN_IF_ERROR(WriteFloatRecords(v.value, options.max_record_bytes, sink, &records));
    for (const ShardView::Slot& s : v.slots) {
      TOWERPS_RETURN_IF_ERROR(
          WriteFloatRecords(s.values, options.max_record_bytes, sink, &records));
    }
  }

  ckpt::ShardFooter footer;
  footer.set_num_variables(static_cast<int64_t>(state.vars.size()));
  footer.set_num_records(records);
  footer.set_payload_bytes(static_cast<int64_t>(payload));
  return WriteRecord(footer.SerializeAsString(), sink);
}

// Walks a shard file's records in order, checking each against what the
// previous ones announced. Every error is DataLoss naming the file.
class ShardDecoder {
 public:
  ShardDecoder(absl::string_view buffer, const std::string& path)
      : buffer_(buffer), path_(path), reader_(buffer, path) {}

  // Fills `state`; the values only if `keep_values`.
  absl::Status Decode(bool keep_values, ShardState* state) {
    TOWERPS_ASSIGN_OR_RETURN(absl::string_view rec, Next("the header"));
    ckpt::ShardHeader header;
    if (!header.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
      return Error("the header record does not parse");
    }
    if (header.magic() != kShardMagic) {
      return Error(absl::StrCat("not a shard file (magic \"", absl::CHexEscape(header.magic()),
                                "\", expected \"", kShardMagic, "\")"));
    }
    if (header.format_version() != kShardFormatVersion) {
      return Error(absl::StrCat("format version ", header.format_version(),
                                ", this build reads version ", kShardFormatVersion));
    }
    if (header.num_ps() < 1 || header.ps_task() < 0 || header.ps_task() >= header.num_ps()) {
      return Error(absl::StrCat("header has ps_task ", header.ps_task(), " of num_ps ",
                                header.num_ps()));
    }
    // Every variable takes at least one record (16 bytes of framing).
    if (header.num_variables() < 0 ||
        header.num_variables() > static_cast<int64_t>(buffer_.size() / 16)) {
      return Error(absl::StrCat("header announces ", header.num_variables(),
                                " variables, impossible in ", buffer_.size(), " bytes"));
    }
    state->job_id = header.job_id();
    state->ps_task = header.ps_task();
    state->num_ps = header.num_ps();
    state->global_step = header.global_step();
    state->worker_completed.assign(header.worker_completed().begin(),
                                   header.worker_completed().end());
    state->vars.clear();
    if (keep_values) state->vars.reserve(static_cast<size_t>(header.num_variables()));

    for (int64_t i = 0; i < header.num_variables(); ++i) {
      TOWERPS_ASSIGN_OR_RETURN(rec, Next(absl::StrCat("the header of variable ", i)));
      ckpt::VariableHeader vh;
      if (!vh.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
        return Error(absl::StrCat("the header of variable ", i, " does not parse"));
      }
      const std::string var = absl::StrCat("variable ", i, " \"", vh.def().name(), "\"");
      if (vh.def().dtype() != v1::DT_FLOAT32) {
        return Error(absl::StrCat(var, " has dtype ", vh.def().dtype(), ", expected DT_FLOAT32"));
      }
      absl::StatusOr<int64_t> n = NumElements(vh.def());
      if (!n.ok()) return Error(std::string(n.status().message()));
      if (vh.num_elements() != *n) {
        return Error(absl::StrCat(var, " has ", vh.num_elements(), " elements, its shape ",
                                  absl::StrJoin(vh.def().shape(), "x"), " has ", *n));
      }
      VariableState v;
      TOWERPS_RETURN_IF_ERROR(
          ReadFloats(*n, absl::StrCat(var, " value"), keep_values ? &v.value : nullptr));
      std::set<std::string> names;
      for (const ckpt::SlotHeader& sh : vh.slots()) {
        const std::string slot = absl::StrCat(var, " slot \"", sh.name(), "\"");
        if (sh.name().empty() || !names.insert(sh.name()).second) {
          return Error(absl::StrCat(slot, ": empty or duplicate slot name"));
        }
        if (sh.num_elements() < 0) {
          return Error(absl::StrCat(slot, " has ", sh.num_elements(), " elements"));
        }
        SlotValues s;
        s.name = sh.name();
        TOWERPS_RETURN_IF_ERROR(ReadFloats(sh.num_elements(), slot, keep_values ? &s.values : nullptr));
        if (keep_values) v.slots.push_back(std::move(s));
      }
      if (keep_values) {
        v.def = std::move(*vh.mutable_def());
        v.updates = vh.updates();
        state->vars.push_back(std::move(v));
      }
    }

    const int64_t records_before_footer = records_;
    TOWERPS_ASSIGN_OR_RETURN(rec, Next("the footer"));
    ckpt::ShardFooter footer;
    if (!footer.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
      return Error(absl::StrCat("the footer record at byte ", record_offset_,
                                " does not parse"));
    }
    if (footer.num_variables() != header.num_variables() ||
        footer.num_records() != records_before_footer || footer.payload_bytes() != payload_bytes_) {
      return Error(absl::StrCat("footer counts (", footer.num_variables(), " variables, ",
                                footer.num_records(), " records, ", footer.payload_bytes(),
                                " payload bytes) do not match the file (",
                                header.num_variables(), ", ", records_before_footer, ", ",
                                payload_bytes_, ")"));
    }
    absl::StatusOr<absl::string_view> extra = reader_.Next();
    if (extra.ok()) {
      return Error(absl::StrCat("trailing record at byte ", record_offset_, " after the footer"));
    }
    if (!absl::IsOutOfRange(extra.status())) return extra.status();
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", what));
  }

  // The next record, which should be `what`. A clean end of the file here
  // means it was cut short.
  absl::StatusOr<absl::string_view> Next(const std::string& what) {
    record_offset_ = reader_.offset();
    absl::StatusOr<absl::string_view> rec = reader_.Next();
    if (absl::IsOutOfRange(rec.status())) {
      return Error(absl::StrCat("truncated: ends after ", records_, " records (", buffer_.size(),
                                " bytes) where ", what, " should follow; no footer"));
    }
    if (rec.ok()) ++records_;
    return rec;
  }

  // Reads `n` floats from payload records into `out` (if not null).
  absl::Status ReadFloats(int64_t n, const std::string& what, std::vector<float>* out) {
    const int64_t left_in_file = static_cast<int64_t>(buffer_.size()) - reader_.offset();
    if (n > left_in_file / 4) {
      return Error(absl::StrCat("truncated: ", what, " has ", n, " elements, only ",
                                left_in_file, " bytes are left in the file"));
    }
    if (out != nullptr) out->resize(static_cast<size_t>(n));
    int64_t done = 0;  // Bytes.
    const int64_t total = 4 * n;
    while (done < total) {
      TOWERPS_ASSIGN_OR_RETURN(absl::string_view rec,
                               Next(absl::StrCat(what, " payload at element ", done / 4)));
      const int64_t size = static_cast<int64_t>(rec.size());
      if (size == 0 || size % 4 != 0 || size > total - done) {
        return Error(absl::StrCat(what, ": payload record at byte ", record_offset_, " has ", size,
                                  " bytes, expected a positive multiple of 4 up to ",
                                  total - done));
      }
      if (out != nullptr) CopyFloats(rec, out->data() + done / 4);
      done += size;
    }
    payload_bytes_ += total;
    return absl::OkStatus();
  }

  const absl::string_view buffer_;
  const std::string path_;
  RecordReader reader_;
  int64_t records_ = 0;        // Read so far.
  int64_t payload_bytes_ = 0;  // Float32 payload read so far.
  int64_t record_offset_ = 0;  // Of the last record asked for.
};

absl::StatusOr<ShardState> ReadShardImpl(const std::string& path, bool keep_values) {
  TOWERPS_ASSIGN_OR_RETURN(std::string contents, ReadFileToString(path));
  ShardState state;
  ShardDecoder decoder(contents, path);
  TOWERPS_RETURN_IF_ERROR(decoder.Decode(keep_values, &state));
  return state;
}

}  // namespace

std::string ShardFileName(int ps_task, int num_ps) {
  return absl::StrCat("shard-", ps_task, "-of-", num_ps);
}

ShardView ViewOf(const ShardState& state) {
  ShardView view;
  view.job_id = state.job_id;
  view.ps_task = state.ps_task;
  view.num_ps = state.num_ps;
  view.global_step = state.global_step;
  view.worker_completed = state.worker_completed;
  for (const VariableState& v : state.vars) {
    ShardView::Variable& out = view.vars.emplace_back();
    out.def = v.def;
    out.value = v.value;
    out.updates = v.updates;
    for (const SlotValues& s : v.slots) out.slots.push_back({s.name, s.values});
  }
  return view;
}

absl::StatusOr<std::string> WriteShard(const std::string& checkpoint_dir, const ShardView& shard,
                                       const ShardWriteOptions& options) {
  TOWERPS_RETURN_IF_ERROR(ValidateShard(shard, options));
  TOWERPS_RETURN_IF_ERROR(MakeDirs(checkpoint_dir));
  const std::string path = JoinPath(checkpoint_dir, ShardFileName(shard.ps_task, shard.num_ps));
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file,
                           AtomicFileWriter::Create(path));
  TOWERPS_RETURN_IF_ERROR(EncodeShard(
      shard, options, [&file](absl::string_view bytes) { return file->Append(bytes); }));
  TOWERPS_RETURN_IF_ERROR(file->Commit());
  return path;
}

absl::StatusOr<std::string> WriteShard(const std::string& checkpoint_dir, const ShardState& state,
                                       const ShardWriteOptions& options) {
  return WriteShard(checkpoint_dir, ViewOf(state), options);
}

absl::StatusOr<ShardState> ReadShard(const std::string& path) {
  return ReadShardImpl(path, /*keep_values=*/true);
}

absl::StatusOr<ShardState> VerifyShard(const std::string& path) {
  return ReadShardImpl(path, /*keep_values=*/false);
}

}  // namespace towerps::common
