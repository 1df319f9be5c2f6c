#!/usr/bin/env bash
# Resource limits (issue 15, done-when 5) on real processes on 127.0.0.1: one
# ps (--memory_budget_bytes=200 MiB, --metrics_port) and one worker --serve
# (the chief), started here with ports from deploy/free_ports.py.
# - memory-bomb specs submitted with towerctl (a layer of 10^9 units, a batch
#   of 10^12 and one over the limit, epochs 10^9, a conv of 2^20 filters on a
#   huge image; 159M parameters, within the bounds but over the chief's
#   --memory_budget_bytes=256 MiB taken for every worker) are each refused at
#   submit: towerctl exit 2, the field (or the flag) named
#   (10^12 does not fit the int32 field: towerctl's parser names its line);
# - bare ParameterService calls (tests/raw_rpc.py with grpcio, requests
#   encoded by protoc): a 7.4 GiB variable with Adam is RESOURCE_EXHAUSTED
#   naming the variable and --max_job_bytes; a shape [2^31, 2^33-1] that
#   overflows int64 likewise; a job over the budget names
#   --memory_budget_bytes and the bytes already held (so the budget is summed
#   over jobs); DeleteJob returns the bytes (the refused job then fits);
#   a 65 MiB message is refused RESOURCE_EXHAUSTED and the ps serves after;
# - towerps_refusals_total{server="ps"} and {server="chief"} counted them;
# - no process's memory grew past its budget: the ps's VmHWM stays under its
#   start-up RSS + the budget + one 64 MiB message, the chief's under its
#   start-up RSS + 256 MiB (a 10^9-unit layer alone would be 3.7 GiB);
# - and a normal small job then SUCCEEDS on the same servers (accuracy > 0.6);
# - a ps started with --blas_threads out of [1, 1024] exits 2 naming it.
# Python with grpcio: $TOWERPS_HEALTH_PYTHON, else tests/health_venv.sh's venv
# (PyPI on the first run; without it the RPC part is SKIPPED, saying so).
# Waits follow state (towerctl answers, metrics) with deadlines.
set -uo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,26p' "$0"; exit 0
fi
PS_BIN="$PWD/ps/ps"
WORKER_BIN="$PWD/worker/worker"
TOWERCTL="$PWD/client/towerctl"
RAW_RPC="$PWD/tests/raw_rpc.py"
for b in "$PS_BIN" "$WORKER_BIN" "$TOWERCTL"; do
  [ -x "$b" ] || { echo "FAIL: $b not built (run under bazel test //tests:limits_test)"; exit 1; }
done
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/limits.XXXXXX")"
STATE="$TMP/state"
SPECS="$TMP/specs"
BUDGET=$((200 << 20))
WORKER_BUDGET=$((256 << 20))
export OPENBLAS_NUM_THREADS=1
FAILS=0 PASSES=0
PIDS=()
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
mkdir -p "$STATE" "$SPECS"

has_grpc() { [[ -n "$1" ]] && "$1" -c 'import grpc' >/dev/null 2>&1; }
PY=""
if has_grpc "${TOWERPS_HEALTH_PYTHON:-}"; then
  PY="$TOWERPS_HEALTH_PYTHON"
else
  . "$PWD/tests/health_venv.sh"
  has_grpc "$HEALTH_PYTHON" && PY="$HEALTH_PYTHON"
fi

kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }  # PID FIELD -> kB

IFS=, read -r PS_PORT WORKER_PORT METRICS_PORT CHIEF_METRICS_PORT <<<"$(python3 "$PWD/deploy/free_ports.py" 4)"
PS_ADDR="127.0.0.1:$PS_PORT"
export TOWERCTL_CHIEF="127.0.0.1:$WORKER_PORT"
COMMON=(--ps_hosts="$PS_ADDR" --worker_hosts="$TOWERCTL_CHIEF")

