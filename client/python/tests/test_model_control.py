"""Model versions and model control from Python (issue 38, wall 2): infer(model_version=...)
and the version that served each result (InferResult, AppendResult, SessionInfo), models()
with every version's state, and the typed repository_index(), load_model(), unload_model()
(AttentionClient over attention.v1 and the Open Inference Protocol's RepositoryIndex;
InferenceClient with Triton's names; the asyncio client; python -m attention_client).

Against one server run with --model_control=explicit on a repository written with
attention_client.export: "enc" with versions 1 and 2 (version_policy "all", different
weights). Run by CTest as python_model_control_test (ATTENTION_SERVER_BINARY, ATTENTION_PY_GEN
and PYTHONPATH set there).
"""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))

try:  # Third-party modules: their absence is a skip with the reason.
    import grpc
    import numpy as np
    import torch
    MISSING = None
except ImportError as e:
    MISSING = str(e)
if not MISSING:  # The package's own names: missing ones fail the test.
    from attention_client import (AttentionClient, AttentionError, InferenceClient,
                                  RepositoryModel)
    from attention_client.aio import AsyncAttentionClient
    from attention_client.export import export_mha


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(MISSING, f"dependencies missing: {MISSING}")
class ModelControlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="attention-model-control-")
        cls.repository = os.path.join(cls.tmp.name, "models")
        for version in (1, 2):
            torch.manual_seed(version)
            export_mha(torch.nn.MultiheadAttention(16, 2, batch_first=True),
                       os.path.join(cls.repository, "enc", str(version)))
        with open(os.path.join(cls.repository, "enc", "config.json"), "w") as f:
            json.dump({"version_policy": "all"}, f)
        cls.target = f"127.0.0.1:{free_port()}"
        cls.server = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", f"--port={cls.target.split(':')[1]}",
             "--metrics_port=0", "--http_port=0", f"--model_repository={cls.repository}",
             "--model_control=explicit", "--threads=1"], stderr=subprocess.DEVNULL)
        cls.client = AttentionClient(cls.target, timeout=30)
        if not cls.client.wait_ready(60):
            cls.server.kill()
            raise RuntimeError("attention-server did not become ready")
        cls.query = np.random.default_rng(0).standard_normal((1, 3, 16), dtype=np.float32)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.send_signal(signal.SIGTERM)
        code = cls.server.wait(timeout=60)
        cls.tmp.cleanup()
        assert code == 0, f"attention-server exited with {code}"

    def index(self):
        return sorted((e.name, e.version, e.state) for e in self.client.repository_index())

    def test_infer_names_and_reports_the_version(self):
        newest = self.client.infer(self.query, model="enc")
        first = self.client.infer(self.query, model="enc", model_version=1)
        self.assertEqual((newest.model_version, first.model_version), (2, 1))
        self.assertEqual(self.client.infer(self.query, model="enc",
                                           model_version="1").model_version, 1)
        self.assertGreater(float(np.abs(newest.output - first.output).max()), 1e-3)
        with self.assertRaises(AttentionError) as ctx:
            self.client.infer(self.query, model="enc", model_version=7)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        streamed = list(self.client.infer_stream([{"query": self.query, "model": "enc",
                                                   "model_version": 1}]))
        self.assertEqual(streamed[0].model_version, 1)

    def test_models_show_versions_and_states(self):
        (enc,) = [m for m in self.client.models() if m["name"] == "enc"]
        self.assertEqual(enc["version"], 2)
        self.assertEqual([(v["version"], v["state"]) for v in enc["versions"]],
                         [(1, "READY"), (2, "READY")])

    def test_sessions_report_their_version(self):
        with self.client.session(model="enc") as s:
            self.assertEqual(s.created.model_version, 2)
            self.assertEqual(s.model_version, 2)
            self.assertEqual(s.append(self.query[0]).model_version, 2)
            self.assertEqual(s.info().model_version, 2)

    def test_repository_index_load_and_unload(self):
        entries = self.client.repository_index()
        self.assertTrue(all(isinstance(e, RepositoryModel) for e in entries))
        self.assertEqual(self.index(), [("enc", 1, "READY"), ("enc", 2, "READY")])
        self.client.unload_model("enc")
        try:
            (entry,) = self.client.repository_index()
            self.assertEqual((entry.name, entry.state), ("enc", "UNAVAILABLE"))
            self.assertTrue(entry.reason)
            self.assertEqual(self.client.repository_index(ready=True), [])
            with self.assertRaises(AttentionError) as ctx:
                self.client.infer(self.query, model="enc")
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        finally:
            self.assertEqual(self.client.load_model("enc"), [1, 2])
        self.assertEqual(self.client.infer(self.query, model="enc").model_version, 2)
        with self.assertRaises(AttentionError) as ctx:
            self.client.load_model("nope")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_inference_client_has_tritons_names(self):
        with InferenceClient(self.target) as oip:
            self.assertEqual(sorted((e.name, e.version, e.state)
                                    for e in oip.get_model_repository_index()),
                             [("enc", 1, "READY"), ("enc", 2, "READY")])
            oip.unload_model("enc")
            try:
                self.assertEqual(oip.get_model_repository_index(ready=True), [])
            finally:
                oip.load_model("enc")
            self.assertEqual(len(oip.repository_index(ready=True)), 2)

    def test_asyncio_client(self):
        async def run():
            async with AsyncAttentionClient(self.target) as client:
                index = await client.repository_index()
                versions = await client.load_model("enc")
                result = await client.infer(self.query, model="enc", model_version=1)
                return index, versions, result.model_version
        index, versions, served = asyncio.run(run())
        self.assertEqual(sorted((e.name, e.version) for e in index), [("enc", 1), ("enc", 2)])
        self.assertEqual((versions, served), ([1, 2], 1))

    def test_command_line(self):
        def cli(*args):
            return subprocess.run([sys.executable, "-m", "attention_client", *args, "--server",
                                   self.target], capture_output=True, text=True, timeout=60)
        models = cli("models")
        self.assertEqual(models.returncode, 0, models.stderr)
        self.assertRegex(models.stdout,
                         r"enc \*: embed_dim 16, .*, version 2 \(1 READY, 2 READY\)")
        repository = cli("repository")
        self.assertEqual(repository.returncode, 0, repository.stderr)
        self.assertRegex(repository.stdout, r"enc +1  READY")
        self.assertEqual(cli("load", "enc").stdout.strip(), "loaded enc: serving version(s) 1, 2")
        infer = cli("infer", "--model", "enc", "--model_version", "1", "--seq_len", "2")
        self.assertIn("model        enc version 1", infer.stdout, infer.stderr)


if __name__ == "__main__":
    unittest.main()
