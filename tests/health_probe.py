"""An independent grpc.health.v1 client (PyPI's grpcio-health-checking) for
tests/health_test.sh.

  health_probe.py check ADDRESS SERVICE WANT TIMEOUT_S
      Follows Health/Watch (waiting for the server to be up) until it reports
      WANT (SERVING, NOT_SERVING or SERVICE_UNKNOWN); exit 0, or 1 with the
      last answer once TIMEOUT_S has passed.
  health_probe.py watch ADDRESS SERVICE READY_FIFO TIMEOUT_S
      Follows Health/Watch. Writes a line to READY_FIFO once it has seen
      SERVING, then
      waits for the server to drain: exit 0 when it sees NOT_SERVING or the
      stream ends (the server shut down), printing which; 1 on timeout.
"""
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

Status = health_pb2.HealthCheckResponse


def check(address, service, want, timeout_s):
    # Health/Watch pushes every status change, and wait_for_ready waits for
    # the server to come up: no polling; the deadline is the call's timeout.
    last = "no answer yet"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s,
                            wait_for_ready=True)
        try:
            for reply in stream:
                last = Status.ServingStatus.Name(reply.status)
                if last == want:
                    print(f"{address} {service or '(overall)'}: {last}")
                    return 0
        except grpc.RpcError as e:
            last = f"{last}, then {e.code()}"
    print(f"{address} {service or '(overall)'}: want {want} within {timeout_s}s, last answer {last}")
    return 1


def watch(address, service, ready_file, timeout_s):
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        ready = False
        try:
            for reply in stream:
                name = Status.ServingStatus.Name(reply.status)
                print(f"watch {address}: {name}", flush=True)
                if reply.status == Status.SERVING and not ready:
                    with open(ready_file, "w") as ready_fifo:
                        ready_fifo.write("SERVING\n")
                    ready = True
                elif reply.status == Status.NOT_SERVING and ready:
                    print("drain observed: NOT_SERVING")
                    return 0
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                print(f"watch {address}: still serving after {timeout_s}s")
                return 1
            if ready:
                print(f"drain observed: the stream ended ({e.code()})")
                return 0
            print(f"watch {address}: failed before SERVING: {e.code()} {e.details()}")
            return 1
        print("drain observed: the stream ended" if ready else "stream ended before SERVING")
        return 0 if ready else 1


def main(argv):
    if len(argv) == 6 and argv[1] == "check":
        return check(argv[2], argv[3], argv[4], float(argv[5]))
    if len(argv) == 6 and argv[1] == "watch":
        return watch(argv[2], argv[3], argv[4], float(argv[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
