"""The Python package as a user installs and uses it: imported from any folder, its version,
malformed targets refused, wait_ready() against a server that comes up late, streams
(infer_stream, session_stream), the asyncio client, the Open Inference Protocol client
(InferenceClient: infer, streams, sequences), `python -m attention_client`, and messages over
a size limit with hints that name max_message_bytes / --max_message_bytes.

Run by CTest as python_package_test (tests/installed_test.sh) against the package installed
with pip into a fresh virtual environment, from a folder outside the repository
(ATTENTION_EXPECT_INSTALLED=1: the package imported must be the installed one, with its own
stubs, and its version ATTENTION_VERSION). ATTENTION_SERVER_BINARY names the server. By hand
against the source tree: ATTENTION_PY_GEN=build/client/python/gen PYTHONPATH=client/python
ATTENTION_SERVER_BINARY=build/bin/attention-server /usr/bin/python3 -m unittest
client/python/tests/test_usage.py
"""
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent import futures

SERVER = os.environ.get("ATTENTION_SERVER_BINARY", "attention-server")
INSTALLED = os.environ.get("ATTENTION_EXPECT_INSTALLED") == "1"

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import attention_client  # noqa: E402
from attention_client import (AttentionClient, AttentionError, InferenceClient,  # noqa: E402
                              Session)
from attention_client.aio import AsyncAttentionClient  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*flags):
    port = free_port()
    process = subprocess.Popen([SERVER, "--host=127.0.0.1", f"--port={port}", "--metrics_port=0",
                                "--http_port=0", f"--advertise_address=127.0.0.1:{port}", *flags],
                               stderr=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"
    with AttentionClient(target, timeout=5) as client:
        if not client.wait_ready(60):
            process.kill()
            raise RuntimeError(f"attention-server {flags} did not become ready")
    return process, target


def stop_server(process):
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=60)


STATE = {}


def setUpModule():
    STATE["server"], STATE["target"] = start_server()
    # A second server whose message limit is 1 MiB.
    STATE["small"], STATE["small_target"] = start_server("--max_message_bytes=1048576")


def tearDownModule():
    codes = [stop_server(STATE[name]) for name in ("server", "small") if name in STATE]
    assert codes == [0] * len(codes), f"attention-server exit codes {codes}"


