#!/usr/bin/env bash
# Flake check: runs every test N times and prints a table test -> passes/runs.
#   tests/flake.sh N [--load] [TARGET_PATTERN...]      (default pattern //...)
# Unit tests (cc_test) run N times each with --runs_per_test (two at a time,
# as in CI); the multi-process tests (sh_test: real ps/worker processes) run
# in a loop of N whole `bazel test` invocations, so that no two copies of one
# of them share the machine. --load keeps every core busy with spinning
# processes for the whole run (CI shares its 2 cores with other work).
# Exits non-zero when any run failed; logs of failed runs stay in
# bazel-testlogs (unit tests: run_K_of_N/) and are named at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
N="${1:-}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "usage: tests/flake.sh N [--load] [TARGET_PATTERN...]" >&2; exit 2; }
shift
LOAD=0 PATTERNS=()
for a in "$@"; do
  case "$a" in
    --load) LOAD=1 ;;
    *) PATTERNS+=("$a") ;;
  esac
done
[ ${#PATTERNS[@]} -gt 0 ] || PATTERNS=(//...)

deploy/setup.sh >/dev/null || exit 1
. tests/tb_venv.sh
. tests/health_venv.sh
. tests/k8s_venv.sh  # issue 14: kubernetes-validate for //tests:k8s_manifests_test
BUSY=()
cleanup() { for p in "${BUSY[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
if [ "$LOAD" = 1 ]; then
  for ((i = 0; i < $(nproc); i++)); do (while :; do :; done) & BUSY+=($!); done
  echo "flake: ${#BUSY[@]} busy loops beside the tests"
fi

union="${PATTERNS[0]}"
for p in "${PATTERNS[@]:1}"; do union+=" + $p"; done
query() { bazel query --noshow_progress "$1" 2>/dev/null | sort; }
# The docker test needs its own build (--config=cpu_image, as .ci/run runs
# it): named, not run here.
mapfile -t OWN_CONFIG < <(query "attr(tags, '\bdocker\b', tests($union))")
skip="attr(tags, gpu, $union) + attr(tags, '\bdocker\b', $union)"
mapfile -t UNIT < <(query "kind(cc_test, $union) except ($skip)")
mapfile -t MULTI < <(query "kind(sh_test, $union) except ($skip)")
[ ${#OWN_CONFIG[@]} -eq 0 ] ||
  echo "flake: not run (needs --config=cpu_image; see .ci/run): ${OWN_CONFIG[*]}"
ARGS=(--test_output=summary --test_summary=short --test_env=TOWERPS_TB_PYTHON="$TB_PYTHON"
      --test_env=TOWERPS_HEALTH_PYTHON="$HEALTH_PYTHON"
      --test_env=TOWERPS_K8S_PYTHON="$K8S_PYTHON")

declare -A PASS RUNS
FAILED_LOGS=()
start=$(date +%s)
if [ ${#UNIT[@]} -gt 0 ]; then
  echo "flake: ${#UNIT[@]} unit test targets x $N runs each"
  log=$(mktemp)
  bazel test "${ARGS[@]}" --runs_per_test="$N" --nocache_test_results "${UNIT[@]}" >"$log" 2>&1
  for t in "${UNIT[@]}"; do
    line=$(grep -E "^$t +" "$log" | tail -n 1)
    RUNS[$t]=$N
    if [[ "$line" =~ (FAILED|TIMEOUT|INCOMPLETE|NO\ STATUS)\ in\ ([0-9]+)\ out\ of\ ([0-9]+) ]]; then
      PASS[$t]=$(( BASH_REMATCH[3] - BASH_REMATCH[2] ))
      p="${t#//}"; FAILED_LOGS+=("bazel-testlogs/${p/://}/run_*_of_$N/test.log")
    elif [[ "$line" =~ PASSED ]]; then
      PASS[$t]=$N
    else
      PASS[$t]=0  # did not build, or no result at all
      FAILED_LOGS+=("$t: ${line:-no result (build failure?)}")
    fi
  done
  rm -f "$log"
fi
for ((r = 1; r <= N && ${#MULTI[@]} > 0; r++)); do
  echo "flake: multi-process tests, round $r of $N"
  log=$(mktemp)
  bazel test "${ARGS[@]}" --nocache_test_results "${MULTI[@]}" >"$log" 2>&1
  for t in "${MULTI[@]}"; do
    RUNS[$t]=$(( ${RUNS[$t]:-0} + 1 ))
    if grep -qE "^$t +PASSED" "$log"; then
      PASS[$t]=$(( ${PASS[$t]:-0} + 1 ))
    else
      PASS[$t]=$(( ${PASS[$t]:-0} ))
      d="$(mktemp -d /tmp/towerps-flake.XXXXXX)"
      p="${t#//}"; cp "bazel-testlogs/${p/://}/test.log" "$d/" 2>/dev/null
      cp "$log" "$d/bazel.log"
      FAILED_LOGS+=("$t round $r: $d")
    fi
  done
  rm -f "$log"
done

bad=0
printf '\n%-45s %s\n' "test" "passes/runs"
for t in "${UNIT[@]}" "${MULTI[@]}"; do
  printf '%-45s %s/%s\n' "$t" "${PASS[$t]}" "${RUNS[$t]}"
  [ "${PASS[$t]}" = "${RUNS[$t]}" ] || bad=$((bad + 1))
done
echo "flake: $(( $(date +%s) - start )) s$([ "$LOAD" = 1 ] && echo ", under load")"
if [ "$bad" -gt 0 ]; then
  echo "flake: $bad test(s) failed at least once; logs:"
  printf '  %s\n' "${FAILED_LOGS[@]}"
  exit 1
fi
echo "flake: every test passed every run"
