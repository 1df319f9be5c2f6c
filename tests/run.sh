#!/usr/bin/env bash
# The project's test command: installs what is missing, then runs every test.
# Ends with a plain "N passed, N failed" line counted over Bazel test targets.
set -uo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh || exit 1
# TensorBoard (from PyPI) for //tests:tensorboard_test, made once outside
# Bazel; same venv, lock and marker as tests/tensorboard_test.sh uses.
TB_CACHE="${TOWERPS_CACHE_DIR:-${HOME:-/tmp}/.cache/towerps}"
TB_VENV="$TB_CACHE/tb-venv"
mkdir -p "$TB_CACHE"
( flock 9
  if [ ! -f "$TB_VENV/.complete" ] || ! "$TB_VENV/bin/python" -c 'import tensorboard' 2>/dev/null; then
    rm -rf "$TB_VENV" && python3 -m venv "$TB_VENV" &&
      "$TB_VENV/bin/python" -m pip install --quiet tensorboard && touch "$TB_VENV/.complete"
  fi ) 9>"$TB_CACHE/tb-venv.lock" || echo "warning: no tensorboard venv; //tests:tensorboard_test will make one itself"
log=$(mktemp)
bazel test --test_output=errors --test_summary=short --test_tag_filters=-gpu \
  --test_env=TOWERPS_TB_PYTHON="$TB_VENV/bin/python" //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
rm -f "$log"
echo "tests: $passed passed, $failed failed"
exit "$rc"
