// Writes an event file with known contents for tests/tensorboard_test.sh,
// which checks them with TensorBoard's own loaders (tests/tensorboard_check.py
// holds the same numbers):
//   "loss"          steps 0..9, 1 / (step + 1)
//   "accuracy"      steps 0..9, 0.5 + 0.05 * step
//   "dense/kernel"  step 1: the 6 values of kStep1Values
//                   step 2: (i - 50) / 20 for i in 0..99
//   "empty"         step 3: no values
//
// Usage: write_events LOG_DIR. Prints the event file's path.
#include <cstdio>
#include <vector>

#include "common/storage/event_writer.h"

namespace {

constexpr float kStep1Values[] = {-1.5f, -0.25f, 0.0f, 0.5f, 1.0f, 3.0f};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "write_events: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOG_DIR\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<towerps::common::EventWriter>> writer =
      towerps::common::EventWriter::Create(argv[1]);
  if (!writer.ok()) return Fail(writer.status());
  towerps::common::EventWriter& w = **writer;
  for (int step = 0; step < 10; ++step) {
    if (absl::Status s = w.AddScalar("loss", step, 1.0 / (step + 1)); !s.ok())
      return Fail(s);
    if (absl::Status s = w.AddScalar("accuracy", step, 0.5 + 0.05 * step);
        !s.ok())
      return Fail(s);
  }
  if (absl::Status s = w.AddHistogram("dense/kernel", 1, kStep1Values); !s.ok())
    return Fail(s);
  std::vector<float> step2;
  for (int i = 0; i < 100; ++i) step2.push_back((i - 50) / 20.0f);
  if (absl::Status s = w.AddHistogram("dense/kernel", 2, step2); !s.ok())
    return Fail(s);
  if (absl::Status s = w.AddHistogram("empty", 3, {}); !s.ok()) return Fail(s);
  if (absl::Status s = w.Close(); !s.ok()) return Fail(s);
  std::printf("%s\n", w.path().c_str());
  return 0;
}
