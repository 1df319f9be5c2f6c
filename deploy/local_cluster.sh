#!/usr/bin/env bash
# Starts a whole towerps cluster on loopback as a service (ps tasks, workers
# and the chief's JobService) and, unless --serve, submits one job with
# towerctl, follows it, and stops everything.
#
#   deploy/local_cluster.sh [--ps=2] [--workers=2] [--mode=sync|async]
#                           [--model=mlp|dense_stack|cnn_small|lenet|resnet18|resnet_cifar]
#                           [--base_port=PORT]
#                           [--state_dir=DIR] [--serve]
#                           [-- job flags for the submitted job, e.g. --epochs=1 or
#                               --compression=none|fp16|bf16|topk:RATIO,
#                               or worker flags such as --virtual_devices=CPU=4]
#
# Without --serve it ends with: final: test_accuracy=<x> test_loss=<y> steps=<n> wall_s=<t>
# With --serve it prints the chief's address (also in $LOG_DIR/chief_address)
# once every ps and worker serves, and keeps the cluster up until
# Ctrl-C/SIGTERM; submit with
#   TOWERCTL_CHIEF=<address> towerctl submit job.json --wait
# Every process it starts is stopped on exit, on Ctrl-C and on failure.
# TOWERPS_BIN_DIR=<dir with ps/ps, worker/worker, client/towerctl> skips the build;
# TOWERPS_PS_FLAGS="--flag=value ..." goes to every ps.
set -euo pipefail
cd "$(dirname "$0")/.."

NUM_PS=2 NUM_WORKERS=2 MODE=sync MODEL=mlp BASE_PORT="" SERVE=0 STATE_DIR=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ps=*) NUM_PS="${1#*=}" ;;
    --workers=*) NUM_WORKERS="${1#*=}" ;;
    --mode=*) MODE="${1#*=}" ;;
    --model=*) MODEL="${1#*=}" ;;
    --base_port=*) BASE_PORT="${1#*=}" ;;
    --state_dir=*) STATE_DIR="${1#*=}" ;;
    --serve) SERVE=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "local_cluster: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$NUM_PS" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --ps must be a positive integer" >&2; exit 2; }
