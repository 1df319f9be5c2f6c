#include "client/towerctl_lib.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/health_check.h"
#include "client/job_event_printer.h"
#include "client/job_report.h"
#include "client/safetensors_writer.h"
#include "client/text_table.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/retry.h"
#include "common/rpc.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"

namespace towerps::client {
namespace {

constexpr char kUsage[] = R"(towerctl: the client of a towerps cluster's chief (JobService).

Usage: towerctl [GLOBAL OPTIONS] COMMAND [ARGS]

Commands:
  submit JOB_FILE [--wait]     Submit the JobSpec in JOB_FILE (JSON if it starts
                               with '{', else protobuf text format; see
                               proto/job.proto, and deploy/jobs/ for one file
                               per built-in model) and print the job id.
                               --wait: follow the job like `logs -f` and exit by
                               its final state.
  submit --resume JOB [--wait] Resubmit job JOB (same id) from its latest
                               checkpoint. With a JOB_FILE too, the file's spec
                               is sent along.
  list                         All jobs, oldest first: id, state, submit time,
                               duration, step/total, loss, accuracy (test if
                               evaluated, else train), error.
  status JOB                   The job's record and, while it runs, the live
                               view: the open step and the workers it waits
                               for, every worker and every ps shard (bytes held
                               and their share, to spot unbalanced placement).
  logs JOB [-f]                The job's events so far; -f follows until the
                               job ends (exit 0 if it SUCCEEDED, else 1). On a
                               terminal, -f shows a live progress bar.
  cancel JOB                   Cancel the job; prints its new state.
  cluster                      Every ps and worker task: address, health,
                               uptime, devices (workers), bytes held and what
                               the jobs count against --memory_budget_bytes
                               (ps).
  export JOB OUT               Write the weights of the job's latest checkpoint
                               (the final ones once it ended) to the file OUT in
                               the safetensors format (see below).
  health HOST:PORT [--service=NAME]
                               Ask any ps or worker (no --chief needed) through
                               grpc.health.v1 whether it serves: prints SERVING,
                               NOT_SERVING (starting or shutting down) or
                               SERVICE_UNKNOWN; exit 0 only for SERVING. NAME:
                               towerps.v1.ParameterService, WorkerService or
                               JobService. Default: the whole process.
  help                         This text.

Global options (anywhere on the line; also as --name VALUE):
  --chief=HOST:PORT     The chief's JobService. Default: $TOWERCTL_CHIEF.
  The --tls_* and --auth_token_file options below default to the environment
  variables TOWERCTL_TLS_CERT, TOWERCTL_TLS_KEY, TOWERCTL_TLS_CA,
  TOWERCTL_TLS_SERVER_NAME and TOWERCTL_AUTH_TOKEN_FILE.
  --output=table|json   json: the response as protobuf JSON (logs: one JSON
                        object per event and line). Default: table.
  --tls_ca=PEM          TLS: verify the chief (or the health address) with these
                        CA certificates; it must name the address dialed (SAN).
  --tls_cert=PEM --tls_key=PEM
                        Client certificate and key, for servers that require
                        mutual TLS.
  --tls_server_name=N   TLS: the name the server's certificate must carry,
                        checked instead of the host dialed (e.g. towerps for
                        the certificates of deploy/make_certs.sh).
  --auth_token_file=F   The cluster's bearer token (alternative:
                        $TOWERPS_AUTH_TOKEN; not both). Health needs none.
  --timeout_s=N         Deadline of each call in seconds. Default: 10. Followed
                        streams (logs -f, submit --wait) have none; export has
                        60 x N.

Exit codes:
  0  success; a followed job SUCCEEDED; health: SERVING
  1  a followed job FAILED or was CANCELLED; an error from the chief (for
     example a job that does not exist); a bad export stream; health: not
     SERVING
  2  usage error: unknown command or flag, missing argument, unreadable or
     invalid job spec (also a spec the chief rejects, or a job id in use)
  3  the chief (health: the address) cannot be reached (unavailable, or no
     answer before the deadline)

Export format (safetensors, https://github.com/huggingface/safetensors):
  8 bytes     N, the header size, little-endian unsigned 64-bit
  N bytes     a JSON object, padded with spaces to a multiple of 8:
              {"<variable>": {"dtype": "F32", "shape": [d0, d1, ...],
                              "data_offsets": [begin, end]}, ...,
               "__metadata__": {"job_id": "<id>", "global_step": "<step>"}}
  the rest    the tensors' float32 little-endian data back to back; offsets
              are byte offsets into this part.
  The file is written to OUT.tmp, fsynced and renamed to OUT. A stream with a
  gap, an overlap or a missing end is an error (exit 1) and writes nothing.
)";

constexpr int kExportTimeoutFactor = 60;

// The command line, once parsed.
struct Options {
  std::string chief;
  bool json = false;
  double timeout_s = 10;
  std::shared_ptr<const common::RpcSecurity> security;
};

// One command's run: its options, output streams and stub.
struct Call {
  const TowerctlEnv& env;
  Options opts;
  std::unique_ptr<v1::JobService::StubInterface> stub;

