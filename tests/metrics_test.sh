#!/usr/bin/env bash
# Prometheus metrics (issue 14): 1 ps + 1 worker on loopback, each with
# --metrics_port. Scrapes both twice while the job trains, checks each scrape
# with `promtool check metrics`, and that push bytes, pull bytes and steps
# grew between the scrapes. Also: a taken metrics port fails at startup
# naming it (exit 1). Every process runs under `timeout`; waits poll state
# against deadlines.
set -uo pipefail

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export OPENBLAS_NUM_THREADS=1
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }

if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool not found (deploy/setup.sh installs Debian's prometheus package)"
  exit 0
fi

# scrape PORT FILE: one GET of /metrics; fails if the server does not answer.
scrape() {
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5) as r:
    open(sys.argv[2], "wb").write(r.read())
PY
}

# value FILE NAME: the sum of every series of metric NAME (0 when absent).
value() {
  python3 - "$1" "$2" <<'PY'
import sys
total = 0.0
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    name = line.split("{")[0].split(" ")[0]
    if name == sys.argv[2]:
        total += float(line.rsplit(" ", 1)[1])
print(int(total))
PY
}

# wait_for SECONDS COMMAND...: polls COMMAND until it succeeds, time is up,
# or a process in $WATCH (the training processes) has exited.
WATCH=()
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    for p in "${WATCH[@]}"; do kill -0 "$p" 2>/dev/null || { echo "process $p exited"; return 1; }; done
    sleep 0.2
  done
}

read -r PS_PORT WK_PORT PS_MPORT WK_MPORT <<<"$(python3 "$PWD/deploy/free_ports.py" 4 --sep=" ")"
CLUSTER=(--ps_hosts=127.0.0.1:$PS_PORT --worker_hosts=127.0.0.1:$WK_PORT)

echo "== 1 ps + 1 worker with --metrics_port"
timeout 200 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps --task_index=0 --metrics_port=$PS_MPORT \
  >"$TMP/ps.log" 2>&1 &
PS_PID=$!; PIDS+=($PS_PID)
# A long job (many epochs of a small slice): it is stopped once scraped.
timeout 180 "$WORKER_BIN" "${CLUSTER[@]}" --job_name=worker --task_index=0 --job_id=metrics \
  --metrics_port=$WK_MPORT --log_every_steps=0 --max_train_examples=640 \
  --max_test_examples=100 --epochs=10000 >"$TMP/worker.log" 2>&1 &
WK_PID=$!; PIDS+=($WK_PID)
WATCH=("$PS_PID" "$WK_PID")

# The worker has trained a step and both endpoints answer.
# steps_above STEPS PUSH_BYTES: scrapes both into $TMP/{worker,ps}.txt; true when the
# worker's steps exceed STEPS and the ps's push bytes exceed PUSH_BYTES.
steps_above() {
  scrape "$WK_MPORT" "$TMP/worker.txt" 2>/dev/null && scrape "$PS_MPORT" "$TMP/ps.txt" 2>/dev/null &&
    [ "$(value "$TMP/worker.txt" towerps_worker_steps_total)" -gt "$1" ] &&
    [ "$(value "$TMP/ps.txt" towerps_ps_push_bytes_total)" -gt "$2" ]
}
if wait_for 90 steps_above 0 0; then
  cp "$TMP/worker.txt" "$TMP/worker1.txt"; cp "$TMP/ps.txt" "$TMP/ps1.txt"
  pass "first scrapes: steps > 0 and push bytes > 0"
