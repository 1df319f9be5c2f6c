#!/usr/bin/env bash
# SIGTERM to every process of a running cluster (what `docker-compose down`,
# a Kubernetes rollout or `scancel` sends), then a restart (issue 14):
# - 2 ps (--drain_s) and 2 workers --serve, the chief (worker 0) with a
#   state directory; a job whose only checkpoint can be the one written at
#   the stop (its schedule never fires).
# - Once the job is past step 20, all four get SIGTERM at once. Each must
#   exit 0 within its bound; the chief must have written a complete
#   checkpoint at a step boundary (MANIFEST names it, one shard per ps) and
#   left the job QUEUED with resume set, on disk (decoded with protoc).
# - The same cluster started again resumes the job from that checkpoint and
#   trains it to its last step with a sane accuracy.
# - A one-job worker (no --serve) stops at its next step on SIGTERM and exits
#   143 saying the job did not finish.
# Waits follow state (health, steps, exits) with deadlines.
set -uo pipefail

PS_BIN="$PWD/ps/ps"
WORKER_BIN="$PWD/worker/worker"
TOWERCTL="$PWD/client/towerctl"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export OPENBLAS_NUM_THREADS=1
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

read -r P0 P1 W0 W1 < <(python3 "$PWD/deploy/free_ports.py" 4 --sep=" ")
PS_HOSTS="127.0.0.1:$P0,127.0.0.1:$P1"
WORKER_HOSTS="127.0.0.1:$W0,127.0.0.1:$W1"
export TOWERCTL_CHIEF="127.0.0.1:$W0"
STATE="$TMP/state"
# The servers and the other worker keep serving this long after SIGTERM: the
# chief's stop (next step boundary + checkpoint) must fit in it.
DRAIN_S=10

# start ROUND: the four processes; their pids in PS0 PS1 WK0 WK1.
start() {
  local r="$1" common=(--ps_hosts="$PS_HOSTS" --worker_hosts="$WORKER_HOSTS")
  "$PS_BIN" "${common[@]}" --job_name=ps --task_index=0 --drain_s=$DRAIN_S --state_dir="$STATE" >"$TMP/ps0.$r.log" 2>&1 &
  PS0=$!; PIDS+=($!)
  "$PS_BIN" "${common[@]}" --job_name=ps --task_index=1 --drain_s=$DRAIN_S --state_dir="$STATE" >"$TMP/ps1.$r.log" 2>&1 &
  PS1=$!; PIDS+=($!)
  "$WORKER_BIN" "${common[@]}" --job_name=worker --task_index=1 --serve --drain_s=$DRAIN_S \
    >"$TMP/worker1.$r.log" 2>&1 &
  WK1=$!; PIDS+=($!)
  "$WORKER_BIN" "${common[@]}" --job_name=worker --task_index=0 --serve --state_dir="$STATE" \
    --stop_checkpoint_timeout_s=$DRAIN_S >"$TMP/worker0.$r.log" 2>&1 &
  WK0=$!; PIDS+=($!)
  local t
  for ((t = 0; t < 600; t++)); do
    "$TOWERCTL" --timeout_s=2 health "$TOWERCTL_CHIEF" >/dev/null 2>&1 && return 0
    kill -0 "$WK0" 2>/dev/null || break
    sleep 0.1
  done
  cat "$TMP/worker0.$r.log"
  echo "FAIL: the chief did not become SERVING (round $r)"
  exit 1
}

# The job: 3000 examples, batch 100, 30 epochs = 900 steps; no scheduled
# checkpoint (every 10^6 steps), so a checkpoint on disk is the stop's. Long
# enough that it cannot end between the step seen below and the stop: with
# 6 epochs (180 steps), a run saw step 130 and the job SUCCEEDED before its
# SIGTERM was handled.
cat >"$TMP/job.txtpb" <<'JOB'
job_id: "stopped"
model { input_dim: 784 layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: 10 } }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 3000 max_test_examples: 1000 }
global_batch_size: 100
epochs: 30
log_every_steps: 10
checkpoint { every_steps: 1000000 }
JOB
TOTAL_STEPS=900

