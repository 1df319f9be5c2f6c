// ps_throughput: bytes per second through the real parameter-server path
// (GrpcParameterClient -> S x ParameterServiceImpl/ParameterServer over
// 127.0.0.1), against two ceilings measured in the same run over the same
// bytes per round: a plain gRPC echo (payload as `bytes` and as packed
// `repeated float`) and plain loopback TCP.
//
// One round = each of W workers pulls every weight + pushes every gradient of
// the model: 2 x W x model bytes moved. The model is a built-in one
// (--model, default dense_stack: 10,211,100 floats) or --model_bytes split
// into --variables equal float variables. Every path moves each server's
// share (GREEDY_BYTES placement) on its own stream per worker, all in
// parallel, as the ps clients do. Warm-up rounds are untimed; correctness is
// checked after the timed rounds (the `wrong` column; the exit code is 1 if
// any is non-zero).
//
//   bazel run -c opt //tests/bench:ps_throughput -- [--rounds=10]
//       [--servers=2] [--workers=1] [--mode=async|sync]
//       [--model=dense_stack | --model_bytes=16777216 [--variables=8]]
//       [--chunk_sizes=1048576,4194304,16777216] [--json=PATH]
//       [--no_malloc_tuning] [--tls_dir=DIR]
//
// --tls_dir (issue 15): a directory made by deploy/make_certs.sh; adds a
// `ps_tls` row per chunk size: the same ps path over mutual TLS (P-256
// certificates) with a bearer token checked on every call, on its own two
// servers, so that `ps_tls` vs `ps` is the cost of transport security.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "common/blas_kernels.h"
#include "common/host_limits.h"
#include "common/job_spec.h"
#include "common/rpc.h"
#include "common/rpc_security.h"
#include "common/status.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "ps/optimizer.h"
#include "ps/parameter_server.h"
#include "ps/ps_service.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "tests/bench/echo.grpc.pb.h"
#include "tests/bench/echo_service.h"
#include "tests/bench/loopback_tcp.h"
#include "worker/device/backend.h"
#include "worker/model/model.h"
#include "worker/train/placement.h"
#include "worker/train/ps_client.h"

ABSL_FLAG(int, rounds, 10, "Timed rounds per row.");
ABSL_FLAG(int, warmup, 2, "Untimed rounds before each row.");
ABSL_FLAG(std::string, chunk_sizes, "1048576,4194304,16777216",
          "Comma-separated payload bytes per streamed message (>= 4096).");
ABSL_FLAG(std::string, json, "", "If set, also write the rows as JSON to this path.");
ABSL_FLAG(bool, no_malloc_tuning, false,
          "Skip common::TuneAllocatorForLargeMessages(), to measure its effect.");
ABSL_FLAG(std::string, tls_dir, "",
          "Directory from deploy/make_certs.sh: adds ps_tls rows (mutual TLS + token).");
ABSL_FLAG(int64_t, tcp_io_bytes, 1 << 20, "Bytes per read()/write() call on the TCP path.");
ABSL_FLAG(int, servers, 2, "Parameter servers (1..16).");
ABSL_FLAG(int, workers, 1, "Workers pulling and pushing at once, each its own client (1..16).");
ABSL_FLAG(std::string, mode, "async",
          "async: every push is applied at once; sync: a step waits for every worker's push.");
ABSL_FLAG(std::string, model, "dense_stack",
          "Built-in model whose variables are moved (mlp, dense_stack, cnn_small, ...).");
ABSL_FLAG(int64_t, model_bytes, 0,
          "If set: instead of --model, --variables float variables of equal size summing to "
          "this many bytes (a multiple of 4 x --variables).");
ABSL_FLAG(int, variables, 8, "With --model_bytes: how many variables.");
ABSL_FLAG(int, ps_blas_threads, towerps::ps::kDefaultMathThreads,
          "OpenBLAS threads for the servers' update math, as the ps binary's --blas_threads.");

