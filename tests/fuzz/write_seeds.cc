// Writes the fuzz targets' seed corpus into OUT/<target>/ (usage:
// write_seeds OUT), each seed made by the real writer of its format so that
// fuzzing starts from inputs the parsers accept. tests/fuzz/corpus/ holds
// its output (regenerate with:
//   bazel run //tests/fuzz:write_seeds -- $PWD/tests/fuzz/corpus
// which adds or replaces only seed-* files; crashers kept as regression
// inputs are named crash-*).
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/gradient_codec.h"
#include "common/job_spec.h"
#include "common/shm_channel.h"
#include "common/shm_ring.h"
#include "common/storage/checkpoint.h"
#include "common/storage/record_io.h"
#include "google/protobuf/text_format.h"
#include "proto/job_service.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensorboard.pb.h"

namespace {

namespace v1 = towerps::v1;
namespace fs = std::filesystem;

std::string out_dir;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(out_dir) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / ("seed-" + name), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "write_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "write_seeds: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "write_seeds: %s failed\n", what);
    std::exit(1);
  }
}

std::string Gzip(const std::string& in) {
  z_stream z{};
  Check(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
  std::string out(deflateBound(&z, in.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  Check(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string BigEndian32(uint32_t v) {
  return std::string({static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                      static_cast<char>(v >> 8), static_cast<char>(v)});
}

void JobSpecs() {
  for (const char* name : {"mlp", "cnn_small", "resnet_cifar"}) {
    auto job = towerps::worker::BuiltinJob(name);
    Check(job.ok(), "BuiltinJob");
    std::string text;
    Check(google::protobuf::TextFormat::PrintToString(
              towerps::worker::JobForSubmitFile(*job, false), &text),
          "text format");
    Write("job_spec_fuzzer", absl::StrCat(name, ".txtpb"), text);
  }
  // The JSON job files users start from (deploy/jobs/), as they are.
  for (const char* name : {"mlp", "lenet"}) {
    Write("job_spec_fuzzer", absl::StrCat(name, ".json"),
          ReadAll(absl::StrCat("deploy/jobs/", name, ".json")));
  }
}

void ClusterSpecs() {
  // Byte 0 even: TF_CONFIG; odd: four lines of flags.
  Write("cluster_spec_fuzzer", "tf_config",
        std::string("\0", 1) +
            R"({"cluster": {"ps": ["localhost:2222", "10.0.0.2:2222"], "worker": ["h1:2223"],)"
            R"( "chief": ["h0:2223"]}, "task": {"type": "worker", "index": 1}})");
  Write("cluster_spec_fuzzer", "tf_config_ps",
        std::string("\0", 1) +
            R"({"cluster": {"ps": ["[::1]:2222"], "worker": ["127.0.0.1:1", "127.0.0.2:2"],)"
            R"( "evaluator": ["e:1"]}, "task": {"type": "ps", "index": 0}})");
  Write("cluster_spec_fuzzer", "flags",
        "\x01localhost:2222,localhost:2223\nlocalhost:2224, [::1]:2225\nworker\n1");
}

void Checkpoints() {
  towerps::common::ShardState state;
  state.job_id = "job-1";
  state.ps_task = 0;
  state.num_ps = 1;
  state.global_step = 200;
  state.worker_completed = {200, 199};
  towerps::common::VariableState kernel;
  kernel.def.set_name("dense/kernel");
  kernel.def.add_shape(3);
  kernel.def.add_shape(2);
  kernel.def.set_dtype(v1::DT_FLOAT32);
  kernel.value = {0.5f, -1.25f, 3, 0, -0.0f, 1e-3f};
  kernel.updates = 200;
  kernel.slots = {{"m", {1, 2, 3, 4, 5, 6}}, {"v", {6, 5, 4, 3, 2, 1}}};
  towerps::common::VariableState mean;
  mean.def.set_name("bn/moving_mean");
  mean.def.add_shape(2);
  mean.def.set_dtype(v1::DT_FLOAT32);
  mean.def.set_update(v1::VariableDef::MOVING_AVERAGE);
  mean.def.set_moving_average_decay(0.9f);
  mean.value = {0.25f, 0.75f};
  state.vars = {kernel, mean};
  const std::string tmp = fs::temp_directory_path() / "towerps-write-seeds";
  fs::remove_all(tmp);
  towerps::common::ShardWriteOptions small;
  small.max_record_bytes = 8;  // values split over several records
  auto path = towerps::common::WriteShard(tmp + "/ckpt-0000000200", state, small);
  Check(path.ok(), "WriteShard");
  Write("checkpoint_fuzzer", "shard", ReadAll(*path));

  std::vector<towerps::common::ManifestEntry> entries;
  for (int64_t step : {100, 200, 300}) {
    towerps::common::ManifestEntry e;
    e.step = step;
    e.dir_name = towerps::common::CheckpointDirName(step);
    e.num_ps = 2;
    e.unix_time = 1.7e9 + step;
    entries.push_back(e);
  }
  Check(towerps::common::WriteManifest(tmp, entries).ok(), "WriteManifest");
  Write("manifest_fuzzer", "manifest", ReadAll(tmp + "/MANIFEST"));
  fs::remove_all(tmp);
}

void Events() {
  std::string file;
  towerps::tb::Event first;
  first.set_wall_time(1.7e9);
  first.set_file_version("brain.Event:2");
  towerps::common::AppendRecord(first.SerializeAsString(), &file);
  towerps::tb::Event scalar;
  scalar.set_wall_time(1.7e9 + 1);
  scalar.set_step(10);
  auto* v = scalar.mutable_summary()->add_value();
  v->set_tag("loss");
  v->set_simple_value(0.5f);
  towerps::common::AppendRecord(scalar.SerializeAsString(), &file);
  towerps::tb::Event histo;
  histo.set_step(10);
  auto* h = histo.mutable_summary()->add_value();
  h->set_tag("dense/kernel");
  h->mutable_histo()->set_num(2);
  h->mutable_histo()->add_bucket_limit(1);
  h->mutable_histo()->add_bucket(2);
  towerps::common::AppendRecord(histo.SerializeAsString(), &file);
  Write("record_event_fuzzer", "events", file);
}

void Datasets() {
  // IDX: byte 0 even, byte 1 max_examples, 4 bytes images length, images, labels.
  std::string images = BigEndian32(0x803) + BigEndian32(3) + BigEndian32(2) + BigEndian32(2);
  for (int i = 0; i < 12; ++i) images.push_back(static_cast<char>(i * 21));
  const std::string labels = BigEndian32(0x801) + BigEndian32(3) + std::string("\x01\x09\x00", 3);
  auto idx = [](const std::string& im, const std::string& lb, char max) {
    const uint32_t n = static_cast<uint32_t>(im.size());
    std::string s = {'\0', max};
    s.append(reinterpret_cast<const char*>(&n), 4);  // little-endian here
    return s + im + lb;
  };
  Write("dataset_fuzzer", "idx", idx(images, labels, 0));
  Write("dataset_fuzzer", "idx_gzip", idx(Gzip(images), Gzip(labels), 2));
  // CIFAR-10: byte 0 odd, byte 1 max_examples, then 3073-byte records.
  std::string cifar = {'\x01', '\0'};
  for (int r = 0; r < 2; ++r) {
    cifar.push_back(static_cast<char>(r * 7));
    for (int i = 0; i < 3072; ++i) cifar.push_back(static_cast<char>((i * 13 + r) & 0xff));
  }
  Write("dataset_fuzzer", "cifar", cifar);
}

// ps: [op][length, 2 bytes little-endian][serialized request] ...
void Op(std::string* out, int op, const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  Check(bytes.size() < 65536, "request size");
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(bytes.size() & 0xff));
  out->push_back(static_cast<char>(bytes.size() >> 8));
  *out += bytes;
}

void PsRequests() {
  for (auto mode : {v1::SYNC, v1::ASYNC}) {
    v1::RegisterRequest reg;
    reg.set_job_id("j");
    reg.set_num_ps(1);
    reg.set_worker_task(0);
    auto* c = reg.mutable_config();
    c->set_mode(mode);
    c->set_num_workers(2);
    c->set_replicas_to_aggregate(mode == v1::SYNC ? 1 : 0);
    c->set_max_staleness(mode == v1::SYNC ? 0 : 1);
    c->mutable_optimizer()->set_type(mode == v1::SYNC ? v1::OptimizerSpec::ADAM
                                                      : v1::OptimizerSpec::MOMENTUM);
    auto* w = reg.add_variables();
    w->set_name("w");
    w->add_shape(2);
    w->add_shape(3);
    w->set_dtype(v1::DT_FLOAT32);
    w->mutable_initializer()->set_type(v1::Initializer::GLOROT_UNIFORM);
    w->mutable_initializer()->set_fan_in(2);
    w->mutable_initializer()->set_fan_out(3);
    auto* m = reg.add_variables();
    m->set_name("moving_mean");
    m->add_shape(3);
    m->set_dtype(v1::DT_FLOAT32);
    m->set_update(v1::VariableDef::MOVING_AVERAGE);
    m->set_moving_average_decay(0.9f);

    v1::PushRequest push;
    auto* h = push.mutable_header();
    h->set_job_id("j");
    h->set_worker_task(0);
    h->set_incarnation(7);
    h->set_sequence(1);
    h->set_step(0);
    h->set_num_examples(4);
    const float g[6] = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f};
    auto* s0 = push.add_slices();
    s0->set_var_index(0);
    s0->set_data(std::string(reinterpret_cast<const char*>(g), 16));
    auto* s1 = push.add_slices();
    s1->set_var_index(0);
    s1->set_offset(4);
    s1->set_data(std::string(reinterpret_cast<const char*>(g + 4), 8));
    auto* s2 = push.add_slices();
    s2->set_var_index(1);
    s2->set_data(std::string(reinterpret_cast<const char*>(g), 12));

    v1::PullRequest pull;
    pull.set_job_id("j");
    pull.set_min_step(1);
    pull.set_worker_task(0);
    pull.set_worker_iteration(1);
    v1::HeartbeatRequest beat;
    beat.set_job_id("j");
    beat.set_worker_task(1);
    v1::StatusRequest status;
    v1::SaveRequest save;
    save.set_job_id("j");
    save.set_checkpoint_dir("ckpt");
    save.set_num_ps(1);
    v1::DeleteJobRequest del;
    del.set_job_id("j");
    v1::RegisterRequest restore = reg;
    restore.set_restore_from("ckpt");

    std::string seq;
    Op(&seq, 0, reg);
    Op(&seq, 1, push);
    Op(&seq, 2, pull);
    Op(&seq, 3, beat);
    Op(&seq, 4, status);
    Op(&seq, 6, save);
    h->set_sequence(2);
    h->set_step(1);
    Op(&seq, 1, push);
    Op(&seq, 5, del);
    Op(&seq, 0, restore);
    Op(&seq, 2, pull);
    // A push whose gradients lie in a shared segment (pid 1: the fuzzer's
    // own), then the same pull into it.
    v1::PushRequest from_segment;
    *from_segment.mutable_header() = *h;
    from_segment.mutable_header()->set_sequence(3);
    auto* pseg = from_segment.mutable_header()->mutable_segment();
    pseg->set_pid(1);
    pseg->set_size(4096 + 4096);
    pseg->add_offsets(4096 + 128);
    pseg->add_offsets(4096 + 256);
    from_segment.add_segment_vars(0);
    from_segment.add_segment_vars(1);
    Op(&seq, 1, from_segment);
    auto* seg = pull.mutable_segment();
    seg->set_pid(1);
    seg->set_size(4096 + 4096);
    seg->add_offsets(4096);
    seg->add_offsets(4096 + 64);
    seg->set_pull_id(1);
    Op(&seq, 2, pull);
    Write("ps_fuzzer", mode == v1::SYNC ? "sync" : "async", seq);
  }
}

// Updates that would overflow a float (the overflow guard): SGD at lr 0.5
// with gradients of -3e38 takes the values to 1.5e38, 3e38, then past
// FLT_MAX, by a step of two workers (the update after the answer) and by a
// lone worker's pushes (formed ahead as they arrive); a pull after each.
// The fuzzer's invariant (every pulled value finite) fails on a server
// without the guard.
void PsOverflowRequests() {
  for (int workers : {1, 2}) {
    v1::RegisterRequest reg;
    reg.set_job_id("j");
    reg.set_num_ps(1);
    auto* c = reg.mutable_config();
    c->set_mode(workers == 1 ? v1::ASYNC : v1::SYNC);
    c->set_num_workers(workers);
    c->mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
    c->mutable_optimizer()->set_learning_rate(0.5f);
    auto* w = reg.add_variables();
    w->set_name("w");
    w->add_shape(6);
    w->set_dtype(v1::DT_FLOAT32);
    w->mutable_initializer()->set_type(v1::Initializer::CONSTANT);
    w->mutable_initializer()->set_value(1.0f);
    std::string seq;
    Op(&seq, 0, reg);
    const std::vector<float> g(6, -3e38f);
    for (int step = 0; step < 3; ++step) {
      for (int worker = 0; worker < workers; ++worker) {
        v1::PushRequest push;
        auto* h = push.mutable_header();
        h->set_job_id("j");
        h->set_worker_task(worker);
        h->set_incarnation(7);
        h->set_sequence(step + 1);
        h->set_step(workers == 1 ? 0 : step);
        h->set_num_examples(4);
        auto* s = push.add_slices();
        s->set_var_index(0);
        s->set_data(std::string(reinterpret_cast<const char*>(g.data()), 24));
        Op(&seq, 1, push);
      }
      v1::PullRequest pull;
      pull.set_job_id("j");
      pull.set_min_step(step + 1);
      Op(&seq, 2, pull);
    }
    Write("ps_fuzzer", workers == 1 ? "overflow-ahead" : "overflow-sync", seq);
  }
}

// Compressed pushes (issue 16): float16, top-k and bfloat16 pushes encoded
// by the real codec, the batch norm statistic as float32, pulls between.
void PsCompressedRequests() {
  v1::RegisterRequest reg;
  reg.set_job_id("c");
  reg.set_num_ps(1);
  reg.set_worker_task(0);
  auto* c = reg.mutable_config();
  c->set_mode(v1::SYNC);
  c->set_num_workers(1);
  c->mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  auto* w = reg.add_variables();
  w->set_name("w");
  w->add_shape(4);
  w->add_shape(5);
  w->set_dtype(v1::DT_FLOAT32);
  auto* m = reg.add_variables();
  m->set_name("moving_mean");
  m->add_shape(3);
  m->set_dtype(v1::DT_FLOAT32);
  m->set_update(v1::VariableDef::MOVING_AVERAGE);
  m->set_moving_average_decay(0.9f);

  std::vector<float> g(20);
  for (int i = 0; i < 20; ++i) g[i] = (i % 3 - 1) * 0.25f * (i + 1);
  const float stat[3] = {0.5f, -1.0f, 2.0f};
  std::string seq;
  Op(&seq, 0, reg);
  int64_t step = 0;
  for (auto encoding : {v1::SLICE_FLOAT16, v1::SLICE_TOPK, v1::SLICE_BFLOAT16}) {
    v1::PushRequest push;
    auto* h = push.mutable_header();
    h->set_job_id("c");
    h->set_worker_task(0);
    h->set_incarnation(3);
    h->set_sequence(static_cast<uint64_t>(step + 1));
    h->set_step(step);
    h->set_num_examples(2);
    h->set_slice_encoding(encoding);
    std::string payload;
    std::vector<towerps::common::EncodedSlice> slices;
    // Slices of at most 28 bytes: several per variable.
    Check(towerps::common::EncodeGradient(encoding, g, 0.25, 28, &payload, &slices).ok(),
          "EncodeGradient");
    for (const auto& e : slices) {
      auto* s = push.add_slices();
      s->set_offset(static_cast<uint64_t>(e.offset));
      s->set_data(payload.substr(static_cast<size_t>(e.begin), static_cast<size_t>(e.bytes)));
    }
    auto* st = push.add_slices();
    st->set_var_index(1);
    st->set_data(std::string(reinterpret_cast<const char*>(stat), sizeof(stat)));
    Op(&seq, 1, push);
    v1::PullRequest pull;
    pull.set_job_id("c");
    pull.set_min_step(++step);
    Op(&seq, 2, pull);
  }
  Op(&seq, 4, v1::StatusRequest());
  Write("ps_fuzzer", "compressed", seq);
}

// The chief's JobService: submit two jobs (one refused: a path outside the
// state directory), list, get, watch, cancel, cluster, export.
void JobServiceRequests() {
  auto job = towerps::worker::BuiltinJob("mlp");
  Check(job.ok(), "BuiltinJob");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = towerps::worker::JobForSubmitFile(*job, false);
  submit.mutable_spec()->set_job_id("a");
  v1::SubmitJobRequest second = submit;
  second.mutable_spec()->set_job_id("b");
  second.mutable_spec()->mutable_checkpoint()->set_dir("ckpt/b");
  v1::SubmitJobRequest outside = submit;
  outside.mutable_spec()->set_job_id("c");
  outside.mutable_spec()->mutable_checkpoint()->set_dir("/etc/towerps");
  v1::GetJobRequest get;
  get.set_job_id("a");
  v1::WatchJobRequest watch;
  watch.set_job_id("a");
  v1::CancelJobRequest cancel;
  cancel.set_job_id("b");
  v1::ExportRequest exp;
  exp.set_job_id("a");
  std::string seq;
  Op(&seq, 0, submit);
  Op(&seq, 0, second);
  Op(&seq, 0, outside);
  Op(&seq, 1, v1::ListJobsRequest());
  Op(&seq, 2, get);
  Op(&seq, 5, watch);
  Op(&seq, 3, cancel);
  Op(&seq, 4, v1::ClusterRequest());
  Op(&seq, 6, exp);
  Op(&seq, 3, cancel);
  Write("job_service_fuzzer", "submit-list-cancel", seq);
}

}  // namespace

// Rings as a worker's channel holds them: calls' messages written by the
// real writer, some read already, one wrapped past the end of the data.
void ShmRings() {
  using towerps::common::ShmCallHeader;
  using towerps::common::ShmCallKind;
  constexpr int64_t kBytes = towerps::common::kShmRingHeaderBytes + 1024;
  auto header = [](ShmCallKind kind, uint64_t id) {
    ShmCallHeader h;
    h.kind = kind;
    h.call_id = id;
    return towerps::common::EncodeShmCallHeader(h);
  };
  for (int variant = 0; variant < 3; ++variant) {
    alignas(64) char memory[kBytes];
    std::memset(memory, 0, sizeof(memory));
    towerps::common::ShmRing::Init(memory, kBytes);
    towerps::common::ShmRing ring(memory, kBytes);
    const absl::Time past = absl::InfinitePast();
    std::string scratch;
    // Variant 2 moves the positions near the end first, so that the next
    // message wraps (a skip marker).
    for (int i = 0; variant == 2 && i < 3; ++i) {
      if (!ring.Write({std::string(330, 'p')}, past).ok() || !ring.Read(&scratch, past).ok()) {
        std::fprintf(stderr, "write_seeds: ring\n");
        std::exit(1);
      }
    }
    for (uint64_t id = 1; id <= 3; ++id) {
      if (!ring.Write({header(ShmCallKind::kOpen, id), "request"}, past).ok() ||
          !ring.Write({header(ShmCallKind::kData, id), std::string(40, 'n')}, past).ok()) {
        std::fprintf(stderr, "write_seeds: ring\n");
        std::exit(1);
      }
    }
    if (variant == 1 && !ring.Read(&scratch, past).ok()) std::exit(1);
    Write("shm_ring_fuzzer", absl::StrCat("ring", variant), std::string(memory, sizeof(memory)));
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seeds OUT_DIR (run from the repository root)\n");
    return 2;
  }
  out_dir = argv[1];
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) fs::current_path(ws);
  JobSpecs();
  ClusterSpecs();
  Checkpoints();
  Events();
  Datasets();
  PsRequests();
  PsCompressedRequests();
  PsOverflowRequests();
  JobServiceRequests();
  ShmRings();
  std::printf("write_seeds: seeds written under %s\n", out_dir.c_str());
  return 0;
}
