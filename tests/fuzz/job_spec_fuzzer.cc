// Fuzzes the JobSpec parser (JSON when the text starts with '{', text format
// otherwise), the defaults and the validation (common/job_spec).
// Invariants: a refusal is InvalidArgument with a message; a spec that
// validates re-serializes to JSON and to text format and parses back to the
// same message; JobWithDefaults is idempotent.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/job.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using towerps::v1::JobSpec;

bool SameSpec(const JobSpec& a, const JobSpec& b) {
  google::protobuf::util::DefaultFieldComparator cmp;
  cmp.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&cmp);
  // A field set to its default equals an unset one: proto3 keeps -0.0 as
  // set, and JSON's "-0" reads back as 0 (the same value to every reader).
  differ.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  return differ.Compare(a, b);
}

void CheckRoundTrip(const JobSpec& job) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  FUZZ_CHECK(google::protobuf::util::MessageToJsonString(job, &json, opts).ok(), "to JSON");
  auto from_json = towerps::worker::ParseJobSpec(json);
  FUZZ_CHECK(from_json.ok(), "JSON %s does not parse back: %s", json.c_str(),
             from_json.status().ToString().c_str());
  FUZZ_CHECK(SameSpec(job, *from_json), "JSON round trip changed the spec: %s", json.c_str());

  std::string text;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(job, &text), "to text");
  auto from_text = towerps::worker::ParseJobSpec(text);
  FUZZ_CHECK(from_text.ok(), "text %s does not parse back: %s", text.c_str(),
             from_text.status().ToString().c_str());
  FUZZ_CHECK(SameSpec(job, *from_text), "text round trip changed the spec: %s", text.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto job = towerps::worker::ParseJobSpec(text);
  if (!job.ok()) {
    FUZZ_CHECK(job.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               job.status().ToString().c_str());
    FUZZ_CHECK(!job.status().message().empty(), "a refusal without a message");
    return 0;
  }
  // The checks the worker makes on the spec as given and as completed.
  (void)towerps::worker::ValidateJob(*job, 2);
  const JobSpec full = towerps::worker::JobWithDefaults(*job);
  FUZZ_CHECK(SameSpec(full, towerps::worker::JobWithDefaults(full)),
             "JobWithDefaults is not idempotent");
  (void)towerps::worker::JobForSubmitFile(*job, /*keep_job_id=*/false);
  const absl::Status valid = towerps::worker::ValidateJob(full, towerps::worker::kAnyWorkerCount);
  if (!valid.ok()) {
    FUZZ_CHECK(valid.code() == absl::StatusCode::kInvalidArgument, "%s", valid.ToString().c_str());
    return 0;
  }
  CheckRoundTrip(*job);
  CheckRoundTrip(full);
  return 0;
}