  void SetDeadline(grpc::ClientContext* ctx, double factor = 1) const {
    ctx->set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(opts.timeout_s * factor * 1e6)));
  }
};

int UsageError(const TowerctlEnv& env, const std::string& message) {
  env.err << "towerctl: " << message << "\n"
          << "Run 'towerctl help' for usage.\n";
  return kExitUsage;
}

bool IsUnreachable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Prints an RPC failure and returns its exit code. `job_id`: the job the call
// was about, if any (NotFound then reads `job "x": not found`).
int RpcError(const Call& call, const grpc::Status& status, const std::string& what,
             const std::string& job_id = "") {
  std::ostream& err = call.env.err;
  if (IsUnreachable(status.error_code())) {
    err << "towerctl: cannot reach the chief at " << call.opts.chief << ": "
        << (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                ? absl::StrFormat("no answer within %gs (%s)", call.opts.timeout_s,
                                  status.error_message())
                : status.error_message())
        << "\n";
    return kExitUnreachable;
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND && !job_id.empty()) {
    err << "towerctl: job \"" << job_id << "\": not found\n";
    return kExitFailed;
  }
  err << "towerctl: " << what << ": "
      << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())) << ": "
      << status.error_message() << "\n";
  return kExitFailed;
}

void PrintJson(const Call& call, const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  call.env.out << json << "\n";
}

bool IsFinal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

// --- Follow / logs -----------------------------------------------------------

