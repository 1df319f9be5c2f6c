#include "common/cluster_spec.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace towerps::common {
namespace {

absl::StatusOr<std::vector<std::string>> SplitHosts(const std::string& flag,
                                                    const std::string& value) {
  std::vector<std::string> hosts;
  if (value.empty()) return hosts;
  for (absl::string_view h : absl::StrSplit(value, ',')) {
    h = absl::StripAsciiWhitespace(h);
    if (h.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " has an empty entry in \"", value, "\""));
    }
    hosts.emplace_back(h);
  }
  return hosts;
}

absl::Status CheckHostPort(const std::string& what, const std::string& addr) {
  absl::string_view host, port;
  if (!addr.empty() && addr[0] == '[') {  // [v6]:port
    size_t close = addr.find(']');
    if (close == std::string::npos || close + 1 >= addr.size() ||
        addr[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": malformed address \"", addr, "\" (want [ipv6]:port)"));
    }
    host = absl::string_view(addr).substr(1, close - 1);
    port = absl::string_view(addr).substr(close + 2);
  } else {
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos || addr.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": malformed address \"", addr, "\" (want host:port)"));
    }
    host = absl::string_view(addr).substr(0, colon);
    port = absl::string_view(addr).substr(colon + 1);
  }
  int port_num = 0;
  if (host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": address \"", addr, "\" has no host"));
  }
  if (!absl::SimpleAtoi(port, &port_num) || port_num < 1 || port_num > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": address \"", addr, "\" has an invalid port \"", port,
        "\" (want 1-65535)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> StringList(
    const google::protobuf::Value& v, const std::string& what) {
  if (v.kind_case() != google::protobuf::Value::kListValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG: ", what, " must be a list of \"host:port\""));
  }
  std::vector<std::string> out;
  for (const auto& e : v.list_value().values()) {
    if (e.kind_case() != google::protobuf::Value::kStringValue) {
      return absl::InvalidArgumentError(
          absl::StrCat("TF_CONFIG: ", what, " has a non-string entry"));
    }
    out.push_back(e.string_value());
  }
  return out;
}

// The host part of "host:port" or "[v6]:port", with every loopback name as
// "loopback".
std::string HostOf(const std::string& addr) {
  std::string host = addr;
  if (!addr.empty() && addr[0] == '[') {
    host = addr.substr(1, addr.find(']') - 1);
  } else if (size_t colon = addr.rfind(':'); colon != std::string::npos) {
    host = addr.substr(0, colon);
  }
  if (host == "localhost" || host == "::1" || absl::StartsWith(host, "127.")) return "loopback";
  return host;
}

}  // namespace

int ClusterSpec::WorkersOnSameHost() const {
  const std::string self = HostOf(self_address());
  int n = 0;
  for (const std::string& w : worker) n += HostOf(w) == self ? 1 : 0;
  return n;
}

int ClusterSpec::PsOnSameHost() const {
  const std::string self = HostOf(self_address());
  int n = 0;
  for (const std::string& p : ps) n += HostOf(p) == self ? 1 : 0;
  return n;
}

std::string ClusterSpec::TaskName() const {
  return absl::StrCat("/job:", job_name, "/replica:0/task:", task_index);
}

