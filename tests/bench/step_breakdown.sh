#!/usr/bin/env bash
# step_breakdown: where a training step's time and a server's memory go, on a
# real local cluster (deploy/local_cluster.sh: ps and worker processes on
# loopback, a job submitted with towerctl), for each model and shape.
#
#   tests/bench/step_breakdown.sh [--models=mlp,dense_stack] [--ps=2]
#       [--shapes=1:sync,2:sync,1:async,2:async] [--epochs=1] [--max_steps=0]
#       [--out=DIR] [--worker_flags="--virtual_devices=GPU:0=8000x1"]
#       [--ps_flags="--blas_threads=4"] [--pin=WORKER_CPUS:PS_CPUS] [--repeats=1]
#
# Per run it prints one row from the logs the processes write:
#   - each worker's step breakdown (worker/train/trainer: compute = forward,
#     loss, backward and the towers' reduction; pull, and of it the time the
#     servers held the pull for its step, i.e. the sync barrier or the
#     staleness bound; push; other = batches, checkpoints, evaluation);
#   - step/c: a step's time over the compute measured inside it (1.0 =
#     communication fully hidden or free); c/step is the same as examples/s
#     of the whole step over examples/s of that compute;
#   - alone: the same worker's compute with no cluster around it
#     (tests/bench/worker_throughput at the worker's batch and CPU math
#     threads, on the device its towers ran on, as the chief's log says:
#     column "dev"; three runs of 1 s right after the cluster, in the same
#     window, the fastest taken: the least disturbed by the machine), and
#     step/alone = ms/step over it: what overlapping communication with
#     compute is measured against (inside a step, the compute shares the
#     cores with the communication, so it is slower than alone);
#   - each ps's peak resident memory (VmHWM, logged at exit) against the
#     bytes of values and optimizer slots it held (logged at register), raw
#     and net of the memory the same ps had with no job (gRPC, libraries)
#     and of the workers' shared segments it maps (their pages, in its VmHWM).
# --worker_flags go to every worker (devices, BLAS threads; word-split),
# --ps_flags to every ps (deploy/local_cluster.sh's TOWERPS_PS_FLAGS).
# --pin runs the workers (and worker_throughput) on WORKER_CPUS and the
# servers on PS_CPUS (taskset lists, e.g. --pin=0:1): on a small machine, a
# stand-in for servers with cores of their own.
# --repeats=N runs every model and shape N times, round by round (each round
# runs them all, so a machine that drifts disturbs every row alike), prints
# every run's row and, per model and shape, the median and the range of
# ms/step, alone, st/alone and tr/alone over the runs: on a shared machine
# one run's ratio can move more than the margin it is read against.
# Where a GPU is present the towers run on it unless the worker is told
# otherwise (CUDA_VISIBLE_DEVICES= hides it: CPU towers on a GPU machine).
# Not a test: nothing is asserted; numbers are reported. The binaries are
# built with -c opt unless TOWERPS_BIN_DIR names them.
set -euo pipefail
usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

MODELS=mlp,dense_stack
SHAPES=1:sync,2:sync,1:async,2:async
NUM_PS=2
EPOCHS=1
MAX_STEPS=0
OUT=""
WORKER_FLAGS=""
PS_FLAGS=""
PIN=""
REPEATS=1
for arg in "$@"; do
  case "$arg" in
    --models=*) MODELS="${arg#*=}" ;;
    --shapes=*) SHAPES="${arg#*=}" ;;
    --ps=*) NUM_PS="${arg#*=}" ;;
    --epochs=*) EPOCHS="${arg#*=}" ;;
    --max_steps=*) MAX_STEPS="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --worker_flags=*) WORKER_FLAGS="${arg#*=}" ;;
    --ps_flags=*) PS_FLAGS="${arg#*=}" ;;
    --pin=*) PIN="${arg#*=}" ;;
    --repeats=*) REPEATS="${arg#*=}" ;;
    -h|--help) usage 0 ;;
    *) echo "step_breakdown: unknown argument \"$arg\"" >&2; usage ;;
  esac
done
case "$REPEATS" in
  ''|*[!0-9]*|0)
    echo "step_breakdown: --repeats=$REPEATS: want a whole number of runs, 1 or more" >&2
    exit 2 ;;
esac
cd "$(dirname "$0")/../.."
if [ -z "${TOWERPS_BIN_DIR:-}" ]; then
  bazel build -c opt //ps:ps //worker:worker //client:towerctl //tests/bench:worker_throughput \
    >/dev/null 2>&1 \
    || { echo "step_breakdown: build failed" >&2; exit 1; }
  export TOWERPS_BIN_DIR="$PWD/bazel-bin"
