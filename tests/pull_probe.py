"""One ParameterService.Pull (a server-streaming call) with a serialized
PullRequest, for tests that hold a long-poll open on a ps (issue 15: a ps
must answer its pending long polls when it shuts down).

  pull_probe.py ADDRESS TIMEOUT_S < request.bin

The request bytes come from stdin (e.g. `protoc --encode`). Prints
"connected" once the channel is up (flushed), then, when the call ends, one
line "<STATUS_CODE_NAME> <details>" ("OK" after a complete stream). Exits 0
whenever the server answered, 3 when it could not be reached in TIMEOUT_S.
Needs only PyPI's grpcio (the health venv has it); no generated stubs.
"""
import sys

import grpc


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    address, timeout = sys.argv[1], float(sys.argv[2])
    request = sys.stdin.buffer.read()
    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            print("UNREACHABLE %s" % address, flush=True)
            return 3
        print("connected", flush=True)
        call = channel.unary_stream("/towerps.v1.ParameterService/Pull",
                                    request_serializer=None, response_deserializer=None)
        try:
            for _ in call(request, timeout=timeout):
                pass
        except grpc.RpcError as e:
            print("%s %s" % (e.code().name, e.details()), flush=True)
            return 0
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
