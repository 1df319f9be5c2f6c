#!/usr/bin/env bash
# The compose cluster in containers, end to end: deploy/docker_up.sh starts
# the engine if needed, builds the base image (debootstrap, once) and the
# CPU-only towerps image from this test's binaries, and brings up 2 ps and 2
# workers with the host-network override on free loopback ports. Then:
# `docker-compose ps` shows every service healthy, the image has every
# library its binaries need and no compiler, towerctl (on the host) submits a
# short MLP job that SUCCEEDS with a sane test accuracy, its checkpoint lies
# in the shared state volume, a task killed inside its container is restarted
# by the policy; `docker-compose stop` while the whole mlp.json trains ends
# every task with exit code 0 (init: true, SIGTERM handled, --drain_s=10),
# the chief having checkpointed the job and queued it again in the state
# volume; `start` resumes it from that checkpoint to SUCCEEDED; and `down -v`
# leaves no container, volume or network of the project. Everything the test made goes, also on failure;
# a dockerd it started is stopped again.
#
# Needs root and the engine (docker.io, docker-compose, debootstrap:
# deploy/setup.sh --docker); prints "SKIPPED: <why>" and exits 0 where they
# are missing or the engine cannot start. Run built CPU-only:
#   bazel test --config=cpu_image //tests:docker_test
set -uo pipefail

skip() { echo "SKIPPED: $1"; exit 0; }
TOWERCTL="$PWD/client/towerctl"
UP="$PWD/deploy/docker_up.sh"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
DOCKER=docker
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() { echo "FAIL: $1"; exit 1; }
t0=$SECONDS
elapsed() { echo "$((SECONDS - t0)) s"; }

[ "$(id -u)" -eq 0 ] || skip "needs root to start and use the Docker engine"
for tool in dockerd docker-compose debootstrap; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (deploy/setup.sh --docker installs docker.io, docker-compose, debootstrap)"
done
# The binaries go into the image, which has Debian's libraries and no CUDA.
if ldd worker/worker | grep -q libcudart; then
  die "worker/worker links the CUDA runtime; run this test built CPU-only: bazel test --config=cpu_image //tests:docker_test"
fi

ENGINE_WAS_UP=0
"$DOCKER" info >/dev/null 2>&1 && ENGINE_WAS_UP=1
PROJECT="towerps-test-$$"
IFS=, read -r P0 P1 W0 W1 < <(python3 deploy/free_ports.py 4)
export TOWERPS_PS0_PORT=$P0 TOWERPS_PS1_PORT=$P1 TOWERPS_WORKER0_PORT=$W0 TOWERPS_WORKER1_PORT=$W1
export TOWERPS_IMAGE="towerps:test"
export TOWERPS_BIN_DIR="$PWD"
# docker_up.sh makes the cluster's certificates and token here (mutual TLS +
# token on every channel); towerctl on the host uses the client certificate.
export TOWERPS_SECRETS_DIR="$TMP/secrets"
COMPOSE=(docker-compose -p "$PROJECT" -f deploy/docker-compose.yml -f deploy/docker-compose.host.yml)

