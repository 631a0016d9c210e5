"""InferenceClient: the Open Inference Protocol (KServe v2, inference.GRPCInferenceService),
for those who speak it, over the same channel settings, security and errors as AttentionClient.

    from attention_client import InferenceClient
    oip = InferenceClient("localhost:50051")
    oip.server_ready(), oip.model_metadata("demo")
    r = oip.infer("demo", {"query": q, "key_padding_mask": mask}, parameters={"is_causal": True},
                  outputs=["output", "attn_weights"])
    r.outputs["output"], r.outputs["attn_weights"], r.parameters["queue_us"]

    # Triton's sequences (the server's sessions): the first step starts it, end=True ends it.
    with oip.sequence("demo", sequence_id=42) as seq:
        seq.step(prompt)              # (1, P, E) or (P, E)
        seq.step(token, end=True)     # (1, 1, E)

Inputs are NumPy arrays: float32 (FP32), float16 (FP16), bool (BOOL), float64 sent as FP32, or
BF16(values) for bfloat16; they go as raw_input_contents. Outputs come back as NumPy arrays
(BF16 as float32 values).
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

import grpc
import numpy as np

from . import _lifetime, _reopen
from ._stubs import grpc_predict_v2_pb2 as pb
from ._stubs import grpc_predict_v2_pb2_grpc as pb_grpc
from ._codec import bfloat16_to_float32, float32_to_bfloat16
from .client import AttentionClient
from .errors import AttentionError
from .models import RepositoryModel, check_name, index_request, repository_models

_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
              np.dtype(np.bool_): "BOOL", np.dtype(np.float64): "FP32"}
_NUMPY = {"FP32": "<f4", "FP16": "<f2", "BF16": "<u2", "BOOL": "|b1"}


class BF16:
    """An input to send as BF16: `values` (float32) rounded to bfloat16 words."""

    def __init__(self, values):
        self.words = float32_to_bfloat16(values)
        self.shape = self.words.shape


@dataclass
class InferenceResult:
    """A ModelInferResponse: outputs by name, parameters as Python values (queue_us,
    compute_us, batch_requests), and the echoed model, version and id. From stream_infer() a
    failed request has `error` (the server's message) and no outputs."""
    model_name: str
    model_version: str
    id: str
    outputs: Dict[str, np.ndarray] = field(default_factory=dict)
    parameters: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


def _parameter_value(parameter):
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind else None


def _set_parameter(parameter, name, value):
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, str):
        parameter.string_param = value
    else:
        raise TypeError(f"parameters[{name!r}]: expected bool, int or str, got "
                        f"{type(value).__name__}")


def make_request(model, inputs, parameters=None, outputs=None, request_id="", model_version=""):
    """A ModelInferRequest: `inputs` {name: array or BF16} as raw_input_contents."""
    request = pb.ModelInferRequest(model_name=model, model_version=model_version, id=request_id)
    for name, array in inputs.items():
        if array is None:
            continue
        if isinstance(array, BF16):
            datatype, data = "BF16", array.words
        else:
            data = np.asarray(array)
            if data.dtype not in _DATATYPES:
                raise TypeError(f"inputs[{name!r}]: unsupported dtype {data.dtype}: use "
                                f"float32, float16, bool or BF16(values)")
            datatype = _DATATYPES[data.dtype]
            data = data.astype(_NUMPY[datatype])
        request.inputs.add(name=name, datatype=datatype, shape=list(data.shape))
        request.raw_input_contents.append(np.ascontiguousarray(data).tobytes())
    for name, value in (parameters or {}).items():
        _set_parameter(request.parameters[name], name, value)
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def decode_response(response):
    """An InferenceResult of a ModelInferResponse."""
    outputs = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        array = np.frombuffer(raw, dtype=_NUMPY[tensor.datatype]).reshape(tuple(tensor.shape))
        outputs[tensor.name] = (bfloat16_to_float32(array) if tensor.datatype == "BF16"
                                else array.copy())
    return InferenceResult(model_name=response.model_name, model_version=response.model_version,
                           id=response.id, outputs=outputs,
                           parameters={k: _parameter_value(v)
                                       for k, v in response.parameters.items()})


