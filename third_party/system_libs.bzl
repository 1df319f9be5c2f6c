"""Repository rules that wire Debian's system libraries and the CUDA toolkit.

Nothing is downloaded. `@system_libs` turns pkg-config's flags into cc_library
targets (headers come from /usr/include, which the autoconfigured toolchain
treats as a system directory) and exposes protoc and grpc_cpp_plugin.
`@local_cuda` looks for the CUDA toolkit ($CUDA_PATH, then /usr/local/cuda;
TOWERPS_NO_CUDA=1 forces a CPU-only build); it
sets HAS_CUDA in @local_cuda//:defs.bzl, which BUILD files use to choose the
CUDA or CPU-only implementation, and provides :cuda_libs (cudart; cuBLAS,
NCCL and cuDNN are loaded at run time) and :cuda_headers (the toolkit's headers; both empty in CPU-only builds).
"""

_PKG_LIBS = {
    "grpcpp": ["grpc++"],
    "protobuf": ["protobuf"],
    "absl": [
        "absl_flags",
        "absl_flags_parse",
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format",
        "absl_synchronization",
        "absl_time",
        "absl_random_random",
        "absl_hash",
        "absl_raw_hash_set",
    ],
    "openblas": ["openblas"],
    "zlib": ["zlib"],
    # prometheus-cpp 1.0 (Debian's prometheus-cpp-dev): metrics and the
    # Exposer that serves them over HTTP.
    "prometheus": ["prometheus-cpp-pull"],
}

def _pkg_config(ctx, pkgs):
    res = ctx.execute(["pkg-config", "--libs"] + pkgs)
    if res.return_code != 0:
        fail("pkg-config could not find %s (run deploy/setup.sh): %s" % (pkgs, res.stderr))
    return [f for f in res.stdout.strip().split(" ") if f]

def _which(ctx, name):
    path = ctx.which(name)
    if path == None:
        fail("%s not found on PATH (run deploy/setup.sh)" % name)
    return path

def _system_libs_impl(ctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, pkgs in _PKG_LIBS.items():
        build.append("cc_library(name = %r, linkopts = %r%s)" % (
            name,
            _pkg_config(ctx, pkgs),
            # Debian's Abseil is not built with TSan: --config=tsan links
            # annotations that make its Mutex visible to TSan.
            ', deps = select({"@//third_party:tsan": ["@//third_party:absl_tsan_annotations"], "//conditions:default": []})' if name == "absl" else "",
        ))
    # oneDNN (Debian's libdnnl-dev 2.6) ships no pkg-config file; its headers
    # are in /usr/include/oneapi/dnnl, which the toolchain already searches.
    # Its threads are OpenMP (libgomp), whose API worker/device/cpu_threads
    # calls to size oneDNN's teams.
    build.append('cc_library(name = "dnnl", linkopts = ["-ldnnl", "-lgomp"])')
    # gRPC's server reflection (Debian ships no pkg-config file for it).
    build.append('cc_library(name = "grpcpp_reflection", linkopts = ["-lgrpc++_reflection"], deps = [":grpcpp"])')
    build.append('cc_library(name = "gtest", linkopts = ["-lgmock", "-lgtest", "-pthread"])')
    build.append('cc_library(name = "gtest_main", linkopts = ["-lgmock", "-lgtest_main", "-lgtest", "-pthread"])')
    ctx.symlink(_which(ctx, "protoc"), "protoc")
    ctx.symlink(_which(ctx, "grpc_cpp_plugin"), "grpc_cpp_plugin")
    build.append('exports_files(["protoc", "grpc_cpp_plugin"])')
    ctx.file("BUILD", "\n".join(build) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "system_libs")\n')

_system_libs = repository_rule(
    implementation = _system_libs_impl,
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)

def _local_cuda_impl(ctx):
    candidates = []
    if ctx.os.environ.get("TOWERPS_NO_CUDA") == "1":
        candidates = ["/nonexistent"]  # forced CPU-only build
    elif ctx.os.environ.get("CUDA_PATH"):
        candidates.append(ctx.os.environ["CUDA_PATH"])
    if not candidates or candidates[0] != "/nonexistent":
        candidates.append("/usr/local/cuda")
    root = None
    for c in candidates:
        if ctx.path(c + "/bin/nvcc").exists:
            root = c
            break
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if root == None:
        ctx.file("defs.bzl", "HAS_CUDA = False\nCUDA_ROOT = None\nNVCC = None\nCUDA_LIBDIRS = []\n")
        build.append('cc_library(name = "cuda_libs")')
        build.append('cc_library(name = "cuda_headers")')
    else:
        libdirs = [d for d in [root + "/lib64", root + "/lib"] if ctx.path(d).exists]
        ctx.file("defs.bzl", "HAS_CUDA = True\nCUDA_ROOT = %r\nNVCC = %r\nCUDA_LIBDIRS = %r\n" % (root, root + "/bin/nvcc", libdirs))
        linkopts = []
        for d in libdirs:
            linkopts += ["-L" + d, "-Wl,-rpath," + d]

        # cuBLAS, NCCL and cuDNN are not linked: worker/device/cublas_lib,
        # nccl_lib and cudnn_lib load them with dlopen, so CUDA binaries start
        # where they are missing and do not map them where there is no GPU.
        linkopts += ["-lcudart"]
        build.append("cc_library(name = \"cuda_libs\", linkopts = %r)" % linkopts)

        # The toolkit's headers for code compiled by the ordinary C++ compiler
        # (cuda_runtime.h, cublas_v2.h, nccl.h, cudnn.h). Only what those include: the
        # top-level headers, crt/ and nv/ (cuda_fp16.hpp includes <nv/target>);
        # CCCL (thrust, cub, libcu++: ~1700 files) stays out of the glob.
        ctx.symlink(root + "/include", "include")
        build.append("\n".join([
            "cc_library(",
            "    name = \"cuda_headers\",",
            "    hdrs = glob([\"include/*.h\", \"include/*.hpp\", \"include/crt/**\", \"include/nv/**\"]),",
            "    includes = [\"include\"],",
            ")",
        ]))
    ctx.file("BUILD", "\n".join(build) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "local_cuda")\n')

_local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH", "TOWERPS_NO_CUDA"],
    local = True,
)

def system_libs():
    _system_libs(name = "system_libs")
    _local_cuda(name = "local_cuda")