// Streams the job's events to env.out. follow: until the job ends, riding out
// a chief that drops the stream (reconnecting after the last event seen, for
// up to --timeout_s). Returns the exit code.
int WatchEvents(Call& call, const std::string& job_id, bool follow) {
  JobEventPrinter::Style style = call.opts.json ? JobEventPrinter::Style::kJson
                                 : follow && call.env.stdout_is_tty
                                     ? JobEventPrinter::Style::kTerminal
                                     : JobEventPrinter::Style::kPlain;
  JobEventPrinter printer(call.env.out, style);
  int64_t after_seq = 0;
  bool received_any = false;
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  std::string final_message;
  // Reconnects wait 200 ms doubling to 2 s; a chief unreachable for about
  // --timeout_s ends the command. Engaged at the first break after the last
  // event and dropped at the next event, so that the deadline counts from the
  // break.
  const common::RetryPolicy reconnect =
      common::RetryPolicy::Transport()
          .WithBackoff(absl::Milliseconds(200), absl::Seconds(2))
          .WithDeadline(absl::Seconds(call.opts.timeout_s));
  std::optional<common::Backoff> backoff;
  while (true) {
    grpc::ClientContext ctx;
    if (!follow) call.SetDeadline(&ctx);
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_follow(follow);
    req.set_after_seq(after_seq);
    std::unique_ptr<grpc::ClientReaderInterface<v1::JobEvent>> reader =
        call.stub->WatchJob(&ctx, req);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      received_any = true;
      backoff.reset();
      if (event.seq() != 0) {
        if (event.seq() <= after_seq) continue;  // Already shown before a reconnect.
        after_seq = event.seq();
      }
      printer.Print(event);
      if (event.kind() == v1::JobEvent::STATE) {
        // A resubmitted job's history holds an earlier end: only the last counts.
        final_state = IsFinal(event.state()) ? event.state() : v1::JOB_STATE_UNSPECIFIED;
        final_message = event.message();
      }
    }
    const grpc::Status status = reader->Finish();
    if (!follow) {
      printer.Finish();
      return status.ok() ? kExitOk : RpcError(call, status, "logs", job_id);
    }
    if (status.ok() && final_state != v1::JOB_STATE_UNSPECIFIED) break;
    if (!backoff.has_value()) backoff.emplace(reconnect);
    if (status.ok()) {
      // The chief ended the stream before the job ended: ask for the state.
      grpc::ClientContext get_ctx;
      call.SetDeadline(&get_ctx);
      v1::GetJobRequest get;
      get.set_job_id(job_id);
      v1::GetJobResponse resp;
      const grpc::Status s = call.stub->GetJob(&get_ctx, get, &resp);
      if (!s.ok()) {
        printer.Finish();
        return RpcError(call, s, "logs", job_id);
      }
      if (IsFinal(resp.job().state())) {
        final_state = resp.job().state();
        final_message = resp.job().error();
        break;
      }
      backoff->Pause().IgnoreError();  // Without a token it always waits and returns OK.
    } else if (!received_any || !backoff->Wait(common::FromGrpcStatus(status)).ok()) {
      // Never connected (a wrong address or job, shown at once), not a
      // transport error, or unreachable for too long: the RPC's error.
      printer.Finish();
      return RpcError(call, status, "logs", job_id);
    }
    // Otherwise the stream broke after it worked: the chief may be restarting.
  }
  printer.Finish();
  if (final_state == v1::SUCCEEDED) {
    if (!call.opts.json) {
      // One summary line, the same as a one-job worker prints.
      grpc::ClientContext ctx;
      call.SetDeadline(&ctx);
      v1::GetJobRequest get;
      get.set_job_id(job_id);
      v1::GetJobResponse resp;
      if (call.stub->GetJob(&ctx, get, &resp).ok()) {
        const v1::JobRecord& r = resp.job();
        const v1::Metrics& m = r.metrics();
        call.env.out << absl::StrFormat(
            "final: test_accuracy=%s test_loss=%s steps=%d wall_s=%.1f\n",
            m.has_test() && m.has_accuracy() ? absl::StrFormat("%.4f", m.test_accuracy()) : "n/a",
            m.has_test() ? absl::StrFormat("%.4f", m.test_loss()) : "n/a",
            // The servers' step (ASYNC: every worker's pushes), else the chief's.
            r.final_shards_size() > 0 ? r.final_shards(0).global_step() : m.step(),
            r.end_time() - r.start_time());
      }
    }
    return kExitOk;
  }
  // The record has the full error; the event's message is the fallback.
  std::string error = final_message;
  {
    grpc::ClientContext ctx;
    call.SetDeadline(&ctx);
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::GetJobResponse resp;
    if (call.stub->GetJob(&ctx, get, &resp).ok() && !resp.job().error().empty()) {
      error = resp.job().error();
    }
  }
  call.env.err << "towerctl: job \"" << job_id << "\" " << JobStateName(final_state)
               << (error.empty() ? "" : ": ") << error << "\n";
  return kExitFailed;
}

// --- Commands ----------------------------------------------------------------

