"""Sessions routed by a gateway, from the Python client: every session call carries the
x-attention-session header (a fresh key per session, a re-created one included; later calls take
it from the id), appends send expected_length, and ReplayingSession recovers from a diverged
copy and replays its history merged. Against a fake replica recording the metadata, and against
a live attention-server.

Run by CTest as python_routing_test (see test_client.py for the environment).
"""
import os
import signal
import subprocess
import threading
import time
import unittest
from concurrent import futures

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))

try:
    import grpc
    import numpy as np
    from attention_client import AttentionClient, AttentionError
    from attention_client import client as client_module
    MISSING = None
except ImportError as e:  # Reported as a skip with the reason.
    MISSING = str(e)

HEADER = "x-attention-session"


class RecordingReplica:
    """A grpcio SessionService recording (method, session_id, routing header, expected_length,
    tokens) per call. CreateSession answers "<32 hex>.<key>" with the header's key; Append
    fails with the next code (or (code, message)) of `append_codes` (None: OK, length =
    expected_length + tokens)."""

    def __init__(self):
        self.calls = []
        self.append_codes = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([self])
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def service(self, details):  # grpc.GenericRpcHandler
        prefix = "/attention.v1.SessionService/"
        if not details.method.startswith(prefix):
            return None
        method = details.method[len(prefix):]
        pb2 = client_module.sessions_pb2
        request_type = {"CreateSession": pb2.CreateSessionRequest, "Append": pb2.AppendRequest,
                        "GetSession": pb2.GetSessionRequest,
                        "CloseSession": pb2.CloseSessionRequest}[method]
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._call(method, request, context),
            request_deserializer=request_type.FromString,
            response_serializer=lambda response: response.SerializeToString())

    def _call(self, method, request, context):
        pb2 = client_module.sessions_pb2
        key = dict(context.invocation_metadata()).get(HEADER)
        expected = request.expected_length if method == "Append" else None
        tokens = request.tokens.shape[0] if method == "Append" else 0
        with self._lock:
            self.calls.append((method, getattr(request, "session_id", ""), key, expected, tokens))
        if method == "CreateSession":
            return pb2.SessionInfo(session_id="f" * 32 + "." + key, kind=request.kind)
        if method == "Append":
            code = self.append_codes.pop(0) if self.append_codes else None
            if code is not None:
                code, message = code if isinstance(code, tuple) else (code, "session lost")
                context.abort(code, message)
            return pb2.AppendResponse(session_id=request.session_id, length=expected + tokens)
        if method == "GetSession":
            return pb2.SessionInfo(session_id=request.session_id)
        return pb2.CloseSessionResponse()

    def stop(self):
        self._server.stop(grace=None)


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class RoutingHeaderTest(unittest.TestCase):
    def setUp(self):
        self.replica = RecordingReplica()
        self.client = AttentionClient(f"127.0.0.1:{self.replica.port}", timeout=10,
                                      load_balancing="pick_first")

    def tearDown(self):
        self.client.close()
        self.replica.stop()

    def test_every_call_carries_the_key_and_a_recovery_draws_a_fresh_one(self):
        self.assertEqual(client_module.routing_key_of("a" * 32 + ".k-1@10.0.0.1:5"), "k-1")
        self.assertEqual(client_module.routing_key_of("a" * 32 + "@10.0.0.1:5"), "")
        session = self.client.session(replay=True)
        session.replay_chunk_tokens = 2
        token = np.zeros((1, 8), np.float32)
        for _ in range(5):
            session.append(token)
        first_key = client_module.routing_key_of(session.session_id)
        self.assertRegex(first_key, r"^[0-9a-f]{32}$")
        session.info()
        session.close()
        calls = self.replica.calls
        self.assertEqual(calls[0][0], "CreateSession")
        self.assertEqual(calls[0][2], first_key)
        # Appends and the rest take the key from the id; expected_length counts the tokens.
        self.assertEqual([(c[2], c[3]) for c in calls[1:6]],
                         [(first_key, n) for n in range(5)])
        self.assertEqual([c[2] for c in calls[6:]], [first_key, first_key])
        # Lost: a new session under a fresh key, the history replayed two tokens at a time.
        del self.replica.calls[:]
        self.replica.append_codes = [grpc.StatusCode.NOT_FOUND]
        session.append(token)
        self.assertEqual(session.recoveries, 1)
        methods = [c[0] for c in self.replica.calls]
        self.assertEqual(methods, ["Append", "CreateSession", "Append", "Append", "Append",
                                   "Append"])
        second_key = self.replica.calls[1][2]
        self.assertNotEqual(second_key, first_key)
        self.assertEqual(client_module.routing_key_of(session.session_id), second_key)
        self.assertEqual([(c[2], c[3], c[4]) for c in self.replica.calls[2:]],
                         [(second_key, 0, 2), (second_key, 2, 2), (second_key, 4, 1),
                          (second_key, 5, 1)])
        self.assertEqual(session.replayed_tokens, 5)

    def test_a_diverged_copy_is_closed_and_replaced(self):
        session = self.client.session(replay=True)
        session.append(np.zeros((2, 8), np.float32))
        stale = session.session_id
        del self.replica.calls[:]
        self.replica.append_codes = [(grpc.StatusCode.FAILED_PRECONDITION,
                                      "expected_length: the session holds 3 tokens")]
        session.append(np.zeros((1, 8), np.float32))
        methods = [(c[0], c[1] == stale) for c in self.replica.calls]
        self.assertEqual(methods, [("Append", True), ("CloseSession", True),
                                   ("CreateSession", False), ("Append", False),
                                   ("Append", False)])
        self.assertEqual(session.recoveries, 1)
        # Other FAILED_PRECONDITIONs (max_session_tokens) are the caller's.
        self.replica.append_codes = [(grpc.StatusCode.FAILED_PRECONDITION,
                                      "tokens: 1 more would pass max_session_tokens")]
        with self.assertRaises(AttentionError) as ctx:
            session.append(np.zeros((1, 8), np.float32))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(session.recoveries, 1)


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class LiveRoutingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            cls.port = s.getsockname()[1]
        cls.server = subprocess.Popen([SERVER, "--host=127.0.0.1", f"--port={cls.port}",
                                       "--metrics_port=0", "--threads=1"],
                                      stderr=subprocess.DEVNULL)
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

    def sneak_append(self, session_id, tokens):
        """An append the session object does not know of (as a retry applied twice)."""
        request = client_module.sessions_pb2.AppendRequest(session_id=session_id)
        client_module._encode(tokens, request.tokens)
        self.client._session_call("Append", request)

    def test_ids_carry_a_key_and_a_create_retry_gets_the_same_session(self):
        with self.client.session() as session:
            self.assertRegex(session.session_id, r"^[0-9a-f]{32}\.[0-9a-f]{32}$")
        request = client_module.sessions_pb2.CreateSessionRequest(
            kind=client_module.sessions_pb2.SESSION_KIND_SELF)
        first = self.client._session_call("CreateSession", request, routing_key="retried-key")
        again = self.client._session_call("CreateSession", request, routing_key="retried-key")
        self.assertEqual(first.session_id, again.session_id)
        self.client.close_session(first.session_id)

    def test_a_diverged_session_fails_plainly_and_recovers_replaying(self):
        x = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
        want = self.client.infer(x, is_causal=True).output
        with self.client.session() as plain:
            plain.append(x[:3])
            self.sneak_append(plain.session_id, x[3:4])
            with self.assertRaises(AttentionError) as ctx:
                plain.append(x[3:5])
            self.assertEqual(ctx.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertTrue(ctx.exception.details.startswith(
                "expected_length: the session holds 4 tokens, the append expected 3"),
                ctx.exception.details)
        with self.client.session(replay=True) as session:
            got = [session.append(x[:3]).output]
            stale = session.session_id
            self.sneak_append(stale, x[3:4])
            got.append(session.append(x[3:5]).output)
            got.append(session.append(x[5:]).output)
            self.assertEqual(session.recoveries, 1)
            self.assertEqual(session.info().length, 8)
            with self.assertRaises(AttentionError) as ctx:  # The stale copy was closed.
                self.client.session_info(stale)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        np.testing.assert_allclose(np.concatenate(got), want, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
