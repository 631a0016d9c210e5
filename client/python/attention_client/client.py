"""AttentionClient: infer(), models() and health() over one gRPC channel."""
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import grpc
import numpy as np

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_GEN = os.environ.get("ATTENTION_PY_GEN", os.path.join(_REPO, "build", "client", "python", "gen"))
if _GEN not in sys.path:
    sys.path.insert(0, _GEN)
try:
    from attention.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402
except ImportError as e:  # pragma: no cover - a setup problem, reported clearly.
    raise ImportError(f"attention_client: generated stubs not found in {_GEN} (build the project "
                      f"with scripts/build.sh, or set ATTENTION_PY_GEN): {e}") from e

_TO_PROTO = {
    np.dtype(np.float32): attention_pb2.DATA_TYPE_FLOAT32,
    np.dtype(np.float16): attention_pb2.DATA_TYPE_FLOAT16,
    np.dtype(np.bool_): attention_pb2.DATA_TYPE_BOOL,
}
_FROM_PROTO = {
    attention_pb2.DATA_TYPE_FLOAT32: np.dtype("<f4"),
    attention_pb2.DATA_TYPE_FLOAT16: np.dtype("<f2"),
    attention_pb2.DATA_TYPE_BFLOAT16: np.dtype("<u2"),  # Raw bfloat16 words.
    attention_pb2.DATA_TYPE_BOOL: np.dtype(np.bool_),
}
_OUTPUT_DTYPES = {None: attention_pb2.DATA_TYPE_UNSPECIFIED,
                  "float32": attention_pb2.DATA_TYPE_FLOAT32,
                  "float16": attention_pb2.DATA_TYPE_FLOAT16,
                  "bfloat16": attention_pb2.DATA_TYPE_BFLOAT16}


_SERVING = 1  # grpc.health.v1.HealthCheckResponse.SERVING


def _health_request(service):
    """grpc.health.v1.HealthCheckRequest{service} (Debian packages no Python health stubs)."""
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def _health_status(response):
    """The status field (1, varint) of a HealthCheckResponse."""
    return response[1] if len(response) >= 2 and response[0] == 0x08 else 0


class AttentionError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass
class InferResult:
    output: np.ndarray                   # The query's shape with embed_dim features.
    attn_weights: Optional[np.ndarray]   # (N, L, S') averaged or (N, H, L, S') per head.
    queue_us: int                        # Server-side queue time.
    compute_us: int                      # The executed batch's compute time.
    batch_requests: int                  # Requests that shared the batch.
    request_id: str