# The ps's --blas_threads out of [1, 1024] is refused at start-up, naming the
# flag and the value, before anything listens.
for bad in 0 -3 1025; do
  out=$("$PS_BIN" "${COMMON[@]}" --job_name=ps --task_index=0 --blas_threads=$bad 2>&1)
  rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "--blas_threads=$bad must be in [1, 1024]" <<<"$out"; then
    pass "ps --blas_threads=$bad refused (exit 2, flag named)"
  else
    fail "ps --blas_threads=$bad: exit $rc, output: $out"
  fi
done
"$PS_BIN" "${COMMON[@]}" --job_name=ps --task_index=0 --state_dir="$STATE" \
  --memory_budget_bytes=$BUDGET --metrics_port="$METRICS_PORT" >"$TMP/ps.log" 2>&1 &
PS_PID=$!; PIDS+=($PS_PID)
"$WORKER_BIN" "${COMMON[@]}" --job_name=worker --task_index=0 --serve --state_dir="$STATE" \
  --metrics_port="$CHIEF_METRICS_PORT" --memory_budget_bytes=$WORKER_BUDGET >"$TMP/chief.log" 2>&1 &
CHIEF_PID=$!; PIDS+=($CHIEF_PID)
deadline=$((SECONDS + 120)) up=0
while [ $SECONDS -lt $deadline ]; do
  if "$TOWERCTL" --timeout_s=2 list >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$CHIEF_PID" 2>/dev/null && kill -0 "$PS_PID" 2>/dev/null || break
  sleep 0.1
done
[ "$up" = 1 ] || { tail -5 "$TMP/ps.log" "$TMP/chief.log"; echo "FAIL: the cluster did not start"; exit 1; }
# The chief answers before the ps may have finished starting: the ps logs its
# budget after it serves, and its resident memory with no job last.
deadline=$((SECONDS + 60))
until grep -q "resident memory with no job" "$TMP/ps.log"; do
  [ $SECONDS -lt $deadline ] && kill -0 "$PS_PID" 2>/dev/null || break
  sleep 0.1
done
grep -q "memory budget $BUDGET bytes for all jobs" "$TMP/ps.log" \
  && pass "ps logs its budget: $(grep -m1 -o 'memory budget.*' "$TMP/ps.log")" \
  || fail "ps log: $(head -5 "$TMP/ps.log")"
PS_BASE=$(kib $PS_PID VmRSS) CHIEF_BASE=$(kib $CHIEF_PID VmRSS)
echo "start-up RSS: ps ${PS_BASE} kB, chief ${CHIEF_BASE} kB"

echo "== memory-bomb specs are refused at submit, the field named, towerctl exit 2"
spec() {  # FILE UNITS BATCH EPOCHS [MODEL] [JOB_ID]
  local model=${5:-}
  [ -n "$model" ] || model="input_dim: 784 layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: $2 } layers { type: DENSE units: 10 }"
  cat >"$SPECS/$1" <<JOB
${6:+job_id: \"$6\"}
model { $model }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 3000 max_test_examples: 1000 }
global_batch_size: $3
epochs: $4
log_every_steps: 10
JOB
}
refuse() {  # NAME WANT...: each WANT must appear in towerctl's output
  local name=$1; shift
  out=$(timeout 60 "$TOWERCTL" submit "$SPECS/bomb.txtpb" 2>&1); rc=$?
  local ok=1
  for w in "$@"; do grep -qF -- "$w" <<<"$out" || ok=0; done
  if [ "$rc" -eq 2 ] && [ "$ok" = 1 ]; then pass "$name: $(tr '\n' ' ' <<<"$out" | cut -c1-220)"
  else fail "$name: exit $rc: $out"; fi
}
spec bomb.txtpb 1000000000 100 1
refuse "a layer of 10^9 units" "model.layers[1].units = 1000000000 (limit 1048576)"
spec bomb.txtpb 64 1000000000000 1
# Over int32: the text-format parser refuses it at its line (4: global_batch_size).
refuse "global_batch_size 10^12 (over int32)" "line 5:20: Integer out of range (1000000000000)"
spec bomb.txtpb 64 2000000 1
refuse "global_batch_size 2000000" "global_batch_size = 2000000 (limit 1048576)"
spec bomb.txtpb 64 100 1000000000
refuse "epochs 10^9" "epochs = 1000000000 (limit 100000)"
spec bomb.txtpb 64 100 1 'input_dim: 1048576 input_shape { channels: 1 height: 1024 width: 1024 } layers { type: CONV2D filters: 1048576 kernel_size: 64 } layers { type: FLATTEN } layers { type: DENSE units: 10 }'
refuse "a conv of 2^20 filters, kernel 64, on a 1024x1024 image" "parameters up to model.layers[0] (limit 268435456"
spec bomb.txtpb 64 100 1 'input_dim: 784 layers { type: DENSE units: 1048576 } layers { type: DENSE units: 1048576 } layers { type: DENSE units: 10 }'
refuse "widths whose product is 2^40 parameters" "parameters up to model.layers[0] (limit 268435456"
spec bomb.txtpb 64 100 1 'input_dim: 784 layers { type: DENSE units: 200000 } layers { type: DENSE units: 10 }'
# (785 x 200000 + 200001 x 10) x 2 + (200000 + 10) x 2 x 100 floats x 4 bytes
refuse "159M parameters, within the spec bounds, over the workers' 256 MiB budget" \
  "the model needs about 1432008080 bytes on each worker" "a worker's budget is $WORKER_BUDGET bytes (--memory_budget_bytes)"
