# Sourced by tests/gpu/run.sh and tests/gpu/bench.sh on the GPU machine, from
# the repository root with gpu-bundle/ carried (see tests/gpu/package.sh):
# unpacks the bundle into $B (once), points the loader at its libraries and
# at the machine's CUDA libraries, and installs the bundle's Fashion-MNIST
# where the worker's default --data_root looks (the machine runs as root and
# has no Debian package for it).
B=/tmp/gpu-bundle
# Unpacked again whenever the bundle is not the one unpacked last.
stamp=$(stat -c '%s %Y' gpu-bundle/gpu-bundle.tar.xz)
if [ ! -x "$B/bin/worker" ] || [ "$(cat "$B/.bundle" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$B" && mkdir -p "$B" && tar -C "$B" -xJf gpu-bundle/gpu-bundle.tar.xz
  echo "$stamp" >"$B/.bundle"
fi
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
# Where nvidia-smi lists a GPU, a GPU test that finds none fails instead of
# skipping (a driver too old for the CUDA runtime, a stub libcuda).
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then export TOWERPS_REQUIRE_GPU=1; fi
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ -w /usr/share ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp "$B"/data/*.gz /usr/share/datasets/fashion-mnist/
fi
# The layout deploy/local_cluster.sh and tests/bench/step_breakdown.sh expect
# in TOWERPS_BIN_DIR.
T=/tmp/gpu-bundle-tree
mkdir -p "$T/ps" "$T/worker" "$T/client" "$T/tests/bench"
ln -sf "$B/bin/ps" "$T/ps/ps"; ln -sf "$B/bin/worker" "$T/worker/worker"
ln -sf "$B/bin/towerctl" "$T/client/towerctl"
ln -sf "$B/bin/worker_throughput" "$T/tests/bench/worker_throughput"
ln -sf "$B/bin/ps_throughput" "$T/tests/bench/ps_throughput"