namespace towerps::bench {
namespace {

// Powers of two, so lr * g is exact and the expected update is known exactly;
// the 12 or so pushes per job move weights (|w| ~ 0.05) by ~1e-4: finite,
// yet far above float rounding.
constexpr float kLearningRate = 1.0f / 1024;
constexpr float kGradient = 1.0f / 128;

struct BenchOptions {
  int rounds = 10;
  int warmup = 2;
  std::vector<int64_t> chunk_sizes;
  std::string json_path;
  bool malloc_tuning = true;
  int64_t tcp_io_bytes = 1 << 20;
  std::string tls_dir;  // "": no ps_tls rows.
  int servers = 2;
  int workers = 1;
  bool sync = false;
  std::string model = "dense_stack";
  int64_t model_bytes = 0;  // > 0: synthetic model instead of `model`.
  int variables = 8;
  int ps_blas_threads = ps::kDefaultMathThreads;
};

struct Row {
  std::string path;
  int64_t chunk_bytes = 0;
  double ms_per_round = 0;
  double gbps_moved = 0;    // (pushed + pulled) bytes / s, 1 GB = 1e9 B
  double goodput_gbps = 0;  // model bytes / round time
  double vs_tcp = NAN;
  double vs_echo_bytes = NAN;
  int64_t wrong = 0;
};

// The echo is plain gRPC: the library's own settings, only the message-size
// limit raised to ours, so that it stays what gRPC does out of the box
// whatever common/rpc tunes for the ps path. (A fixed 4-8 MiB stream window
// in place of gRPC's bandwidth-delay probing was tried for the ps path, issue
// 16: a dense-stack server peaked at 67 MB instead of 74-77, but the
// dense-stack rounds moved ~15% fewer bytes per second; left out.)
absl::StatusOr<std::unique_ptr<grpc::Server>> StartPlainServer(grpc::Service* service,
                                                              int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(common::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(common::kMaxMessageBytes);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError("echo: cannot listen on 127.0.0.1");
  }
  return server;
}

std::shared_ptr<grpc::Channel> PlainChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(common::kMaxMessageBytes);
  args.SetMaxSendMessageSize(common::kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Runs fn(s) for every server on its own thread, like the ps client does.
absl::Status ForEachStream(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) threads.emplace_back([&, s] { results[s] = fn(s); });
  for (auto& t : threads) t.join();
  for (int s = 0; s < n; ++s) {
    if (!results[s].ok()) return common::Annotate(results[s], absl::StrCat("stream ", s));
  }
  return absl::OkStatus();
}

// Warm-up rounds, then the mean wall time of `rounds` timed rounds (seconds).
absl::StatusOr<double> TimeRounds(int warmup, int rounds,
                                  const std::function<absl::Status()>& round) {
  for (int i = 0; i < warmup; ++i) TOWERPS_RETURN_IF_ERROR(round());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) TOWERPS_RETURN_IF_ERROR(round());
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / rounds;
}

// `moved_bytes`: pushed + pulled bytes of one round, all workers together.
Row MakeRow(std::string path, int64_t chunk_bytes, double seconds, int64_t moved_bytes,
            int64_t wrong) {
  Row r;
  r.path = std::move(path);
  r.chunk_bytes = chunk_bytes;
  r.ms_per_round = seconds * 1e3;
  r.gbps_moved = moved_bytes / seconds / 1e9;
  r.goodput_gbps = moved_bytes / 2.0 / seconds / 1e9;
  r.wrong = wrong;
  return r;
}

// A deterministic, non-constant payload so the echo check means something.
std::vector<float> Pattern(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed) % 1000) * 0.25f;
  return v;
}

// Streams of the ceilings: one per (worker, server) pair, stream w * S + s
// carrying server s's share for worker w, as the ps clients do.
int NumStreams(const BenchOptions& opt) { return opt.workers * opt.servers; }
int ServerOf(const BenchOptions& opt, int stream) { return stream % opt.servers; }

