#include "common/thread_name.h"

#include <pthread.h>

#include <string>

namespace towerps::common {

void SetCurrentThreadName(absl::string_view name) {
  // The kernel's limit is 16 bytes with the terminator; longer is ERANGE.
  const std::string cut(name.substr(0, 15));
  (void)pthread_setname_np(pthread_self(), cut.c_str());
}

std::string CurrentThreadName() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return "";
  return buf;
}

}  // namespace towerps::common
