#!/usr/bin/env bash
# TLS, mutual TLS and the bearer token on every channel (issue 15), on real
# processes on 127.0.0.1: 1 ps and 2 workers --serve (worker 0 is the chief),
# all with --tls_cert/--tls_key/--tls_ca (servers require client
# certificates) and --auth_token_file. Certificates are made at run time by
# deploy/make_certs.sh (openssl) in the test's temp dir: a CA, a server/client
# certificate for the cluster (SANs DNS:towerps, DNS:localhost, IP:127.0.0.1),
# a client certificate for
# towerctl, and a second, unrelated CA with its own client certificate.
#   (a) a short job submitted with the right CA, certificate and token trains
#       (loss goes down, SUCCEEDED, test accuracy above a floor);
#   (b) without the token every service refuses (chief's JobService through
#       towerctl; ParameterService and WorkerService through PyPI's grpcio,
#       tests/rpc_probe.py) with UNAUTHENTICATED, a wrong token with
#       PERMISSION_DENIED, and no error text or log holds the token;
#   (c) a client certificate from the unrelated CA, no client certificate, a
#       client that trusts another CA, and a plaintext client are refused;
#   (d) the health service answers without a token (probes);
#   and bad security flags stop a server at startup with exit 2, naming the
#   flag and the path.
# Python with grpcio: as tests/health_test.sh ($TOWERPS_HEALTH_PYTHON, else the
# venv of tests/health_venv.sh). Waits follow state (towerctl health, the
# job's end) with deadlines; every process runs under `timeout` and is killed
# on exit.
#   Usage: tests/tls_test.sh   (from the runfiles root, as `bazel test` runs it)
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,25p' "$0"; exit 0
fi

PS_BIN="${PWD}/ps/ps"
WORKER_BIN="${PWD}/worker/worker"
TOWERCTL="${PWD}/client/towerctl"
PROBE="${PWD}/tests/rpc_probe.py"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/tls.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${TEST_TMPDIR:-}" ]] || rm -rf "$TMP"
}
trap cleanup EXIT
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() { echo "FAIL: $*" >&2; exit 1; }

if ! command -v openssl >/dev/null; then
  echo "SKIPPED: openssl is not installed (deploy/setup.sh installs it)"; exit 0
fi
has_grpc() { [[ -n "$1" ]] && "$1" -c 'import grpc' >/dev/null 2>&1; }
if has_grpc "${TOWERPS_HEALTH_PYTHON:-}"; then
  PY="$TOWERPS_HEALTH_PYTHON"
else
  . "${PWD}/tests/health_venv.sh"
  has_grpc "$HEALTH_PYTHON" || die "no python with grpcio (needs PyPI on the first run)"
  PY="$HEALTH_PYTHON"
fi

# --- certificates (deploy/make_certs.sh: ca, node, client; other_ca, rogue) ----------
C="$TMP/certs"
"${PWD}/deploy/make_certs.sh" --test_extras --days 2 "$C" >/dev/null || die "cannot make certificates"
TOKEN="tok-$(openssl rand -hex 16)"
printf '%s\n' "$TOKEN" >"$TMP/token"
printf 'not-%s\n' "$TOKEN" >"$TMP/wrong_token"
chmod 600 "$TMP/token" "$TMP/wrong_token"

TLS_NODE=(--tls_cert="$C/node.pem" --tls_key="$C/node.key" --tls_ca="$C/ca.pem")
TLS_CLIENT=(--tls_cert="$C/client.pem" --tls_key="$C/client.key" --tls_ca="$C/ca.pem")
SECURE=("${TLS_NODE[@]}" --auth_token_file="$TMP/token")

# --- bad flags: exit 2 at startup, naming the flag and the path ------------------
read -r PS_PORT WK0_PORT WK1_PORT <<<"$(python3 "$PWD/deploy/free_ports.py" 3 --sep=" ")"
PS_ADDR="127.0.0.1:$PS_PORT" WK0_ADDR="127.0.0.1:$WK0_PORT" WK1_ADDR="127.0.0.1:$WK1_PORT"
CLUSTER=(--ps_hosts="$PS_ADDR" --worker_hosts="$WK0_ADDR,$WK1_ADDR")