scrape() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=10).read().decode())" 2>&1; }
chief_metrics=$(scrape "$CHIEF_METRICS_PORT")
for want in spec_limits:5 memory_budget_bytes:1; do
  line=$(grep "^towerps_refusals_total{.*server=\"chief\".*reason=\"${want%:*}\"" <<<"$chief_metrics")
  [[ "$line" =~ \}\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -eq "${want#*:}" ] \
    && pass "the chief counted ${want#*:} ${want%:*} refusal(s): $line" \
    || fail "chief refusals ${want%:*}: '$line'"
done
jobs=$("$TOWERCTL" --output=json list | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))')
[ "$jobs" = 0 ] && pass "no refused job was recorded" || fail "$jobs job(s) recorded"

if [ -z "$PY" ]; then
  echo "SKIPPED: no python with grpcio (tests/health_venv.sh needs PyPI on the first run); the RPC checks did not run"
else
  echo "== bare RegisterVariables to the ps"
  rpc() {  # METHOD REQUEST_TYPE (text on stdin): prints raw_rpc's status line
    protoc --encode="towerps.v1.$2" -I. proto/ps.proto \
      | "$PY" "$RAW_RPC" "$PS_ADDR" "/towerps.v1.ParameterService/$1" "$SPECS/rpc.out"
  }
  register() {  # JOB OPTIMIZER SHAPE...
    local job=$1 opt=$2; shift 2
    local shape=""; for d in "$@"; do shape+="shape: $d "; done
    printf 'job_id: "%s" config { mode: SYNC num_workers: 1 optimizer { type: %s } } variables { name: "huge" dtype: DT_FLOAT32 %s }\n' \
      "$job" "$opt" "$shape" | rpc RegisterVariables RegisterRequest 2>&1
  }
  expect() {  # NAME OUT CODE WANT...
    local name=$1 out=$2 code=$3; shift 3
    local ok=1
    [[ "$out" == "$code"* ]] || ok=0
    for w in "$@"; do grep -qF -- "$w" <<<"$out" || ok=0; done
    [ "$ok" = 1 ] && pass "$name: $(cut -c1-260 <<<"$out")" || fail "$name: $out"
  }
  # 7.4 GiB of values: 1986422374 floats; with Adam and one worker, 7 floats
  # each (the only variable is the first: its same-host pushes form its
  # slots ahead, a second set).
  out=$(register bomb ADAM 1986422374)
  expect "a 7.4 GiB variable with Adam" "$out" RESOURCE_EXHAUSTED 'variable "huge"' \
    "alone needs $((1986422374 * 7 * 4))" "4 optimizer slots" "--max_job_bytes" "$((8 << 30))"
  out=$(register overflow SGD 2147483648 8589934591)
  expect "shape [2^31, 2^33-1] overflowing int64" "$out" RESOURCE_EXHAUSTED \
    'variable "huge" of shape [2147483648, 8589934591]' "int64"
  # 10485760 floats x (value, snapshot, one push buffer) = 120 MiB: one fits
  # the 200 MiB budget, two do not.
  out=$(register first SGD 10485760)
  expect "a 120 MiB job fits the budget" "$out" OK
  out=$(register second SGD 10485760)
  expect "a second 120 MiB job passes the budget summed over jobs" "$out" RESOURCE_EXHAUSTED \
    'job "second" needs 125829120 bytes' "125829120 bytes are already held by 1 jobs" \
    "budget is $BUDGET bytes (--memory_budget_bytes)"
  out=$(printf 'job_id: "first"\n' | rpc DeleteJob DeleteJobRequest 2>&1)
  expect "DeleteJob first" "$out" OK
  out=$(register second SGD 10485760)
  expect "after DeleteJob the second job fits" "$out" OK
  out=$(printf 'job_id: "second"\n' | rpc DeleteJob DeleteJobRequest 2>&1)
  expect "DeleteJob second" "$out" OK

  echo "== an over-size message (65 MiB > 64 MiB) is refused, the ps serves after"
  out=$(head -c $((65 << 20)) /dev/zero | "$PY" "$RAW_RPC" "$PS_ADDR" \
          /towerps.v1.ParameterService/RegisterVariables "$SPECS/rpc.out" 2>&1)
  expect "65 MiB RegisterVariables" "$out" RESOURCE_EXHAUSTED "larger than max"
  out=$(printf 'job_id: "nothing"\n' | rpc DeleteJob DeleteJobRequest 2>&1)
  expect "the ps answers after the over-size message" "$out" OK
  kill -0 $PS_PID 2>/dev/null && pass "the ps is alive" || fail "the ps died"

  echo "== the refusals are counted"
  metrics=$(scrape "$METRICS_PORT")
  for reason in max_job_bytes memory_budget_bytes; do
    line=$(grep "^towerps_refusals_total{.*reason=\"$reason\"" <<<"$metrics")
    [[ "$line" =~ \}\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] \
      && pass "counted: $line" || fail "no refusal counted for $reason: $(grep refusals <<<"$metrics")"
  done
