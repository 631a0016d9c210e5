"""The Open Inference Protocol (KServe v2, inference.GRPCInferenceService) from Python, through
the stubs generated from proto/inference/grpc_predict_v2.proto only (grpcio + NumPy), against a
live attention-server.

One server for the whole module, on a temporary model repository of two models exported from
seeded torch.nn.MultiheadAttention layers (scripts/export_torch_mha.py): "small" (E=32, 4 heads,
bias, add_bias_kv) and "cross" (E=16, 2 heads, kdim=12, vdim=10). Readiness is the
grpc.health.v1 Watch stream reaching SERVING (no polling, no sleeps).

Checked: every RPC (ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
ModelInfer, ModelStreamInfer); raw_input_contents and typed contents; FP32, FP16 and BF16
inputs; bool and float key_padding_mask, 2-D and 3-D attn_mask; the parameters (is_causal,
need_weights, average_attn_weights, timeout, priority, and the outputs asked for); bad inputs;
sequences (sequence_id / sequence_start / sequence_end); and a mixed load of both protocols.

Oracles and tolerances:
  * torch.nn.MultiheadAttention in float64 with the same weights (Debian's PyTorch 1.13: is_causal
    is passed as the equivalent top-left bool attn_mask, and a float key_padding_mask, which 1.13
    mishandles, is added into a float 3-D attn_mask): |got - want| <= 1e-5 + 1e-5 |want| for
    FP32 inputs; for FP16 and BF16 inputs (rounded first, the oracle takes the rounded values)
    the output's rounding is allowed on top, 2^-10 |want| (FP16) or 2^-7 |want| (BF16).
  * attention.v1 (the project's Python client, attention_client) on the same inputs: within
    1e-6; raw and typed contents of one request: within 1e-6 of each other.
  * A sequence: within 1e-5 of one stateless causal ModelInfer over all its tokens.
  * Under the mixed load: within 1e-5 of the request's solo result.

Run by CTest as python_inference_protocol_test (ATTENTION_SERVER_BINARY, ATTENTION_PY_GEN and
PYTHONPATH set there); by hand: PYTHONPATH=client/python /usr/bin/python3 -m unittest -v
discover -s client/python/tests -p test_inference_protocol.py
"""
import copy
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))
GEN = os.environ.get("ATTENTION_PY_GEN", os.path.join(REPO, "build", "client", "python", "gen"))

try:
    import grpc
    import numpy as np
    import torch
    if GEN not in sys.path:
        sys.path.insert(0, GEN)
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from export_torch_mha import export_mha
    from attention_client import AttentionClient
    MISSING = None
except ImportError as e:  # Reported as a skip with the reason.
    MISSING = str(e)
if MISSING is None:
    # The build's own stubs: missing or broken is a failure, never a skip.
    from inference import grpc_predict_v2_pb2 as pb
    from inference import grpc_predict_v2_pb2_grpc as pb_grpc

INVALID = "StatusCode.INVALID_ARGUMENT"
FP32_ATOL = FP32_RTOL = 1e-5
OUTPUT_RTOL = {"FP32": 0.0, "FP16": 2.0 ** -10, "BF16": 2.0 ** -7}  # The output's rounding.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The server and the models (module-wide).

MODELS = {}   # name -> the float64 torch.nn.MultiheadAttention the server's weights came from.
STATE = {}    # "server", "dir", "target", "log"


def build_models(directory):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    small = torch.nn.MultiheadAttention(32, 4, bias=True, add_bias_kv=True, batch_first=True)
    cross = torch.nn.MultiheadAttention(16, 2, kdim=12, vdim=10, batch_first=True)
    with torch.no_grad():  # Non-zero biases, so that they are exercised.
        for m in (small, cross):
            m.in_proj_bias.normal_(0, 0.1, generator=g)
            m.out_proj.bias.normal_(0, 0.1, generator=g)
        small.bias_k.normal_(0, 0.5, generator=g)
        small.bias_v.normal_(0, 0.5, generator=g)
    for name, m in (("small", small), ("cross", cross)):
        export_mha(m.eval(), os.path.join(directory, name))
        MODELS[name] = copy.deepcopy(m).double().eval()


