#!/usr/bin/env bash
# On the GPU machine, from the repository root, with gpu-bundle/ carried
# (see tests/gpu/package.sh): the GPU tests, training runs on the GPU (MLP
# with 1 and 4 towers on virtual GPUs; the dense stack split over 12 virtual
# GPUs in the classic layout; towers pipelined), then the benchmark with its
# GPU rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=/tmp/gpu-bundle
mkdir -p "$B" && tar -C "$B" -xJf gpu-bundle/gpu-bundle.tar.xz
# cudart, cuBLAS, NCCL and cuDNN from the machine's CUDA toolkit or its pip
# wheels (nvidia/cudnn/lib).
cuda_dirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null) \
  2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$B/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}"
# The machine's own libstdc++/libgcc_s unless they are too old for these
# binaries; then the bundle's (Debian 12's, which need glibc 2.36).
unresolved() { for b in "$B"/bin/*; do ldd "$b" 2>&1; done | grep "not found" | sort -u; }
if [ -n "$(unresolved)" ]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$B/lib-fallback"
  echo "using the bundle's C++ runtime ($B/lib-fallback)"
fi
if [ -n "$(unresolved)" ]; then
  echo "cannot run the bundle here ($(ldd --version | head -n 1)):"
  unresolved
  exit 1
fi
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
# Where nvidia-smi lists a GPU, a GPU test that finds none fails instead of
# skipping (a driver too old for the CUDA runtime, a stub libcuda).
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then export TOWERPS_REQUIRE_GPU=1; fi
rc=0
for t in cublas_lib_test cudnn_lib_test backend_cuda_test backend_cuda_conv_test nccl_reduce_test cuda_memory_test; do
  echo "== $t"
  $B/bin/$t || rc=1
done
# One ps and one worker on loopback; prints the worker's placement and final lines.
train() {
  local name="$1"; shift
  local p1=$((20000 + RANDOM % 20000)) p2=$((40000 + RANDOM % 20000))
  local hosts=(--ps_hosts=127.0.0.1:$p1 --worker_hosts=127.0.0.1:$p2)
  echo "== train: $name: $*"
  timeout 300 $B/bin/ps "${hosts[@]}" --job_name=ps >/tmp/ps_$name.log 2>&1 &
  local ps=$!
  timeout 300 $B/bin/worker "${hosts[@]}" --job_name=worker --task_index=0 --data_dir=$B/data \
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
$B/bin/worker_throughput --seconds="${SECONDS_PER_ROW:-2}" --towers=1,4 || rc=1
exit $rc
