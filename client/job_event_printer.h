// Prints a job's event stream (JobService.WatchJob) the way towerctl shows it:
// one plain line per event, one JSON object per line, or, on a terminal, a
// progress bar redrawn in place with '\r' and the LOG/EPOCH/STATE lines
// printed above it.
//
// Thread-compatible: one stream per instance.
#ifndef TOWERPS_CLIENT_JOB_EVENT_PRINTER_H_
#define TOWERPS_CLIENT_JOB_EVENT_PRINTER_H_

#include <cstdint>
#include <deque>
#include <ostream>
#include <string>
#include <utility>

#include "proto/job_service.pb.h"

namespace towerps::client {

// "epoch 1/2  step 120/468  loss 0.4123  acc 0.8512  test_loss ...  1234 ex/s
// lr 0.001": the fields the metrics have (accuracy only for classification,
// test values once an evaluation ran).
std::string MetricsSummary(const v1::Metrics& m);

// One line (no newline) for an event: local time, kind, then the message
// and/or metrics.
std::string EventLine(const v1::JobEvent& event);

// The terminal progress line (no '\r', no newline): epoch, a bar of
// step/total `bar_width` wide, step, loss, accuracy, examples/s, learning
// rate and the ETA (`eta_s` < 0: unknown).
std::string ProgressBar(const v1::Metrics& m, double eta_s, int bar_width = 30);

class JobEventPrinter {
 public:
  enum class Style {
    kPlain,     // One line per event; no control characters.
    kTerminal,  // The live progress bar; LOG/EPOCH/STATE lines above it.
    kJson,      // One protobuf JSON object per line.
  };

  // `out` must outlive the printer.
  JobEventPrinter(std::ostream& out, Style style);

  void Print(const v1::JobEvent& event);

  // Ends the progress line, if one is shown. Call once, after the last event.
  void Finish();

  // Seconds to the end of the job at the step rate of the last ~30 s of
  // progress events; -1 while unknown.
  double EtaSeconds() const;

 private:
  void DrawBar();

  std::ostream& out_;
  const Style style_;
  bool bar_shown_ = false;
  bool have_metrics_ = false;
  v1::Metrics last_;
  std::deque<std::pair<double, int64_t>> window_;  // (event time, step)
};

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_JOB_EVENT_PRINTER_H_
