#!/usr/bin/python3
"""PyTorch's side of the cnn_small comparison (issue 13): examples/s of one
forward + backward pass of the classic small CNN on 1x28x28 inputs,

  Conv2D(32, 3x3, relu) -> MaxPool(2) -> Flatten -> Dense(64, relu) -> Dense(10)

with softmax cross-entropy, for each thread count, on CPU. Run it with
Debian's Python (python3-torch 1.13 loads only there), beside
`bazel run -c opt //tests/bench:worker_throughput` in the same window:

  /usr/bin/python3 tests/bench/torch_cnn_small.py --batch=64 --seconds=3
"""
import argparse
import time

import torch
import torch.nn as nn


def model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 13 * 13, 64), nn.ReLU(), nn.Linear(64, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--threads", default="1,2")
    a = p.parse_args()
    torch.manual_seed(1)
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))
    loss_fn = nn.CrossEntropyLoss()
    print(f"torch {torch.__version__}  mkldnn={torch.backends.mkldnn.is_available()}")
    print(f"{'threads':>7} {'batch':>6} {'examples/s':>12}")
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        m = model()
        for _ in range(5):  # warm-up, untimed
            m.zero_grad(set_to_none=True)
            loss_fn(m(x), y).backward()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < a.seconds:
            m.zero_grad(set_to_none=True)
            loss_fn(m(x), y).backward()
            steps += 1
        rate = steps * a.batch / (time.perf_counter() - start)
        print(f"{threads:>7} {a.batch:>6} {rate:>12.0f}")


if __name__ == "__main__":
    main()