: >"$TMP/empty_token"
# bad_flags NAME WANT_TEXT -- ps args...
bad_flags() {
  local name="$1" want="$2"; shift 3
  local out rc=0
  out=$(timeout 30 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps --task_index=0 "$@" 2>&1) || rc=$?
  if [[ "$rc" -eq 2 ]] && grep -qF -- "$want" <<<"$out"; then
    pass "bad flags: $name: exit 2: $(tail -1 <<<"$out")"
  else
    fail "bad flags: $name: exit $rc (want 2, \"$want\"): $out"
  fi
}
bad_flags "cert without key" "--tls_cert=$C/node.pem needs --tls_key" -- --tls_cert="$C/node.pem"
bad_flags "unreadable key" "--tls_key=$TMP/absent.key: cannot read" -- \
  --tls_cert="$C/node.pem" --tls_key="$TMP/absent.key"
bad_flags "empty token file" "--auth_token_file=$TMP/empty_token: the token is empty" -- \
  --auth_token_file="$TMP/empty_token"
bad_flags "CA without a certificate" "--tls_ca=$C/ca.pem needs --tls_cert" -- --tls_ca="$C/ca.pem"
out=$(TOWERPS_AUTH_TOKEN=x timeout 30 "$PS_BIN" "${CLUSTER[@]}" --job_name=ps \
  --auth_token_file="$TMP/token" 2>&1) && rc=0 || rc=$?
[[ "$rc" -eq 2 ]] && grep -q "both set" <<<"$out" && pass "bad flags: token file and env: $out" ||
  fail "bad flags: token file and env: exit $rc: $out"

# --- the cluster ------------------------------------------------------------------
# The ps writes checkpoint shards only under its --state_dir: the chief's.
timeout 300 "$PS_BIN" "${CLUSTER[@]}" "${SECURE[@]}" --job_name=ps --task_index=0 \
  --state_dir="$TMP/state" >"$TMP/ps.log" 2>&1 &
PIDS+=($!)
for w in 0 1; do
  timeout 300 "$WORKER_BIN" "${CLUSTER[@]}" "${SECURE[@]}" --job_name=worker --task_index=$w \
    --serve --state_dir="$TMP/state" >"$TMP/worker$w.log" 2>&1 &
  PIDS+=($!)
done

# (d) health needs no token (TLS still does: servers require a client certificate).
# wait_serving ADDRESS: towerctl health until SERVING, 90 s at most.
wait_serving() {
  local deadline=$((SECONDS + 90)) out
  while ((SECONDS < deadline)); do
    out=$("$TOWERCTL" "${TLS_CLIENT[@]}" --timeout_s=2 health "$1" 2>&1) && return 0
    sleep 0.2
  done
  die "$1 never SERVING over TLS: $out"
}
for a in "$PS_ADDR" "$WK0_ADDR" "$WK1_ADDR"; do
  wait_serving "$a"
  pass "(d) towerctl health $a over mutual TLS, no token: SERVING"
done
# An independent client, no token, each process.
# probe EXPECT_CODE NAME ADDRESS METHOD [rpc_probe args...]: the call's code must be EXPECT_CODE.
probe() {
  local want="$1" name="$2" addr="$3" method="$4"; shift 4
  local out
  out=$("$PY" "$PROBE" "$addr" "$method" "$@" 2>&1) || true
  if [[ "$out" == "$want:"* ]]; then
    if grep -qF -- "$TOKEN" <<<"$out"; then fail "$name: the error text holds the token"; return; fi
    pass "$name: $out"
  else
    fail "$name: got \"$out\", want $want"
  fi
}
CA_CLIENT=(--ca "$C/ca.pem" --cert "$C/client.pem" --key "$C/client.key")
HEALTH=/grpc.health.v1.Health/Check
for a in "$PS_ADDR" "$WK0_ADDR" "$WK1_ADDR"; do
  probe OK "(d) grpcio Health/Check $a without a token" "$a" "$HEALTH" "${CA_CLIENT[@]}"
done
grep -q "mutual TLS" "$TMP/ps.log" && grep -q "bearer token required" "$TMP/ps.log" &&
  pass "ps logs its transport security: $(grep -m1 'mutual TLS' "$TMP/ps.log")" ||
  fail "ps log does not describe TLS and the token: $(cat "$TMP/ps.log")"

