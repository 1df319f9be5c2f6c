#!/usr/bin/env bash
# grpc.health.v1 on real processes, seen by an independent client (PyPI's
# grpcio-health-checking, tests/health_probe.py) and by `towerctl health`:
# a ps and a worker (the chief, --serve) on 127.0.0.1 report SERVING once up,
# for the whole process and for each of their services; after SIGTERM the ps
# drains and stops.
#
# Python with grpcio-health-checking: $TOWERPS_HEALTH_PYTHON if it imports
# grpc_health (tests/run.sh passes it with --test_env), else the venv that
# tests/health_venv.sh makes once (PyPI on the first run; tagged
# requires-network). Every process runs under `timeout` and is killed on exit;
# waits poll with deadlines.
set -uo pipefail

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TOWERCTL="${PWD}/client/towerctl"
PROBE="${PWD}/tests/health_probe.py"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/health.XXXXXX")"
export OPENBLAS_NUM_THREADS=1
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

timeout 120 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps --task_index=0 >"$TMP/ps.log" 2>&1 &
PS_PID=$!; PIDS+=($!)
timeout 120 "$WORKER_BIN" "${CLUSTER[@]}" --job_name=worker --task_index=0 --serve \
  --state_dir="$TMP/state" >"$TMP/worker.log" 2>&1 &
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

echo "== SIGTERM to the ps: NOT_SERVING or the end of the stream, then the port closes"
# The ps turns NOT_SERVING and then shuts its server down at once: new Check
# calls may find the port already closed, so a poll cannot see the short
# NOT_SERVING window reliably. A Watch stream opened before the signal is in
# flight while the server drains and may receive NOT_SERVING; whether that
# message or the cancellation of the stream comes first is timing, so either
# counts. (common/rpc_test checks NOT_SERVING after BeginDraining exactly.)
READY="$TMP/watch_ready"
timeout 60 "$PY" "$PROBE" watch "$PS_ADDR" "" "$READY" 50 >"$TMP/watch.log" 2>&1 &
WATCH_PID=$!; PIDS+=($!)
deadline=$((SECONDS + 30))
until [[ -f "$READY" ]]; do
  kill -0 "$WATCH_PID" 2>/dev/null || break
  ((SECONDS < deadline)) || break
  sleep 0.1
done
[[ -f "$READY" ]] || die "the watcher never saw SERVING: $(cat "$TMP/watch.log")"
kill -TERM "$PS_PID"  # `timeout` passes SIGTERM on to the ps
if wait "$WATCH_PID"; then
  pass "watch: $(tail -1 "$TMP/watch.log")"
else
  fail "watch: $(cat "$TMP/watch.log")"
fi
if wait "$PS_PID"; then pass "ps exited 0 after SIGTERM"; else fail "ps exit $? after SIGTERM"; fi
grep -q "shutting down" "$TMP/ps.log" && pass "ps logged its shutdown" || fail "ps log: $(cat "$TMP/ps.log")"
towerctl_expect "towerctl health on the stopped ps" 3 "cannot reach $PS_ADDR" -- health "$PS_ADDR"

echo "== SIGTERM to the worker"
kill -TERM "$WK_PID"
if wait "$WK_PID"; then pass "worker exited 0 after SIGTERM"; else fail "worker exit $? after SIGTERM"; fi

if [[ "$FAILS" -ne 0 ]]; then
  echo "--- ps log"; cat "$TMP/ps.log"; echo "--- worker log"; cat "$TMP/worker.log"
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all health checks passed"