int Submit(Call& call, const std::vector<std::string>& args) {
  std::string file, resume;
  bool wait = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--wait") {
      wait = true;
    } else if (a == "--resume") {
      if (i + 1 >= args.size()) return UsageError(call.env, "submit: --resume needs a job id");
      resume = args[++i];
    } else if (absl::StartsWith(a, "--resume=")) {
      resume = a.substr(9);
      if (resume.empty()) return UsageError(call.env, "submit: --resume needs a job id");
    } else if (absl::StartsWith(a, "-") && a != "-") {
      return UsageError(call.env, absl::StrCat("submit: unknown flag ", a));
    } else if (file.empty()) {
      file = a;
    } else {
      return UsageError(
          call.env, absl::StrCat("submit: unexpected argument \"", a, "\" (one JOB_FILE only)"));
    }
  }
  if (file.empty() && resume.empty()) {
    return UsageError(call.env, "submit: missing JOB_FILE (or --resume JOB)");
  }
  v1::SubmitJobRequest req;
  if (!file.empty()) {
    absl::StatusOr<v1::JobSpec> spec = worker::ReadJobSpecFile(file);
    if (!spec.ok()) {
      return UsageError(call.env, absl::StrCat("bad job spec: ", spec.status().message()));
    }
    *req.mutable_spec() = *std::move(spec);
  }
  req.set_resume_job_id(resume);
  v1::SubmitJobResponse resp;
  {
    grpc::ClientContext ctx;
    call.SetDeadline(&ctx);
    const grpc::Status status = call.stub->SubmitJob(&ctx, req, &resp);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          status.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
          status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        call.env.err << "towerctl: submit: the chief rejected the job: " << status.error_message()
                     << "\n";
        return kExitUsage;
      }
      return RpcError(call, status, "submit", resume);
    }
  }
  std::string job_id = resp.job().job_id();
  if (job_id.empty()) job_id = !resume.empty() ? resume : req.spec().job_id();
  if (call.opts.json) {
    PrintJson(call, resp);
  } else {
    call.env.out << job_id << "\n";
  }
  call.env.out << std::flush;
  if (!wait) return kExitOk;
  return WatchEvents(call, job_id, /*follow=*/true);
}

int List(Call& call) {
  grpc::ClientContext ctx;
  call.SetDeadline(&ctx);
  v1::ListJobsResponse resp;
  const grpc::Status status = call.stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  if (!status.ok()) return RpcError(call, status, "list");
  if (call.opts.json) {
    PrintJson(call, resp);
    return kExitOk;
  }
  TextTable table({"JOB", "STATE", "SUBMITTED", "DURATION", "STEP", "LOSS", "ACCURACY", "ERROR"});
  for (const v1::JobRecord& r : resp.jobs()) {
    table.AddRow({r.job_id(), JobStateName(r.state()), LocalTime(r.submit_time()),
                  HumanDuration(JobDuration(r)), StepCell(r.metrics()), LossCell(r.metrics()),
                  AccuracyCell(r.metrics()), Truncate(r.error(), kErrorColumnChars)});
  }
  call.env.out << table.Render();
  return kExitOk;
}


int Status(Call& call, const std::string& job_id) {
  grpc::ClientContext ctx;
  call.SetDeadline(&ctx);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  const grpc::Status status = call.stub->GetJob(&ctx, req, &resp);
  if (!status.ok()) return RpcError(call, status, "status", job_id);
  if (call.opts.json) {
    PrintJson(call, resp);
    return kExitOk;
  }
  PrintJobRecord(call.env.out, resp.job());
  if (resp.has_live()) {
    PrintJobLiveStatus(call.env.out, resp.live());
  } else {
    PrintFinalShards(call.env.out, resp.job());
  }
  return kExitOk;
}

int Cancel(Call& call, const std::string& job_id) {
  grpc::ClientContext ctx;
  call.SetDeadline(&ctx);
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  const grpc::Status status = call.stub->CancelJob(&ctx, req, &resp);
  if (!status.ok()) return RpcError(call, status, "cancel", job_id);
  if (call.opts.json) {
    PrintJson(call, resp);
  } else {
    call.env.out << job_id << ": " << JobStateName(resp.job().state()) << "\n";
  }
  return kExitOk;
}

