#!/usr/bin/env bash
# The rooms' rules (docs/ARCHITECTURE.md), checked on the build graph and the
# headers. Prints each query and what it found; exits 1 on any violation.
#   tests/check_layers.sh
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0

check_query() {  # check_query <description> <query>: the query must be empty
  local out
  if ! out=$(bazel query --noshow_progress "$2" 2>/tmp/check_layers.err); then
    echo "check_layers: query failed: $2"; cat /tmp/check_layers.err; fail=1; return
  fi
  if [ -n "$out" ]; then
    echo "check_layers: FAIL: $1"; echo "  bazel query '$2':"; echo "$out" | sed 's/^/    /'
    fail=1
  else
    echo "check_layers: ok: $1"
  fi
}

check_query "common/ does not depend on worker/" 'deps(//common/...) intersect //worker/...'
check_query "ps/ does not depend on worker/" 'deps(//ps/...) intersect //worker/...'
check_query "client/ does not depend on worker/" 'deps(//client/...) intersect //worker/...'
check_query "client/ and ps/ do not depend on each other" \
  '(deps(//client/...) intersect //ps/...) + (deps(//ps/...) intersect //client/...)'
# Tests of worker/train may start an in-process ps (worker/train:local_ps_cluster,
# testonly); the worker's own code never links the ps.
check_query "worker/ code (not its tests) does not depend on ps/" \
  'deps(kind("cc_library|cc_binary", attr(testonly, 0, //worker/...))) intersect //ps/...'
check_query "ps/ code (not its tests) does not depend on worker/" \
  'deps(kind("cc_library|cc_binary", attr(testonly, 0, //ps/...))) intersect //worker/...'
check_query "worker/device does not depend on model, train or chief" \
  'deps(//worker/device/...) intersect (//worker/model/... + //worker/train/... + //worker/chief/...)'
check_query "worker/model does not depend on train or chief" \
  'deps(//worker/model/...) intersect (//worker/train/... + //worker/chief/...)'
check_query "worker/train does not depend on chief" \
  'deps(//worker/train/...) intersect //worker/chief/...'

cuda=$(git ls-files '*.h' | grep -v '^worker/device/' | xargs grep -liE 'cuda' 2>/dev/null)
if [ -n "$cuda" ]; then
  echo "check_layers: FAIL: headers outside worker/device/ mention CUDA:"; echo "$cuda" | sed 's/^/    /'
  fail=1
else
  echo "check_layers: ok: no header outside worker/device/ mentions CUDA"
fi
exit $fail
