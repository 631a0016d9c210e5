"""The REST examples (client/python/examples/rest_infer.py with urllib, client/node/rest_example.js
with fetch: standard libraries only) against a live attention-server, checked against
torch.nn.MultiheadAttention in float64.

One server on a temporary repository holding "small" (E=32, 4 heads, add_bias_kv, non-zero
biases), exported from a seeded torch layer with scripts/export_torch_mha.py; REST on a free
--http_port. Readiness: GET /v2/health/ready answering 200 (polled every 20 ms, bounded).

Checked: JSON and binary-extension requests from Python each within 1e-5 + 1e-5 |want| of the
float64 oracle, and equal to each other; the Node example's JSON and --binary runs print the
same first values as the Python example for the same query (within 1e-6); an unknown model is
HTTP 404 with {"error": ...} naming it.

Run by CTest as rest_examples_test (ATTENTION_SERVER_BINARY, ATTENTION_REPO set there).
"""
import importlib.util
import json
import math
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest
import urllib.request

import torch

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rest_infer = load(os.path.join(REPO, "client", "python", "examples", "rest_infer.py"),
                  "rest_infer")
export_mha = load(os.path.join(REPO, "scripts", "export_torch_mha.py"),
                  "export_torch_mha").export_mha


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RestExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="attention-rest-")
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        layer = torch.nn.MultiheadAttention(32, 4, add_bias_kv=True, batch_first=True)
        with torch.no_grad():
            layer.in_proj_bias.normal_(0, 0.1, generator=g)
            layer.out_proj.bias.normal_(0, 0.1, generator=g)
        export_mha(layer.eval(), os.path.join(cls.dir.name, "models", "small"))
        cls.oracle = layer.double().eval()
        http = free_port()
        cls.url = f"http://127.0.0.1:{http}"
        cls.log = open(os.path.join(cls.dir.name, "server.log"), "w+")
        cls.server = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", f"--port={free_port()}", "--metrics_port=0",
             f"--http_port={http}", f"--model_repository={cls.dir.name}/models", "--threads=1"],
            stderr=cls.log)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{cls.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or cls.server.poll() is not None:
                cls.tearDownClass()
                raise RuntimeError("the server did not become ready")
            time.sleep(0.02)

    @classmethod
    def tearDownClass(cls):
        if cls.server.poll() is None:
            cls.server.send_signal(signal.SIGTERM)
        code = cls.server.wait(timeout=60)
        cls.log.seek(0)
        log = cls.log.read()
        cls.log.close()
        cls.dir.cleanup()
        assert code == 0, f"attention-server exited with {code}:\n{log}"

    def want(self, query):
        q = torch.tensor(query, dtype=torch.float64).reshape(1, 4, 32)
        with torch.no_grad():
            return self.oracle(q, q, q, need_weights=False)[0].reshape(-1).tolist()

    def test_python_json_and_binary_match_torch(self):
        query = [math.sin(i) for i in range(4 * 32)]
        want = self.want(query)
        outputs = []
        for binary in (False, True):
            status, response, output = rest_infer.infer(self.url, "small", query, [1, 4, 32],
                                                        binary=binary)
            self.assertEqual(status, 200, response)
            self.assertEqual(response["outputs"][0]["shape"], [1, 4, 32])
            self.assertEqual(len(output), len(want))
            for got, w in zip(output, want):
                self.assertLessEqual(abs(got - w), 1e-5 + 1e-5 * abs(w))
            outputs.append(output)
        # JSON's shortest float32 forms round-trip: as float32, the two are equal.
        as_f32 = list(struct.unpack(f"<{len(outputs[0])}f",
                                    struct.pack(f"<{len(outputs[0])}f", *outputs[0])))
        self.assertEqual(as_f32, outputs[1])

    def test_node_example_prints_the_same_values(self):
        query = [math.sin(i) for i in range(4 * 32)]
        _, _, want = rest_infer.infer(self.url, "small", query, [1, 4, 32])
        for flags in ([], ["--binary"]):
            out = subprocess.run(
                ["node", os.path.join(REPO, "client", "node", "rest_example.js"), "--url",
                 self.url, "--model", "small", *flags],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            printed = json.loads(out.stdout)
            self.assertEqual(printed["shape"], [1, 4, 32])
            for got, w in zip(printed["first"], want[:4]):
                self.assertAlmostEqual(got, w, delta=1e-6)

    def test_errors_are_a_status_and_a_message(self):
        status, response, output = rest_infer.infer(self.url, "nope", [0.0] * 32, [1, 1, 32])
        self.assertEqual(status, 404)
        self.assertIn("nope", response["error"])
        self.assertIsNone(output)


if __name__ == "__main__":
    unittest.main()