int Cluster(Call& call) {
  grpc::ClientContext ctx;
  call.SetDeadline(&ctx);
  v1::ClusterResponse resp;
  const grpc::Status status = call.stub->GetCluster(&ctx, v1::ClusterRequest(), &resp);
  if (!status.ok()) return RpcError(call, status, "cluster");
  if (call.opts.json) {
    PrintJson(call, resp);
    return kExitOk;
  }
  TextTable table({"JOB", "INDEX", "ADDRESS", "HEALTH", "UPTIME", "HOLDS", "BUDGET USED",
                   "DEVICE", "LIMIT", "IN USE"});
  for (const v1::TaskInfo& t : resp.tasks()) {
    std::vector<std::string> row = {
        t.is_chief() ? t.job() + " (chief)" : t.job(), absl::StrCat(t.index()), t.address(),
        t.healthy() ? "ok"
                    : Truncate(t.error().empty() ? "unhealthy" : t.error(), kErrorColumnChars),
        t.healthy() ? HumanDuration(t.uptime_s()) : "-"};
    row.push_back(t.job() == "ps" ? absl::StrCat(HumanBytes(t.bytes_held()), ", ", t.jobs(),
                                                 t.jobs() == 1 ? " job" : " jobs")
                                  : "");
    // What the ps's jobs count against --memory_budget_bytes (values, pull
    // snapshots, slots, push buffers: more than HOLDS), of the budget.
    row.push_back(t.job() == "ps" && t.healthy() && t.memory_budget_bytes() > 0
                      ? absl::StrCat(HumanBytes(t.memory_reserved_bytes()), " of ",
                                     HumanBytes(t.memory_budget_bytes()))
                      : "");
    if (t.devices_size() == 0) {
      table.AddRow(std::move(row));
      continue;
    }
    for (int i = 0; i < t.devices_size(); ++i) {
      const v1::DeviceInfo& d = t.devices(i);
      if (i > 0) row.assign(7, "");  // Further devices: on rows of their own.
      row.push_back(d.name());
      row.push_back(d.memory_limit_bytes() > 0 ? HumanBytes(d.memory_limit_bytes()) : "unlimited");
      row.push_back(HumanBytes(d.memory_in_use_bytes()));
      table.AddRow(std::move(row));
      row.clear();
    }
  }
  call.env.out << table.Render();
  return kExitOk;
}

