#!/usr/bin/env bash
# Disk faults under the chief's --state_dir (issue 15, "Faults"): small
# tmpfs mounts stand for a full and a read-only disk.
# - STATE: a tmpfs, the --state_dir of the chief and the servers.
#   CKPT: a second, tiny tmpfs at STATE/ckpt (under the state root) for the
#   checkpoints of (b), so that filling it leaves the job records writable.
# (a) STATE full: submit is refused naming the record's path and the errno
#     text; towerctl exits non-zero; the job is not listed (not queued).
# (b) CKPT full: a job whose final checkpoint hits ENOSPC ends FAILED naming
#     the path, `submit --wait` exits non-zero, and no ckpt-* directory or
#     MANIFEST is left that looks complete. A job whose periodic checkpoints
#     fail fails at the 3rd failure in a row, saying so.
# (d) A byte flipped in the MANIFEST of a finished job: export still works
#     (rebuilt in memory); the job resubmitted (--resume) restores its latest
#     checkpoint, its final checkpoint rewrites the MANIFEST, its events say
#     it was rebuilt and from which checkpoints; the next resume reads it as is.
# (c) STATE/jobs read-only (a read-only bind mount): submit is refused naming
#     the path and "Read-only file system"; nothing is listed.
# Needs root and mount (tmpfs): otherwise SKIPPED, saying why. Every mount
# is undone on exit. Waits follow state (health, towerctl) with deadlines.
set -uo pipefail

usage() { echo "usage: $0   (run by bazel test //tests:disk_faults_test; needs root for mount)"; }
[ $# -eq 0 ] || { usage >&2; exit 2; }

PS_BIN="$PWD/ps/ps"
WORKER_BIN="$PWD/worker/worker"
TOWERCTL="$PWD/client/towerctl"
export OPENBLAS_NUM_THREADS=1

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: disk_faults_test needs root to mount a tmpfs (running as uid $(id -u))"
  exit 0
fi
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/disk_faults.XXXXXX")"
STATE="$TMP/state"
CKPT="$STATE/ckpt"
PIDS=()
MOUNTS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null ||
      echo "warning: could not unmount ${MOUNTS[$i]}" >&2
  done
}
trap cleanup EXIT
mkdir -p "$STATE"
if ! out=$(mount -t tmpfs -o size=16m tmpfs "$STATE" 2>&1); then
  echo "SKIPPED: disk_faults_test cannot mount a tmpfs here: $out"
  exit 0
fi
MOUNTS+=("$STATE")
mkdir -p "$CKPT"
mount -t tmpfs -o size=1m tmpfs "$CKPT" || { echo "FAIL: mount the checkpoint tmpfs"; exit 1; }
MOUNTS+=("$CKPT")

FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
fill() { dd if=/dev/zero of="$1/filler" bs=16k >/dev/null 2>&1; [ "$(df -k --output=avail "$1" | tail -1)" -lt 64 ]; }
job_json() {  # JOB: its record as JSON
  "$TOWERCTL" --output=json status "$1" 2>/dev/null
}
field() { python3 -c "import json,sys; j=json.load(sys.stdin)['job']; print(j$1)"; }

read -r P0 P1 W0 W1 < <(python3 "$PWD/deploy/free_ports.py" 4 --sep=" ")
COMMON=(--ps_hosts="127.0.0.1:$P0,127.0.0.1:$P1" --worker_hosts="127.0.0.1:$W0,127.0.0.1:$W1")
export TOWERCTL_CHIEF="127.0.0.1:$W0"
for t in 0 1; do
  "$PS_BIN" "${COMMON[@]}" --job_name=ps --task_index=$t --state_dir="$STATE" >"$TMP/ps$t.log" 2>&1 &
  PIDS+=($!)
done
"$WORKER_BIN" "${COMMON[@]}" --job_name=worker --task_index=1 --serve >"$TMP/worker1.log" 2>&1 &
PIDS+=($!)
"$WORKER_BIN" "${COMMON[@]}" --job_name=worker --task_index=0 --serve --state_dir="$STATE" \
  >"$TMP/worker0.log" 2>&1 &
CHIEF=$!; PIDS+=($!)
for ((t = 0; t < 600; t++)); do
  "$TOWERCTL" --timeout_s=2 health "$TOWERCTL_CHIEF" >/dev/null 2>&1 && break
  kill -0 "$CHIEF" 2>/dev/null || break
  sleep 0.1