fi

echo "== no process's memory grew past its budget"
PS_HWM=$(kib $PS_PID VmHWM) CHIEF_HWM=$(kib $CHIEF_PID VmHWM)
# The budget counts jobs; a message being received adds up to its 64 MiB cap.
PS_BOUND=$((PS_BASE + BUDGET / 1024 + 65536))
[ "$PS_HWM" -le "$PS_BOUND" ] \
  && pass "ps VmHWM ${PS_HWM} kB <= start ${PS_BASE} kB + budget $((BUDGET / 1024)) kB + one 64 MiB message" \
  || fail "ps VmHWM ${PS_HWM} kB > start ${PS_BASE} kB + budget $((BUDGET / 1024)) kB + one 64 MiB message"
[ "$CHIEF_HWM" -le $((CHIEF_BASE + 262144)) ] \
  && pass "chief VmHWM ${CHIEF_HWM} kB <= start ${CHIEF_BASE} kB + 256 MiB" \
  || fail "chief VmHWM ${CHIEF_HWM} kB > start ${CHIEF_BASE} kB + 256 MiB"

echo "== a normal small job still succeeds on the same servers"
spec good.txtpb 32 100 2 "" good
timeout 300 "$TOWERCTL" submit "$SPECS/good.txtpb" --wait >"$SPECS/good.log" 2>&1; rc=$?
[ "$rc" -eq 0 ] && pass "small job: towerctl exit 0" || fail "small job: exit $rc: $(tail -5 "$SPECS/good.log")"
check=$("$TOWERCTL" --output=json status good | python3 -c "
import json, sys
j = json.load(sys.stdin)['job']
acc = float(j.get('metrics', {}).get('testAccuracy', 0))
print(('ok' if j['state'] == 'SUCCEEDED' and acc > 0.6 else 'bad') + ' %s acc=%.4f' % (j['state'], acc))")
[[ "$check" == ok* ]] && pass "small job $check" || fail "small job: $check"

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
