"""Python client of the attention inference service (attention.v1 over gRPC).

    from attention_client import AttentionClient
    client = AttentionClient("localhost:50051")
    result = client.infer(query, key_padding_mask=mask, need_weights=True)
    result.output, result.attn_weights, result.queue_us, result.compute_us

    # Sessions: the server keeps keys and values; each append sends only the new tokens.
    with client.session() as s:               # Self-attention on the default model.
        s.append(prompt)                      # (T, E) -> AppendResult(output (T, E), length)
        step = s.append(token)                # (1, E): equals infer(is_causal=True)'s last row.
    client.session(replay=True)               # ReplayingSession: re-created and replayed
                                              # when lost (NOT_FOUND / UNAVAILABLE).

    # TLS (system roots, or tls_ca_file), mutual TLS (tls_cert_file + tls_key_file), and a
    # bearer token on every call (token, token_file, or the environment's ATTENTION_TOKEN):
    AttentionClient("attention:50051", tls_ca_file="ca.pem", tls_cert_file="client.pem",
                    tls_key_file="client.key", token_file="token")

Inputs and outputs are NumPy arrays: float32 or float16 tensors, bool masks (bfloat16 is sent
as raw 16-bit words with `bfloat16=True`). Run with Debian's /usr/bin/python3 (python3-grpcio,
python3-numpy). The gRPC stubs are generated at build time from proto/ into
build/client/python/gen; set ATTENTION_PY_GEN to use another directory. Sessions: see
attention_client.session (and examples/decode_loop.py).
"""
from .client import (AttentionClient, AttentionError, InferResult, add_security_flags,  # noqa: F401
                     security_kwargs)
from .session import AppendResult, ReplayingSession, Session, SessionInfo  # noqa: F401

__all__ = ["AttentionClient", "AttentionError", "InferResult", "Session", "ReplayingSession",
           "AppendResult", "SessionInfo", "add_security_flags", "security_kwargs"]