echo "== start the cluster, submit a job, wait until it is past step 20"
start 1
# Worker 1 is held (SIGSTOP) from the submit on and let go in short
# windows: a SYNC step needs its push, so the job moves only inside a
# window and is read while it cannot move (at most the step under way
# completes). Watching it run freely raced: its 900 steps take about a
# second, and one poll (towerctl and python, on a loaded machine) can take
# as long (a run saw step 372, then the job ended before the chief handled
# its SIGTERM; a later one saw the job over at its first poll past step 0).
# Windows of 0.2 s until the job steps (worker 1 starts its part meanwhile),
# then 0.02 s: a few dozen steps each, far from the 900.
kill -STOP "$WK1"
"$TOWERCTL" submit "$TMP/job.txtpb" >/dev/null || { echo "FAIL: submit"; exit 1; }
step=0
for ((t = 0; t < 600; t++)); do
  step=$("$TOWERCTL" --output=json status stopped 2>/dev/null | jq_py 'int(d.get("live",{}).get("globalStep","0"))' 2>/dev/null)
  [ "${step:-0}" -gt 20 ] && break
  kill -CONT "$WK1"
  if [ "${step:-0}" -gt 0 ]; then sleep 0.02; else sleep 0.2; fi
  kill -STOP "$WK1"
done
[ "${step:-0}" -gt 20 ] || { tail -5 "$TMP"/*.1.log; echo "FAIL: the job did not reach step 21"; exit 1; }
[ "$step" -lt "$TOTAL_STEPS" ] || { echo "FAIL: the job ended before the stop (step $step)"; exit 1; }
echo "job at step $step, worker 1 stopped"

echo "== SIGTERM to every process at once"
kill -TERM "$PS0" "$PS1" "$WK1" "$WK0"
kill -CONT "$WK1"
# Bound: the drain plus the servers' own 2 s shutdown deadline, with room
# for a loaded machine.
deadline=$((SECONDS + DRAIN_S + 30))
for name in PS0 PS1 WK1 WK0; do
  pid=${!name}
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$name still running $((DRAIN_S + 30)) s after SIGTERM"
    kill -9 "$pid" 2>/dev/null
  fi
  wait "$pid"; rc=$?
  [ "$rc" -eq 0 ] && pass "$name exited 0 after SIGTERM" || fail "$name exited $rc after SIGTERM: $(tail -3 "$TMP/$(tr A-Z a-z <<<"${name:0:2}")"*.1.log)"
done

echo "== what the stop left on disk"
CKPT="$STATE/jobs/stopped/checkpoints"
manifest=$(tr -d '\0' <"$CKPT/MANIFEST" 2>/dev/null)
saved_step=$(grep -o 'ckpt-[0-9]*' <<<"$manifest" | tail -1 | sed 's/ckpt-0*//')
if [ -n "$saved_step" ] && [ "$saved_step" -ge "$step" ]; then
  pass "MANIFEST names a checkpoint at step $saved_step (>= $step, where the stop was asked)"
else
  fail "no checkpoint at or after step $step: MANIFEST: $manifest"
fi
shards=$(ls "$CKPT"/ckpt-*/ 2>/dev/null | grep -c shard)
[ "$shards" -eq 2 ] && pass "the checkpoint has one shard per ps" || fail "$shards shards: $(ls -R "$CKPT")"
grep -q "stopped at step $saved_step\|resumes from the checkpoint written at step $saved_step" "$TMP/worker0.1.log" \
  && pass "the chief logged the stop at step $saved_step" || fail "chief log: $(grep -i "shut\|stop" "$TMP/worker0.1.log" | tail -5)"
record=$(python3 - "$STATE/jobs/stopped/record" <<'PY' | protoc --decode=towerps.v1.JobRecord -I. proto/job_service.proto 2>&1
import struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])  # TFRecord framing: length, crc, data, crc
sys.stdout.buffer.write(data[12:12 + n])
PY
)
if grep -q "^state: QUEUED" <<<"$record" && grep -q "resume: true" <<<"$record"; then
  pass "the job record on disk: QUEUED, resume set"
