#!/usr/bin/env bash
# Confined paths (issue 15): on a real cluster (deploy/local_cluster.sh
# --serve, 2 ps and 1 worker on 127.0.0.1, every ps and the chief with the
# same --state_dir), every path a job spec or an RPC names must resolve under
# the roots:
# - specs whose checkpoint.dir, tensorboard_dir or data.dir point outside
#   (absolute paths, '..' that escapes, a symlink the test puts inside the
#   state dir pointing outside) are each refused at submit, towerctl exit 2,
#   with the field named;
# - a bare ParameterService.SaveCheckpoint (tests/raw_rpc.py with grpcio, the
#   request encoded by protoc from proto/ps.proto) with an outside dir, for a
#   job the ps really holds, is refused INVALID_ARGUMENT naming the field; one
#   inside the state dir writes its shard there;
# - a normal job with relative dirs trains, checkpoints and writes TensorBoard
#   events inside the state dir;
# - and nothing was written outside it: the canary dir stays empty, /x and
#   the other targets do not appear, and `find -newer` over the test's dir
#   shows no new file or directory outside the state dir.
# Python with grpcio: $TOWERPS_HEALTH_PYTHON, else tests/health_venv.sh's
# venv (PyPI on the first run; without it the RPC part is SKIPPED, saying so).
# Waits follow state (chief address, job steps, towerctl --wait) with
# deadlines; every process stops with the test.
set -uo pipefail

export TOWERPS_BIN_DIR="$PWD"
TOWERCTL="$PWD/client/towerctl"
LAUNCHER="$PWD/deploy/local_cluster.sh"
RAW_RPC="$PWD/tests/raw_rpc.py"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/paths.XXXXXX")"
export TOWERPS_LOG_DIR="$TMP/cluster"
STATE="$TOWERPS_LOG_DIR/state"   # local_cluster.sh's default --state_dir
CANARY="$TMP/canary"             # outside every root: must stay empty
SPECS="$TMP/specs"               # the test's own files
export OPENBLAS_NUM_THREADS=1
FAILS=0 PASSES=0
pass() { echo "PASS: $1"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
cleanup() {
  [ -n "${CLUSTER_PID:-}" ] && kill "$CLUSTER_PID" 2>/dev/null
  wait 2>/dev/null
}
trap cleanup EXIT
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
mkdir -p "$CANARY" "$SPECS"
X_EXISTED=0; [ -e /x ] && X_EXISTED=1

has_grpc() { [[ -n "$1" ]] && "$1" -c 'import grpc' >/dev/null 2>&1; }
PY=""
if has_grpc "${TOWERPS_HEALTH_PYTHON:-}"; then
  PY="$TOWERPS_HEALTH_PYTHON"
else
  . "$PWD/tests/health_venv.sh"
  has_grpc "$HEALTH_PYTHON" && PY="$HEALTH_PYTHON"
fi

echo "== start the cluster (2 ps, 1 worker, state in $STATE)"
timeout 600 "$LAUNCHER" --serve --ps=2 --workers=1 >"$TMP/launcher.log" 2>&1 &
CLUSTER_PID=$!
deadline=$((SECONDS + 120))
while [ $SECONDS -lt $deadline ]; do
  [ -s "$TOWERPS_LOG_DIR/chief_address" ] && break
  kill -0 "$CLUSTER_PID" 2>/dev/null || break
  sleep 0.1
done
export TOWERCTL_CHIEF=$(cat "$TOWERPS_LOG_DIR/chief_address" 2>/dev/null)
[ -n "$TOWERCTL_CHIEF" ] || { cat "$TMP/launcher.log"; echo "FAIL: cluster did not start"; exit 1; }
PS0=$(sed -n 's/^local_cluster: [0-9]* ps (\([^,)]*\).*/\1/p' "$TMP/launcher.log")
echo "chief at $TOWERCTL_CHIEF, ps 0 at $PS0"
grep -q "checkpoints only under $STATE" "$TOWERPS_LOG_DIR/ps0.log" \
  && pass "ps 0 confines checkpoints to $STATE" || fail "ps 0 log: $(head -3 "$TOWERPS_LOG_DIR/ps0.log")"

# Links inside the state dir that point outside it.
ln -s "$CANARY" "$STATE/evil"
ln -s /etc "$STATE/etc_link"
ln -s "$CANARY/not_yet" "$STATE/dangling"
# From here on nothing may appear outside $STATE (the test's own files go to
# $SPECS, the processes' logs are older than this).
touch "$SPECS/marker"

# job FILE ID EPOCHS [extra text-format fields] [data fields]
job() {
  cat >"$SPECS/$1" <<JOB
job_id: "$2"
model { input_dim: 784 layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: 10 } }
optimizer { type: ADAM learning_rate: 0.002 }
data { ${5:-max_train_examples: 3000 max_test_examples: 1000} }
global_batch_size: 100
epochs: $3
log_every_steps: 10
$4
JOB
}

