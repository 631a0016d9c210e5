"""Sessions: server-held keys and values for incremental decoding (attention.v1.SessionService).

An autoregressive decoder calls attention once per new token over every token so far. Through
a session it sends each token once: the server keeps the projected keys and values and returns
only the new tokens' output rows, the rows one stateless infer() over the whole sequence gives
(with is_causal=True for a self-attention session).

    with client.session() as s:                 # kind="self", the default model
        prompt = s.append(prompt_tokens)        # (T, E): prefill
        step = s.append(next_token)             # (1, E): one decode step
        step.output, step.length, step.queue_us, step.compute_us

    # Cross-attention: keys and values fixed at creation (an encoder's output), queries appended.
    with client.session(kind="cross", key=memory, value=memory) as s:
        s.append(queries)

Sessions live in one server process: they do not survive a restart and are not shared between
replicas, and the server may close an idle one (its ttl_s) or evict it (memory). Calls then fail
with NOT_FOUND (UNAVAILABLE when its replica is gone); ReplayingSession (client.session(...,
replay=True)) recovers by creating a new session and re-sending the tokens appended so far.

A session id "<32 hex>@<address>" (a server run with --advertise_address) names the replica
holding it: the client sends the session's calls to that address. Behind an L7 gateway (nginx,
HAProxy, Istio) the client reaches one address, and the gateway routes by the metadata header
x-attention-session: each session is created under a fresh random key (128 bits), its id
carries the key ("<32 hex>.<key>"), and every call of the session sends it. Appends send the
session's length as expected_length, so an append that would land on a diverged copy of the
session (a key moved back to a replica holding an older one, or an append applied twice) fails
with FAILED_PRECONDITION instead of returning wrong rows. One Session is used by one thread at
a time; the client and its channels are shared.
"""
import secrets
from dataclasses import dataclass
from typing import Optional

import grpc
import numpy as np

from ._codec import _decode, _encode, checked, output_dtype_of
from ._stubs import attention_pb2, sessions_pb2
from .errors import AttentionError

_KINDS = {"self": sessions_pb2.SESSION_KIND_SELF, "cross": sessions_pb2.SESSION_KIND_CROSS}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}


@dataclass
class AppendResult:
    output: np.ndarray                   # (T, E): the new tokens' output rows.
    attn_weights: Optional[np.ndarray]   # (T, S') averaged or (H, T, S') per head.
    length: int                          # The session's length after this append.
    queue_us: int                        # Server-side queue time.
    compute_us: int                      # The executed batch's compute time.
    batch_requests: int                  # Appends (of different sessions) in the batch.
    request_id: str = ""
    session_id: str = ""                 # session_stream(): the append's session.
    error: Optional[AttentionError] = None  # session_stream(): this append failed (no output).
    model_version: int = 0               # The version that computed it: the session's.


def _append_request(session_id, tokens, not_key=None, need_weights=False,
                    per_head_weights=False, output_dtype=None, bfloat16=False, request_id=""):
    """The AppendRequest of Session.append()'s arguments (also session_stream()'s)."""
    checked(request_id=request_id, need_weights=need_weights, per_head_weights=per_head_weights)
    request = sessions_pb2.AppendRequest(session_id=session_id, request_id=request_id,
                                         need_weights=need_weights,
                                         per_head_weights=per_head_weights,
                                         output_dtype=output_dtype_of(output_dtype))
    _encode(tokens, request.tokens, bfloat16, "tokens")
    if not_key is not None:
        _encode(not_key, request.not_key, argument="not_key")
    return request


@dataclass
class SessionInfo:
    session_id: str
    model: str
    kind: str               # "self" or "cross".
    length: int             # Tokens appended so far.
    keys: int               # Keys held: length (self) or S (cross).
    bytes: int              # Cache memory held.
    created_unix_ms: int
    last_used_unix_ms: int
    ttl_s: int              # Idle seconds before it expires.
    max_tokens: int         # The model's max_session_tokens.
    model_version: int = 0  # The version it was created on, which computes all its appends.

    @classmethod
    def from_proto(cls, info):
        return cls(session_id=info.session_id, model=info.model,
                   kind=_KIND_NAMES.get(info.kind, "unspecified"), length=info.length,
                   keys=info.keys, bytes=info.bytes, created_unix_ms=info.created_unix_ms,
                   last_used_unix_ms=info.last_used_unix_ms, ttl_s=info.ttl_s,
                   max_tokens=info.max_tokens, model_version=info.model_version)