fi
OUT="${OUT:-$(mktemp -d /tmp/step_breakdown.XXXXXX)}"
mkdir -p "$OUT"
if [ -n "$PIN" ]; then
  case "$PIN" in
    ?*:?*) ;;
    *) echo "step_breakdown: --pin=$PIN: want WORKER_CPUS:PS_CPUS, e.g. 0:1" >&2; exit 2 ;;
  esac
  # The same binaries, each started under taskset.
  TOWERPS_BIN_DIR="$(cd "$TOWERPS_BIN_DIR" && pwd)"
  pinned="$OUT/pinned-bin"
  mkdir -p "$pinned/ps" "$pinned/worker" "$pinned/client" "$pinned/tests/bench"
  ln -sf "$TOWERPS_BIN_DIR/client/towerctl" "$pinned/client/towerctl"
  for entry in "ps/ps:${PIN#*:}" "worker/worker:${PIN%%:*}" \
      "tests/bench/worker_throughput:${PIN%%:*}"; do
    bin="${entry%%:*}"
    printf '#!/bin/sh\nexec taskset -c %s "%s" "$@"\n' "${entry#*:}" "$TOWERPS_BIN_DIR/$bin" \
      >"$pinned/$bin"
    chmod +x "$pinned/$bin"
  done
  taskset -c "${PIN%%:*}" true && taskset -c "${PIN#*:}" true \
    || { echo "step_breakdown: --pin=$PIN: taskset refused the CPU lists" >&2; exit 2; }
  export TOWERPS_BIN_DIR="$pinned"
fi

rows="$OUT/rows.tsv"
: >"$rows"
IFS=, read -r -a models <<<"$MODELS"
IFS=, read -r -a shapes <<<"$SHAPES"
for round in $(seq 1 "$REPEATS"); do
  for model in "${models[@]}"; do
    for shape in "${shapes[@]}"; do
      workers="${shape%%:*}"
      mode="${shape#*:}"
      run="$OUT/$model-$workers-$mode"
      [ "$REPEATS" -gt 1 ] && run="$run-r$round"
      rm -rf "$run"
      mkdir -p "$run"
      job_flags=(--epochs="$EPOCHS")
      [ "$MAX_STEPS" -gt 0 ] && job_flags+=(--max_steps="$MAX_STEPS")
      read -r -a extra <<<"$WORKER_FLAGS"
      job_flags+=("${extra[@]}")
      if ! TOWERPS_PS_FLAGS="$PS_FLAGS" TOWERPS_LOG_DIR="$run" \
          timeout 900 deploy/local_cluster.sh --ps="$NUM_PS" \
          --workers="$workers" --mode="$mode" --model="$model" -- "${job_flags[@]}" \
          >"$run/launcher.log" 2>&1; then
        echo "step_breakdown: $model $workers workers $mode failed; see $run/launcher.log" >&2
        tail -n 5 "$run/launcher.log" >&2
        exit 1
      fi
      # The compute alone, at what each worker of the run computed: its batch,
      # its CPU math threads and the device of its towers (from the chief's
      # log lines: "N CPU math thread(s)", "reduction: ... (1 on cuda:0)").
      wt="$TOWERPS_BIN_DIR/tests/bench/worker_throughput"
      threads=$(grep -m1 -oE '[0-9]+ CPU math thread' "$run/worker0.log" | cut -d' ' -f1 || true)
      dev=cpu
      grep -m1 'reduction: ' "$run/worker0.log" | grep -q ' on cuda:' && dev=gpu
      global_batch=$(python3 -c \
        'import json, sys; print(json.load(open(sys.argv[1])).get("global_batch_size", 256))' \
        "$run/job.json" 2>/dev/null || echo 0)
      if [ -x "$wt" ] && [ -n "$threads" ] && [ "$global_batch" -gt 0 ]; then
        : >"$run/alone.txt"
        for _ in 1 2 3; do
          "$wt" --models="$model" --towers=1 --devices="$dev" --threads="$threads" \
            --batch=$((global_batch / workers)) --seconds=1 >>"$run/alone.txt" 2>&1 || true
        done
      fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$model" "$workers" "$mode" "$run" "$dev" >>"$rows"
    done
  done
done

python3 - "$rows" <<'PY'
import glob, os, re, sys

def read(path):
    with open(path, errors="replace") as f:
        return f.read()

