#!/usr/bin/env bash
# deploy/slurm/towerps.sbatch on a real one-node Slurm that this test starts
# and stops: its own munged (own key and socket), slurmctld and slurmd (as
# root; select/cons_tres, proctrack/linuxproc, no cgroups), with their config,
# state, spool, pid and log files in one temporary folder and their ports
# free ones on this machine. The node is `hostname -s` with NodeAddr
# 127.0.0.1, so every connection (Slurm's and towerps's) stays on loopback.
#
# 1. A short MLP job (deploy/jobs/mlp.json cut to 10,000 examples, 1 epoch)
#    through sbatch: the batch job COMPLETED with exit 0, the job SUCCEEDED
#    with test accuracy >= 0.70, and all four tasks (2 ps, 2 workers) shut
#    down on SIGTERM ("signal 15" in each task's log) and exited 0.
# 2. A job file the chief rejects: the batch job FAILED with towerctl's exit
#    2, its output names the bad field, and the cluster still stopped cleanly.
# 3. scancel while a long job trains: the batch job is CANCELLED and every
#    task still shut down on SIGTERM (Slurm's own, before its SIGKILL).
#
# Skipped, saying so, when Slurm and munge are not installed
# (deploy/setup.sh --slurm installs them) or when not root. Waits follow
# state (munge answers, sinfo says idle, scontrol says the job ended) with
# deadlines; every daemon and job it started is stopped on exit.
set -uo pipefail

NEEDED=(munged mungekey munge unmunge slurmctld slurmd sbatch srun sinfo squeue scontrol scancel)
missing=()
for c in "${NEEDED[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "SKIPPED: Slurm is not installed (deploy/setup.sh --slurm installs it; missing: ${missing[*]})"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: starting slurmctld and slurmd needs root"
  exit 0
fi

SBATCH_SCRIPT="$PWD/deploy/slurm/towerps.sbatch"
MLP_JOB="$PWD/deploy/jobs/mlp.json"
FREE_PORTS="$PWD/deploy/free_ports.py"
# Short: munged's and slurmd's Unix sockets live here (108-byte path limit).
T="$(mktemp -d /tmp/towerps-slurm.XXXXXX)"
chmod 755 "$T"  # munged wants every folder above its socket searchable by all
mkdir -p "$T/bin" "$T/log" "$T/ctld" "$T/spool" "$T/munge"
ln -s "$PWD/ps/ps" "$PWD/worker/worker" "$PWD/client/towerctl" "$T/bin/"
# Nothing from a Slurm job this test might itself run in.
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
export SLURM_CONF="$T/slurm.conf"

FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
DAEMONS=() JOBS=()
show_logs() {
  for f in "$T"/log/* "$T"/*.out "$T"/state*/logs/*; do
    [ -f "$f" ] && { echo "--- $f (last lines)"; tail -n 15 "$f"; }
  done
}
die() { echo "FAIL: $*"; show_logs; exit 1; }
cleanup() {
  local rc=$? t
  trap - EXIT
  # Jobs first (slurmstepd outlives slurmd), then the daemons, newest first.
  for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null; done
  if [ ${#JOBS[@]} -gt 0 ]; then
    for ((t = 0; t < 300; t++)); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do kill "${DAEMONS[$i]}" 2>/dev/null; done
  for p in "${DAEMONS[@]}"; do
    for ((t = 0; t < 100; t++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ "$rc" -eq 0 ] && rm -rf "$T" || echo "kept $T for its logs"
  exit "$rc"
}
trap cleanup EXIT

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local secs="$1" what="$2" t
  shift 2
  for ((t = 0; t < secs * 10; t++)); do
    "$@" >/dev/null 2>&1 && return 0
    for p in "${DAEMONS[@]}"; do kill -0 "$p" 2>/dev/null || die "daemon $p exited while waiting for $what"; done
    sleep 0.1
  done
  die "no $what within $secs s"
}

# N consecutive free ports on every address (towerps task i gets BASE + i).
free_block() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randint(20000, 30000 - n)
    held = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            held.append(s)
            s.bind(("0.0.0.0", p))
    except OSError:
        continue
    finally:
        for s in held:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no block of %d free ports" % n)
PY
}

start=$(date +%s)
NODE="$(hostname -s)"
read -r CTLD_PORT SLURMD_PORT <<<"$(python3 "$FREE_PORTS" 2 --sep=" ")"
echo "slurm: $(slurmctld -V), node $NODE (127.0.0.1), slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT, in $T"

echo "== munged"
mungekey --create --keyfile="$T/munge/munge.key" || die "mungekey failed"
munged --foreground --socket="$T/munge/socket" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --seed-file="$T/munge/seed" >"$T/log/munged.out" 2>&1 &
DAEMONS+=($!)
munge_ok() { munge -n -S "$T/munge/socket" | unmunge -S "$T/munge/socket"; }
wait_for 15 "munge credential round trip" munge_ok
pass "munged answers on $T/munge/socket"

echo "== slurmctld and slurmd"
cat >"$SLURM_CONF" <<EOF
# One node, made by tests/slurm_test.sh.
ClusterName=towerpstest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/socket
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=$NODE Default=YES MaxTime=10 State=UP
EOF
slurmctld -D >"$T/log/slurmctld.out" 2>&1 &
DAEMONS+=($!)
slurmd -D >"$T/log/slurmd.out" 2>&1 &
DAEMONS+=($!)
node_idle() { [ "$(sinfo -h -n "$NODE" -o %T)" = idle ]; }
wait_for 30 "idle node in sinfo" node_idle
pass "node $NODE idle after $(( $(date +%s) - start )) s"

# submit_job NAME JOB_FILE [TLS_DIR]: sbatch on 4 tasks (2 ps, 2 workers;
# --overcommit: the node has 2 CPUs), with mutual TLS and a token from
# TLS_DIR when given; sets JOB_ID and OUT (the batch output file).
submit_job() {
  local base
  base=$(free_block 4) || die "no 4 consecutive free ports"
  OUT="$T/$1.out"
  JOB_ID=$(TOWERPS_TLS_DIR="${3:-}" TOWERPS_BIN_DIR="$T/bin" TOWERPS_BASE_PORT="$base" TOWERPS_STATE_DIR="$T/state_$1" \
    TOWERPS_DRAIN_S=1 TOWERPS_START_TIMEOUT_S=60 TOWERPS_STOP_TIMEOUT_S=20 \
    sbatch --parsable --overcommit --ntasks=4 --job-name="$1" --chdir="$T" --output="$OUT" \
    "$SBATCH_SCRIPT" "$2") || die "sbatch refused $1"
  JOBS+=("$JOB_ID")
  echo "$1: batch job $JOB_ID, tasks on ports $base-$((base + 3))"
}

# wait_job NAME: until batch job $JOB_ID has ended; sets STATE and EXIT
# (Slurm's "code:signal").
wait_job() {
  local t info
  STATE="" EXIT=""
  for ((t = 0; t < 1200; t++)); do
    info=$(scontrol show job -o "$JOB_ID" 2>/dev/null)
    STATE=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
    EXIT=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
    case "$STATE" in PENDING|RUNNING|CONFIGURING|COMPLETING|"") ;; *) return 0 ;; esac
    sleep 0.1
  done
  die "$1: batch job $JOB_ID still $STATE after 120 s"
}

run_job() { submit_job "$@" && wait_job "$1"; }

# every_task_stopped NAME: each task's log shows the SIGTERM shutdown.
every_task_stopped() {
  local n=0 i
  for i in 0 1 2 3; do
    grep -q "signal 15, shutting down" "$T/state_$1/logs/task-$i.log" 2>/dev/null && n=$((n + 1))
  done
  if [ "$n" -eq 4 ]; then
    pass "$1: all 4 tasks shut down on SIGTERM"
  else
    fail "$1: $n of 4 task logs show the SIGTERM shutdown"
  fi
}

echo "== a short MLP job through deploy/slurm/towerps.sbatch, mutual TLS + token (TOWERPS_TLS_DIR)"
"$PWD/deploy/make_certs.sh" --days 2 "$T/tls" >/dev/null || die "deploy/make_certs.sh failed"
python3 - "$MLP_JOB" "$T/mlp_short.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
job["job_id"] = "slurm_mlp"
job["epochs"] = 1
job["data"]["max_train_examples"] = 10000
job["data"]["max_test_examples"] = 1000
json.dump(job, open(sys.argv[2], "w"))
PY
t0=$(date +%s)
run_job mlp "$T/mlp_short.json" "$T/tls"
echo "mlp: $STATE, exit $EXIT, $(( $(date +%s) - t0 )) s"
[ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ] && pass "mlp: batch job COMPLETED, exit 0:0" ||
  fail "mlp: batch job $STATE, exit $EXIT"
grep -q "STATE *SUCCEEDED" "$OUT" && pass "mlp: the job SUCCEEDED" || fail "mlp: no SUCCEEDED in the batch output"
final=$(grep "^final: " "$OUT")
acc=$(sed -n 's/^final: test_accuracy=\([0-9.]*\) .*/\1/p' <<<"$final")
if [ -n "$acc" ] && python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.70 else 1)"; then
  pass "mlp: $final (accuracy >= 0.70)"
