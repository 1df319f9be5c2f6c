// ps_throughput: bytes per second through the real parameter-server path
// (GrpcParameterClient -> 2 x ParameterServiceImpl/ParameterServer over
// 127.0.0.1), against two ceilings measured in the same run over the same
// bytes per round: a plain gRPC echo (payload as `bytes` and as packed
// `repeated float`) and plain loopback TCP.
//
// One round = pull every weight + push every gradient of the dense_stack model
// (10,211,100 floats): 2 x model bytes moved. Every path moves each server's
// share (GREEDY_BYTES placement) on its own stream, in parallel, as the ps
// client does. Warm-up rounds are untimed; correctness is checked after the
// timed rounds (the `wrong` column; the exit code is 1 if any is non-zero).
//
//   bazel run -c opt //tests/bench:ps_throughput -- [--rounds=10]
//       [--chunk_sizes=1048576,4194304,16777216] [--json=PATH]
//       [--no_malloc_tuning] [--tls_dir=DIR]
//
// --tls_dir (issue 15): a directory made by deploy/make_certs.sh; adds a
// `ps_tls` row per chunk size: the same ps path over mutual TLS (P-256
// certificates) with a bearer token checked on every call, on its own two
// servers, so that `ps_tls` vs `ps` is the cost of transport security.
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
#include "common/job_spec.h"
#include "common/rpc.h"
#include "common/rpc_security.h"
#include "common/status.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "ps/parameter_server.h"
#include "ps/ps_service.h"
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

namespace towerps::bench {
namespace {

constexpr int kNumServers = 2;
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

Row MakeRow(std::string path, int64_t chunk_bytes, double seconds, int64_t model_bytes,
            int64_t wrong) {
  Row r;
  r.path = std::move(path);
  r.chunk_bytes = chunk_bytes;
  r.ms_per_round = seconds * 1e3;
  r.gbps_moved = 2.0 * model_bytes / seconds / 1e9;
  r.goodput_gbps = model_bytes / seconds / 1e9;
  r.wrong = wrong;
  return r;
}

// A deterministic, non-constant payload so the echo check means something.
std::vector<float> Pattern(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed) % 1000) * 0.25f;
  return v;
}

absl::StatusOr<Row> RunTcp(const BenchOptions& opt, const worker::Placement& placement,
                           int64_t model_bytes) {
  std::vector<std::unique_ptr<LoopbackTcpEcho>> echoes;
  std::vector<std::vector<char>> data, out;
  for (int s = 0; s < kNumServers; ++s) {
    TOWERPS_ASSIGN_OR_RETURN(
        auto e, LoopbackTcpEcho::Start({.round_bytes = placement.bytes[s],
                                        .io_bytes = opt.tcp_io_bytes}));
    echoes.push_back(std::move(e));
    std::vector<float> p = Pattern(placement.bytes[s] / 4, s);
    data.emplace_back(reinterpret_cast<const char*>(p.data()),
                      reinterpret_cast<const char*>(p.data()) + placement.bytes[s]);
    out.emplace_back(placement.bytes[s], 0);
  }
  auto round = [&]() {
    return ForEachStream(kNumServers, [&](int s) {
      return echoes[s]->RoundTrip(absl::MakeConstSpan(data[s]), absl::MakeSpan(out[s]));
    });
  };
  TOWERPS_RETURN_IF_ERROR(TimeRounds(opt.warmup, 0, round).status());
  for (auto& o : out) std::fill(o.begin(), o.end(), 0);
  TOWERPS_ASSIGN_OR_RETURN(double sec, TimeRounds(0, opt.rounds, round));
  int64_t wrong = 0;
  for (int s = 0; s < kNumServers; ++s) wrong += (data[s] != out[s]);
  return MakeRow("tcp", opt.tcp_io_bytes, sec, model_bytes, wrong);
}

absl::StatusOr<Row> RunEcho(const BenchOptions& opt, Payload payload, int64_t chunk,
                            const std::vector<std::unique_ptr<Echo::Stub>>& stubs,
                            const worker::Placement& placement, int64_t model_bytes) {
  std::vector<std::vector<float>> data, out;
  for (int s = 0; s < kNumServers; ++s) {
    data.push_back(Pattern(placement.bytes[s] / 4, s + 1));
    out.emplace_back(data.back().size(), 0.0f);
  }
  auto round = [&]() {
    return ForEachStream(kNumServers, [&](int s) {
      return EchoRoundTrip(*stubs[s], payload, chunk, data[s], absl::MakeSpan(out[s]));
    });
  };
  TOWERPS_RETURN_IF_ERROR(TimeRounds(opt.warmup, 0, round).status());
  for (auto& o : out) std::fill(o.begin(), o.end(), 0.0f);
  TOWERPS_ASSIGN_OR_RETURN(double sec, TimeRounds(0, opt.rounds, round));
  int64_t wrong = 0;
  for (int s = 0; s < kNumServers; ++s) {
    wrong += std::memcmp(data[s].data(), out[s].data(), data[s].size() * 4) != 0;
  }
  return MakeRow(payload == Payload::kBytes ? "grpc_echo_bytes" : "grpc_echo_floats", chunk,
                 sec, model_bytes, wrong);
}

