#!/usr/bin/env bash
# What a container allows, on real processes in a real cgroup that this test
# creates and removes (common/host_limits.h): 1 GiB of memory and 1 CPU of
# bandwidth, cgroup v2 or v1. SKIPPED, saying why, where this process cannot
# make one (not root, a read-only /sys/fs/cgroup, no memory or cpu
# controller).
# - one ps and one worker --serve (the chief), both started in the cgroup:
#   their default memory budgets are half of its 1 GiB, not of the host's
#   memory, and their logs say where the limit came from;
# - a job whose model the ps would hold at about 1.1 GB (7 floats an
#   element with one worker: value, pull snapshot, Adam's slots and the ones
#   its pushes form ahead, a push buffer) fails cleanly, naming the ps's
#   --memory_budget_bytes (on the host's memory it was admitted, and the
#   kernel then killed the ps at the cgroup's limit); both still serve;
# - a small job then SUCCEEDS in the same cgroup, the worker's job log naming
#   one CPU math thread and the cgroup's CPU limit.
# Waits follow state (towerctl answers, log lines; jobs followed with
# submit --wait) with deadlines.
set -uo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,18p' "$0"; exit 0
fi
PS_BIN="$PWD/ps/ps"
WORKER_BIN="$PWD/worker/worker"
TOWERCTL="$PWD/client/towerctl"
for b in "$PS_BIN" "$WORKER_BIN" "$TOWERCTL"; do
  [ -x "$b" ] || { echo "FAIL: $b not built (run under bazel test //tests:cgroup_limits_test)"; exit 1; }
done
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cgroup_limits.XXXXXX")"
LIMIT=$((1 << 30))
FAILS=0 PASSES=0
PIDS=()
CGROUPS=()
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
skip() { echo "SKIP: $1"; exit 0; }
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  # Every process in them reaped (waited for above), the cgroups are empty.
  for cg in "${CGROUPS[@]}"; do
    rmdir "$cg" 2>/dev/null || echo "WARNING: could not remove $cg: $(cat "$cg/cgroup.procs" 2>&1)"
  done
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "not root: this test creates a cgroup"
NAME="towerps_test_$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  # cgroup v2, mounted at /sys/fs/cgroup: a child of the root with the
  # memory and cpu controllers enabled for the root's children.
  grep -qw memory /sys/fs/cgroup/cgroup.controllers && grep -qw cpu /sys/fs/cgroup/cgroup.controllers \
    || skip "cgroup v2 without the memory and cpu controllers"
  echo "+memory +cpu" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  mkdir "/sys/fs/cgroup/$NAME" 2>/dev/null || skip "cannot create /sys/fs/cgroup/$NAME"
  CGROUPS+=("/sys/fs/cgroup/$NAME")
  echo "$LIMIT" >"/sys/fs/cgroup/$NAME/memory.max" 2>/dev/null \
    && echo "100000 100000" >"/sys/fs/cgroup/$NAME/cpu.max" 2>/dev/null \
    || skip "cannot set memory.max and cpu.max in /sys/fs/cgroup/$NAME"
  echo "cgroup v2: /sys/fs/cgroup/$NAME"
else
  MEM_ROOT=$(awk '$9 == "cgroup" && $NF ~ /(^|,)memory(,|$)/ {print $5; exit}' /proc/self/mountinfo)
  CPU_ROOT=$(awk '$9 == "cgroup" && $NF ~ /(^|,)cpu(,|$)/ {print $5; exit}' /proc/self/mountinfo)
  [ -n "$MEM_ROOT" ] && [ -n "$CPU_ROOT" ] || skip "no cgroup v2 and no v1 memory and cpu hierarchies"
  mkdir "$MEM_ROOT/$NAME" 2>/dev/null || skip "cannot create $MEM_ROOT/$NAME"
  CGROUPS+=("$MEM_ROOT/$NAME")
  if [ "$CPU_ROOT" != "$MEM_ROOT" ]; then
    mkdir "$CPU_ROOT/$NAME" 2>/dev/null || skip "cannot create $CPU_ROOT/$NAME"
    CGROUPS+=("$CPU_ROOT/$NAME")
  fi
  echo "$LIMIT" >"$MEM_ROOT/$NAME/memory.limit_in_bytes" 2>/dev/null \
    && echo 100000 >"$CPU_ROOT/$NAME/cpu.cfs_period_us" 2>/dev/null \
    && echo 100000 >"$CPU_ROOT/$NAME/cpu.cfs_quota_us" 2>/dev/null \
    || skip "cannot set the memory and CPU limits of $NAME"
  echo "cgroup v1: $MEM_ROOT/$NAME, $CPU_ROOT/$NAME"
fi
# in_cgroup CMD...: runs CMD in every cgroup made above, as this process
# (started with &, $! is CMD's own pid).
in_cgroup() {
  exec sh -c 'for cg in $CGS; do echo $$ >"$cg/cgroup.procs" || exit 97; done; exec "$@"' sh "$@"
}
export CGS="${CGROUPS[*]}"

