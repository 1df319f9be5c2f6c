#!/usr/bin/env bash
# Real ps and worker processes on loopback (127.0.0.1 only). Every process is
# started under `timeout` and killed on exit, so the test stops by itself.
set -uo pipefail

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export OPENBLAS_NUM_THREADS=1
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
source "$PWD/tests/await_lib.sh"
FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }

# N free ports, space-separated (deploy/free_ports.py says why not port 0).
ports() { python3 "$PWD/deploy/free_ports.py" "$1" --sep=" "; }

# expect_reject NAME WANT_SUBSTRING -- command...
expect_reject() {
  local name="$1" want="$2"; shift 3
  local out rc
  out=$(timeout 20 "$@" 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$want" <<<"$out" && [ "$(wc -l <<<"$out")" -eq 1 ]; then
    pass "$name"
  else
    fail "$name: rc=$rc, output: $out"
  fi
}

echo "== bad cluster specs are rejected with one line naming the problem"
expect_reject "missing job" "missing job name" -- "$PS_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2
expect_reject "bad host:port" 'malformed address "localhost"' -- "$PS_BIN" --ps_hosts=localhost --worker_hosts=127.0.0.1:2 --job_name=ps
expect_reject "bad port" 'invalid port "99999"' -- "$WORKER_BIN" --ps_hosts=127.0.0.1:99999 --worker_hosts=127.0.0.1:2 --job_name=worker
expect_reject "index out of range" "task index 2 is out of range" -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --task_index=2
expect_reject "duplicate address" 'duplicate address "127.0.0.1:1"' -- "$PS_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:1 --job_name=ps
expect_reject "wrong binary" 'this binary runs ps tasks' -- "$PS_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker
TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:1"]' expect_reject "malformed TF_CONFIG" "TF_CONFIG is not valid JSON" -- "$PS_BIN"
expect_reject "unknown model" 'unknown model "resnet"' -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --model=resnet
expect_reject "missing GPU" "no physical GPU 9" -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --virtual_devices=GPU:9=100x2
expect_reject "bad virtual devices" 'entry "CPU=0": zero count' -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --virtual_devices=CPU=0
expect_reject "device memory limit" 'does not fit its devices: layer "dense_1": /job:worker/replica:0/task:0/device:CPU:1: cannot allocate 8008000 bytes' -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --model=dense_stack --virtual_devices=CPU=1x2 --layout=classic
expect_reject "bad batch size" "global_batch_size = -4" -- "$WORKER_BIN" --ps_hosts=127.0.0.1:1 --worker_hosts=127.0.0.1:2 --job_name=worker --batch_size=-4

# run_cluster NAME NUM_PS NUM_WORKERS WORKER_FLAGS...
# Starts the workers first, then the servers (workers wait for them; see
# cluster_faults_test for servers that come up late).
# PS_PIN / WORKER_PIN, where set: taskset CPU lists to run them on.
run_cluster() {
  local name="$1" nps="$2" nw="$3"; shift 3
  local p=($(ports $((nps + nw))))
  local ps_hosts="" wk_hosts=""
  for ((i = 0; i < nps; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${p[$i]}"; done
  for ((i = 0; i < nw; i++)); do wk_hosts+="${wk_hosts:+,}127.0.0.1:${p[$((nps + i))]}"; done
  local dir="$TMP/$name"; mkdir -p "$dir"
  local wpids=()
  for ((i = 0; i < nw; i++)); do
    ${WORKER_PIN:+taskset -c "$WORKER_PIN"} timeout 180 "$WORKER_BIN" --ps_hosts="$ps_hosts" \
      --worker_hosts="$wk_hosts" --job_name=worker \
      --task_index=$i --log_every_steps=0 "$@" >"$dir/worker$i.log" 2>&1 &
    wpids+=($!); PIDS+=($!)
  done
  local pspids=()
  for ((i = 0; i < nps; i++)); do
    ${PS_PIN:+taskset -c "$PS_PIN"} timeout 200 "$PS_BIN" --ps_hosts="$ps_hosts" \
      --worker_hosts="$wk_hosts" --job_name=ps \
      --task_index=$i --wait_log_interval_s=1 >"$dir/ps$i.log" 2>&1 &
    pspids+=($!); PIDS+=($!)
  done
  # Deadlines well inside `timeout`'s and Bazel's: a hang is reported with
  # the processes' stacks (await_lib.sh), not just timed out.
  await_exit 120 "$dir" "${wpids[@]}"; RC=$?
  kill "${pspids[@]}" 2>/dev/null
  local ps_rc
  await_exit 30 "$dir" "${pspids[@]}"; ps_rc=$?
  if [ "$ps_rc" -ne 0 ]; then
    echo "$name: a ps ended with status $ps_rc after SIGTERM"
    [ "$RC" -ne 0 ] || RC=$ps_rc
  fi
  DIR="$dir"
}

final_field() { sed -n "s/^final: .*$1=\([^ ]*\).*/\1/p" "$DIR/worker0.log"; }

# expect_trained NAME WANT_STEPS MIN_ACCURACY: checks the last run_cluster.
expect_trained() {
  local acc steps
  acc=$(final_field test_accuracy); steps=$(final_field steps)
  if [ "$RC" -eq 0 ] && [ "$steps" = "$2" ] && python3 -c "import sys; sys.exit(0 if float('$acc') >= $3 else 1)"; then
    pass "$1: test_accuracy=$acc steps=$steps"
  else
    fail "$1: rc=$RC acc=$acc steps=$steps"; tail -n 5 "$DIR"/*.log
  fi
}

echo "== sync training: 2 ps, 2 workers, workers started before the servers"
run_cluster sync 2 2 --mode=sync --max_train_examples=4000 --max_test_examples=1000 --epochs=2
expect_trained sync 32 0.70
SYNC_FINAL=$(grep '^final: ' "$DIR/worker0.log" | sed 's/ wall_s=.*//')
# Same host: every server wrote its pulls into each worker's shared memory.
for i in 0 1; do
  n=$(grep -c "ps [01] at 127.0.0.1:[0-9]* writes its pulls into this worker's shared memory" "$DIR/worker$i.log")
  if [ "$n" -eq 2 ]; then pass "worker $i: both servers use its shared memory"
  else fail "worker $i: $n of 2 servers used its shared memory"; grep -h "shared memory" "$DIR/worker$i.log"; fi
done
# And each step's update wrote the new values where the workers' next
# pulls waited (they go out when backward begins), so that those pulls
# found them there (each ps counts it in its log when the job is deleted).
for i in 0 1; do
  line=$(grep -o "of the [0-9]* variables pulled into workers' shared memory, [0-9]* were there already" "$DIR/ps$i.log")
  found=$(echo "$line" | sed -n 's/.*, \([0-9]*\) were there already/\1/p')
  if [ -n "$found" ] && [ "$found" -gt 0 ]; then pass "ps $i: $line"
  else fail "ps $i: no pull found its values written in place: '$line'"; fi
done
# The workers share the servers' cores: after its first push, whose answer
# says so, each names every gradient at once, with the commit, rather than
# as backward produces them (each ps counts those pushes in its log).
# named_count DIR PS: "N M" from "N of its M pushes named every gradient".
named_count() {
  grep -o '[0-9]* of its [0-9]* pushes named every gradient at once' "$1/ps$2.log" | head -n 1 |
    sed 's/ of its / /; s/ pushes.*//'
}
for i in 0 1; do
  read -r NAMED PUSHES <<<"$(named_count "$DIR" $i)"
  if [ -n "${PUSHES:-}" ] && [ "$PUSHES" -gt 2 ] && [ "${NAMED:-0}" -ge $((PUSHES - 2)) ]; then
    pass "ps $i: $NAMED of $PUSHES pushes named every gradient at once"
  else
    fail "ps $i: '${NAMED:-}' of '${PUSHES:-}' pushes named every gradient at once (want all but each worker's first)"
  fi
done

echo "== the same job over gRPC only (--shared_memory=false) ends on the same bits"
run_cluster sync_grpc 2 2 --mode=sync --max_train_examples=4000 --max_test_examples=1000 --epochs=2 --shared_memory=false
expect_trained sync_grpc 32 0.70
GRPC_FINAL=$(grep '^final: ' "$DIR/worker0.log" | sed 's/ wall_s=.*//')
if [ -n "$SYNC_FINAL" ] && [ "$SYNC_FINAL" = "$GRPC_FINAL" ] && ! grep -q "shared memory" "$DIR"/worker*.log; then
  pass "over gRPC: $GRPC_FINAL"
else
  fail "shared memory: '$SYNC_FINAL', gRPC: '$GRPC_FINAL'"; grep -h "shared memory" "$DIR"/worker*.log | head -n 3
fi

echo "== one worker: the new values its server writes where its pulls land end on the bits of gRPC"
# One worker, same host: the server writes each update's new values into
# the worker's segment as it forms them, and its pulls then copy nothing.
# On the worker's cores, in the update after the push; on cores apart
# (taskset: the ps on one CPU, the worker on another), formed ahead during
# the push (SGD, the dense stack; Adam's slots, the MLP): the ps says how
# many at the job's end. On its cores, every push after the first names
# its gradients at once, with the commit. The final line must be the same
# bits as over gRPC only, every way.
# ahead_count DIR: "N of M" from the ps's line at the job's deletion.
ahead_count() {
  grep -o '[0-9]* of its [0-9]* updates formed ahead' "$1/ps0.log" | head -n 1 | sed 's/ of its / /; s/ updates.*//'
}
CPUS=($(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])'))
for model in mlp dense_stack; do
  flags=(--model=$model --mode=sync --max_train_examples=2000 --max_test_examples=500 --epochs=2)
  run_cluster "one_${model}_grpc" 1 1 "${flags[@]}" --shared_memory=false
  GRPC_RC=$RC
  ONE_GRPC=$(grep '^final: ' "$DIR/worker0.log" | sed 's/ wall_s=.*//')
  for where in shared apart; do
    if [ "$where" = apart ]; then
      if [ "${#CPUS[@]}" -lt 2 ]; then
        echo "($model, cores apart: skipped, this test may run on one CPU only)"
        continue
      fi
      WORKER_PIN=${CPUS[0]} PS_PIN=${CPUS[1]}
    fi
    run_cluster "one_${model}_$where" 1 1 "${flags[@]}"
    unset WORKER_PIN PS_PIN
    ONE_FINAL=$(grep '^final: ' "$DIR/worker0.log" | sed 's/ wall_s=.*//')
    ONE_SHM=$(grep -c "writes its pulls into this worker's shared memory" "$DIR/worker0.log")
    read -r AHEAD STEPS <<<"$(ahead_count "$DIR")"
    read -r NAMED PUSHES <<<"$(named_count "$DIR" 0)"
    # The cores the ps kept busy from its first update to its last (logged
    # at the job's deletion): at most the CPUs it may run on, pinned to one
    # at most that one (5% for the clock and the CPU time being read apart).
    PS_CORES=$(grep -o 'process cpu from its first update to its last [0-9.]* s in [0-9.]* s ([0-9.]* cores)' \
                 "$DIR/ps0.log" | sed 's/.*(//; s/ cores)//')
    MAX_CORES=$([ "$where" = apart ] && echo 1.05 || echo "$(nproc).05")
    # Cores apart: named as they come, though a push whose gradients were
    # all out before the worker's push thread looked is one message too.
    if [ "$where" = apart ]; then WANT_AHEAD=${STEPS:-x} MIN_NAMED=0
    else WANT_AHEAD=0 MIN_NAMED=$((${PUSHES:-1} - 1)); fi
    # Bound to one CPU, the worker sizes its math team to it, not to the host.
    if [ "$where" = apart ]; then
      if grep -q "1 CPU math thread(s) each (1 worker(s) on this host; 1 of the host's $(getconf _NPROCESSORS_ONLN) cores usable: its CPU affinity allows 1)" "$DIR/worker0.log"; then
        pass "$model, worker bound to one CPU: one math thread"
      else
        fail "$model, worker bound to one CPU: $(grep -o '[0-9]* CPU math thread.*usable[^)]*)' "$DIR/worker0.log" || grep -o '[0-9]* CPU math thread(s) each ([^)]*)' "$DIR/worker0.log")"
      fi
    fi
    if [ "$RC" -eq 0 ] && [ "$GRPC_RC" -eq 0 ] && [ "$ONE_SHM" -eq 1 ] && [ -n "$ONE_FINAL" ] &&
       [ "$ONE_FINAL" = "$ONE_GRPC" ] && [ -n "${STEPS:-}" ] && [ "${STEPS:-0}" -gt 0 ] &&
       [ "${AHEAD:-}" = "$WANT_AHEAD" ] && [ "${PUSHES:-}" = "$STEPS" ] &&
       [ "${NAMED:-0}" -ge "$MIN_NAMED" ] &&
       awk -v c="${PS_CORES:-x}" -v m="$MAX_CORES" 'BEGIN { exit !(c ~ /^[0-9.]+$/ && c + 0 <= m) }'; then
      pass "$model, one worker, $where cores: $AHEAD of $STEPS formed ahead, $NAMED of $PUSHES pushes named at once, ps busy $PS_CORES cores, $ONE_FINAL"
    else
      fail "$model, one worker, $where cores: rc $RC/$GRPC_RC, in shared memory: $ONE_SHM, formed ahead '${AHEAD:-}' of '${STEPS:-}' (want $WANT_AHEAD), pushes named at once '${NAMED:-}' of '${PUSHES:-}' (want at least $MIN_NAMED), ps busy '${PS_CORES:-}' cores (want at most $MAX_CORES), '$ONE_FINAL' vs gRPC '$ONE_GRPC'"
    fi
  done
done

echo "== async training: every gradient applied (steps = workers x iterations)"
run_cluster async 2 2 --mode=async --max_train_examples=4000 --max_test_examples=1000 --epochs=2
expect_trained async 64 0.65

echo "== sync with data shards: each worker loads only its half of the train set"
run_cluster shard 2 2 --mode=sync --shard_data --max_train_examples=4000 --max_test_examples=1000 --epochs=2
expect_trained shard 32 0.70
# 4000 examples, global batch 256: 15 full batches of 128 + 128 and a last
# one of 80 + 80, so each worker holds 2000.
for i in 0 1; do
  if grep -q "data: worker $i holds a shard of 2000 of the 4000 train examples" "$DIR/worker$i.log"; then
    pass "worker $i holds a shard of 2000 of 4000"
  else
    fail "worker $i shard"; grep -h "shard\|train examples" "$DIR/worker$i.log" | head -n 3
  fi
done

echo "== sync with shards of different sizes finishes (1001 examples, batch 10)"
run_cluster uneven 1 2 --mode=sync --max_train_examples=1001 --max_test_examples=200 --batch_size=10 --epochs=1
steps=$(final_field steps)
if [ "$RC" -eq 0 ] && [ "$steps" = "101" ] && grep -q "done: 101 iterations" "$DIR/worker1.log"; then
  pass "uneven shards: steps=$steps"
else
  fail "uneven shards: rc=$RC steps=$steps"; tail -n 5 "$DIR"/*.log
fi

echo "== towers and layers on CPU virtual devices, placement logged"
run_cluster devices 1 1 --virtual_devices=CPU=3 --towers=3 --log_device_placement --max_train_examples=600 --max_test_examples=200 --epochs=1
if [ "$RC" -eq 0 ] && grep -q "tower 2: /job:worker/replica:0/task:0/device:CPU:2" "$DIR/worker0.log" \
   && grep -q '^final: ' "$DIR/worker0.log"; then
  pass "3 towers on CPU:0-2"
else
  fail "towers on devices: rc=$RC"; tail -n 5 "$DIR"/*.log
fi
run_cluster layers 1 1 --virtual_devices=CPU=3 --layout=classic --log_device_placement --max_train_examples=600 --max_test_examples=200 --epochs=1
if [ "$RC" -eq 0 ] && grep -q 'layer "dense_2": /job:worker/replica:0/task:0/device:CPU:2' "$DIR/worker0.log" \
   && grep -q '^final: ' "$DIR/worker0.log"; then
  pass "layers split over CPU:0-2 (classic layout)"
else
  fail "layers on devices: rc=$RC"; tail -n 5 "$DIR"/*.log
fi

run_cluster pipeline 1 1 --virtual_devices=CPU=6 --towers=2 --layout=classic --micro_batches=3 --log_device_placement --max_train_examples=600 --max_test_examples=200 --epochs=1
if [ "$RC" -eq 0 ] && grep -q 'tower 1 layers: /job:worker/replica:0/task:0/device:CPU:3, .*device:CPU:5' "$DIR/worker0.log" \
   && grep -q '3 micro-batches per tower step, 3 pipeline stage(s)' "$DIR/worker0.log" \
   && grep -q '^final: ' "$DIR/worker0.log"; then
  pass "2 towers, each split over 3 CPU devices, 3 micro-batches pipelined"
else
  fail "towers of split models: rc=$RC"; tail -n 5 "$DIR"/*.log
fi

echo "== image models: cnn_small, and batch norm + residual blocks with towers (issue 13)"
run_cluster cnn_small 2 2 --model=cnn_small --max_train_examples=9600 --max_test_examples=1000 --epochs=1
expect_trained cnn_small 150 0.70
# A small residual network from the spec's layers: its moving statistics are
# MOVING_AVERAGE variables on the servers, used by the chief's evaluation.
cat >"$TMP/resnet_tiny.json" <<'JSON'
{"model": {"name": "resnet_tiny", "inputDim": 784,
  "inputShape": {"channels": 1, "height": 28, "width": 28},
  "layers": [
    {"type": "CONV2D", "filters": 8, "kernelSize": 3, "padding": "PADDING_SAME"},
    {"type": "BATCH_NORM", "activation": "RELU", "momentum": 0.9},
    {"type": "RESIDUAL_BLOCK", "filters": 8, "momentum": 0.9},
    {"type": "RESIDUAL_BLOCK", "filters": 16, "strides": 2, "momentum": 0.9},
    {"type": "GLOBAL_AVG_POOL2D"},
    {"type": "DROPOUT", "rate": 0.1},
    {"type": "DENSE", "units": 10}],
  "loss": "SOFTMAX_CROSS_ENTROPY"},
 "optimizer": {"type": "ADAM", "learningRate": 0.003},
 "data": {"source": "FASHION_MNIST"}, "globalBatchSize": 64, "epochs": 1}
JSON
run_cluster resnet_tiny 2 2 --job_spec="$TMP/resnet_tiny.json" --towers=2 --max_train_examples=6400 --max_test_examples=1000
expect_trained resnet_tiny 100 0.45
# 112 moving statistics: the stem's batch norm (8 channels x 2) and two per block.
if grep -q "Non-trainable params: 112" "$DIR/worker0.log"; then
  pass "resnet_tiny: moving statistics counted apart"
else
  fail "resnet_tiny summary: $(grep -A3 'Total params' "$DIR/worker0.log")"
fi

echo "== a sync step waiting on a worker names it"
p=($(ports 3)); PSH=127.0.0.1:${p[0]}; WKH=127.0.0.1:${p[1]},127.0.0.1:${p[2]}
dir="$TMP/waiting"; mkdir -p "$dir"
timeout 120 "$PS_BIN" --ps_hosts=$PSH --worker_hosts=$WKH --job_name=ps --wait_log_interval_s=1 >"$dir/ps0.log" 2>&1 &
PSPID=$!; PIDS+=($PSPID)
COMMON=(--ps_hosts=$PSH --worker_hosts=$WKH --job_name=worker --max_train_examples=512 --max_test_examples=100 --epochs=1 --log_every_steps=0)
timeout 120 "$WORKER_BIN" "${COMMON[@]}" --task_index=0 >"$dir/worker0.log" 2>&1 &
W0=$!; PIDS+=($W0)
# Polled with a deadline: the ps logs the wait every second once worker 0
# has pushed step 0 (after loading the data, which is slow under load).
for ((t = 0; t < 600; t++)); do grep -q "waiting for workers \[1\]" "$dir/ps0.log" && break; sleep 0.1; done
if grep -q "waiting for workers \[1\]" "$dir/ps0.log"; then pass "ps names worker 1 as awaited"; else fail "no waiting log: $(cat "$dir/ps0.log")"; fi
timeout 120 "$WORKER_BIN" "${COMMON[@]}" --task_index=1 >"$dir/worker1.log" 2>&1 &
W1=$!; PIDS+=($W1)
if wait $W0 && wait $W1 && grep -q "^final: " "$dir/worker0.log"; then pass "step completes once worker 1 arrives"; else fail "waiting run did not finish"; fi
kill $PSPID 2>/dev/null

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