leftovers() {  # every container, volume and network of the project
  local what
  for what in "ps -a" "volume ls" "network ls"; do
    # shellcheck disable=SC2086
    "$DOCKER" $what -q --filter "label=com.docker.compose.project=$PROJECT"
  done
}
cleanup() {
  trap - EXIT
  if [ -n "$(leftovers 2>/dev/null)" ]; then
    echo "cleanup: docker-compose down -v"
    "${COMPOSE[@]}" down -v --timeout 10 >/dev/null 2>&1
  fi
  if [ "$ENGINE_WAS_UP" = 0 ]; then "$UP" --stop-engine; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== engine"
if [ "$ENGINE_WAS_UP" = 1 ]; then
  echo "the engine was running; left running"
else
  out=$("$UP" --engine-only 2>&1) || skip "the Docker engine cannot start here: $(tail -n 1 <<<"$out")"
  echo "$out"
fi
"$DOCKER" image inspect towerps-base:bookworm >/dev/null 2>&1 \
  && echo "base image present (cached)" || echo "no base image yet: debootstrap makes it (about a minute)"

echo "== build the images and bring the cluster up (host network: ps $P0 $P1, workers $W0 $W1) [$(elapsed)]"
"$UP" --host-network --project="$PROJECT" >"$TMP/up.log" 2>&1
rc=$?
cat "$TMP/up.log"
[ "$rc" -eq 0 ] || die "docker_up.sh exited $rc"
pass "docker_up.sh: images built, cluster up [$(elapsed)]"
# The TOWERCTL_TLS_* / TOWERCTL_AUTH_TOKEN_FILE settings it made, as a user would.
[ -f "$TOWERPS_SECRETS_DIR/towerctl.env" ] || die "no $TOWERPS_SECRETS_DIR/towerctl.env"
# shellcheck disable=SC1091
. "$TOWERPS_SECRETS_DIR/towerctl.env"

# What `docker-compose ps` says, not only what docker_up.sh waited for.
deadline=$((SECONDS + 120))
while true; do
  ps_out=$("${COMPOSE[@]}" ps 2>&1)
  healthy=$(grep -c "Up (healthy)" <<<"$ps_out")
  [ "$healthy" -eq 4 ] && break
  [ "$SECONDS" -lt "$deadline" ] || { echo "$ps_out"; die "docker-compose ps: $healthy of 4 healthy after 120 s"; }
  sleep 0.5
done
pass "docker-compose ps: all 4 services Up (healthy)"
for port in "$P0" "$P1" "$W0" "$W1"; do
  out=$("$TOWERCTL" health --timeout_s=5 "127.0.0.1:$port" 2>&1); rc=$?
  [ "$rc" -eq 0 ] && [ "$out" = SERVING ] || fail "towerctl health 127.0.0.1:$port from the host: exit $rc: $out"
done
[ "$FAILS" -eq 0 ] && pass "towerctl health from the host (TLS): SERVING on all 4 loopback ports"
# The cluster refuses plaintext and calls without the token.
out=$(env -u TOWERCTL_TLS_CA -u TOWERCTL_TLS_CERT -u TOWERCTL_TLS_KEY -u TOWERCTL_TLS_SERVER_NAME \
  "$TOWERCTL" --chief="127.0.0.1:$W0" --timeout_s=5 list 2>&1); rc=$?
[ "$rc" -eq 3 ] && pass "plaintext towerctl refused: $out" || fail "plaintext towerctl: exit $rc: $out"
out=$(env -u TOWERCTL_AUTH_TOKEN_FILE "$TOWERCTL" --chief="127.0.0.1:$W0" --timeout_s=5 list 2>&1); rc=$?
[ "$rc" -eq 1 ] && grep -q UNAUTHENTICATED <<<"$out" && pass "towerctl without the token refused: $out" \
  || fail "towerctl without the token: exit $rc: $out"

echo "== the image [$(elapsed)]"
out=$("$DOCKER" run --rm --network none --entrypoint sh "$TOWERPS_IMAGE" -c \
  'ldd /usr/local/bin/ps /usr/local/bin/worker /usr/local/bin/towerctl | grep -c "not found"; command -v gcc g++ cc c++ bazel nvcc; ls /usr/share/datasets/fashion-mnist | wc -l; ls /usr/share/towerps/jobs/mlp.json' 2>&1)
missing=$(sed -n 1p <<<"$out")
[ "$missing" = 0 ] && pass "ldd in the image: no library missing" || fail "ldd in the image: $out"
grep -qE '/(gcc|g\+\+|cc|c\+\+|bazel|nvcc)$' <<<"$out" && fail "build tools in the image: $out" || pass "no compiler or bazel in the image"
grep -q '/usr/share/towerps/jobs/mlp.json' <<<"$out" && [ "$(sed -n 2p <<<"$out")" -ge 4 ] \
  && pass "Fashion-MNIST and the job files in the image" || fail "data or job files missing: $out"
echo "image $TOWERPS_IMAGE: $("$DOCKER" image inspect -f '{{.Size}}' "$TOWERPS_IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')"

echo "== a short job, submitted from the host [$(elapsed)]"
# deploy/jobs/mlp.json cut short: one epoch on 20000 examples.
python3 - deploy/jobs/mlp.json "$TMP/short.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["job_id"] = "docker_short"
d["epochs"] = 1
d["data"]["max_train_examples"] = "20000"
d["data"]["max_test_examples"] = "5000"
d["log_every_steps"] = 20
json.dump(d, open(sys.argv[2], "w"), indent=1)
PY
timeout 300 "$TOWERCTL" --chief="127.0.0.1:$W0" --timeout_s=30 submit "$TMP/short.json" --wait >"$TMP/job.log" 2>&1
rc=$?
tail -n 4 "$TMP/job.log"
[ "$rc" -eq 0 ] && pass "towerctl submit --wait: exit 0" || fail "towerctl submit --wait: exit $rc"
check=$("$TOWERCTL" --chief="127.0.0.1:$W0" --output=json list 2>&1 | python3 -c '
import json, sys
j = {j["jobId"]: j for j in json.load(sys.stdin)["jobs"]}.get("docker_short", {})
m = j.get("metrics", {})
acc = float(m.get("testAccuracy", 0))
print("ok %.4f" % acc if j.get("state") == "SUCCEEDED" and m.get("hasTest") and acc > 0.7
      else "bad: state %s metrics %s" % (j.get("state"), m))' 2>&1)
[ "${check%% *}" = ok ] && pass "job SUCCEEDED, test accuracy ${check#ok } > 0.7" || fail "job: $check"
out=$("${COMPOSE[@]}" exec -T ps1 sh -c 'ls /var/lib/towerps/state/jobs/docker_short/checkpoints/' 2>&1)
grep -q MANIFEST <<<"$out" && grep -q 'ckpt-' <<<"$out" \
  && pass "checkpoint and MANIFEST in the shared state volume (seen from ps1)" || fail "state volume: $out"

# Waits (deadline 90 s) until service $1 has restarted at least $2 times and
# is healthy again.
wait_restarted() {
  local id deadline=$((SECONDS + 90)) st
  id=$("${COMPOSE[@]}" ps -q "$1")
  while true; do
    st=$("$DOCKER" inspect -f '{{.RestartCount}} {{.State.StartedAt}} {{.State.Health.Status}}' "$id" 2>&1)
    [ "${st%% *}" -ge "$2" ] 2>/dev/null && [ "${st##* }" = healthy ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || { echo "$1: $st"; return 1; }
    sleep 0.5
  done
}

echo "== restart policy [$(elapsed)]"
# SIGKILL to the ps process (not to the container's init, PID 1): the
# container exits and `restart: unless-stopped` brings it back.
"${COMPOSE[@]}" exec -T ps1 sh -c 'kill -9 -1' >/dev/null 2>&1
wait_restarted ps1 1 && pass "ps1 killed inside its container: restarted by the policy, healthy again" \
  || fail "ps1 not restarted and healthy within 90 s"

echo "== docker-compose stop while a job trains; start again: it resumes [$(elapsed)]"
# deploy/jobs/mlp.json for 4 epochs of 30000 examples (468 steps, about 15 s
# here), so that the stop lands mid-job even on a slow machine.
python3 - deploy/jobs/mlp.json "$TMP/long.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["job_id"] = "docker_long"
d["epochs"] = 4
d["data"]["max_train_examples"] = "30000"
json.dump(d, open(sys.argv[2], "w"), indent=1)
PY
ids=$("${COMPOSE[@]}" ps -q)
"$TOWERCTL" --chief="127.0.0.1:$W0" submit "$TMP/long.json" >/dev/null || fail "submit docker_long"
deadline=$((SECONDS + 120)) step=0
while [ "${step:-0}" -le 20 ] && [ "$SECONDS" -lt "$deadline" ]; do
  sleep 0.2
  step=$("$TOWERCTL" --chief="127.0.0.1:$W0" --output=json status docker_long 2>/dev/null \
    | python3 -c 'import json,sys; print(int(json.load(sys.stdin).get("live",{}).get("globalStep","0")))' 2>/dev/null)
done
[ "${step:-0}" -gt 20 ] && pass "docker_long running (step $step)" || fail "docker_long did not pass step 20 in 120 s"
start=$SECONDS
"${COMPOSE[@]}" stop --timeout 30 >/dev/null 2>&1
stop_s=$((SECONDS - start))
# shellcheck disable=SC2086
codes=$("$DOCKER" inspect -f '{{.Name}}={{.State.ExitCode}}' $ids | tr '\n' ' ')
# --drain_s=10: about 11 s; Docker's SIGKILL would come at 30 s (exit 137).
[ "$stop_s" -le 25 ] && pass "stop took $stop_s s (drain 10 s; SIGKILL only at 30 s)" || fail "stop took $stop_s s"
grep -qvE '=0$' <(tr ' ' '\n' <<<"${codes% }") && fail "exit codes after SIGTERM: $codes" \
  || pass "every task exited 0 on SIGTERM: $codes"
"${COMPOSE[@]}" start >/dev/null 2>&1 || fail "docker-compose start"
deadline=$((SECONDS + 120))
until [ "$("${COMPOSE[@]}" ps 2>&1 | grep -c "Up (healthy)")" -eq 4 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { fail "not all healthy 120 s after start"; break; }
  sleep 0.5
done
timeout 300 "$TOWERCTL" --chief="127.0.0.1:$W0" logs -f docker_long >"$TMP/long.log" 2>&1; rc=$?
[ "$rc" -eq 0 ] && pass "docker_long resumed and followed to success" || fail "logs -f docker_long: exit $rc: $(tail -n 3 "$TMP/long.log")"
saved=$(grep -oE "resumes from the checkpoint written at step [0-9]+" "$TMP/long.log" | head -1 | grep -oE "[0-9]+$")
if [ -n "$saved" ] && grep -qE "restoring checkpoint ckpt-0*$saved \(step $saved\)" "$TMP/long.log"; then
  pass "the chief checkpointed it at step $saved of 468 on SIGTERM (state volume) and restored it there"
else
  fail "no stop checkpoint and restore in its events: $(grep -iE "queued again|restor" "$TMP/long.log" | head -3)"
fi
check=$("$TOWERCTL" --chief="127.0.0.1:$W0" --output=json list 2>&1 | python3 -c '
import json, sys
j = {j["jobId"]: j for j in json.load(sys.stdin)["jobs"]}.get("docker_long", {})
m = j.get("metrics", {})
acc = float(m.get("testAccuracy", 0))
print("ok %.4f" % acc if j.get("state") == "SUCCEEDED" and acc > 0.8 else "bad: %s %s" % (j.get("state"), m))' 2>&1)
[ "${check%% *}" = ok ] && pass "docker_long SUCCEEDED, test accuracy ${check#ok } > 0.8" || fail "docker_long: $check"

echo "== down [$(elapsed)]"
start=$SECONDS
"${COMPOSE[@]}" down -v --timeout 30 >/dev/null 2>&1 || fail "docker-compose down -v failed"
down_s=$((SECONDS - start))
[ "$down_s" -le 25 ] && pass "down -v took $down_s s" || fail "down -v took $down_s s"
left=$(leftovers)
[ -z "$left" ] && pass "no container, volume or network of $PROJECT left" || fail "left behind: $left"

echo "total $(elapsed)"
[ "$FAILS" -eq 0 ] || { echo "$FAILS check(s) failed"; exit 1; }
echo "all checks passed"
