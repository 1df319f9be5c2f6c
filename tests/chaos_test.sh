#!/usr/bin/env bash
# Chaos (issue 15): a sync job with periodic checkpoints on a real cluster
# (2 ps + 2 workers --serve, worker 0 the chief, one --state_dir), while a
# driver disrupts it N times at random moments:
#   kill_ps       SIGKILL of a random ps, restarted on its port with its flags
#   kill_worker   SIGKILL of worker 1, restarted likewise
#   kill_chief    SIGKILL of worker 0 (the chief), restarted likewise
#   stop_worker   SIGSTOP of a random worker, SIGCONT after a random 0.3-3 s
#                 (below the job's peer_timeout_s: the job pauses, no restart)
# A restart is what a supervisor does (docker restart policy, Kubernetes).
# Each disruption comes once the job has advanced a random 1-6 steps past
# the last one's recovery (a state: the step in `towerctl status`), and is
# followed by a wait (deadline) until the job is RUNNING past the step it had
# before, or has ended. A process that exits without being killed fails the
# test (and is restarted). Then:
#   - the job ends SUCCEEDED at its last step;
#   - its test accuracy is within 0.02 of an undisturbed run of the same
#     spec trained first on the same cluster (same data and seeds). A
#     restore replays the same batches from the same weights, so the runs
#     here ended at the reference's accuracy exactly; 0.02 (20 of the 1000
#     test examples) leaves room for rounding differences in a replayed
#     step and still catches a lost or doubled update schedule;
#   - each ps's --apply_log (ps/apply_log.h) never repeats a (worker, step)
#     between registrations, never applies a step below the checkpoint it
#     restored, and never restores behind the newest checkpoint listed in
#     the MANIFEST when a disruption began (tests/chaos_check.py);
#   - nothing under the state directory is corrupt: every job record and
#     event file, the MANIFEST and every shard it lists read back with valid
#     CRCs (tests/state_check).
# Usage: chaos_test.sh [--n=N] [--seed=S] [--timeout=SECONDS]
#   or the environment: N (default 3), SEED (default: random, printed),
#   TIMEOUT (seconds for the whole disturbed job, default 120 + 20 per N).
# Rerun a failure with the SEED it printed. Waits follow states (health,
# status, process exits) with deadlines.
set -euo pipefail

usage() {
  sed -n '2,/^# Rerun/p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}
N="${N:-3}"
SEED="${SEED:-$(( $(date +%s%N) % 1000000 ))}"
TIMEOUT="${TIMEOUT:-}"
for arg in "$@"; do
  case "$arg" in
    --n=*) N="${arg#*=}" ;;
    --seed=*) SEED="${arg#*=}" ;;
    --timeout=*) TIMEOUT="${arg#*=}" ;;
    -h|--help) usage ;;
    *) echo "chaos_test: unknown argument: $arg" >&2; usage ;;
  esac
done
[[ "$N" =~ ^[0-9]+$ ]] || { echo "chaos_test: N must be a non-negative integer, got '$N'" >&2; exit 2; }
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "chaos_test: SEED must be a non-negative integer, got '$SEED'" >&2; exit 2; }
TIMEOUT="${TIMEOUT:-$((120 + 20 * N))}"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "chaos_test: TIMEOUT must be a positive integer (seconds), got '$TIMEOUT'" >&2; exit 2; }
echo "chaos: N=$N SEED=$SEED TIMEOUT=${TIMEOUT}s"
RANDOM=$SEED  # every random choice below comes from bash's seeded RANDOM

PS_BIN="$PWD/ps/ps"
WORKER_BIN="$PWD/worker/worker"
TOWERCTL="$PWD/client/towerctl"
STATE_CHECK="$PWD/tests/state_check"
CHAOS_CHECK="$PWD/tests/chaos_check.py"
for f in "$PS_BIN" "$WORKER_BIN" "$TOWERCTL" "$STATE_CHECK" "$CHAOS_CHECK"; do
  [ -e "$f" ] || { echo "chaos_test: missing $f (run under bazel test, or from bazel-bin)" >&2; exit 2; }
done
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export OPENBLAS_NUM_THREADS=1
STATE="$TMP/state"
mkdir -p "$STATE"