class Session:
    """One session on the server; created by AttentionClient.session().

    model: model name ("" the server's default). kind: "self" (appended tokens are queries,
    keys and values) or "cross" (key (S, kdim), value (S, vdim; absent: key) and optional
    key_padding_mask (S) given here; appends send queries). is_causal (cross): query p sees
    keys j <= p. ttl_s: idle seconds before the server expires it (0: the model's default).
    bfloat16=True sends key/value as bfloat16.

    Attributes: session_id, model (the served name), model_version (the version it was
    created on, which computes its appends), kind, length (after the last append),
    max_tokens, created (the SessionInfo at creation). Methods raise AttentionError on failure.
    A context manager: closes the session on exit.
    """

    def __init__(self, client, model="", kind="self", ttl_s=0, key=None, value=None,
                 key_padding_mask=None, is_causal=False, bfloat16=False):
        if kind not in _KINDS:
            raise ValueError(f"kind: expected 'self' or 'cross', got {kind!r}")
        checked(model=model, ttl_s=ttl_s, is_causal=is_causal)
        self._client = client
        request = sessions_pb2.CreateSessionRequest(model=model, kind=_KINDS[kind],
                                                    is_causal=is_causal, ttl_s=ttl_s)
        if key is not None:
            _encode(key, request.key, bfloat16, "key")
        if value is not None:
            _encode(value, request.value, bfloat16, "value")
        if key_padding_mask is not None:
            _encode(key_padding_mask, request.key_padding_mask, argument="key_padding_mask")
        self._create_request = request
        self._create()

    def _create(self):
        # A fresh routing key for every session, a re-created one included; a retry of this
        # call (the channel retries UNAVAILABLE) sends the same key and gets the same session.
        self.created = SessionInfo.from_proto(self._client._session_call(
            "CreateSession", self._create_request, routing_key=secrets.token_hex(16)))
        self.session_id = self.created.session_id
        self.model = self.created.model
        self.kind = self.created.kind
        self.length = self.created.length
        self.max_tokens = self.created.max_tokens
        self.model_version = self.created.model_version
        self._closed = False

    def _append_request(self, tokens, not_key, need_weights, per_head_weights, output_dtype,
                        bfloat16, request_id):
        request = _append_request(self.session_id, tokens, not_key, need_weights,
                                  per_head_weights, output_dtype, bfloat16, request_id)
        request.expected_length = self.length  # A diverged copy refuses it (Scale-out).
        return request

    def _send(self, request):
        response = self._client._session_call("Append", request)
        self.length = response.length
        return AppendResult(output=_decode(response.output),
                            attn_weights=_decode(response.attn_weights), length=response.length,
                            queue_us=response.queue_us, compute_us=response.compute_us,
                            batch_requests=response.batch_requests,
                            request_id=response.request_id,
                            model_version=response.model_version)

    def append(self, tokens, not_key=None, need_weights=False, per_head_weights=False,
               output_dtype=None, bfloat16=False, request_id=""):
        """Appends tokens (T, E) (float32 or float16; bfloat16=True sends bfloat16) and returns
        their output rows as an AppendResult.

        not_key (self sessions, optional (T) bool): True stores the token but no token attends
        to it (as key_padding_mask over the whole sequence). need_weights: also return the new
        rows' attention probabilities over every key held, (T, S') averaged or, with
        per_head_weights, (H, T, S'). output_dtype: "float32", "float16" or "bfloat16"
        (returned as float32 values); default: the tokens'. An error leaves the session
        unchanged (except UNAVAILABLE/DEADLINE_EXCEEDED, after which its state is unknown: the
        next append then fails FAILED_PRECONDITION "expected_length: ..." if this one was
        applied after all).
        """
        return self._send(self._append_request(tokens, not_key, need_weights, per_head_weights,
                                               output_dtype, bfloat16, request_id))

    def info(self):
        """GetSession: the SessionInfo now (length, keys, bytes, times)."""
        return self._client.session_info(self.session_id)

    def close(self):
        """Frees the session on the server; returns the bytes freed (0 if it was already gone:
        closed, expired or evicted). The session's id is kept: info() then raises NOT_FOUND."""
        if self._closed:
            return 0
        try:
            freed = self._client.close_session(self.session_id)
        except AttentionError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
            freed = 0
        self._closed = True
        return freed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        try:
            self.close()
        except AttentionError:
            if exc_type is None:  # Do not hide the exception that ended the block.
                raise

    def __repr__(self):
        return (f"{type(self).__name__}({self.session_id!r}, kind={self.kind!r}, "
                f"length={self.length})")


def _is_lost(error):
    """Whether an AttentionError means the session is lost (re-create and replay it)."""
    if error.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
        return True
    return (error.code == grpc.StatusCode.FAILED_PRECONDITION and
            (error.details or "").startswith("expected_length:"))