else
  fail "mlp: want test_accuracy >= 0.70, got: ${final:-no final line}"
fi
grep -q "cluster stopped: every task exited 0" "$OUT" && pass "mlp: the script saw every task exit 0" ||
  fail "mlp: the cluster did not stop cleanly"
every_task_stopped mlp
grep -q "cluster up (mutual TLS + token from $T/tls)" "$OUT" && pass "mlp: towerctl reached the chief over mutual TLS" ||
  fail "mlp: the batch output does not say mutual TLS"
n=$(grep -l "client certificates required" "$T"/state_mlp/logs/task-*.log 2>/dev/null | wc -l)
[ "$n" -eq 4 ] && pass "mlp: all 4 tasks served mutual TLS with a token" ||
  fail "mlp: $n of 4 task logs say mutual TLS"
[ -d "$T/state_mlp/jobs/slurm_mlp" ] && pass "mlp: the chief kept the job's record under TOWERPS_STATE_DIR" ||
  fail "mlp: no $T/state_mlp/jobs/slurm_mlp"

echo "== a job file the chief rejects"
printf '{"model": {"input_dim": 784, "layers": [{"type": "DENSE", "units": 0}]}}\n' >"$T/bad.json"
t0=$(date +%s)
run_job bad "$T/bad.json"
echo "bad: $STATE, exit $EXIT, $(( $(date +%s) - t0 )) s"
[ "$STATE" = FAILED ] && [ "$EXIT" = 2:0 ] && pass "bad: batch job FAILED with towerctl's exit 2" ||
  fail "bad: batch job $STATE, exit $EXIT (want FAILED, 2:0)"
if grep -qi "units" "$OUT"; then
  pass "bad: the output names the field: $(grep -i -m1 units "$OUT")"
else
  fail "bad: the output does not name 'units': $(tail -n 5 "$OUT")"
fi
every_task_stopped bad

echo "== scancel while a job trains: the cluster stops on SIGTERM all the same"
python3 - "$MLP_JOB" "$T/mlp_long.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
job["job_id"] = "slurm_long"
job["epochs"] = 50
json.dump(job, open(sys.argv[2], "w"))
PY
t0=$(date +%s)
submit_job long "$T/mlp_long.json"
training() { grep -q "PROGRESS" "$OUT"; }
wait_for 60 "progress of the long job in $OUT" training
scancel "$JOB_ID"
wait_job long
echo "long: $STATE, exit $EXIT, $(( $(date +%s) - t0 )) s"
[ "$STATE" = CANCELLED ] && pass "long: batch job CANCELLED" || fail "long: batch job $STATE (want CANCELLED)"
grep -q "STATE *SUCCEEDED" "$OUT" && fail "long: the 50-epoch job SUCCEEDED before scancel"
every_task_stopped long

echo "slurm_test: $(( $(date +%s) - start )) s"
if [ "$FAILS" -gt 0 ]; then
  show_logs
  echo "slurm_test: $FAILS check(s) failed"
  exit 1
fi
echo "slurm_test: every check passed"
