#!/usr/bin/env bash
# Builds the GPU tests, the benchmark and the ps/worker binaries here (this
# machine has the CUDA toolkit and Bazel, the GPU machine has neither Bazel
# nor the Debian libraries) and copies them with the shared libraries they
# need, except glibc's and the CUDA driver's, into gpu-bundle/ (git-ignored).
# Then, through the device tool: carry gpu-bundle and run tests/gpu/run.sh.
#
#   bash tests/gpu/package.sh && du -sh gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//worker/device:backend_cuda_test //worker/device:backend_cuda_conv_test
         //worker/device:cublas_lib_test //worker/device:cudnn_lib_test //worker/device:nccl_reduce_test //worker/device:cuda_memory_test
         //tests/bench:worker_throughput //tests/bench:ps_throughput //worker:worker //ps:ps
         //client:towerctl //worker/device:thread_bits)
bazel build -c opt "${targets[@]}"
out=gpu-bundle
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/lib-fallback"
for t in "${targets[@]}"; do
  p=${t#//}; bin="bazel-bin/${p%%:*}/${p##*:}"
  cp -L "$bin" "$out/bin/"
  # Libraries from this machine's Debian packages; not glibc, not the CUDA
  # driver, and not cudart, cuBLAS or NCCL: the GPU machine has CUDA 13 with
  # them (tests/gpu/run.sh finds them there), and they are 800 MB. (cuBLAS
  # and NCCL are loaded with dlopen, so ldd does not list them; without NCCL
  # the NCCL test fails and training falls back to copies, saying so. cuDNN too, and it is not bundled either (its engine
  # libraries alone are over 300 MB): without it on the GPU machine,
  # cudnn_lib_test and backend_cuda_conv_test fail with "cuDNN unavailable".)
  ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*|libnccl*) ;;
      # Debian 12's C++ runtime needs glibc 2.36: used there only when the
      # machine's own is too old for these binaries (run.sh decides).
      libstdc++.so*|libgcc_s.so*) cp -Ln "$lib" "$out/lib-fallback/" 2>/dev/null || true ;;
      *) cp -Ln "$lib" "$out/lib/" 2>/dev/null || true ;;
    esac
  done
done
# Fashion-MNIST (the Debian package's files) for the training runs.
mkdir -p "$out/data" && cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
strip --strip-unneeded "$out"/lib/*.so* "$out"/lib-fallback/*.so* "$out"/bin/* 2>/dev/null || true
# One compressed file travels (the device tool carries at most 64 MiB).
tar -C "$out" -cJf gpu-bundle.tar.xz bin lib lib-fallback data
rm -rf "$out" && mkdir -p "$out" && mv gpu-bundle.tar.xz "$out/"
du -sh "$out"
