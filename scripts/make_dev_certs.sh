#!/usr/bin/env bash
# Makes a development CA and certificates for trying TLS and mutual TLS
# locally (compose.tls.yaml, the examples in docs/operating/security.md). Not for production:
# use your PKI or cert-manager there.
#
# Usage: scripts/make_dev_certs.sh DIR [EXTRA_DNS_NAME...]
# Writes DIR/ca.crt, DIR/tls.crt + DIR/tls.key (the server: localhost,
# 127.0.0.1, attention-server and any extra names) and DIR/client.crt +
# DIR/client.key (a client certificate for mutual TLS), valid 30 days.
set -euo pipefail
dir=${1:?usage: make_dev_certs.sh DIR [EXTRA_DNS_NAME...]}
shift
mkdir -p "$dir"
cd "$dir"
san="DNS:localhost,IP:127.0.0.1,DNS:attention-server"
for name in "$@"; do san="$san,DNS:$name"; done
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 30 \
  -subj /CN=attention-dev-ca 2>/dev/null
openssl req "${ec[@]}" -keyout tls.key -out tls.csr -subj /CN=attention-server 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >server.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 30 \
  -extfile server.ext 2>/dev/null
openssl req "${ec[@]}" -keyout client.key -out client.csr -subj /CN=attention-client 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' >client.ext
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt \
  -days 30 -extfile client.ext 2>/dev/null
rm -f tls.csr client.csr server.ext client.ext ca.srl
# Readable by the container's user (uid 10001) when mounted; dev certificates only.
chmod 644 ./*.key
echo "make_dev_certs: wrote $dir/{ca.crt,tls.crt,tls.key,client.crt,client.key} ($san)"