STEP = re.compile(r"worker (\d+): (\d+) steps, per step ([\d.]+) ms: compute ([\d.]+) \(\d+%\), "
                  r"pull ([\d.]+) \((?:wait|servers held it) ([\d.]+)[^)]*\), push ([\d.]+), other ([\d.]+)"
                  r"(?: \((?:batches ([\d.]+), )?eval ([\d.]+)\))?(?:; process cpu ([\d.]+) cores)?")
LOOP = re.compile(r"worker \d+: (\d+) steps, per step ([\d.]+) ms")
CPU = re.compile(r"cpu time user ([\d.e+-]+) s, system ([\d.e+-]+) s")
# What start-up took (libraries, gRPC), logged once the ps listens: not the
# job's work.
CPU_START = re.compile(r"cpu time at start user ([\d.e+-]+) s, system ([\d.e+-]+) s")
# The cores a ps kept busy from its first update of the job to its last (at
# the job's delete): the same window as the worker's loop, less one step.
JOB_CPU = re.compile(r"process cpu from its first update to its last [\d.]+ s in [\d.]+ s "
                     r"\(([\d.]+) cores\)")
ALONE = re.compile(r"^(?:cpu|gpu)\S*\s+(\S+)\s+1\s+\d+\s+(\d+)\s+([\d.]+)", re.M)
print("%-11s %2s %-5s %3s %6s %7s %7s %13s %6s %6s %6s %6s %6s %6s %6s %7s %7s %5s %7s %6s | %8s %6s %8s %5s %5s | %8s" % (
    "model", "W", "mode", "dev", "steps", "ms/step", "compute", "pull (wait)", "push", "other",
    "batch", "eval", "step/c", "c/step", "alone", "st/alone", "tr/alone", "cores", "wall_s", "acc", "ps MB",
    "shm MB", "held MB", "x", "x net", "worker MB"))
# Per model and shape, each run's ms/step, alone, st/alone and tr/alone.
runs_of = {}
for line in open(sys.argv[1]):
    model, workers, mode, run, dev = line.rstrip("\n").split("\t")
    final = re.search(r"final: test_accuracy=(\S+) test_loss=\S+ steps=\d+ wall_s=([\d.]+)",
                      read(os.path.join(run, "launcher.log")))
    acc, wall = (final.group(1), float(final.group(2))) if final else ("?", float("nan"))
    bds, worker_peak = [], []
    for log in sorted(glob.glob(os.path.join(run, "worker*.log"))):
        text = read(log)
        m = STEP.findall(text)
        if m:
            bds.append([float(x) if x else float("nan") for x in m[-1][1:]])
        p = re.findall(r"peak resident memory \(VmHWM\) (\d+) bytes", text)
        if p:
            worker_peak.append(int(p[-1]))
    ps_rows, ps_cpu, ps_cores = [], [], []
    for log in sorted(glob.glob(os.path.join(run, "ps*.log"))):
        text = read(log)
        held = re.findall(r"registered: \d+ variables, (\d+) bytes, optimizer slots (\d+) bytes",
                          text)
        peak = re.findall(r"peak resident memory \(VmHWM\) (\d+) bytes", text)
        idle = re.findall(r"resident memory with no job (\d+) bytes", text)
        # Workers' segments mapped by the ps: their pages count in its VmHWM.
        shm = re.findall(r"shared segments mapped here [^;]*? at most (\d+) bytes", text)
        if held and peak and idle:
            ps_rows.append((int(peak[-1]), int(held[-1][0]) + int(held[-1][1]), int(idle[-1]),
                            int(shm[-1]) if shm else 0))
        in_job = JOB_CPU.findall(text)
        cpu = CPU.findall(text)
        if in_job:
            ps_cores.append(float(in_job[-1]))
        elif cpu:
            at_start = CPU_START.findall(text)
            ps_cpu.append(float(cpu[-1][0]) + float(cpu[-1][1]) -
                          (float(at_start[0][0]) + float(at_start[0][1]) if at_start else 0))
    if not bds:
        print("%-11s %2s %-5s  (no breakdown line in the worker logs: %s)" % (model, workers, mode, run))
        continue
    # The slowest worker's figures (in sync they wait for each other).
    steps, step_ms, comp, pull, wait, push, other, batch, evl, _ = max(bds, key=lambda b: b[1])
    evl = 0.0 if evl != evl else evl  # a worker without the eval figure: none counted
    # Cores kept busy during the training loop: every worker's process
    # (measured over its loop) plus every ps's over its first to last update
    # of the job (its log). A ps whose log has no such line (one step, or an
    # older binary): its CPU time past its start-up over the loop's length,
    # which counts its work on the job before and after the loop too (2.3
    # cores busy of 2, a 1-worker MLP run).
    loop_s = steps * step_ms / 1e3
    cores = (sum(b[9] for b in bds) + sum(ps_cores) +
             (sum(ps_cpu) / loop_s if loop_s > 0 else 0))
    worst = (max(ps_rows, key=lambda r: (r[0] - r[3]) / max(1, r[1])) if ps_rows
             else (0, 1, 0, 0))
    alone = float("nan")
    alone_path = os.path.join(run, "alone.txt")
    if os.path.exists(alone_path):
        # The fastest of the runs: the compute least disturbed by the machine.
        runs = [1e3 * int(b) / float(r) for _, b, r in ALONE.findall(read(alone_path))
                if float(r) > 0]
        if runs:
            alone = min(runs)
    runs_of.setdefault((model, workers, mode, dev), []).append(
        (step_ms, alone, step_ms / alone, (step_ms - evl) / alone))
    print("%-11s %2s %-5s %3s %6d %7.2f %7.2f %6.2f (%4.2f) %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %7.2f %7.2f %5.2f %7.1f %6s | %8.1f %6.1f %8.1f %5.1f %5.1f | %8.1f" % (
        model, workers, mode, dev, steps, step_ms, comp, pull, wait, push, other, batch, evl,
        step_ms / comp if comp else float("nan"), comp / step_ms if step_ms else float("nan"),
        alone, step_ms / alone, (step_ms - evl) / alone, cores,
        wall, acc, worst[0] / 1e6, worst[3] / 1e6, worst[1] / 1e6, worst[0] / max(1, worst[1]),
        (worst[0] - worst[3] - worst[2]) / max(1, worst[1]), max(worker_peak or [0]) / 1e6))