def _merged(history, max_tokens):
    """The chunks of `history` (AppendRequests) concatenated, in order, into appends of at most
    `max_tokens` tokens of one dtype (a longer chunk goes alone, as it went first)."""
    out, group, rows = [], [], 0
    for chunk in history + [None]:
        if group and (chunk is None or chunk.tokens.dtype != group[0].tokens.dtype or
                      rows + chunk.tokens.shape[0] > max_tokens):
            merged = sessions_pb2.AppendRequest()
            merged.tokens.dtype = group[0].tokens.dtype
            merged.tokens.shape[:] = [rows, group[0].tokens.shape[1]]
            merged.tokens.data = b"".join(c.tokens.data for c in group)
            if any(c.HasField("not_key") for c in group):
                merged.not_key.dtype = attention_pb2.DATA_TYPE_BOOL
                merged.not_key.shape[:] = [rows]
                merged.not_key.data = b"".join(
                    c.not_key.data if c.HasField("not_key") else bytes(c.tokens.shape[0])
                    for c in group)
            out.append(merged)
            group, rows = [], 0
        if chunk is not None:
            group.append(chunk)
            rows += chunk.tokens.shape[0]
    return out


class ReplayingSession(Session):
    """A Session that survives losing its server-side state.

    It remembers every chunk appended (tokens and not_key, as sent) and the session's length.
    When an append fails with NOT_FOUND (the session was closed, expired or evicted, its
    replica restarted, or a gateway moved its key to another replica), UNAVAILABLE (its replica
    is gone or draining) or FAILED_PRECONDITION "expected_length: ..." (it reached a diverged
    copy of the session, which is closed), it creates a new session with the same parameters
    under a fresh routing key (through the client's target, so possibly on another replica),
    re-sends the history merged into appends of up to `replay_chunk_tokens` tokens (at most
    the model's max_batch_tokens), and retries the append, up to MAX_RECOVERIES times per
    call; past that, or on any other error, it raises AttentionError (a failed recovery never
    leaves a partly replayed session behind: the next append starts a new one). The outputs
    returned are the new session's, which equal the lost one's to float rounding. session_id
    changes on recovery; `recoveries` counts the sessions re-created and `replayed_tokens` the
    tokens re-sent. The client holds the history in memory. close() frees the session; a later
    append re-creates it from the history.
    """

    MAX_RECOVERIES = 3

    def __init__(self, *args, replay_chunk_tokens=256, **kwargs):
        self.history = []  # AppendRequests (tokens, not_key) of every chunk appended, in order.
        self.recoveries = 0
        self.replayed_tokens = 0
        self.replay_chunk_tokens = max(1, replay_chunk_tokens)
        self._replayed = True  # False while the server's session may lack part of history.
        super().__init__(*args, **kwargs)

    def _recreate(self, stale=False):
        if stale:  # Alive but diverged: free it (best effort).
            try:
                self._client.close_session(self.session_id)
            except AttentionError:
                pass
        self._replayed = False
        self._create()
        try:
            for chunk in _merged(self.history, self.replay_chunk_tokens):
                chunk.session_id = self.session_id
                chunk.expected_length = self.length
                self._send(chunk)
                self.replayed_tokens += chunk.tokens.shape[0]
        except AttentionError:
            try:  # Free the partly replayed session (best effort).
                self._client.close_session(self.session_id)
            except AttentionError:
                pass
            raise
        self._replayed = True

    def append(self, tokens, not_key=None, need_weights=False, per_head_weights=False,
               output_dtype=None, bfloat16=False, request_id=""):
        """As Session.append, recovering a lost session (see the class)."""
        request = self._append_request(tokens, not_key, need_weights, per_head_weights,
                                       output_dtype, bfloat16, request_id)
        lost, stale = not self._replayed, False  # The last recovery may have failed midway.
        for attempt in range(self.MAX_RECOVERIES + 1):
            try:
                if lost:
                    self._recreate(stale)
                    self.recoveries += 1
                    request.session_id = self.session_id
                    request.expected_length = self.length
                result = self._send(request)
                break
            except AttentionError as e:
                if attempt == self.MAX_RECOVERIES or not _is_lost(e):
                    raise
                stale = self._replayed and e.code == grpc.StatusCode.FAILED_PRECONDITION
                lost = True
        chunk = sessions_pb2.AppendRequest(tokens=request.tokens)
        if request.HasField("not_key"):
            chunk.not_key.CopyFrom(request.not_key)
        self.history.append(chunk)
        return result
