// towerctl: the command-line client of a towerps chief. See client/towerctl_lib.h
// and `towerctl help`.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/towerctl_lib.h"

int main(int argc, char** argv) {
  const char* chief = std::getenv("TOWERCTL_CHIEF");
  const char* token = std::getenv(towerps::common::kAuthTokenEnvVar);
  towerps::client::TowerctlEnv env{std::cout, std::cerr, isatty(STDOUT_FILENO) == 1,
                                   chief != nullptr ? chief : ""};
  env.auth_token_from_env = token != nullptr ? token : "";
  return towerps::client::RunTowerctl(std::vector<std::string>(argv + 1, argv + argc), env);
}