# --- (a) a short job trains over TLS with the token ---------------------------------
cat >"$TMP/job.txtpb" <<JOB
job_id: "tls_job"
model { input_dim: 784 layers { type: DENSE units: 64 activation: RELU } layers { type: DENSE units: 10 } }
optimizer { type: ADAM learning_rate: 0.002 }
data { max_train_examples: 6000 max_test_examples: 1000 }
global_batch_size: 100
epochs: 2
log_every_steps: 10
JOB
start=$SECONDS
out=$(timeout 240 "$TOWERCTL" "${TLS_CLIENT[@]}" --auth_token_file="$TMP/token" \
  --chief="$WK0_ADDR" submit "$TMP/job.txtpb" --wait 2>&1) && rc=0 || rc=$?
echo "$out" >"$TMP/job.out"
acc=$(sed -n 's/^final: test_accuracy=\([0-9.]*\).*/\1/p' <<<"$out" | tail -1)
# The loss of the first and the last progress line.
losses=$(grep -o 'loss[= ][0-9.]*' <<<"$out" | grep -o '[0-9.]*$' || true)
first=$(head -1 <<<"$losses") last=$(tail -1 <<<"$losses")
if [[ "$rc" -eq 0 && -n "$acc" && -n "$first" && -n "$last" ]] &&
  python3 -c "import sys; a,f,l=map(float,sys.argv[1:]); sys.exit(0 if a>0.70 and l<f else 1)" \
    "$acc" "$first" "$last"; then
  pass "(a) job over mutual TLS + token: SUCCEEDED, test accuracy $acc, loss $first -> $last, $((SECONDS - start)) s"
else
  fail "(a) job over TLS: exit $rc, accuracy '$acc', loss '$first' -> '$last': $(tail -5 <<<"$out")"
