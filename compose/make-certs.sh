#!/usr/bin/env bash
# Makes the certificates of the TLS deployment (compose/docker-compose.tls.yml) with
# openssl: a CA, one server certificate for every service name (and 127.0.0.1, for the
# ports published on loopback), and a client certificate (CN=locker; etcd takes the CN as
# the user name when auth is on).
#
#   compose/make-certs.sh [DIR]     # default: compose/certs; kept if there (FORCE=1 redoes)
#
# These are throwaway certificates for a local deployment: their keys are readable by the
# containers' users. Production keys belong to their server's user alone (mode 0600).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/certs}"
days=3650
mkdir -p "$dir"
if [ -s "$dir/ca.pem" ] && [ "${FORCE:-0}" != 1 ]; then
  exit 0
fi
cd "$dir"

openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=fencelock compose CA" \
  -keyout ca-key.pem -out ca.pem 2>/dev/null

names="etcd1 etcd2 etcd3 redis-master redis-replica sentinel1 sentinel2 sentinel3 postgres localhost"
san="IP:127.0.0.1"
for name in $names; do san="$san,DNS:$name"; done

issue() { # issue <file> <subject> <extensions>
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1-key.pem" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue server "/CN=fencelock compose" \
  "subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth
keyUsage=digitalSignature,keyEncipherment"
issue client "/CN=locker" \
  "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
chmod 644 ./*.pem
rm -f ca-key.pem ca.srl
echo "certificates in $dir" >&2
