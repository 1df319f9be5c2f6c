#!/usr/bin/env bash
# grpc.health.v1 on real processes, seen by an independent client (PyPI's
# grpcio-health-checking, tests/health_probe.py) and by `towerctl health`:
# a ps and a worker (the chief, --serve) on 127.0.0.1 report SERVING once up,
# for the whole process and for each of their services. SIGTERM (issue 14):
# both run with --drain_s=5, so after the first SIGTERM a Check reads
# NOT_SERVING while the port is still open; more SIGTERMs during the shutdown
# (as `timeout` and orchestrators send) are ignored and both exit 0. No
# OPENBLAS_NUM_THREADS=1 here: OpenBLAS's own threads, which start before
# main() and never block signals, are what a repeated SIGTERM used to kill the
# process through (status 143).
#
# Python with grpcio-health-checking: $TOWERPS_HEALTH_PYTHON if it imports
# grpc_health (tests/run.sh passes it with --test_env), else the venv that
# tests/health_venv.sh makes once (PyPI on the first run; tagged
# requires-network). Every process runs under `timeout` and is killed on exit;
# waits follow state (Health/Watch streams, a FIFO) with deadlines.
set -uo pipefail

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TOWERCTL="${PWD}/client/towerctl"
PROBE="${PWD}/tests/health_probe.py"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/health.XXXXXX")"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() { echo "FAIL: $*" >&2; exit 1; }

has_health() { [[ -n "$1" ]] && "$1" -c 'import grpc_health.v1.health_pb2_grpc' >/dev/null 2>&1; }
if has_health "${TOWERPS_HEALTH_PYTHON:-}"; then
  PY="$TOWERPS_HEALTH_PYTHON"
else
  . "${PWD}/tests/health_venv.sh"
  has_health "$HEALTH_PYTHON" || die "no python with grpcio-health-checking (needs PyPI on the first run)"
  PY="$HEALTH_PYTHON"
fi
echo "python: $PY"

read -r PS_PORT WK_PORT <<<"$(python3 "$PWD/deploy/free_ports.py" 2 --sep=" ")"
PS_ADDR="127.0.0.1:$PS_PORT" WK_ADDR="127.0.0.1:$WK_PORT"
CLUSTER=(--ps_hosts="$PS_ADDR" --worker_hosts="$WK_ADDR")

timeout 120 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps --task_index=0 --drain_s=5 --state_dir="$TMP/state" >"$TMP/ps.log" 2>&1 &
PS_PID=$!; PIDS+=($!)
timeout 120 "$WORKER_BIN" "${CLUSTER[@]}" --job_name=worker --task_index=0 --serve \
  --drain_s=5 --state_dir="$TMP/state" >"$TMP/worker.log" 2>&1 &
WK_PID=$!; PIDS+=($!)

# probe_check NAME ADDRESS SERVICE WANT
probe_check() {
  local out
  if out=$("$PY" "$PROBE" check "$2" "$3" "$4" 60 2>&1); then pass "$1: $out"; else fail "$1: $out"; fi
}

echo "== SERVING once up (grpcio-health-checking)"
probe_check "ps overall" "$PS_ADDR" "" SERVING
probe_check "ps ParameterService" "$PS_ADDR" towerps.v1.ParameterService SERVING
probe_check "ps has no JobService" "$PS_ADDR" towerps.v1.JobService SERVICE_UNKNOWN
probe_check "worker overall" "$WK_ADDR" "" SERVING
probe_check "worker WorkerService" "$WK_ADDR" towerps.v1.WorkerService SERVING
probe_check "chief JobService" "$WK_ADDR" towerps.v1.JobService SERVING

# towerctl_expect NAME WANT_RC WANT_OUT -- towerctl args...
towerctl_expect() {
  local name="$1" want_rc="$2" want_out="$3"; shift 4
  local out rc
  out=$(timeout 30 "$TOWERCTL" --timeout_s=5 "$@" 2>&1); rc=$?
  if [[ "$rc" -eq "$want_rc" ]] && grep -qF -- "$want_out" <<<"$out"; then
    pass "$name: $out (rc $rc)"
  else
    fail "$name: rc=$rc (want $want_rc), output: $out"
  fi
}