if any(len(r) > 1 for r in runs_of.values()):
    def median(xs):
        xs = sorted(xs)
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    print()
    print("%-11s %2s %-5s %3s %4s | %s" % ("model", "W", "mode", "dev", "runs", " | ".join(
        "%-23s" % (name + ": median (range)")
        for name in ("ms/step", "alone", "st/alone", "tr/alone"))))
    for (model, workers, mode, dev), runs in runs_of.items():
        cells = []
        for col in range(4):
            xs = [r[col] for r in runs if r[col] == r[col]]  # NaN: no alone measured
            cells.append("%7.2f (%6.2f-%6.2f)" % (median(xs), min(xs), max(xs)) if xs
                         else "%-23s" % "-")
        print("%-11s %2s %-5s %3s %4d | %s" % (model, workers, mode, dev, len(runs),
                                               " | ".join(cells)))
print()
print("ms/step, compute, pull (wait), push, other: per step, of the slowest worker; pull and push")
print("count only the time the step was blocked on them (they overlap the compute); wait: the")
print("servers' hold for the step (async: for the worker's own push), hidden or not. step/c:")
print("step time over the compute inside it;")
print("c/step: its inverse. alone: ms per step of the same worker's compute with no cluster")
print("(worker_throughput, same batch, threads and device: dev, where the chief's towers ran;")
print("same window; the fastest of 3 runs of 1 s); st/alone: ms/step over alone. batch: of")
print("other, gathering each step's batch (its rows at random in the train set); eval: of")
print("other, the chief's evaluations at epoch ends inside the loop (no training work);")
print("tr/alone: (ms/step - eval) over alone.")
print("cores: CPU seconds over wall seconds, summed: every worker's in its loop, every ps's from")
print("its first update of the job to its last (of %d cores)." % os.cpu_count())
print("ps MB: peak resident (VmHWM) of the ps with the highest x net; shm MB: of it, the workers'")
print("shared segments the ps maps (the ps's log: RssShmem at its most; the pages are the workers',")
print("counted in their memory too); held MB: its values + slots; x = ps MB / held MB;")
print("x net = (ps MB - shm MB - that ps's resident MB with no job) / held MB.")
PY
# The CPU math kernels the runs used (the worker logs them; see
# common/blas_kernels.h): CPU rows are only comparable on the same ones.
kernels=$(cut -f4 "$rows" | while read -r run; do
  grep -m1 -oE 'OpenBLAS kernels [A-Za-z0-9]+' "$run/worker0.log" || true
done | sort | uniq -c | sed 's/^ *//' | paste -sd, -)
echo "step_breakdown: ${kernels:-OpenBLAS kernels not logged}; logs in $OUT"
