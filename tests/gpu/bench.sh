#!/usr/bin/env bash
# On the GPU machine (see tests/gpu/package.sh), after or instead of
# tests/gpu/run.sh: the issue-16 benchmarks on a machine whose cores are not
# the limit (16 there, 2 on the build machine): the step breakdown of a local
# cluster with CPU towers and with GPU towers, and ps_throughput at the
# README's shapes. Reports numbers; asserts nothing.
#
#   bash tests/gpu/bench.sh [cpu_breakdown] [gpu_breakdown] [ps_throughput]
#       [threads] [cpu_breakdown_blas4] [resnet18] [diag]
# threads: the compute alone at each CPU math thread count (what the
# breakdown's "alone" column should be read against); cpu_breakdown_blas4:
# the MLP breakdown with 4 BLAS threads per worker; resnet18: ResNet-18 on
# Fashion-MNIST on the GPU, one ps and one worker (RESNET_EPOCHS, default 10);
# diag: the machine's CPUs, the MLP's compute alone at each thread count, and
# where the cores go, by thread (tests/bench/thread_cpu.py), while 1- and
# 2-worker SYNC MLP clusters train, each with OpenBLAS's default idle spin
# and with OPENBLAS_THREAD_TIMEOUT=4 (its pool threads sleep almost at once).
set -uo pipefail
cd "$(dirname "$0")/../.."
# Under the device tool, the whole output also in $OUT (see run.sh).
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then exec > >(tee -a "$OUT/gpu_bench.log") 2>&1; fi
source tests/gpu/env.sh
export TOWERPS_BIN_DIR="$T"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(cpu_breakdown ps_throughput gpu_breakdown)
echo "cores: $(nproc)"
for part in "${parts[@]}"; do
  echo "== $part"
  case "$part" in
    cpu_breakdown)
      timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
        --epochs="${EPOCHS:-2}" --out=/tmp/sb_cpu ;;
    gpu_breakdown)
      timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
        --epochs="${EPOCHS:-2}" --shapes="${SHAPES:-1:sync,2:sync,1:async,2:async}" \
        --worker_flags="--virtual_devices=GPU:0=8000x1 --log_device_placement" \
        --alone_devices=gpu --out=/tmp/sb_gpu
      # Where the towers ran and how they were reduced.
      grep -h -E "tower|reduction" /tmp/sb_gpu/*/worker0.log | sort | uniq -c ;;
    cpu_breakdown_blas4)
      timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh --models=mlp \
        --shapes=1:sync,2:sync,1:async --epochs="${EPOCHS:-2}" --worker_flags="--blas_threads=4" \
        --out=/tmp/sb_blas4 ;;
    threads)
      "$T/tests/bench/worker_throughput" --models=mlp,dense_stack --devices=cpu --towers=1 \
        --threads=1,2,4,8,16 --seconds=1
      "$T/tests/bench/worker_throughput" --models=mlp --devices=cpu --towers=1 \
        --threads=1,2,4,8 --batch=128 --seconds=1 | grep -E '^cpu' ;;
    resnet18)
      p=$(python3 deploy/free_ports.py 2 | tr -d ' ')
      hosts=(--ps_hosts=127.0.0.1:${p%%,*} --worker_hosts=127.0.0.1:${p##*,})
      "$B/bin/ps" "${hosts[@]}" --job_name=ps --state_dir=/tmp/resnet_state >/tmp/resnet_ps.log 2>&1 &
      ps_pid=$!
      timeout "${RESNET_TIMEOUT_S:-400}" "$B/bin/worker" "${hosts[@]}" --job_name=worker \
        --task_index=0 --model=resnet18 --epochs="${RESNET_EPOCHS:-10}" \
        --virtual_devices="GPU:0=40000x1" --log_every_steps=47 --state_dir=/tmp/resnet_state 2>&1 \
        | while IFS= read -r line; do echo "$(date +%s) $line"; done
      kill "$ps_pid" 2>/dev/null; wait "$ps_pid" 2>/dev/null ;;
    ps_throughput)
      for shape in "--servers=1 --workers=1 --model_bytes=67108864" "--servers=2 --workers=1" \
                   "--servers=2 --workers=2 --mode=sync"; do
        echo "-- ps_throughput $shape"
        # shellcheck disable=SC2086
        timeout "${PS_THROUGHPUT_TIMEOUT_S:-90}" "$T/tests/bench/ps_throughput" --rounds=20 $shape
      done ;;
    diag)
      lscpu | grep -E '^(CPU\(s\)|Model name|Thread|Core|Socket|NUMA node\(s\))' || true
      cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null || true
      ls "$B/lib" | grep -i -E 'blas|gomp|dnnl' || true
      for spin in default 4; do
        envs=(); [ "$spin" != default ] && envs=(OPENBLAS_THREAD_TIMEOUT="$spin")
        echo "-- OPENBLAS_THREAD_TIMEOUT=$spin: MLP compute alone, batch 256 and 128"
        env "${envs[@]}" "$T/tests/bench/worker_throughput" --models=mlp --devices=cpu --towers=1 \
          --threads=1,4,8,16 --batch=256 --seconds=1 | grep -E '^cpu'
        env "${envs[@]}" "$T/tests/bench/worker_throughput" --models=mlp --devices=cpu --towers=1 \
          --threads=1,4,8 --batch=128 --seconds=1 | grep -E '^cpu'
        for w in 1 2; do
          echo "-- OPENBLAS_THREAD_TIMEOUT=$spin: MLP, $w worker(s), sync, 2 ps: threads while it trains"
          d=/tmp/diag-$spin-$w; rm -rf "$d"; mkdir -p "$d"
          env "${envs[@]}" TOWERPS_LOG_DIR="$d" timeout 120 deploy/local_cluster.sh --ps=2 --workers=$w \
            --mode=sync --model=mlp -- --epochs=$((24 / w)) >"$d/launcher.log" 2>&1 &
          lc=$!
          deadline=$((SECONDS + 60))
          until grep -q 'step 100/' "$d/worker0.log" 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
          python3 tests/bench/thread_cpu.py --seconds=2
          wait $lc; grep -h -E 'per step|final:' "$d"/worker*.log "$d/launcher.log" | tail -n 3
        done
        echo "-- OPENBLAS_THREAD_TIMEOUT=$spin: step breakdown"
        env "${envs[@]}" timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh --models=mlp \
          --shapes=1:sync,2:sync --epochs="${EPOCHS:-2}" --out=/tmp/sb_spin_$spin
      done ;;
    *) echo "bench.sh: unknown part \"$part\"" >&2; exit 2 ;;
  esac
done
