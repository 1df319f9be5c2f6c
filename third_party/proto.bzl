"""cc_grpc_library: C++ code for a .proto file from the system protoc and gRPC plugin."""

def cc_grpc_library(name, src, deps = [], visibility = None):
    """Generates <base>.pb.{h,cc} and <base>.grpc.pb.{h,cc} for `src` and wraps them.

    Args:
      name: the cc_library's name.
      src: one .proto file in this package.
      deps: cc_grpc_library targets of the protos `src` imports.
      visibility: as usual.
    """
    base = src[:-len(".proto")]
    pkg = native.package_name()
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        tools = ["@system_libs//:protoc", "@system_libs//:grpc_cpp_plugin"],
        cmd = ("$(location @system_libs//:protoc) -I. -I$(GENDIR) " +
               "--cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=$(location @system_libs//:grpc_cpp_plugin) " +
               "%s/%s") % (pkg, src),
    )
    # The .proto and, transitively, every .proto it imports (protoc reads them all).
    native.filegroup(
        name = name + "_srcs",
        srcs = [src] + [d + "_srcs" for d in deps],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        deps = deps + ["@system_libs//:grpcpp", "@system_libs//:protobuf"],
        visibility = visibility,
    )