class PackageTest(unittest.TestCase):
    def test_imported_from_any_folder_with_its_version_and_types(self):
        with tempfile.TemporaryDirectory() as folder:
            result = subprocess.run(
                [sys.executable, "-c", "import attention_client, os; "
                 "print(attention_client.__version__); print(attention_client.__file__)"],
                cwd=folder, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        version, path = result.stdout.split()
        package = os.path.dirname(path)
        self.assertTrue(os.path.isfile(os.path.join(package, "py.typed")))
        if INSTALLED:
            self.assertEqual(version, os.environ["ATTENTION_VERSION"])
            self.assertIn("site-packages", package)
            # The wheel carries its stubs; nothing points at a build folder.
            self.assertTrue(os.path.isfile(os.path.join(
                package, "_proto", "attention", "v1", "attention_pb2.py")))
            self.assertNotIn("ATTENTION_PY_GEN", os.environ)
        from attention_client import stubs
        self.assertEqual(stubs.attention_pb2.InferRequest.DESCRIPTOR.full_name,
                         "attention.v1.InferRequest")

    def test_malformed_targets_are_refused(self):
        cases = {
            "http://localhost:50651": "a URL; a gRPC target is host:port: use 'localhost:50651'",
            "https://attention.example.com": "use 'attention.example.com:50051' and tls=True",
            "localhost": "no port (gRPC would use 443): give host:port, e.g. 'localhost:50051'",
            "dns:///attention": "no port",
            "::1": "an IPv6 address goes in brackets",
            "localhost:http": "port 'http': expected a number",
        }
        for target, message in cases.items():
            for make in (AttentionClient, InferenceClient, AsyncAttentionClient):
                with self.subTest(target=target, client=make.__name__):
                    with self.assertRaises(AttentionError) as ctx:
                        make(target)
                    self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                    self.assertIn(message, str(ctx.exception))
        for target in ("localhost:50051", "dns:///localhost:50051", "[::1]:50051",
                       "ipv4:127.0.0.1:1,127.0.0.1:2", "unix:/tmp/attention.sock"):
            attention_client.check_target(target)


class WaitReadyTest(unittest.TestCase):
    def test_a_server_that_comes_up_late_is_noticed(self):
        """wait_ready() polls over a fresh connection: a server that starts listening 3 s in
        is seen before a 6 s timeout. (Through one long-lived channel the reconnect backoff
        would try at about 0, 1, 2.6 and 5.2 s.) The delay is printed, not asserted."""
        port = free_port()
        started = {}
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers([_Serving()])

        def start_later():  # The port opens (add_insecure_port binds it) 3 s in.
            time.sleep(3.0)
            started["at"] = time.monotonic()
            server.add_insecure_port(f"127.0.0.1:{port}")
            server.start()

        thread = threading.Thread(target=start_later)
        client = AttentionClient(f"127.0.0.1:{port}", timeout=5)
        try:
            self.assertFalse(client.health())  # Nothing listens yet.
            thread.start()
            self.assertTrue(client.wait_ready(timeout=6.0))
            noticed = time.monotonic() - started["at"]
            print(f"\nwait_ready noticed the server {noticed * 1000:.0f} ms after its port opened",
                  file=sys.stderr)
        finally:
            thread.join()
            client.close()
            server.stop(None)

    def test_timeout_returns_false(self):
        with AttentionClient(f"127.0.0.1:{free_port()}") as client:
            self.assertFalse(client.wait_ready(timeout=0.3))


class _Serving(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method == "/grpc.health.v1.Health/Check":
            return grpc.unary_unary_rpc_method_handler(lambda request, context: b"\x08\x01")
        return None


class LiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = AttentionClient(STATE["target"], timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def setUp(self):
        self.rng = np.random.default_rng(3)

    def randn(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32)

    def test_infer_stream_answers_each_request(self):
        queries = [self.randn(1, 4 + i, 256) for i in range(5)]
        requests = [{"query": q, "request_id": f"r{i}", "is_causal": i % 2 == 1}
                    for i, q in enumerate(queries)]
        requests.insert(2, {"query": self.randn(1, 3, 100), "request_id": "bad"})
        requests.append({"query": queries[0]})  # No request_id: given its index, "6".
        results = {r.request_id: r for r in self.client.infer_stream(requests)}
        self.assertEqual(sorted(results), sorted([f"r{i}" for i in range(5)] + ["bad", "6"]))
        bad = results["bad"]
        self.assertIsNone(bad.output)
        self.assertEqual(bad.error.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("query: expected shape [*, *, 256], got [1, 3, 100]", bad.error.details)
        for i, q in enumerate(queries):
            want = self.client.infer(q, is_causal=i % 2 == 1).output
            self.assertIsNone(results[f"r{i}"].error)
            np.testing.assert_allclose(results[f"r{i}"].output, want, atol=1e-6)
        np.testing.assert_allclose(results["6"].output, results["r0"].output, atol=1e-6)

    def test_session_stream_matches_causal_infer(self):
        x, y = self.randn(6, 256), self.randn(4, 256)
        a, b = self.client.session(), self.client.session()
        try:
            appends = [{"session": a, "tokens": x[:3]}, {"session": b, "tokens": y[:1]},
                       {"session": a, "tokens": x[3:4]}, {"session": b.session_id,
                                                          "tokens": y[1:]},
                       {"session": a, "tokens": x[4:], "request_id": "last"},
                       {"session": a, "tokens": self.randn(1, 100)}]
            results = list(self.client.session_stream(appends))
            self.assertEqual(len(results), 6)
            by_session = {}
            for r in results:
                if r.error is None:
                    by_session.setdefault(r.session_id, []).append(r)
            failed = [r for r in results if r.error is not None]
            self.assertEqual(len(failed), 1)
            self.assertEqual(failed[0].error.code, grpc.StatusCode.INVALID_ARGUMENT)
            got_a = np.concatenate([r.output for r in by_session[a.session_id]])
            got_b = np.concatenate([r.output for r in by_session[b.session_id]])
            np.testing.assert_allclose(got_a, self.client.infer(x, is_causal=True).output,
                                       atol=1e-5)
            np.testing.assert_allclose(got_b, self.client.infer(y, is_causal=True).output,
                                       atol=1e-5)
            self.assertEqual(a.length, 6)  # Updated from the stream's results.
            self.assertEqual(b.info().length, 4)
            self.assertIn("last", [r.request_id for r in by_session[a.session_id]])
            with self.assertRaises(TypeError):
                list(self.client.session_stream([{"session": self.client.session(replay=True),
                                                  "tokens": x[:1]}]))
        finally:
            a.close()
            b.close()
        self.assertIsInstance(a, Session)

    def test_asyncio_client(self):
        q = self.randn(2, 5, 256)
        want = self.client.infer(q, is_causal=True).output

        async def run():
            async with AsyncAttentionClient(STATE["target"], timeout=30) as client:
                self.assertTrue(await client.wait_ready(5))
                self.assertEqual(await client.health_status(), "SERVING")
                self.assertEqual([m["name"] for m in await client.models()], ["demo"])
                result = await client.infer(q, is_causal=True)
                streamed = [r async for r in client.infer_stream(
                    [{"query": q, "is_causal": True}, {"query": q[:, :2], "request_id": "x"}])]
                async with await client.session() as session:
                    rows = [(await session.append(q[0, :3])).output,
                            (await session.append(q[0, 3:])).output]
                    info = await session.info()
                with self.assertRaises(AttentionError) as ctx:
                    await client.infer(self.randn(1, 2, 100))
                return result, streamed, rows, info, ctx.exception

        result, streamed, rows, info, error = asyncio.run(run())
        np.testing.assert_allclose(result.output, want, atol=1e-6)
        self.assertEqual(sorted(r.request_id for r in streamed), ["0", "x"])
        np.testing.assert_allclose(next(r for r in streamed if r.request_id == "0").output,
                                   want, atol=1e-6)
        np.testing.assert_allclose(np.concatenate(rows), want[0], atol=1e-5)
        self.assertEqual(info.length, 5)
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_inference_protocol_client(self):
        q = self.randn(2, 6, 256)
        mask = np.zeros((2, 6), bool)
        mask[1, 4:] = True
        want = self.client.infer(q, key_padding_mask=mask, is_causal=True, need_weights=True)
        with InferenceClient(STATE["target"], timeout=30) as oip:
            self.assertTrue(oip.server_live() and oip.server_ready() and oip.model_ready("demo"))
            self.assertEqual(oip.server_metadata()["name"], "attention-service")
            meta = oip.model_metadata("demo")
            self.assertEqual(meta["inputs"][0], {"name": "query", "datatype": "FP32",
                                                 "shape": [-1, -1, 256]})
            result = oip.infer("demo", {"query": q, "key_padding_mask": mask},
                               parameters={"is_causal": True},
                               outputs=["output", "attn_weights"], request_id="oip")
            self.assertEqual((result.model_name, result.model_version, result.id),
                             ("demo", "1", "oip"))
            np.testing.assert_allclose(result.outputs["output"], want.output, atol=1e-6)
            np.testing.assert_allclose(result.outputs["attn_weights"], want.attn_weights,
                                       atol=1e-6)
            self.assertGreaterEqual(result.parameters["batch_requests"], 1)
            bf16 = oip.infer("demo", {"query": attention_client.BF16(q)})
            np.testing.assert_allclose(bf16.outputs["output"],
                                       self.client.infer(q).output, atol=3e-2)
            streamed = {r.id: r for r in oip.stream_infer(
                [{"model": "demo", "inputs": {"query": q}, "request_id": "s"},
                 {"model": "nope", "inputs": {"query": q}, "request_id": "bad"}])}
            self.assertIn("nope", streamed["bad"].error)
            np.testing.assert_allclose(streamed["s"].outputs["output"],
                                       self.client.infer(q).output, atol=1e-6)
            # A sequence equals one stateless causal call over all its tokens.
            tokens = self.randn(1, 7, 256)
            whole = self.client.infer(tokens, is_causal=True).output
            with oip.sequence("demo", sequence_id="py-seq") as seq:
                rows = [seq.step(tokens[:, :4]).outputs["output"],
                        seq.step(tokens[:, 4:5]).outputs["output"],
                        seq.step(tokens[:, 5:], end=True).outputs["output"]]
                self.assertEqual(seq.length, 7)
                with self.assertRaises(AttentionError):
                    seq.step(tokens[:, :1])
            np.testing.assert_allclose(np.concatenate(rows, axis=1), whole, atol=1e-5)
            with self.assertRaises(AttentionError) as ctx:
                oip.infer("nope", {"query": q})
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def run_cli(self, *args):
        with tempfile.TemporaryDirectory() as folder:
            return subprocess.run([sys.executable, "-m", "attention_client", *args],
                                  cwd=folder, capture_output=True, text=True, timeout=60)

    def test_command_line(self):
        health = self.run_cli("health", "--server", STATE["target"])
        self.assertEqual((health.returncode, health.stdout.strip()), (0, "SERVING"),
                         health.stderr)
        models = self.run_cli("models", "--server", STATE["target"])
        self.assertIn("demo *: embed_dim 256, num_heads 8", models.stdout)
        infer = self.run_cli("infer", "--server", STATE["target"], "--batch", "2", "--seq_len",
                             "5", "--need_weights")
        self.assertEqual(infer.returncode, 0, infer.stderr)
        self.assertIn("output       [2, 5, 256] float32", infer.stdout)
        self.assertIn("attn_weights [2, 5, 5]", infer.stdout)
        url = self.run_cli("health", "--server", "http://localhost:50651")
        self.assertEqual(url.returncode, 2)
        self.assertIn("a URL; a gRPC target is host:port: use 'localhost:50651'", url.stderr)
        down = self.run_cli("health", "--server", f"127.0.0.1:{free_port()}", "--timeout", "1")
        self.assertEqual(down.returncode, 1)
        self.assertIn("health failed: UNAVAILABLE", down.stderr)
        version = self.run_cli("--version")
        self.assertIn(f"attention-client (Python) {attention_client.__version__}",
                      version.stdout)
        usage = self.run_cli("--help")
        self.assertIn("health", usage.stdout)
        self.assertIn("infer --help", usage.stdout)

    def test_messages_over_a_limit_name_max_message_bytes(self):
        # The server's limit (1 MiB here): a 2 MiB request is refused; the hint names the
        # server's flag and the size that would pass.
        with AttentionClient(STATE["small_target"], timeout=30) as client:
            with self.assertRaises(AttentionError) as ctx:
                client.infer(self.randn(1, 2048, 256))
        error = ctx.exception
        self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("over the server's limit of 1048576", error.hint)
        self.assertIn("--max_message_bytes=", str(error))
        # The client's own limit: the request never leaves; the hint names max_message_bytes.
        with AttentionClient(STATE["target"], timeout=30, max_message_bytes=1 << 20) as client:
            with self.assertRaises(AttentionError) as ctx:
                client.infer(self.randn(1, 2048, 256))
            self.assertEqual(client.infer(self.randn(1, 4, 256)).output.shape, (1, 4, 256))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("over this client's limit of 1048576: raise max_message_bytes",
                      ctx.exception.hint)


if __name__ == "__main__":
    unittest.main()