absl::StatusOr<Row> RunTcp(const BenchOptions& opt, const worker::Placement& placement,
                           int64_t moved_bytes) {
  const int n = NumStreams(opt);
  std::vector<std::unique_ptr<LoopbackTcpEcho>> echoes;
  std::vector<std::vector<char>> data, out;
  for (int k = 0; k < n; ++k) {
    const int64_t bytes = placement.bytes[ServerOf(opt, k)];
    TOWERPS_ASSIGN_OR_RETURN(
        auto e, LoopbackTcpEcho::Start({.round_bytes = bytes, .io_bytes = opt.tcp_io_bytes}));
    echoes.push_back(std::move(e));
    std::vector<float> p = Pattern(bytes / 4, k);
    data.emplace_back(reinterpret_cast<const char*>(p.data()),
                      reinterpret_cast<const char*>(p.data()) + bytes);
    out.emplace_back(bytes, 0);
  }
  auto round = [&]() {
    return ForEachStream(n, [&](int k) {
      return echoes[k]->RoundTrip(absl::MakeConstSpan(data[k]), absl::MakeSpan(out[k]));
    });
  };
  TOWERPS_RETURN_IF_ERROR(TimeRounds(opt.warmup, 0, round).status());
  for (auto& o : out) std::fill(o.begin(), o.end(), 0);
  TOWERPS_ASSIGN_OR_RETURN(double sec, TimeRounds(0, opt.rounds, round));
  int64_t wrong = 0;
  for (int k = 0; k < n; ++k) wrong += (data[k] != out[k]);
  return MakeRow("tcp", opt.tcp_io_bytes, sec, moved_bytes, wrong);
}

// `stubs`: one per stream (see NumStreams), each on its own channel.
absl::StatusOr<Row> RunEcho(const BenchOptions& opt, Payload payload, int64_t chunk,
                            const std::vector<std::unique_ptr<Echo::Stub>>& stubs,
                            const worker::Placement& placement, int64_t moved_bytes) {
  const int n = NumStreams(opt);
  std::vector<std::vector<float>> data, out;
  for (int k = 0; k < n; ++k) {
    data.push_back(Pattern(placement.bytes[ServerOf(opt, k)] / 4, k + 1));
    out.emplace_back(data.back().size(), 0.0f);
  }
  auto round = [&]() {
    return ForEachStream(n, [&](int k) {
      // Worker k / S's buffer on its server.
      return EchoRoundTrip(*stubs[k], payload, chunk, data[k], absl::MakeSpan(out[k]),
                           k / opt.servers);
    });
  };
  TOWERPS_RETURN_IF_ERROR(TimeRounds(opt.warmup, 0, round).status());
  for (auto& o : out) std::fill(o.begin(), o.end(), 0.0f);
  TOWERPS_ASSIGN_OR_RETURN(double sec, TimeRounds(0, opt.rounds, round));
  int64_t wrong = 0;
  for (int k = 0; k < n; ++k) {
    wrong += std::memcmp(data[k].data(), out[k].data(), data[k].size() * 4) != 0;
  }
  return MakeRow(payload == Payload::kBytes ? "grpc_echo_bytes" : "grpc_echo_floats", chunk,
                 sec, moved_bytes, wrong);
}