fi
out=$("$TOWERCTL" "${TLS_CLIENT[@]}" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" \
  status tls_job 2>&1) || true
grep -q SUCCEEDED <<<"$out" && pass "(a) status says SUCCEEDED" || fail "(a) status: $out"

# --- (b) no token / a wrong token: every service refuses --------------------------
# towerctl_expect NAME WANT_RC WANT_TEXT -- towerctl args...
towerctl_expect() {
  local name="$1" want_rc="$2" want="$3"; shift 4
  local out rc=0
  out=$(timeout 30 "$TOWERCTL" --timeout_s=5 "$@" 2>&1) || rc=$?
  if grep -qF -- "$TOKEN" <<<"$out"; then fail "$name: the output holds the token"; return; fi
  if [[ "$rc" -eq "$want_rc" ]] && grep -qF -- "$want" <<<"$out"; then
    pass "$name: rc $rc: $out"
  else
    fail "$name: rc $rc (want $want_rc, \"$want\"): $out"
  fi
}
towerctl_expect "(b) chief list, no token" 1 UNAUTHENTICATED -- \
  "${TLS_CLIENT[@]}" --chief="$WK0_ADDR" list
towerctl_expect "(b) chief cancel, no token" 1 UNAUTHENTICATED -- \
  "${TLS_CLIENT[@]}" --chief="$WK0_ADDR" cancel tls_job
towerctl_expect "(b) chief list, wrong token" 1 PERMISSION_DENIED -- \
  "${TLS_CLIENT[@]}" --auth_token_file="$TMP/wrong_token" --chief="$WK0_ADDR" list
towerctl_expect "(b) chief list, right token" 0 tls_job -- \
  "${TLS_CLIENT[@]}" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" list

PS_M=/towerps.v1.ParameterService WK_M=/towerps.v1.WorkerService JOB_M=/towerps.v1.JobService
REFLECT=/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo
# issue 15: the gradient push (client stream), pull and heartbeat as well;
# the job's record must be the same after the rogue calls.
job_before=$("$TOWERCTL" "${TLS_CLIENT[@]}" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" \
  --output=json status tls_job 2>&1 | python3 -c "import json,sys; j=json.load(sys.stdin)['job']; print(j['state'], j.get('finalShards'), j.get('checkpointStep'))" 2>&1)
for m in GetStatus DeleteJob SaveCheckpoint RegisterVariables Push Pull Heartbeat; do
  probe UNAUTHENTICATED "(b) ps $m, no token" "$PS_ADDR" "$PS_M/$m" "${CA_CLIENT[@]}"
  probe PERMISSION_DENIED "(b) ps $m, wrong token" "$PS_ADDR" "$PS_M/$m" "${CA_CLIENT[@]}" \
    --token "not-$TOKEN"
done
for a in "$WK0_ADDR" "$WK1_ADDR"; do
  for m in GetStatus StopJob StartJob; do
    probe UNAUTHENTICATED "(b) worker $a $m, no token" "$a" "$WK_M/$m" "${CA_CLIENT[@]}"
    probe PERMISSION_DENIED "(b) worker $a $m, wrong token" "$a" "$WK_M/$m" "${CA_CLIENT[@]}" \
      --token "not-$TOKEN"
  done
done
probe UNAUTHENTICATED "(b) chief CancelJob, no token" "$WK0_ADDR" "$JOB_M/CancelJob" "${CA_CLIENT[@]}"
probe UNAUTHENTICATED "(b) reflection, no token" "$PS_ADDR" "$REFLECT" "${CA_CLIENT[@]}"
job_after=$("$TOWERCTL" "${TLS_CLIENT[@]}" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" \
  --output=json status tls_job 2>&1 | python3 -c "import json,sys; j=json.load(sys.stdin)['job']; print(j['state'], j.get('finalShards'), j.get('checkpointStep'))" 2>&1)
[[ "$job_before" == SUCCEEDED* && "$job_after" == "$job_before" ]] \
  && pass "(b) the job's record is untouched by the rogue calls: ${job_after:0:60}..." \
  || fail "(b) the job's record changed: before \"$job_before\", after \"$job_after\""
# The probe itself can get through: with the right token a call reaches the handler.
probe OK "(b) ps GetStatus with the right token reaches the handler" "$PS_ADDR" \
  "$PS_M/GetStatus" "${CA_CLIENT[@]}" --token "$TOKEN"
probe OK "(b) worker GetStatus with the right token reaches the handler" "$WK1_ADDR" \
  "$WK_M/GetStatus" "${CA_CLIENT[@]}" --token "$TOKEN"

# --- (c) wrong certificates and plaintext are refused --------------------------------
ROGUE=(--tls_cert="$C/rogue.pem" --tls_key="$C/rogue.key" --tls_ca="$C/ca.pem")
towerctl_expect "(c) client certificate from another CA" 3 "cannot reach" -- \
  "${ROGUE[@]}" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" list
towerctl_expect "(c) no client certificate" 3 "cannot reach" -- \
  --tls_ca="$C/ca.pem" --auth_token_file="$TMP/token" --chief="$WK0_ADDR" list
towerctl_expect "(c) client trusting another CA" 3 "cannot reach" -- \
  --tls_cert="$C/client.pem" --tls_key="$C/client.key" --tls_ca="$C/other_ca.pem" \
  --auth_token_file="$TMP/token" --chief="$WK0_ADDR" list
towerctl_expect "(c) plaintext towerctl" 3 "cannot reach" -- \
  --auth_token_file="$TMP/token" --chief="$WK0_ADDR" list
# --tls_server_name replaces the host dialed in the certificate check: a name
# the certificate carries passes, one it does not is refused although the
# address dialed (127.0.0.1) is in the certificate.
towerctl_expect "(c) --tls_server_name the certificate carries" 0 tls_job -- \
  "${TLS_CLIENT[@]}" --tls_server_name=towerps --auth_token_file="$TMP/token" \
  --chief="$WK0_ADDR" list
towerctl_expect "(c) --tls_server_name the certificate lacks" 3 "cannot reach" -- \
  "${TLS_CLIENT[@]}" --tls_server_name=elsewhere --auth_token_file="$TMP/token" \
  --chief="$WK0_ADDR" list
towerctl_expect "(c) plaintext towerctl health" 3 "cannot reach" -- health "$PS_ADDR"
probe UNAVAILABLE "(c) grpcio, client certificate from another CA, ps" "$PS_ADDR" \
  "$PS_M/GetStatus" --ca "$C/ca.pem" --cert "$C/rogue.pem" --key "$C/rogue.key" --token "$TOKEN"
probe UNAVAILABLE "(c) grpcio, plaintext, worker" "$WK1_ADDR" "$WK_M/GetStatus" --token "$TOKEN"

# --- the token is in no log ---------------------------------------------------------
if grep -lF -- "$TOKEN" "$TMP"/*.log "$TMP/job.out" 2>/dev/null; then
  fail "a log holds the token"
else
  pass "no log holds the token"
fi

if [[ "$FAILS" -ne 0 ]]; then
  for f in ps worker0 worker1; do echo "--- $f log (tail)"; tail -n 30 "$TMP/$f.log"; done
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all TLS and token checks passed"
