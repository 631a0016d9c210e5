"""scripts/export_torch_mha.py on real checkpoints, and what it writes served by attention-server.

Checkpoints of a seeded torch.nn.TransformerEncoder (4 layers, E=32, 4 heads, non-zero biases,
batch_first=True) saved three ways (a state_dict, a {"model_state_dict": ...} training checkpoint,
the whole module with torch.save), of one built with PyTorch's default batch_first=False (saved
whole and as a state_dict), and of a module of a class defined here holding a cross-attention
layer with kdim 24 and vdim 16 (separate q/k/v projections), saved whole.

Checked:
* without --prefix, and with a prefix that matches nothing, the command fails (exit 1) listing
  every attention layer's prefix; missing tensors are named with the ones found; a file that is
  not a checkpoint and a whole module whose class cannot be imported fail with one line each;
  no output has a Python traceback;
* --repository/--model writes version folders 1, 2, 3 ... renamed into place (nothing hidden
  or temporary is left behind), and refuses a flat model folder;
* config.json records "batch_first": a saved module's own (false for the default encoder), or
  for a state_dict of tensors --batch_first true|false, which is then required (the error names
  it) and must agree with a saved module if given; export_mha() from Python records the module's;
* attention-server (--model_control=poll, --repository_poll_s=0.2) serves what was written, and
  a version exported while it runs is picked up: each version's REST output (JSON) is within
  1e-5 + 1e-5 |want| of the exported torch layer in float64 (need_weights off), and says which
  version computed it; a batch_first=False layer is sent and answers (L, N, E) with N 2, as the
  module takes and returns them.

Run by CTest as export_torch_mha_test (ATTENTION_SERVER_BINARY, ATTENTION_REPO set there), with
/usr/bin/python3 (Debian's python3-torch).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import torch

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))
SCRIPT = os.path.join(REPO, "scripts", "export_torch_mha.py")
E, HEADS, LAYERS = 32, 4, 4
# A class torch.save pickles by reference: loading it needs this file (--import).
CROSS_SOURCE = '''
import torch


class CrossBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.cross = torch.nn.MultiheadAttention(32, 4, kdim=24, vdim=16, batch_first=True)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export(*args):
    """Runs the script; returns (exit code, stdout + stderr)."""
    r = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


class ExportTorchMhaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="attention-export-")
        cls.dir = cls.tmp.name
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        layer = torch.nn.TransformerEncoderLayer(E, HEADS, batch_first=True)
        cls.encoder = torch.nn.TransformerEncoder(layer, LAYERS).eval()
        with torch.no_grad():
            for name, p in cls.encoder.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1, generator=g)
        torch.save(cls.encoder.state_dict(), cls.path("state_dict.pt"))
        torch.save({"epoch": 7, "model_state_dict": cls.encoder.state_dict()},
                   cls.path("checkpoint.pt"))
        torch.save(cls.encoder, cls.path("whole.pt"))
        broken = cls.encoder.state_dict()
        del broken["layers.1.self_attn.out_proj.weight"]
        torch.save(broken, cls.path("broken.pt"))
        # PyTorch's default layout: the layers' forward takes (L, N, E).
        seq_layer = torch.nn.TransformerEncoderLayer(E, HEADS)
        cls.seq_encoder = torch.nn.TransformerEncoder(seq_layer, 2).eval()
        with torch.no_grad():
            for name, p in cls.seq_encoder.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1, generator=g)
        torch.save(cls.seq_encoder, cls.path("seq_whole.pt"))
        torch.save(cls.seq_encoder.state_dict(), cls.path("seq_state_dict.pt"))
        with open(cls.path("not_a_checkpoint.pt"), "w") as f:
            f.write("weights, honestly\n")
        # The cross block: its class lives in a file of its own, imported as torch would.
        with open(cls.path("cross_block.py"), "w") as f:
            f.write(CROSS_SOURCE)
        code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); "
                "from cross_block import CrossBlock; torch.manual_seed(3); "
                "b = CrossBlock().eval(); torch.save(b, sys.argv[2]); "
                "torch.save(b.cross.state_dict(), sys.argv[3])")
        subprocess.run([sys.executable, "-c", code, cls.dir, cls.path("cross_whole.pt"),
                        cls.path("cross_layer.pt")], check=True, timeout=120)
        cls.cross = torch.nn.MultiheadAttention(E, HEADS, kdim=24, vdim=16, batch_first=True)
        cls.cross.load_state_dict(torch.load(cls.path("cross_layer.pt")))
        cls.cross.eval()
        cls.server = None

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None and cls.server.poll() is None:
            cls.server.send_signal(signal.SIGTERM)
            cls.server.wait(timeout=60)
        cls.tmp.cleanup()

    def assertFailsWith(self, args, *needles):
        code, out = export(*args)
        self.assertEqual(code, 1, out)
        self.assertNotIn("Traceback", out)
        for needle in needles:
            self.assertIn(needle, out)
        return out

    def test_lists_the_layers_without_a_prefix_or_with_one_matching_none(self):
        every = [f"--prefix 'layers.{i}.self_attn.'" for i in range(LAYERS)]
        for checkpoint in ("state_dict.pt", "checkpoint.pt", "whole.pt"):
            with self.subTest(checkpoint=checkpoint):
                out = self.path(f"out_{checkpoint}")
                self.assertFailsWith(["--state_dict", self.path(checkpoint), "--num_heads", "4",
                                      "--out", out], *every)
                self.assertFailsWith(["--state_dict", self.path(checkpoint), "--num_heads", "4",
                                      "--prefix", "encoder.layers.3.self_attn.", "--out", out],
                                     "encoder.layers.3.self_attn.", *every)
                self.assertFalse(os.path.exists(out))

    def test_errors_name_what_was_found_and_what_is_missing(self):
        self.assertFailsWith(["--state_dict", self.path("broken.pt"), "--num_heads", "4",
                              "--prefix", "layers.1.self_attn.", "--out", self.path("b")],
                             "missing layers.1.self_attn.out_proj.weight",
                             "found layers.1.self_attn.in_proj_bias [96]",
                             "layers.1.self_attn.in_proj_weight [96, 32]")
        self.assertFailsWith(["--state_dict", self.path("state_dict.pt"), "--prefix",
                              "layers.1.self_attn.", "--out", self.path("b")],
                             "--num_heads is required", "embed_dim 32")
        self.assertFailsWith(["--state_dict", self.path("state_dict.pt"), "--num_heads", "5",
                              "--batch_first", "true", "--prefix", "layers.1.self_attn.", "--out",
                              self.path("b")], "--num_heads 5 does not divide embed_dim 32")
        self.assertFailsWith(["--state_dict", self.path("not_a_checkpoint.pt"), "--num_heads",
                              "4", "--out", self.path("b")], "not a torch.save() file")
        self.assertFailsWith(["--state_dict", self.path("cross_whole.pt"), "--out",
                              self.path("b")], "--import")
        self.assertFailsWith(["--state_dict", self.path("nothing.pt"), "--num_heads", "4",
                              "--out", self.path("b")], "nothing.pt: no such file")
        flat = self.path("flat_repo")
        code, out = export("--embed_dim", "8", "--num_heads", "2", "--out",
                           os.path.join(flat, "m"))
        self.assertEqual(code, 0, out)
        self.assertIs(self.config(os.path.join(flat, "m"))["batch_first"], True)  # New: default.
        self.assertFailsWith(["--embed_dim", "8", "--num_heads", "2", "--repository", flat,
                              "--model", "m"], "flat model", "/1/")

    def config(self, out):
        with open(os.path.join(out, "config.json")) as f:
            return json.load(f)

    def test_records_batch_first_and_requires_it_for_a_state_dict(self):
        # A bare state_dict cannot tell: the flag is required and named.
        args = ["--state_dict", self.path("state_dict.pt"), "--num_heads", "4", "--prefix",
                "layers.0.self_attn."]
        out = self.path("bf_state_dict")
        self.assertFailsWith(args + ["--out", out], "--batch_first true|false is required",
                             "(L, N, E)")
        self.assertFalse(os.path.exists(out))
        for value, want in (("false", False), ("true", True)):
            code, text = export(*args, "--batch_first", value, "--out", out, "--force")
            self.assertEqual(code, 0, text)
            self.assertIs(self.config(out)["batch_first"], want)
        code, text = export(*args, "--batch_first", "yes", "--out", self.path("bf_yes"))
        self.assertEqual(code, 2, text)  # argparse's usage error.
        self.assertIn("argument --batch_first: expected true or false, got 'yes'", text)
        # A saved module carries it: read (PyTorch's default here), and a contradiction refused
        # (the batch-first whole.pt and a new layer: test_versions_written_..., test_errors_...).
        out = self.path("bf_seq_whole")
        code, text = export("--state_dict", self.path("seq_whole.pt"), "--prefix",
                            "layers.0.self_attn.", "--out", out)
        self.assertEqual(code, 0, text)
        self.assertIs(self.config(out)["batch_first"], False)
        self.assertFailsWith(["--state_dict", self.path("seq_whole.pt"), "--prefix",
                              "layers.0.self_attn.", "--batch_first", "true", "--out",
                              self.path("bf_contradiction")],
                             "--batch_first true, but the saved layer has batch_first=False")

    def test_export_mha_from_python_records_the_modules_layout(self):
        sys.path.insert(0, os.path.dirname(SCRIPT))
        from export_torch_mha import export_mha
        for batch_first in (False, True):
            out = self.path(f"py_{batch_first}")
            layer = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
            self.assertIs(export_mha(layer, out)["batch_first"], batch_first)
            self.assertIs(self.config(out)["batch_first"], batch_first)
        with self.assertRaisesRegex(ValueError, "batch_first"):
            export_mha(torch.nn.MultiheadAttention(8, 2), self.path("py_conflict"),
                       extra_config={"batch_first": True})

    def rest(self, path, body=None):
        request = urllib.request.Request(
            self.url + path, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.load(r) if body is not None else None
        except urllib.error.HTTPError as e:
            return e.code, None
        except OSError:
            return -1, None

    def check_served(self, model, version, layer, cross=False, batch_first=True):
        """REST output of `version` of `model` against `layer` in float64, both called with the
        tensors in the layer's layout: (N, L, E), or (L, N, E) with N = 2 when not batch_first."""
        g = torch.Generator().manual_seed(version)
        q = torch.randn(1, 5, E, generator=g) if batch_first else torch.randn(5, 2, E, generator=g)
        k = torch.randn(1, 7, 24, generator=g) if cross else q
        v = torch.randn(1, 7, 16, generator=g) if cross else q
        inputs = [{"name": "query", "datatype": "FP32", "shape": list(q.shape),
                   "data": q.reshape(-1).tolist()}]
        if cross:
            for name, t in (("key", k), ("value", v)):
                inputs.append({"name": name, "datatype": "FP32", "shape": list(t.shape),
                               "data": t.reshape(-1).tolist()})
        status, response = self.rest(f"/v2/models/{model}/versions/{version}/infer",
                                     {"inputs": inputs})
        self.assertEqual(status, 200, response)
        self.assertEqual(response["model_version"], str(version))
        oracle = torch.nn.MultiheadAttention(E, HEADS, kdim=layer.kdim, vdim=layer.vdim,
                                             batch_first=layer.batch_first).double().eval()
        oracle.load_state_dict({n: t.double() for n, t in layer.state_dict().items()})
        with torch.no_grad():
            want = oracle(q.double(), k.double(), v.double(), need_weights=False)[0]
        self.assertEqual(response["outputs"][0]["shape"], list(q.shape))
        got = response["outputs"][0]["data"]
        want = want.reshape(-1).tolist()
        self.assertEqual(len(got), len(want))
        worst = max(abs(a - b) - 1e-5 * abs(b) for a, b in zip(got, want))
        self.assertLessEqual(worst, 1e-5, f"{model} version {version}")

    def test_versions_written_into_a_repository_are_served(self):
        repo = self.path("models")
        layer = lambda i: self.encoder.layers[i].self_attn  # noqa: E731
        runs = [  # (args, model, version, torch layer)
            (["--state_dict", self.path("state_dict.pt"), "--num_heads", "4", "--batch_first",
              "true", "--prefix", "layers.3.self_attn."], "enc", 1, layer(3)),
            (["--state_dict", self.path("whole.pt"), "--prefix", "layers.1.self_attn"],
             "enc", 2, layer(1)),
            (["--state_dict", self.path("cross_whole.pt"), "--import",
              self.path("cross_block.py"), "--prefix", "cross."], "cross", 1, self.cross),
            (["--state_dict", self.path("cross_layer.pt"), "--num_heads", "4",
              "--batch_first", "true"], "cross", 2,
             self.cross),  # A bare layer's state_dict: no prefix needed.
            # batch_first=False, read from the saved module, and given for its state_dict.
            (["--state_dict", self.path("seq_whole.pt"), "--prefix", "layers.0.self_attn."],
             "seq", 1, self.seq_encoder.layers[0].self_attn),
            (["--state_dict", self.path("seq_state_dict.pt"), "--num_heads", "4",
              "--batch_first", "false", "--prefix", "layers.1.self_attn."], "seq", 2,
             self.seq_encoder.layers[1].self_attn),
        ]
        for args, model, version, _ in runs:
            code, out = export(*args, "--repository", repo, "--model", model)
            self.assertEqual(code, 0, out)
            self.assertIn(os.path.join(repo, model, str(version)), out)
        self.assertEqual(sorted(os.listdir(os.path.join(repo, "enc"))), ["1", "2"])
        self.assertEqual(sorted(os.listdir(os.path.join(repo, "cross"))), ["1", "2"])
        for model, version, batch_first in (("enc", 2, True), ("seq", 1, False)):  # Modules'.
            self.assertIs(self.config(os.path.join(repo, model, str(version)))["batch_first"],
                          batch_first)
        for model in ("enc", "cross", "seq"):  # Serve every version, to compare each.
            with open(os.path.join(repo, model, "config.json"), "w") as f:
                json.dump({"version_policy": "all"}, f)

        http = free_port()
        self.url = f"http://127.0.0.1:{http}"
        log = open(self.path("server.log"), "w+")
        type(self).server = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", f"--port={free_port()}", "--metrics_port=0",
             f"--http_port={http}", f"--model_repository={repo}", "--model_control=poll",
             "--repository_poll_s=0.2", "--threads=1"], stderr=log)
        deadline = time.monotonic() + 60
        while self.rest("/v2/health/ready")[0] != 200:
            self.assertIsNone(self.server.poll(), "the server exited")
            self.assertLess(time.monotonic(), deadline, "the server did not become ready")
            time.sleep(0.02)
        for _, model, version, torch_layer in runs:
            self.check_served(model, version, torch_layer, cross=model == "cross",
                              batch_first=model != "seq")

        # A version exported while the server polls: picked up once renamed into place.
        code, out = export("--state_dict", self.path("checkpoint.pt"), "--num_heads", "4",
                           "--batch_first", "true", "--prefix", "layers.0.self_attn.",
                           "--repository", repo, "--model", "enc")
        self.assertEqual(code, 0, out)
        deadline = time.monotonic() + 30
        while self.rest("/v2/models/enc/versions/3/ready")[0] != 200:
            self.assertLess(time.monotonic(), deadline, "version 3 was not loaded")
            time.sleep(0.05)
        self.check_served("enc", 3, layer(0))
        self.assertEqual(sorted(os.listdir(os.path.join(repo, "enc"))),
                         ["1", "2", "3", "config.json"])
        self.server.send_signal(signal.SIGTERM)
        self.assertEqual(self.server.wait(timeout=60), 0)
        log.seek(0)
        text = log.read()
        log.close()
        self.assertNotIn("not loaded", text)


if __name__ == "__main__":
    unittest.main()
