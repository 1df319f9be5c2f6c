#!/usr/bin/env bash
# Faults in a cluster started by hand, with real ps and worker processes on
# 127.0.0.1: a worker that never comes, a ps that comes late or dies, start
# orders, a second server on a taken port. Every wait is a poll for a state
# (a log line, a process exit) with a deadline; no sleep hopes for an event.
# Every process is started under `timeout` and killed on exit.
set -uo pipefail

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export OPENBLAS_NUM_THREADS=1
PIDS=()  # the `timeout` wrappers; each has one child, the server or worker
# crash PID: SIGKILL for the process that `timeout` PID runs.
crash() { pkill -KILL -P "$1"; }
cleanup() {
  for p in "${PIDS[@]}"; do crash "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$(now) - $1:.1f}')"; }
le() { python3 -c "import sys; sys.exit(0 if $1 <= $2 else 1)"; }

# N free ports, space-separated (deploy/free_ports.py says why not port 0).
ports() { python3 "$PWD/deploy/free_ports.py" "$1" --sep=" "; }

# wait_for_line FILE PATTERN SECONDS: 0 once grep -E finds PATTERN in FILE.
wait_for_line() {
  local end; end=$(python3 -c "print($(now) + $3)")
  while ! grep -qE -- "$2" "$1" 2>/dev/null; do
    le "$(now)" "$end" || return 1
    sleep 0.05
  done
}

# wait_exit PID SECONDS: sets RC to the exit status, or 124 (and kills it)
# if it still runs after SECONDS.
wait_exit() {
  local end; end=$(python3 -c "print($(now) + $2)")
  while kill -0 "$1" 2>/dev/null; do
    if ! le "$(now)" "$end"; then crash "$1"; wait "$1" 2>/dev/null; RC=124; return; fi
    sleep 0.05
  done
  wait "$1"; RC=$?
}

