// towerctl: the command-line client of the chief's JobService. Everything but
// the process plumbing lives here so that tests can run commands against an
// in-process server and read what they print.
//
// RunTowerctl is thread-compatible: concurrent calls need their own streams.
#ifndef TOWERPS_CLIENT_TOWERCTL_LIB_H_
#define TOWERPS_CLIENT_TOWERCTL_LIB_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/rpc_security.h"
#include "proto/job_service.grpc.pb.h"

namespace towerps::client {

// Exit codes of towerctl (also listed in its usage text).
enum ExitCode : int {
  kExitOk = 0,           // Success; a followed job SUCCEEDED.
  kExitFailed = 1,       // A followed job FAILED or was CANCELLED; a server-side error.
  kExitUsage = 2,        // Bad command line or job spec (also InvalidArgument,
                         // AlreadyExists and ResourceExhausted, a job over a limit,
                         // from SubmitJob).
  kExitUnreachable = 3,  // The chief cannot be reached (UNAVAILABLE, DEADLINE_EXCEEDED).
};

// Makes a JobService stub for the chief's "host:port", with the TLS and token
// settings of the command line.
using JobServiceStubFactory = std::function<std::unique_ptr<v1::JobService::StubInterface>(
    const std::string& chief, const common::RpcSecurity& security)>;

// A channel made by common::NewChannel (its limits; `security`'s TLS and token).
JobServiceStubFactory DefaultJobServiceStubFactory();

// What towerctl takes from its process. The streams are not owned and must
// outlive the call.
struct TowerctlEnv {
  std::ostream& out;
  std::ostream& err;
  // Stdout is a terminal: `logs -f` and `submit --wait` draw a live progress
  // bar. Default: false (one plain line per event).
  bool stdout_is_tty = false;
  // $TOWERCTL_CHIEF, used when --chief is not given. Default: empty (unset).
  std::string chief_from_env;
  // $TOWERPS_AUTH_TOKEN, used as the token when --auth_token_file is not
  // given (both set is an error). Default: empty (unset).
  std::string auth_token_from_env;
  // $TOWERCTL_TLS_CERT, $TOWERCTL_TLS_KEY, $TOWERCTL_TLS_CA,
  // $TOWERCTL_TLS_SERVER_NAME and $TOWERCTL_AUTH_TOKEN_FILE: defaults of the
  // flags of the same names (a flag given wins). The deploy files set them in
  // every container, so that `towerctl` there needs no flags.
  // auth_token_env is not read from here (see auth_token_from_env).
  common::RpcSecurityOptions security_from_env;
  // Default: DefaultJobServiceStubFactory().
  JobServiceStubFactory stub_factory = DefaultJobServiceStubFactory();
};

// Runs one towerctl command line (`args` without the program name) and
// returns its exit code (an ExitCode). Prints results to env.out, errors to
// env.err as "towerctl: ..." lines. Blocks until the command is done; `logs
// -f` and `submit --wait` block until the job ends.
int RunTowerctl(const std::vector<std::string>& args, const TowerctlEnv& env);

// The usage text (`towerctl help`).
std::string TowerctlUsage();

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_TOWERCTL_LIB_H_
