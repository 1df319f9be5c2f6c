#!/usr/bin/env bash
# Several hosts, each in its own network namespace (issue 14): 2 ps, 2 workers
# (worker 0 is the chief, `worker --serve`) and a client, one namespace each,
# joined by veth pairs to a Linux bridge in a sixth, "switch" namespace:
#
#   <run>-ps0      eth0 198.18.N.11 ─┐
#   <run>-ps1      eth0 198.18.N.12 ─┤
#   <run>-worker0  eth0 198.18.N.21 ─┼── br0 in <run>-sw
#   <run>-worker1  eth0 198.18.N.22 ─┤
#   <run>-client   eth0 198.18.N.31 ─┘
#
# 198.18.0.0/15 is the benchmarking range (RFC 2544); N is picked per run.
# Every process runs with `ip netns exec`, named by --ps_hosts/--worker_hosts
# with those addresses (port 2222 everywhere, as on real hosts: each
# namespace has its own ports); the servers bind 0.0.0.0:2222 inside their
# namespace, which holds only lo and that one address. From the client
# namespace, towerctl waits for SERVING on all four, checks that
# `towerctl cluster` lists the four tasks at their 198.18 addresses and
# healthy (the chief reached each across the bridge), that nothing answers on
# the client's own loopback, submits a short MLP job (deploy/jobs/mlp.json,
# shortened) with --wait, and checks: SUCCEEDED, loss below its first
# window's, test accuracy above 0.6, and each ps applied a push from both
# workers at every step (sync, replicas_to_aggregate = 2).
#
# Everything it creates (namespaces, veths, the bridge, processes) is removed
# on exit, on failure too; the last check is that none of its namespaces is
# left. Without root, or where `ip netns add` is not permitted, it prints
# "SKIPPED: network namespaces need root/CAP_SYS_ADMIN (...)" and exits 0.
#
#   tests/netns_test.sh [-h]    (in Bazel: bazel test //tests:netns_test)
# Outside Bazel, TOWERPS_BIN_DIR names a folder with ps/ps, worker/worker and
# client/towerctl (e.g. $(bazel info -c opt bazel-bin)); default: $PWD.
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
  "") ;;
  *) echo "netns_test: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

skip() { echo "SKIPPED: network namespaces need root/CAP_SYS_ADMIN ($1)"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "running as uid $(id -u)"

HERE="$PWD"
BIN="${TOWERPS_BIN_DIR:-$PWD}"
PS_BIN="$BIN/ps/ps" WORKER_BIN="$BIN/worker/worker" TOWERCTL="$BIN/client/towerctl"
for b in "$PS_BIN" "$WORKER_BIN" "$TOWERCTL"; do
  [ -x "$b" ] || { echo "netns_test: no binary $b (set TOWERPS_BIN_DIR)" >&2; exit 2; }
done
MLP_JOB="$HERE/deploy/jobs/mlp.json"
[ -r "$MLP_JOB" ] || MLP_JOB="$(dirname "$0")/../deploy/jobs/mlp.json"
[ -r "$MLP_JOB" ] || { echo "netns_test: no deploy/jobs/mlp.json" >&2; exit 2; }

command -v ip >/dev/null || { echo "FAIL: no 'ip' command (iproute2; deploy/setup.sh installs it)"; exit 1; }

TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns.XXXXXX")"
RUN="tps$$r$RANDOM"                # namespace prefix, unique per run
NET="198.18.$((RANDOM % 256))"     # this run's /24 in 198.18.0.0/15
PORT=2222
SW="$RUN-sw"
HOSTS=(ps0 ps1 worker0 worker1 client)
declare -A OCTET=([ps0]=11 [ps1]=12 [worker0]=21 [worker1]=22 [client]=31)
addr() { echo "$NET.${OCTET[$1]}"; }
PS_HOSTS="$(addr ps0):$PORT,$(addr ps1):$PORT"
WORKER_HOSTS="$(addr worker0):$PORT,$(addr worker1):$PORT"
CHIEF="$(addr worker0):$PORT"

NAMESPACES=() PIDS=()
# Stops every process (SIGTERM, SIGKILL after 10 s), kills anything still in
# one of our namespaces, deletes the namespaces (which takes their veths and
# the bridge with them), and fails the test if one of them is left.
cleanup() {
  local rc=$? p ns left t
  trap - EXIT INT TERM
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((t = 0; t < 100; t++)); do
    left=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "${NAMESPACES[@]}"; do
    p=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$p" ] && kill -KILL $p 2>/dev/null
    ip netns del "$ns" 2>/dev/null || echo "cleanup: could not delete namespace $ns"
  done
  left=$(ip netns list | grep -c "^$RUN-")
  if [ "$left" -ne 0 ]; then
    echo "FAIL: $left namespace(s) left behind: $(ip netns list | grep "^$RUN-" | tr '\n' ' ')"
    rc=1
  elif [ "${#NAMESPACES[@]}" -gt 0 ]; then
    echo "cleanup: ${#NAMESPACES[@]} namespaces and their veths, bridge and processes removed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "netns_test: interrupted"; exit 130' INT TERM

FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() {
  echo "FAIL: $1"
  for h in ps0 ps1 worker0 worker1; do
    [ -f "$TMP/$h.log" ] && { echo "--- $h log (tail)"; tail -n 15 "$TMP/$h.log"; }
  done
  exit 1
}

# The first `ip netns add` tells whether namespaces may be made here.
if ! err=$(ip netns add "$SW" 2>&1); then
  case "$err" in
    *"not permitted"*|*"Permission denied"*|*"Read-only file system"*) skip "ip netns add: $err" ;;
    *) die "ip netns add $SW: $err" ;;
  esac
