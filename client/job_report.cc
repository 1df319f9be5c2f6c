#include "client/job_report.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_event_printer.h"
#include "client/text_table.h"
#include "common/skipped_updates.h"

namespace towerps::client {
namespace {

std::string WorkStateName(v1::WorkState s) {
  std::string name = v1::WorkState_Name(s);
  if (absl::StartsWith(name, "WORK_")) name = name.substr(5);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

std::string Workers(const std::vector<int32_t>& tasks) {
  if (tasks.empty()) return "no worker";
  return absl::StrCat(tasks.size() == 1 ? "worker " : "workers ", absl::StrJoin(tasks, ", "));
}

std::string Percent(int64_t part, int64_t total) {
  if (total <= 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * part / total);
}

}  // namespace

std::string JobStateName(v1::JobState s) { return v1::JobState_Name(s); }

double JobDuration(const v1::JobRecord& r) {
  if (r.start_time() == 0) return -1;
  const double end = r.end_time() != 0 ? r.end_time() : absl::ToUnixMicros(absl::Now()) / 1e6;
  return end - r.start_time();
}

std::string StepCell(const v1::Metrics& m) {
  if (m.total_steps() > 0) return absl::StrCat(m.step(), "/", m.total_steps());
  return absl::StrCat(m.step());
}

std::string LossCell(const v1::Metrics& m) {
  if (m.step() == 0 && m.loss() == 0) return "-";
  return absl::StrFormat("%.4f", m.loss());
}

std::string AccuracyCell(const v1::Metrics& m) {
  if (!m.has_accuracy()) return "-";
  if (m.has_test()) return absl::StrFormat("%.4f test", m.test_accuracy());
  if (m.step() == 0) return "-";
  return absl::StrFormat("%.4f train", m.accuracy());
}

std::string ImbalanceNote(const std::vector<std::pair<int, int64_t>>& shard_bytes) {
  if (shard_bytes.size() < 2) return "";
  int64_t total = 0;
  std::pair<int, int64_t> largest = shard_bytes[0];
  for (const auto& s : shard_bytes) {
    total += s.second;
    if (s.second > largest.second) largest = s;
  }
  if (total <= 0) return "";
  const double even = 1.0 / shard_bytes.size();
  const double share = static_cast<double>(largest.second) / total;
  if (share <= 1.25 * even) return "";
  return absl::StrFormat(
      "Placement is unbalanced: ps %d holds %.1f%% of the bytes (an even share is %.1f%%).",
      largest.first, 100 * share, 100 * even);
}

void PrintJobRecord(std::ostream& out, const v1::JobRecord& r) {
  auto field = [&out](const std::string& name, const std::string& value) {
    out << absl::StrFormat("%-13s %s\n", name + ":", value);
  };
  field("Job", r.job_id());
  field("State",
        absl::StrCat(JobStateName(r.state()),
                     r.attempts() > 0 ? absl::StrCat(" (attempt ", r.attempts(), ")") : ""));
  field("Submitted", LocalTime(r.submit_time()));
  field("Started", LocalTime(r.start_time()));
  field("Ended", LocalTime(r.end_time()));
  field("Duration", HumanDuration(JobDuration(r)));
  std::string ckpt = r.checkpoint_step() > 0 ? absl::StrCat("step ", r.checkpoint_step()) : "none";
  std::vector<std::string> notes;
  if (!r.checkpoint_dir().empty()) notes.push_back(absl::StrCat("dir ", r.checkpoint_dir()));
  if (r.restored_step() > 0)
    notes.push_back(absl::StrCat("restored from step ", r.restored_step()));
  if (!notes.empty()) absl::StrAppend(&ckpt, " (", absl::StrJoin(notes, "; "), ")");
  field("Checkpoint", ckpt);
  if (!r.tensorboard_dir().empty()) field("TensorBoard", r.tensorboard_dir());
  if (r.variables_bytes() > 0)
    field("Variables", HumanBytes(r.variables_bytes()) + " on the servers");
  field("Metrics", r.has_metrics() && (r.metrics().step() > 0 || r.metrics().total_steps() > 0)
                       ? MetricsSummary(r.metrics())
                       : "-");
  if (!r.error().empty()) field("Error", r.error());
}

void PrintJobLiveStatus(std::ostream& out, const v1::JobLiveStatus& live) {
  out << "\nLive: global step " << live.global_step() << "\n";
  if (!live.explanation().empty()) out << "  " << live.explanation() << "\n";
  std::set<int32_t> pushed;
  for (const v1::ShardStatus& s : live.shards()) {
    pushed.insert(s.status().pushed_this_step().begin(), s.status().pushed_this_step().end());
  }
  const std::set<int32_t> waiting(live.waiting_for().begin(), live.waiting_for().end());
  if (!waiting.empty() || !pushed.empty()) {
    std::string line = absl::StrCat("  Open step ", live.global_step(), ": pushed by ",
                                    Workers({pushed.begin(), pushed.end()}));
    if (!waiting.empty()) {
      absl::StrAppend(&line, "; waiting for ", Workers({waiting.begin(), waiting.end()}), " for ",
                      HumanDuration(live.waiting_s()));
    }
    out << line << "\n";
  }
  if (live.workers_size() > 0) {
    TextTable workers({"WORKER", "ADDRESS", "REACHABLE", "STATE", "LAST STEP", "ITERATIONS",
                       "OPEN STEP", "ERROR"});
    for (const v1::WorkerProgress& w : live.workers()) {
      std::string open = waiting.count(w.task_index())  ? "waiting"
                         : pushed.count(w.task_index()) ? "pushed"
                                                        : "";
      workers.AddRow({absl::StrCat(w.task_index()), w.address(), w.reachable() ? "yes" : "no",
                      WorkStateName(w.state()), absl::StrCat(w.last_step()),
                      absl::StrCat(w.iterations()), open, Truncate(w.error(), kErrorColumnChars)});
    }
    out << "\n" << workers.Render("  ");
  }
  if (live.shards_size() > 0) {
    // A shard that did not report (unreachable, or not holding the job) has
    // no figures, and the others' shares of the bytes are unknown.
    int64_t total = 0;
    std::vector<std::pair<int, int64_t>> bytes;
    std::vector<std::string> silent;
    for (const v1::ShardStatus& s : live.shards()) {
      if (!s.has_status()) silent.push_back(absl::StrCat(s.ps_task()));
      total += s.status().bytes_held();
      bytes.emplace_back(s.ps_task(), s.status().bytes_held());
    }
    TextTable shards({"PS", "ADDRESS", "REACHABLE", "BYTES", "SHARE", "VARIABLES", "REQ/S",
                      "LATENCY MS", "STEP", "ERROR"});
    for (const v1::ShardStatus& s : live.shards()) {
      const v1::JobStatus& st = s.status();
      const bool known = s.has_status();
      auto cell = [known](std::string v) { return known ? v : std::string("-"); };
      shards.AddRow({absl::StrCat(s.ps_task()), s.address(), s.reachable() ? "yes" : "no",
                     cell(HumanBytes(st.bytes_held())),
                     silent.empty() ? Percent(st.bytes_held(), total) : "-",
                     cell(absl::StrCat(st.num_variables())),
                     cell(absl::StrFormat("%.1f", st.requests_per_s())),
                     cell(absl::StrFormat("%.2f", st.mean_latency_ms())),
                     cell(absl::StrCat(st.global_step())), Truncate(s.error(), kErrorColumnChars)});
    }
    out << "\n" << shards.Render("  ");
    const std::string note =
        silent.empty()
            ? ImbalanceNote(bytes)
            : absl::StrCat("Shares of the bytes unknown: ps ", absl::StrJoin(silent, ", "),
                           " did not report.");
    if (!note.empty()) out << "  " << note << "\n";
    std::vector<std::pair<int, int64_t>> skipped;
    for (const v1::ShardStatus& s : live.shards()) {
      skipped.emplace_back(s.ps_task(), s.status().updates_skipped());
    }
    const std::string skipped_note = common::SkippedUpdatesNote(skipped);
    if (!skipped_note.empty()) out << "  " << skipped_note << "\n";
  }
}

void PrintFinalShards(std::ostream& out, const v1::JobRecord& r) {
  if (r.final_shards_size() == 0) return;
  int64_t total = 0;
  std::vector<std::pair<int, int64_t>> bytes;
  for (int i = 0; i < r.final_shards_size(); ++i) {
    total += r.final_shards(i).bytes_held();
    bytes.emplace_back(i, r.final_shards(i).bytes_held());
  }
  // CORES: the server process's CPU time over the span of the job's
  // updates there (every job it served in that span).
  TextTable shards({"PS", "BYTES", "SHARE", "SLOTS", "VARIABLES", "STEP", "APPLIED", "STALE",
                    "DUPLICATE", "CORES"});
  for (int i = 0; i < r.final_shards_size(); ++i) {
    const v1::JobStatus& st = r.final_shards(i);
    shards.AddRow({absl::StrCat(i), HumanBytes(st.bytes_held()), Percent(st.bytes_held(), total),
                   HumanBytes(st.slot_bytes()), absl::StrCat(st.num_variables()),
                   absl::StrCat(st.global_step()), absl::StrCat(st.pushes_applied()),
                   absl::StrCat(st.pushes_stale()), absl::StrCat(st.pushes_duplicate()),
                   st.update_span_s() > 0
                       ? absl::StrFormat("%.2f", st.update_span_cpu_s() / st.update_span_s())
                       : "-"});
  }
  out << "\nParameter servers at the end of the job:\n" << shards.Render("  ");
  const std::string note = ImbalanceNote(bytes);
  if (!note.empty()) out << "  " << note << "\n";
  std::vector<std::pair<int, int64_t>> skipped;
  for (int i = 0; i < r.final_shards_size(); ++i) {
    skipped.emplace_back(i, r.final_shards(i).updates_skipped());
  }
  const std::string skipped_note = common::SkippedUpdatesNote(skipped);
  if (!skipped_note.empty()) out << "  " << skipped_note << "\n";
}

}  // namespace towerps::client
