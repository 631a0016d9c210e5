"""Models exported from torch.nn.MultiheadAttention(batch_first=False), PyTorch's default layout,
served in the module's own layout on every protocol, against the module itself.

One server for the module, on a temporary repository of layers exported with
scripts/export_torch_mha.py (config.json "batch_first": false): "seq" (E=32, 4 heads, bias,
add_bias_kv), "seq_cross" (E=16, 2 heads, kdim=12, vdim=10), "seq_bf16" and "seq_int8" (E=32,
4 heads, compute_dtype bfloat16 and int8), and the batch-first twins of the last two
("twin_bf16", "twin_int8": the same weights exported with batch_first=True).

Every call sends the tensors exactly as the module takes them: query (L, N, E), key (S, N, kdim),
value (S, N, vdim), with N > 1 and L != S; key_padding_mask (N, S); attn_mask (L, S) or
(N*H, L, S). Checked:
  * attention.v1 Infer and InferStream, the Open Inference Protocol's ModelInfer and
    ModelStreamInfer (gRPC) and REST: the output is (L, N, E) and within 1e-5 + 1e-5 |want| of
    the module in float64 (float32 compute), the attention weights (N, L, S') (averaged) or
    (N, H, L, S') (per head) as the module returns them; BF16 inputs too (the oracle takes the
    rounded values; the output's rounding allowed on top);
  * bfloat16 and int8 models: equal (within 1e-6) to their batch-first twins given the same
    tensors transposed, output and weights, and near the module (a layout mistake is off by
    ~1: here at most 3% of the largest |output|);
  * a sequence step (Open Inference Protocol sequences) takes [T, 1, E] and answers [T, 1, E],
    as one stateless causal call over the same tokens; [1, T, E] with T > 1 is refused naming
    [T, 1, E];
  * what the server says of the layout: attention.v1 GetModel's batch_first (and the Python
    client's models()), ModelConfig's parameters["batch_first"] (gRPC and REST), ModelMetadata's
    shapes ([-1, -1, E]: the same in both layouts);
  * shape errors name the layout: "query: expected shape (L, N, E) [*, *, 32], got ...".

Run by CTest as python_batch_first_test (ATTENTION_SERVER_BINARY, ATTENTION_PY_GEN and PYTHONPATH
set there), with /usr/bin/python3 (Debian's python3-torch, grpcio, NumPy).
"""
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

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
    from attention.v1 import attention_pb2 as v1
    from attention.v1 import attention_pb2_grpc as v1_grpc
    from inference import grpc_predict_v2_pb2 as pb
    from inference import grpc_predict_v2_pb2_grpc as pb_grpc

