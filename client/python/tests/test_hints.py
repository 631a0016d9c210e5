"""The Python client's errors say what to do, as the CLI's and the Node.js client's do (issue
38): a port where nothing listens names the address and says to start attention-server there
or pass the right one; a call over its deadline names timeout= and its value; a missing or
refused token names token=, token_file= and ATTENTION_TOKEN; and gRPC core's raw log lines
("E1129 ... ssl_transport_security.cc:1501] Handshake failed ...") are off by default (the
AttentionError names the TLS cause with its hint) and back with GRPC_VERBOSITY=ERROR.

Against one plaintext attention-server (ATTENTION_SERVER_BINARY). Run by CTest as
python_hints_test (ATTENTION_PY_GEN and PYTHONPATH set there).
"""
import asyncio
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
    import grpc
    import numpy as np
    from attention_client import AttentionClient, AttentionError
    from attention_client.aio import AsyncAttentionClient
    from attention_client.errors import advise
    MISSING = None
except ImportError as e:  # Reported as a skip with the reason.
    MISSING = str(e)

# A client that uses TLS against the plaintext server: prints its error on stdout.
TLS_TO_PLAIN = """
import sys
import numpy as np
from attention_client import AttentionClient, AttentionError
try:
    AttentionClient(sys.argv[1], tls=True, timeout=10).infer(np.zeros((1, 2, 256), np.float32))
except AttentionError as e:
    print(e)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(MISSING, f"Python client dependencies missing: {MISSING}")
class HintsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        port = free_port()
        cls.target = f"127.0.0.1:{port}"
        cls.server = subprocess.Popen([SERVER, "--host=127.0.0.1", f"--port={port}",
                                       "--metrics_port=0", "--http_port=0"],
                                      stderr=subprocess.DEVNULL)
        with AttentionClient(cls.target, timeout=10) as client:
            if not client.wait_ready(timeout=30):
                cls.server.kill()
                raise RuntimeError("attention-server did not become ready")
        cls.query = np.zeros((1, 2, 256), np.float32)

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        assert cls.server.wait(timeout=60) == 0

    def error_of(self, function):
        with self.assertRaises(AttentionError) as ctx:
            function()
        return ctx.exception

    def test_nothing_listening_names_the_address(self):
        port = free_port()
        client = AttentionClient(f"127.0.0.1:{port}", timeout=5)
        error = self.error_of(lambda: client.infer(self.query))
        self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(f"nothing is listening at 127.0.0.1:{port}", error.hint or "", str(error))
        self.assertIn("start attention-server there", error.hint)
        self.assertIn(f"nothing is listening at 127.0.0.1:{port}", str(error))

        async def aio():
            async with AsyncAttentionClient(f"127.0.0.1:{port}", timeout=5) as client:
                await client.infer(self.query)
        error = self.error_of(lambda: asyncio.run(aio()))
        self.assertIn(f"nothing is listening at 127.0.0.1:{port}", error.hint or "", str(error))

    def test_deadline_names_the_timeout(self):
        client = AttentionClient(self.target, timeout=1e-6)
        error = self.error_of(lambda: client.infer(self.query))
        self.assertEqual(error.code, grpc.StatusCode.DEADLINE_EXCEEDED, str(error))
        self.assertIn("the call took longer than timeout=1e-06 s", error.hint or "", str(error))
        self.assertIn("timeout argument of AttentionClient()", error.hint)

    def test_token_hints_name_how_the_client_takes_one(self):
        code = grpc.StatusCode.UNAUTHENTICATED
        missing = advise(code, "authorization: missing", self.target, False, False, 1 << 20,
                         token=False)
        self.assertIn("pass token='<token>' or token_file='<file>'", missing)
        self.assertIn("ATTENTION_TOKEN", missing)
        refused = advise(code, "authorization: unknown token", self.target, False, False,
                         1 << 20, token=True)
        self.assertIn("refused this client's bearer token", refused)

    def test_grpc_log_is_quiet_unless_asked_for(self):
        env = dict(os.environ)
        env.pop("GRPC_VERBOSITY", None)
        run = subprocess.run([sys.executable, "-c", TLS_TO_PLAIN, self.target], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertIn("UNAVAILABLE", run.stdout, run.stdout + run.stderr)
        self.assertIn("the server speaks plaintext, not TLS", run.stdout)
        self.assertNotIn("Handshake failed", run.stderr)
        self.assertNotIn("ssl_transport_security", run.stderr)
        # The user's own setting wins: gRPC's lines come back.
        env["GRPC_VERBOSITY"] = "ERROR"
        run = subprocess.run([sys.executable, "-c", TLS_TO_PLAIN, self.target], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertIn("the server speaks plaintext, not TLS", run.stdout)
        self.assertIn("Handshake failed", run.stderr)


if __name__ == "__main__":
    unittest.main()