declare -A PID CMD
cleanup() {
  local name
  for name in "${!PID[@]}"; do
    kill -CONT "${PID[$name]}" 2>/dev/null || true
    kill -9 "${PID[$name]}" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() { echo "FAIL: $1"; tail -n 5 "$TMP"/*.log 2>/dev/null || true; exit 1; }
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

read -r P0 P1 W0 W1 < <(python3 "$PWD/deploy/free_ports.py" 4 --sep=" ")
HOSTS=(--ps_hosts="127.0.0.1:$P0,127.0.0.1:$P1" --worker_hosts="127.0.0.1:$W0,127.0.0.1:$W1")
export TOWERCTL_CHIEF="127.0.0.1:$W0"
CMD[ps0]="$PS_BIN ${HOSTS[*]} --job_name=ps --task_index=0 --state_dir=$STATE --apply_log=$TMP/apply.ps0"
CMD[ps1]="$PS_BIN ${HOSTS[*]} --job_name=ps --task_index=1 --state_dir=$STATE --apply_log=$TMP/apply.ps1"
CMD[worker1]="$WORKER_BIN ${HOSTS[*]} --job_name=worker --task_index=1 --serve"
CMD[worker0]="$WORKER_BIN ${HOSTS[*]} --job_name=worker --task_index=0 --serve --state_dir=$STATE"

# start NAME: runs CMD[NAME] (no spaces in its words), appending to NAME.log.
start() {
  echo "=== start $(date +%T.%N)" >>"$TMP/$1.log"
  # shellcheck disable=SC2086
  ${CMD[$1]} >>"$TMP/$1.log" 2>&1 &
  PID[$1]=$!
}
# supervise: any process that exited although the driver did not kill it
# (a crash, or a failed start on its port) is a failure; it is restarted,
# as a supervisor's restart policy would, so that the run can go on.
supervise() {
  local name rc
  for name in "${!PID[@]}"; do
    kill -0 "${PID[$name]}" 2>/dev/null && continue
    rc=0; wait "${PID[$name]}" 2>/dev/null || rc=$?
    fail "$name exited on its own (status $rc): $(tail -n 3 "$TMP/$name.log" | tr '\n' ' ')"
    start "$name"
  done
}
# chief_serving SECONDS: 0 once the chief answers health.
chief_serving() {
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    "$TOWERCTL" --timeout_s=2 health "$TOWERCTL_CHIEF" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
# job_status JOB: "STATE STEP" from towerctl (STEP: the live global step, or
# the final one once ended), or "UNKNOWN -1" if the chief does not answer.
job_status() {
  "$TOWERCTL" --timeout_s=3 --output=json status "$1" 2>/dev/null | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    print("UNKNOWN -1"); sys.exit()
j = d.get("job", {})
step = int(d.get("live", {}).get("globalStep", "-1"))
if step < 0:
    steps = [int(s.get("globalStep", "0")) for s in j.get("finalShards", [])]
    step = min(steps) if steps else -1
print(j.get("state", "UNKNOWN"), step)' 2>/dev/null || echo "UNKNOWN -1"
}
# The newest checkpoint step listed in JOB's MANIFEST, -1 without one (read
# by the checker binary, which verifies CRCs; a MANIFEST that does not read
# back counts as none and is caught by the final check). Its exit status is
# ignored here: files being written while it reads (an events file's last
# record, a checkpoint being pruned) are no corruption.
manifest_step() {
  local s
  s=$({ "$STATE_CHECK" "$STATE" 2>/dev/null || true; } |
    sed -n "s/^job $1: checkpoint ckpt-[0-9]* (step \([0-9]*\),.*/\1/p" | tail -n 1)
  echo "${s:--1}"
}

# 4000 examples, global batch 200: 20 steps an epoch, each long enough
# (two 256-unit layers) that a poll of the step sees most of them. Long
# enough for N disruptions that each need the job to advance a few steps.
EPOCHS=$(( (100 + 40 * N + 19) / 20 ))
TOTAL_STEPS=$((EPOCHS * 20))
job_spec() {
  cat <<JOB
job_id: "$1"
model { input_dim: 784 layers { type: DENSE units: 256 activation: RELU } layers { type: DENSE units: 256 activation: RELU } layers { type: DENSE units: 10 } init_seed: 1 }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 4000 max_test_examples: 1000 shuffle_seed: 1 }
mode: SYNC
global_batch_size: 200
epochs: $EPOCHS
log_every_steps: 10
checkpoint { every_steps: 5 keep: 3 }
max_restarts: $((4 * N + 10))
peer_timeout_s: 10
JOB
}
job_spec reference >"$TMP/reference.txtpb"
job_spec chaos >"$TMP/chaos.txtpb"

