# Sourced by tests/run.sh and tests/flake.sh: makes (once) the venv with the
# `tensorboard` pip package for //tests:tensorboard_test, outside Bazel, and
# sets TB_PYTHON to its python. Same venv, lock and marker as
# tests/tensorboard_test.sh uses when it has to make one itself.
TB_CACHE="${TOWERPS_CACHE_DIR:-${HOME:-/tmp}/.cache/towerps}"
TB_VENV="$TB_CACHE/tb-venv"
TB_PYTHON="$TB_VENV/bin/python"
mkdir -p "$TB_CACHE"
( flock 9
  if [ ! -f "$TB_VENV/.complete" ] || ! "$TB_PYTHON" -c 'import tensorboard' 2>/dev/null; then
    rm -rf "$TB_VENV" && python3 -m venv "$TB_VENV" &&
      "$TB_PYTHON" -m pip install --quiet tensorboard && touch "$TB_VENV/.complete"
  fi ) 9>"$TB_CACHE/tb-venv.lock" || echo "warning: no tensorboard venv; //tests:tensorboard_test will make one itself"