def wait_until_serving(target, timeout_s=60):
    """grpc.health.v1.Health/Watch("") until SERVING (Debian has no Python health stubs: the
    request is empty and the response's status is field 1)."""
    with grpc.insecure_channel(target) as channel:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch", request_serializer=lambda r: r,
            response_deserializer=lambda b: b[1] if len(b) >= 2 and b[0] == 0x08 else 0)
        call = watch(b"", timeout=timeout_s, wait_for_ready=True)
        try:
            for status in call:
                if status == 1:  # SERVING
                    return
        finally:
            call.cancel()
    raise RuntimeError("the health Watch ended before SERVING")


def setUpModule():
    if MISSING:
        return
    STATE["dir"] = tempfile.TemporaryDirectory(prefix="attention-oip-")
    repository = os.path.join(STATE["dir"].name, "models")
    build_models(repository)
    port = free_port()
    STATE["target"] = f"127.0.0.1:{port}"
    STATE["log"] = open(os.path.join(STATE["dir"].name, "server.log"), "w+")
    STATE["server"] = subprocess.Popen(
        [SERVER, "--host=127.0.0.1", f"--port={port}", "--metrics_port=0", "--http_port=0",
         f"--model_repository={repository}", "--threads=2"],
        stderr=STATE["log"])
    try:
        wait_until_serving(STATE["target"])
    except Exception:
        tearDownModule()
        raise


def tearDownModule():
    server = STATE.pop("server", None)
    if server is not None:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
        STATE["log"].seek(0)
        log = STATE["log"].read()
        STATE["log"].close()
        STATE["dir"].cleanup()
        assert code == 0, f"attention-server exited with {code}:\n{log}"


# ---------------------------------------------------------------------------------------------
# Requests and responses with the generated stubs.

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
             np.dtype(np.bool_): "BOOL"}


def to_bf16(values):
    """float32 -> bfloat16 words (uint16), rounding to nearest even (finite values)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(words):
    return (np.asarray(words, dtype=np.uint32) << 16).view(np.float32)


class Bf16:
    """An input to send as BF16 (raw words); .values are the float32 values it stands for."""

    def __init__(self, values):
        self.words = to_bf16(values)
        self.values = from_bf16(self.words)
        self.shape = self.words.shape


def add_input(request, name, array, typed=False):
    """Adds input `name`: raw_input_contents, or typed contents (fp32_contents/bool_contents)."""
    if isinstance(array, Bf16):
        datatype, data = "BF16", array.words
    else:
        datatype, data = DATATYPES[array.dtype], array
    tensor = request.inputs.add(name=name, datatype=datatype, shape=list(data.shape))
    if not typed:
        request.raw_input_contents.append(np.ascontiguousarray(data).astype(
            data.dtype.newbyteorder("<")).tobytes())
    elif datatype == "BOOL":
        tensor.contents.bool_contents.extend(data.ravel().tolist())
    else:
        tensor.contents.fp32_contents.extend(data.ravel().tolist())
    return tensor


def make_request(model, inputs, typed=False, params=None, outputs=(), request_id=""):
    """inputs: [(name, array or Bf16)]; params: {name: value} (bool -> bool_param, int ->
    int64_param, str -> string_param); outputs: names asked for."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs:
        if array is not None:
            add_input(request, name, array, typed)
    for name, value in (params or {}).items():
        if isinstance(value, bool):
            request.parameters[name].bool_param = value
        elif isinstance(value, int):
            request.parameters[name].int64_param = value
        else:
            request.parameters[name].string_param = value
    for name in outputs:
        request.outputs.add(name=name)
    return request


def decode(response):
    """{output name: (datatype, float32 array)} of a ModelInferResponse."""
    assert len(response.outputs) == len(response.raw_output_contents)
    result = {}
    for meta, data in zip(response.outputs, response.raw_output_contents):
        dtype = {"FP32": "<f4", "FP16": "<f2", "BF16": "<u2"}[meta.datatype]
        array = np.frombuffer(data, dtype=dtype).reshape(tuple(meta.shape))
        result[meta.name] = (meta.datatype,
                             from_bf16(array) if meta.datatype == "BF16"
                             else array.astype(np.float32))
    return result


# ---------------------------------------------------------------------------------------------
# The oracle: torch.nn.MultiheadAttention in float64.

def values(array):
    return None if array is None else (array.values if isinstance(array, Bf16) else array)