echo "== cluster: 2 ps, 2 workers --serve (worker 0 the chief), state in $STATE"
for name in ps0 ps1 worker1 worker0; do start "$name"; done
chief_serving 60 || die "the chief did not become SERVING"

echo "== undisturbed reference run ($TOTAL_STEPS steps)"
T0=$SECONDS
"$TOWERCTL" submit "$TMP/reference.txtpb" >/dev/null || die "submit reference"
timeout "$TIMEOUT" "$TOWERCTL" logs -f reference >"$TMP/reference.out" 2>&1 || die "reference run: $(tail -3 "$TMP/reference.out")"
REF_ACC=$("$TOWERCTL" --output=json status reference | jq_py 'd["job"]["metrics"]["testAccuracy"]')
echo "reference: test accuracy $REF_ACC in $((SECONDS - T0)) s"

echo "== chaos run: $N disruptions"
: >"$TMP/disruptions"
"$TOWERCTL" submit "$TMP/chaos.txtpb" >/dev/null || die "submit chaos"
DEADLINE=$((SECONDS + TIMEOUT))
SUMMARY=()
state=QUEUED step=-1
# wait_step MIN: until the job is RUNNING at a step > MIN or has ended, by the
# overall deadline; sets state and step.
wait_step() {
  while [ $SECONDS -lt $DEADLINE ]; do
    read -r state step < <(job_status chaos)
    case "$state" in
      SUCCEEDED|FAILED|CANCELLED) return 0 ;;
      RUNNING) [ "$step" -gt "$1" ] && return 0 ;;
    esac
    supervise
    sleep 0.05
  done
  return 1
}
# applied_step: the newest step of the chaos job applied on ps 0, read from
# its apply log (a file: no lag, unlike a towerctl poll); -1 if none.
applied_step() {
  local s
  s=$(grep " apply chaos " "$TMP/apply.ps0" 2>/dev/null | tail -n 1 | cut -d' ' -f5)
  echo "${s:--1}"
}
# wait_applied MIN: until ps 0 has applied a step >= MIN (then state RUNNING,
# step that step), or the job has ended, by the overall deadline.
wait_applied() {
  local t=0 s
  while [ $SECONDS -lt $DEADLINE ]; do
    s=$(applied_step)
    if [ "$s" -ge "$1" ]; then state=RUNNING step=$s; return 0; fi
    if [ $((++t % 20)) -eq 0 ]; then  # about once a second: has it ended?
      supervise
      read -r state step < <(job_status chaos)
      case "$state" in SUCCEEDED|FAILED|CANCELLED) return 0 ;; esac
    fi
    sleep 0.02
  done
  return 1
}
wait_step 0 || die "the chaos job never ran past step 0 (state $state)"
k=0
while [ $k -lt "$N" ]; do
  # A random moment: 1-6 steps past the last step seen.
  wait_applied $((step + 1 + RANDOM % 6)) || die "no progress before disruption $((k + 1)) (state $state step $step)"
  if [ "$state" != RUNNING ]; then
    fail "the job ended ($state at step $step) after $k of $N disruptions: too short for N"
    break
  fi
  k=$((k + 1))
  before=$step
  kinds=(kill_ps kill_worker kill_chief stop_worker)
  kind=${kinds[$((RANDOM % 4))]}
  case "$kind" in
    kill_ps) victim=ps$((RANDOM % 2)) ;;
    kill_worker) victim=worker1 ;;
    kill_chief) victim=worker0 ;;
    stop_worker) victim=worker$((RANDOM % 2)) ;;
  esac
  counts=$(for i in 0 1; do wc -l <"$TMP/apply.ps$i" 2>/dev/null || echo 0; done | tr '\n' ' ')
  echo "$k $(manifest_step chaos) $counts" >>"$TMP/disruptions"
  t0=$SECONDS
  if [ "$kind" = stop_worker ]; then
    hold=$(printf '%d.%d' $((RANDOM % 3)) $((3 + RANDOM % 7)))
    signal="SIGSTOP ${hold}s"
    kill -STOP "${PID[$victim]}"
    sleep "$hold"  # the disruption itself: how long the worker stays stopped
    kill -CONT "${PID[$victim]}"
  else
    signal=SIGKILL
    kill -9 "${PID[$victim]}"
    wait "${PID[$victim]}" 2>/dev/null || true  # gone, its port free
    start "$victim"
  fi
  if ! wait_step "$before"; then
    fail "disruption $k ($victim $signal at step $before): the job did not run past step $before by the deadline (state $state step $step)"
    SUMMARY+=("$k $victim $signal before=$before after=STUCK")
    break
  fi
  line="disruption $k: $victim $signal at step $before -> $state at step $step after $((SECONDS - t0)) s"
  echo "$line"
  SUMMARY+=("$line")
