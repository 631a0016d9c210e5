"""AsyncAttentionClient: the attention.v1 client for asyncio (grpc.aio).

    import asyncio
    from attention_client.aio import AsyncAttentionClient

    async def main():
        async with AsyncAttentionClient("localhost:50051") as client:
            await client.wait_ready(10)
            result = await client.infer(query, is_causal=True)
            async for r in client.infer_stream([{"query": q} for q in queries]):
                ...
            async with await client.session() as s:
                step = await s.append(token)

    asyncio.run(main())

The same arguments, channel settings (retries, balancing, message limits), security and errors
(AttentionError with hints) as AttentionClient. Sessions: AsyncSession (create, append, info,
close); there is no replaying session here (use AttentionClient's ReplayingSession). Calls for
a session id naming a replica ("...@host:port") go to that replica.
"""
import asyncio
import time
from typing import Any, AsyncIterator, Iterable, List, Mapping, Optional

import grpc

from . import _lifetime, _reopen
from ._stubs import attention_pb2, attention_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from ._stubs import grpc_predict_v2_pb2_grpc
from ._codec import InferResult, _decode, _encode, _infer_result, checked
from .client import (MAX_MESSAGE_BYTES, _channel_options, _health_request, _health_status,
                     _HEALTH_STATUS_NAMES, AttentionClient, channel_security, service_config)
from .errors import AttentionError, advise, check_target
from .models import (RepositoryModel, index_request, load_request, model_dict,
                     repository_models, unload_request)
from .session import _KINDS, AppendResult, SessionInfo, _append_request


