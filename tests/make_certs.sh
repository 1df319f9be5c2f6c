#!/usr/bin/env bash
# Makes throwaway certificates for TLS tests and benchmarks (issue 15) with
# openssl, into DIR:
#   ca.pem/.key         a CA
#   node.pem/.key       signed by ca: SAN IP:127.0.0.1, serverAuth + clientAuth
#                       (ps and workers serve with it and present it when calling)
#   client.pem/.key     signed by ca: clientAuth (towerctl)
#   other_ca.pem/.key   an unrelated CA
#   rogue.pem/.key      signed by other_ca: clientAuth (must be refused)
# EC P-256 keys, valid 2 days. Not for production (see README "TLS and tokens").
#   Usage: tests/make_certs.sh DIR
set -euo pipefail
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: tests/make_certs.sh DIR" >&2; exit 2
fi
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed (deploy/setup.sh)" >&2; exit 2; }
C="$1"
mkdir -p "$C"
LOG="$C/openssl.log"
ossl() { openssl "$@" >>"$LOG" 2>&1 || { echo "make_certs: openssl $1 failed:" >&2; tail -5 "$LOG" >&2; exit 1; }; }
new_ca() {  # new_ca NAME
  ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=towerps test $1" -keyout "$C/$1.key" -out "$C/$1.pem"
}
new_cert() {  # new_cert CA NAME EXTENSIONS
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=towerps $2" -keyout "$C/$2.key" -out "$C/$2.csr"
  printf '%s\n' "$3" >"$C/$2.ext"
  ossl x509 -req -in "$C/$2.csr" -CA "$C/$1.pem" -CAkey "$C/$1.key" -CAcreateserial \
    -days 2 -extfile "$C/$2.ext" -out "$C/$2.pem"
}
new_ca ca
new_ca other_ca
new_cert ca node $'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth'
new_cert ca client 'extendedKeyUsage=clientAuth'
new_cert other_ca rogue 'extendedKeyUsage=clientAuth'
chmod 600 "$C"/*.key
