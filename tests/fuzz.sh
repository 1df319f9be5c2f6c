#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (bazel --config=fuzz: clang 14,
# ASan + UBSan) and runs each for SECONDS on a temporary copy of its seed
# corpus (tests/fuzz/corpus/<target>/; the repository is not modified).
# Prints one summary line per target (runs, coverage, crashes) and exits 1 if
# any target crashed, leaked, timed out or ran out of memory; the input that
# did it is kept and its path printed (copy it into the target's corpus as
# crash-<what> to keep it as a regression input).
#   tests/fuzz.sh SECONDS [TARGET...]     e.g. tests/fuzz.sh 60 ps_fuzzer
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(job_spec_fuzzer cluster_spec_fuzzer checkpoint_fuzzer manifest_fuzzer
             record_event_fuzzer dataset_fuzzer ps_fuzzer job_service_fuzzer shm_ring_fuzzer)

usage() {
  echo "usage: tests/fuzz.sh SECONDS [TARGET...]" >&2
  echo "  SECONDS: how long each target runs (a positive integer)" >&2
  echo "  TARGET: any of ${ALL_TARGETS[*]} (default: all)" >&2
  exit 2
}

[ $# -ge 1 ] || usage
seconds=$1
shift
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz: SECONDS must be a positive integer, got \"$seconds\"" >&2
  usage
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  if ! printf '%s\n' "${ALL_TARGETS[@]}" | grep -qx -- "$t"; then
    echo "fuzz: unknown target \"$t\" (known: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/towerps-fuzz.XXXXXX")
# Crashers outlive the run: kept only if something was found.
artifacts=$(mktemp -d "${TMPDIR:-/tmp}/towerps-fuzz-crashes.XXXXXX")
cleanup() {
  rm -rf "$work"
  rmdir "$artifacts" 2>/dev/null || true
}
trap cleanup EXIT

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:$t"); done
echo "fuzz: bazel build --config=fuzz ${labels[*]}"
build_start=$SECONDS
# gold warns once per ASan helper symbol ("Cannot export local symbol"): noise.
build_rc=0
bazel build --config=fuzz "${labels[@]}" 2>&1 |
  { grep -v "Cannot export local symbol" || true; } || build_rc=$?
if [ "$build_rc" -ne 0 ]; then
  echo "fuzz: build FAILED (exit $build_rc)" >&2
  exit 1
fi
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz
echo "fuzz: built in $((SECONDS - build_start)) s; each target runs ${seconds} s"

failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "$artifacts/$t"
  cp -r "tests/fuzz/corpus/$t" "$work/$t/corpus"
  log="$work/$t/log"
  start=$SECONDS
  rc=0
  # -timeout: one input may take 10 s; the outer timeout catches a hang of
  # libFuzzer itself.
  # TMPDIR inside $work: a target's own temp files go with it, even after a
  # crash (libFuzzer exits without running atexit handlers).
  TMPDIR="$work/$t" timeout --signal=KILL $((seconds + 120)) "$bin/$t" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t/" "$work/$t/corpus" >"$log" 2>&1 || rc=$?
  runs=$(grep -ao 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  cov=$(grep -aoE '(DONE|pulse|NEW|REDUCE|INITED) +cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 |
        sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+)/cov=\1 ft=\2/')
  corpus=$(find "$work/$t/corpus" -type f | wc -l)
  crashers=$(find "$artifacts/$t" -type f | wc -l)
  verdict=ok
  if [ "$rc" -ne 0 ] || [ "$crashers" -gt 0 ]; then
    verdict="FAILED (exit $rc)"
    failed=$((failed + 1))
  fi
  echo "fuzz: $t: runs=${runs:-?} ${cov:-cov=?} corpus=$corpus crashes=$crashers ($((SECONDS - start)) s) $verdict"
  if [ "$verdict" != ok ]; then
    echo "---- $t: last lines of its log"
    grep -av '^#[0-9]' "$log" | tail -40
    echo "----"
    find "$artifacts/$t" -type f | sed "s/^/fuzz: $t: crasher kept: /"
  fi
  rmdir "$artifacts/$t" 2>/dev/null || true
done
echo "fuzz: ${#targets[@]} targets, $((${#targets[@]} - failed)) clean, $failed failed"
[ "$failed" -eq 0 ]
