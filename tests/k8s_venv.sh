# Sourced by tests/run.sh, tests/flake.sh and tests/k8s_manifests_test.sh:
# makes (once) the venv with PyPI's `kubernetes-validate` (which bundles the
# Kubernetes JSON schemas, so validation is offline; PyYAML comes with it) and
# sets K8S_PYTHON to its python, or to "" if it cannot be made (no network on
# the first run). Pinned: the test states the Kubernetes versions it checks,
# and 1.37.0 bundles schemas up to 1.37. The venv lives at
# ${TOWERPS_CACHE_DIR:-$HOME/.cache/towerps}/k8s-venv (/tmp/towerps-cache when
# HOME is unset); the lock keeps concurrent runs apart, and .complete,
# written last, marks a finished install.
K8S_VALIDATE_PIN="kubernetes-validate==1.37.0"
if [[ -n "${TOWERPS_CACHE_DIR:-}" ]]; then
  K8S_CACHE="$TOWERPS_CACHE_DIR"
elif [[ -n "${HOME:-}" ]]; then
  K8S_CACHE="$HOME/.cache/towerps"
else
  K8S_CACHE=/tmp/towerps-cache
fi
K8S_VENV="$K8S_CACHE/k8s-venv"
K8S_PYTHON="$K8S_VENV/bin/python"
mkdir -p "$K8S_CACHE"
( flock -w 600 9 || exit 1
  if [ ! -f "$K8S_VENV/.complete" ] || [ "$(cat "$K8S_VENV/.complete")" != "$K8S_VALIDATE_PIN" ] ||
     ! "$K8S_PYTHON" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    echo "creating $K8S_VENV: pip install $K8S_VALIDATE_PIN" >&2
    rm -rf "$K8S_VENV" && python3 -m venv "$K8S_VENV" &&
      "$K8S_PYTHON" -m pip install --quiet "$K8S_VALIDATE_PIN" &&
      echo "$K8S_VALIDATE_PIN" >"$K8S_VENV/.complete"
  fi ) 9>"$K8S_CACHE/k8s-venv.lock" || {
  echo "warning: no kubernetes-validate venv at $K8S_VENV (needs PyPI on the first run)" >&2
  K8S_PYTHON=""
}
