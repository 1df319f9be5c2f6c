// The main of unit tests that compute convolutions and GEMMs on the CPU
// backend: one thread for both math libraries (SetCpuMathThreads(1)), as the
// worker sets them on few cores. Left at their defaults, OpenBLAS's pool and
// oneDNN's OpenMP team (every core each) spin against each other and against
// the machine's other work: under tests/flake.sh --load, model_limits_test
// took 5-48 s a run (one of 5 timed out at 60 s), 2.1-2.3 s on one thread.
#include "gtest/gtest.h"
#include "worker/device/cpu_threads.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  towerps::worker::SetCpuMathThreads(1);
  return RUN_ALL_TESTS();
}