done
"$TOWERCTL" --timeout_s=2 health "$TOWERCTL_CHIEF" >/dev/null 2>&1 ||
  { tail -5 "$TMP/worker0.log"; echo "FAIL: the chief did not become SERVING"; exit 1; }

write_job() {  # NAME EPOCHS CHECKPOINT_BLOCK
  cat >"$TMP/$1.txtpb" <<JOB
job_id: "$1"
model { input_dim: 784 layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: 10 } }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 3000 max_test_examples: 500 }
global_batch_size: 100
epochs: $2
log_every_steps: 30
max_restarts: 1
$3
JOB
}

echo "== (a) the state dir is full: submit is refused, naming the path"
write_job refused 1 ""
fill "$STATE" || fail "(a) could not fill $STATE: $(df -k "$STATE" | tail -1)"
out=$("$TOWERCTL" submit "$TMP/refused.txtpb" 2>&1); rc=$?
if [ "$rc" -ne 0 ] && grep -qF "$STATE/jobs/refused" <<<"$out" && grep -q "No space left on device" <<<"$out"; then
  pass "(a) submit refused, rc $rc: $out"
else
  fail "(a) submit on a full disk: rc $rc: $out"
fi
if "$TOWERCTL" list 2>&1 | grep -q refused; then fail "(a) the refused job is listed"; else pass "(a) the refused job is not listed"; fi
"$TOWERCTL" status refused >/dev/null 2>&1 && fail "(a) status knows the refused job" || pass "(a) status: no such job"
rm -f "$STATE/filler"

echo "== (b) the checkpoint disk is full: the final checkpoint fails the job"
write_job full 1 "checkpoint { dir: \"$CKPT/full\" every_steps: 1000000 }"
fill "$CKPT" || fail "(b) could not fill $CKPT"
out=$(timeout 300 "$TOWERCTL" submit "$TMP/full.txtpb" --wait 2>&1); rc=$?
state=$(job_json full | field "['state']")
error=$(job_json full | field ".get('error', '')")
if [ "$rc" -ne 0 ] && [ "$state" = FAILED ] && grep -qF "$CKPT/full" <<<"$error" &&
   grep -q "No space left on device" <<<"$error" && grep -q "final checkpoint" <<<"$error"; then
  pass "(b) FAILED, submit --wait rc $rc: $error"
else
  fail "(b) rc $rc, state $state, error: $error; $(tail -3 <<<"$out")"
fi
left=$(find "$CKPT/full" -name 'ckpt-*' 2>/dev/null; find "$CKPT/full" -name MANIFEST 2>/dev/null)
[ -z "$left" ] && pass "(b) nothing half-written that looks complete is left" || fail "(b) left behind: $left"
grep -q "incomplete: removed" <<<"$out$("$TOWERCTL" logs full 2>&1)" &&
  pass "(b) the events say the partial checkpoint was removed" || echo "note: no partial directory to remove"

write_job periodic 2 "checkpoint { dir: \"$CKPT/periodic\" every_steps: 10 }"
out=$(timeout 300 "$TOWERCTL" submit "$TMP/periodic.txtpb" --wait 2>&1); rc=$?
state=$(job_json periodic | field "['state']")
error=$(job_json periodic | field ".get('error', '')")
if [ "$rc" -ne 0 ] && [ "$state" = FAILED ] && grep -q "failed 3 times in a row" <<<"$error" &&
   grep -qF "$CKPT/periodic" <<<"$error"; then
  pass "(b) periodic checkpoints failing 3 times in a row fail the job: $error"
else
  fail "(b) periodic: rc $rc, state $state, error: $error"
fi
grep -q "failed (1 of 3 in a row; the next one tries again)" <<<"$out" &&
  pass "(b) a failed periodic checkpoint is an event and is tried again" || fail "(b) no retry event: $(grep -i checkpoint <<<"$out" | head -3)"
rm -f "$CKPT/filler"

echo "== (d) a flipped byte in a finished job's MANIFEST"
write_job flip 2 "checkpoint { every_steps: 20 keep: 2 }"
out=$(timeout 300 "$TOWERCTL" submit "$TMP/flip.txtpb" --wait 2>&1); rc=$?
[ "$rc" -eq 0 ] && pass "(d) job flip SUCCEEDED" || fail "(d) job flip: rc $rc: $(tail -3 <<<"$out")"
manifest="$STATE/jobs/flip/checkpoints/MANIFEST"
python3 - "$manifest" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x01
open(p, "wb").write(bytes(b))
PY
if "$TOWERCTL" export flip "$TMP/flip.safetensors" >"$TMP/export.out" 2>&1 && [ -s "$TMP/flip.safetensors" ]; then
  pass "(d) export works with the MANIFEST damaged"