# cluster NAME NUM_PS NUM_WORKERS: fresh ports and a log directory.
cluster() {
  DIR="$TMP/$1"; mkdir -p "$DIR"
  local p=($(ports $(($2 + $3)))) i
  PORTS=("${p[@]}")
  PSH="" WKH=""
  for ((i = 0; i < $2; i++)); do PSH+="${PSH:+,}127.0.0.1:${p[$i]}"; done
  for ((i = 0; i < $3; i++)); do WKH+="${WKH:+,}127.0.0.1:${p[$(($2 + i))]}"; done
}
# start_ps I [FLAGS...]: sets PS_PID[I]. Serves until killed.
declare -A PS_PID W_PID
start_ps() {
  local i="$1"; shift
  timeout 120 "$PS_BIN" --ps_hosts="$PSH" --worker_hosts="$WKH" --job_name=ps --task_index="$i" \
    --wait_log_interval_s=1 "$@" >"$DIR/ps$i.log" 2>&1 &
  PS_PID[$i]=$!; PIDS+=($!)
}
# start_worker I [FLAGS...]: a short job; sets W_PID[I].
SHORT=(--max_train_examples=2000 --max_test_examples=500 --epochs=1 --log_every_steps=0)
start_worker() {
  local i="$1"; shift
  timeout 120 "$WORKER_BIN" --ps_hosts="$PSH" --worker_hosts="$WKH" --job_name=worker \
    --task_index="$i" "$@" >"$DIR/worker$i.log" 2>&1 &
  W_PID[$i]=$!; PIDS+=($!)
}
stop_ps() { local i; for i in "${!PS_PID[@]}"; do kill "${PS_PID[$i]}" 2>/dev/null; done; PS_PID=(); }
show_logs() { tail -n 4 "$DIR"/*.log; }

# expect_completes NAME: both workers exit 0, the chief with its final line.
expect_completes() {
  local ok=1 i
  for i in 0 1; do
    wait_exit "${W_PID[$i]}" 60
    [ "$RC" -eq 0 ] || { ok=0; echo "worker $i: rc=$RC"; }
  done
  grep -q '^final: test_accuracy=' "$DIR/worker0.log" || ok=0
  grep -q '^worker 1 done: ' "$DIR/worker1.log" || ok=0
  if [ "$ok" -eq 1 ]; then pass "$1: $(grep '^final: ' "$DIR/worker0.log")"; else fail "$1"; show_logs; fi
  stop_ps
}

# expect_worker_fails NAME I SINCE BOUND_S PATTERN...: worker I exits 1
# within BOUND_S of SINCE with one "worker: training failed:" line matching
# every PATTERN (grep -E).
expect_worker_fails() {
  local name="$1" i="$2" since="$3" bound="$4"; shift 4
  wait_exit "${W_PID[$i]}" "$bound"
  local took line pat ok=1
  took=$(elapsed "$since")
  line=$(grep '^worker: training failed: ' "$DIR/worker$i.log")
  [ "$RC" -eq 1 ] && [ "$(wc -l <<<"$line")" -eq 1 ] || ok=0
  for pat in "$@"; do grep -qE -- "$pat" <<<"$line" || ok=0; done
  if [ "$ok" -eq 1 ]; then
    pass "$name: worker $i exit 1 after ${took}s: $line"
  else
    fail "$name: worker $i rc=$RC after ${took}s, line: $line"; show_logs
  fi
}

PT=3       # --peer_timeout_s of the loss cases
BOUND=15   # peer_timeout + generous slack for 2 loaded cores

echo "== a: worker 1 never starts: worker 0 fails naming it, the ps logs it"
cluster never 2 2
start_ps 0; start_ps 1
start_worker 0 "${SHORT[@]}" --peer_timeout_s=$PT
wait_for_line "$DIR/ps0.log" 'job "mlp" registered' 30 || fail "never: ps 0 got no registration"
T0=$(now)
expect_worker_fails "never started" 0 "$T0" "$BOUND" \
  'waits for worker 1, not heard from for [0-9.]+ s \(never joined' 'peer_timeout_s=3'
if grep -qE 'ps 0: job "mlp" on ps 0: step 1 waits for worker 1, not heard from' "$DIR/ps0.log"; then
  pass "never started: ps 0 logged the lost worker"
else
  fail "never started: ps 0 log"; show_logs
fi
# The ps keeps serving (like TensorFlow's server.join()) until SIGTERM.
if kill -0 "${PS_PID[0]}" 2>/dev/null; then pass "ps 0 still serving"; else fail "ps 0 exited"; fi
stop_ps

echo "== a2: worker 1 killed after it joined: worker 0 fails naming it"
cluster killed_worker 1 2
start_ps 0
start_worker 0 --max_train_examples=20000 --max_test_examples=100 --epochs=50 --batch_size=32 --log_every_steps=1 --peer_timeout_s=$PT
start_worker 1 --max_train_examples=20000 --max_test_examples=100 --epochs=50 --batch_size=32 --log_every_steps=1 --peer_timeout_s=$PT
wait_for_line "$DIR/worker0.log" 'step 3/' 60 || fail "killed worker: no progress"
crash "${W_PID[1]}"; T0=$(now)
expect_worker_fails "worker killed" 0 "$T0" "$BOUND" 'waits for worker 1, not heard from for [0-9.]+ s \(last heard by'
stop_ps

echo "== b: a ps that comes up late: workers wait for it, saying so"
cluster late 1 2
start_worker 0 "${SHORT[@]}" --peer_timeout_s=30
start_worker 1 "${SHORT[@]}" --peer_timeout_s=30
if wait_for_line "$DIR/worker0.log" "waiting for ps 0 at $PSH to come up" 30; then
  pass "late ps: worker 0 says it waits for ps 0 at $PSH"
else
  fail "late ps: no waiting line"; show_logs
fi
start_ps 0
expect_completes "late ps"

echo "== c: start orders"
cluster ps_first 2 2
start_ps 0; start_ps 1
wait_for_line "$DIR/ps1.log" "serving on" 30
start_worker 0 "${SHORT[@]}"; start_worker 1 "${SHORT[@]}"
expect_completes "ps first"

cluster workers_first 2 2
start_worker 1 "${SHORT[@]}"; start_worker 0 "${SHORT[@]}"
start_ps 1; start_ps 0
expect_completes "workers first"

cluster interleaved 2 2
start_ps 1; start_worker 0 "${SHORT[@]}"
wait_for_line "$DIR/ps1.log" 'job "mlp" registered' 30
start_worker 1 "${SHORT[@]}"; start_ps 0
expect_completes "interleaved (ps 1, worker 0, worker 1, ps 0)"

echo "== d: ps 1 killed mid-job: both workers fail naming it"
cluster killed_ps 2 2
start_ps 0; start_ps 1
LONG=(--max_train_examples=20000 --max_test_examples=100 --epochs=50 --batch_size=32 --log_every_steps=1 --peer_timeout_s=$PT)
start_worker 0 "${LONG[@]}"; start_worker 1 "${LONG[@]}"
wait_for_line "$DIR/worker0.log" 'step 3/' 60 || fail "killed ps: no progress"
crash "${PS_PID[1]}"; T0=$(now)
PS1="127.0.0.1:${PORTS[1]}"
expect_worker_fails "ps killed" 0 "$T0" "$BOUND" "ps 1 at $PS1 unreachable for [0-9.]+ s \(peer_timeout_s=3\); last error: "
expect_worker_fails "ps killed" 1 "$T0" "$BOUND" "ps 1 at $PS1 unreachable for [0-9.]+ s"
stop_ps

echo "== e: a second server on a taken port exits 1 naming it; the first serves on"
cluster taken 1 2
start_ps 0
wait_for_line "$DIR/ps0.log" "serving on" 30
P="${PORTS[0]}"
out=$(timeout 30 "$PS_BIN" --ps_hosts="$PSH" --worker_hosts="$WKH" --job_name=ps --task_index=0 2>&1); rc=$?
if [ "$rc" -eq 1 ] && grep -qE "^ps: cannot listen on 0\.0\.0\.0:$P: address in use: port $P " <<<"$out"; then
  pass "second ps: rc=1, $(grep '^ps: ' <<<"$out")"
else
  fail "second ps: rc=$rc, output: $out"
fi
out=$(timeout 30 "$WORKER_BIN" --ps_hosts="$PSH" --worker_hosts="$WKH" --job_name=worker --task_index=1 \
  --serve --bind_address=127.0.0.1:$P 2>&1); rc=$?
if [ "$rc" -eq 1 ] && grep -qE "^worker: serve: cannot listen on 127\.0\.0\.1:$P: address in use: port $P " <<<"$out"; then
  pass "worker --serve on a taken port: rc=1, $(grep '^worker: ' <<<"$out")"
else
  fail "worker --serve on a taken port: rc=$rc, output: $out"
fi
start_worker 0 "${SHORT[@]}"; start_worker 1 "${SHORT[@]}"
expect_completes "first ps still serves the job"

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
