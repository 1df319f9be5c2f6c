#!/usr/bin/env bash
# deploy/docker-compose.yml alone and with deploy/docker-compose.host.yml
# pass `docker-compose config -q` (no engine needed), and the merged file
# says what the docker test relies on: every service on the host network,
# one loopback port each taken from TOWERPS_*_PORT, the same cluster
# addresses for every task, and mutual TLS + token on every task. A broken copy is refused, so the check can fail.
# Skipped, saying so, where docker-compose is not installed
# (deploy/setup.sh --compose; tests/run.sh runs it).
set -euo pipefail

if ! command -v docker-compose >/dev/null; then
  echo "SKIPPED: docker-compose is not installed (deploy/setup.sh --compose installs it)"
  exit 0
fi
MAIN=deploy/docker-compose.yml
HOST=deploy/docker-compose.host.yml
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
# Compose reads a .env file from the project directory and the environment:
# neither may change what is checked here.
unset TOWERPS_PS0_PORT TOWERPS_PS1_PORT TOWERPS_WORKER0_PORT TOWERPS_WORKER1_PORT TOWERPS_IMAGE \
  TOWERPS_SECRETS_DIR

if out=$(docker-compose -f "$MAIN" config -q 2>&1); then
  pass "$MAIN is valid"
else
  fail "$MAIN: $out"
fi
if out=$(docker-compose -f "$MAIN" -f "$HOST" config -q 2>&1); then
  pass "$MAIN + $HOST is valid"
else
  fail "$MAIN + $HOST: $out"
fi

# The merged configuration, with two ports chosen and two left to default.
TOWERPS_PS0_PORT=31000 TOWERPS_WORKER0_PORT=31002 \
  docker-compose -f "$MAIN" -f "$HOST" config >"$TMP/host.yml"
docker-compose -f "$MAIN" config >"$TMP/main.yml"
check=$(/usr/bin/python3 - "$TMP/main.yml" "$TMP/host.yml" <<'PY'
import sys, yaml
main = yaml.safe_load(open(sys.argv[1]))
host = yaml.safe_load(open(sys.argv[2]))
bad = []
want = {"ps0": "31000", "ps1": "22221", "worker0": "31002", "worker1": "22223"}
if set(main["services"]) != set(want):
    bad.append("services %s" % sorted(main["services"]))
for name, svc in main["services"].items():
    env = svc.get("environment", {})
    if svc.get("network_mode"):
        bad.append("%s: network_mode in the main file" % name)
    if env.get("FLAGS_ps_hosts") != "ps0:2222,ps1:2222" or env.get("FLAGS_worker_hosts") != "worker0:2222,worker1:2222":
        bad.append("%s: cluster %s" % (name, env))
    if not svc.get("init") or "healthcheck" not in svc or svc.get("restart") != "unless-stopped":
        bad.append("%s: init/healthcheck/restart missing" % name)
    if not any(str(v).startswith("state:/var/lib/towerps") for v in svc.get("volumes", [])):
        bad.append("%s: state volume not mounted" % name)
# Mutual TLS + token on every task: each reads the node certificate, key, CA,
# server name and token through --fromenv from files mounted as secrets, and
# towerctl (health check, exec) gets the client certificate.
secrets = {"towerps_ca", "towerps_node_cert", "towerps_node_key", "towerps_client_cert",
           "towerps_client_key", "towerps_token"}
if set(main.get("secrets", {})) != secrets:
    bad.append("top-level secrets %s" % sorted(main.get("secrets", {})))
tls_env = {"FLAGS_tls_cert": "/run/secrets/towerps_node_cert", "FLAGS_tls_key": "/run/secrets/towerps_node_key",
           "FLAGS_tls_ca": "/run/secrets/towerps_ca", "FLAGS_tls_server_name": "towerps",
           "FLAGS_auth_token_file": "/run/secrets/towerps_token",
           "TOWERCTL_TLS_CERT": "/run/secrets/towerps_client_cert",
           "TOWERCTL_TLS_KEY": "/run/secrets/towerps_client_key",
           "TOWERCTL_TLS_CA": "/run/secrets/towerps_ca", "TOWERCTL_TLS_SERVER_NAME": "towerps",
           "TOWERCTL_AUTH_TOKEN_FILE": "/run/secrets/towerps_token"}
for name, svc in main["services"].items():
    got = {(x["source"] if isinstance(x, dict) else x) for x in svc.get("secrets", [])}
    if got != secrets:
        bad.append("%s: secrets %s" % (name, sorted(got)))
    env = svc.get("environment", {})
    wrong = {k: env.get(k) for k, v in tls_env.items() if env.get(k) != v}
    if wrong:
        bad.append("%s: TLS environment %s" % (name, wrong))
    cmd = svc.get("command") or []
    fromenv = next((c.split("=", 1)[1].split(",") for c in cmd if str(c).startswith("--fromenv=")), [])
    missing = {"tls_cert", "tls_key", "tls_ca", "tls_server_name", "auth_token_file"} - set(fromenv)
    if missing:
        bad.append("%s: --fromenv lacks %s" % (name, sorted(missing)))
# The ps write checkpoint shards only under their own --state_dir, and the
# chief reads them under its own: the same folder, on the shared volume.
def flag(svc, name):
    cmd = svc.get("command") or []
    cmd = cmd.split() if isinstance(cmd, str) else cmd
    return next((c.split("=", 1)[1] for c in cmd if str(c).startswith(name + "=")), None)
dirs = {name: flag(svc, "--state_dir") for name, svc in main["services"].items() if name != "worker1"}
if len(set(dirs.values())) != 1 or None in dirs.values() or not str(dirs["ps0"]).startswith("/var/lib/towerps"):
    bad.append("--state_dir differs or is off the volume: %s" % dirs)
ps_hosts = "127.0.0.1:31000,127.0.0.1:22221"
worker_hosts = "127.0.0.1:31002,127.0.0.1:22223"
for name, port in want.items():
    svc = host["services"][name]
    env = svc["environment"]
    if svc.get("network_mode") != "host" or svc.get("networks"):
        bad.append("%s: not on the host network" % name)
    if env.get("FLAGS_bind_address") != "127.0.0.1:" + port or str(env.get("TOWERPS_PORT")) != port:
        bad.append("%s: bind %s port %s, want %s" % (name, env.get("FLAGS_bind_address"), env.get("TOWERPS_PORT"), port))
    if env.get("FLAGS_ps_hosts") != ps_hosts or env.get("FLAGS_worker_hosts") != worker_hosts:
        bad.append("%s: cluster %s %s" % (name, env.get("FLAGS_ps_hosts"), env.get("FLAGS_worker_hosts")))
print("ok" if not bad else "; ".join(bad))
PY
)
[ "$check" = ok ] && pass "merged config: host network, ports from TOWERPS_*_PORT, one cluster, TLS + token" || fail "merged config: $check"

# A broken file must be refused (a misspelt key), or the checks above prove nothing.
sed 's/^  ps0:$/  ps0:\n    restartt: always/' "$MAIN" >"$TMP/broken.yml"
if out=$(docker-compose -f "$TMP/broken.yml" config -q 2>&1); then
  fail "a misspelt key passed validation"
elif grep -q restartt <<<"$out"; then
  pass "a misspelt key is refused, named: $(head -1 <<<"$out")"
else
  fail "broken file refused without naming the key: $out"
fi

[ "$FAILS" -eq 0 ] || { echo "$FAILS check(s) failed"; exit 1; }
echo "all checks passed"