else
  fail "(d) export: $(cat "$TMP/export.out")"
fi
# A resubmitted job keeps its spec: it restores step 60 (the MANIFEST rebuilt
# in memory) and its final checkpoint at 60 writes a whole MANIFEST again.
out=$(timeout 300 "$TOWERCTL" submit --resume flip --wait 2>&1); rc=$?
[ "$rc" -eq 0 ] && pass "(d) resumed job SUCCEEDED" || fail "(d) resume: rc $rc: $(tail -3 <<<"$out")"
grep -q "restoring checkpoint ckpt-0000000060 (step 60)" <<<"$out" &&
  pass "(d) restored from ckpt-0000000060" || fail "(d) no restore: $(grep -i restor <<<"$out" | head -3)"
grep -q "checkpoint ckpt-0000000060: MANIFEST damaged (.*): rebuilt from the intact checkpoints on disk: ckpt-0000000040, ckpt-0000000060" <<<"$out" &&
  pass "(d) the events say the MANIFEST was rebuilt and from which: $(grep -m1 -o 'checkpoint ckpt-0000000060: MANIFEST.*' <<<"$out" | sed 's/(.*)/(...)/' | cut -c1-160)" ||
  fail "(d) no rebuild event: $(grep -i manifest <<<"$out" | head -3)"
step=$(job_json flip | field ".get('checkpointStep', '')")
[ "$step" = 60 ] && pass "(d) status: checkpoint at step 60" || fail "(d) checkpointStep '$step'"
dirs=$(ls -d "$STATE/jobs/flip/checkpoints"/ckpt-* 2>/dev/null | wc -l)
[ "$dirs" -eq 2 ] && pass "(d) keep:2 holds: $(ls "$STATE/jobs/flip/checkpoints" | tr '\n' ' ')" ||
  fail "(d) $dirs checkpoint dirs: $(ls "$STATE/jobs/flip/checkpoints")"
# (The events of a resubmitted job follow its earlier ones: count them.)
damaged=$(grep -c "MANIFEST damaged" <<<"$out") restores=$(grep -c "restoring checkpoint ckpt-0000000060" <<<"$out")
out=$(timeout 300 "$TOWERCTL" submit --resume flip --wait 2>&1); rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c "MANIFEST damaged" <<<"$out")" -eq "$damaged" ] &&
   [ "$(grep -c "restoring checkpoint ckpt-0000000060" <<<"$out")" -eq $((restores + 1)) ]; then
  pass "(d) the MANIFEST is whole again: the next resume reads it as is"
else
  fail "(d) second resume: rc $rc: $(grep -i 'manifest\|restor' <<<"$out" | head -3)"
fi

echo "== (c) the job records' directory is read-only: submit is refused, naming the path"
# A read-only bind mount over STATE/jobs (a remount of the whole tmpfs is
# refused while the chief holds files open for writing).
if mount --bind "$STATE/jobs" "$STATE/jobs" && MOUNTS+=("$STATE/jobs") &&
   mount -o remount,bind,ro "$STATE/jobs"; then
  write_job readonly 1 ""
  out=$("$TOWERCTL" submit "$TMP/readonly.txtpb" 2>&1); rc=$?
  if [ "$rc" -ne 0 ] && grep -qF "$STATE/jobs/readonly" <<<"$out" && grep -q "Read-only file system" <<<"$out"; then
    pass "(c) submit refused, rc $rc: $out"
  else
    fail "(c) submit on a read-only disk: rc $rc: $out"
  fi
  if "$TOWERCTL" list 2>&1 | grep -q readonly; then fail "(c) the refused job is listed"; else pass "(c) the refused job is not listed"; fi
  # A cancel of an ended job changes nothing; one of a missing job says so.
  out=$("$TOWERCTL" status flip 2>&1) && grep -q SUCCEEDED <<<"$out" &&
    pass "(c) the ended jobs still read back" || fail "(c) status flip: $out"
else
  fail "(c) could not make $STATE/jobs read-only"
fi

echo "== $PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ] || { echo "logs in $TMP"; tail -5 "$TMP"/*.log; exit 1; }