echo "== towerctl health"
towerctl_expect "towerctl health ps" 0 SERVING -- health "$PS_ADDR"
towerctl_expect "towerctl health worker" 0 SERVING -- health "$WK_ADDR"
towerctl_expect "towerctl health chief JobService" 0 SERVING -- \
  health "$WK_ADDR" --service=towerps.v1.JobService
towerctl_expect "towerctl health ps JobService" 1 SERVICE_UNKNOWN -- \
  health "$PS_ADDR" --service=towerps.v1.JobService

# wait_not_serving NAME ADDRESS: the independent client's Watch reports
# NOT_SERVING (the process is draining), then `towerctl health` must say so
# too while the port is still open (the drain lasts 5 s).
wait_not_serving() {
  local out
  if ! out=$("$PY" "$PROBE" check "$2" "" NOT_SERVING 20 2>&1); then
    fail "$1: no NOT_SERVING after SIGTERM: $out"
    return 1
  fi
  towerctl_expect "$1: towerctl health during the drain" 1 NOT_SERVING -- health "$2"
}

echo "== SIGTERM twice to the ps: NOT_SERVING during the drain, more SIGTERMs ignored, exit 0"
# A Watch stream opened before the signal sees NOT_SERVING (or the end of the
# stream, if the drain passed before its message came).
# The watcher writes a line into a FIFO once it has seen SERVING; reading it
# (with a deadline) waits for exactly that.
READY="$TMP/watch_ready"
mkfifo "$READY"
exec 3<>"$READY"
timeout 60 "$PY" "$PROBE" watch "$PS_ADDR" "" "$READY" 50 >"$TMP/watch.log" 2>&1 &
WATCH_PID=$!; PIDS+=($!)
read -r -t 30 -u 3 line || die "the watcher never saw SERVING: $(cat "$TMP/watch.log")"
kill -TERM "$PS_PID"; kill -TERM "$PS_PID"  # `timeout` passes each SIGTERM on to the ps
wait_not_serving "ps" "$PS_ADDR"
# The first signal has been handled (health says so): this one lands while the
# ps is shutting down, on any of its threads.
kill -TERM "$PS_PID" 2>/dev/null
if wait "$WATCH_PID"; then
  pass "watch: $(tail -1 "$TMP/watch.log")"
else
  fail "watch: $(cat "$TMP/watch.log")"
fi
wait "$PS_PID"; rc=$?
if [[ "$rc" -eq 0 ]]; then pass "ps exited 0 after repeated SIGTERMs"; else fail "ps exit $rc after repeated SIGTERMs"; fi
grep -q "shutting down (drain 5s)" "$TMP/ps.log" && pass "ps logged its shutdown" || fail "ps log: $(cat "$TMP/ps.log")"
towerctl_expect "towerctl health on the stopped ps" 3 "cannot reach $PS_ADDR" -- health "$PS_ADDR"

echo "== SIGTERM twice to the worker (chief): the same"
kill -TERM "$WK_PID"; kill -TERM "$WK_PID"
wait_not_serving "worker" "$WK_ADDR"
kill -TERM "$WK_PID" 2>/dev/null
wait "$WK_PID"; rc=$?
if [[ "$rc" -eq 0 ]]; then pass "worker exited 0 after repeated SIGTERMs"; else fail "worker exit $rc after repeated SIGTERMs"; fi
grep -q "shutting down (drain 5s)" "$TMP/worker.log" && pass "worker logged its shutdown" || fail "worker log: $(cat "$TMP/worker.log")"

if [[ "$FAILS" -ne 0 ]]; then
  echo "--- ps log"; cat "$TMP/ps.log"; echo "--- worker log"; cat "$TMP/worker.log"
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all health checks passed"
