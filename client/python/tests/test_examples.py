"""Every Python example runs exactly as its own text says, and the exporter ships with the
package (issue 38, wall 1).

Each example under client/python/examples names its commands in its docstring (indented lines
starting with /usr/bin/python3, python3 or ~/attention-venv/bin/). This test runs those lines
as written, from the repository's root, in a fresh temporary home: the venv line makes a fresh
virtual environment, the pip line installs the package into it (offline: Debian's grpcio,
numpy and PyTorch come through --system-site-packages), then the example's own line runs it.
The only substitutions are the places: ~/attention-venv is the temporary one, and the server
the text names (localhost:50051, http://localhost:8000) is a demo server this test starts on
free ports. No PYTHONPATH, no ATTENTION_PY_GEN. Then, in that environment: attention-export
writes a model repository's version folders (<repo>/<model>/<version>/config.json +
model.safetensors), attention_client.export imports from a folder outside the repository, and
the guide's page runs each example with the command the example itself gives.

Run by CTest as python_examples_test (ATTENTION_SERVER_BINARY and ATTENTION_REPO set there);
by hand: ATTENTION_SERVER_BINARY=build/bin/attention-server /usr/bin/python3 -m unittest
discover -s client/python/tests -p test_examples.py
"""
import ast
import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))
EXAMPLES = sorted(glob.glob(os.path.join(REPO, "client", "python", "examples", "*.py")))
COMMAND_STARTS = ("/usr/bin/python3 ", "python3 ", "~/attention-venv/bin/")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def documented_commands(path):
    """The command lines of a file's docstring: indented lines starting as COMMAND_STARTS,
    with backslash continuations joined."""
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    commands, pending = [], None
    for line in doc.splitlines():
        text = line.strip()
        if pending is not None:
            pending += " " + text.rstrip("\\").strip()
            if not text.endswith("\\"):
                commands.append(pending)
                pending = None
            continue
        if line.startswith("    ") and text.startswith(COMMAND_STARTS):
            if text.endswith("\\"):
                pending = text.rstrip("\\").strip()
            else:
                commands.append(text)
    return commands


class ExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="attention-examples-")
        cls.venv = os.path.join(cls.tmp.name, "attention-venv")
        cls.grpc_port, cls.http_port = free_port(), free_port()
        cls.server = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", f"--port={cls.grpc_port}", "--metrics_port=0",
             f"--http_port={cls.http_port}", "--threads=1"], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"http://127.0.0.1:{cls.http_port}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or cls.server.poll() is not None:
                cls.tearDownClass()
                raise RuntimeError("attention-server did not become ready")
            time.sleep(0.02)
        cls.done = set()  # Setup lines (venv, pip) already run: one fresh venv for all.
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "ATTENTION_PY_GEN", "VIRTUAL_ENV")}
        cls.env["ATTENTION_SERVER_BINARY"] = SERVER

    @classmethod
    def tearDownClass(cls):
        if cls.server.poll() is None:
            cls.server.send_signal(signal.SIGTERM)
        code = cls.server.wait(timeout=60)
        cls.tmp.cleanup()
        assert code == 0, f"attention-server exited with {code}"

    def run_line(self, line, cwd=REPO):
        """Runs one documented line with its places substituted; returns the process."""
        line = (line.replace("~/attention-venv", self.venv)
                .replace("http://localhost:8000", f"http://127.0.0.1:{self.http_port}")
                .replace("localhost:50051", f"127.0.0.1:{self.grpc_port}"))
        return subprocess.run(shlex.split(line), cwd=cwd, env=self.env, capture_output=True,
                              text=True, timeout=300)

    def run_example(self, name, setup_only=False):
        """Runs example `name` as its docstring says (setup_only: only the lines before it, the
        venv and the install); returns its output."""
        path = os.path.join(REPO, "client", "python", "examples", name)
        lines = documented_commands(path)
        own = [line for line in lines if f"client/python/examples/{name}" in line]
        self.assertTrue(own, f"{name}: its docstring names no command that runs it: {lines}")
        for line in lines:
            if line in own or line in self.done:
                continue
            result = self.run_line(line)
            self.assertEqual(result.returncode, 0, f"{name}: `{line}` failed:\n"
                             f"{result.stdout}{result.stderr}")
            self.done.add(line)
        if setup_only:
            return ""
        outputs = []
        for line in own:
            result = self.run_line(line)
            self.assertEqual(result.returncode, 0, f"{name}: `{line}` (as its docstring says) "
                             f"failed:\n{result.stdout}{result.stderr}")
            outputs.append(result.stdout)
        return "".join(outputs)

    def test_every_example_is_covered(self):
        names = {os.path.basename(p) for p in EXAMPLES}
        self.assertEqual(names, {"decode_loop.py", "rest_infer.py", "serve_torch_layer.py"},
                         "an example was added or removed: run it here as its text says")

    def test_decode_loop(self):
        out = self.run_example("decode_loop.py")
        self.assertIn("MATCH", out)
        self.assertNotIn("MISMATCH", out)

    def test_rest_infer(self):
        out = self.run_example("rest_infer.py")
        self.assertEqual(json.loads(out)["model_name"], "demo")

    def test_serve_torch_layer(self):
        out = self.run_example("serve_torch_layer.py")
        self.assertIn("OK: attention-server matches torch.nn.MultiheadAttention", out)

    def test_the_guide_runs_each_example_as_the_example_says(self):
        with open(os.path.join(REPO, "docs", "clients", "python.md"), encoding="utf-8") as f:
            guide = [line.strip() for line in f if "client/python/examples/" in line
                     and line.strip().startswith(COMMAND_STARTS)]
        self.assertTrue(guide, "docs/clients/python.md runs no example")
        for line in guide:
            name = line.split("client/python/examples/")[1].split()[0]
            own = documented_commands(os.path.join(REPO, "client", "python", "examples", name))
            self.assertTrue(any(o.startswith(line.rstrip("\\").strip()) for o in own),
                            f"docs/clients/python.md runs `{line}`; {name} says {own}")

    def test_exporter_ships_with_the_package(self):
        self.run_example("serve_torch_layer.py", setup_only=True)  # The venv, installed.
        repository = os.path.join(self.tmp.name, "models")
        export = os.path.join(self.venv, "bin", "attention-export")
        for version in (1, 2):
            result = subprocess.run([export, "--embed_dim", "16", "--num_heads", "2",
                                     "--repository", repository, "--model", "tiny"],
                                    cwd=self.tmp.name, env=self.env, capture_output=True,
                                    text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            folder = os.path.join(repository, "tiny", str(version))
            self.assertIn(f"wrote {folder}", result.stdout)
            self.assertEqual(sorted(os.listdir(folder)), ["config.json", "model.safetensors"])
        refused = subprocess.run([export, "--num_heads", "2", "--out", "x"], cwd=self.tmp.name,
                                 env=self.env, capture_output=True, text=True, timeout=120)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("attention-export: a new layer needs --embed_dim", refused.stderr)
        code = ("import torch; from attention_client.export import export_mha; "
                "print(export_mha(torch.nn.MultiheadAttention(8, 2), 'flat')['embed_dim'])")
        result = subprocess.run([os.path.join(self.venv, "bin", "python"), "-c", code],
                                cwd=self.tmp.name, env=self.env, capture_output=True, text=True,
                                timeout=120)
        self.assertEqual((result.returncode, result.stdout.strip()), (0, "8"), result.stderr)
        self.assertTrue(os.path.isfile(os.path.join(self.tmp.name, "flat", "model.safetensors")))


if __name__ == "__main__":
    unittest.main()
