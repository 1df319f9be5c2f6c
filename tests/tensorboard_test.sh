#!/usr/bin/env bash
# Our event files, read by TensorBoard itself: //tests:write_events writes
# known scalars and histograms, tests/tensorboard_check.py loads them with
# TensorBoard's loaders and with its own minimal TFRecord reader.
#
# Python with tensorboard:
#   1. $TOWERPS_TB_PYTHON, if set and it imports tensorboard (CI pre-creates
#      one and passes it with --test_env=TOWERPS_TB_PYTHON);
#   2. else a venv at ${TOWERPS_CACHE_DIR:-$HOME/.cache/towerps}/tb-venv
#      (/tmp/towerps-cache when HOME is unset), made once with the first
#      python3 on PATH and `pip install tensorboard` from PyPI, under flock so
#      that concurrent runs do not collide; reused afterwards.
# Needs the network on the first run only (tagged requires-network).
set -euo pipefail

die() { echo "FAIL: $*" >&2; exit 1; }

WRITE_EVENTS="${PWD}/tests/write_events"
CHECK_PY="${PWD}/tests/tensorboard_check.py"
[[ -x "$WRITE_EVENTS" ]] || die "missing $WRITE_EVENTS"
[[ -f "$CHECK_PY" ]] || die "missing $CHECK_PY"

has_tensorboard() { "$1" -c 'import tensorboard' >/dev/null 2>&1; }

find_python() {
  if [[ -n "${TOWERPS_TB_PYTHON:-}" ]]; then
    if has_tensorboard "$TOWERPS_TB_PYTHON"; then
      echo "using TOWERPS_TB_PYTHON=$TOWERPS_TB_PYTHON" >&2
      PY="$TOWERPS_TB_PYTHON"
      return
    fi
    echo "TOWERPS_TB_PYTHON=$TOWERPS_TB_PYTHON cannot import tensorboard; using the venv" >&2
  fi
  local cache
  if [[ -n "${TOWERPS_CACHE_DIR:-}" ]]; then
    cache="$TOWERPS_CACHE_DIR"
  elif [[ -n "${HOME:-}" ]]; then
    cache="$HOME/.cache/towerps"
  else
    cache=/tmp/towerps-cache
  fi
  local venv="$cache/tb-venv"
  mkdir -p "$cache" || die "cannot create $cache"
  (
    flock -w 600 9 || die "timed out waiting for the lock $cache/tb-venv.lock"
    # .complete is written last: a venv without it is a half-finished install.
    if [[ -f "$venv/.complete" ]] && has_tensorboard "$venv/bin/python"; then
      echo "reusing $venv" >&2
      exit 0
    fi
    local base
    base="$(command -v python3)" || die "no python3 on PATH"
    echo "creating $venv with $base ($("$base" --version 2>&1)); pip install tensorboard" >&2
    rm -rf "$venv"
    local start=$SECONDS
    "$base" -m venv "$venv" || die "python3 -m venv $venv failed"
    "$venv/bin/python" -m pip install --quiet tensorboard \
      || die "pip install tensorboard failed (needs PyPI on the first run)"
    has_tensorboard "$venv/bin/python" || die "tensorboard installed but does not import"
    touch "$venv/.complete"
    echo "venv ready in $((SECONDS - start)) s" >&2
  ) 9>"$cache/tb-venv.lock"
  PY="$venv/bin/python"
}

PY=""
find_python
echo "python: $PY; tensorboard $("$PY" -c 'import tensorboard; print(tensorboard.__version__)')"

LOG_DIR="$(mktemp -d "${TEST_TMPDIR:-/tmp}/tb_logs.XXXXXX")"
EVENT_FILE="$("$WRITE_EVENTS" "$LOG_DIR/run1")" || die "write_events failed"
[[ -f "$EVENT_FILE" ]] || die "write_events printed '$EVENT_FILE', which is no file"
echo "event file: $EVENT_FILE ($(wc -c <"$EVENT_FILE") bytes)"

"$PY" "$CHECK_PY" "$EVENT_FILE"