int Export(Call& call, const std::string& job_id, const std::string& path) {
  grpc::ClientContext ctx;
  call.SetDeadline(&ctx, kExportTimeoutFactor);
  v1::ExportRequest req;
  req.set_job_id(job_id);
  SafetensorsWriter writer(job_id);
  std::unique_ptr<grpc::ClientReaderInterface<v1::ExportChunk>> reader =
      call.stub->ExportWeights(&ctx, req);
  v1::ExportChunk chunk;
  absl::Status bad_stream;
  while (reader->Read(&chunk)) {
    bad_stream = writer.Add(chunk);
    if (!bad_stream.ok()) {
      ctx.TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!bad_stream.ok()) {
    call.env.err << "towerctl: export of job \"" << job_id
                 << "\": bad stream from the chief: " << bad_stream.message() << "\n";
    return kExitFailed;
  }
  if (!status.ok()) return RpcError(call, status, "export", job_id);
  if (absl::Status s = writer.WriteFile(path); !s.ok()) {
    call.env.err << "towerctl: export of job \"" << job_id << "\": " << s.message() << "\n";
    return kExitFailed;
  }
  if (call.opts.json) {
    google::protobuf::Struct summary;
    auto& f = *summary.mutable_fields();
    f["path"].set_string_value(path);
    f["jobId"].set_string_value(job_id);
    f["globalStep"].set_number_value(static_cast<double>(writer.global_step()));
    f["tensors"].set_number_value(writer.num_variables());
    f["dataBytes"].set_number_value(static_cast<double>(writer.data_bytes()));
    PrintJson(call, summary);
  } else {
    call.env.out << "wrote " << path << ": " << writer.num_variables() << " tensors, "
                 << HumanBytes(writer.data_bytes()) << ", global step " << writer.global_step()
                 << "\n";
  }
  return kExitOk;
}

// Parses "--name=value" or "--name value" at args[*i] for a global option.
// Returns true if args[*i] was one (advancing *i past a separate value).
bool TakeGlobalOption(const std::vector<std::string>& args, size_t* i, const std::string& name,
                      std::string* value, std::string* error) {
  const std::string& a = args[*i];
  const std::string flag = "--" + name;
  if (absl::StartsWith(a, flag + "=")) {
    *value = a.substr(flag.size() + 1);
    return true;
  }
  if (a != flag) return false;
  if (*i + 1 >= args.size()) {
    *error = absl::StrCat(flag, " needs a value");
    return true;
  }
  *value = args[++*i];
  return true;
}

// The positional arguments of a command that takes exactly `names`.
bool Positional(const TowerctlEnv& env, const std::string& command,
                const std::vector<std::string>& args, const std::vector<std::string>& names,
                int* exit_code) {
  for (const std::string& a : args) {
    if (absl::StartsWith(a, "-") && a != "-") {
      *exit_code = UsageError(env, absl::StrCat(command, ": unknown flag ", a));
      return false;
    }
  }
  if (args.size() < names.size()) {
    *exit_code = UsageError(env, absl::StrCat(command, ": missing ", names[args.size()]));
    return false;
  }
  if (args.size() > names.size()) {
    *exit_code = UsageError(
        env, absl::StrCat(command, ": unexpected argument \"", args[names.size()], "\""));
    return false;
  }
  return true;
}

// `health HOST:PORT [--service=NAME]`: talks to any process, not the chief.
int Health(const TowerctlEnv& env, const Options& opts, const std::vector<std::string>& args) {
  std::string service;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string error;
    if (TakeGlobalOption(args, &i, "service", &service, &error)) {
      if (!error.empty()) return UsageError(env, "health: " + error);
      continue;
    }
    positional.push_back(args[i]);
  }
  int code = kExitOk;
  if (!Positional(env, "health", positional, {"HOST:PORT"}, &code)) return code;
  const std::string& address = positional[0];
  absl::StatusOr<ServingState> state =
      CheckHealth(address, service, absl::Seconds(opts.timeout_s), opts.security.get());
  if (!state.ok()) {
    if (absl::IsUnavailable(state.status()) || absl::IsDeadlineExceeded(state.status())) {
      env.err << "towerctl: cannot reach " << address << ": "
              << (absl::IsDeadlineExceeded(state.status())
                      ? absl::StrFormat("no answer within %gs", opts.timeout_s)
                      : std::string(state.status().message()))
              << "\n";
      return kExitUnreachable;
    }
    env.err << "towerctl: health of " << address << ": "
            << absl::StatusCodeToString(state.status().code()) << ": " << state.status().message()
            << "\n";
    return kExitFailed;
  }
  if (opts.json) {
    env.out << "{\"status\": \"" << ServingStateName(*state) << "\"}\n";
  } else {
    env.out << ServingStateName(*state) << "\n";
  }
  return *state == ServingState::kServing ? kExitOk : kExitFailed;
}

}  // namespace

JobServiceStubFactory DefaultJobServiceStubFactory() {
  return [](const std::string& chief, const common::RpcSecurity& security)
             -> std::unique_ptr<v1::JobService::StubInterface> {
    return v1::JobService::NewStub(common::NewChannel(chief, &security));
  };
}

std::string TowerctlUsage() { return kUsage; }