class InferenceClient:
    """A client of inference.GRPCInferenceService. Takes AttentionClient's arguments (target,
    timeout, load_balancing, tls..., token..., max_message_bytes) and shares its behaviour:
    deadlines, UNAVAILABLE retried, errors as AttentionError with hints, wait_ready()."""

    def __init__(self, target, **kwargs):
        self._client = AttentionClient(target, **kwargs)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._client._channel)
        self.timeout = self._client.timeout
        _lifetime.track(self)  # Closed at exit if the program does not (see _lifetime).

    def close(self):
        """Closes the client's channels; later calls raise ValueError. A client left open is
        closed at interpreter exit."""
        _lifetime.untrack(self)
        self._release()

    def _release(self):
        self._stub = _lifetime.Closed(f"InferenceClient({self._client.target!r})")
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._client._error(e) from None

    def wait_ready(self, timeout=30.0, poll_interval=0.1):
        """As AttentionClient.wait_ready: True once the server reports SERVING."""
        return self._client.wait_ready(timeout=timeout, poll_interval=poll_interval)

    def server_live(self) -> bool:
        return self._call("ServerLive", pb.ServerLiveRequest()).live

    def server_ready(self) -> bool:
        return self._call("ServerReady", pb.ServerReadyRequest()).ready

    def model_ready(self, name, version="") -> bool:
        return self._call("ModelReady", pb.ModelReadyRequest(name=name, version=version)).ready

    def server_metadata(self) -> Dict[str, Any]:
        meta = self._call("ServerMetadata", pb.ServerMetadataRequest())
        return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}

    def model_metadata(self, name, version="") -> Dict[str, Any]:
        meta = self._call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version))

        def tensors(items):
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for t in items]
        return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
                "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}

    def get_model_repository_index(self, ready=False) -> List[RepositoryModel]:
        """RepositoryIndex: every model of the repository, served or not, one entry per version
        (name, version, state, reason); ready=True: only READY ones (Triton's name)."""
        return repository_models(self._call("RepositoryIndex", index_request(ready)))

    repository_index = get_model_repository_index

    def load_model(self, model_name) -> None:
        """RepositoryModelLoad (Triton's load_model): loads or re-reads a model per its version
        policy. Needs --model_control=explicit and, with tokens, the admin permission."""
        self._call("RepositoryModelLoad", pb.RepositoryModelLoadRequest(
            model_name=check_name(model_name, "model_name")))

    def unload_model(self, model_name) -> None:
        """RepositoryModelUnload (Triton's unload_model): stops serving every version."""
        self._call("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(
            model_name=check_name(model_name, "model_name")))

    def infer(self, model: str, inputs: Mapping[str, Any],
              parameters: Optional[Mapping[str, Any]] = None,
              outputs: Optional[Sequence[str]] = None, request_id: str = "",
              model_version: str = "") -> InferenceResult:
        """ModelInfer. inputs: {"query": array, "key": ..., "value": ..., "key_padding_mask":
        ..., "attn_mask": ...}; parameters: {"is_causal": True, "need_weights": True,
        "average_attn_weights": False, "timeout": microseconds, "sequence_id": 7, ...};
        outputs: the names to return, in order (default: "output", plus "attn_weights" with
        need_weights). Raises AttentionError."""
        request = make_request(model, inputs, parameters, outputs, request_id, model_version)
        return decode_response(self._call("ModelInfer", request))

    def stream_infer(self, requests: Iterable[Mapping[str, Any]],
                     timeout: Optional[float] = None) -> Iterator[InferenceResult]:
        """ModelStreamInfer: each request a dict of infer()'s keyword arguments; yields an
        InferenceResult per request as answered (match them by id: a request without one gets
        its index). A failed request's result has `error`; the stream goes on. When the server
        closes the stream (UNAVAILABLE), a new one is opened and the unanswered requests are
        sent again, unless one is a sequence step without parameters["expected_length"] (it
        may have been applied): the error is then raised."""
        def prepare(index, kwargs):
            kwargs = dict(kwargs)
            if not kwargs.get("request_id"):
                kwargs["request_id"] = str(index)
            return make_request(**kwargs)

        def resendable(request):
            return ("sequence_id" not in request.parameters
                    or "expected_length" in request.parameters)

        outbox = _reopen.SyncOutbox(requests, prepare, lambda r: _reopen.echoed(r.id),
                                    resendable)
        responses = _reopen.stream(
            lambda messages, left: self._stub.ModelStreamInfer(messages, timeout=left), outbox,
            lambda response: _reopen.echoed(response.infer_response.id), timeout or self.timeout)
        try:
            for response, _, _ in responses:
                if response.error_message:
                    yield InferenceResult(model_name=response.infer_response.model_name,
                                          model_version=response.infer_response.model_version,
                                          id=response.infer_response.id,
                                          error=response.error_message)
                else:
                    yield decode_response(response.infer_response)
        except grpc.RpcError as e:
            raise self._client._error(e) from None
        finally:
            responses.close()

    def sequence(self, model, sequence_id, parameters=None):
        """A Sequence (Triton's sequence_id/sequence_start/sequence_end over ModelInfer)."""
        return Sequence(self, model, sequence_id, parameters)


class Sequence:
    """One sequence of steps on the server (a session): step() sends the next tokens (the
    query only) and returns their output rows. The first step carries sequence_start (and
    replaces a sequence of that id the caller had), the one with end=True sequence_end; later
    steps raise AttentionError. The rows equal one stateless is_causal call over every token.
    A context manager; a sequence left without end=True expires by the server's session TTL."""

    def __init__(self, client, model, sequence_id, parameters=None):
        if sequence_id in (0, "", None):
            raise ValueError("sequence_id: expected a non-zero integer or a non-empty string")
        self._client, self.model, self.sequence_id = client, model, sequence_id
        self._parameters = dict(parameters or {})
        self.started = self.ended = False
        self.length = 0

    def step(self, query, end=False, parameters=None, outputs=None) -> InferenceResult:
        if self.ended:
            raise AttentionError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"sequence {self.sequence_id!r} has ended")
        merged = dict(self._parameters, **(parameters or {}))
        merged["sequence_id"] = self.sequence_id
        if not self.started:
            merged["sequence_start"] = True
        if end:
            merged["sequence_end"] = True
        result = self._client.infer(self.model, {"query": query}, parameters=merged,
                                    outputs=outputs)
        self.started = True
        self.ended = bool(end)
        self.length += int(np.shape(query)[-2])
        return result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None
