"""Tests of the Python client against a live attention-server (the demo model; stateless
calls, sessions and examples/decode_loop.py), of its encoding, and of its channel (retries,
balancing, health, session routing) against fake grpcio replicas.

Run by CTest as python_client_test against the source tree (ATTENTION_SERVER_BINARY,
ATTENTION_PY_GEN and PYTHONPATH set there), and by python_package_test against the installed
package; by hand: ATTENTION_PY_GEN=build/client/python/gen PYTHONPATH=client/python
/usr/bin/python3 -m unittest discover -s client/python/tests -p test_client.py
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from concurrent import futures

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))

try:
    import grpc  # noqa: F401
    import numpy as np
    from attention_client import AttentionClient, AttentionError, ReplayingSession, Session
    from attention_client import client as client_module
    MISSING = None
except ImportError as e:  # Reported as a skip with the reason.
    MISSING = str(e)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.server = subprocess.Popen([SERVER, "--host=127.0.0.1", f"--port={cls.port}",
                                       "--metrics_port=0", "--http_port=0"], stderr=subprocess.DEVNULL)
        cls.client = AttentionClient(f"127.0.0.1:{cls.port}", timeout=10)
        deadline = time.monotonic() + 30
        while not cls.client.health():
            if cls.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("attention-server did not become ready")
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.send_signal(signal.SIGTERM)
        assert cls.server.wait(timeout=60) == 0

    def setUp(self):
        self.rng = np.random.default_rng(0)

    def query(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32)

    def test_models_and_health(self):
        models = self.client.models()
        self.assertEqual([m["name"] for m in models], ["demo"])
        self.assertEqual(models[0]["embed_dim"], 256)
        self.assertEqual(models[0]["num_heads"], 8)
        self.assertTrue(models[0]["is_default"])
        self.assertEqual(models[0]["compute_dtype"], "DATA_TYPE_FLOAT32")
        self.assertTrue(self.client.health())
        self.assertTrue(self.client.health("attention.v1.AttentionService"))
        self.assertEqual(self.client.health_status(), "SERVING")
        self.assertFalse(AttentionClient(f"127.0.0.1:{free_port()}", timeout=1).health())

    def test_infer_shapes_and_determinism(self):
        q = self.query(2, 6, 256)
        a = self.client.infer(q, request_id="x1")
        b = self.client.infer(q)
        self.assertEqual(a.output.shape, (2, 6, 256))
        self.assertEqual(a.output.dtype, np.float32)
        self.assertEqual(a.request_id, "x1")
        self.assertIsNone(a.attn_weights)
        np.testing.assert_array_equal(a.output, b.output)
        self.assertGreaterEqual(a.batch_requests, 1)
        unbatched = self.client.infer(q[0])
        self.assertEqual(unbatched.output.shape, (6, 256))
        np.testing.assert_allclose(unbatched.output, a.output[0], atol=1e-5)

    def test_masks_and_weights(self):
        q = self.query(2, 5, 256)
        kpm = np.zeros((2, 5), dtype=bool)
        kpm[:, 3:] = True
        plain = self.client.infer(q, need_weights=True)
        masked = self.client.infer(q, key_padding_mask=kpm, need_weights=True)
        self.assertEqual(masked.attn_weights.shape, (2, 5, 5))
        np.testing.assert_allclose(masked.attn_weights.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(masked.attn_weights[..., 3:], 0.0)
        self.assertGreater(np.abs(plain.output - masked.output).max(), 1e-3)
        per_head = self.client.infer(q, key_padding_mask=kpm, need_weights=True,
                                     per_head_weights=True)
        self.assertEqual(per_head.attn_weights.shape, (2, 8, 5, 5))
        np.testing.assert_allclose(per_head.attn_weights.mean(1), masked.attn_weights, atol=1e-6)
        causal = self.client.infer(q, is_causal=True, need_weights=True)
        self.assertTrue(np.all(np.triu(causal.attn_weights[0], 1) == 0))
        float_mask = self.rng.standard_normal((5, 5)).astype(np.float32)
        self.assertEqual(self.client.infer(q, attn_mask=float_mask).output.shape, (2, 5, 256))

    def test_dtypes(self):
        q = self.query(1, 4, 256)
        half = self.client.infer(q.astype(np.float16))
        self.assertEqual(half.output.dtype, np.float16)
        # Big-endian arrays are sent as the same values (once raised TypeError).
        np.testing.assert_array_equal(self.client.infer(q.astype(">f4")).output,
                                      self.client.infer(q.astype("<f4")).output)
        np.testing.assert_array_equal(self.client.infer(q.astype(">f2")).output, half.output)
        np.testing.assert_array_equal(
            self.client.infer(q.astype("<f4"), key_padding_mask=np.zeros((1, 4), bool),
                              attn_mask=np.zeros((4, 4), ">f4")).output,
            self.client.infer(q).output)
        as_bf16 = self.client.infer(q, output_dtype="bfloat16")
        full = self.client.infer(q)
        np.testing.assert_allclose(as_bf16.output, full.output, atol=1e-2)
        sent_bf16 = self.client.infer(q, bfloat16=True, output_dtype="float32")
        np.testing.assert_allclose(sent_bf16.output, full.output, atol=2e-2)

    def test_errors(self):
        with self.assertRaises(AttentionError) as ctx:
            self.client.infer(self.query(1, 4, 100))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("query: expected shape [*, *, 256], got [1, 4, 100]", ctx.exception.details)
        with self.assertRaises(AttentionError) as ctx:
            self.client.infer(self.query(1, 4, 256), model="nope")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(AttentionError) as ctx:
            self.client.infer(self.query(1, 4, 256), key_padding_mask=np.zeros((1, 3), bool))
        self.assertIn("key_padding_mask", ctx.exception.details)

    def test_example_against_pytorch(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("python3-torch missing")
        example = os.path.join(REPO, "client", "python", "examples", "serve_torch_layer.py")
        result = subprocess.run([sys.executable, example, "--server-binary", SERVER],
                                capture_output=True, text=True, timeout=240)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("OK: attention-server matches torch.nn.MultiheadAttention", result.stdout)

    # Sessions: every output row equals the one stateless Infer over the whole sequence gives.

    def test_self_session_matches_causal_infer(self):
        x = self.query(21, 256)
        want = self.client.infer(x, is_causal=True).output
        # Token by token, then in chunks crossing the server's 16-token cache blocks.
        for chunks in ([1] * 21, [5, 12, 1, 3]):
            with self.client.session() as session:
                self.assertIsInstance(session, Session)
                self.assertEqual((session.kind, session.model, session.length),
                                 ("self", "demo", 0))
                got, at = [], 0
                for t in chunks:
                    result = session.append(x[at:at + t])
                    at += t
                    self.assertEqual(result.output.shape, (t, 256))
                    self.assertEqual(result.length, at)
                    self.assertIsNone(result.attn_weights)
                    self.assertGreaterEqual(result.batch_requests, 1)
                    got.append(result.output)
                np.testing.assert_allclose(np.concatenate(got), want, atol=1e-5, err_msg=chunks)
                info = session.info()
                self.assertEqual((info.session_id, info.kind, info.length, info.keys),
                                 (session.session_id, "self", 21, 21))
                self.assertGreater(info.bytes, 0)
        # Weights over every key held, and not_key as key_padding_mask over the sequence.
        not_key = np.zeros(8, bool)
        not_key[3] = True
        want = self.client.infer(x[None, :8], key_padding_mask=not_key[None], is_causal=True,
                                 need_weights=True)
        with self.client.session() as session:
            first = session.append(x[:5], not_key=not_key[:5], need_weights=True)
            second = session.append(x[5:8], not_key=not_key[5:8], need_weights=True,
                                    per_head_weights=True, output_dtype="float16")
        np.testing.assert_allclose(np.concatenate([first.output, second.output]),
                                   want.output[0], atol=2e-3)
        self.assertEqual(first.attn_weights.shape, (5, 5))
        np.testing.assert_allclose(first.attn_weights, want.attn_weights[0, :5, :5], atol=1e-5)
        self.assertEqual(second.output.dtype, np.float16)
        self.assertEqual(second.attn_weights.shape, (8, 3, 8))
        np.testing.assert_array_equal(second.attn_weights[:, :, 3], 0)

    def test_cross_session_matches_infer(self):
        key, value, q = self.query(12, 256), self.query(12, 256), self.query(9, 256)
        mask = np.zeros(12, bool)
        mask[10:] = True
        got = {}
        for is_causal in (False, True):
            want = self.client.infer(q[None], key=key[None], value=value[None],
                                     key_padding_mask=mask[None], is_causal=is_causal).output[0]
            with self.client.session(kind="cross", key=key, value=value, key_padding_mask=mask,
                                     is_causal=is_causal) as session:
                self.assertEqual(session.kind, "cross")
                got[is_causal] = np.concatenate([session.append(q[:4]).output,
                                                 session.append(q[4:5]).output,
                                                 session.append(q[5:]).output])
                info = session.info()
            np.testing.assert_allclose(got[is_causal], want, atol=1e-5,
                                       err_msg=f"is_causal={is_causal}")
            self.assertEqual((info.kind, info.length, info.keys), ("cross", 9, 12))
        # The session applied the mask and is_causal: without them the rows differ.
        unmasked = self.client.infer(q, key=key, value=value).output
        self.assertGreater(np.abs(unmasked - got[False]).max(), 1e-3)
        self.assertGreater(np.abs(got[True] - got[False]).max(), 1e-3)

    def test_session_context_manager_closes(self):
        with self.client.session(ttl_s=30) as session:
            session.append(self.query(3, 256))
            self.assertEqual(session.info().ttl_s, 30)
            self.assertEqual(session.info().length, 3)
        for call in (session.info, lambda: self.client.session_info(session.session_id),
                     lambda: session.append(self.query(1, 256))):
            with self.assertRaises(AttentionError) as ctx:
                call()
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("closed", ctx.exception.details)
        self.assertEqual(session.close(), 0)  # Closing again is a no-op.
        # An exception in the block closes the session too, and propagates.
        with self.assertRaises(ZeroDivisionError):
            with self.client.session() as failed:
                1 / 0
        with self.assertRaises(AttentionError) as ctx:
            self.client.session_info(failed.session_id)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_replaying_session_recovers(self):
        x = self.query(13, 256)
        want = self.client.infer(x, is_causal=True).output
        with self.client.session(replay=True) as session:
            self.assertIsInstance(session, ReplayingSession)
            plain = self.client.session()
            got = [session.append(x[:6]).output, session.append(x[6:7]).output]
            plain.append(x[:6])
            lost = session.session_id
            # Closed behind their backs (as an expired or evicted session, or a restart).
            self.assertGreater(self.client.close_session(lost), 0)
            self.client.close_session(plain.session_id)
            with self.assertRaises(AttentionError) as ctx:
                plain.append(x[6:7])
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
            got.append(session.append(x[7:10]).output)
            self.assertEqual(session.recoveries, 1)
            self.assertNotEqual(session.session_id, lost)
            got.append(session.append(x[10:]).output)
            self.assertEqual(session.recoveries, 1)
            self.assertEqual(session.info().length, 13)
        np.testing.assert_allclose(np.concatenate(got), want, atol=1e-5)
        # Only a lost session is recovered: other errors are raised, the session unchanged.
        with self.client.session(replay=True) as session:
            session.append(x[:2])
            with self.assertRaises(AttentionError) as ctx:
                session.append(self.query(1, 100))
            self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual((session.recoveries, len(session.history)), (0, 1))
            self.assertEqual(session.info().length, 2)

    def test_session_errors(self):
        with self.assertRaises(AttentionError) as ctx:
            self.client.session(model="nope")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(AttentionError) as ctx:
            self.client.session(key=self.query(4, 256))  # A self session takes no key.
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(ValueError):
            self.client.session(kind="both")
        with self.client.session() as session:
            with self.assertRaises(AttentionError) as ctx:
                session.append(self.query(2, 100))
            self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("tokens", ctx.exception.details)
            self.assertEqual(session.append(self.query(2, 256)).length, 2)

    def test_decode_loop_example(self):
        example = os.path.join(REPO, "client", "python", "examples", "decode_loop.py")
        result = subprocess.run([sys.executable, example, "--server", f"127.0.0.1:{self.port}",
                                 "--prompt", "20", "--steps", "6", "--check"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("prefill 20 tokens", result.stdout)
        self.assertEqual(result.stdout.count("\nstep "), 6, result.stdout)
        self.assertIn("step   6: length   26", result.stdout)
        self.assertIn("final length 26, recoveries 0", result.stdout)
        self.assertIn("over 26 tokens", result.stdout)
        self.assertIn(": MATCH", result.stdout)
        bad = subprocess.run([sys.executable, example, "--server", f"127.0.0.1:{self.port}",
                              "--model", "nope"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("not served", bad.stderr)


HEALTH = "/grpc.health.v1.Health/"
INFER = "/attention.v1.AttentionService/Infer"
SESSIONS = "/attention.v1.SessionService/"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # HealthCheckResponse{status}.


class FakeBackend:
    """A grpcio server standing in for one replica: grpc.health.v1 Check and Watch report
    `health`; Infer counts its calls (attempts) and answers OK (an empty InferResponse) or
    fails with `infer_code` (e.g. UNAVAILABLE, as a draining replica does). SessionService
    calls are recorded in `session_calls` as (method, session_id); CreateSession answers
    the id `session_id` (its '#' replaced by a count), Append fails with the next code of
    `append_codes` (None: OK), GetSession and CloseSession answer OK."""

    def __init__(self, health=SERVING, infer_code=None, session_id=""):
        self.health, self.infer_code = health, infer_code
        self.session_id = session_id
        self.session_calls = []
        self.append_codes = []
        self.created = 0
        self.infer_calls = 0
        self.request_bytes = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                   options=[("grpc.max_receive_message_length", 16 << 20)])
        self._server.add_generic_rpc_handlers([self])
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def service(self, details):  # grpc.GenericRpcHandler
        if details.method == HEALTH + "Check":
            return grpc.unary_unary_rpc_method_handler(lambda request, context: self.health)
        if details.method == HEALTH + "Watch":
            return grpc.unary_stream_rpc_method_handler(self._watch)
        if details.method == INFER:
            return grpc.unary_unary_rpc_method_handler(self._infer)
        if details.method.startswith(SESSIONS):
            method = details.method[len(SESSIONS):]
            pb2 = client_module.sessions_pb2
            request_type = {"CreateSession": pb2.CreateSessionRequest,
                            "Append": pb2.AppendRequest, "GetSession": pb2.GetSessionRequest,
                            "CloseSession": pb2.CloseSessionRequest}.get(method)
            if request_type is None:
                return None
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: self._session(method, request, context),
                request_deserializer=request_type.FromString,
                response_serializer=lambda response: response.SerializeToString())
        return None

    def _session(self, method, request, context):
        pb2 = client_module.sessions_pb2
        session_id = getattr(request, "session_id", "")
        with self._lock:
            self.session_calls.append((method, session_id))
        if method == "CreateSession":
            with self._lock:
                self.created += 1
                new_id = self.session_id.replace("#", str(self.created))
            return pb2.SessionInfo(session_id=new_id, kind=request.kind)
        if method == "Append":
            code = self.append_codes.pop(0) if self.append_codes else None
            if code is not None:
                context.abort(code, "session lost")
            return pb2.AppendResponse(session_id=session_id, length=request.tokens.shape[0])
        if method == "GetSession":
            return pb2.SessionInfo(session_id=session_id, length=7)
        return pb2.CloseSessionResponse(freed_bytes=4096)

    def _watch(self, request, context):
        yield self.health
        while context.is_active() and not self._stopped.wait(0.05):
            pass

    def _infer(self, request, context):
        with self._lock:
            self.infer_calls += 1
            self.request_bytes.append(len(request))
        if self.infer_code is not None:
            context.abort(self.infer_code, "server is shutting down")
        return b""

    def stop(self):
        self._stopped.set()
        self._server.stop(grace=None)


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class EncodingTest(unittest.TestCase):
    def test_bfloat16_keeps_nan(self):
        # A signalling NaN whose payload is all in the bits that rounding drops once became
        # +Inf; a quiet NaN, the infinities and 1.0 must round-trip too.
        bits = np.array([0x7F800001, 0x7FC00000, 0x7F800000, 0xFF800000, 0x3F800000,
                         0xFF800001, 0x7FFFFFFF], dtype=np.uint32)
        words = client_module.float32_to_bfloat16(bits.view(np.float32))
        self.assertEqual(words[:2].tolist(), [0x7FC0, 0x7FC0])
        self.assertEqual(words[5:].tolist(), [0xFFC0, 0x7FFF])
        back = client_module.bfloat16_to_float32(words)
        self.assertTrue(np.isnan(back[[0, 1, 5, 6]]).all(), back)
        self.assertEqual(back[2:5].tolist(), [np.inf, -np.inf, 1.0])
        # Rounding to nearest even is unchanged: 1 + 2^-8 (a tie) rounds down to 1.0,
        # 1 + 3 * 2^-8 up to 1 + 2^-6; the largest finite float32 rounds to +Inf.
        self.assertEqual(client_module.float32_to_bfloat16(
            np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5], np.float32)).tolist(),
            [0x3F80, 0x3F82, 0xC020])
        self.assertEqual(client_module.float32_to_bfloat16(
            np.array([0x7F7FFFFF], np.uint32).view(np.float32)).tolist(), [0x7F80])
        # And through a request: the bfloat16 tensor carries the quiet NaN.
        request = client_module.attention_pb2.InferRequest()
        client_module._encode(bits.view(np.float32)[:5], request.query, bfloat16=True)
        decoded = client_module._decode(request.query)
        self.assertTrue(np.isnan(decoded[:2]).all())
        self.assertEqual(decoded[2:].tolist(), [np.inf, -np.inf, 1.0])

    def test_big_endian_arrays(self):
        q = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
        for big, little in ((">f4", "<f4"), (">f2", "<f2"), (">f8", "<f4")):
            a, b = (client_module.attention_pb2.InferRequest() for _ in range(2))
            client_module._encode(q.astype(big), a.query)
            client_module._encode(q.astype(little), b.query)
            self.assertEqual(a.query, b.query, big)
            self.assertEqual(list(a.query.shape), [2, 3, 4])
            np.testing.assert_array_equal(client_module._decode(a.query), q.astype(little))


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class ChannelTest(unittest.TestCase):
    """The client's channel against fake replicas (no attention-server)."""

    def backend(self, **kwargs):
        backend = FakeBackend(**kwargs)
        self.addCleanup(backend.stop)
        return backend

    def client(self, target, **kwargs):
        client = AttentionClient(target, timeout=10, **kwargs)
        self.addCleanup(client.close)
        return client

    def test_default_config_round_robin_with_health_checks(self):
        config = self.client("localhost:1").service_config
        self.assertEqual(config["loadBalancingConfig"], [{"round_robin": {}}])
        self.assertEqual(config["healthCheckConfig"], {"serviceName": ""})
        for several in ("dns:///svc:1", "ipv4:127.0.0.1:1,127.0.0.1:2"):
            self.assertIn("healthCheckConfig", self.client(several).service_config, several)
        # One numeric address, or a socket, names one server: nothing to choose between.
        for one in ("127.0.0.1:1", "[::1]:1", "ipv4:127.0.0.1:1", "unix:/tmp/attention.sock"):
            one_config = self.client(one).service_config
            self.assertEqual(one_config["loadBalancingConfig"], [{"round_robin": {}}], one)
            self.assertNotIn("healthCheckConfig", one_config, one)
        # gRPC's health-check calls cannot carry a token: a channel with one has none.
        self.assertNotIn("healthCheckConfig", self.client("localhost:1", token="t").service_config)
        self.assertEqual(config["methodConfig"][0]["retryPolicy"]["maxAttempts"], 4)
        self.assertEqual(config["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"],
                         ["UNAVAILABLE"])
        chosen = self.client("127.0.0.1:1", load_balancing="pick_first").service_config
        self.assertEqual(chosen["loadBalancingConfig"], [{"pick_first": {}}])
        self.assertNotIn("healthCheckConfig", chosen)
        self.assertNotIn("loadBalancingConfig",
                         self.client("127.0.0.1:1", load_balancing=None).service_config)
        # health() must not health-check its backend, or NOT_SERVING turns into UNAVAILABLE.
        self.assertNotIn("healthCheckConfig", self.client("127.0.0.1:1").health_service_config)

    def test_session_calls_go_to_the_replica_in_the_id(self):
        # The target's replica creates the session; its id names another replica, which gets
        # every later call of the session over one cached channel.
        holder = self.backend()
        front = self.backend(session_id=f"{'ab' * 16}@{holder.address}")
        client = self.client(front.address)
        with client.session() as session:
            self.assertEqual(session.session_id, f"{'ab' * 16}@{holder.address}")
            self.assertEqual(session.append(np.ones((3, 8), np.float32)).length, 3)
            self.assertEqual(session.info().length, 7)
        self.assertEqual(client.close_session(session.session_id), 4096)
        self.assertEqual(front.session_calls, [("CreateSession", "")])
        self.assertEqual([m for m, _ in holder.session_calls],
                         ["Append", "GetSession", "CloseSession", "CloseSession"])
        self.assertTrue(all(i == session.session_id for _, i in holder.session_calls))
        self.assertEqual(list(client._replicas), [holder.address])
        # An id without '@' uses the target's channel.
        self.assertEqual(client.session_info("cd" * 16).length, 7)
        self.assertEqual(front.session_calls[-1], ("GetSession", "cd" * 16))
        self.assertIs(client.session_stub("cd" * 16), client.session_stub())
        self.assertIs(client.session_stub(session.session_id),
                      client.session_stub(f"{'ef' * 16}@{holder.address}"))

    def test_session_calls_retried_except_append(self):
        names = self.client("127.0.0.1:1").service_config["methodConfig"][0]["name"]
        retried = {n.get("method") for n in names if n["service"] == "attention.v1.SessionService"}
        self.assertEqual(retried, {"CreateSession", "GetSession", "CloseSession"})
        # A replica that is gone: the session's calls fail UNAVAILABLE (no wait for it).
        client = self.client("127.0.0.1:1")
        with self.assertRaises(AttentionError) as ctx:
            client.session_info(f"{'ab' * 16}@127.0.0.1:{free_port()}")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_failed_recovery_is_not_appended_to(self):
        # A recovery that fails midway (its replay got UNAVAILABLE) frees the partly replayed
        # session; the append tries again (MAX_RECOVERIES times) and then raises; the next
        # append starts a new recovery rather than appending to a partly replayed session.
        backend = self.backend(session_id="s#")
        client = self.client(backend.address)
        session = client.session(replay=True)
        token = np.ones((1, 8), np.float32)
        session.append(token)
        session.append(token)
        NOT_FOUND, UNAVAILABLE = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE
        backend.append_codes = [NOT_FOUND] + [UNAVAILABLE] * session.MAX_RECOVERIES
        with self.assertRaises(AttentionError) as ctx:
            session.append(token)
        self.assertEqual(ctx.exception.code, UNAVAILABLE)
        self.assertEqual(session.recoveries, 0)
        del backend.session_calls[:3]
        failed = []
        for n in (2, 3, 4):  # Each replays the 2 tokens as one append.
            failed += [("CreateSession", ""), ("Append", f"s{n}"), ("CloseSession", f"s{n}")]
        self.assertEqual(backend.session_calls, [("Append", "s1")] + failed)
        backend.session_calls.clear()
        session.append(token)
        self.assertEqual(session.recoveries, 1)
        self.assertEqual(session.session_id, "s5")
        self.assertEqual(backend.session_calls, [
            ("CreateSession", ""), ("Append", "s5"), ("Append", "s5")])
        self.assertEqual(len(session.history), 3)

    def test_large_requests_are_retried(self):
        # gRPC's default per-call retry buffer (256 KiB) once committed larger requests at
        # once: a 512 KiB request got 1 attempt, a 16 KiB one 4 (maxAttempts).
        backend = self.backend(infer_code=grpc.StatusCode.UNAVAILABLE)
        client = self.client(backend.address)
        for seq_len, min_bytes in ((16, 16 << 10), (512, 512 << 10)):
            backend.infer_calls = 0
            with self.assertRaises(AttentionError) as ctx:
                client.infer(np.ones((1, seq_len, 256), np.float32))
            self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(backend.infer_calls, 4, f"{seq_len} tokens")
            self.assertGreaterEqual(backend.request_bytes[-1], min_bytes)

    def test_draining_replica_is_skipped(self):
        # The first address drains (NOT_SERVING, Infer answers UNAVAILABLE): with pick_first
        # every attempt went to it and the call failed; round_robin with health checks sends
        # every call to the serving replica.
        draining = self.backend(health=NOT_SERVING, infer_code=grpc.StatusCode.UNAVAILABLE)
        serving = self.backend()
        client = self.client(f"ipv4:{draining.address},{serving.address}")
        for _ in range(8):
            self.assertIsNone(client.infer(np.ones((1, 2, 8), np.float32)).output)
        self.assertEqual(serving.infer_calls, 8)
        self.assertEqual(draining.infer_calls, 0)

    def test_health_reports_not_serving(self):
        draining = self.backend(health=NOT_SERVING, infer_code=grpc.StatusCode.UNAVAILABLE)
        client = self.client(draining.address)
        self.assertEqual(client.health_status(), "NOT_SERVING")
        self.assertFalse(client.health())
        # A numeric address names one server: not health-checked, the replica itself answers
        # UNAVAILABLE (4 attempts).
        with self.assertRaises(AttentionError) as ctx:
            client.infer(np.ones((1, 2, 8), np.float32))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(draining.infer_calls, 4)
        # A name may resolve to several replicas: the calls' channel health-checks each and
        # sends the draining one nothing.
        named = self.client(f"localhost:{draining.port}")
        with self.assertRaises(AttentionError) as ctx:
            named.infer(np.ones((1, 2, 8), np.float32))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(draining.infer_calls, 4)
        serving = self.backend()
        self.assertEqual(self.client(serving.address).health_status(), "SERVING")
        self.assertTrue(self.client(serving.address).health())
        with self.assertRaises(AttentionError) as ctx:
            self.client(f"127.0.0.1:{free_port()}").health_status()
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_health_then_calls_while_the_server_is_down_raise(self):
        # A readiness script: health() or health_status() first, then infer() and models()
        # while nothing listens. Debian's grpcio 1.51 crashed the caller's process here
        # (SIGSEGV: two channels to one target, one with healthCheckConfig, sharing
        # subchannels). Run in a child process, so that a crash fails this test instead of
        # killing the test runner.
        script = """
import sys
import numpy as np
from attention_client import AttentionClient, AttentionError
client = AttentionClient(sys.argv[1], timeout=2)
assert client.health() is False
for call in (lambda: client.infer(np.ones((1, 2, 8), np.float32)), client.models,
             client.health_status, lambda: client.infer(np.ones((1, 2, 8), np.float32))):
    try:
        call()
        sys.exit("a call to an unreachable server returned")
    except AttentionError as e:
        print(e.code.name)
client.close()
print("no crash")
"""
        # A name (not a numeric address), so that the calls' channel health-checks.
        child = subprocess.run([sys.executable, "-c", script, f"localhost:{free_port()}"],
                               capture_output=True, text=True, timeout=120, env=os.environ)
        self.assertEqual(child.returncode, 0,
                         f"exit {child.returncode} (-11: SIGSEGV); stdout: {child.stdout}; "
                         f"stderr: {child.stderr[-2000:]}")
        self.assertEqual(child.stdout.split(), ["UNAVAILABLE"] * 4 + ["no", "crash"])


if __name__ == "__main__":
    unittest.main()