class AsyncAttentionClient:
    """attention.v1 over grpc.aio. Arguments as AttentionClient's. Use it from one event loop;
    `async with` closes its channels."""

    def __init__(self, target, timeout=30.0, load_balancing="round_robin", tls=False,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None, tls_server_name=None,
                 token=None, token_file=None, max_message_bytes=MAX_MESSAGE_BYTES):
        check_target(target)
        self.target, self.timeout, self.max_message_bytes = target, timeout, max_message_bytes
        self._security = channel_security(tls=tls, tls_ca_file=tls_ca_file,
                                          tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                                          tls_server_name=tls_server_name, token=token,
                                          token_file=token_file)
        self.tls = self._security.credentials is not None
        self._client_certificate = bool(tls_cert_file)
        # The token goes as per-call metadata, over TLS and plaintext alike (not as call
        # credentials: see client._BearerTokenInterceptor; grpc.aio's interceptors differ
        # from grpcio's).
        self._metadata = ()
        if self._security.interceptor is not None:
            self._metadata = (self._security.interceptor._header,)
        self._channel = self._make_channel(
            target, service_config(load_balancing, target, token=bool(self._metadata)))
        self._stub = attention_pb2_grpc.AttentionServiceStub(self._channel)
        self._session_stub = sessions_pb2_grpc.SessionServiceStub(self._channel)
        self._oip_stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._replicas = {}  # address -> (channel, SessionServiceStub)
        _lifetime.track(self)  # Released at exit if the program does not close it.

    def _make_channel(self, target, config, extra_options=()):
        options = (_channel_options(config, self.max_message_bytes) + self._security.options
                   + list(extra_options))
        if "healthCheckConfig" in config:
            options.append(("grpc.use_local_subchannel_pool", 1))
        if self._security.credentials is not None:
            return grpc.aio.secure_channel(target, self._security.credentials, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    async def close(self):
        """Closes the client's channels and lets them go (once the last grpc.aio channel is
        freed, grpc.aio stops its poller thread); later calls raise ValueError."""
        _lifetime.untrack(self)
        for channel in self._drop():
            await channel.close()

    def _drop(self):
        """Replaces the channels and stubs with Closed; returns the channels still open."""
        channels = [] if isinstance(self._channel, _lifetime.Closed) else [self._channel]
        channels += [channel for channel, _ in self._replicas.values()]
        closed = _lifetime.Closed(f"AsyncAttentionClient({self.target!r})")
        self._channel = self._stub = self._session_stub = self._oip_stub = closed
        self._replicas = {}
        return channels

    def _release(self):
        """At exit, outside any event loop: drops the channels; grpc.aio closes each as it is
        freed."""
        self._drop()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _error(self, rpc_error):
        """AttentionError with advise()'s hint (its probe runs off the event loop)."""
        code, details = rpc_error.code(), rpc_error.details()
        hint = await asyncio.get_running_loop().run_in_executor(
            None, advise, code, details, self.target, self.tls, self._client_certificate,
            self.max_message_bytes, self.timeout, self._security.interceptor is not None)
        return AttentionError(code, details, hint)

    async def _unary(self, method, request, stub=None):
        try:
            return await getattr(stub or self._stub, method)(
                request, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from None

    async def infer(self, query, **kwargs) -> InferResult:
        """As AttentionClient.infer (the same keyword arguments)."""
        request = AttentionClient._infer_request(query, **kwargs)
        return _infer_result(await self._unary("Infer", request))

    async def infer_stream(self, requests: Iterable[Mapping[str, Any]],
                           timeout: Optional[float] = None) -> AsyncIterator[InferResult]:
        """As AttentionClient.infer_stream: an async iterator of InferResult (out of order;
        a failed request's result has `error`). `requests` may be an iterable or an async
        iterable of dicts of infer()'s keyword arguments. Reopened as AttentionClient's when
        the server closes it (UNAVAILABLE)."""
        def key(message):
            return _reopen.echoed(message.request_id)

        outbox = _reopen.AsyncOutbox(requests, lambda index, kwargs: self._numbered(kwargs, index),
                                     key)
        responses = _reopen.async_stream(
            lambda messages, left: self._stub.InferStream(messages, timeout=left,
                                                          metadata=self._metadata),
            outbox, key, timeout or self.timeout)
        try:
            async for response, _, _ in responses:
                yield _infer_result(response)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from None
        finally:
            await responses.aclose()

    @staticmethod
    def _numbered(kwargs, index):
        kwargs = dict(kwargs)
        if not kwargs.get("request_id"):
            kwargs["request_id"] = str(index)
        return AttentionClient._infer_request(**kwargs)

    async def models(self):
        """As AttentionClient.models."""
        response = await self._unary("ListModels", attention_pb2.ListModelsRequest())
        return [model_dict(m) for m in response.models]

    async def repository_index(self, ready=False) -> List[RepositoryModel]:
        """As AttentionClient.repository_index."""
        return repository_models(await self._unary("RepositoryIndex", index_request(ready),
                                                    self._oip_stub))

    async def load_model(self, model_name) -> List[int]:
        """As AttentionClient.load_model: the versions serving after the load."""
        return list((await self._unary("LoadModel", load_request(model_name))).versions)

    async def unload_model(self, model_name) -> None:
        """As AttentionClient.unload_model."""
        await self._unary("UnloadModel", unload_request(model_name))

    async def health_status(self, service=""):
        """As AttentionClient.health_status (over a pick_first channel of its own)."""
        channel = self._make_channel(self.target, {"loadBalancingConfig": [{"pick_first": {}}]})
        try:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=_health_request,
                                        response_deserializer=_health_status)
            status = await check(service, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from None
        finally:
            await channel.close()
        return _HEALTH_STATUS_NAMES.get(status, "UNKNOWN")

    async def health(self, service="") -> bool:
        try:
            return await self.health_status(service) == "SERVING"
        except AttentionError:
            return False

    async def wait_ready(self, timeout=30.0, service="", poll_interval=0.1) -> bool:
        """As AttentionClient.wait_ready: a fresh connection per poll; True once SERVING."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            channel = self._make_channel(self.target,
                                         {"loadBalancingConfig": [{"pick_first": {}}]},
                                         [("grpc.use_local_subchannel_pool", 1)])
            try:
                check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=_health_request,
                                            response_deserializer=_health_status)
                if await check(service, timeout=max(0.05, min(remaining, 1.0)),
                               metadata=self._metadata) == 1:
                    return True
            except grpc.aio.AioRpcError:
                pass
            finally:
                await channel.close()
            if time.monotonic() + poll_interval >= deadline:
                return False
            await asyncio.sleep(poll_interval)

    def session_stub(self, session_id=""):
        at = session_id.find("@")
        if at < 0 or isinstance(self._channel, _lifetime.Closed):
            return self._session_stub
        address = session_id[at + 1:]
        if address not in self._replicas:
            channel = self._make_channel(address, service_config("pick_first"))
            self._replicas[address] = (channel, sessions_pb2_grpc.SessionServiceStub(channel))
        return self._replicas[address][1]

    async def session(self, model="", kind="self", ttl_s=0, key=None, value=None,
                      key_padding_mask=None, is_causal=False, bfloat16=False):
        """Creates a session (as AttentionClient.session, without replay): an AsyncSession."""
        if kind not in _KINDS:
            raise ValueError(f"kind: expected 'self' or 'cross', got {kind!r}")
        checked(model=model, ttl_s=ttl_s, is_causal=is_causal)
        request = sessions_pb2.CreateSessionRequest(model=model, kind=_KINDS[kind],
                                                    is_causal=is_causal, ttl_s=ttl_s)
        for name, array, tensor in (("key", key, request.key), ("value", value, request.value)):
            if array is not None:
                _encode(array, tensor, bfloat16, name)
        if key_padding_mask is not None:
            _encode(key_padding_mask, request.key_padding_mask, argument="key_padding_mask")
        info = SessionInfo.from_proto(await self._unary("CreateSession", request,
                                                        self._session_stub))
        return AsyncSession(self, info)


class AsyncSession:
    """A session created by AsyncAttentionClient.session(): append(), info(), close();
    `async with` closes it. One task at a time."""

    def __init__(self, client, info):
        self._client, self.created = client, info
        self.session_id, self.model, self.kind = info.session_id, info.model, info.kind
        self.length, self.max_tokens = info.length, info.max_tokens
        self.model_version = info.model_version
        self._closed = False

    async def append(self, tokens, not_key=None, need_weights=False, per_head_weights=False,
                     output_dtype=None, bfloat16=False, request_id="") -> AppendResult:
        """As Session.append."""
        request = _append_request(self.session_id, tokens, not_key, need_weights,
                                  per_head_weights, output_dtype, bfloat16, request_id)
        response = await self._client._unary(
            "Append", request, self._client.session_stub(self.session_id))
        self.length = response.length
        return AppendResult(output=_decode(response.output),
                            attn_weights=_decode(response.attn_weights), length=response.length,
                            queue_us=response.queue_us, compute_us=response.compute_us,
                            batch_requests=response.batch_requests,
                            request_id=response.request_id, session_id=response.session_id,
                            model_version=response.model_version)

    async def info(self) -> SessionInfo:
        request = sessions_pb2.GetSessionRequest(session_id=self.session_id)
        return SessionInfo.from_proto(await self._client._unary(
            "GetSession", request, self._client.session_stub(self.session_id)))

    async def close(self) -> int:
        """Frees the session; the bytes freed (0 if it was already gone)."""
        if self._closed:
            return 0
        request = sessions_pb2.CloseSessionRequest(session_id=self.session_id)
        try:
            response = await self._client._unary(
                "CloseSession", request, self._client.session_stub(self.session_id))
            freed = response.freed_bytes
        except AttentionError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
            freed = 0
        self._closed = True
        return freed

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, *exc):
        try:
            await self.close()
        except AttentionError:
            if exc_type is None:
                raise
