#!/usr/bin/env bash
# On the GPU machine, from the repository root, with gpu-bundle/ carried
# (see tests/gpu/package.sh): the GPU tests, training runs on the GPU (MLP
# with 1 and 4 towers on virtual GPUs; the dense stack split over 12 virtual
# GPUs in the classic layout; towers pipelined), then the benchmark with its
# GPU rows.
#
#   bash tests/gpu/run.sh [--tests_only]
# Under the device tool ($OUT set) the whole output is also kept in
# $OUT/gpu_run.log, since the tool returns only the end of what a command
# prints.
set -uo pipefail
cd "$(dirname "$0")/../.."
tests_only=0
[ "${1:-}" = "--tests_only" ] && tests_only=1
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then exec > >(tee -a "$OUT/gpu_run.log") 2>&1; fi
source tests/gpu/env.sh
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
rc=0
for t in cublas_lib_test cudnn_lib_test backend_cuda_test backend_cuda_conv_test nccl_reduce_test cuda_memory_test; do
  echo "== $t"
  # A test that hangs (a wedged driver call) fails instead of taking the
  # whole device lease.
  timeout "${TEST_TIMEOUT_S:-60}" $B/bin/$t || rc=1
done
[ "$tests_only" = 1 ] && exit $rc
# One ps and one worker on loopback; prints the worker's placement and final lines.
train() {
  local name="$1"; shift
  local p1=$((20000 + RANDOM % 20000)) p2=$((40000 + RANDOM % 20000))
  local hosts=(--ps_hosts=127.0.0.1:$p1 --worker_hosts=127.0.0.1:$p2)
  echo "== train: $name: $*"
  timeout "${TRAIN_TIMEOUT_S:-120}" $B/bin/ps "${hosts[@]}" --job_name=ps >/tmp/ps_$name.log 2>&1 &
  local ps=$!
  timeout "${TRAIN_TIMEOUT_S:-120}" $B/bin/worker "${hosts[@]}" --job_name=worker --task_index=0 --data_dir=$B/data \
    --log_every_steps=0 "$@" >/tmp/worker_$name.log 2>&1 || rc=1
  kill $ps 2>/dev/null; wait $ps 2>/dev/null
  grep -E "tower|reduction|micro|final:" /tmp/worker_$name.log | head -30
  grep -q '^final:' /tmp/worker_$name.log || { rc=1; tail -n 3 /tmp/worker_$name.log; }
}
train mlp_1_tower --virtual_devices="GPU:0=8000x4" --towers=1
train mlp_4_towers --virtual_devices="GPU:0=8000x4" --towers=4
train dense_stack_12 --model=dense_stack --virtual_devices="GPU:0=4000x12" --layout=classic \
  --log_device_placement --epochs=1
train dense_stack_pipeline --model=dense_stack --virtual_devices="GPU:0=4000x12" --layout=classic \
  --micro_batches=5 --epochs=1
echo "== worker_throughput"
timeout "${THROUGHPUT_TIMEOUT_S:-300}" $B/bin/worker_throughput --seconds="${SECONDS_PER_ROW:-2}" --towers=1,4 || rc=1
exit $rc