// The real path: W workers, each with its own client, pull and push at once.
// Each chunk size gets its own job, so every row starts from the
// initializer's values and its SGD check is independent.
absl::StatusOr<Row> RunPs(const BenchOptions& opt, int64_t chunk,
                          const std::vector<std::string>& addresses,
                          const std::vector<v1::VariableDef>& vars, int64_t moved_bytes,
                          bool shared_memory,
                          std::shared_ptr<const common::RpcSecurity> security = nullptr) {
  const int W = opt.workers;
  const std::string job_id = absl::StrCat("bench_chunk_", chunk, security != nullptr ? "_tls" : "",
                                          shared_memory ? "_shm" : "");
  std::vector<std::unique_ptr<worker::ParameterClient>> clients;
  for (int w = 0; w < W; ++w) {
    worker::ParameterClientOptions co;
    if (security != nullptr) co.security = security;
    co.ps_addresses = addresses;
    co.job_id = job_id;
    co.worker_task = w;
    co.chunk_bytes = chunk;
    co.shared_memory = shared_memory;
    TOWERPS_ASSIGN_OR_RETURN(auto client,
                             worker::NewGrpcParameterClient(co, vars, v1::GREEDY_BYTES));
    clients.push_back(std::move(client));
  }
  v1::TrainingConfig config;
  config.set_mode(opt.sync ? v1::SYNC : v1::ASYNC);
  config.set_num_workers(W);
  config.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
  config.mutable_optimizer()->set_learning_rate(kLearningRate);
  for (auto& c : clients) TOWERPS_RETURN_IF_ERROR(c->Register(config).status());

  // Per worker: its weights and its (constant) gradients.
  std::vector<std::vector<common::Tensor>> weights(W), grads(W);
  std::vector<std::vector<common::Tensor*>> wptrs(W);
  std::vector<std::vector<const common::Tensor*>> gptrs(W);
  for (int w = 0; w < W; ++w) {
    for (const auto& v : vars) {
      std::vector<int64_t> shape(v.shape().begin(), v.shape().end());
      weights[w].emplace_back(shape);
      grads[w].emplace_back(shape);
      grads[w].back().Fill(kGradient);
    }
    // ps_shm: they live in the client's shared memory, as a trainer's do
    // (worker::Model::PlaceHostTensors), so the client copies nothing.
    for (size_t v = 0; v < vars.size() && shared_memory; ++v) {
      weights[w][v].MoveTo(clients[w]->SharedValues(static_cast<int>(v)));
      grads[w][v].MoveTo(clients[w]->SharedGradients(static_cast<int>(v)));
    }
    for (auto& t : weights[w]) wptrs[w].push_back(&t);
    for (auto& g : grads[w]) gptrs[w].push_back(&g);
  }

  // Worker w's round `it`: sync pulls the weights of step `it` (every
  // worker's push of step it - 1 applied), async the latest.
  auto round = [&](int w, int64_t it) -> absl::Status {
    TOWERPS_ASSIGN_OR_RETURN(int64_t step,
                             clients[w]->Pull(opt.sync ? it : 0, it, wptrs[w]));
    TOWERPS_ASSIGN_OR_RETURN(worker::PushResult r, clients[w]->Push(step, 1, gptrs[w]));
    if (r.applied != opt.servers) {
      return absl::InternalError(absl::StrCat("worker ", w, ": push applied on ", r.applied,
                                              " of ", opt.servers, " servers"));
    }
    return absl::OkStatus();
  };
  // Every worker: warm-up rounds; all meet; worker 0 reads the weights
  // before; all meet; timed rounds (the clock runs from the second meeting
  // until the last worker is done); all meet; worker 0 reads them after.
  const int64_t total = opt.warmup + opt.rounds;
  auto* before_timed = new absl::Barrier(W);
  auto* start_timed = new absl::Barrier(W);
  std::vector<common::Tensor> before;
  std::chrono::steady_clock::time_point t0;
  std::vector<std::chrono::steady_clock::time_point> t1(W);
  TOWERPS_RETURN_IF_ERROR(ForEachStream(W, [&](int w) -> absl::Status {
    absl::Status st;
    for (int64_t it = 0; it < opt.warmup && st.ok(); ++it) st = round(w, it);
    // A worker that failed still meets the others, or they would wait forever;
    // it then skips its timed rounds, and the sync ones fail on their deadline.
    if (before_timed->Block()) delete before_timed;
    if (w == 0 && st.ok()) {
      absl::StatusOr<int64_t> pulled = clients[0]->Pull(opt.sync ? opt.warmup : 0,
                                                        opt.warmup, wptrs[0]);
      if (pulled.ok()) before = weights[0];
      st.Update(pulled.status());
      t0 = std::chrono::steady_clock::now();
    }
    if (start_timed->Block()) delete start_timed;
    for (int64_t it = opt.warmup; it < total && st.ok(); ++it) st = round(w, it);
    t1[w] = std::chrono::steady_clock::now();
    return st;
  }));
  for (int w = 0; w < W && shared_memory; ++w) {
    if (clients[w]->bytes_pulled_in_place() == 0 || clients[w]->bytes_pushed_in_place() == 0) {
      return absl::InternalError(absl::StrCat(
          "ps_shm: worker ", w, " moved no pull or no push through its shared memory"));
    }
  }
  const std::chrono::duration<double> elapsed = *std::max_element(t1.begin(), t1.end()) - t0;
  const double sec = elapsed.count() / opt.rounds;
  TOWERPS_RETURN_IF_ERROR(
      clients[0]->Pull(opt.sync ? total : 0, total, wptrs[0]).status());

  // Each SGD step is w += (-lr) * g with lr * g exact, so every applied
  // update is exact up to one rounding (<= 1 ulp of the result): sync applies
  // one mean gradient (= g) per round, async every worker's push.
  const int64_t updates = opt.sync ? opt.rounds : int64_t{W} * opt.rounds;
  const float delta = updates * kLearningRate * kGradient;
  int64_t wrong = 0;
  for (size_t v = 0; v < weights[0].size(); ++v) {
    for (int64_t i = 0; i < weights[0][v].num_elements(); ++i) {
      const float b = before[v][i];
      const float expected = b - delta;
      const float tol = (updates + 1) * std::ldexp(std::fabs(b) + delta, -23);
      const float got = weights[0][v][i];
      if (!std::isfinite(got) || std::fabs(got - expected) > tol) ++wrong;
    }
  }
  return MakeRow(security != nullptr ? "ps_tls" : shared_memory ? "ps_shm" : "ps", chunk, sec,
                 moved_bytes, wrong);
}

