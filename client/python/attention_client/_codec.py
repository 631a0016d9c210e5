"""The attention.v1 wire codec, shared by every module of the client: NumPy arrays to and from
TensorProto (_encode, _decode; bfloat16 as raw 16-bit words), the output dtypes a request can
ask for, and an InferResponse as an InferResult. Imports no other module of the package but
_stubs and errors, so client, session, _streams and aio all import it without a cycle.
Stateless: safe from any thread."""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ._stubs import attention_pb2
from .errors import AttentionError, status_code

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
_ACCEPTED_OUTPUT_DTYPES = ("'float32', 'bfloat16' or 'float16' (or np.float32, np.float16, "
                           "torch.float32, torch.bfloat16, torch.float16; None: the input's)")


def output_dtype_of(value, argument="output_dtype"):
    """The DataType of an output_dtype argument: None, a name ("float32", "bfloat16",
    "float16"), or a NumPy or PyTorch dtype (np.float16, np.dtype("<f4"), torch.bfloat16)
    that is one of them. ValueError names the argument and the accepted values otherwise."""
    if value is None or (isinstance(value, str) and value in _OUTPUT_DTYPES):
        return _OUTPUT_DTYPES[value]
    name = None
    text = str(value)
    if text.startswith("torch."):  # torch.float16, torch.half, ... (no import of torch).
        name = {"torch.float32": "float32", "torch.float": "float32",
                "torch.float16": "float16", "torch.half": "float16",
                "torch.bfloat16": "bfloat16"}.get(text)
    elif not isinstance(value, (bool, int, float)):
        try:
            name = np.dtype(value).name  # np.float16, "f4", "<f2"; ml_dtypes' "bfloat16".
        except (TypeError, ValueError):
            name = None
    if name is not None and name in _OUTPUT_DTYPES:
        return _OUTPUT_DTYPES[name]
    raise ValueError(f"{argument}: expected {_ACCEPTED_OUTPUT_DTYPES}, got {value!r}")


def model_version_of(value, argument="model_version"):
    """The attention.v1 model_version (int64; 0: the newest serving) of an int or a string of
    digits (the Open Inference Protocol's "2"; "" or None: 0)."""
    if value is None or value == "":
        return 0
    if isinstance(value, str) and value.strip().isdigit() and int(value) < 2**63:
        return int(value)
    if (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and 0 <= value < 2**63):
        return int(value)
    raise ValueError(f"{argument}: expected a version number >= 1 (an int or a string of "
                     f"digits; 0, '' or None: the newest serving version), got {value!r}")


def checked(**arguments):
    """Checks request arguments by their kind, before protobuf refuses them without naming
    them: flags (is_causal, need_weights, ...) are bools (or NumPy bools, ints, None), ids and
    names (request_id, model) strs, ttl_s an int. TypeError names the argument."""
    for argument, value in arguments.items():
        if argument in ("request_id", "model"):
            ok, expected = isinstance(value, str), "a str"
        elif argument == "ttl_s":
            ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            expected = "an int (seconds; 0: the model's default)"
        else:
            ok = value is None or isinstance(value, (bool, np.bool_, int, np.integer))
            expected = "a bool"
        if not ok:
            raise TypeError(f"{argument}: expected {expected}, got {type(value).__name__} "
                            f"{value!r}")
    return arguments


@dataclass
class InferResult:
    output: np.ndarray                   # The query's shape with embed_dim features.
    attn_weights: Optional[np.ndarray]   # (N, L, S') averaged or (N, H, L, S') per head.
    queue_us: int                        # Server-side queue time.
    compute_us: int                      # The executed batch's compute time.
    batch_requests: int                  # Requests that shared the batch.
    request_id: str
    error: Optional[AttentionError] = None  # infer_stream(): this request failed (no output).
    model_version: int = 0               # The model version that computed it (0: unknown).


def _infer_result(response):
    """An InferResponse as an InferResult (its error, if set, as an AttentionError)."""
    if response.HasField("error") and response.error.code != 0:
        return InferResult(output=None, attn_weights=None, queue_us=0, compute_us=0,
                           batch_requests=0, request_id=response.request_id,
                           error=AttentionError(status_code(response.error.code),
                                                response.error.message))
    return InferResult(output=_decode(response.output),
                       attn_weights=_decode(response.attn_weights),
                       queue_us=response.queue_us, compute_us=response.compute_us,
                       batch_requests=response.batch_requests, request_id=response.request_id,
                       model_version=response.model_version)


def bfloat16_to_float32(words):
    """Raw bfloat16 words (uint16) to float32."""
    return (np.asarray(words, dtype=np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values):
    """float32 to raw bfloat16 words, rounding to nearest even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    # Rounding would carry a NaN whose payload is all in the low 16 bits (e.g. 0x7f800001)
    # into the exponent (+Inf); keep its sign and top payload and set the quiet bit.
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def _encode(array, tensor, bfloat16=False, argument="array"):
    """Writes `array` (NumPy or array-like) into `tensor`; TypeError names `argument`."""
    if bfloat16:
        tensor.dtype = attention_pb2.DATA_TYPE_BFLOAT16
        data = float32_to_bfloat16(array)
    else:
        array = np.asarray(array)
        if not array.dtype.isnative:  # E.g. '>f4': same values in native order ('=f4').
            array = array.astype(array.dtype.newbyteorder("="))
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if array.dtype not in _TO_PROTO:
            raise TypeError(f"{argument}: unsupported dtype {array.dtype}: use float32, float16 "
                            f"or bool (float64 is sent as float32; bfloat16=True sends "
                            f"bfloat16)")
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