else
  fail "no steps within 90 s (or a process exited)"; tail -n 5 "$TMP"/*.log
  echo "$FAILS failed"; exit 1
fi
STEPS1=$(value "$TMP/worker1.txt" towerps_worker_steps_total)
PUSH1=$(value "$TMP/ps1.txt" towerps_ps_push_bytes_total)
PULL1=$(value "$TMP/ps1.txt" towerps_ps_pull_bytes_total)
EX1=$(value "$TMP/worker1.txt" towerps_worker_examples_total)
if wait_for 60 steps_above "$STEPS1" "$PUSH1"; then
  cp "$TMP/worker.txt" "$TMP/worker2.txt"; cp "$TMP/ps.txt" "$TMP/ps2.txt"
  STEPS2=$(value "$TMP/worker2.txt" towerps_worker_steps_total)
  PUSH2=$(value "$TMP/ps2.txt" towerps_ps_push_bytes_total)
  PULL2=$(value "$TMP/ps2.txt" towerps_ps_pull_bytes_total)
  EX2=$(value "$TMP/worker2.txt" towerps_worker_examples_total)
  pass "steps grew $STEPS1 -> $STEPS2, push bytes $PUSH1 -> $PUSH2"
  if [ "$PULL2" -gt "$PULL1" ] && [ "$EX2" -gt "$EX1" ]; then
    pass "pull bytes grew $PULL1 -> $PULL2, examples $EX1 -> $EX2"
  else
    fail "pull bytes $PULL1 -> $PULL2, examples $EX1 -> $EX2"
  fi
else
  fail "steps did not grow past $STEPS1 within 60 s"; tail -n 5 "$TMP"/*.log
fi

for f in ps1 ps2 worker1 worker2; do
  [ -f "$TMP/$f.txt" ] || continue
  if out=$(promtool check metrics <"$TMP/$f.txt" 2>&1); then
    pass "promtool check metrics: $f"
  else
    fail "promtool check metrics: $f: $out"
  fi
done
for want in 'towerps_ps_push_bytes_total{task="ps:0",training_job="metrics"}' \
            'towerps_ps_requests_total{task="ps:0",code="OK",method="Push"}' \
            'towerps_ps_rpc_seconds_count{task="ps:0",method="Pull"}' \
            'towerps_ps_global_step{task="ps:0",training_job="metrics"}' \
            'towerps_ps_pushes_total{task="ps:0",outcome="applied",training_job="metrics"}'; do
  if grep -qF "$want" "$TMP/ps2.txt" 2>/dev/null; then pass "ps has $want"; else fail "ps lacks $want"; fi
done
if grep -qF 'towerps_worker_examples_total{task="worker:0",training_job="metrics"}' "$TMP/worker2.txt" 2>/dev/null; then
  pass "worker has examples by training_job"
else
  fail "worker lacks towerps_worker_examples_total"
fi
# The model's weights and activations live on CPU:0 while it trains.
MEM=$(grep -F 'towerps_worker_device_memory_bytes{task="worker:0",device="CPU:0"}' "$TMP/worker2.txt" 2>/dev/null | awk '{print int($2)}')
[ "${MEM:-0}" -gt 0 ] && pass "worker: memory in use on CPU:0: $MEM bytes" || fail "worker: CPU:0 memory: '${MEM:-}'"
# What the job counts against the ps's budget while it trains, under the budget.
# (The values as written: awk would print a budget over 2^31 as 1.26383e+10.)
RESERVED=$(grep -F 'towerps_ps_memory_reserved_bytes{task="ps:0"}' "$TMP/ps2.txt" 2>/dev/null | sed 's/.* //')
BUDGET=$(grep -F 'towerps_ps_memory_budget_bytes{task="ps:0"}' "$TMP/ps2.txt" 2>/dev/null | sed 's/.* //')
if [[ "${RESERVED:-}" =~ ^[0-9]+$ ]] && [[ "${BUDGET:-}" =~ ^[0-9]+$ ]] &&
   [ "$RESERVED" -gt 0 ] && [ "$BUDGET" -gt "$RESERVED" ]; then
  pass "ps: $RESERVED of its $BUDGET budget bytes reserved"
else
  fail "ps: reserved '${RESERVED:-}' of budget '${BUDGET:-}'"
fi
APPLIED=$(grep -F 'towerps_ps_pushes_total{task="ps:0",outcome="applied"' "$TMP/ps2.txt" 2>/dev/null | awk '{print int($2)}')
[ "${APPLIED:-0}" -ge "$STEPS1" ] && pass "ps: $APPLIED pushes applied (>= $STEPS1 steps seen earlier)" || fail "ps: applied pushes '${APPLIED:-}' < $STEPS1"

echo "== a taken metrics port (the running ps's and worker's) fails at startup, naming it"
read -r P2 W2 <<<"$(python3 "$PWD/deploy/free_ports.py" 2 --sep=" ")"
out=$(timeout 20 "$PS_BIN" --ps_hosts=127.0.0.1:$P2 --worker_hosts=127.0.0.1:$W2 --job_name=ps \
  --task_index=0 --metrics_port=$PS_MPORT 2>&1); rc=$?
if [ "$rc" -eq 1 ] && grep -qF ":$PS_MPORT" <<<"$out"; then
  pass "taken metrics port: rc=1, $(grep -F ":$PS_MPORT" <<<"$out" | head -1)"
else
  fail "taken metrics port: rc=$rc, output: $out"
fi

out=$(timeout 20 "$WORKER_BIN" --ps_hosts=127.0.0.1:$P2 --worker_hosts=127.0.0.1:$W2 \
  --job_name=worker --task_index=0 --metrics_port=$WK_MPORT 2>&1); rc=$?
if [ "$rc" -eq 1 ] && grep -qF ":$WK_MPORT" <<<"$out"; then
  pass "worker: taken metrics port: rc=1"
else
  fail "worker: taken metrics port: rc=$rc, output: $out"
fi

# Stop the job, then the ps: SIGTERM still ends a ps cleanly with metrics on.
kill "$WK_PID" 2>/dev/null; wait "$WK_PID" 2>/dev/null
kill "$PS_PID" 2>/dev/null
if wait "$PS_PID"; then pass "ps: clean shutdown with metrics"; else fail "ps: exit status $? on SIGTERM"; fi

echo "== the chief in service mode: towerps_chief_jobs by state"
read -r P3 W3 M3 <<<"$(python3 "$PWD/deploy/free_ports.py" 3 --sep=" ")"
timeout 60 "$WORKER_BIN" --ps_hosts=127.0.0.1:$P3 --worker_hosts=127.0.0.1:$W3 --job_name=worker \
  --task_index=0 --serve --state_dir="$TMP/chief_state" --metrics_port=$M3 >"$TMP/chief.log" 2>&1 &
CHIEF_PID=$!; PIDS+=($CHIEF_PID)
WATCH=("$CHIEF_PID")
has_jobs() { scrape "$M3" "$TMP/chief.txt" 2>/dev/null && grep -q '^towerps_chief_jobs{' "$TMP/chief.txt"; }
if wait_for 30 has_jobs && grep -qF 'towerps_chief_jobs{task="worker:0",state="QUEUED"} 0' "$TMP/chief.txt" \
   && out=$(promtool check metrics <"$TMP/chief.txt" 2>&1); then
  pass "chief: towerps_chief_jobs by state, promtool clean"
else
  fail "chief: $(cat "$TMP/chief.txt" 2>/dev/null | grep chief_jobs) ${out:-}"; tail -n 5 "$TMP/chief.log"
fi
kill "$CHIEF_PID" 2>/dev/null
if wait "$CHIEF_PID"; then pass "chief: clean shutdown with metrics"; else fail "chief: exit status $? on SIGTERM"; fi

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
