#!/usr/bin/env bash
# Starts a whole towerps cluster on loopback, trains one job, stops everything.
#
#   deploy/local_cluster.sh [--ps=2] [--workers=2] [--mode=sync|async]
#                           [--model=mlp|dense_stack] [--base_port=PORT]
#                           [-- any extra worker flags, e.g. --epochs=1]
#
# Ends with the chief's line: final: test_accuracy=<x> test_loss=<y> steps=<n> wall_s=<t>
# Every process it starts is stopped on exit, on Ctrl-C and on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

NUM_PS=2 NUM_WORKERS=2 MODE=sync MODEL=mlp BASE_PORT=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ps=*) NUM_PS="${1#*=}" ;;
    --workers=*) NUM_WORKERS="${1#*=}" ;;
    --mode=*) MODE="${1#*=}" ;;
    --model=*) MODEL="${1#*=}" ;;
    --base_port=*) BASE_PORT="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "local_cluster: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$NUM_PS" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --ps must be a positive integer" >&2; exit 2; }
[[ "$NUM_WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --workers must be a positive integer" >&2; exit 2; }

# Build (and install what a fresh machine lacks) only when needed.
if ! command -v bazel >/dev/null || ! pkg-config --exists grpc++ 2>/dev/null \
   || [ ! -d /usr/share/datasets/fashion-mnist ]; then
  deploy/setup.sh
fi
echo "local_cluster: building //ps:ps //worker:worker ..."
bazel build -c opt --ui_event_filters=-info,-stdout --noshow_progress //ps:ps //worker:worker
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"

# Free ports: ask the kernel for them unless a base port was given.
pick_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(",".join("127.0.0.1:%d" % s.getsockname()[1] for s in socks))
PY
}
if [ -n "$BASE_PORT" ]; then
  PS_HOSTS=$(seq -s, "$BASE_PORT" $((BASE_PORT + NUM_PS - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
  WORKER_HOSTS=$(seq -s, $((BASE_PORT + NUM_PS)) $((BASE_PORT + NUM_PS + NUM_WORKERS - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
else
  ALL=$(pick_ports $((NUM_PS + NUM_WORKERS)))
  PS_HOSTS=$(echo "$ALL" | cut -d, -f1-"$NUM_PS")
  WORKER_HOSTS=$(echo "$ALL" | cut -d, -f$((NUM_PS + 1))-)
fi

LOG_DIR="${TOWERPS_LOG_DIR:-$(mktemp -d /tmp/towerps.XXXXXX)}"
mkdir -p "$LOG_DIR"
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo "local_cluster: interrupted" >&2; exit 130' INT TERM

COMMON=(--ps_hosts="$PS_HOSTS" --worker_hosts="$WORKER_HOSTS")
for ((i = 0; i < NUM_PS; i++)); do
  "$BIN/ps/ps" "${COMMON[@]}" --job_name=ps --task_index=$i >"$LOG_DIR/ps$i.log" 2>&1 &
  PIDS+=($!)
done
# Each worker gets an even share of the cores for its BLAS.
CORES=$(nproc)
export OPENBLAS_NUM_THREADS=$(( CORES / NUM_WORKERS > 0 ? CORES / NUM_WORKERS : 1 ))
WORKER_FLAGS=(--model="$MODEL" --mode="$MODE" "${EXTRA[@]}")
for ((i = 1; i < NUM_WORKERS; i++)); do
  "$BIN/worker/worker" "${COMMON[@]}" --job_name=worker --task_index=$i "${WORKER_FLAGS[@]}" \
    >"$LOG_DIR/worker$i.log" 2>&1 &
  PIDS+=($!)
done
echo "local_cluster: $NUM_PS ps ($PS_HOSTS), $NUM_WORKERS workers ($WORKER_HOSTS); logs in $LOG_DIR"
set +e
"$BIN/worker/worker" "${COMMON[@]}" --job_name=worker --task_index=0 "${WORKER_FLAGS[@]}" 2>&1 \
  | tee "$LOG_DIR/worker0.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "local_cluster: chief failed (exit $rc); logs in $LOG_DIR" >&2
  tail -n 5 "$LOG_DIR"/*.log >&2 || true
  exit "$rc"
fi
for ((i = 1; i < NUM_WORKERS; i++)); do
  if ! wait "${PIDS[$((NUM_PS + i - 1))]}"; then
    echo "local_cluster: worker $i failed; see $LOG_DIR/worker$i.log" >&2
    exit 1
  fi
done
