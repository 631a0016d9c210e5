"""attention-client: the Python client of attention-service (attention.v1 and the Open
Inference Protocol over gRPC).

    /usr/bin/python3 -m venv --system-site-packages ~/attention-venv   # sees Debian's grpcio
    ~/attention-venv/bin/pip install ./client/python   # docs/clients/python.md#install

    import numpy as np
    from attention_client import AttentionClient, AttentionError

    client = AttentionClient("localhost:50051")
    client.wait_ready(timeout=30)                     # True once the server reports SERVING
    query = np.random.rand(1, 16, 256).astype(np.float32)
    result = client.infer(query, is_causal=True, need_weights=True)  # model_version=2: that one
    result.output, result.attn_weights, result.queue_us, result.compute_us, result.model_version

    # Models, versions and model control (load/unload: --model_control=explicit).
    client.models()                           # dicts: name, version, versions (state, reason)...
    client.repository_index()                 # [RepositoryModel(name, version, state, reason)]
    client.load_model("encoder"); client.unload_model("encoder")

    # Many requests on one stream (answers may come out of order: match request_id).
    for r in client.infer_stream({"query": q, "request_id": str(i)} for i, q in enumerate(qs)):
        r.request_id, r.error or r.output.shape

    # Sessions: the server keeps keys and values; each append sends only the new tokens.
    with client.session() as s:               # Self-attention on the default model.
        s.append(prompt)                      # (T, E) -> AppendResult(output (T, E), length)
        step = s.append(token)                # (1, E): equals infer(is_causal=True)'s last row.
    client.session(replay=True)               # ReplayingSession: re-created and replayed
                                              # when lost (NOT_FOUND / UNAVAILABLE).
    client.session_stream([{"session": s, "tokens": t}, ...])  # appends on one stream

    # TLS (system roots, or tls_ca_file), mutual TLS (tls_cert_file + tls_key_file), and a
    # bearer token on every call (token, token_file, or the environment's ATTENTION_TOKEN):
    AttentionClient("attention:50051", tls_ca_file="ca.pem", tls_cert_file="client.pem",
                    tls_key_file="client.key", token_file="token")

Also: InferenceClient (the Open Inference Protocol, KServe v2: infer, stream_infer,
sequences), attention_client.aio.AsyncAttentionClient (asyncio), attention_client.stubs (the
generated messages and stubs), attention_client.export (export_mha: a torch layer as a model
folder; the attention-export command), and `python -m attention_client health|models|
repository|load|unload|infer`.

Inputs and outputs are NumPy arrays: float32 or float16 tensors, bool masks (bfloat16 is sent
as raw 16-bit words with `bfloat16=True`). An argument the client cannot send (an
output_dtype or a model_version it does not know, an array of another dtype) raises
ValueError or TypeError naming it and what it accepts. Failed calls raise AttentionError
(.code, a grpc.StatusCode; .details; .hint, what to do when the client can tell: nothing
listening at the target, a TLS/plaintext mismatch or an untrusted certificate, a missing or
refused token, a deadline, a message over a size limit); a malformed target (a URL, no port)
raises it at construction.

gRPC core's own log is off unless asked for: importing attention_client sets the environment's
GRPC_VERBOSITY to NONE when it is not set (before this process makes its first channel), so
its raw lines ("E1129 ... ssl_transport_security.cc:1501] Handshake failed ...") do not
precede the AttentionError that says the same with a hint. GRPC_VERBOSITY=ERROR (or INFO,
DEBUG) in the environment brings them back.
"""
import os as _os

# Before the first channel: gRPC core reads GRPC_VERBOSITY once, when it starts.
_os.environ.setdefault("GRPC_VERBOSITY", "NONE")
from .client import (AttentionClient, InferResult, add_security_flags,  # noqa: F401
                     security_kwargs)
from .errors import AttentionError, check_target  # noqa: F401
from .inference import BF16, InferenceClient, InferenceResult, Sequence  # noqa: F401
from .models import ModelVersionState, RepositoryModel  # noqa: F401
from .session import AppendResult, ReplayingSession, Session, SessionInfo  # noqa: F401

try:
    from ._version import __version__  # noqa: F401 (written when the package is built)
except ImportError:  # A source checkout used without installing.
    __version__ = "0+source"

__all__ = ["AttentionClient", "AttentionError", "InferResult", "Session", "ReplayingSession",
           "AppendResult", "SessionInfo", "InferenceClient", "InferenceResult", "Sequence",
           "BF16", "RepositoryModel", "ModelVersionState", "add_security_flags", "security_kwargs", "check_target", "__version__"]
