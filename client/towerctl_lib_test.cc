// towerctl against an in-process JobService on loopback: exit codes, usage
// errors, table alignment, the live status, JSON output, following a job,
// reconnecting, and safetensors export.
#include "client/towerctl_lib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/export_chunk_test_util.h"
#include "common/rpc.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/ps.pb.h"
#include "proto/worker.pb.h"

namespace towerps::client {
namespace {

constexpr double kT0 = 1.7e9;  // Submit time of the canned jobs.
constexpr int64_t kStep = 468;  // The canned job's exported step.

v1::JobEvent Event(int64_t seq, v1::JobEvent::Kind kind, const std::string& message = "",
                   v1::JobState state = v1::JOB_STATE_UNSPECIFIED, int64_t step = 0) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.set_time(kT0 + seq);
  e.set_kind(kind);
  e.set_message(message);
  e.set_state(state);
  if (kind == v1::JobEvent::PROGRESS || kind == v1::JobEvent::EPOCH) {
    v1::Metrics* m = e.mutable_metrics();
    m->set_step(step);
    m->set_total_steps(100);
    m->set_epoch(1);
    m->set_epochs(1);
    m->set_loss(1.0 / (1 + step));
    m->set_has_accuracy(true);
    m->set_accuracy(0.5);
    m->set_examples_per_s(1000);
    m->set_learning_rate(0.01);
  }
  return e;
}

// A chief with canned, consistent state:
//   mnist   SUCCEEDED, evaluated, two unbalanced shards at the end (the second
//           skipped 2 variable updates), exportable
//   big     RUNNING, its open step 12 waiting for worker 1 for 8.2 s
//   broken  FAILED ("ps 1 lost")
//   flaky   SUCCEEDED; its first WatchJob stream breaks (UNAVAILABLE) after 2 events
//   gappy   SUCCEEDED; its export stream has a gap
// A submitted job (valid spec) is QUEUED and, when watched, runs to SUCCEEDED.
class FakeJobService final : public v1::JobService::Service {
 public:
  FakeJobService() {
    v1::JobRecord& mnist = jobs_["mnist"];
    mnist.set_job_id("mnist");
    mnist.set_state(v1::SUCCEEDED);
    mnist.set_submit_time(kT0);
    mnist.set_start_time(kT0 + 1);
    mnist.set_end_time(kT0 + 125);
    mnist.set_attempts(1);
    mnist.set_checkpoint_step(468);
    mnist.set_restored_step(-1);
    mnist.set_checkpoint_dir("/state/jobs/mnist/checkpoints");
    v1::Metrics* m = mnist.mutable_metrics();
    m->set_step(468);
    m->set_total_steps(468);
    m->set_epoch(2);
    m->set_epochs(2);
    m->set_loss(0.3512);
    m->set_has_accuracy(true);
    m->set_accuracy(0.88);
    m->set_has_test(true);
    m->set_test_loss(0.3783);
    m->set_test_accuracy(0.8632);
    for (int64_t bytes : {900000, 100000}) {
      v1::JobStatus* s = mnist.add_final_shards();
      s->set_bytes_held(bytes);
      s->set_global_step(468);
    }
    mnist.mutable_final_shards(1)->set_updates_skipped(2);
    // Server 0 busy 0.5 s of CPU over its 2 s of updates; server 1 applied
    // fewer than two updates (no span).
    mnist.mutable_final_shards(0)->set_update_span_s(2.0);
    mnist.mutable_final_shards(0)->set_update_span_cpu_s(0.5);
    events_["mnist"] = {Event(1, v1::JobEvent::STATE, "", v1::RUNNING),
                        Event(2, v1::JobEvent::PROGRESS, "", {}, 50),
                        Event(3, v1::JobEvent::EPOCH, "", {}, 100),
                        Event(4, v1::JobEvent::STATE, "", v1::SUCCEEDED)};

    v1::JobRecord& big = jobs_["big"];
    big.set_job_id("big");
    big.set_state(v1::RUNNING);
    big.set_submit_time(kT0 + 10);
    big.set_start_time(kT0 + 11);
    big.mutable_metrics()->set_step(12);
    big.mutable_metrics()->set_total_steps(100);
    big.mutable_metrics()->set_loss(0.7);
    big.mutable_metrics()->set_has_accuracy(true);
    big.mutable_metrics()->set_accuracy(0.61);
    events_["big"] = {Event(1, v1::JobEvent::STATE, "", v1::RUNNING),
                      Event(2, v1::JobEvent::LOG, "placement: 2 variables on 2 servers")};

    v1::JobRecord& broken = jobs_["broken"];
    broken.set_job_id("broken");
    broken.set_state(v1::FAILED);
    broken.set_submit_time(kT0 + 20);
    broken.set_start_time(kT0 + 21);
    broken.set_end_time(kT0 + 30);
    broken.set_error(
        "ps 1 lost: connection refused while pushing step 5; no restarts left (3 of 3 used)");
    events_["broken"] = {Event(1, v1::JobEvent::STATE, "", v1::RUNNING),
                         Event(2, v1::JobEvent::LOG, "started"),
                         Event(3, v1::JobEvent::PROGRESS, "", {}, 5),
                         Event(4, v1::JobEvent::STATE, "ps 1 lost", v1::FAILED)};

    v1::JobRecord& flaky = jobs_["flaky"];
    flaky.set_job_id("flaky");
    flaky.set_state(v1::SUCCEEDED);
    events_["flaky"] = {Event(1, v1::JobEvent::STATE, "", v1::RUNNING),
                        Event(2, v1::JobEvent::PROGRESS, "", {}, 40),
                        Event(3, v1::JobEvent::STATE, "", v1::SUCCEEDED)};

    jobs_["gappy"].set_job_id("gappy");
    jobs_["gappy"].set_state(v1::SUCCEEDED);
  }

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    submitted_.push_back(*req);
    if (!req->resume_job_id().empty()) {
      auto it = jobs_.find(req->resume_job_id());
      if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
      it->second.set_state(v1::QUEUED);
      *resp->mutable_job() = it->second;
      return grpc::Status::OK;
    }
    if (req->spec().model().input_dim() <= 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "model.input_dim: required (> 0), got 0");
    }
    if (jobs_.count(req->spec().job_id())) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          "job_id \"" + req->spec().job_id() + "\" is in use");
    }
    v1::JobRecord& r = jobs_[req->spec().job_id()];
    r.set_job_id(req->spec().job_id());
    *r.mutable_spec() = req->spec();
    r.set_state(v1::QUEUED);
    r.set_submit_time(kT0 + 100);
    events_[r.job_id()] = {Event(1, v1::JobEvent::STATE, "", v1::RUNNING),
                           Event(2, v1::JobEvent::PROGRESS, "", {}, 50),
                           Event(3, v1::JobEvent::EPOCH, "", {}, 100),
                           Event(4, v1::JobEvent::STATE, "", v1::SUCCEEDED)};
    *resp->mutable_job() = r;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    for (const char* id : {"mnist", "big", "broken"}) *resp->add_jobs() = jobs_.at(id);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job " + req->job_id() + " not found");
    }
    *resp->mutable_job() = it->second;
    if (req->job_id() == "big") {
      v1::JobLiveStatus* live = resp->mutable_live();
      live->set_global_step(12);
      live->add_waiting_for(1);
      live->set_waiting_s(8.2);
      live->set_explanation("step 12 waits for worker 1 (8.2 s)");
      for (int i = 0; i < 2; ++i) {
        v1::ShardStatus* s = live->add_shards();
        s->set_ps_task(i);
        s->set_address(absl::StrCat("10.0.0.", i + 1, ":2222"));
        s->set_reachable(true);
        v1::JobStatus* st = s->mutable_status();
        st->set_global_step(12);
        st->set_num_variables(i == 0 ? 3 : 1);
        st->set_bytes_held(i == 0 ? 3 << 20 : 1 << 20);
        st->set_requests_per_s(20.5);
        st->set_mean_latency_ms(1.25);
        st->add_pushed_this_step(0);
        st->add_waiting_for(1);
        if (i == 1 && ps1_lost_) {
          s->set_reachable(false);
          s->clear_status();
          s->set_error("failed to connect to all addresses");
        }
      }
      for (int i = 0; i < 2; ++i) {
        v1::WorkerProgress* w = live->add_workers();
        w->set_task_index(i);
        w->set_address(absl::StrCat("10.0.1.", i + 1, ":2222"));
        w->set_reachable(true);
        w->set_state(v1::WORK_RUNNING);
        w->set_iterations(i == 0 ? 13 : 12);
        w->set_last_step(i == 0 ? 12 : 11);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    it->second.set_state(v1::CANCELLED);
    *resp->mutable_job() = it->second;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    std::vector<v1::JobEvent> events;
    int call = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = events_.find(req->job_id());
      if (it == events_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
      events = it->second;
      call = ++watch_calls_[req->job_id()];
      watch_after_.push_back(req->after_seq());
    }
    for (const v1::JobEvent& e : events) {
      if (e.seq() <= req->after_seq()) continue;
      if (req->job_id() == "flaky" && call == 1 && e.seq() == 3) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "chief restarting");
      }
      // A running job's stream stays open while following: "big" never ends,
      // so tests follow only jobs that end.
      writer->Write(e);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetCluster(grpc::ServerContext*, const v1::ClusterRequest*,
                          v1::ClusterResponse* resp) override {
    for (int i = 0; i < 2; ++i) {
      v1::TaskInfo* t = resp->add_tasks();
      t->set_job("ps");
      t->set_index(i);
      t->set_address(absl::StrCat("10.0.0.", i + 1, ":2222"));
      t->set_healthy(i == 0);
      if (i == 1) t->set_error("connection refused");
      t->set_uptime_s(3725);
      t->set_bytes_held(i == 0 ? 3 << 20 : 0);
      t->set_jobs(i == 0 ? 1 : 0);
      if (i == 0) {
        t->set_memory_budget_bytes(int64_t{2} << 30);
        t->set_memory_reserved_bytes(15 << 20);
      }
    }
    for (int i = 0; i < 2; ++i) {
      v1::TaskInfo* t = resp->add_tasks();
      t->set_job("worker");
      t->set_index(i);
      t->set_address(absl::StrCat("10.0.1.", i + 1, ":2222"));
      t->set_healthy(true);
      t->set_is_chief(i == 0);
      t->set_uptime_s(125);
      for (int d = 0; d < 2; ++d) {
        v1::DeviceInfo* dev = t->add_devices();
        dev->set_name(absl::StrCat("/job:worker/replica:0/task:", i, "/device:CPU:", d));
        dev->set_memory_limit_bytes(d == 0 ? 0 : int64_t{1} << 30);
        dev->set_memory_in_use_bytes(12 << 20);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status ExportWeights(grpc::ServerContext*, const v1::ExportRequest* req,
                             grpc::ServerWriter<v1::ExportChunk>* writer) override {
    if (req->job_id() == "mnist") {
      writer->Write(Chunk("dense_0/kernel", {2, 3}, 0, Floats({1, 2, 3, 4}), kStep));
      writer->Write(Chunk("", {}, 4, Floats({5, 6}), kStep));
      writer->Write(Chunk("dense_0/bias", {3}, 0, Floats({7, 8, 9}), kStep));
      return grpc::Status::OK;
    }
    if (req->job_id() == "gappy") {
      writer->Write(Chunk("w", {4}, 0, Floats({1}), kStep));
      writer->Write(Chunk("", {}, 2, Floats({3, 4}), kStep));
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
  }

  std::vector<v1::SubmitJobRequest> submitted() {
    absl::MutexLock lock(&mu_);
    return submitted_;
  }
  // The live view of "big" from here on: ps 1 did not answer the chief.
  void LosePs1() {
    absl::MutexLock lock(&mu_);
    ps1_lost_ = true;
  }
  std::vector<int64_t> watch_after() {
    absl::MutexLock lock(&mu_);
    return watch_after_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, v1::JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> watch_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> watch_after_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SubmitJobRequest> submitted_ ABSL_GUARDED_BY(mu_);
  bool ps1_lost_ ABSL_GUARDED_BY(mu_) = false;
};

struct Result {
  int code;
  std::string out;
  std::string err;
};

class TowerctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int port = 0;
    auto server = common::StartServer("127.0.0.1:0", {&service_}, &port);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    chief_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs towerctl with --chief pointing at the fake.
  Result Run(std::vector<std::string> args, bool tty = false) {
    args.insert(args.begin(), "--chief=" + chief_);
    return RunRaw(args, tty);
  }
  Result RunRaw(const std::vector<std::string>& args, bool tty = false,
                const std::string& env_chief = "") {
    std::ostringstream out, err;
    TowerctlEnv env{out, err, tty, env_chief};
    const int code = RunTowerctl(args, env);
    return {code, out.str(), err.str()};
  }
  std::string TmpPath(const std::string& name) {
    return absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = TmpPath(name);
    std::ofstream(path) << text;
    return path;
  }

  FakeJobService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string chief_;
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// --- Usage and exit codes ----------------------------------------------------

TEST_F(TowerctlTest, HelpAndNoArguments) {
  Result help = RunRaw({"help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "Exit codes:"));
  EXPECT_TRUE(Contains(help.out, "safetensors"));
  EXPECT_EQ(RunRaw({"--help"}).code, 0);
  EXPECT_EQ(RunRaw({"status", "-h"}).code, 0);
  Result none = RunRaw({});
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(Contains(none.err, "missing command"));
  EXPECT_TRUE(Contains(none.err, "Usage:"));
}

TEST_F(TowerctlTest, UsageErrorsExit2AndNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"frobnicate"}, "unknown command \"frobnicate\""},
      {{"list", "--bogus"}, "list: unknown flag --bogus"},
      {{"--bogus", "list"}, "unknown flag --bogus"},
      {{"status"}, "status: missing JOB"},
      {{"status", "a", "b"}, "status: unexpected argument \"b\""},
      {{"export", "mnist"}, "export: missing OUT"},
      {{"logs", "-x", "mnist"}, "logs: unknown flag -x"},
      {{"submit"}, "submit: missing JOB_FILE"},
      {{"submit", "--resume"}, "--resume needs a job id"},
      {{"submit", "--nope", "f"}, "submit: unknown flag --nope"},
      {{"--output=xml", "list"}, "--output must be table or json, not \"xml\""},
      {{"--timeout_s=soon", "list"}, "--timeout_s must be a positive number"},
      {{"--timeout_s=-1", "list"}, "--timeout_s must be a positive number"},
      {{"list", "--output"}, "--output needs a value"},
  };
  for (const Case& c : cases) {
    Result r = Run(c.args);
    EXPECT_EQ(r.code, 2) << c.args[0] << ": " << r.err;
    EXPECT_TRUE(Contains(r.err, "towerctl: " + c.message) || Contains(r.err, c.message))
        << "wanted \"" << c.message << "\" in: " << r.err;
  }
}

// Issue 15: the security flags are checked before any call, naming the flag
// and the path (exit 2); both the token file and $TOWERPS_AUTH_TOKEN is an
// error.
TEST_F(TowerctlTest, BadSecurityFlagsAreUsageErrorsNamingTheFlag) {
  Result r = RunRaw({"--chief=127.0.0.1:1", "--tls_cert=/x/c.pem", "list"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(Contains(r.err, "--tls_cert=/x/c.pem needs --tls_key")) << r.err;
  r = RunRaw({"--chief=127.0.0.1:1", "--tls_ca", "/absent/ca.pem", "list"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(Contains(r.err, "--tls_ca=/absent/ca.pem: cannot read")) << r.err;
  r = RunRaw({"--auth_token_file=/absent/token", "health", "127.0.0.1:1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(Contains(r.err, "--auth_token_file=/absent/token: cannot read")) << r.err;

  const std::string token = TmpPath("token");
  std::ofstream(token) << "Tok3nFromFile\n";
  std::ostringstream out, err;
  TowerctlEnv env{out, err, false, chief_};
  env.auth_token_from_env = "Tok3nFromEnv";
  EXPECT_EQ(RunTowerctl({"--auth_token_file=" + token, "list"}, env), 2);
  EXPECT_TRUE(Contains(err.str(), "both set")) << err.str();
  EXPECT_FALSE(Contains(err.str(), "Tok3nFrom")) << err.str();
}

// The environment's TOWERCTL_TLS_* / TOWERCTL_AUTH_TOKEN_FILE are the flags'
// defaults: checked the same way, and a flag given replaces its variable.
TEST_F(TowerctlTest, SecurityDefaultsComeFromTheEnvironmentAndFlagsWin) {
  std::ostringstream out, err;
  TowerctlEnv env{out, err, false, chief_};
  env.security_from_env.tls_ca = "/absent/env_ca.pem";
  EXPECT_EQ(RunTowerctl({"list"}, env), 2);
  EXPECT_TRUE(Contains(err.str(), "--tls_ca=/absent/env_ca.pem: cannot read")) << err.str();

  const std::string token = TmpPath("env_token");
  std::ofstream(token) << "Tok3nFromEnvFile\n";
  std::ostringstream out2, err2;
  TowerctlEnv env2{out2, err2, false, chief_};
  env2.security_from_env.tls_server_name = "towerps";
  env2.security_from_env.auth_token_file = token;
  // A server name without TLS is refused: the variable was read.
  EXPECT_EQ(RunTowerctl({"list"}, env2), 2);
  EXPECT_TRUE(Contains(err2.str(), "--tls_server_name=towerps needs TLS")) << err2.str();
  // The flag replaces the variable: a readable token file from the flag, no
  // server name, and the (plaintext, tokenless) fake chief answers.
  std::ostringstream out3, err3;
  TowerctlEnv env3{out3, err3, false, chief_};
  env3.security_from_env.auth_token_file = "/absent/env_token";
  EXPECT_EQ(RunTowerctl({"--auth_token_file=" + token, "list"}, env3), 0) << err3.str();
}

TEST_F(TowerctlTest, ChiefComesFromTheFlagOrTheEnvironment) {
  Result missing = RunRaw({"list"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(Contains(missing.err, "--chief")) << missing.err;
  EXPECT_TRUE(Contains(missing.err, "TOWERCTL_CHIEF")) << missing.err;

  std::vector<std::string> asked;
  std::ostringstream out, err;
  TowerctlEnv env{out, err, false, chief_};
  env.stub_factory = [&asked](const std::string& chief, const common::RpcSecurity& security) {
    asked.push_back(chief);
    return DefaultJobServiceStubFactory()(chief, security);
  };
  EXPECT_EQ(RunTowerctl({"list"}, env), 0) << err.str();
  EXPECT_TRUE(Contains(out.str(), "mnist"));
  // The flag wins over the environment; "--chief VALUE" works too.
  EXPECT_EQ(RunTowerctl({"list", "--chief", "127.0.0.1:1", "--timeout_s", "0.5"}, env), 3);
  EXPECT_EQ(asked, (std::vector<std::string>{chief_, "127.0.0.1:1"}));
}

TEST_F(TowerctlTest, UnreachableChiefExits3) {
  // A port that was free a moment ago: nothing listens there.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string dead = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"list"}, {"logs", "-f", "x"}, {"status", "x"}}) {
    std::vector<std::string> args = {"--chief=" + dead, "--timeout_s=1"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    Result r = RunRaw(args);
    EXPECT_EQ(r.code, 3) << cmd[0] << ": " << r.err;
    EXPECT_TRUE(Contains(r.err, "towerctl: cannot reach the chief at " + dead + ": ")) << r.err;
  }
}

// `health` talks to the address it is given (no --chief needed); the fake
// chief's server has gRPC's default health service, NOT_SERVING until
// SetServing.
TEST_F(TowerctlTest, HealthPrintsTheStateAndExits0OnlyWhenServing) {
  Result r = RunRaw({"health", chief_});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "NOT_SERVING\n");

  common::SetServing(*server_);
  r = RunRaw({"health", chief_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = RunRaw({"--output=json", "health", chief_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"status\": \"SERVING\"}\n");

  r = RunRaw({"health", "--service=towerps.v1.NoSuchService", chief_});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");

  common::BeginDraining(*server_);
  r = RunRaw({"health", chief_, "--service", ""});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "NOT_SERVING\n");
}

TEST_F(TowerctlTest, HealthUsageErrorsExit2AndUnreachableExits3) {
  Result r = RunRaw({"health"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(Contains(r.err, "health: missing HOST:PORT")) << r.err;
  r = RunRaw({"health", chief_, "extra"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(Contains(r.err, "unexpected argument \"extra\"")) << r.err;

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string dead = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  r = RunRaw({"--timeout_s=1", "health", dead});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(Contains(r.err, "towerctl: cannot reach " + dead + ": ")) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(TowerctlTest, UnknownJobExits1) {
  for (const char* cmd : {"status", "cancel", "logs"}) {
    Result r = Run({cmd, "nope"});
    EXPECT_EQ(r.code, 1) << cmd;
    EXPECT_EQ(r.err, "towerctl: job \"nope\": not found\n") << cmd;
  }
}

// --- list / status / cluster / cancel ----------------------------------------

TEST_F(TowerctlTest, ListIsAnAlignedTable) {
  Result r = Run({"list"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;
  const std::vector<std::string> columns = {"JOB",  "STATE", "SUBMITTED", "DURATION",
                                            "STEP", "LOSS",  "ACCURACY",  "ERROR"};
  std::vector<size_t> offsets;
  for (const std::string& c : columns) {
    offsets.push_back(lines[0].find(c));
    ASSERT_NE(offsets.back(), std::string::npos) << c;
  }
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  // Every cell but ERROR is filled, so every column starts at its header's offset.
  for (size_t row = 1; row < lines.size(); ++row) {
    for (size_t c = 1; c + 1 < columns.size(); ++c) {
      ASSERT_GT(lines[row].size(), offsets[c]) << lines[row];
      EXPECT_EQ(lines[row].substr(offsets[c] - 2, 2), "  ") << columns[c] << ": " << lines[row];
      EXPECT_NE(lines[row][offsets[c]], ' ') << columns[c] << ": " << lines[row];
    }
  }
  EXPECT_TRUE(Contains(lines[1], "mnist"));
  EXPECT_TRUE(Contains(lines[1], "468/468"));
  EXPECT_TRUE(Contains(lines[1], "0.8632 test"));
  EXPECT_TRUE(Contains(lines[1], "2m04s"));
  EXPECT_TRUE(Contains(lines[2], "0.6100 train"));
  // The error is cut to fit and starts in the ERROR column.
  EXPECT_EQ(lines[3].find("ps 1 lost"), offsets.back()) << r.out;
  EXPECT_TRUE(Contains(lines[3], "..."));
  EXPECT_FALSE(Contains(lines[3], "(3 of 3 used)"));
}

TEST_F(TowerctlTest, StatusOfARunningJobExplainsTheStall) {
  Result r = Run({"status", "big"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "State:        RUNNING")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Live: global step 12")) << r.out;
  EXPECT_TRUE(Contains(r.out, "step 12 waits for worker 1 (8.2 s)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "pushed by worker 0; waiting for worker 1 for 8.2s")) << r.out;
  // Worker and shard tables; the 3:1 placement is called out.
  EXPECT_TRUE(Contains(r.out, "OPEN STEP")) << r.out;
  EXPECT_TRUE(Contains(r.out, "10.0.0.1:2222  yes        3.00 MiB  75.0%")) << r.out;
  EXPECT_TRUE(Contains(r.out, "25.0%")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Placement is unbalanced: ps 0 holds 75.0% of the bytes")) << r.out;
  EXPECT_FALSE(Contains(r.out, "not applied")) << r.out;  // none skipped
}

TEST_F(TowerctlTest, StatusWithAServerThatDidNotReportClaimsNoShares) {
  service_.LosePs1();
  Result r = Run({"status", "big"});
  ASSERT_EQ(r.code, 0) << r.err;
  // ps 0's row keeps its own figures; its share of the total is unknown.
  EXPECT_TRUE(Contains(r.out, "10.0.0.1:2222  yes        3.00 MiB  -      3          20.5"))
      << r.out;
  EXPECT_TRUE(Contains(r.out, "10.0.0.2:2222  no         -         -      -          -")) << r.out;
  EXPECT_TRUE(Contains(r.out, "failed to connect to all addresses")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Shares of the bytes unknown: ps 1 did not report.")) << r.out;
  EXPECT_FALSE(Contains(r.out, "unbalanced")) << r.out;
  EXPECT_FALSE(Contains(r.out, "100.0%")) << r.out;
}

TEST_F(TowerctlTest, StatusOfAFinishedJobShowsItsRecordAndFinalShards) {
  Result r = Run({"status", "mnist"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "SUCCEEDED (attempt 1)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "step 468 (dir /state/jobs/mnist/checkpoints)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "test_acc 0.8632")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Parameter servers at the end of the job")) << r.out;
  EXPECT_TRUE(Contains(r.out, "90.0%")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Variable updates not applied, their values not finite")) << r.out;
  EXPECT_TRUE(Contains(r.out, "): ps 1 skipped 2.")) << r.out;
  EXPECT_FALSE(Contains(r.out, "ps 0 skipped")) << r.out;
  // The cores each server process kept busy over the job's updates.
  const size_t table = r.out.find("Parameter servers at the end of the job");
  ASSERT_NE(table, std::string::npos);
  std::vector<std::string> rows = absl::StrSplit(r.out.substr(table), '\n');
  ASSERT_GE(rows.size(), 4u) << r.out;
  const size_t col = rows[1].find("CORES");
  ASSERT_NE(col, std::string::npos) << r.out;
  EXPECT_EQ(rows[2].substr(col, 4), "0.25") << r.out;
  EXPECT_EQ(rows[3].substr(col, 1), "-") << r.out;
  EXPECT_FALSE(Contains(r.out, "Live:")) << r.out;
}

TEST_F(TowerctlTest, ClusterListsEveryTask) {
  Result r = Run({"cluster"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "worker (chief)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "connection refused")) << r.out;
  EXPECT_TRUE(Contains(r.out, "3.00 MiB, 1 job")) << r.out;
  // What its jobs count against its budget, in its own column.
  EXPECT_TRUE(Contains(r.out, "3.00 MiB, 1 job  15.0 MiB of 2.00 GiB")) << r.out;
  EXPECT_TRUE(Contains(r.out, "/job:worker/replica:0/task:1/device:CPU:1  1.00 GiB")) << r.out;
  EXPECT_TRUE(Contains(r.out, "unlimited")) << r.out;
  EXPECT_TRUE(Contains(r.out, "1h02m")) << r.out;
}

TEST_F(TowerctlTest, CancelPrintsTheNewState) {
  Result r = Run({"cancel", "big"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "big: CANCELLED\n");
}

// --- JSON ---------------------------------------------------------------------

TEST_F(TowerctlTest, JsonOutputParsesBack) {
  Result list = Run({"--output=json", "list"});
  ASSERT_EQ(list.code, 0) << list.err;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(list.out, &jobs).ok()) << list.out;
  EXPECT_EQ(jobs.jobs_size(), 3);
  EXPECT_EQ(jobs.jobs(0).metrics().test_accuracy(), 0.8632);

  Result status = Run({"status", "big", "--output", "json"});
  ASSERT_EQ(status.code, 0) << status.err;
  v1::GetJobResponse job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.out, &job).ok()) << status.out;
  ASSERT_EQ(job.live().waiting_for_size(), 1);
  EXPECT_EQ(job.live().waiting_for(0), 1);

  Result logs = Run({"--output=json", "logs", "mnist"});
  ASSERT_EQ(logs.code, 0) << logs.err;
  std::vector<std::string> lines = absl::StrSplit(logs.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& line : lines) {
    v1::JobEvent e;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &e).ok()) << line;
  }

  Result cluster = Run({"--output=json", "cluster"});
  v1::ClusterResponse tasks;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(cluster.out, &tasks).ok());
  EXPECT_EQ(tasks.tasks_size(), 4);
}

// --- logs / submit --------------------------------------------------------------

TEST_F(TowerctlTest, LogsWithoutFollowPrintsTheEventsSoFar) {
  Result r = Run({"logs", "big"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "STATE     RUNNING")) << r.out;
  EXPECT_TRUE(Contains(r.out, "LOG       placement: 2 variables on 2 servers")) << r.out;
}

TEST_F(TowerctlTest, FollowingAFailedJobExits1WithItsError) {
  Result r = Run({"logs", "-f", "broken"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(Contains(r.err, "towerctl: job \"broken\" FAILED: ps 1 lost: connection refused"))
      << r.err;
  // Not a terminal: one plain line per event, no carriage returns.
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 4u) << r.out;
  EXPECT_TRUE(Contains(r.out, "PROGRESS  epoch 1/1  step 5/100")) << r.out;
}

TEST_F(TowerctlTest, FollowingOnATerminalDrawsAProgressBar) {
  Result r = Run({"logs", "--follow", "mnist"}, /*tty=*/true);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find('\r'), std::string::npos);
  EXPECT_TRUE(Contains(r.out, "\r\x1b[Kepoch 1/1 [###############...............] 50/100"))
      << r.out;
  EXPECT_TRUE(Contains(r.out, "STATE     SUCCEEDED\n")) << r.out;
  // Without -f even a terminal gets plain lines.
  EXPECT_EQ(Run({"logs", "mnist"}, /*tty=*/true).out.find('\r'), std::string::npos);
}

TEST_F(TowerctlTest, FollowReconnectsAfterTheStreamBreaks) {
  Result r = Run({"logs", "-f", "flaky"});
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;  // Each event once, then the summary.
  EXPECT_TRUE(Contains(lines[2], "SUCCEEDED"));
  EXPECT_TRUE(absl::StartsWith(lines[3], "final: test_accuracy=")) << lines[3];
  EXPECT_EQ(service_.watch_after(), (std::vector<int64_t>{0, 2}));
}

TEST_F(TowerctlTest, SubmitPrintsTheJobIdAndWaitFollows) {
  const std::string spec = WriteFile(
      "new.txtpb", "job_id: \"new\" model { input_dim: 4 layers { type: DENSE units: 2 } }");
  Result r = Run({"submit", spec});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "new\n");
  ASSERT_EQ(service_.submitted().size(), 1u);
  EXPECT_EQ(service_.submitted()[0].spec().model().layers(0).units(), 2);

  const std::string json_spec =
      WriteFile("new2.json", R"({"jobId": "new2", "model": {"inputDim": 4}})");
  Result waited = Run({"submit", "--wait", json_spec});
  EXPECT_EQ(waited.code, 0) << waited.err;
  EXPECT_EQ(waited.out.substr(0, 5), "new2\n");
  EXPECT_TRUE(Contains(waited.out, "STATE     SUCCEEDED")) << waited.out;

  Result resumed = Run({"submit", "--resume", "mnist"});
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(resumed.out, "mnist\n");
  EXPECT_EQ(service_.submitted().back().resume_job_id(), "mnist");
  EXPECT_FALSE(service_.submitted().back().has_spec());
}

TEST_F(TowerctlTest, SubmitRejectionsExit2) {
  // Unreadable and unparsable files: named, with the problem; nothing sent.
  Result missing = Run({"submit", TmpPath("absent.json")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(Contains(missing.err, "absent.json")) << missing.err;
  const std::string bad = WriteFile("bad.json", R"({"jobId": "x", "modle": {}})");
  Result parse = Run({"submit", bad});
  EXPECT_EQ(parse.code, 2);
  EXPECT_TRUE(Contains(parse.err, "bad.json")) << parse.err;
  EXPECT_TRUE(Contains(parse.err, "modle")) << parse.err;
  const std::string empty = WriteFile("empty.json", " \n");
  Result blank = Run({"submit", empty});
  EXPECT_EQ(blank.code, 2);
  EXPECT_TRUE(absl::StartsWith(
      blank.err, absl::StrCat("towerctl: bad job spec: job spec file \"", empty, "\" is empty\n")))
      << blank.err;
  EXPECT_TRUE(service_.submitted().empty());

  // The chief's InvalidArgument and AlreadyExists: its message names the field.
  Result invalid = Run({"submit", WriteFile("zero.txtpb", "job_id: \"z\"")});
  EXPECT_EQ(invalid.code, 2);
  EXPECT_TRUE(Contains(invalid.err, "model.input_dim: required")) << invalid.err;
  Result taken =
      Run({"submit", WriteFile("taken.txtpb", "job_id: \"mnist\" model { input_dim: 1 }")});
  EXPECT_EQ(taken.code, 2);
  EXPECT_TRUE(Contains(taken.err, "job_id \"mnist\" is in use")) << taken.err;

  Result resume_unknown = Run({"submit", "--resume=ghost"});
  EXPECT_EQ(resume_unknown.code, 1);
  EXPECT_EQ(resume_unknown.err, "towerctl: job \"ghost\": not found\n");
}

// --- export ---------------------------------------------------------------------

TEST_F(TowerctlTest, ExportWritesASafetensorsFile) {
  const std::string path = TmpPath("mnist.safetensors");
  Result r = Run({"export", "mnist", path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "2 tensors")) << r.out;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  ASSERT_EQ(n % 8, 0u);
  ASSERT_EQ(file.size(), 8 + n + 9 * 4);
  google::protobuf::Struct header;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(file.substr(8, n), &header).ok());
  const auto& kernel = header.fields().at("dense_0/kernel").struct_value().fields();
  EXPECT_EQ(kernel.at("dtype").string_value(), "F32");
  EXPECT_EQ(kernel.at("shape").list_value().values(1).number_value(), 3);
  const auto& bias = header.fields().at("dense_0/bias").struct_value().fields();
  EXPECT_EQ(bias.at("data_offsets").list_value().values(0).number_value(), 24);
  EXPECT_EQ(bias.at("data_offsets").list_value().values(1).number_value(), 36);
  const auto& meta = header.fields().at("__metadata__").struct_value().fields();
  EXPECT_EQ(meta.at("global_step").string_value(), "468");
  EXPECT_EQ(meta.at("job_id").string_value(), "mnist");
  EXPECT_EQ(file.substr(8 + n), Floats({1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(TowerctlTest, ExportWithAGapFailsAndWritesNothing) {
  const std::string path = TmpPath("gappy.safetensors");
  Result r = Run({"export", "gappy", path});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(Contains(r.err, "variable \"w\": chunk at element 2, expected 1 (a gap)")) << r.err;
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
}

}  // namespace
}  // namespace towerps::client