echo "== specs that point outside the roots are refused at submit, the field named"
refuse() {  # NAME FIELD PATH SPEC_FIELDS [DATA_FIELDS]
  job refused.txtpb "refused" 1 "$4" "${5:-}"
  out=$("$TOWERCTL" submit "$SPECS/refused.txtpb" 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$2 \"$3\"" <<<"$out" && grep -qF "is outside --" <<<"$out"; then
    pass "$1: $(grep -m1 -F "$2" <<<"$out")"
  else
    fail "$1: exit $rc: $out"
  fi
}
refuse "absolute checkpoint.dir" checkpoint.dir "$CANARY/ck" "checkpoint { dir: \"$CANARY/ck\" }"
refuse "checkpoint.dir /x/deep/dir" checkpoint.dir /x/deep/dir 'checkpoint { dir: "/x/deep/dir" }'
refuse "checkpoint.dir with .. escaping" checkpoint.dir ../../canary/ck 'checkpoint { dir: "../../canary/ck" }'
refuse "checkpoint.dir with .. inside a path" checkpoint.dir "jobs/../../../canary" \
  'checkpoint { dir: "jobs/../../../canary" }'
refuse "checkpoint.dir through a symlink out" checkpoint.dir evil/ck 'checkpoint { dir: "evil/ck" }'
refuse "checkpoint.dir through a dangling symlink out" checkpoint.dir dangling 'checkpoint { dir: "dangling" }'
refuse "absolute tensorboard_dir" tensorboard_dir "$CANARY/tb" "tensorboard_dir: \"$CANARY/tb\""
refuse "tensorboard_dir through a symlink out" tensorboard_dir evil "tensorboard_dir: \"evil\""
refuse "tensorboard_dir with .. escaping" tensorboard_dir "$STATE/../../canary" \
  "tensorboard_dir: \"$STATE/../../canary\""
refuse "data.dir outside --data_root" data.dir "$CANARY" "" "dir: \"$CANARY\""
refuse "data.dir through a symlink to /etc" data.dir "$STATE/etc_link" "" "dir: \"$STATE/etc_link\""
out=$("$TOWERCTL" submit "$SPECS/refused.txtpb" 2>&1)
grep -qF -- "is outside --data_root \"/usr/share/datasets\", \"$STATE\"" <<<"$out" \
  && pass "the data roots are named: /usr/share/datasets and the state dir" || fail "data roots: $out"
jobs=$("$TOWERCTL" --output=json list | jq_py 'len(d.get("jobs", []))')
[ "$jobs" = 0 ] && pass "no refused job was recorded" || fail "$jobs job(s) recorded"

echo "== a bare SaveCheckpoint to a ps: outside dirs refused, for a job it holds"
if [ -z "$PY" ]; then
  echo "SKIPPED: no python with grpcio (tests/health_venv.sh needs PyPI on the first run); the RPC checks did not run"
else
  # A long job, so that the ps holds it while the RPCs come.
  job long.txtpb held 1000 'checkpoint { disabled: true }' 'max_train_examples: 500 max_test_examples: 100'
  step=0
  if "$TOWERCTL" submit "$SPECS/long.txtpb" >/dev/null; then
    deadline=$((SECONDS + 120))
    while [ $SECONDS -lt $deadline ]; do
      step=$("$TOWERCTL" --output=json status held 2>/dev/null | jq_py 'int(d.get("live",{}).get("globalStep","0"))' 2>/dev/null)
      [ "${step:-0}" -gt 2 ] && break
      sleep 0.1
    done
  fi
  [ "${step:-0}" -gt 2 ] && pass "job held runs (step $step)" || fail "job held did not start (step $step)"
  save() {  # DIR: prints raw_rpc's status line; the response in $SPECS/save.out
    rm -f "$SPECS/save.out"
    printf 'job_id: "held" checkpoint_dir: "%s" num_ps: 2\n' "$1" \
      | protoc --encode=towerps.v1.SaveRequest -I. proto/ps.proto \
      | "$PY" "$RAW_RPC" "$PS0" /towerps.v1.ParameterService/SaveCheckpoint "$SPECS/save.out"
  }
  for dir in "$CANARY/rpc" /x/deep/dir "state/../../y" "evil/rpc" "dangling/rpc" "$STATE/../outside"; do
    out=$(save "$dir" 2>&1)
    if [[ "$out" == INVALID_ARGUMENT* ]] && grep -qF "save: checkpoint_dir \"$dir\"" <<<"$out" \
       && grep -qF "is outside --state_dir" <<<"$out"; then
      pass "SaveCheckpoint to $dir refused: ${out#INVALID_ARGUMENT }"
    else
      fail "SaveCheckpoint to $dir: $out"
    fi
  done
  out=$(save rpc_ok/ckpt-0000000001 2>&1)
  path=$(protoc --decode=towerps.v1.SaveResponse -I. proto/ps.proto <"$SPECS/save.out" 2>&1 | sed -n 's/^path: "\(.*\)"$/\1/p')
  if [ "$out" = OK ] && [ "$path" = "$STATE/rpc_ok/ckpt-0000000001/shard-0-of-2" ] && [ -s "$path" ]; then
    pass "SaveCheckpoint to a relative dir writes the shard under the state dir: $path"
  else
    fail "SaveCheckpoint inside: $out, path \"$path\""
  fi
  "$TOWERCTL" cancel held >/dev/null || fail "cancel held"
fi

echo "== a normal job with relative dirs trains and checkpoints inside the state dir"
job good.txtpb good 2 'checkpoint { every_steps: 10 dir: "mine/ckpt" } tensorboard_dir: "mine/tb"'
timeout 300 "$TOWERCTL" submit "$SPECS/good.txtpb" --wait >"$SPECS/good.log" 2>&1; rc=$?
[ "$rc" -eq 0 ] && pass "job good: towerctl exit 0" || fail "job good: exit $rc: $(tail -5 "$SPECS/good.log")"
check=$("$TOWERCTL" --output=json status good | python3 -c "
import json, sys
j = json.load(sys.stdin)['job']
acc = float(j.get('metrics', {}).get('testAccuracy', 0))
ok = (j['state'] == 'SUCCEEDED' and acc > 0.6 and j.get('checkpointDir') == '$STATE/mine/ckpt'
      and j.get('tensorboardDir') == '$STATE/mine/tb')
print('ok acc=%.4f' % acc if ok else 'bad: %s acc=%s dirs %s %s' % (j['state'], acc, j.get('checkpointDir'), j.get('tensorboardDir')))")
[[ "$check" == ok* ]] && pass "job good SUCCEEDED, $check, its dirs absolute under the state dir" || fail "job good: $check"
shards=$(ls "$STATE"/mine/ckpt/ckpt-*/shard-*-of-2 2>/dev/null | wc -l)
[ -s "$STATE/mine/ckpt/MANIFEST" ] && [ "$shards" -ge 2 ] \
  && pass "MANIFEST and $shards shards in $STATE/mine/ckpt" || fail "checkpoints: $(ls -R "$STATE/mine" 2>&1)"
ls "$STATE"/mine/tb/events.out.tfevents.* >/dev/null 2>&1 \
  && pass "TensorBoard events in $STATE/mine/tb" || fail "no events in $STATE/mine/tb"

echo "== nothing was written outside the state dir"
left=$(find "$CANARY" -mindepth 1 2>&1)
[ -z "$left" ] && pass "the canary dir is empty" || fail "the canary dir has: $left"
if [ "$X_EXISTED" = 0 ]; then
  [ ! -e /x ] && pass "/x was not created" || fail "/x exists: $(ls -R /x | head)"
fi
[ ! -e "$TOWERPS_LOG_DIR/y" ] && [ ! -e "$TOWERPS_LOG_DIR/outside" ] && [ ! -e "$CANARY/not_yet" ] \
  && pass "no state/../../y, ../outside or dangling target" || fail "an escaping target exists"
# New files and directories since the marker, outside the state dir and the
# test's own folder (directories that merely got new entries are allowed
# only if they are the state dir's parents).
new=$(find "$TMP" -newer "$SPECS/marker" \
        -not -path "$STATE" -not -path "$STATE/*" -not -path "$SPECS" -not -path "$SPECS/*" \
        -not -path "$TMP" -not -path "$TOWERPS_LOG_DIR" \
        -not \( -path "$TOWERPS_LOG_DIR/*" -name '*.log' \) 2>&1)
[ -z "$new" ] && pass "find -newer: nothing new outside $STATE" || fail "new outside the state dir: $new"

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
