#!/usr/bin/env bash
# ps_throughput at tiny shapes (see tests/bench/BUILD): each run must exit 0,
# which it does only when every row's `wrong` is 0, and its JSON must list
# the rows of the shape asked for. Bad flags must be refused with exit 2.
set -euo pipefail
B="$PWD/tests/bench/ps_throughput"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
FAILS=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }

run() {  # run NAME ARGS...: exit 0 and a JSON with a ps row with wrong 0
  local name="$1"; shift
  if "$B" --rounds=2 --warmup=1 --chunk_sizes=65536 --json="$TMP/$name.json" "$@" \
      >"$TMP/$name.log" 2>&1; then
    if python3 - "$TMP/$name.json" "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
args = dict(a[2:].split("=", 1) for a in sys.argv[2:])
paths = [r["path"] for r in d["rows"]]
assert paths == ["tcp", "grpc_echo_bytes", "grpc_echo_floats", "ps", "ps_shm"], paths
assert all(r["wrong"] == 0 for r in d["rows"]), d["rows"]
assert d["servers"] == int(args.get("servers", 2)), d
assert d["workers"] == int(args.get("workers", 1)), d
assert d["mode"] == args.get("mode", "async"), d
if "model_bytes" in args:
    assert d["model_bytes"] == int(args["model_bytes"]), d
PY
    then pass "$name: $*"; else fail "$name: JSON: $(cat "$TMP/$name.json")"; fi
  else
    fail "$name: exit $?: $(tail -n 5 "$TMP/$name.log")"
  fi
}
run one_by_one --model_bytes=262144 --servers=1 --workers=1
run async_2x3 --model_bytes=245760 --variables=6 --servers=3 --workers=2
run sync_2x2 --model_bytes=262144 --servers=2 --workers=2 --mode=sync
run mlp --model=mlp --servers=2 --workers=1

refused() {  # refused WANT ARGS...: exit 2 and a message containing WANT
  local want="$1" out rc=0; shift
  out=$("$B" "$@" 2>&1) || rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$want" <<<"$out"; then pass "refused $*: $out"
  else fail "$* : rc $rc, want 2 and '$want': $out"; fi
}
refused "--mode must be async or sync" --mode=fast
refused "--servers and --workers must be 1..16" --servers=0
refused "a multiple of 4 x --variables" --model_bytes=1000 --variables=3
[ "$FAILS" -eq 0 ] || { echo "$FAILS check(s) failed"; exit 1; }
echo "all checks passed"