// The real path. Each chunk size gets its own job, so every row starts from
// the initializer's values and its SGD check is independent.
absl::StatusOr<Row> RunPs(const BenchOptions& opt, int64_t chunk,
                          const std::vector<std::string>& addresses,
                          const std::vector<v1::VariableDef>& vars, int64_t model_bytes,
                          std::shared_ptr<const common::RpcSecurity> security = nullptr) {
  worker::ParameterClientOptions co;
  if (security != nullptr) co.security = security;
  co.ps_addresses = addresses;
  co.job_id = absl::StrCat("bench_chunk_", chunk);
  co.chunk_bytes = chunk;
  TOWERPS_ASSIGN_OR_RETURN(auto client,
                           worker::NewGrpcParameterClient(co, vars, v1::GREEDY_BYTES));
  v1::TrainingConfig config;
  config.set_mode(v1::ASYNC);
  config.set_num_workers(1);
  config.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
  config.mutable_optimizer()->set_learning_rate(kLearningRate);
  TOWERPS_RETURN_IF_ERROR(client->Register(config).status());

  std::vector<common::Tensor> weights, grads;
  for (const auto& v : vars) {
    std::vector<int64_t> shape(v.shape().begin(), v.shape().end());
    weights.emplace_back(shape);
    grads.emplace_back(shape);
    grads.back().Fill(kGradient);
  }
  std::vector<common::Tensor*> wptrs;
  std::vector<const common::Tensor*> gptrs;
  for (auto& w : weights) wptrs.push_back(&w);
  for (auto& g : grads) gptrs.push_back(&g);

  int64_t iteration = 0;
  auto pull = [&]() -> absl::StatusOr<int64_t> {
    return client->Pull(/*min_step=*/0, iteration, wptrs);
  };
  auto round = [&]() -> absl::Status {
    TOWERPS_ASSIGN_OR_RETURN(int64_t step, pull());
    TOWERPS_ASSIGN_OR_RETURN(worker::PushResult r, client->Push(step, 1, gptrs));
    ++iteration;
    if (r.applied != kNumServers) {
      return absl::InternalError(absl::StrCat("push applied on ", r.applied, " of ",
                                              kNumServers, " servers"));
    }
    return absl::OkStatus();
  };
  TOWERPS_RETURN_IF_ERROR(TimeRounds(opt.warmup, 0, round).status());
  TOWERPS_RETURN_IF_ERROR(pull().status());
  std::vector<common::Tensor> before = weights;
  TOWERPS_ASSIGN_OR_RETURN(double sec, TimeRounds(0, opt.rounds, round));
  TOWERPS_RETURN_IF_ERROR(pull().status());

  // Each SGD step is w += (-lr) * g with lr * g exact; one rounding (<= 1 ulp
  // of the result) per step bounds the error.
  const float delta = opt.rounds * kLearningRate * kGradient;
  int64_t wrong = 0;
  for (size_t v = 0; v < weights.size(); ++v) {
    for (int64_t i = 0; i < weights[v].num_elements(); ++i) {
      const float b = before[v][i];
      const float expected = b - delta;
      const float tol = (opt.rounds + 1) * std::ldexp(std::fabs(b) + delta, -23);
      const float got = weights[v][i];
      if (!std::isfinite(got) || std::fabs(got - expected) > tol) ++wrong;
    }
  }
  return MakeRow(security != nullptr ? "ps_tls" : "ps", chunk, sec, model_bytes, wrong);
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
                               ", \"model_bytes\": ", model_bytes, ", \"servers\": ",
                               kNumServers, ", \"rounds\": ", opt.rounds,
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
  auto backend = worker::NewCpuBackend();
  TOWERPS_ASSIGN_OR_RETURN(v1::JobSpec job, worker::BuiltinJob("dense_stack"));
  TOWERPS_ASSIGN_OR_RETURN(auto model, worker::Model::Create(job.model(), *backend));
  const std::vector<v1::VariableDef> vars = model->VariableDefs();
  int64_t model_bytes = 0;
  for (const auto& v : vars) model_bytes += worker::VariableBytes(v);
  TOWERPS_ASSIGN_OR_RETURN(worker::Placement placement,
                           worker::PlanPlacement(vars, kNumServers, v1::GREEDY_BYTES));

  // Servers: the real ps, and the echo ceiling on separate gRPC servers.
  std::vector<std::unique_ptr<ps::ParameterServer>> servers;
  std::vector<std::unique_ptr<ps::ParameterServiceImpl>> services;
  std::vector<std::unique_ptr<EchoServiceImpl>> echo_services;
  std::vector<std::unique_ptr<grpc::Server>> grpc_servers;
  std::vector<std::string> ps_addresses;
  std::vector<std::unique_ptr<Echo::Stub>> echo_stubs;
  for (int s = 0; s < kNumServers; ++s) {
    servers.push_back(std::make_unique<ps::ParameterServer>(
        ps::ParameterServerOptions{.task_index = s}));
    services.push_back(std::make_unique<ps::ParameterServiceImpl>(
        *servers.back(), common::kDefaultChunkBytes));
    int port = 0;
    TOWERPS_ASSIGN_OR_RETURN(auto server,
                             common::StartServer("127.0.0.1:0", {services.back().get()}, &port));
    grpc_servers.push_back(std::move(server));
    ps_addresses.push_back(absl::StrCat("127.0.0.1:", port));

    echo_services.push_back(std::make_unique<EchoServiceImpl>(placement.bytes[s]));
    TOWERPS_ASSIGN_OR_RETURN(
        auto echo_server,
        common::StartServer("127.0.0.1:0", {echo_services.back().get()}, &port));
    grpc_servers.push_back(std::move(echo_server));
    echo_stubs.push_back(Echo::NewStub(common::NewChannel(absl::StrCat("127.0.0.1:", port))));
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
    for (int s = 0; s < kNumServers; ++s) {
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

  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  std::cout << "ps_throughput: one round = pull all weights + push all gradients of "
               "dense_stack\n"
            << "  model: " << vars.size() << " variables, " << model_bytes / 4 << " floats, "
            << model_bytes << " bytes; moved per round (push + pull): " << 2 * model_bytes
            << " bytes\n"
            << "  " << kNumServers << " servers on 127.0.0.1, one stream per server in "
               "parallel; placement GREEDY_BYTES: ";
  for (int s = 0; s < kNumServers; ++s) std::cout << (s ? ", " : "") << placement.bytes[s];
  std::cout << " bytes\n"
            << "  paths: ps = GrpcParameterClient -> ParameterServiceImpl (ASYNC, SGD);\n"
            << "         grpc_echo_{bytes,floats} = plain gRPC client-stream up + "
               "server-stream down, payload `bytes` / packed `repeated float`;\n"
            << "         tcp = plain loopback TCP, write N then read N echoed, "
            << opt.tcp_io_bytes << "-byte calls\n"
            << "  GB/s moved = (pushed + pulled bytes) / round time; goodput = model bytes / "
               "round time; 1 GB = 1e9 B\n"
            << "         ps_tls = the ps path over mutual TLS with a bearer token ("
            << (tls != nullptr ? "--tls_dir=" + opt.tls_dir : std::string("off: no --tls_dir"))
            << ")\n"
            << "  cores: " << cores << "; warm-up rounds: " << opt.warmup
            << " (untimed); timed rounds: " << opt.rounds << "; malloc tuning: "
            << (opt.malloc_tuning ? "on" : "off") << "\n\n";
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
  TOWERPS_ASSIGN_OR_RETURN(Row tcp, RunTcp(opt, placement, model_bytes));
  tcp.vs_tcp = 1.0;
  print(tcp);
  rows.push_back(tcp);
  for (int64_t chunk : opt.chunk_sizes) {
    TOWERPS_ASSIGN_OR_RETURN(
        Row eb, RunEcho(opt, Payload::kBytes, chunk, echo_stubs, placement, model_bytes));
    eb.vs_tcp = eb.gbps_moved / tcp.gbps_moved;
    eb.vs_echo_bytes = 1.0;
    TOWERPS_ASSIGN_OR_RETURN(
        Row ef, RunEcho(opt, Payload::kFloats, chunk, echo_stubs, placement, model_bytes));
    ef.vs_tcp = ef.gbps_moved / tcp.gbps_moved;
    ef.vs_echo_bytes = ef.gbps_moved / eb.gbps_moved;
    TOWERPS_ASSIGN_OR_RETURN(Row p, RunPs(opt, chunk, ps_addresses, vars, model_bytes));
    p.vs_tcp = p.gbps_moved / tcp.gbps_moved;
    p.vs_echo_bytes = p.gbps_moved / eb.gbps_moved;
    for (const Row* r : {&eb, &ef, &p}) {
      print(*r);
      rows.push_back(*r);
    }
    if (tls != nullptr) {
      TOWERPS_ASSIGN_OR_RETURN(Row t, RunPs(opt, chunk, tls_addresses, vars, model_bytes, tls));
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