absl::Status ValidateClusterSpec(const ClusterSpec& spec) {
  if (spec.job_name != "ps" && spec.job_name != "worker") {
    return absl::InvalidArgumentError(
        spec.job_name.empty()
            ? "missing job name: set --job_name=ps or --job_name=worker"
            : absl::StrCat("unknown job name \"", spec.job_name,
                           "\" (want ps or worker)"));
  }
  if (spec.ps.empty()) {
    return absl::InvalidArgumentError(
        "no ps tasks: set --ps_hosts=host:port[,host:port...]");
  }
  if (spec.worker.empty()) {
    return absl::InvalidArgumentError(
        "no worker tasks: set --worker_hosts=host:port[,host:port...]");
  }
  const auto& own = spec.job_name == "ps" ? spec.ps : spec.worker;
  if (spec.task_index < 0 || spec.task_index >= static_cast<int>(own.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task index ", spec.task_index, " is out of range for job \"",
        spec.job_name, "\", which has ", own.size(), " task(s)"));
  }
  std::set<std::string> seen;
  for (const auto* list : {&spec.ps, &spec.worker}) {
    const std::string kind = list == &spec.ps ? "ps" : "worker";
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string& a = (*list)[i];
      TOWERPS_RETURN_IF_ERROR(CheckHostPort(absl::StrCat(kind, " task ", i), a));
      if (!seen.insert(a).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate address \"", a, "\" in the cluster spec"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ClusterSpecFromFlags(const std::string& ps_hosts,
                                                 const std::string& worker_hosts,
                                                 const std::string& job_name,
                                                 int task_index) {
  ClusterSpec spec;
  TOWERPS_ASSIGN_OR_RETURN(spec.ps, SplitHosts("--ps_hosts", ps_hosts));
  TOWERPS_ASSIGN_OR_RETURN(spec.worker, SplitHosts("--worker_hosts", worker_hosts));
  spec.job_name = job_name;
  spec.task_index = task_index;
  TOWERPS_RETURN_IF_ERROR(ValidateClusterSpec(spec));
  return spec;
}

absl::StatusOr<ClusterSpec> ClusterSpecFromTfConfig(const std::string& json) {
  google::protobuf::Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &root);
  if (!parsed.ok()) {
    std::string why = parsed.message().as_string();
    why = why.substr(0, why.find('\n'));  // protobuf adds a multi-line excerpt
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG is not valid JSON: ", why));
  }
  const auto& f = root.fields();
  auto cluster = f.find("cluster");
  if (cluster == f.end() ||
      cluster->second.kind_case() != google::protobuf::Value::kStructValue) {
    return absl::InvalidArgumentError("TF_CONFIG has no \"cluster\" object");
  }
  const auto& cf = cluster->second.struct_value().fields();
  ClusterSpec spec;
  std::vector<std::string> chief;
  for (const auto& [name, value] : cf) {
    if (name == "ps") {
      TOWERPS_ASSIGN_OR_RETURN(spec.ps, StringList(value, "cluster.ps"));
    } else if (name == "worker") {
      TOWERPS_ASSIGN_OR_RETURN(spec.worker, StringList(value, "cluster.worker"));
    } else if (name == "chief") {
      TOWERPS_ASSIGN_OR_RETURN(chief, StringList(value, "cluster.chief"));
      if (chief.size() > 1) {
        return absl::InvalidArgumentError("TF_CONFIG: cluster.chief must have one entry");
      }
    } else if (name != "evaluator") {
      return absl::InvalidArgumentError(absl::StrCat(
          "TF_CONFIG: unknown job \"", name, "\" in cluster (want ps, worker, chief)"));
    }
  }
  auto task = f.find("task");
  if (task == f.end() ||
      task->second.kind_case() != google::protobuf::Value::kStructValue) {
    return absl::InvalidArgumentError("TF_CONFIG has no \"task\" object");
  }
  const auto& tf = task->second.struct_value().fields();
  auto type = tf.find("type");
  if (type == tf.end() ||
      type->second.kind_case() != google::protobuf::Value::kStringValue) {
    return absl::InvalidArgumentError("TF_CONFIG: task.type must be a string");
  }
  int index = 0;
  auto idx = tf.find("index");
  if (idx != tf.end()) {
    // The range first: converting a double outside int's range (1e53) is
    // undefined behaviour (found by tests/fuzz:cluster_spec_fuzzer).
    if (idx->second.kind_case() != google::protobuf::Value::kNumberValue ||
        !(idx->second.number_value() >= 0 && idx->second.number_value() <= 1e6) ||
        idx->second.number_value() != static_cast<int>(idx->second.number_value())) {
      return absl::InvalidArgumentError(
          "TF_CONFIG: task.index must be an integer from 0 to 1000000");
    }
    index = static_cast<int>(idx->second.number_value());
  }
  spec.job_name = type->second.string_value();
  spec.task_index = index;
  if (!chief.empty()) {
    spec.worker.insert(spec.worker.begin(), chief[0]);
    if (spec.job_name == "chief") {
      if (index != 0) {
        return absl::InvalidArgumentError("TF_CONFIG: the chief task's index must be 0");
      }
      spec.job_name = "worker";
    } else if (spec.job_name == "worker") {
      spec.task_index = index + 1;
    }
  }
  TOWERPS_RETURN_IF_ERROR(ValidateClusterSpec(spec));
  return spec;
}

absl::StatusOr<ClusterSpec> ResolveClusterSpec(const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name,
                                               int task_index,
                                               const std::string& tf_config) {
  if (ps_hosts.empty() && worker_hosts.empty() && job_name.empty() &&
      !tf_config.empty()) {
    return ClusterSpecFromTfConfig(tf_config);
  }
  return ClusterSpecFromFlags(ps_hosts, worker_hosts, job_name, task_index);
}

absl::StatusOr<ClusterSpec> ClusterSpecForRole(const std::string& role,
                                               const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name,
                                               int task_index,
                                               const std::string& tf_config) {
  TOWERPS_ASSIGN_OR_RETURN(
      ClusterSpec spec,
      ResolveClusterSpec(ps_hosts, worker_hosts, job_name, task_index, tf_config));
  if (spec.job_name != role) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this binary runs ", role, " tasks, but the job name is \"", spec.job_name, "\""));
  }
  return spec;
}

}  // namespace towerps::common
