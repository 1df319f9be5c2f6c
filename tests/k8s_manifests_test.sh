#!/usr/bin/env bash
# deploy/k8s/ validated offline for stated Kubernetes versions, and the facts
# a schema cannot see.
#
# 1. `kubernetes-validate --strict` (PyPI, pinned 1.37.0 by tests/k8s_venv.sh;
#    it bundles the API's JSON schemas) over every manifest for Kubernetes
#    1.37 (the newest that version bundles) and 1.27 (the oldest we support:
#    gRPC probes went GA there). Every document of every file must pass.
# 2. It can fail: a copy with an unknown field is rejected under --strict (and
#    passes without it, which is why we use --strict); a copy with a wrong
#    type is rejected.
# 3. tests/k8s_manifest_facts.py: replicas == entries in --ps_hosts /
#    --worker_hosts, host names are the headless Services' pod names, the
#    probes' port is the port the flags give the task, the drain fits the
#    readiness period and the grace period, the GPU variant is the CPU worker
#    plus `nvidia.com/gpu: 1`, the container's `sh -c` command really expands
#    to the right argv for pod X-1 in namespace ns1 (run under /bin/sh with
#    printf in place of the binary), ... And broken copies fail it, naming
#    the fact.
#
# Python with kubernetes-validate: $TOWERPS_K8S_PYTHON if it imports it
# (tests/run.sh passes it with --test_env), else the venv tests/k8s_venv.sh
# makes once (PyPI on the first run; tagged requires-network).
set -uo pipefail

K8S_DIR="${PWD}/deploy/k8s"
FACTS="${PWD}/tests/k8s_manifest_facts.py"
VERSIONS=(1.37.0 1.27.0)
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/k8s.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
die() { echo "FAIL: $*" >&2; exit 1; }

has_kv() { [[ -n "$1" ]] && "$1" -c 'import kubernetes_validate, yaml' >/dev/null 2>&1; }
if has_kv "${TOWERPS_K8S_PYTHON:-}"; then
  PY="$TOWERPS_K8S_PYTHON"
else
  . "${PWD}/tests/k8s_venv.sh"
  has_kv "$K8S_PYTHON" || die "no python with kubernetes-validate (needs PyPI on the first run)"
  PY="$K8S_PYTHON"
fi
echo "python: $PY, kubernetes-validate $("$PY" -m kubernetes_validate --version)"

# kv ARGS...: kubernetes-validate; output in $KV_OUT, exit status returned.
kv() { KV_OUT=$("$PY" -m kubernetes_validate "$@" 2>&1); }

# The manifests: every YAML file under deploy/k8s (the BUILD glob), and the
# three the facts check must be among them.
mapfile -t FILES < <(cd "$K8S_DIR" && find -L . -name '*.yaml' | sed 's|^\./||' | sort)
echo "manifests: ${FILES[*]}"
for f in ps.yaml worker.yaml gpu/worker.yaml state.yaml; do
  [[ " ${FILES[*]} " == *" $f "* ]] || die "deploy/k8s/$f is missing"
done

echo "== kubernetes-validate --strict, Kubernetes ${VERSIONS[*]}"
for v in "${VERSIONS[@]}"; do
  for f in "${FILES[@]}"; do
    docs=$("$PY" -c 'import sys, yaml; print(sum(d is not None for d in yaml.safe_load_all(open(sys.argv[1]))))' \
      "$K8S_DIR/$f") || { fail "$f: not YAML"; continue; }
    if kv --strict --kubernetes-version "$v" "$K8S_DIR/$f"; then
      n=$(grep -c "passed for resource" <<<"$KV_OUT")
      if [[ "$docs" -gt 0 && "$n" -eq "$docs" ]]; then
        pass "$f: $n of $docs resources valid for Kubernetes $v"
      else
        fail "$f: $n of $docs resources reported valid for Kubernetes $v: $KV_OUT"
      fi
    else
      fail "$f (Kubernetes $v): $KV_OUT"
    fi
  done
done

# broken NAME FILE SED_EXPRESSION: a copy of the manifests with FILE edited;
# prints the copy's folder. The edit must change the file.
broken() {
  local d="$TMP/$1"
  mkdir -p "$d" && cp -rL "$K8S_DIR/." "$d/" && chmod -R u+w "$d"
  sed -i "$3" "$d/$2"
  if cmp -s "$K8S_DIR/$2" "$d/$2"; then die "broken copy $1: the edit of $2 changed nothing"; fi
  echo "$d"
}

