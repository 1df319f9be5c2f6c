"""One unary gRPC call with a serialized request, for tests that call a
server's RPC directly (issue 15: a bare ParameterService.SaveCheckpoint).

  raw_rpc.py ADDRESS /package.Service/Method RESPONSE_FILE < request.bin

The request bytes come from stdin (e.g. `protoc --encode`); the response
bytes go to RESPONSE_FILE (decode them with `protoc --decode`). Prints one
line, "<STATUS_CODE_NAME> <details>", and exits 0 whenever the server
answered (the status is what the test checks), 3 when it could not be reached.
Needs only PyPI's grpcio (the health venv has it); no generated stubs.
"""
import sys

import grpc


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    address, method, out = sys.argv[1:]
    request = sys.stdin.buffer.read()
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            response = call(request, timeout=30)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                print("UNAVAILABLE %s" % e.details())
                return 3
            print("%s %s" % (e.code().name, e.details()))
            return 0
    with open(out, "wb") as f:
        f.write(response)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