else
  fail "record on disk: $(grep -E '^state|resume' <<<"$record")"
fi

echo "== the cluster started again resumes the job to its end"
start 2
timeout 300 "$TOWERCTL" logs -f stopped >"$TMP/resumed.log" 2>&1; rc=$?
[ "$rc" -eq 0 ] && pass "resumed job followed to success" || fail "logs -f: exit $rc: $(tail -5 "$TMP/resumed.log")"
grep -q "queued again, resumes from the checkpoint written at step $saved_step as it stopped" "$TMP/resumed.log" \
  && pass "its events say where it stopped" || fail "no stop event: $(grep -i queued "$TMP/resumed.log")"
grep -q "restoring checkpoint ckpt-0*$saved_step (step $saved_step)" "$TMP/resumed.log" \
  && pass "restored from step $saved_step" || fail "no restore from $saved_step: $(grep -i restor "$TMP/resumed.log")"
check=$("$TOWERCTL" --output=json status stopped | python3 -c "
import json, sys
j = json.load(sys.stdin)['job']
steps = [int(s.get('globalStep', 0)) for s in j.get('finalShards', [])]
acc = float(j['metrics'].get('testAccuracy', 0))
ok = j['state'] == 'SUCCEEDED' and steps and all(s == $TOTAL_STEPS for s in steps) and acc > 0.7
print('ok' if ok else 'bad: %s steps=%s acc=%s' % (j['state'], steps, acc))")
[ "$check" = ok ] && pass "SUCCEEDED at step $TOTAL_STEPS on every ps, test accuracy > 0.7" || fail "final: $check"

echo "== a one-job worker (no --serve) stops at a step on SIGTERM and says the job did not finish"
for p in "$PS0" "$PS1" "$WK1" "$WK0"; do kill -9 "$p" 2>/dev/null; done
read -r P2 W2 < <(python3 "$PWD/deploy/free_ports.py" 2 --sep=" ")
one=(--ps_hosts=127.0.0.1:$P2 --worker_hosts=127.0.0.1:$W2)
"$PS_BIN" "${one[@]}" --job_name=ps --task_index=0 >"$TMP/one_ps.log" 2>&1 &
ONE_PS=$!; PIDS+=($!)
"$WORKER_BIN" "${one[@]}" --job_name=worker --task_index=0 --max_train_examples=1000 \
  --epochs=1000 --log_every_steps=5 >"$TMP/one_worker.log" 2>&1 &
ONE_WK=$!; PIDS+=($!)
for ((t = 0; t < 1200; t++)); do
  grep -q "step " "$TMP/one_worker.log" 2>/dev/null && break
  kill -0 "$ONE_WK" 2>/dev/null || break
  sleep 0.05
done
if grep -q "step " "$TMP/one_worker.log"; then
  kill -TERM "$ONE_WK"
  deadline=$((SECONDS + 30))
  while kill -0 "$ONE_WK" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -9 "$ONE_WK" 2>/dev/null
  wait "$ONE_WK"; rc=$?
  if [ "$rc" -eq 143 ] && grep -q "stopped by signal 15 (SIGTERM) before the job finished" "$TMP/one_worker.log"; then
    pass "one-job worker: exit 143 with the reason"
  else
    fail "one-job worker: exit $rc: $(tail -3 "$TMP/one_worker.log")"
  fi
else
  fail "one-job worker never logged a step: $(tail -3 "$TMP/one_worker.log")"
fi
kill -TERM "$ONE_PS" 2>/dev/null
wait "$ONE_PS"; rc=$?
[ "$rc" -eq 0 ] && pass "its ps: exit 0 on SIGTERM" || fail "its ps: exit $rc"

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