// The variables moved: a built-in model's, or --model_bytes as --variables
// equal float vectors.
absl::StatusOr<std::vector<v1::VariableDef>> BenchVariables(const BenchOptions& opt) {
  if (opt.model_bytes > 0) {
    const int64_t floats = opt.model_bytes / 4 / opt.variables;
    std::vector<v1::VariableDef> vars(opt.variables);
    for (int i = 0; i < opt.variables; ++i) {
      vars[i].set_name(absl::StrCat("bench/v", i));
      vars[i].add_shape(floats);
      vars[i].set_dtype(v1::DT_FLOAT32);
      // Glorot with fan 1000 + 1000: U(-0.055, 0.055), like a dense layer's.
      vars[i].mutable_initializer()->set_type(v1::Initializer::GLOROT_UNIFORM);
      vars[i].mutable_initializer()->set_fan_in(1000);
      vars[i].mutable_initializer()->set_fan_out(1000);
      vars[i].mutable_initializer()->set_seed(i + 1);
    }
    return vars;
  }
  auto backend = worker::NewCpuBackend();
  TOWERPS_ASSIGN_OR_RETURN(v1::JobSpec job, worker::BuiltinJob(opt.model));
  TOWERPS_ASSIGN_OR_RETURN(auto model, worker::Model::Create(job.model(), *backend));
  return model->VariableDefs();
}

// A FormatSpec, not a char*: the format is checked at compile time (clang
// refuses a runtime format string).
std::string Num(double x, const absl::FormatSpec<double>& fmt) {
  return std::isnan(x) ? "-" : absl::StrFormat(fmt, x);
}