done

echo "== the chaos job runs to its end"
while [ $SECONDS -lt $DEADLINE ]; do
  read -r state step < <(job_status chaos)
  case "$state" in SUCCEEDED|FAILED|CANCELLED) break ;; esac
  supervise
  sleep 0.2
done
"$TOWERCTL" --output=json status chaos >"$TMP/chaos.json" 2>&1 || true
"$TOWERCTL" logs chaos >"$TMP/chaos.out" 2>&1 || true
final=$(python3 - "$TMP/chaos.json" "$REF_ACC" "$TOTAL_STEPS" <<'PY'
import json, sys
band = 0.02
try:
    j = json.load(open(sys.argv[1]))["job"]
except Exception as e:
    print("bad: no status: %s" % e); sys.exit()
ref, total = float(sys.argv[2]), int(sys.argv[3])
acc = float(j.get("metrics", {}).get("testAccuracy", 0))
steps = [int(s.get("globalStep", 0)) for s in j.get("finalShards", [])]
problems = []
if j.get("state") != "SUCCEEDED": problems.append("state %s" % j.get("state"))
if not steps or any(s != total for s in steps): problems.append("final steps %s, want %d" % (steps, total))
if abs(acc - ref) > band: problems.append("accuracy %.4f outside %.4f +- %.2f" % (acc, ref, band))
print(("ok" if not problems else "bad: " + "; ".join(problems)) +
      " (accuracy %.4f, reference %.4f, band +-%.2f, attempts %s, steps %s)" % (acc, ref, band, j.get("attempts"), steps))
PY
)
[[ "$final" == ok* ]] && pass "the job SUCCEEDED at step $TOTAL_STEPS in the band: $final" || fail "final: $final"

echo "== each ps's applied steps (--apply_log)"
if python3 "$CHAOS_CHECK" chaos "$TMP/disruptions" "$TMP/apply.ps0" "$TMP/apply.ps1" >"$TMP/check.out" 2>&1; then
  pass "no (worker, step) applied twice, none behind the last checkpoint"
else
  fail "apply logs"
fi
cat "$TMP/check.out"

echo "== nothing in the state directory is corrupt"
# Every process stopped first: nothing is being written while it is read.
for name in "${!PID[@]}"; do kill -CONT "${PID[$name]}" 2>/dev/null || true; kill -9 "${PID[$name]}" 2>/dev/null || true; done
wait 2>/dev/null || true
if "$STATE_CHECK" "$STATE" >"$TMP/state_check.out" 2>&1; then
  pass "state directory: $(tail -1 "$TMP/state_check.out")"
else
  fail "state directory:"
fi
grep -E "CORRUPT|MANIFEST lists|not in the MANIFEST|record " "$TMP/state_check.out" || true

echo "== summary (SEED=$SEED, N=$N)"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
echo "  chaos job: $final"
if [ "$FAILS" -ne 0 ]; then
  echo "logs: $TMP"; tail -n 20 "$TMP/chaos.out" || true
  for name in ps0 ps1 worker0 worker1; do echo "--- $name"; grep -iE "error|fail|abort|restor" "$TMP/$name.log" | tail -n 8 || true; done
  echo "$FAILS checks failed"
  exit 1
fi
echo "chaos: all checks passed"
