"""One real unary call to any towerps method through PyPI's grpcio (an
independent client), for tests/tls_test.sh.

  rpc_probe.py ADDRESS METHOD [--ca PEM] [--cert PEM --key PEM] [--token TOKEN]
               [--timeout_s N]

METHOD is a full name such as /towerps.v1.ParameterService/GetStatus; the
request is an empty message (every field at its default). With --ca the
channel is TLS (verifying the server against PEM; with --cert/--key it
presents a client certificate); without it, plaintext. --token sends
"authorization: Bearer TOKEN". Prints "CODE: details" (CODE as gRPC names it,
OK on success) and exits 0 whatever the code; 2 on bad arguments.
"""
import argparse
import sys

import grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("method")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--token")
    p.add_argument("--timeout_s", type=float, default=10)
    a = p.parse_args()

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    if a.ca:
        creds = grpc.ssl_channel_credentials(
            root_certificates=read(a.ca),
            private_key=read(a.key) if a.key else None,
            certificate_chain=read(a.cert) if a.cert else None)
        channel = grpc.secure_channel(a.address, creds)
    else:
        channel = grpc.insecure_channel(a.address)
    metadata = [("authorization", "Bearer " + a.token)] if a.token else None
    # Bytes in, bytes out: no generated stubs needed; b"" is an empty message.
    call = channel.unary_unary(a.method)
    try:
        call(b"", timeout=a.timeout_s, metadata=metadata)
        print("OK: ")
    except grpc.RpcError as e:
        print("%s: %s" % (e.code().name, e.details()))
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