fi
NAMESPACES+=("$SW")

echo "== topology: bridge br0 in $SW, one veth per host, $NET.0/24"
start_s=$SECONDS
ip -n "$SW" link set lo up
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for h in "${HOSTS[@]}"; do
  ns="$RUN-$h"
  ip netns add "$ns"
  NAMESPACES+=("$ns")
  # Both ends are made inside our namespaces: the host's own one is untouched.
  ip -n "$SW" link add "$h" type veth peer name eth0 netns "$ns"
  ip -n "$SW" link set "$h" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(addr "$h")/24" dev eth0
  ip -n "$ns" link set eth0 up
done
echo "namespaces: ${NAMESPACES[*]} ($((SECONDS - start_s)) s)"
echo "ps_hosts=$PS_HOSTS worker_hosts=$WORKER_HOSTS"

echo "== start 2 ps and 2 workers, each in its own namespace"
# in_ns HOST CMD...: runs CMD in HOST's namespace (in the foreground). The
# servers are started with `ip netns exec` itself, not through this function,
# so that $! is their process (ip execs timeout, which passes SIGTERM on).
in_ns() { local h="$1"; shift; ip netns exec "$RUN-$h" "$@"; }
CLUSTER=(--ps_hosts="$PS_HOSTS" --worker_hosts="$WORKER_HOSTS")
export OPENBLAS_NUM_THREADS=1
for i in 0 1; do
  ip netns exec "$RUN-ps$i" timeout 300 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps --task_index=$i \
    --state_dir="$TMP/state" >"$TMP/ps$i.log" 2>&1 &
  PIDS+=($!)
done
# As in the README's "Several hosts": only the chief (worker 0) keeps state.
ip netns exec "$RUN-worker0" timeout 300 "$WORKER_BIN" "${CLUSTER[@]}" --job_name=worker --task_index=0 \
  --serve --state_dir="$TMP/state" >"$TMP/worker0.log" 2>&1 &
PIDS+=($!)
ip netns exec "$RUN-worker1" timeout 300 "$WORKER_BIN" "${CLUSTER[@]}" --job_name=worker --task_index=1 \
  --serve >"$TMP/worker1.log" 2>&1 &
PIDS+=($!)

# From the client namespace: towerctl health until SERVING (60 s deadline),
# failing early if the process died.
TC=(in_ns client "$TOWERCTL" --timeout_s=5)
wait_serving() {  # HOST PID
  local a="$(addr "$1"):$PORT" deadline=$((SECONDS + 60)) out
  while ((SECONDS < deadline)); do
    out=$("${TC[@]}" --timeout_s=2 health "$a" 2>&1) && { pass "$1 at $a: $out (from the client namespace)"; return 0; }
    kill -0 "$2" 2>/dev/null || die "$1 exited before serving"
    sleep 0.1
  done
  die "$1 at $a not SERVING within 60 s: $out"
}
wait_serving ps0 "${PIDS[0]}"
wait_serving ps1 "${PIDS[1]}"
wait_serving worker0 "${PIDS[2]}"
wait_serving worker1 "${PIDS[3]}"

echo "== the client namespace reaches the cluster only through the bridge"
out=$("${TC[@]}" health "127.0.0.1:$PORT" 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 3 ] && pass "nothing on the client's own 127.0.0.1:$PORT (exit 3)" \
  || fail "client's loopback answered: exit $rc: $out"
out=$(in_ns ps0 ip -o -4 addr show 2>&1)
[ "$(grep -c inet <<<"$out")" -eq 2 ] && grep -q "inet $(addr ps0)/24" <<<"$out" \
  && pass "ps0's namespace holds 127.0.0.1 and $(addr ps0) only" || fail "ps0 addresses: $out"

