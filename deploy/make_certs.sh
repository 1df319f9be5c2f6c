#!/usr/bin/env bash
# Makes the certificates and the token of a towerps cluster with openssl
# (README "TLS and tokens"), into DIR:
#   ca.pem/.key       the cluster's CA (keep ca.key offline once done)
#   node.pem/.key     every ps and worker: serverAuth + clientAuth, SANs
#                     DNS:towerps, DNS:localhost, IP:127.0.0.1 and each --san;
#                     clients dial any address with --tls_server_name=towerps
#   client.pem/.key   towerctl: clientAuth
#   token             the shared bearer token (32 random bytes, hex)
#   towerctl.env      `. DIR/towerctl.env` sets TOWERCTL_TLS_* and
#                     TOWERCTL_AUTH_TOKEN_FILE for towerctl on this machine
# With --test_extras also an unrelated CA (other_ca) and a client certificate
# it signed (rogue), which a cluster must refuse (tests/tls_test.sh).
# EC P-256 keys. Files that exist are kept (run it again to add nothing);
# --force makes everything anew.
#   Usage: deploy/make_certs.sh [--days N] [--san DNS:name|IP:addr]... [--test_extras] [--force] DIR
set -euo pipefail
usage() {
  echo "usage: deploy/make_certs.sh [--days N] [--san DNS:name|IP:addr]... [--test_extras] [--force] DIR" >&2
  exit 2
}
DAYS=365 EXTRAS=0 FORCE=0 SANS=() C=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --days) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || usage; DAYS=$2; shift 2 ;;
    --san)
      [[ $# -ge 2 && "$2" =~ ^(DNS:[A-Za-z0-9.*-]+|IP:[0-9a-fA-F.:]+)$ ]] ||
        { echo "make_certs: --san wants DNS:name or IP:address, got '${2:-}'" >&2; exit 2; }
      SANS+=("$2"); shift 2 ;;
    --test_extras) EXTRAS=1; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage ;;
    -*) echo "make_certs: unknown option $1" >&2; usage ;;
    *) [[ -z "$C" ]] || usage; C=$1; shift ;;
  esac
done
[[ -n "$C" ]] || usage
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed (deploy/setup.sh)" >&2; exit 2; }
mkdir -p "$C"
chmod 700 "$C"
LOG="$C/openssl.log"
: >"$LOG"
ossl() { openssl "$@" >>"$LOG" 2>&1 || { echo "make_certs: openssl $1 failed:" >&2; tail -5 "$LOG" >&2; exit 1; }; }
fresh() { [[ "$FORCE" == 1 || ! -s "$C/$1" ]]; }
new_ca() {  # new_ca NAME
  fresh "$1.pem" || return 0
  ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$DAYS" \
    -subj "/CN=towerps $1" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout "$C/$1.key" -out "$C/$1.pem"
}
new_cert() {  # new_cert CA NAME EXTENSIONS
  fresh "$2.pem" || return 0
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=towerps $2" -keyout "$C/$2.key" -out "$C/$2.csr"
  printf '%s\n' "$3" >"$C/$2.ext"
  ossl x509 -req -in "$C/$2.csr" -CA "$C/$1.pem" -CAkey "$C/$1.key" -CAcreateserial \
    -days "$DAYS" -extfile "$C/$2.ext" -out "$C/$2.pem"
  rm -f "$C/$2.csr" "$C/$2.ext"
}
san="DNS:towerps,DNS:localhost,IP:127.0.0.1"
for s in ${SANS[@]+"${SANS[@]}"}; do san+=",$s"; done
new_ca ca
new_cert ca node "subjectAltName=$san"$'\n'"extendedKeyUsage=serverAuth,clientAuth"
new_cert ca client 'extendedKeyUsage=clientAuth'
if [[ "$EXTRAS" == 1 ]]; then
  new_ca other_ca
  new_cert other_ca rogue 'extendedKeyUsage=clientAuth'
fi
if fresh token; then
  (umask 077; openssl rand -hex 32 >"$C/token")
fi
abs=$(cd "$C" && pwd)
cat >"$C/towerctl.env" <<ENV
# towerctl's TLS and token for the cluster of $abs: . $abs/towerctl.env
export TOWERCTL_TLS_CA=$abs/ca.pem TOWERCTL_TLS_CERT=$abs/client.pem TOWERCTL_TLS_KEY=$abs/client.key
export TOWERCTL_TLS_SERVER_NAME=towerps TOWERCTL_AUTH_TOKEN_FILE=$abs/token
ENV
chmod 600 "$C"/*.key "$C/token"
# The containers' processes read them as whatever user they run as.
chmod 644 "$C"/*.pem
echo "make_certs: $C: ca.pem, node.pem/.key ($san), client.pem/.key, token, towerctl.env$([[ "$EXTRAS" == 1 ]] && echo ', other_ca.pem, rogue.pem/.key')"