def reference(model, query, key=None, value=None, key_padding_mask=None, attn_mask=None,
              is_causal=False, average=True):
    """(output, attn_weights) of MODELS[model] in float64 (NumPy), batched or not."""
    m = MODELS[model]
    h = m.num_heads
    q = torch.from_numpy(np.asarray(values(query), dtype=np.float64))
    batched = q.dim() == 3
    k = q if key is None else torch.from_numpy(np.asarray(values(key), dtype=np.float64))
    v = k if value is None else torch.from_numpy(np.asarray(values(value), dtype=np.float64))
    if not batched:
        q, k, v = q[None], k[None], v[None]
    n, l, s = q.shape[0], q.shape[1], k.shape[1]
    kpm = None if key_padding_mask is None else torch.from_numpy(key_padding_mask).view(n, s)
    am = None if attn_mask is None else torch.from_numpy(attn_mask)
    if is_causal:  # 1.13's module has no is_causal: the top-left causal mask over the keys.
        causal = torch.ones(l, s, dtype=torch.bool).triu(1)
        if am is None:
            am = causal
        elif am.dtype == torch.bool:
            am = am | causal
        else:
            am = am.double().masked_fill(causal, float("-inf"))
    mixed = kpm is not None and am is not None and kpm.dtype != am.dtype
    if kpm is not None and (kpm.dtype != torch.bool or mixed):
        # A float (or mixed) key padding mask is added into a float (N*H, L, S) attn_mask.
        additive = lambda t: (torch.zeros(t.shape, dtype=torch.float64).masked_fill(  # noqa
            t, float("-inf")) if t.dtype == torch.bool else t.double())
        full = torch.zeros(n, h, l, s, dtype=torch.float64)
        full += additive(kpm).view(n, 1, 1, s)
        if am is not None:
            full += additive(am).view(n, h, l, s) if am.dim() == 3 else additive(am)
        am, kpm = full.view(n * h, l, s), None
    elif am is not None and am.dtype != torch.bool:
        am = am.double()
    with torch.enable_grad():  # 1.13's general path (not its fast path).
        out, weights = m(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                         average_attn_weights=average)
    out, weights = out.detach().numpy(), weights.detach().numpy()
    return (out, weights) if batched else (out[0], weights[0])


# ---------------------------------------------------------------------------------------------

