#!/usr/bin/env bash
# Makes a development CA and certificates for trying TLS and mutual TLS
# locally (compose.tls.yaml, the examples in docs/operating/security.md). Not for production:
# use your PKI or cert-manager there.
#
# Usage: scripts/make_dev_certs.sh [--for-container] DIR [EXTRA_DNS_NAME...]
# Writes DIR/ca.crt, DIR/tls.crt + DIR/tls.key (the server: localhost,
# 127.0.0.1, attention-server and any extra names) and DIR/client.crt +
# DIR/client.key (a client certificate for mutual TLS), valid 30 days.
# Private keys (*.key) are written 0600, readable by their owner only.
# --for-container: tls.key is also made readable by the image's user (uid
# 10001), which reads it from a bind mount (docker/compose.tls.yaml): by an
# ACL (setfacl) where the file system has them, else by mode 0644, said on
# stderr.
set -euo pipefail
for_container=false
if [[ ${1:-} == --for-container ]]; then
  for_container=true
  shift
fi
dir=${1:?usage: make_dev_certs.sh [--for-container] DIR [EXTRA_DNS_NAME...]}
shift
mkdir -p "$dir"
cd "$dir"
umask 077  # Keys are owner-only from the moment they are written.
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
chmod 600 ./*.key
chmod 644 ./*.crt
if $for_container; then
  if command -v setfacl >/dev/null 2>&1 && setfacl -m u:10001:r tls.key 2>/dev/null; then
    echo "make_dev_certs: tls.key readable by uid 10001 (the image's user) by an ACL" >&2
  else
    chmod 644 tls.key
    echo "make_dev_certs: no ACLs here: tls.key made 0644 (readable by every user) for the" \
      "container; development certificates only" >&2
  fi
fi
echo "make_dev_certs: wrote $dir/{ca.crt,tls.crt,tls.key,client.crt,client.key} ($san)"
