#!/usr/bin/env python3
"""thread_cpu: where the CPU of running ps and worker processes goes, by thread.

    tests/bench/thread_cpu.py [--seconds=2] [--names=ps,worker]

Samples /proc/<pid>/task/*/stat of every process whose name is in --names
twice, --seconds apart, and prints per process and thread name (threads of
one name summed; a thread that kept its process's name is "(main)" if it is
the process's first thread, else "(unnamed)": OpenBLAS's pool, for one) the
cores used over the interval in user and system time, and how many threads
of that name ran. A diagnosis tool for benchmarks (issue 16: where cores go
when a local cluster runs on a machine with many); asserts nothing.
"""
import argparse
import os
import time

HZ = os.sysconf("SC_CLK_TCK")


def threads(names):
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                pname = f.read().strip()
            if pname not in names:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                # comm may hold spaces: fields after the closing parenthesis.
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                rest = stat[stat.rindex(")") + 2:].split()
                utime, stime = int(rest[11]), int(rest[12])
                if comm == pname:
                    comm = "(main)" if tid == pid else "(unnamed)"
                out[(pid, pname, tid)] = (comm, utime, stime)
        except (OSError, ValueError):
            continue  # exited meanwhile
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--names", default="ps,worker")
    a = ap.parse_args()
    names = set(a.names.split(","))
    t0, before = time.monotonic(), threads(names)
    time.sleep(a.seconds)
    t1, after = time.monotonic(), threads(names)
    dt = (t1 - t0) * HZ
    rows = {}
    for key, (comm, u1, s1) in after.items():
        if key not in before:
            continue
        _, u0, s0 = before[key]
        pid, pname, _ = key
        r = rows.setdefault((pname, pid, comm), [0.0, 0.0, 0, 0])
        r[0] += (u1 - u0) / dt
        r[1] += (s1 - s0) / dt
        r[2] += 1
        r[3] += 1 if (u1 - u0) + (s1 - s0) > 0 else 0
    print("%-7s %8s %-18s %6s %6s %7s %7s" % ("process", "pid", "thread", "user", "sys", "threads", "ran"))
    total = 0.0
    for (pname, pid, comm), (u, s, n, ran) in sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        total += u + s
        if u + s >= 0.005:
            print("%-7s %8s %-18s %6.2f %6.2f %7d %7d" % (pname, pid, comm, u, s, n, ran))
    print("total cores: %.2f over %.1f s" % (total, t1 - t0))


if __name__ == "__main__":
    main()