int RunTowerctl(const std::vector<std::string>& args, const TowerctlEnv& env) {
  Options opts;
  std::string chief_flag, output = "table", timeout;
  common::RpcSecurityOptions security = env.security_from_env;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      env.out << kUsage;
      return kExitOk;
    }
    std::string error;
    if (TakeGlobalOption(args, &i, "chief", &chief_flag, &error) ||
        TakeGlobalOption(args, &i, "output", &output, &error) ||
        TakeGlobalOption(args, &i, "timeout_s", &timeout, &error) ||
        TakeGlobalOption(args, &i, "tls_cert", &security.tls_cert, &error) ||
        TakeGlobalOption(args, &i, "tls_key", &security.tls_key, &error) ||
        TakeGlobalOption(args, &i, "tls_ca", &security.tls_ca, &error) ||
        TakeGlobalOption(args, &i, "tls_server_name", &security.tls_server_name, &error) ||
        TakeGlobalOption(args, &i, "auth_token_file", &security.auth_token_file, &error)) {
      if (!error.empty()) return UsageError(env, error);
      continue;
    }
    rest.push_back(a);
  }
  if (rest.empty()) {
    env.err << "towerctl: missing command\n\n" << kUsage;
    return kExitUsage;
  }
  const std::string command = rest[0];
  rest.erase(rest.begin());
  if (command == "help") {
    env.out << kUsage;
    return kExitOk;
  }
  if (absl::StartsWith(command, "-")) {
    return UsageError(env, absl::StrCat("unknown flag ", command));
  }
  static const char* const kCommands[] = {"submit",  "list",   "status", "logs",
                                          "cancel",  "cluster", "export", "health"};
  if (std::find(std::begin(kCommands), std::end(kCommands), command) == std::end(kCommands)) {
    return UsageError(env, absl::StrCat("unknown command \"", command,
                                        "\" (commands: submit, list, status, logs, cancel, "
                                        "cluster, export, health, help)"));
  }
  if (output == "json") {
    opts.json = true;
  } else if (output != "table") {
    return UsageError(env, absl::StrCat("--output must be table or json, not \"", output, "\""));
  }
  if (!timeout.empty() && (!absl::SimpleAtod(timeout, &opts.timeout_s) || !(opts.timeout_s > 0))) {
    return UsageError(env, absl::StrCat("--timeout_s must be a positive number of seconds, not \"",
                                        timeout, "\""));
  }
  security.auth_token_env = env.auth_token_from_env;
  absl::StatusOr<std::shared_ptr<const common::RpcSecurity>> made =
      common::RpcSecurity::Create(security, common::RpcRole::kClient);
  if (!made.ok()) return UsageError(env, std::string(made.status().message()));
  opts.security = *std::move(made);
  if (command == "health") return Health(env, opts, rest);
  opts.chief = !chief_flag.empty() ? chief_flag : env.chief_from_env;
  if (opts.chief.empty()) {
    return UsageError(env, "no chief address: pass --chief=HOST:PORT or set TOWERCTL_CHIEF");
  }

  // Check the command line fully before any call.
  int code = kExitOk;
  bool follow = false;
  if (command == "list" || command == "cluster") {
    if (!Positional(env, command, rest, {}, &code)) return code;
  } else if (command == "status" || command == "cancel") {
    if (!Positional(env, command, rest, {"JOB"}, &code)) return code;
  } else if (command == "export") {
    if (!Positional(env, command, rest, {"JOB", "OUT"}, &code)) return code;
  } else if (command == "logs") {
    std::vector<std::string> positional;
    for (const std::string& a : rest) {
      if (a == "-f" || a == "--follow") {
        follow = true;
      } else {
        positional.push_back(a);
      }
    }
    if (!Positional(env, command, positional, {"JOB"}, &code)) return code;
    rest = positional;
  }

  Call call{env, opts, env.stub_factory(opts.chief, *opts.security)};
  if (call.stub == nullptr) {
    env.err << "towerctl: cannot make a client for the chief at " << opts.chief << "\n";
    return kExitUnreachable;
  }
  if (command == "submit") return Submit(call, rest);
  if (command == "list") return List(call);
  if (command == "status") return Status(call, rest[0]);
  if (command == "logs") return WatchEvents(call, rest[0], follow);
  if (command == "cancel") return Cancel(call, rest[0]);
  if (command == "cluster") return Cluster(call);
  return Export(call, rest[0], rest[1]);
}

}  // namespace towerps::client