std::string Json(const BenchOptions& opt, int cores, int64_t model_bytes,
                 const std::vector<Row>& rows) {
  auto num = [](double x) { return std::isnan(x) ? std::string("null") : absl::StrCat(x); };
  std::string s = absl::StrCat("{\"benchmark\": \"ps_throughput\", \"cores\": ", cores,
                               ", \"model\": \"",
                               opt.model_bytes > 0 ? "synthetic" : opt.model,
                               "\", \"model_bytes\": ", model_bytes, ", \"servers\": ",
                               opt.servers, ", \"workers\": ", opt.workers, ", \"mode\": \"",
                               opt.sync ? "sync" : "async", "\", \"rounds\": ", opt.rounds,
                               ", \"warmup\": ", opt.warmup, ", \"malloc_tuning\": ",
                               opt.malloc_tuning ? "true" : "false", ", \"rows\": [\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    absl::StrAppend(&s, "  {\"path\": \"", r.path, "\", \"chunk_bytes\": ", r.chunk_bytes,
                    ", \"ms_per_round\": ", num(r.ms_per_round),
                    ", \"gbps_moved\": ", num(r.gbps_moved),
                    ", \"goodput_gbps\": ", num(r.goodput_gbps),
                    ", \"vs_tcp\": ", num(r.vs_tcp),
                    ", \"vs_echo_bytes\": ", num(r.vs_echo_bytes),
                    ", \"wrong\": ", r.wrong, "}", i + 1 < rows.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&s, "]}\n");
  return s;
}

absl::Status Run(const BenchOptions& opt, bool* all_right) {
  if (opt.malloc_tuning) common::TuneAllocatorForLargeMessages();
  ps::SetMathThreads(opt.ps_blas_threads);  // as ps/main.cc does
  TOWERPS_ASSIGN_OR_RETURN(const std::vector<v1::VariableDef> vars, BenchVariables(opt));
  int64_t model_bytes = 0;
  for (const auto& v : vars) model_bytes += worker::VariableBytes(v);
  const int64_t moved_bytes = 2 * model_bytes * opt.workers;
  TOWERPS_ASSIGN_OR_RETURN(worker::Placement placement,
                           worker::PlanPlacement(vars, opt.servers, v1::GREEDY_BYTES));
  for (int s = 0; s < opt.servers; ++s) {
    if (placement.bytes[s] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--servers=", opt.servers, ": ps ", s, " holds no variable of the model's ",
          vars.size(), " (use fewer servers or more --variables)"));
    }
  }

  // Servers: the real ps, and the echo ceiling on separate gRPC servers.
  std::vector<std::unique_ptr<ps::ParameterServer>> servers;
  std::vector<std::unique_ptr<ps::ParameterServiceImpl>> services;
  std::vector<std::unique_ptr<EchoServiceImpl>> echo_services;
  std::vector<std::unique_ptr<grpc::Server>> grpc_servers;
  std::vector<std::string> ps_addresses;
  std::vector<std::unique_ptr<Echo::Stub>> echo_stubs;
  std::vector<std::string> echo_addresses;
  for (int s = 0; s < opt.servers; ++s) {
    servers.push_back(std::make_unique<ps::ParameterServer>(
        ps::ParameterServerOptions{.task_index = s}));
    services.push_back(std::make_unique<ps::ParameterServiceImpl>(
        *servers.back(), common::kDefaultChunkBytes));
    int port = 0;
    TOWERPS_ASSIGN_OR_RETURN(auto server,
                             common::StartServer("127.0.0.1:0", {services.back().get()}, &port));
    grpc_servers.push_back(std::move(server));
    ps_addresses.push_back(absl::StrCat("127.0.0.1:", port));

    echo_services.push_back(std::make_unique<EchoServiceImpl>(placement.bytes[s], opt.workers));
    TOWERPS_ASSIGN_OR_RETURN(auto echo_server, StartPlainServer(echo_services.back().get(), &port));
    grpc_servers.push_back(std::move(echo_server));
    echo_addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  // One stub per (worker, server) stream, in NumStreams order.
  for (int k = 0; k < NumStreams(opt); ++k) {
    echo_stubs.push_back(Echo::NewStub(PlainChannel(echo_addresses[ServerOf(opt, k)])));
  }

  // The same servers again behind mutual TLS and a token, for the ps_tls rows.
  std::shared_ptr<const common::RpcSecurity> tls;
  std::vector<std::string> tls_addresses;
  if (!opt.tls_dir.empty()) {
    common::RpcSecurityOptions so;
    so.tls_cert = opt.tls_dir + "/node.pem";
    so.tls_key = opt.tls_dir + "/node.key";
    so.tls_ca = opt.tls_dir + "/ca.pem";
    so.auth_token_env = "bench-token-0123456789abcdef";
    TOWERPS_ASSIGN_OR_RETURN(tls, common::RpcSecurity::Create(so, common::RpcRole::kServerAndClient));
    for (int s = 0; s < opt.servers; ++s) {
      servers.push_back(std::make_unique<ps::ParameterServer>(
          ps::ParameterServerOptions{.task_index = s}));
      services.push_back(std::make_unique<ps::ParameterServiceImpl>(
          *servers.back(), common::kDefaultChunkBytes));
      int port = 0;
      TOWERPS_ASSIGN_OR_RETURN(
          auto server,
          common::StartServer("127.0.0.1:0", {services.back().get()}, &port, {}, tls.get()));
      grpc_servers.push_back(std::move(server));
      tls_addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }

  const int cores = common::UsableCores().usable;  // the CPUs this run may use
  const std::string model_name =
      opt.model_bytes > 0 ? absl::StrCat("--model_bytes=", opt.model_bytes) : opt.model;
  std::cout << "ps_throughput: one round = each worker pulls all weights + pushes all "
               "gradients of "
            << model_name << "\n"
            << "  model: " << vars.size() << " variables, " << model_bytes / 4 << " floats, "
            << model_bytes << " bytes; moved per round (push + pull, all workers): "
            << moved_bytes << " bytes\n"
            << "  " << opt.servers << " server(s) and " << opt.workers
            << " worker(s) on 127.0.0.1, one stream per (worker, server) in parallel; "
               "placement GREEDY_BYTES: ";
  for (int s = 0; s < opt.servers; ++s) std::cout << (s ? ", " : "") << placement.bytes[s];
  std::cout << " bytes\n"
            << "  paths: ps = GrpcParameterClient -> ParameterServiceImpl ("
            << (opt.sync ? "SYNC" : "ASYNC") << ", SGD, common/rpc's channels), "
               "everything over gRPC;\n"
            << "         ps_shm = the same through the client's shared memory segment "
               "(common/shared_segment.h), where its weights and gradients live as a "
               "trainer's do: the calls carry only which variables are there (through "
               "its same-host channels once the first calls set them up);\n"
            << "         grpc_echo_{bytes,floats} = plain gRPC (its default settings) "
               "client-stream up + server-stream down, payload `bytes` / packed `repeated "
               "float`;\n"
            << "         tcp = plain loopback TCP, write N then read N echoed, "
            << opt.tcp_io_bytes << "-byte calls\n"
            << "  GB/s moved = (pushed + pulled bytes) / round time; goodput = model bytes / "
               "round time; 1 GB = 1e9 B\n"
            << "         ps_tls = the ps path over mutual TLS with a bearer token ("
            << (tls != nullptr ? "--tls_dir=" + opt.tls_dir : std::string("off: no --tls_dir"))
            << ")\n"
            << "  cores: " << cores << "; warm-up rounds: " << opt.warmup
            << " (untimed); timed rounds: " << opt.rounds << "; malloc tuning: "
            << (opt.malloc_tuning ? "on" : "off") << "; " << towerps::common::BlasDescription()
            << "\n\n";
  auto line = [](const std::string& a, const std::string& b, const std::string& c,
                 const std::string& d, const std::string& e, const std::string& f,
                 const std::string& g, const std::string& h) {
    return absl::StrFormat("%-18s %12s %10s %10s %10s %8s %9s %6s\n", a, b, c, d, e, f, g, h);
  };
  std::cout << line("path", "chunk_bytes", "ms/round", "GB/s", "goodput", "vs_tcp",
                    "vs_echo_b", "wrong");
  auto print = [&](const Row& r) {
    std::cout << line(r.path, absl::StrCat(r.chunk_bytes),
                                 Num(r.ms_per_round, "%.1f"), Num(r.gbps_moved, "%.3f"),
                                 Num(r.goodput_gbps, "%.3f"), Num(r.vs_tcp, "%.3f"),
                                 Num(r.vs_echo_bytes, "%.3f"), absl::StrCat(r.wrong))
              << std::flush;
  };

  std::vector<Row> rows;
  TOWERPS_ASSIGN_OR_RETURN(Row tcp, RunTcp(opt, placement, moved_bytes));
  tcp.vs_tcp = 1.0;
  print(tcp);
  rows.push_back(tcp);
  for (int64_t chunk : opt.chunk_sizes) {
    TOWERPS_ASSIGN_OR_RETURN(
        Row eb, RunEcho(opt, Payload::kBytes, chunk, echo_stubs, placement, moved_bytes));
    eb.vs_tcp = eb.gbps_moved / tcp.gbps_moved;
    eb.vs_echo_bytes = 1.0;
    TOWERPS_ASSIGN_OR_RETURN(
        Row ef, RunEcho(opt, Payload::kFloats, chunk, echo_stubs, placement, moved_bytes));
    ef.vs_tcp = ef.gbps_moved / tcp.gbps_moved;
    ef.vs_echo_bytes = ef.gbps_moved / eb.gbps_moved;
    TOWERPS_ASSIGN_OR_RETURN(Row p, RunPs(opt, chunk, ps_addresses, vars, moved_bytes, false));
    p.vs_tcp = p.gbps_moved / tcp.gbps_moved;
    p.vs_echo_bytes = p.gbps_moved / eb.gbps_moved;
    TOWERPS_ASSIGN_OR_RETURN(Row m, RunPs(opt, chunk, ps_addresses, vars, moved_bytes, true));
    m.vs_tcp = m.gbps_moved / tcp.gbps_moved;
    m.vs_echo_bytes = m.gbps_moved / eb.gbps_moved;
    for (const Row* r : {&eb, &ef, &p, &m}) {
      print(*r);
      rows.push_back(*r);
    }
    if (tls != nullptr) {
      TOWERPS_ASSIGN_OR_RETURN(Row t,
                               RunPs(opt, chunk, tls_addresses, vars, moved_bytes, false, tls));
      t.vs_tcp = t.gbps_moved / tcp.gbps_moved;
      t.vs_echo_bytes = t.gbps_moved / eb.gbps_moved;
      print(t);
      std::cout << absl::StrFormat("%-18s %12s %10s   (ps_tls / ps GB/s: %.3f)\n", "", "", "",
                                   t.gbps_moved / p.gbps_moved);
      rows.push_back(t);
    }
  }
  for (const Row& r : rows) *all_right = *all_right && r.wrong == 0;
  std::cout << "\nvs_tcp: GB/s over the tcp row's; vs_echo_b: GB/s over grpc_echo_bytes' at "
               "the same chunk size. wrong: ps = weights off the expected SGD update; "
               "echo/tcp = streams whose echo differed.\n";

  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << Json(opt, cores, model_bytes, rows);
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", opt.json_path));
  }
  for (auto& server : grpc_servers) {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace towerps::bench

int main(int argc, char** argv) {
  // The kernels the worker and ps run with (common/blas_kernels.h).
  towerps::common::RestartWithBetterBlasKernels("ps_throughput", argv);
  absl::SetProgramUsageMessage(
      "Throughput of the ps push/pull path vs plain gRPC and TCP on 127.0.0.1.");
  absl::ParseCommandLine(argc, argv);
  towerps::bench::BenchOptions opt;
  opt.rounds = absl::GetFlag(FLAGS_rounds);
  opt.warmup = absl::GetFlag(FLAGS_warmup);
  opt.json_path = absl::GetFlag(FLAGS_json);
  opt.malloc_tuning = !absl::GetFlag(FLAGS_no_malloc_tuning);
  opt.tcp_io_bytes = absl::GetFlag(FLAGS_tcp_io_bytes);
  opt.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  opt.servers = absl::GetFlag(FLAGS_servers);
  opt.workers = absl::GetFlag(FLAGS_workers);
  opt.model = absl::GetFlag(FLAGS_model);
  opt.model_bytes = absl::GetFlag(FLAGS_model_bytes);
  opt.variables = absl::GetFlag(FLAGS_variables);
  opt.ps_blas_threads = absl::GetFlag(FLAGS_ps_blas_threads);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "async" && mode != "sync") {
    std::cerr << "ps_throughput: --mode must be async or sync, not \"" << mode << "\"\n";
    return 2;
  }
  opt.sync = mode == "sync";
  if (opt.servers < 1 || opt.servers > 16 || opt.workers < 1 || opt.workers > 16) {
    std::cerr << "ps_throughput: --servers and --workers must be 1..16, got " << opt.servers
              << " and " << opt.workers << "\n";
    return 2;
  }
  if (opt.model_bytes < 0 || opt.model_bytes > (int64_t{4} << 30) || opt.variables < 1 ||
      opt.variables > 4096 ||
      (opt.model_bytes > 0 && opt.model_bytes % (int64_t{4} * opt.variables) != 0)) {
    std::cerr << "ps_throughput: --model_bytes must be 0 or up to 4 GiB, a multiple of 4 x "
                 "--variables (1..4096); got "
              << opt.model_bytes << " and " << opt.variables << "\n";
    return 2;
  }
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_chunk_sizes), ',', absl::SkipEmpty())) {
    int64_t c = 0;
    if (!absl::SimpleAtoi(part, &c) || c < 4096 || c > (int64_t{32} << 20)) {
      std::cerr << "ps_throughput: bad --chunk_sizes entry \"" << part
                << "\": need an integer in [4096, 33554432]\n";
      return 2;
    }
    opt.chunk_sizes.push_back(c);
  }
  if (opt.rounds < 1 || opt.warmup < 0 || opt.tcp_io_bytes < 1 || opt.chunk_sizes.empty()) {
    std::cerr << "ps_throughput: need --rounds >= 1, --warmup >= 0, --tcp_io_bytes >= 1 "
                 "and at least one chunk size\n";
    return 2;
  }
  bool all_right = true;
  absl::Status st = towerps::bench::Run(opt, &all_right);
  if (!st.ok()) {
    std::cerr << "ps_throughput: " << st << "\n";
    return 1;
  }
  if (!all_right) {
    std::cerr << "ps_throughput: FAILED: some rows have wrong > 0\n";
    return 1;
  }
  return 0;
}
