"""Tests of the Python client against a live attention-server (the demo model).

Run by CTest as python_client_test (ATTENTION_SERVER_BINARY, ATTENTION_PY_GEN and PYTHONPATH
set there); by hand: PYTHONPATH=client/python /usr/bin/python3 -m unittest discover -s
client/python/tests
"""
import os
import signal
import socket
import subprocess
import sys
import time
import unittest

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))

try:
    import grpc  # noqa: F401
    import numpy as np
    from attention_client import AttentionClient, AttentionError
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
                                       "--metrics_port=0"], stderr=subprocess.DEVNULL)
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


if __name__ == "__main__":
    unittest.main()
