"""cuda_object: compiles one .cu file with the toolkit's nvcc into an object.

Used only where @local_cuda//:defs.bzl has HAS_CUDA = True; BUILD files pick
the CUDA or CPU-only implementation with that constant, so call sites carry no
#if. The object links against cudart via @local_cuda//:cuda_libs (cuBLAS, NCCL
and cuDNN are loaded at run time: worker/device/cublas_lib, nccl_lib,
cudnn_lib).
"""

load("@local_cuda//:defs.bzl", "NVCC")

def cuda_object(name, src, hdrs = [], deps_hdrs = [], copts = [], deps = []):
    """One .cu file -> one object in a cc_library of that name.

    Args:
      name: the cc_library's name.
      src: the .cu file.
      hdrs: headers it includes from this package.
      deps_hdrs: headers it includes from elsewhere.
      copts: extra nvcc flags (e.g. -arch, --fmad=false).
      deps: libraries the object calls into (linked after it).
    """
    native.genrule(
        name = name + "_nvcc",
        srcs = [src] + hdrs + deps_hdrs,
        outs = [name + ".o"],
        # The toolkit's own nvcc, by absolute path: it finds its helpers
        # relative to where it is installed.
        cmd = (NVCC + " -std=c++17 -O2 -c " + " ".join(copts) + " " +
               "-Xcompiler -fPIC -I. -I$(GENDIR) -o $@ $(location %s)") % src,
    )
    native.cc_library(
        name = name,
        srcs = [name + ".o"],
        deps = ["@local_cuda//:cuda_libs"] + deps,
        alwayslink = True,
    )
