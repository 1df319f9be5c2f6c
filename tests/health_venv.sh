# Sourced by tests/run.sh, tests/flake.sh and tests/health_test.sh: makes (once)
# the venv with PyPI's `grpcio-health-checking` (an independent
# grpc.health.v1 client) and sets HEALTH_PYTHON to its python, or to "" if it
# cannot be made (no network on the first run). The venv lives at
# ${TOWERPS_CACHE_DIR:-$HOME/.cache/towerps}/health-venv (/tmp/towerps-cache
# when HOME is unset); the lock keeps concurrent runs apart, and .complete,
# written last, marks a finished install.
if [[ -n "${TOWERPS_CACHE_DIR:-}" ]]; then
  HEALTH_CACHE="$TOWERPS_CACHE_DIR"
elif [[ -n "${HOME:-}" ]]; then
  HEALTH_CACHE="$HOME/.cache/towerps"
else
  HEALTH_CACHE=/tmp/towerps-cache
fi
HEALTH_VENV="$HEALTH_CACHE/health-venv"
HEALTH_PYTHON="$HEALTH_VENV/bin/python"
mkdir -p "$HEALTH_CACHE"
( flock -w 600 9 || exit 1
  if [ ! -f "$HEALTH_VENV/.complete" ] || ! "$HEALTH_PYTHON" -c 'import grpc_health.v1.health_pb2_grpc' 2>/dev/null; then
    echo "creating $HEALTH_VENV: pip install grpcio-health-checking" >&2
    rm -rf "$HEALTH_VENV" && python3 -m venv "$HEALTH_VENV" &&
      "$HEALTH_PYTHON" -m pip install --quiet grpcio-health-checking &&
      touch "$HEALTH_VENV/.complete"
  fi ) 9>"$HEALTH_CACHE/health-venv.lock" || {
  echo "warning: no grpcio-health-checking venv at $HEALTH_VENV (needs PyPI on the first run)" >&2
  HEALTH_PYTHON=""
}