echo "== broken copies are rejected"
V="${VERSIONS[0]}"
d=$(broken unknown_field ps.yaml 's/publishNotReadyAddresses:/publishNotReadyAddress:/') || exit 1
if kv --strict --kubernetes-version "$V" "$d/ps.yaml"; then
  fail "an unknown field (publishNotReadyAddress) passed --strict: $KV_OUT"
elif grep -q "'publishNotReadyAddress' was unexpected" <<<"$KV_OUT"; then
  pass "unknown field rejected: $(grep -m1 ERROR <<<"$KV_OUT")"
else
  fail "unknown field: rejected, but not naming it: $KV_OUT"
fi
if kv --kubernetes-version "$V" "$d/ps.yaml"; then
  pass "the same copy passes without --strict (which is why the test uses --strict)"
else
  fail "the unknown-field copy failed without --strict too: $KV_OUT"
fi
d=$(broken wrong_type worker.yaml 's/^  replicas: 2$/  replicas: two/') || exit 1
if kv --strict --kubernetes-version "$V" "$d/worker.yaml"; then
  fail "replicas: two passed: $KV_OUT"
elif grep -q "replicas" <<<"$KV_OUT"; then
  pass "wrong type rejected: $(grep -m1 ERROR <<<"$KV_OUT")"
else
  fail "wrong type: rejected, but not naming replicas: $KV_OUT"
fi

echo "== facts the schema cannot check (tests/k8s_manifest_facts.py)"
if out=$("$PY" "$FACTS" "$K8S_DIR" 2>&1); then pass "$out"; else fail "$out"; fi

# broken_facts NAME FILE SED WANT: the facts check must fail on the copy,
# with a FAIL line containing WANT.
broken_facts() {
  local d out
  d=$(broken "$1" "$2" "$3") || exit 1
  if out=$("$PY" "$FACTS" "$d" 2>&1); then
    fail "$1: the facts check passed a broken copy: $out"
  elif grep "^FAIL:" <<<"$out" | grep -qF -- "$4"; then
    pass "$1 caught: $(grep -m1 -F -- "$4" <<<"$out")"
  else
    fail "$1: failed, but not on '$4': $out"
  fi
}
broken_facts ps_replicas ps.yaml 's/^  replicas: 2$/  replicas: 3/' "replicas (3) == entries in PS_HOSTS (2)"
broken_facts probe_port worker.yaml '/readinessProbe:/,/command:/ s/127.0.0.1:2222/127.0.0.1:2223/' \
  "readinessProbe asks 127.0.0.1:2222, the WORKER_HOSTS port"
broken_facts worker_hosts ps.yaml 's/worker-1.worker/worker-2.worker/' "WORKER_HOSTS is the same"
broken_facts grace worker.yaml 's/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: 6/' \
  "terminationGracePeriodSeconds (6) >= --drain_s + 10"
broken_facts env_typo ps.yaml 's/--ps_hosts="\$PS_HOSTS"/--ps_hosts="$PS_HOST"/' \
  "pod ps-1 in ns1 runs /usr/local/bin/ps"
broken_facts shared_state state.yaml 's/\["ReadWriteMany"\]/["ReadWriteOnce"]/' \
  "towerps-state is ReadWriteMany"
broken_facts stop_timeout worker.yaml 's/--stop_checkpoint_timeout_s=8/--stop_checkpoint_timeout_s=20/' \
  "--stop_checkpoint_timeout_s (20) < --drain_s (10.0)"
# Issue 15: a ps writes shards only under its --state_dir, the shared volume.
broken_facts ps_state_dir ps.yaml 's|--state_dir=/var/lib/towerps|--state_dir=/tmp/x|' \
  "--state_dir /tmp/x is the shared volume's /var/lib/towerps"
# Issue 15: mutual TLS and the token on every task, the probes over TLS.
broken_facts plaintext_probe ps.yaml '/livenessProbe:/,/periodSeconds:/ s|exec:|grpc:|; /livenessProbe:/,/periodSeconds:/ s|command: .*|port: 2222|' \
  "livenessProbe execs towerctl health"
broken_facts no_token worker.yaml '/--auth_token_file=/d' "TLS and token flags from /etc/towerps/tls"
broken_facts tls_secret ps.yaml 's/secretName: towerps-tls/secretName: other/' \
  "Secret towerps-tls mounted read-only at /etc/towerps/tls"
broken_facts gpu_drift gpu/worker.yaml 's/memory: 8Gi/memory: 16Gi/' \
  "gpu/worker.yaml == worker.yaml apart from nvidia.com/gpu"

if [[ "$FAILS" -gt 0 ]]; then
  echo "k8s_manifests_test: $FAILS check(s) failed"
  exit 1
fi
echo "k8s_manifests_test: every check passed"
