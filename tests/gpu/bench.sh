#!/usr/bin/env bash
# On the GPU machine (see tests/gpu/package.sh), after or instead of
# tests/gpu/run.sh: the issue-16 benchmarks on a machine whose cores are not
# the limit (16 there, 2 on the build machine): the step breakdown of a local
# cluster with CPU towers and with GPU towers, and ps_throughput at the
# README's shapes. Reports numbers; asserts nothing.
#
#   bash tests/gpu/bench.sh [cpu_breakdown] [gpu_breakdown] [ps_throughput]
#       [threads] [cpu_breakdown_blas4] [resnet18] [diag] [grpc] [blas_core]
#       [threads_sweep] [ps_threads] [cpu_threads_ab] [thread_bits]
# threads: the compute alone at each CPU math thread count (what the
# breakdown's "alone" column should be read against); cpu_breakdown_blas4:
# the MLP breakdown with 4 BLAS threads per worker; resnet18: ResNet-18 on
# Fashion-MNIST on the GPU, one ps and one worker (RESNET_EPOCHS, default 10);
# diag: the machine's CPUs and where the cores go, by thread
# (tests/bench/thread_cpu.py), while 1- and 2-worker SYNC MLP clusters train
# on CPU towers, then their breakdown with OPENBLAS_THREAD_TIMEOUT=4 (its
# pool threads sleep almost at once); grpc: the MLP breakdown and the ps path
# under gRPC's own experiments (GRPC_EXPERIMENTS); blas_core: the kernels
# OpenBLAS chose for the CPU, and the MLP with each core type forced;
# threads_sweep: the CPU-tower breakdown of both models at several worker
# CPU math thread counts (SWEEP_THREADS for 1 worker, halved for 2): how much
# a team of BLAS threads as wide as the machine loses when the servers and
# the worker's own streams need cores during the overlapped compute;
# ps_threads: ps_throughput, 1 server, 64 MiB, at several --ps_blas_threads;
# cpu_threads_ab: the CPU-tower breakdown of both models with the worker's
# default CPU math threads (half the cores where a ps shares the host),
# with every core (cores / workers, the rule before), and with the default
# and 4 OpenBLAS threads on each ps, interleaved by shape.
# thread_bits: which CPU backend ops keep their bits at 1, 2, 4, 8 and 16
# threads (worker/device/thread_bits.cc) on this machine's CPU and kernels.
#
# The cpu_* parts hide the GPU from the workers (CUDA_VISIBLE_DEVICES=):
# where a GPU is present a worker puts its towers on it, so without that a
# "CPU" breakdown on this machine measures GPU towers.
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
      CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
        --epochs="${EPOCHS:-2}" --out=/tmp/sb_cpu ;;
    gpu_breakdown)
      timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
        --epochs="${EPOCHS:-2}" --shapes="${SHAPES:-1:sync,2:sync,1:async,2:async}" \
        --worker_flags="--virtual_devices=GPU:0=8000x1 --log_device_placement" --out=/tmp/sb_gpu
      # Where the towers ran and how they were reduced.
      grep -h -E "tower|reduction" /tmp/sb_gpu/*/worker0.log | sort | uniq -c ;;
    cpu_breakdown_blas4)
      CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh --models=mlp \
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
      # CPU towers (CUDA_VISIBLE_DEVICES= hides the GPU from the workers).
      lscpu | grep -E '^(CPU\(s\)|Model name|Thread|Core|Socket|NUMA node\(s\))' || true
      for w in 1 2; do
        echo "-- MLP, $w worker(s), sync, 2 ps, CPU towers: threads while it trains"
        d=/tmp/diag-$w; rm -rf "$d"; mkdir -p "$d"
        CUDA_VISIBLE_DEVICES= TOWERPS_LOG_DIR="$d" timeout 120 deploy/local_cluster.sh --ps=2 \
          --workers=$w --mode=sync --model=mlp -- --epochs=$((16 / w)) >"$d/launcher.log" 2>&1 &
        lc=$!
        deadline=$((SECONDS + 60))
        until grep -q 'step 100/' "$d/worker0.log" 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
        python3 tests/bench/thread_cpu.py --seconds=2
        wait $lc; grep -h -E 'CPU math|per step|final:' "$d"/worker*.log "$d/launcher.log" | tail -n 4
      done
      echo "-- OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's pool sleeps almost at once), CPU towers"
      OPENBLAS_THREAD_TIMEOUT=4 CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" \
        tests/bench/step_breakdown.sh --models=mlp --shapes=1:sync,2:sync --epochs="${EPOCHS:-2}" \
        --out=/tmp/sb_spin4 ;;
    blas_core)
      # Which kernels OpenBLAS picks for this CPU (by family and model: a
      # model it does not know falls back to Prescott's), and the MLP's
      # compute alone and CPU-tower breakdown with each kind forced. "default"
      # is what the binaries run: they start again with better kernels where
      # the library's choice is older than the CPU (common/blas_kernels.h;
      # OPENBLAS_VERBOSE=2 then prints "Core:" twice).
      grep -o -w -E 'avx512f|avx512bw|avx512vl|avx2|fma|avx' /proc/cpuinfo | sort | uniq -c
      cores=(default Prescott Haswell); grep -q -w avx512f /proc/cpuinfo && cores+=(SkylakeX)
      for core in "${cores[@]}"; do
        envs=(OPENBLAS_VERBOSE=2); [ "$core" != default ] && envs+=(OPENBLAS_CORETYPE="$core")
        echo "-- OPENBLAS_CORETYPE=$core"
        env "${envs[@]}" "$T/tests/bench/worker_throughput" --models=mlp,dense_stack --devices=cpu \
          --towers=1 --threads=1,16 --seconds=1 2>&1 | grep -E '^(cpu|Core)'
        [ "$core" = default ] && continue
        env "${envs[@]}" CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" \
          tests/bench/step_breakdown.sh --models=mlp --shapes=1:sync,2:sync --epochs="${EPOCHS:-2}" \
          --out=/tmp/sb_core_$core 2>&1 | grep -E '^(model|mlp)'
      done ;;
    grpc)
      # gRPC's own experiments (GRPC_EXPERIMENTS, read by the library) on
      # the MLP's step (towers where the worker puts them) and on the ps path.
      for exps in none tcp_frame_size_tuning,tcp_rcv_lowat,peer_state_based_framing,flow_control_fixes \
                  tcp_rcv_lowat,tcp_read_chunks; do
        e=$exps; [ "$e" = none ] && e=
        echo "-- GRPC_EXPERIMENTS=$exps"
        GRPC_EXPERIMENTS=$e timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
          --models=mlp --shapes=1:sync,2:sync --epochs="${EPOCHS:-2}" --out=/tmp/sb_grpc | grep -E '^(model|mlp)'
        GRPC_EXPERIMENTS=$e timeout "${PS_THROUGHPUT_TIMEOUT_S:-90}" "$T/tests/bench/ps_throughput" \
          --rounds=20 --servers=1 --workers=1 --model_bytes=16777216 | grep -E '^(path|tcp|grpc_|ps) '
      done ;;
    threads_sweep)
      for t in ${SWEEP_THREADS:-16 12 8 4}; do
        h=$(( t / 2 > 0 ? t / 2 : 1 ))
        echo "-- worker --blas_threads=$t (1 worker), $h (2 workers)"
        CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
          --models=mlp --shapes=1:sync,1:async --epochs=2 --worker_flags="--blas_threads=$t" \
          --out=/tmp/sb_sweep | grep -E '^mlp'
        CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
          --models=dense_stack --shapes=1:sync --epochs=8 --worker_flags="--blas_threads=$t" \
          --out=/tmp/sb_sweep | grep -E '^dense'
        CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
          --models=mlp --shapes=2:sync --epochs=2 --worker_flags="--blas_threads=$h" \
          --out=/tmp/sb_sweep | grep -E '^mlp'
      done ;;
    cpu_threads_ab)
      c=$(nproc)
      for shape in 1:sync 1:async 2:sync; do
        w=${shape%%:*}
        for variant in default all_cores ps4; do
          wf=""; pf=""
          [ "$variant" = all_cores ] && wf="--blas_threads=$((c / w))"
          [ "$variant" = ps4 ] && pf="--blas_threads=4"
          for m in mlp:2 dense_stack:8; do
            CUDA_VISIBLE_DEVICES= timeout "${BREAKDOWN_TIMEOUT_S:-240}" tests/bench/step_breakdown.sh \
              --models="${m%%:*}" --shapes="$shape" --epochs="${m#*:}" --worker_flags="$wf" \
              --ps_flags="$pf" --out=/tmp/sb_ab | grep -E '^(mlp|dense)' | sed "s/^/$variant /"
          done
        done
      done ;;
    ps_threads)
      for t in ${PS_SWEEP_THREADS:-1 4}; do
        echo "-- ps_throughput --ps_blas_threads=$t, 1 server, 1 worker, 64 MiB"
        timeout "${PS_THROUGHPUT_TIMEOUT_S:-90}" "$T/tests/bench/ps_throughput" --rounds=20 \
          --servers=1 --workers=1 --model_bytes=67108864 --ps_blas_threads="$t" | grep -E '^(path|tcp|grpc_echo_bytes|ps|ps_shm) '
      done ;;
    thread_bits)
      timeout "${THREAD_BITS_TIMEOUT_S:-120}" "$B/bin/thread_bits" 1,2,4,8,16 ;;
    *) echo "bench.sh: unknown part \"$part\"" >&2; exit 2 ;;
  esac
done
