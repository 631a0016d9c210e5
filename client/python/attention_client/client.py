"""AttentionClient: infer(), models(), health() and sessions (session.py) over gRPC channels."""
import json
import threading
import time
from typing import Any, Iterable, Iterator, List, Mapping, Optional

import grpc

from . import _lifetime, _streams
# The codec's and the errors' names stay importable from attention_client.client too.
from ._codec import (_OUTPUT_DTYPES, InferResult, _decode, _encode,  # noqa: F401
                     _infer_result, bfloat16_to_float32, checked, float32_to_bfloat16,
                     model_version_of, output_dtype_of)
from ._stubs import attention_pb2, attention_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from ._stubs import grpc_predict_v2_pb2_grpc
from .errors import (AttentionError, check_target, from_rpc_error, names_one_server,  # noqa: F401
                     status_code)
from .models import (RepositoryModel, index_request, load_request, model_dict,
                     repository_models, unload_request)
# The security's names stay importable from attention_client.client too.
from ._security import (TOKEN_ENV, _BearerTokenInterceptor, _CallDetails,  # noqa: F401
                        _read_file, _Security, add_security_flags, channel_security,
                        resolve_token, security_kwargs)
from .session import AppendResult, ReplayingSession, Session, SessionInfo


# grpc.health.v1.HealthCheckResponse.ServingStatus.
_HEALTH_STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_request(service):
    """grpc.health.v1.HealthCheckRequest{service} (Debian packages no Python health stubs)."""
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def _health_status(response):
    """The status field (1, varint) of a HealthCheckResponse."""
    return response[1] if len(response) >= 2 and response[0] == 0x08 else 0


MAX_MESSAGE_BYTES = 256 << 20  # The largest message the client sends or receives.

_RETRY_POLICY = {"maxAttempts": 4, "initialBackoff": "0.02s", "maxBackoff": "0.5s",
                 "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}


# Session calls without effect on a session's contents are retried like Infer; an Append
# is not (ReplayingSession recovers a lost session), as in the C++ client.
_RETRIED_SESSION_METHODS = ("CreateSession", "GetSession", "CloseSession")


def service_config(load_balancing="round_robin", target=None, token=False):
    """The service config of the client's channel for attention.v1 calls.

    UNAVAILABLE (a replica draining or gone) is retried: computing attention has no side
    effects; of the attention.v1.SessionService calls, CreateSession, GetSession and
    CloseSession are too (never Append, whose retry could apply the tokens twice).
    load_balancing names the policy (None or "": gRPC's default, pick_first). With
    round_robin (the default) the channel also health-checks every backend (grpc.health.v1),
    so replicas reporting NOT_SERVING get no calls and a retry goes to the next healthy
    replica; with pick_first every attempt goes to the same one. A target that can name only
    one server (names_one_server: 10.0.0.5:50051) is not health-checked: there is no other
    replica to choose, and under a flood past the server's gRPC receive quota gRPC may cancel
    the health Watch call, which fails every call UNAVAILABLE for the Watch's retry backoff
    (1 s, growing 1.6x per failure in a row up to 120 s); names stay exposed to that. Nor is
    a channel with a token (`token` true): gRPC's health-check calls do not pass through
    the interceptor that adds it, and a server with --auth_probes refused them, failing
    every call UNAVAILABLE; a draining replica's UNAVAILABLE is retried instead.
    """
    names = [{"service": "attention.v1.AttentionService"}]
    names += [{"service": "attention.v1.SessionService", "method": method}
              for method in _RETRIED_SESSION_METHODS]
    config = {"methodConfig": [{"name": names, "retryPolicy": dict(_RETRY_POLICY)}]}
    if load_balancing:
        config["loadBalancingConfig"] = [{load_balancing: {}}]
    if load_balancing == "round_robin" and not token and not (target and names_one_server(target)):
        config["healthCheckConfig"] = {"serviceName": ""}
    return config


def _channel_options(config, max_message_bytes=MAX_MESSAGE_BYTES):
    return [("grpc.service_config", json.dumps(config)),
            ("grpc.enable_retries", 1),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # gRPC keeps at most this much of a call for retries (256 KiB by default): a
            # larger request would be committed at once and never retried. (The second,
            # channel-wide limit is grpc-js's; gRPC C-core, under grpcio, ignores it.)
            ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
            ("grpc.retry_buffer_size", max_message_bytes)]


# The health channel reconnects quickly (gRPC's default backoff, 1 s growing to 120 s, would
# let a polling health() see a server come up seconds late); wait_ready() polls over a fresh
# channel each time instead, with its own subchannel (never one still backing off).
_HEALTH_BACKOFF_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                           ("grpc.max_reconnect_backoff_ms", 1000)]