@unittest.skipIf(MISSING, f"dependencies missing: {MISSING}")
class InferenceProtocolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.channel = grpc.insecure_channel(STATE["target"])
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)
        cls.v1 = AttentionClient(STATE["target"], timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.v1.close()
        cls.channel.close()

    def setUp(self):
        self.rng = np.random.default_rng(7)

    def randn(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32)

    def bool_mask(self, *shape, p=0.3):
        mask = self.rng.random(shape) < p
        mask[..., 0] = False  # Key 0 stays attendable: no fully masked row.
        return mask

    def infer(self, request):
        return self.stub.ModelInfer(request, timeout=30)

    def assert_close(self, got, want, atol, rtol=0.0, what=""):
        self.assertEqual(got.shape, want.shape, what)
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)

    def assert_code(self, code, substring, request):
        with self.assertRaises(grpc.RpcError) as ctx:
            self.infer(request)
        self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
        self.assertIn(substring, ctx.exception.details())
        return ctx.exception.details()

    # -- Server and model RPCs --------------------------------------------------------------

    def test_server_rpcs(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready)
        meta = self.stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
        self.assertEqual(meta.name, "attention-service")
        self.assertNotEqual(meta.version, "")
        self.assertEqual(sorted(meta.extensions),
                         ["model_configuration", "model_repository", "parameters", "sequence",
                          "statistics"])

    def test_model_ready(self):
        for name in ("small", "cross"):
            for version in ("", "1"):
                self.assertTrue(self.stub.ModelReady(
                    pb.ModelReadyRequest(name=name, version=version), timeout=10).ready)
        for name, version in (("nope", ""), ("small", "2")):
            with self.assertRaises(grpc.RpcError) as ctx:
                self.stub.ModelReady(pb.ModelReadyRequest(name=name, version=version),
                                     timeout=10)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND, (name, version))

    def test_model_metadata(self):
        for name, (e, kdim, vdim) in (("small", (32, 32, 32)), ("cross", (16, 12, 10))):
            meta = self.stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=10)
            self.assertEqual((meta.name, list(meta.versions), meta.platform),
                             (name, ["1"], "attention_mha"))
            self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.inputs], [
                ("query", "FP32", [-1, -1, e]), ("key", "FP32", [-1, -1, kdim]),
                ("value", "FP32", [-1, -1, vdim]), ("key_padding_mask", "BOOL", [-1, -1]),
                ("attn_mask", "BOOL", [-1, -1])])
            self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.outputs], [
                ("output", "FP32", [-1, -1, e]), ("attn_weights", "FP32", [-1, -1, -1])])
        meta = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="small", version="1"),
                                       timeout=10)
        self.assertEqual(meta.name, "small")
        for name, version in (("nope", ""), ("cross", "3")):
            with self.assertRaises(grpc.RpcError) as ctx:
                self.stub.ModelMetadata(pb.ModelMetadataRequest(name=name, version=version),
                                        timeout=10)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND)

    # -- ModelInfer against torch and attention.v1 -------------------------------------------

    def cases(self):
        """Inputs and options covering both models, masks of every kind and the parameters."""
        r = self
        return [
            dict(model="small", query=r.randn(2, 5, 32)),
            dict(model="small", query=r.randn(2, 5, 32), key_padding_mask=r.bool_mask(2, 5),
                 attn_mask=r.bool_mask(5, 5), need_weights=True, average=False),
            dict(model="small", query=r.randn(3, 4, 32), attn_mask=2 * r.randn(4, 4),
                 need_weights=True),
            dict(model="small", query=r.randn(2, 6, 32), attn_mask=r.bool_mask(2 * 4, 6, 6),
                 need_weights=True, average=False),
            dict(model="small", query=r.randn(2, 5, 32), key_padding_mask=2 * r.randn(2, 5),
                 attn_mask=2 * r.randn(2 * 4, 5, 5), need_weights=True),
            dict(model="small", query=r.randn(2, 7, 32), key_padding_mask=r.bool_mask(2, 7),
                 is_causal=True, need_weights=True),
            dict(model="small", query=r.randn(6, 32), key_padding_mask=r.bool_mask(6),
                 attn_mask=2 * r.randn(4, 6, 6), need_weights=True, average=False),
            dict(model="cross", query=r.randn(2, 4, 16), key=r.randn(2, 7, 12),
                 value=r.randn(2, 7, 10), key_padding_mask=r.bool_mask(2, 7),
                 attn_mask=2 * r.randn(4, 7), need_weights=True),
            dict(model="cross", query=r.randn(2, 4, 16), key=r.randn(2, 7, 12),
                 value=r.randn(2, 7, 10), key_padding_mask=2 * r.randn(2, 7),
                 attn_mask=r.bool_mask(2 * 2, 4, 7), is_causal=True, need_weights=True,
                 average=False),
        ]

    @staticmethod
    def oip_request(case, typed=False, request_id=""):
        params = {"is_causal": case.get("is_causal", False),
                  "need_weights": case.get("need_weights", False),
                  "average_attn_weights": case.get("average", True)}
        inputs = [(name, case.get(name)) for name in
                  ("query", "key", "value", "key_padding_mask", "attn_mask")]
        return make_request(case["model"], inputs, typed, params, request_id=request_id)

    def v1_infer(self, case, **kwargs):
        return self.v1.infer(
            values(case["query"]), key=values(case.get("key")),
            value=values(case.get("value")), key_padding_mask=case.get("key_padding_mask"),
            attn_mask=case.get("attn_mask"), is_causal=case.get("is_causal", False),
            need_weights=case.get("need_weights", False),
            per_head_weights=not case.get("average", True), model=case["model"], **kwargs)

    def test_raw_and_typed_contents_equal_torch_and_attention_v1(self):
        for i, case in enumerate(self.cases()):
            want_out, want_w = reference(
                case["model"], case["query"], case.get("key"), case.get("value"),
                case.get("key_padding_mask"), case.get("attn_mask"),
                case.get("is_causal", False), case.get("average", True))
            v1 = self.v1_infer(case)
            got = {}
            for typed in (False, True):
                response = self.infer(self.oip_request(case, typed, request_id=f"case{i}"))
                self.assertEqual((response.model_name, response.model_version, response.id),
                                 (case["model"], "1", f"case{i}"))
                outputs = decode(response)
                names = ["output", "attn_weights"] if case.get("need_weights") else ["output"]
                self.assertEqual([o.name for o in response.outputs], names, i)
                self.assertEqual({d for d, _ in outputs.values()}, {"FP32"})
                for key in ("queue_us", "compute_us", "batch_requests"):
                    self.assertEqual(response.parameters[key].WhichOneof("parameter_choice"),
                                     "int64_param", key)
                self.assertGreaterEqual(response.parameters["batch_requests"].int64_param, 1)
                what = f"case {i} {'typed' if typed else 'raw'}"
                out = outputs["output"][1]
                self.assert_close(out, want_out, FP32_ATOL, FP32_RTOL, what + " vs torch")
                self.assert_close(out, v1.output, 1e-6, 0, what + " vs attention.v1")
                if case.get("need_weights"):
                    w = outputs["attn_weights"][1]
                    self.assert_close(w, want_w, FP32_ATOL, FP32_RTOL, what + " weights")
                    self.assert_close(w, v1.attn_weights, 1e-6, 0, what + " v1 weights")
                got[typed] = outputs
            for name in got[False]:
                self.assert_close(got[True][name][1], got[False][name][1], 1e-6, 0,
                                  f"case {i}: typed vs raw {name}")

    def test_fp16_and_bf16_inputs(self):
        q, k, v = self.randn(2, 5, 16), self.randn(2, 6, 12), self.randn(2, 6, 10)
        kpm_bool, kpm_float = self.bool_mask(2, 6), 2 * self.randn(2, 6)
        am_bool_3d, am_float_2d = self.bool_mask(2 * 2, 5, 6), 2 * self.randn(5, 6)
        for datatype in ("FP16", "BF16"):
            cast = ((lambda a: a.astype(np.float16)) if datatype == "FP16" else Bf16)
            for kpm, am in ((kpm_bool, am_float_2d), (kpm_float, am_bool_3d)):
                case = dict(model="cross", query=cast(q), key=cast(k), value=cast(v),
                            key_padding_mask=kpm, attn_mask=am, need_weights=True)
                response = self.infer(self.oip_request(case))
                outputs = decode(response)
                self.assertEqual(outputs["output"][0], datatype)
                self.assertEqual(outputs["attn_weights"][0], datatype)
                want_out, want_w = reference("cross", values(case["query"]),
                                             values(case["key"]), values(case["value"]), kpm, am)
                rtol = FP32_RTOL + OUTPUT_RTOL[datatype]
                what = f"{datatype} kpm {kpm.dtype} attn_mask {am.dtype}"
                self.assert_close(outputs["output"][1], want_out, FP32_ATOL, rtol, what)
                self.assert_close(outputs["attn_weights"][1], want_w, FP32_ATOL, rtol, what)
                v1 = self.v1_infer(case, bfloat16=datatype == "BF16")
                self.assert_close(outputs["output"][1], v1.output, 1e-6, 0, what + " vs v1")
                self.assert_close(outputs["attn_weights"][1], v1.attn_weights, 1e-6, 0,
                                  what + " v1 weights")
        # FP16 and BF16 have no typed contents field: raw only.
        request = make_request("cross", [("query", q.astype(np.float16))], typed=True)
        request.inputs[0].contents.fp32_contents.extend(q.ravel().tolist())
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT,
                         "datatype FP16 has no typed contents field; send raw_input_contents",
                         request)

    def test_parameters_and_outputs(self):
        q = self.randn(1, 5, 32)
        base = self.infer(make_request("small", [("query", q)]))
        self.assertEqual([o.name for o in base.outputs], ["output"])
        want_out, want_w = reference("small", q, is_causal=True)
        # Asking for attn_weights alone implies need_weights and returns only it.
        only = self.infer(make_request("small", [("query", q)], params={"is_causal": True},
                                       outputs=["attn_weights"]))
        self.assertEqual([o.name for o in only.outputs], ["attn_weights"])
        w = decode(only)["attn_weights"][1]
        self.assert_close(w, want_w, FP32_ATOL, FP32_RTOL, "causal weights")
        self.assertTrue(np.all(np.triu(w[0, :, :5], 1) == 0), "causal: no later key")
        # The outputs come in the order asked for; per-head weights with average false.
        both = self.infer(make_request(
            "small", [("query", q)], params={"is_causal": True, "average_attn_weights": False},
            outputs=["attn_weights", "output"]))
        self.assertEqual([o.name for o in both.outputs], ["attn_weights", "output"])
        outputs = decode(both)
        self.assertEqual(outputs["attn_weights"][1].shape, (1, 4, 5, 6))  # 5 keys + bias_k.
        self.assert_close(outputs["output"][1], want_out, FP32_ATOL, FP32_RTOL, "causal output")
        self.assert_close(outputs["attn_weights"][1],
                          reference("small", q, is_causal=True, average=False)[1],
                          FP32_ATOL, FP32_RTOL, "per-head weights")
        # need_weights false with no outputs named: the output only; unknown parameters ignored.
        plain = self.infer(make_request("small", [("query", q)],
                                        params={"need_weights": False, "some_tool": "x"}))
        self.assertEqual(plain.raw_output_contents, base.raw_output_contents)
        # timeout (µs in the queue): 1 µs expires before the batcher takes the request; 10 s
        # does not. priority is accepted (int64 or uint64) and changes nothing.
        self.assert_code(grpc.StatusCode.DEADLINE_EXCEEDED, "in the queue",
                         make_request("small", [("query", q)], params={"timeout": 1}))
        for params in ({"timeout": 10_000_000}, {"timeout": 0}, {"priority": 1}):
            response = self.infer(make_request("small", [("query", q)], params=params))
            self.assertEqual(response.raw_output_contents, base.raw_output_contents, params)
        request = make_request("small", [("query", q)])
        request.parameters["priority"].uint64_param = 2
        request.parameters["timeout"].uint64_param = 5_000_000
        self.assertEqual(self.infer(request).raw_output_contents, base.raw_output_contents)
        for params, message in (
                ({"timeout": -1}, "parameters['timeout']: expected >= 0 microseconds, got -1"),
                ({"timeout": "soon"}, "parameters['timeout']: expected int64_param"),
                ({"priority": "high"}, "parameters['priority']: expected int64_param"),
                ({"is_causal": 1}, "parameters['is_causal']: expected bool_param"),
                ({"need_weights": "yes"}, "parameters['need_weights']: expected bool_param")):
            self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, message,
                             make_request("small", [("query", q)], params=params))
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT,
                         "outputs[0].name: expected 'output' or 'attn_weights', got 'logits'",
                         make_request("small", [("query", q)], outputs=["logits"]))

    def test_an_output_named_twice_is_refused_or_returned_twice(self):
        """outputs ["output", "output"] is refused with INVALID_ARGUMENT (it once answered a
        second, empty raw_output_contents)."""
        q = self.randn(1, 3, 32)
        try:
            response = self.infer(make_request("small", [("query", q)],
                                               outputs=["output", "output"]))
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
            return
        self.assertEqual([len(b) for b in response.raw_output_contents], [q.nbytes, q.nbytes])

    # -- Errors -----------------------------------------------------------------------------

    def test_bad_inputs_are_invalid_argument_naming_the_input(self):
        q = self.randn(1, 4, 32)

        def edited(edit, typed=False):
            request = make_request("small", [("query", q)], typed=typed)
            edit(request)
            return request

        def missing_query(r):
            r.Clear()
            r.model_name = "small"
            add_input(r, "key", q)

        def both_kinds(r):
            add_input(r, "key", q, typed=True)
            r.raw_input_contents.append(b"")

        cases = [
            ("datatype", edited(lambda r: setattr(r.inputs[0], "datatype", "FP64")),
             "inputs[0] ('query').datatype: expected FP32, FP16, BF16 or BOOL, got 'FP64'"),
            ("lower-case datatype", edited(lambda r: setattr(r.inputs[0], "datatype", "fp32")),
             "inputs[0] ('query').datatype: expected FP32, FP16, BF16 or BOOL, got 'fp32'"),
            ("raw size", edited(lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 12)),
             "raw_input_contents[0] ('query'): data has 12 bytes but shape [1, 4, 32] of "
             "float32 needs 512"),
            ("typed size", edited(lambda r: r.inputs[0].contents.fp32_contents.append(0.5),
                                  typed=True),
             "inputs[0] ('query').contents"),
            ("unknown input", edited(lambda r: setattr(r.inputs[0], "name", "qurey")),
             "inputs[0] ('qurey').name: expected one of query, key, value, key_padding_mask, "
             "attn_mask"),
            ("missing query", edited(missing_query), "inputs: 'query' is required"),
            ("both contents kinds", edited(both_kinds),
             "inputs[1] ('key').contents: the request also has raw_input_contents"),
            ("raw count", edited(lambda r: r.raw_input_contents.append(b"")),
             "raw_input_contents: expected one entry per input (1), got 2"),
            ("no data", edited(lambda r: r.ClearField("raw_input_contents")),
             "inputs[0] ('query'): no data"),
            ("input twice", edited(lambda r: add_input(r, "query", q)),
             "inputs[1] ('query').name: sent twice"),
            ("embed dim", make_request("cross", [("query", q)]), "query"),
            ("mask shape", make_request("small", [("query", q), ("key_padding_mask",
                                                                  np.zeros((1, 3), bool))]),
             "key_padding_mask"),
        ]
        for name, request, message in cases:
            with self.subTest(name):
                self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, message, request)
        for model, version in (("nope", ""), ("small", "7")):
            request = make_request(model, [("query", q)])
            request.model_version = version
            self.assert_code(grpc.StatusCode.NOT_FOUND, model if version == "" else version,
                             request)

    # -- ModelStreamInfer ---------------------------------------------------------------------

    def test_stream_answers_every_request_with_its_result_or_error(self):
        cases = self.cases()
        requests = []
        for i, case in enumerate(cases):
            request = self.oip_request(case, typed=i % 2 == 1, request_id=f"s{i}")
            if i == 3:
                request.inputs[0].datatype = "INT8"  # This one fails; the stream goes on.
            requests.append(request)
        sequence = make_request("small", [("query", self.randn(1, 2, 32))],
                                params={"sequence_id": 5, "sequence_start": True},
                                request_id="seq")
        requests.append(sequence)
        responses = {}
        for response in self.stub.ModelStreamInfer(iter(requests), timeout=60):
            self.assertNotIn(response.infer_response.id, responses)
            responses[response.infer_response.id] = response
        self.assertEqual(sorted(responses), sorted(r.id for r in requests))
        self.assertIn("expected FP32, FP16, BF16 or BOOL, got 'INT8'",
                      responses["s3"].error_message)
        # A sequence step on the stream is served like one on ModelInfer.
        self.assertEqual(responses["seq"].error_message, "")
        self.assertEqual(decode(responses["seq"].infer_response)["output"][1].shape, (1, 2, 32))
        for i, case in enumerate(cases):
            if i == 3:
                continue
            got = responses[f"s{i}"]
            self.assertEqual(got.error_message, "", i)
            self.assertEqual((got.infer_response.model_name, got.infer_response.model_version),
                             (case["model"], "1"))
            solo = decode(self.infer(self.oip_request(case)))
            streamed = decode(got.infer_response)
            self.assertEqual(sorted(streamed), sorted(solo), i)
            for name in solo:
                self.assert_close(streamed[name][1], solo[name][1], 1e-5, 0, f"stream {i}")

    # -- Sequences ----------------------------------------------------------------------------

    def sequence_step(self, sequence_id, chunk, start=False, end=False, **params):
        request = make_request("small", [("query", chunk)], params=params)
        if isinstance(sequence_id, str):
            request.parameters["sequence_id"].string_param = sequence_id
        else:
            request.parameters["sequence_id"].uint64_param = sequence_id
        if start:
            request.parameters["sequence_start"].bool_param = True
        if end:
            request.parameters["sequence_end"].bool_param = True
        return request

    def test_sequence_equals_a_stateless_causal_call(self):
        tokens = self.randn(1, 9, 32)
        whole = decode(self.infer(make_request("small", [("query", tokens)],
                                               params={"is_causal": True})))["output"][1]
        self.assert_close(whole, reference("small", tokens, is_causal=True)[0], FP32_ATOL,
                          FP32_RTOL, "causal call vs torch")
        for sequence_id in (42, "decoder-a"):
            at, got = 0, []
            for i, t in enumerate((4, 1, 1, 3)):
                response = self.infer(self.sequence_step(
                    sequence_id, tokens[:, at:at + t], start=i == 0, end=i == 3,
                    need_weights=i == 1))
                outputs = decode(response)
                self.assertEqual(outputs["output"][1].shape, (1, t, 32))
                if i == 1:  # Weights over every token so far, plus bias_k.
                    self.assertEqual(outputs["attn_weights"][1].shape, (1, 1, at + t + 1))
                got.append(outputs["output"][1])
                at += t
            self.assert_close(np.concatenate(got, axis=1), whole, 1e-5, 0, str(sequence_id))
            # Ended: the next step needs a new start.
            self.assert_code(grpc.StatusCode.NOT_FOUND, "start it with sequence_start",
                             self.sequence_step(sequence_id, tokens[:, :1]))
        # A restart replaces the sequence: its first step is the first token's again.
        first = self.infer(self.sequence_step(7, tokens[:, :2], start=True))
        again = self.infer(self.sequence_step(7, tokens[:, :2], start=True, end=True))
        self.assert_close(decode(again)["output"][1], decode(first)["output"][1], 1e-6)
        self.assert_close(decode(first)["output"][1], whole[:, :2], 1e-5)
        # A step takes only the query; sequence_start needs an id.
        request = self.sequence_step(8, tokens[:, :2], start=True)
        add_input(request, "key_padding_mask", np.zeros((1, 2), bool))
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, "a sequence step takes only 'query'",
                         request)
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, "need a non-zero 'sequence_id'",
                         make_request("small", [("query", tokens)],
                                      params={"sequence_start": True}))

    # -- Both protocols at once ---------------------------------------------------------------

    def test_mixed_load_from_both_protocols(self):
        cases = []
        for i in range(16):
            n, l = 1 + i % 3, 3 + (5 * i) % 7
            case = dict(model="small", query=self.randn(n, l, 32), is_causal=i % 4 == 1,
                        need_weights=i % 3 == 0)
            if i % 2:
                case["key_padding_mask"] = self.bool_mask(n, l)
            cases.append(case)
        solos = [decode(self.infer(self.oip_request(c))) for c in cases]
        failures, shared = [], {"v1": 0, "oip": 0}
        lock = threading.Lock()

        def check(i, got, where):
            for name, (_, want) in solos[i].items():
                if name not in got or got[name].shape != want.shape or \
                        np.abs(got[name] - want).max() > 1e-5:
                    with lock:
                        failures.append(f"{where}: case {i} {name} differs from solo")

        def v1_client():  # One attention.v1 client: its batches of >1 hold OIP requests.
            for _ in range(4):
                for i, case in enumerate(cases):
                    result = self.v1_infer(case)
                    with lock:
                        shared["v1"] += result.batch_requests > 1
                    got = {"output": result.output}
                    if result.attn_weights is not None:
                        got["attn_weights"] = result.attn_weights
                    check(i, got, "attention.v1")

        def oip_client(start):
            for _ in range(4):
                for i in range(start, len(cases), 2):
                    response = self.infer(self.oip_request(cases[i], typed=i % 4 == 3))
                    with lock:
                        shared["oip"] += response.parameters["batch_requests"].int64_param > 1
                    check(i, {k: v for k, (_, v) in decode(response).items()}, "ModelInfer")

        def stream_client():
            requests = [self.oip_request(c, request_id=str(i))
                        for _ in range(3) for i, c in enumerate(cases)]
            count = 0
            for response in self.stub.ModelStreamInfer(iter(requests), timeout=120):
                count += 1
                if response.error_message:
                    with lock:
                        failures.append(f"stream: {response.error_message}")
                    continue
                check(int(response.infer_response.id),
                      {k: v for k, (_, v) in decode(response.infer_response).items()},
                      "ModelStreamInfer")
            if count != len(requests):
                with lock:
                    failures.append(f"stream: {count} responses to {len(requests)} requests")

        def guarded(target, *args):
            def run():
                try:
                    target(*args)
                except Exception as e:  # noqa: BLE001 - reported as a failure.
                    with lock:
                        failures.append(f"{target.__name__}: {e!r}")
            return threading.Thread(target=run)

        threads = [guarded(v1_client), guarded(oip_client, 0), guarded(oip_client, 1),
                   guarded(oip_client, 0), guarded(stream_client)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])
        self.assertGreater(shared["v1"], 0,
                           "no attention.v1 request shared a batch with the other protocol")


if __name__ == "__main__":
    unittest.main()