[[ "$NUM_WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --workers must be a positive integer" >&2; exit 2; }

if [ -n "${TOWERPS_BIN_DIR:-}" ]; then
  BIN="$TOWERPS_BIN_DIR"
else
  # Build (and install what a fresh machine lacks) only when needed.
  if ! command -v bazel >/dev/null || ! pkg-config --exists grpc++ 2>/dev/null \
     || [ ! -d /usr/share/datasets/fashion-mnist ]; then
    deploy/setup.sh
  fi
  echo "local_cluster: building //ps:ps //worker:worker //client:towerctl ..."
  bazel build -c opt --ui_event_filters=-info,-stdout --noshow_progress //ps:ps //worker:worker //client:towerctl
  BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
fi

# Free ports (see free_ports.py for why not the kernel's port 0) unless a
# base port was given.
pick_ports() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/free_ports.py" "$1" | sed 's/\([0-9][0-9]*\)/127.0.0.1:\1/g'
}
if [ -n "$BASE_PORT" ]; then
  PS_HOSTS=$(seq -s, "$BASE_PORT" $((BASE_PORT + NUM_PS - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
  WORKER_HOSTS=$(seq -s, $((BASE_PORT + NUM_PS)) $((BASE_PORT + NUM_PS + NUM_WORKERS - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
else
  ALL=$(pick_ports $((NUM_PS + NUM_WORKERS)))
  PS_HOSTS=$(echo "$ALL" | cut -d, -f1-"$NUM_PS")
  WORKER_HOSTS=$(echo "$ALL" | cut -d, -f$((NUM_PS + 1))-)
fi
CHIEF=$(echo "$WORKER_HOSTS" | cut -d, -f1)

LOG_DIR="${TOWERPS_LOG_DIR:-$(mktemp -d /tmp/towerps.XXXXXX)}"
mkdir -p "$LOG_DIR"
STATE_DIR="${STATE_DIR:-$LOG_DIR/state}"
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo "local_cluster: stopping" >&2; exit 130' INT TERM

# Worker flags (devices, BLAS) go to the workers; job flags into the job.
WORKER_ONLY=() JOB_FLAGS=()
for f in "${EXTRA[@]}"; do
  case "$f" in
    --virtual_devices=*|--visible_devices=*|--log_device_placement*|--allow_soft_placement*|--layout=*|--blas_threads=*|--adapt_blas_threads*|--chunk_bytes=*|--shared_memory*|--same_host_calls*|--wait_timeout_s=*|--data_root=*)
      WORKER_ONLY+=("$f") ;;
    *) JOB_FLAGS+=("$f") ;;
  esac
done

COMMON=(--ps_hosts="$PS_HOSTS" --worker_hosts="$WORKER_HOSTS")
# TOWERPS_PS_FLAGS: more flags for every ps (word-split), e.g. "--blas_threads=4".
read -r -a PS_FLAGS <<<"${TOWERPS_PS_FLAGS:-}"
for ((i = 0; i < NUM_PS; i++)); do
  # The ps writes checkpoint shards only under its --state_dir: the chief's.
  "$BIN/ps/ps" "${COMMON[@]}" --job_name=ps --task_index=$i --state_dir="$STATE_DIR" \
    "${PS_FLAGS[@]}" >"$LOG_DIR/ps$i.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$LOG_DIR/ps$i.pid"
done
# Each worker gets an even share of the cores for its BLAS.
CORES=$(nproc)
export OPENBLAS_NUM_THREADS=$(( CORES / NUM_WORKERS > 0 ? CORES / NUM_WORKERS : 1 ))
for ((i = 0; i < NUM_WORKERS; i++)); do
  "$BIN/worker/worker" "${COMMON[@]}" --job_name=worker --task_index=$i --serve \
    --state_dir="$STATE_DIR" "${WORKER_ONLY[@]}" >"$LOG_DIR/worker$i.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$LOG_DIR/worker$i.pid"
done
# Wait until the chief answers (it loads its job store first).
for ((t = 0; t < 300; t++)); do
  if TOWERCTL_CHIEF="$CHIEF" "$BIN/client/towerctl" --timeout_s=2 list >/dev/null 2>&1; then break; fi
  if ! kill -0 "${PIDS[$NUM_PS]}" 2>/dev/null; then
    echo "local_cluster: the chief exited; see $LOG_DIR/worker0.log" >&2
    tail -n 5 "$LOG_DIR/worker0.log" >&2
    exit 1
  fi
  sleep 0.1
done
# And until every ps and worker serves (grpc.health.v1), so that the cluster
# is whole when it is announced (a ps that starts late would only hold up
# the first job's registration).
for addr in ${PS_HOSTS//,/ } ${WORKER_HOSTS//,/ }; do
  for ((; t < 300; t++)); do
    "$BIN/client/towerctl" --timeout_s=2 health "$addr" >/dev/null 2>&1 && break
    sleep 0.1
  done
done
echo "$CHIEF" >"$LOG_DIR/chief_address"
echo "local_cluster: $NUM_PS ps ($PS_HOSTS), $NUM_WORKERS workers ($WORKER_HOSTS); chief $CHIEF; logs in $LOG_DIR"

if [ "$SERVE" = 1 ]; then
  echo "local_cluster: serving; submit with: TOWERCTL_CHIEF=$CHIEF $BIN/client/towerctl submit JOB_FILE --wait"
  # Until a signal, or until a task dies.
  while true; do
    for p in "${PIDS[@]}"; do
      if ! kill -0 "$p" 2>/dev/null; then
        echo "local_cluster: process $p exited; see $LOG_DIR" >&2
      fi
    done
    sleep 2 &
    wait $! || true
  done
fi

# The job: the built-in model with the job flags, as JSON, via towerctl.
JOB_FILE="$LOG_DIR/job.json"
"$BIN/worker/worker" "${COMMON[@]}" --job_name=worker --task_index=0 --model="$MODEL" \
  --mode="$MODE" "${JOB_FLAGS[@]}" --print_job_spec >"$JOB_FILE"
set +e
TOWERCTL_CHIEF="$CHIEF" "$BIN/client/towerctl" --timeout_s=60 submit "$JOB_FILE" --wait
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "local_cluster: job failed (towerctl exit $rc); logs in $LOG_DIR" >&2
  tail -n 5 "$LOG_DIR"/*.log >&2 || true
fi
exit "$rc"
