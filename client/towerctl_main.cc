// towerctl: the command-line client of a towerps chief. See client/towerctl_lib.h
// and `towerctl help`.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/towerctl_lib.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

int main(int argc, char** argv) {
  const char* chief = std::getenv("TOWERCTL_CHIEF");
  const char* token = std::getenv(towerps::common::kAuthTokenEnvVar);
  towerps::client::TowerctlEnv env{std::cout, std::cerr, isatty(STDOUT_FILENO) == 1,
                                   chief != nullptr ? chief : ""};
  env.auth_token_from_env = token != nullptr ? token : "";
  env.security_from_env.tls_cert = Env("TOWERCTL_TLS_CERT");
  env.security_from_env.tls_key = Env("TOWERCTL_TLS_KEY");
  env.security_from_env.tls_ca = Env("TOWERCTL_TLS_CA");
  env.security_from_env.tls_server_name = Env("TOWERCTL_TLS_SERVER_NAME");
  env.security_from_env.auth_token_file = Env("TOWERCTL_AUTH_TOKEN_FILE");
  return towerps::client::RunTowerctl(std::vector<std::string>(argv + 1, argv + argc), env);
}
