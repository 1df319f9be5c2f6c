#include "client/job_event_printer.h"

#include <sstream>

#include "gtest/gtest.h"
#include "proto/job_service.pb.h"

namespace towerps::client {
namespace {

v1::JobEvent Progress(double time, int64_t step) {
  v1::JobEvent e;
  e.set_kind(v1::JobEvent::PROGRESS);
  e.set_time(time);
  auto* m = e.mutable_metrics();
  m->set_step(step);
  m->set_total_steps(100);
  m->set_epoch(1);
  m->set_epochs(2);
  m->set_loss(0.5);
  m->set_has_accuracy(true);
  m->set_accuracy(0.75);
  m->set_examples_per_s(1000);
  m->set_learning_rate(0.001);
  return e;
}

v1::JobEvent Log(double time, const std::string& text) {
  v1::JobEvent e;
  e.set_kind(v1::JobEvent::LOG);
  e.set_time(time);
  e.set_message(text);
  return e;
}

TEST(JobEventPrinterTest, PlainIsOneLinePerEventWithoutCarriageReturns) {
  std::ostringstream out;
  JobEventPrinter p(out, JobEventPrinter::Style::kPlain);
  p.Print(Log(1.7e9, "started"));
  p.Print(Progress(1.7e9 + 1, 10));
  p.Finish();
  const std::string s = out.str();
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2);
  EXPECT_NE(s.find("LOG       started"), std::string::npos) << s;
  EXPECT_NE(s.find("step 10/100  loss 0.5000  acc 0.7500  1000 ex/s  lr 0.001"), std::string::npos)
      << s;
}

TEST(JobEventPrinterTest, ExamplesPerSecondIsTheWholeJobsWhereTheWorkerSaysIt) {
  v1::JobEvent e = Progress(1.7e9, 10);
  e.mutable_metrics()->set_job_examples_per_s(2000);  // two workers at 1000
  EXPECT_NE(MetricsSummary(e.metrics()).find("acc 0.7500  2000 ex/s  lr"), std::string::npos)
      << MetricsSummary(e.metrics());
  EXPECT_NE(ProgressBar(e.metrics(), 1, 10).find("  2000 ex/s  lr"), std::string::npos);
  // From a worker that reports only its own rate: that one.
  e.mutable_metrics()->clear_job_examples_per_s();
  EXPECT_NE(MetricsSummary(e.metrics()).find("acc 0.7500  1000 ex/s  lr"), std::string::npos);
  EXPECT_NE(ProgressBar(e.metrics(), 1, 10).find("  1000 ex/s  lr"), std::string::npos);
}

TEST(JobEventPrinterTest, TerminalRedrawsTheBarAndPrintsLogsAboveIt) {
  std::ostringstream out;
  JobEventPrinter p(out, JobEventPrinter::Style::kTerminal);
  p.Print(Progress(100, 10));
  p.Print(Progress(110, 20));  // 1 step/s: 80 steps left.
  EXPECT_DOUBLE_EQ(p.EtaSeconds(), 80);
  p.Print(Log(111, "checkpoint written"));
  p.Finish();
  const std::string s = out.str();
  EXPECT_NE(s.find("\r\x1b[Kepoch 1/2 [######......................"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 1m20s"), std::string::npos) << s;
  // The log line replaces the bar, which is drawn again under it.
  EXPECT_NE(s.find("\r\x1b[K"), std::string::npos);
  const size_t log = s.find("LOG       checkpoint written\n");
  ASSERT_NE(log, std::string::npos) << s;
  EXPECT_NE(s.find("epoch 1/2 [", log), std::string::npos);
  EXPECT_EQ(s.back(), '\n');
}

TEST(JobEventPrinterTest, BarAndEtaEdges) {
  v1::Metrics m = Progress(0, 150).metrics();  // Past the total: a full bar.
  EXPECT_NE(ProgressBar(m, -1, 4).find("[####] 150/100"), std::string::npos);
  EXPECT_NE(ProgressBar(m, -1, 4).find("ETA ?"), std::string::npos);
  std::ostringstream out;
  JobEventPrinter p(out, JobEventPrinter::Style::kTerminal);
  EXPECT_EQ(p.EtaSeconds(), -1);
  p.Print(Progress(100, 10));
  EXPECT_EQ(p.EtaSeconds(), -1);  // One point is no rate.
}

TEST(JobEventPrinterTest, JsonIsOneObjectPerLine) {
  std::ostringstream out;
  JobEventPrinter p(out, JobEventPrinter::Style::kJson);
  p.Print(Log(1, "a"));
  p.Print(Progress(2, 3));
  const std::string s = out.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2);
  EXPECT_EQ(s.front(), '{');
}

}  // namespace
}  // namespace towerps::client