ATOL = RTOL = 1e-5
MODELS = {}  # name -> the float64 module its weights came from (batch_first as exported).
STATE = {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_models(directory):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    specs = {  # name -> (MultiheadAttention arguments, compute_dtype)
        "seq": (dict(embed_dim=32, num_heads=4, add_bias_kv=True), "float32"),
        "seq_cross": (dict(embed_dim=16, num_heads=2, kdim=12, vdim=10), "float32"),
        "seq_bf16": (dict(embed_dim=32, num_heads=4), "bfloat16"),
        "seq_int8": (dict(embed_dim=32, num_heads=4), "int8"),
    }
    for name, (args, compute) in specs.items():
        m = torch.nn.MultiheadAttention(**args)  # PyTorch's default: batch_first=False.
        with torch.no_grad():  # Non-zero biases, so that they are exercised.
            m.in_proj_bias.normal_(0, 0.1, generator=g)
            m.out_proj.bias.normal_(0, 0.1, generator=g)
            if m.bias_k is not None:
                m.bias_k.normal_(0, 0.5, generator=g)
                m.bias_v.normal_(0, 0.5, generator=g)
        m.eval()
        assert export_mha(m, os.path.join(directory, name), compute_dtype=compute)[
            "batch_first"] is False
        MODELS[name] = copy.deepcopy(m).double()
        if compute != "float32":  # The same weights, batch-first.
            twin = copy.deepcopy(m)
            twin.batch_first = True
            export_mha(twin, os.path.join(directory, name.replace("seq", "twin")),
                       compute_dtype=compute)


def wait_until_ready(url, server, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError("attention-server exited")
        if time.monotonic() > deadline:
            raise RuntimeError("attention-server did not become ready")
        time.sleep(0.05)


def setUpModule():
    if MISSING:
        return
    STATE["dir"] = tempfile.TemporaryDirectory(prefix="attention-batch-first-")
    repository = os.path.join(STATE["dir"].name, "models")
    build_models(repository)
    port, http = free_port(), free_port()
    STATE["target"] = f"127.0.0.1:{port}"
    STATE["url"] = f"http://127.0.0.1:{http}"
    STATE["log"] = open(os.path.join(STATE["dir"].name, "server.log"), "w+")
    STATE["server"] = subprocess.Popen(
        [SERVER, "--host=127.0.0.1", f"--port={port}", "--metrics_port=0", f"--http_port={http}",
         f"--model_repository={repository}", "--threads=2"], stderr=STATE["log"])
    try:
        wait_until_ready(STATE["url"], STATE["server"])
    except Exception:
        tearDownModule()
        raise


def tearDownModule():
    server = STATE.pop("server", None)
    if server is None:
        return
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=60)
    STATE["log"].seek(0)
    log = STATE["log"].read()
    STATE["log"].close()
    STATE["dir"].cleanup()
    assert code == 0, f"attention-server exited with {code}:\n{log}"


def to_bf16(values):
    """float32 -> bfloat16 words (uint16), rounding to nearest even (finite values)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(words):
    return (np.asarray(words, dtype=np.uint32) << 16).view(np.float32)


def reference(model, q, k=None, v=None, key_padding_mask=None, attn_mask=None, average=True):
    """(output (L, N, E), weights (N, L, S') or (N, H, L, S')) of MODELS[model] in float64,
    called in its own layout."""
    m = MODELS[model]
    t = lambda a: None if a is None else torch.from_numpy(np.asarray(a))  # noqa: E731
    q = t(q).double()
    k = q if k is None else t(k).double()
    v = k if v is None else t(v).double()
    with torch.no_grad():
        out, weights = m(q, k, v, key_padding_mask=t(key_padding_mask), attn_mask=t(attn_mask),
                         need_weights=True, average_attn_weights=average)
    return out.numpy(), weights.numpy()


# attention.v1 tensors.
V1_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.bool_): 4}


def v1_tensor(array):
    if array is None:
        return None
    return v1.Tensor(dtype=V1_DTYPES[array.dtype], shape=list(array.shape),
                     data=np.ascontiguousarray(array).tobytes())


def v1_array(tensor):
    assert tensor.dtype == 1, tensor.dtype
    return np.frombuffer(tensor.data, dtype="<f4").reshape(tuple(tensor.shape))


# Open Inference Protocol tensors.
OIP_DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.bool_): "BOOL"}


def oip_request(model, inputs, params=None, request_id=""):
    """inputs: [(name, array)]; an array of dtype uint16 goes as BF16 words."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs:
        if array is None:
            continue
        datatype = "BF16" if array.dtype == np.uint16 else OIP_DTYPES[array.dtype]
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name, value in (params or {}).items():
        if isinstance(value, bool):
            request.parameters[name].bool_param = value
        else:
            request.parameters[name].int64_param = value
    return request


def oip_outputs(response):
    result = {}
    for meta, data in zip(response.outputs, response.raw_output_contents):
        if meta.datatype == "BF16":
            array = from_bf16(np.frombuffer(data, dtype="<u2"))
        else:
            assert meta.datatype == "FP32", meta.datatype
            array = np.frombuffer(data, dtype="<f4")
        result[meta.name] = array.reshape(tuple(meta.shape))
    return result


@unittest.skipIf(MISSING, f"dependencies missing: {MISSING}")
class BatchFirstFalseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.channel = grpc.insecure_channel(STATE["target"])
        cls.v1 = v1_grpc.AttentionServiceStub(cls.channel)
        cls.oip = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()

    def setUp(self):
        self.rng = np.random.default_rng(11)

    def randn(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32)

    def kpm(self, n, s):
        mask = self.rng.random((n, s)) < 0.3
        mask[:, 0] = False  # No fully masked row.
        return mask

    def assert_close(self, got, want, what, atol=ATOL, rtol=RTOL):
        self.assertEqual(got.shape, want.shape, what)
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)

    def cases(self):
        """(model, inputs, per-head weights) in the module's layout: N > 1, L != S."""
        n, l, s = 3, 5, 7
        self_kv = self.randn(s, n, 32)
        return [
            # Self-attention layer given its keys: key_padding_mask (N, S), bias_k appended.
            ("seq", dict(query=self.randn(l, n, 32), key=self_kv, value=self_kv,
                         key_padding_mask=self.kpm(n, s)), False),
            # Self-attention (keys are the query), a per-item attn_mask (N*H, L, L), per head.
            ("seq", dict(query=self.randn(l, 2, 32),
                         attn_mask=np.triu(np.ones((2 * 4, l, l), bool), 1)), True),
            # kdim and vdim != E, key_padding_mask and a 2-D attn_mask (L, S).
            ("seq_cross", dict(query=self.randn(l, n, 16), key=self.randn(s, n, 12),
                               value=self.randn(s, n, 10), key_padding_mask=self.kpm(n, s),
                               attn_mask=self.kpm(l, s)), False),
        ]

    def check(self, model, inputs, per_head, output, weights, what):
        want, want_weights = reference(model, inputs["query"], inputs.get("key"),
                                       inputs.get("value"), inputs.get("key_padding_mask"),
                                       inputs.get("attn_mask"), average=not per_head)
        self.assertEqual(output.shape, inputs["query"].shape, what)  # (L, N, E)
        self.assert_close(output, want, what)
        self.assert_close(weights, want_weights, what + " weights")

    def v1_request(self, model, inputs, per_head, request_id=""):
        return v1.InferRequest(
            model=model, request_id=request_id, need_weights=True, per_head_weights=per_head,
            **{k: v1_tensor(inputs.get(k)) for k in
               ("query", "key", "value", "key_padding_mask", "attn_mask")})

    # -- attention.v1 ----------------------------------------------------------------------

    def test_attention_v1_infer_and_stream_answer_like_the_module(self):
        cases = self.cases()
        for i, (model, inputs, per_head) in enumerate(cases):
            r = self.v1.Infer(self.v1_request(model, inputs, per_head), timeout=30)
            self.check(model, inputs, per_head, v1_array(r.output), v1_array(r.attn_weights),
                       f"Infer case {i}")
        requests = [self.v1_request(m, x, h, request_id=str(i))
                    for i, (m, x, h) in enumerate(cases)]
        answered = 0
        for r in self.v1.InferStream(iter(requests), timeout=60):
            self.assertFalse(r.HasField("error"), r.error.message)
            model, inputs, per_head = cases[int(r.request_id)]
            self.check(model, inputs, per_head, v1_array(r.output), v1_array(r.attn_weights),
                       f"InferStream case {r.request_id}")
            answered += 1
        self.assertEqual(answered, len(cases))

    # -- The Open Inference Protocol ---------------------------------------------------------

    def oip_req(self, model, inputs, per_head, request_id=""):
        return oip_request(model, [(k, inputs.get(k)) for k in
                                   ("query", "key", "value", "key_padding_mask", "attn_mask")],
                           params={"need_weights": True, "average_attn_weights": not per_head},
                           request_id=request_id)

    def test_inference_protocol_grpc_answers_like_the_module(self):
        cases = self.cases()
        for i, (model, inputs, per_head) in enumerate(cases):
            out = oip_outputs(self.oip.ModelInfer(self.oip_req(model, inputs, per_head), timeout=30))
            self.check(model, inputs, per_head, out["output"], out["attn_weights"],
                       f"ModelInfer case {i}")
        requests = [self.oip_req(m, x, h, request_id=str(i)) for i, (m, x, h) in enumerate(cases)]
        answered = 0
        for r in self.oip.ModelStreamInfer(iter(requests), timeout=60):
            self.assertEqual(r.error_message, "")
            model, inputs, per_head = cases[int(r.infer_response.id)]
            out = oip_outputs(r.infer_response)
            self.check(model, inputs, per_head, out["output"], out["attn_weights"],
                       f"ModelStreamInfer case {r.infer_response.id}")
            answered += 1
        self.assertEqual(answered, len(cases))

    def test_bf16_inputs(self):
        query = to_bf16(self.randn(6, 2, 32))
        out = oip_outputs(self.oip.ModelInfer(oip_request("seq", [("query", query)]),
                                              timeout=30))["output"]
        want, _ = reference("seq", from_bf16(query))
        self.assert_close(out, want, "BF16 query", rtol=2.0 ** -7)

    def test_rest_answers_like_the_module(self):
        model, inputs, per_head = self.cases()[2]
        body = {"inputs": [], "parameters": {"need_weights": True}}
        for name in ("query", "key", "value", "key_padding_mask", "attn_mask"):
            a = inputs[name]
            body["inputs"].append({"name": name, "datatype": OIP_DTYPES[a.dtype],
                                   "shape": list(a.shape), "data": a.ravel().tolist()})
        request = urllib.request.Request(f"{STATE['url']}/v2/models/{model}/infer",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            response = json.load(r)
        out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
               for o in response["outputs"]}
        self.check(model, inputs, per_head, out["output"], out["attn_weights"], "REST")

    # -- bfloat16 and int8 -------------------------------------------------------------------

    def test_bfloat16_and_int8_models_equal_their_batch_first_twins(self):
        n, l, s = 3, 5, 7
        q, kv, kpm = self.randn(l, n, 32), self.randn(s, n, 32), self.kpm(n, s)
        for compute in ("bf16", "int8"):
            seq = self.v1.Infer(v1.InferRequest(
                model=f"seq_{compute}", query=v1_tensor(q), key=v1_tensor(kv),
                value=v1_tensor(kv), key_padding_mask=v1_tensor(kpm), need_weights=True),
                timeout=30)
            t = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))  # noqa: E731
            twin = self.v1.Infer(v1.InferRequest(
                model=f"twin_{compute}", query=v1_tensor(t(q)), key=v1_tensor(t(kv)),
                value=v1_tensor(t(kv)), key_padding_mask=v1_tensor(kpm), need_weights=True),
                timeout=30)
            out, weights = v1_array(seq.output), v1_array(seq.attn_weights)
            self.assert_close(out, t(v1_array(twin.output)), compute, atol=1e-6, rtol=0)
            self.assert_close(weights, v1_array(twin.attn_weights), compute + " weights",
                              atol=1e-6, rtol=0)
            want, want_weights = reference(f"seq_{compute}", q, kv, kv, kpm)
            scale = np.abs(want).max()
            self.assertLess(np.abs(out - want).max(), 0.03 * scale, compute)
            self.assertLess(np.abs(weights - want_weights).max(), 0.03, compute + " weights")

    # -- Sequences -----------------------------------------------------------------------------

    def test_sequence_steps_take_and_return_one_item_in_the_layout(self):
        tokens = self.randn(6, 1, 32)  # (T, N=1, E)
        causal = np.triu(np.ones((6, 6), bool), 1)
        whole, _ = reference("seq", tokens, attn_mask=causal)
        got = []
        for i, (at, t) in enumerate(((0, 4), (4, 2))):
            r = self.oip.ModelInfer(oip_request(
                "seq", [("query", tokens[at:at + t])],
                params={"sequence_id": 9, "sequence_start": i == 0, "sequence_end": i == 1}),
                timeout=30)
            out = oip_outputs(r)["output"]
            self.assertEqual(out.shape, (t, 1, 32))
            got.append(out)
        self.assert_close(np.concatenate(got, axis=0), whole, "sequence steps")
        with self.assertRaises(grpc.RpcError) as ctx:
            self.oip.ModelInfer(oip_request("seq", [("query", self.randn(1, 3, 32))],
                                            params={"sequence_id": 10, "sequence_start": True}),
                                timeout=30)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("[T, 1, E]", ctx.exception.details())

    # -- What the server says ------------------------------------------------------------------

    def test_the_layout_is_reported(self):
        for name, batch_first in (("seq", False), ("seq_cross", False), ("twin_int8", True)):
            self.assertIs(self.v1.GetModel(v1.GetModelRequest(name=name),
                                           timeout=10).batch_first, batch_first)
            config = self.oip.ModelConfig(pb.ModelConfigRequest(name=name), timeout=10).config
            self.assertEqual(config.parameters["batch_first"].string_value,
                             "true" if batch_first else "false")
            with urllib.request.urlopen(f"{STATE['url']}/v2/models/{name}/config",
                                        timeout=10) as r:
                rest = json.load(r)
            self.assertEqual(rest["parameters"]["batch_first"]["string_value"],
                             "true" if batch_first else "false")
        metadata = self.oip.ModelMetadata(pb.ModelMetadataRequest(name="seq_cross"), timeout=10)
        shapes = {t.name: list(t.shape) for t in list(metadata.inputs) + list(metadata.outputs)}
        self.assertEqual(shapes["query"], [-1, -1, 16])
        self.assertEqual(shapes["key"], [-1, -1, 12])
        self.assertEqual(shapes["output"], [-1, -1, 16])
        with AttentionClient(STATE["target"], timeout=10) as client:
            layouts = {m["name"]: m["batch_first"] for m in client.models()}
        self.assertEqual(layouts["seq"], False)
        self.assertEqual(layouts["twin_bf16"], True)

    def test_shape_errors_name_the_layout(self):
        bad = [  # (model, inputs, message)
            ("seq", dict(query=self.randn(5, 3, 16)),
             "query: expected shape (L, N, E) [*, *, 32], got [5, 3, 16]"),
            ("seq_cross", dict(query=self.randn(5, 3, 16), key=self.randn(7, 2, 12),
                               value=self.randn(7, 2, 10)),
             "key: expected shape (S, N, kdim) [*, 3, 12], got [7, 2, 12]"),
            ("seq_cross", dict(query=self.randn(5, 3, 16), key=self.randn(7, 3, 12),
                               value=self.randn(6, 3, 10)),
             "value: expected shape (S, N, vdim) [7, 3, 10], got [6, 3, 10]"),
            # A batch-first (N, S) mask sent (S, N): the masks keep PyTorch's shapes.
            ("seq", dict(query=self.randn(5, 3, 32), key_padding_mask=self.kpm(5, 3)),
             "key_padding_mask: expected shape [3, 5], got [5, 3]"),
        ]
        for model, inputs, message in bad:
            with self.assertRaises(grpc.RpcError) as ctx:
                self.v1.Infer(self.v1_request(model, inputs, False), timeout=30)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(message, ctx.exception.details())
            with self.assertRaises(grpc.RpcError) as ctx:
                self.oip.ModelInfer(self.oip_req(model, inputs, False), timeout=30)
            self.assertIn(message, ctx.exception.details())


if __name__ == "__main__":
    unittest.main()
