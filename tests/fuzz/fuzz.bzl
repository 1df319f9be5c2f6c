"""fuzz_target: one libFuzzer target and the test that replays its corpus.

fuzz_target(name = "x_fuzzer", srcs = [...], deps = [...]) defines
  :x_fuzzer             the fuzz binary (tags fuzz, manual). Under
                        --config=fuzz it links libFuzzer's main
                        (-fsanitize=fuzzer); otherwise replay_main, which runs
                        the files named on its command line.
  :x_fuzzer_regression  a cc_test that replays corpus/x_fuzzer/ (the seeds and
                        every crasher kept) in the normal and asan builds.
"""

def fuzz_target(name, srcs, deps = [], size = "small"):
    corpus = "corpus/" + name
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs + ["fuzz_util.h"],
        deps = deps + select({
            ":libfuzzer": [],
            "//conditions:default": [":replay_main"],
        }),
        linkopts = select({
            ":libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["fuzz", "manual"],
    )
    native.cc_test(
        name = name + "_regression",
        size = size,
        srcs = srcs + ["fuzz_util.h"],
        deps = deps + [":replay_main"],
        args = ["tests/fuzz/" + corpus],
        data = native.glob([corpus + "/**"]),
    )
