#!/usr/bin/env bash
# Installs everything towerps needs on a fresh Debian 12 machine. Idempotent:
# does nothing when every package is already there. Run as root (or with sudo).
# Opt-in extras: --slurm, --compose, --docker (see below).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, works offline with our WORKSPACE
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev
  prometheus-cpp-dev       # prometheus-cpp 1.0: --metrics_port on every process
  prometheus               # promtool, which tests/metrics_test checks scrapes with
  libdnnl-dev              # oneDNN 2.6: the CPU convolution and pooling kernels
  dataset-fashion-mnist    # /usr/share/datasets/fashion-mnist
  python3 iproute2 procps
  gdb                      # stacks of a process that hangs in a multi-process test (tests/await_lib.sh)
)
# --- TLS (issue 15): openssl makes tests/tls_test.sh's certificates (README: "TLS and tokens") ---
PACKAGES+=(openssl)
# --- end TLS ---

# --- Fuzzing (issue 15): clang 14 and its runtime libraries (libFuzzer,
# ASan, UBSan) for tests/fuzz.sh (--config=fuzz); clang also builds
# --config=clang. ---
PACKAGES+=(clang libclang-rt-14-dev)  # clang: /usr/bin/clang, which .bazelrc names
# --- end fuzzing ---

# --- Opt-in: Slurm for tests/slurm_test.sh (issue 14) ---
# `deploy/setup.sh --slurm` also installs Debian's Slurm 22.05 (slurmctld,
# slurmd, sbatch/srun/sinfo) and munge; tests/slurm_test.sh is skipped without
# them. Not in the list above: only that test needs them.
# --- Opt-in: Docker (issue 14, docker) ---
# Not for every user either: --compose adds docker-compose alone (enough to
# validate the compose files, no engine: tests/run.sh), --docker the Docker
# engine, docker-compose and debootstrap (deploy/docker_up.sh,
# tests/docker_test.sh).
for arg in "$@"; do
  case "$arg" in
    --slurm) PACKAGES+=(slurm-wlm munge) ;;
    --compose) PACKAGES+=(docker-compose) ;;                    # docker
    --docker) PACKAGES+=(docker.io docker-compose debootstrap) ;;  # docker
    *) echo "setup: unknown flag $arg (usage: deploy/setup.sh [--slurm] [--compose] [--docker])" >&2; exit 2 ;;
  esac
done
# --- end Slurm and Docker opt-ins ---

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