echo "== towerctl cluster from the client: the four tasks at their 198.18 addresses"
if "${TC[@]}" --chief="$CHIEF" --output=json cluster >"$TMP/cluster.json" 2>&1; then
  check=$(python3 - "$TMP/cluster.json" "$PS_HOSTS" "$WORKER_HOSTS" <<'PY'
import json, sys
tasks = json.load(open(sys.argv[1])).get("tasks", [])
want = {("ps", i): a for i, a in enumerate(sys.argv[2].split(","))}
want.update({("worker", i): a for i, a in enumerate(sys.argv[3].split(","))})
got = {(t["job"], int(t.get("index", 0))): t for t in tasks}
bad = []
for key, a in sorted(want.items()):
    t = got.get(key)
    if t is None:
        bad.append("%s %d missing" % key)
    elif t.get("address") != a or not t.get("healthy"):
        bad.append("%s %d: %s healthy=%s %s" % (key + (t.get("address"), t.get("healthy"), t.get("error", ""))))
if len(tasks) != 4:
    bad.append("%d tasks" % len(tasks))
if not got.get(("worker", 0), {}).get("isChief"):
    bad.append("worker 0 not the chief")
print("ok" if not bad else "bad: " + "; ".join(bad))
PY
  )
  [ "$check" = ok ] && pass "cluster: 2 ps + 2 workers, healthy, at $PS_HOSTS / $WORKER_HOSTS" \
    || fail "cluster: $check"
else
  fail "towerctl cluster: $(cat "$TMP/cluster.json")"
fi

echo "== a short job submitted from the client namespace"
# deploy/jobs/mlp.json as it ships, shortened: 3000 examples, 2 epochs of 30
# sync steps, a progress event every 5 steps.
python3 - "$MLP_JOB" "$TMP/job.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
job["job_id"] = "netns_mlp"
job["global_batch_size"] = 100
job["epochs"] = 2
job["log_every_steps"] = 5
job["data"].update(max_train_examples=3000, max_test_examples=1000)
json.dump(job, open(sys.argv[2], "w"))
PY
job_start=$SECONDS
out=$(in_ns client timeout 120 "$TOWERCTL" --chief="$CHIEF" submit "$TMP/job.json" --wait 2>&1) \
  && rc=0 || rc=$?
echo "$out" | tail -n 3
[ "$rc" -eq 0 ] && pass "job SUCCEEDED through the bridge in $((SECONDS - job_start)) s" \
  || die "towerctl submit --wait: exit $rc: $(tail -n 5 <<<"$out")"

"${TC[@]}" --chief="$CHIEF" --output=json logs netns_mlp >"$TMP/events.json" 2>&1 || true
"${TC[@]}" --chief="$CHIEF" --output=json status netns_mlp >"$TMP/status.json" 2>&1 || true
check=$(python3 - "$TMP/events.json" "$TMP/status.json" <<'PY'
import json, sys
losses = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        e = json.loads(line)
        if e.get("kind") in ("PROGRESS", "EPOCH") and "loss" in e.get("metrics", {}):
            losses.append(float(e["metrics"]["loss"]))
job = json.load(open(sys.argv[2]))["job"]
m = job.get("metrics", {})
acc = float(m.get("testAccuracy", 0))
steps = int(m.get("step", 0))
shards = job.get("finalShards", [])
bad = []
if job.get("state") != "SUCCEEDED": bad.append("state %s" % job.get("state"))
if len(losses) < 3 or not losses[-1] < losses[0]:
    bad.append("loss did not go below its start: %s" % losses)
if not acc > 0.6: bad.append("test accuracy %.4f" % acc)
if len(shards) != 2: bad.append("%d final shards" % len(shards))
# Sync with 2 workers: every step on every ps takes one push from each worker.
pushes = [int(s.get("pushesApplied", 0)) for s in shards]
gsteps = [int(s.get("globalStep", 0)) for s in shards]
if steps <= 0 or any(g != steps for g in gsteps) or any(p != 2 * steps for p in pushes):
    bad.append("steps %d, shards at %s with pushes %s (want 2 per step)" % (steps, gsteps, pushes))
print(("ok loss %.3f -> %.3f, test accuracy %.4f, %d steps, pushes per ps %s"
       % (losses[0], losses[-1], acc, steps, pushes)) if not bad else "bad: " + "; ".join(bad))
PY
) || check="bad: $check"
[[ "$check" == ok* ]] && pass "$check" || fail "job: $check"
for i in 0 1; do
  grep -q "registered: .*workers=2, replicas_to_aggregate=2" "$TMP/ps$i.log" \
    && pass "ps$i registered the job for 2 workers" || fail "ps$i log: $(grep netns_mlp "$TMP/ps$i.log")"
done

echo "== stop: SIGTERM to every process, exit 0"
for ((i = 0; i < 4; i++)); do kill -TERM "${PIDS[$i]}"; done
names=(ps0 ps1 worker0 worker1)
for ((i = 0; i < 4; i++)); do
  wait "${PIDS[$i]}" && rc=0 || rc=$?
  [ "$rc" -eq 0 ] && pass "${names[$i]} exited 0 after SIGTERM" || fail "${names[$i]} exit $rc after SIGTERM"
done
PIDS=()  # all waited for: nothing for cleanup to signal

echo "total $((SECONDS - start_s)) s"
if [ "$FAILS" -ne 0 ]; then
  for h in ps0 ps1 worker0 worker1; do echo "--- $h log (tail)"; tail -n 15 "$TMP/$h.log"; done
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all several-hosts checks passed"