IFS=, read -r PS_PORT WORKER_PORT <<<"$(python3 "$PWD/deploy/free_ports.py" 2)"
export TOWERCTL_CHIEF="127.0.0.1:$WORKER_PORT"
COMMON=(--ps_hosts="127.0.0.1:$PS_PORT" --worker_hosts="$TOWERCTL_CHIEF")
in_cgroup "$PS_BIN" "${COMMON[@]}" --job_name=ps --task_index=0 --state_dir="$TMP/state" \
  >"$TMP/ps.log" 2>&1 &
PS_PID=$!; PIDS+=($PS_PID)
in_cgroup "$WORKER_BIN" "${COMMON[@]}" --job_name=worker --task_index=0 --serve \
  --state_dir="$TMP/state" >"$TMP/chief.log" 2>&1 &
CHIEF_PID=$!; PIDS+=($CHIEF_PID)
deadline=$((SECONDS + 120)) up=0
while [ $SECONDS -lt $deadline ]; do
  if "$TOWERCTL" --timeout_s=2 list >/dev/null 2>&1 && grep -q "resident memory with no job" "$TMP/ps.log"; then
    up=1; break
  fi
  kill -0 "$CHIEF_PID" 2>/dev/null && kill -0 "$PS_PID" 2>/dev/null || break
  sleep 0.1
done
[ "$up" = 1 ] || { tail -5 "$TMP/ps.log" "$TMP/chief.log"; echo "FAIL: the cluster did not start"; exit 1; }

HALF=$((LIMIT / 2))
grep -q "memory budget $HALF bytes (half of $LIMIT: its cgroup's memory limit is $LIMIT bytes" "$TMP/ps.log" \
  && pass "ps: $(grep -m1 -o 'memory budget [^;]*)' "$TMP/ps.log")" \
  || fail "ps budget: $(grep -m1 'memory budget' "$TMP/ps.log")"
grep -q "worker: memory budget $HALF bytes, half of $LIMIT: its cgroup's memory limit is $LIMIT bytes" "$TMP/chief.log" \
  && pass "worker: $(grep -m1 -o 'memory budget.*' "$TMP/chief.log")" \
  || fail "worker budget: $(grep -m1 'memory budget' "$TMP/chief.log")"

# job ID UNITS EPOCHS: a 784 -> UNITS -> 2048 -> 10 MLP on a slice of the data.
job() {
  cat >"$TMP/$1.txtpb" <<JOB
job_id: "$1"
model { input_dim: 784 layers { type: DENSE units: $2 activation: RELU } layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: 10 } }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 2000 max_test_examples: 500 }
global_batch_size: 50
epochs: $3
JOB
}
echo "== a job over the ps's budget (half of the cgroup's memory) is refused, not killed"
# 784 x 49152 + 49152 x 64 = 41.7M floats, 167 MB a copy: the worker holds
# two (334 MB, under its 512 MiB), the ps seven (1.1 GB, over its 512 MiB).
job big 49152 1
# submit --wait follows the job to its end: exit 0 SUCCEEDED, 1 otherwise.
out=$(timeout 180 "$TOWERCTL" submit "$TMP/big.txtpb" --wait 2>&1); rc=$?
if [ "$rc" -eq 1 ]; then
  status=$("$TOWERCTL" --timeout_s=5 status big 2>&1)
  if grep -q "State: *FAILED" <<<"$status" && grep -q -- "--memory_budget_bytes" <<<"$status"; then
    pass "big job FAILED naming the ps's budget: $(grep -m1 '^Error' <<<"$status" | cut -c1-200)"
  else
    fail "big job: $(head -12 <<<"$status")"
  fi
elif [ "$rc" -eq 2 ] && grep -q -- "--memory_budget_bytes" <<<"$out"; then
  pass "big job refused at submit naming a budget: $(tr '\n' ' ' <<<"$out" | cut -c1-200)"
else
  fail "big job: submit exit $rc: $out"
fi
kill -0 "$PS_PID" 2>/dev/null && kill -0 "$CHIEF_PID" 2>/dev/null \
  && pass "ps and worker still run" || fail "a process died: $(tail -3 "$TMP/ps.log" "$TMP/chief.log")"

echo "== a small job trains in the same cgroup, one math thread"
job small 64 1
out=$(timeout 180 "$TOWERCTL" submit "$TMP/small.txtpb" --wait 2>&1); rc=$?
[ "$rc" -eq 0 ] && pass "small job SUCCEEDED" || fail "small job: exit $rc: $(tail -3 <<<"$out")"
# (The events read whole before grep: `grep -q` would leave towerctl writing
# to a closed pipe.)
events=$("$TOWERCTL" --timeout_s=5 logs small 2>&1)
if grep -qF "1 CPU math thread(s) each (1 worker(s) on this host; 1 of the host's $(getconf _NPROCESSORS_ONLN) cores usable: its cgroup's CPU limit is 1 core (" <<<"$events"; then
  pass "the worker runs one math thread: $(grep -o '1 of the host.*core ([^)]*)' <<<"$events")"
elif [ "$(getconf _NPROCESSORS_ONLN)" -le 1 ]; then
  pass "one CPU online: nothing to limit"
else
  fail "math threads: $(grep -m1 'math thread' <<<"$events")"
fi

echo "cgroup_limits: $PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
