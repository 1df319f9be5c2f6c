#!/usr/bin/env python3
"""Prints N free TCP ports for servers on this machine, comma-separated.

Usage: free_ports.py N [--host=127.0.0.1] [--sep=,]

A port picked by binding port 0 comes from the kernel's ephemeral range, the
range it also draws from for every outgoing connection: between our check and
the server's bind, any client on the machine may take it (a flaky "address in
use"). These ports come from below that range (see
/proc/sys/net/ipv4/ip_local_port_range), which the kernel never hands out on
its own, and each is checked free by binding it on every address.
"""
import random
import socket
import sys


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
        sys.exit("usage: free_ports.py N [--host=H] [--sep=S]")
    n, host, sep = int(args[0]), opts.get("host", "127.0.0.1"), opts.get("sep", ",")
    low, high = 20000, max(20000 + 1000, ephemeral_low()) - 1
    held = []  # kept bound until all are chosen, so none is picked twice
    for _ in range(2000):
        if len(held) == n:
            break
        port = random.randint(low, high)
        s = socket.socket()
        try:
            s.bind(("0.0.0.0", port))  # no SO_REUSEADDR: any listener or bound socket conflicts
        except OSError:
            s.close()
            continue
        held.append(s)
    if len(held) < n:
        sys.exit("free_ports.py: found only %d free ports in %d-%d" % (len(held), low, high))
    print(sep.join(str(s.getsockname()[1]) for s in held))
    for s in held:
        s.close()


if __name__ == "__main__":
    main()
