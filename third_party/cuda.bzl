"""cuda_object: compiles one .cu file with the toolkit's nvcc into an object.

Used only where @local_cuda//:defs.bzl has HAS_CUDA = True; BUILD files pick
the CUDA or CPU-only implementation with that constant, so call sites carry no
#if. The object links against cudart/cuBLAS/NCCL via @local_cuda//:cuda_libs.
"""

load("@local_cuda//:defs.bzl", "NVCC")

def cuda_object(name, src, hdrs = [], deps_hdrs = []):
    native.genrule(
        name = name + "_nvcc",
        srcs = [src] + hdrs + deps_hdrs,
        outs = [name + ".o"],
        # The toolkit's own nvcc, by absolute path: it finds its helpers
        # relative to where it is installed.
        cmd = (NVCC + " -std=c++17 -O2 -c " +
               "-Xcompiler -fPIC -I. -I$(GENDIR) -o $@ $(location %s)") % src,
    )
    native.cc_library(
        name = name,
        srcs = [name + ".o"],
        deps = ["@local_cuda//:cuda_libs"],
        alwayslink = True,
    )
