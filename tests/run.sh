#!/usr/bin/env bash
# The project's test command: installs what is missing, then runs every test.
# Ends with a plain "N passed, N failed" line counted over Bazel test targets.
set -uo pipefail
cd "$(dirname "$0")/.."
# --compose (issue 14): docker-compose, for docker_compose_config_test.
deploy/setup.sh --compose || exit 1
. tests/tb_venv.sh
. tests/health_venv.sh
. tests/k8s_venv.sh  # issue 14: kubernetes-validate for //tests:k8s_manifests_test
log=$(mktemp)
bazel test --test_output=errors --test_summary=short --test_tag_filters=-gpu \
  --test_env=TOWERPS_TB_PYTHON="$TB_PYTHON" --test_env=TOWERPS_HEALTH_PYTHON="$HEALTH_PYTHON" \
  --test_env=TOWERPS_K8S_PYTHON="$K8S_PYTHON" \
  //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
rm -f "$log"
echo "tests: $passed passed, $failed failed"
exit "$rc"
