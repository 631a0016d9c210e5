#!/bin/sh
# The image's HEALTHCHECK (and a Kubernetes exec probe): grpc.health.v1 on the
# local gRPC port. Plaintext unless the environment says otherwise:
#   ATTENTION_TLS_CA_FILE           TLS: the CA that signed the server's certificate
#   ATTENTION_TLS_SERVER_NAME       the name in that certificate (default: localhost)
#   ATTENTION_TLS_CLIENT_CERT_FILE  mutual TLS: a client certificate the server trusts
#   ATTENTION_TLS_CLIENT_KEY_FILE   ... and its key
#   ATTENTION_TOKEN_FILE            a bearer token file (only needed with --auth_probes;
#                                   ATTENTION_TOKEN works too)
set -e
client=${ATTENTION_CLIENT:-/usr/local/bin/attention-client}
set -- health --server="127.0.0.1:${ATTENTION_PORT:-50051}" --deadline_ms=2000
if [ -n "$ATTENTION_TLS_CA_FILE" ]; then
  set -- "$@" --tls_ca_file="$ATTENTION_TLS_CA_FILE" \
    --tls_server_name="${ATTENTION_TLS_SERVER_NAME:-localhost}"
fi
if [ -n "$ATTENTION_TLS_CLIENT_CERT_FILE" ]; then
  set -- "$@" --tls_cert_file="$ATTENTION_TLS_CLIENT_CERT_FILE" \
    --tls_key_file="$ATTENTION_TLS_CLIENT_KEY_FILE"
fi
if [ -n "$ATTENTION_TOKEN_FILE" ]; then
  set -- "$@" --token_file="$ATTENTION_TOKEN_FILE"
fi
exec "$client" "$@"