def bfloat16_to_float32(words):
    """Raw bfloat16 words (uint16) to float32."""
    return (np.asarray(words, dtype=np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values):
    """float32 to raw bfloat16 words, rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def _encode(array, tensor, bfloat16=False):
    if bfloat16:
        tensor.dtype = attention_pb2.DATA_TYPE_BFLOAT16
        data = float32_to_bfloat16(array)
    else:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if array.dtype not in _TO_PROTO:
            raise TypeError(f"unsupported dtype {array.dtype}: use float32, float16 or bool")
        tensor.dtype = _TO_PROTO[array.dtype]
        data = array
    tensor.shape[:] = list(np.shape(array))
    tensor.data = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<")).tobytes()


def _decode(tensor):
    if not tensor.shape:
        return None
    array = np.frombuffer(tensor.data, dtype=_FROM_PROTO[tensor.dtype]).reshape(tuple(tensor.shape))
    if tensor.dtype == attention_pb2.DATA_TYPE_BFLOAT16:
        return bfloat16_to_float32(array)
    return array.copy()


class AttentionClient:
    """A client of attention.v1.AttentionService.

    target: any gRPC target: "host:port", "dns:///svc:50051", "ipv4:127.0.0.1:1,127.0.0.1:2".
    load_balancing: e.g. "round_robin" to spread calls over every address of the target.
    timeout: deadline of every call, in seconds.
    Calls that the server refuses with UNAVAILABLE (a replica draining or gone) are retried.
    """

    def __init__(self, target, timeout=30.0, load_balancing=None):
        self.timeout = timeout
        config = {"methodConfig": [{
            "name": [{"service": "attention.v1.AttentionService"}],
            "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.02s", "maxBackoff": "0.5s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}
        if load_balancing:
            config["loadBalancingConfig"] = [{load_balancing: {}}]
            config["healthCheckConfig"] = {"serviceName": ""}
        options = [("grpc.service_config", json.dumps(config)),
                   ("grpc.enable_retries", 1),
                   ("grpc.max_receive_message_length", 256 << 20),
                   ("grpc.max_send_message_length", 256 << 20)]
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = attention_pb2_grpc.AttentionServiceStub(self._channel)
        self._health_check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=_health_request,
            response_deserializer=_health_status)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def infer(self, query, key=None, value=None, key_padding_mask=None, attn_mask=None,
              is_causal=False, need_weights=False, per_head_weights=False, model="",
              output_dtype=None, request_id="", bfloat16=False):
        """Runs torch.nn.MultiheadAttention(query, key, value, ...) (batch-first) on the server.

        query (N, L, E) or (L, E); key (N, S, kdim) and value (N, S, vdim), absent for
        self-attention; key_padding_mask (N, S) bool (True = ignore) or float (added);
        attn_mask (L, S) or (N*H, L, S), bool (True = not allowed) or float (added).
        output_dtype: "float32", "float16" or "bfloat16" (returned as float32 values);
        default: the query's. bfloat16=True sends query/key/value as bfloat16.
        Raises AttentionError on failure.
        """
        request = attention_pb2.InferRequest(model=model, request_id=request_id,
                                             is_causal=is_causal, need_weights=need_weights,
                                             per_head_weights=per_head_weights,
                                             output_dtype=_OUTPUT_DTYPES[output_dtype])
        _encode(query, request.query, bfloat16)
        if key is not None:
            _encode(key, request.key, bfloat16)
        if value is not None:
            _encode(value, request.value, bfloat16)
        if key_padding_mask is not None:
            _encode(key_padding_mask, request.key_padding_mask)
        if attn_mask is not None:
            _encode(attn_mask, request.attn_mask)
        try:
            response = self._stub.Infer(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise AttentionError(e.code(), e.details()) from None
        return InferResult(output=_decode(response.output),
                           attn_weights=_decode(response.attn_weights),
                           queue_us=response.queue_us, compute_us=response.compute_us,
                           batch_requests=response.batch_requests,
                           request_id=response.request_id)

    def models(self):
        """The served models: a list of dicts mirroring attention.v1.ModelInfo."""
        try:
            response = self._stub.ListModels(attention_pb2.ListModelsRequest(),
                                             timeout=self.timeout)
        except grpc.RpcError as e:
            raise AttentionError(e.code(), e.details()) from None
        out = []
        for m in response.models:
            out.append({
                "name": m.name, "embed_dim": m.embed_dim, "num_heads": m.num_heads,
                "kdim": m.kdim, "vdim": m.vdim, "bias": m.bias, "add_bias_kv": m.add_bias_kv,
                "add_zero_attn": m.add_zero_attn,
                "compute_dtype": attention_pb2.DataType.Name(m.compute_dtype),
                "is_default": m.is_default,
                "batching": {"max_batch_size": m.batching.max_batch_size,
                             "max_batch_tokens": m.batching.max_batch_tokens,
                             "max_queue_delay_us": m.batching.max_queue_delay_us,
                             "max_queue_size": m.batching.max_queue_size},
            })
        return out

    def health(self, service=""):
        """True only when grpc.health.v1 reports SERVING (False if unreachable)."""
        try:
            return self._health_check(service, timeout=self.timeout) == _SERVING
        except grpc.RpcError:
            return False