# Sessions behind an L7 gateway (nginx, HAProxy, Istio): every session call carries its routing
# key in this metadata header, and a session created with a key has the id "<32 hex>.<key>"
# (then "@<address>" with --advertise_address), so the id alone gives the key.
ROUTING_HEADER = "x-attention-session"


def routing_key_of(session_id):
    """The routing key a session id carries ("" if none): after the first '.' before any '@'."""
    local = session_id.split("@", 1)[0]
    return local.partition(".")[2]


class AttentionClient:
    """A client of attention.v1.AttentionService.

    target: any gRPC target: "host:port", "dns:///svc:50051", "ipv4:127.0.0.1:1,127.0.0.1:2"; a
    URL or a host without a port raises AttentionError (INVALID_ARGUMENT) naming the right form.
    max_message_bytes: the largest message the client sends or receives (256 MiB by default;
    the server has its own --max_message_bytes).
    load_balancing: "round_robin" (default: calls spread over every address of the target,
    replicas reporting NOT_SERVING skipped), "pick_first", or None for gRPC's default.
    timeout: deadline of every call, in seconds.
    Calls that the server refuses with UNAVAILABLE (a replica draining or gone) are retried
    (up to 4 attempts, requests up to MAX_MESSAGE_BYTES); with round_robin a retry goes to
    the next healthy replica, with pick_first to the same one.

    Sessions (attention.v1.SessionService, server-held keys and values for incremental
    decoding): session() creates one (see attention_client.session). A session id
    "<hex>@<address>" (a server run with --advertise_address) names the replica holding the
    session: its calls go to a channel to that address (pick_first, one per address, kept
    until close()); other ids, and CreateSession, use the target's channel. Every session call
    also carries the session's routing key in the metadata header x-attention-session, by
    which a gateway in front of the replicas (nginx, HAProxy, Istio) routes it.

    Security (the same for every channel: calls, health, session replicas):
    tls: TLS with the system's roots. tls_ca_file: PEM roots to trust instead (implies TLS).
    tls_cert_file and tls_key_file: a PEM client certificate and its key, for mutual TLS
    (implies TLS; one without the other is a ValueError). tls_server_name: the name expected
    in the server's certificate instead of the target's host (implies TLS).
    token: a bearer token sent on every call as `authorization: Bearer <token>` (None: read
    from token_file, else the environment variable ATTENTION_TOKEN; "": no token), added by
    a channel interceptor over TLS and plaintext alike (see _BearerTokenInterceptor).
    """

    def __init__(self, target, timeout=30.0, load_balancing="round_robin", tls=False,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None, tls_server_name=None,
                 token=None, token_file=None, max_message_bytes=MAX_MESSAGE_BYTES):
        check_target(target)
        self.target = target
        self.max_message_bytes = max_message_bytes
        self._client_certificate = bool(tls_cert_file)
        self._security = channel_security(tls=tls, tls_ca_file=tls_ca_file,
                                          tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                                          tls_server_name=tls_server_name, token=token,
                                          token_file=token_file)
        self.tls = self._security.credentials is not None
        self.timeout = timeout
        self.service_config = service_config(load_balancing, target,
                                             token=self._security.interceptor is not None)
        # health() has its own channel that asks the first reachable address, without
        # client-side health checking: with it, a NOT_SERVING backend would fail the Check
        # call UNAVAILABLE instead of answering NOT_SERVING.
        self.health_service_config = {"loadBalancingConfig": [{"pick_first": {}}]}
        self._channel = self._make_channel(target, self.service_config)
        self._stub = attention_pb2_grpc.AttentionServiceStub(self._channel)
        self._session_stub = sessions_pb2_grpc.SessionServiceStub(self._channel)
        # The Open Inference Protocol's repository calls (repository_index) on the same channel.
        self._oip_stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._replicas = {}  # address -> (channel, SessionServiceStub)
        self._replicas_lock = threading.Lock()
        self._health_channel = self._make_channel(target, self.health_service_config,
                                                  _HEALTH_BACKOFF_OPTIONS)
        self._health_check = self._health_channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=_health_request,
            response_deserializer=_health_status)
        _lifetime.track(self)  # Closed at exit if the program does not (see _lifetime).

    def _make_channel(self, target, config, extra_options=()):
        """A channel to `target` with service config `config` and the client's security."""
        options = (_channel_options(config, self.max_message_bytes) + self._security.options
                   + list(extra_options))
        if "healthCheckConfig" in config:
            # Its subchannels are its own, not shared with the client's other channels to the
            # same target. Debian's grpcio 1.51 crashes the process (SIGSEGV) when two channels
            # to one unreachable target share subchannels and one health-checks them: health()
            # on the pick_first health channel, then infer() or models() here.
            options.append(("grpc.use_local_subchannel_pool", 1))
        if self._security.credentials is not None:
            channel = grpc.secure_channel(target, self._security.credentials, options=options)
        else:
            channel = grpc.insecure_channel(target, options=options)
        if self._security.interceptor is not None:
            channel = grpc.intercept_channel(channel, self._security.interceptor)
        return channel

    def close(self):
        """Closes the client's channels (calls in progress are cancelled) and lets them go;
        later calls raise ValueError. A client left open is closed at interpreter exit."""
        _lifetime.untrack(self)
        self._release()

    def _release(self):
        closed = _lifetime.Closed(f"AttentionClient({self.target!r})")
        with self._replicas_lock:
            channels = [self._channel, self._health_channel]
            channels += [channel for channel, _ in self._replicas.values()]
            self._replicas = {}
            self._channel = self._health_channel = closed
            self._stub = self._session_stub = self._health_check = self._oip_stub = closed
        for channel in channels:
            if not isinstance(channel, _lifetime.Closed):
                channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def infer(self, query, key=None, value=None, key_padding_mask=None, attn_mask=None,
              is_causal=False, need_weights=False, per_head_weights=False, model="",
              output_dtype=None, request_id="", bfloat16=False, model_version=0):
        """Runs torch.nn.MultiheadAttention(query, key, value, ...) on the server, in the
        model's layout (batch-first unless it was exported from a batch_first=False layer).

        query (N, L, E) or (L, E); key (N, S, kdim) and value (N, S, vdim), absent for
        self-attention; key_padding_mask (N, S) bool (True = ignore) or float (added);
        attn_mask (L, S) or (N*H, L, S), bool (True = not allowed) or float (added).
        output_dtype: "float32", "float16" or "bfloat16" (returned as float32 values), or
        np.float32, np.float16, torch.float32/bfloat16/float16; default: the query's (other
        values raise ValueError naming the ones accepted). bfloat16=True sends
        query/key/value as bfloat16. model_version: the version to run (an int, or a string
        of digits); 0: the newest serving. The result's model_version says which computed it.
        Raises AttentionError on failure.
        """
        request = self._infer_request(query, key, value, key_padding_mask, attn_mask, is_causal,
                                      need_weights, per_head_weights, model, output_dtype,
                                      request_id, bfloat16, model_version)
        try:
            response = self._stub.Infer(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return _infer_result(response)

    @staticmethod
    def _infer_request(query, key=None, value=None, key_padding_mask=None, attn_mask=None,
                       is_causal=False, need_weights=False, per_head_weights=False, model="",
                       output_dtype=None, request_id="", bfloat16=False, model_version=0):
        if not isinstance(model, str):
            raise TypeError(f"model: expected a model name (str; '' for the server's default), "
                            f"got {type(model).__name__} {model!r}")
        checked(request_id=request_id, is_causal=is_causal, need_weights=need_weights,
                per_head_weights=per_head_weights)
        request = attention_pb2.InferRequest(model=model, request_id=request_id,
                                             is_causal=is_causal, need_weights=need_weights,
                                             per_head_weights=per_head_weights,
                                             output_dtype=output_dtype_of(output_dtype),
                                             model_version=model_version_of(model_version))
        _encode(query, request.query, bfloat16, "query")
        if key is not None:
            _encode(key, request.key, bfloat16, "key")
        if value is not None:
            _encode(value, request.value, bfloat16, "value")
        if key_padding_mask is not None:
            _encode(key_padding_mask, request.key_padding_mask, argument="key_padding_mask")
        if attn_mask is not None:
            _encode(attn_mask, request.attn_mask, argument="attn_mask")
        return request

    def session(self, model="", kind="self", ttl_s=0, key=None, value=None,
                key_padding_mask=None, is_causal=False, bfloat16=False, replay=False):
        """Creates a session (CreateSession) and returns it as a Session, a context manager
        that closes it on exit; replay=True returns a ReplayingSession, which survives losing
        the session (see attention_client.session). Raises AttentionError on failure."""
        cls = ReplayingSession if replay else Session
        return cls(self, model=model, kind=kind, ttl_s=ttl_s, key=key, value=value,
                   key_padding_mask=key_padding_mask, is_causal=is_causal, bfloat16=bfloat16)

    def session_info(self, session_id):
        """GetSession: a session's SessionInfo (length, memory, times), from its replica.
        Raises AttentionError (NOT_FOUND: unknown, closed, expired or evicted)."""
        request = sessions_pb2.GetSessionRequest(session_id=session_id)
        return SessionInfo.from_proto(self._session_call("GetSession", request))

    def close_session(self, session_id):
        """CloseSession: frees a session at once; returns the cache bytes freed. Raises
        AttentionError (NOT_FOUND if unknown)."""
        request = sessions_pb2.CloseSessionRequest(session_id=session_id)
        return self._session_call("CloseSession", request).freed_bytes

    def session_stub(self, session_id=""):
        """The SessionService stub for `session_id`'s replica: the one in its id after '@',
        else (and for "") the target's."""
        at = session_id.find("@")
        if at < 0:
            return self._session_stub
        address = session_id[at + 1:]
        with self._replicas_lock:
            if isinstance(self._channel, _lifetime.Closed):
                return self._session_stub  # Raises ValueError when called.
            replica = self._replicas.get(address)
            if replica is None:
                channel = self._make_channel(address, service_config("pick_first"))
                replica = (channel, sessions_pb2_grpc.SessionServiceStub(channel))
                self._replicas[address] = replica
        return replica[1]

    def _session_call(self, method, request, routing_key=None):
        """One SessionService call, sent to the replica of request.session_id, with the metadata
        header x-attention-session (ROUTING_HEADER) set to `routing_key` or, if None, to the key
        the session id carries (an L7 gateway routes the session's calls by it)."""
        session_id = getattr(request, "session_id", "")
        stub = self.session_stub(session_id)
        key = routing_key if routing_key is not None else routing_key_of(session_id)
        metadata = ((ROUTING_HEADER, key),) if key else None
        try:
            return getattr(stub, method)(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def models(self):
        """The served models: a list of dicts mirroring attention.v1.ModelInfo, with "version"
        (the newest serving) and "versions" (every known version: version, state, reason)."""
        response = self._call("ListModels", attention_pb2.ListModelsRequest())
        return [model_dict(m) for m in response.models]

    _model_dict = staticmethod(model_dict)

    def repository_index(self, ready=False) -> List[RepositoryModel]:
        """Every model of the server's repository, served or not, one entry per version
        (name, version, state "READY"/"UNAVAILABLE", reason): the Open Inference Protocol's
        RepositoryIndex, Triton's get_model_repository_index. ready=True: only READY ones."""
        request = index_request(ready)
        try:
            response = self._oip_stub.RepositoryIndex(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return repository_models(response)

    def load_model(self, model_name) -> List[int]:
        """Loads (or re-reads) a model from the repository per its version policy and returns
        the versions serving after it (attention.v1 LoadModel). Needs a server run with
        --model_control=explicit (FAILED_PRECONDITION otherwise) and, with tokens, the admin
        permission; a model with no folder is NOT_FOUND; a load that serves no version raises
        the load's error (the repository index has its reason)."""
        return list(self._call("LoadModel", load_request(model_name)).versions)

    def unload_model(self, model_name) -> None:
        """Stops serving every version of a model (attention.v1 UnloadModel): requests admitted
        finish, its sessions end. Same mode and permission as load_model; NOT_FOUND when no
        version of it serves."""
        self._call("UnloadModel", unload_request(model_name))

    def _call(self, method, request):
        """One AttentionService call with the client's deadline; AttentionError on failure."""
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def health_status(self, service=""):
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING" (e.g. loading or draining),
        "SERVICE_UNKNOWN" or "UNKNOWN". Raises AttentionError if the call fails (unreachable:
        UNAVAILABLE; unknown service: NOT_FOUND)."""
        try:
            status = self._health_check(service, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return _HEALTH_STATUS_NAMES.get(status, "UNKNOWN")

    def health(self, service=""):
        """True only when grpc.health.v1 reports SERVING (False if unreachable)."""
        try:
            return self.health_status(service) == "SERVING"
        except AttentionError:
            return False

    # Added with the package: errors with hints, readiness, streams.

    def _error(self, rpc_error):
        """An AttentionError for a failed call, with a hint when the client can tell what to do
        (attention_client.errors.advise)."""
        return from_rpc_error(rpc_error, self.target, self.tls, self._client_certificate,
                              self.max_message_bytes, self.timeout,
                              self._security.interceptor is not None)

    def wait_ready(self, timeout=30.0, service="", poll_interval=0.1):
        """Waits until the server reports SERVING (grpc.health.v1), up to `timeout` seconds:
        True once it does, False if it did not in time. Each poll (every poll_interval s) makes
        a fresh connection, so a server is noticed within about poll_interval of serving, not
        after gRPC's reconnect backoff (seconds, growing)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            channel = self._make_channel(self.target, self.health_service_config,
                                         [("grpc.use_local_subchannel_pool", 1)])
            try:
                check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=_health_request,
                                            response_deserializer=_health_status)
                if check(service, timeout=max(0.05, min(remaining, 1.0))) == 1:
                    return True
            except grpc.RpcError:
                pass
            finally:
                channel.close()
            if time.monotonic() + poll_interval >= deadline:
                return False
            time.sleep(poll_interval)

    def infer_stream(self, requests: Iterable[Mapping[str, Any]],
                     timeout: Optional[float] = None) -> Iterator[InferResult]:
        """Sends many requests on one InferStream and yields an InferResult per request as the
        server answers: possibly out of order (match them by request_id; a request without
        one is given its index as a string). Each request is a dict of infer()'s keyword
        arguments (query required). A request that failed yields a result whose `error` is an
        AttentionError (output None); the stream goes on. The stream's deadline is `timeout`
        seconds (default: the client's timeout) for all of it; an error of the stream itself
        raises AttentionError. Requests are read from the iterable as the stream sends them.
        When the server closes the stream (UNAVAILABLE: a drain, a connection recycled), a new
        one is opened and the unanswered requests are sent again (attention_client._reopen)."""
        return _streams.infer_stream(self, requests, timeout or self.timeout)

    def session_stream(self, appends: Iterable[Mapping[str, Any]],
                       timeout: Optional[float] = None) -> Iterator[AppendResult]:
        """Appends to one or many sessions on one SessionStream and yields an AppendResult
        (with session_id and request_id) per append as the server answers: in order per
        session. Each append is a dict of Session.append()'s keyword arguments plus `session`
        (a Session, or a session id); a Session's `length` is updated from its results.
        Every session of a stream must live on one replica (the first append's session's).
        A failed append yields a result whose `error` is an AttentionError; the stream goes
        on. ReplayingSession is refused (TypeError): its history would miss stream appends.

        An append to a Session carries expected_length (the session's length plus the tokens
        of the stream's earlier appends to it), so an append after a failed one of the same
        session fails FAILED_PRECONDITION "expected_length: ..." instead of landing after a
        gap. When the server closes the stream (UNAVAILABLE), a new one is opened on the same
        replica and the unanswered appends are sent again: safe with expected_length (an
        append already applied is refused, not applied twice; its result is then DATA_LOSS:
        applied, its rows lost with the stream). An unanswered append to a bare session id
        has none; the stream's error is then raised."""
        return _streams.session_stream(self, appends, timeout or self.timeout)
