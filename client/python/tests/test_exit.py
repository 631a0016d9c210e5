"""A program that uses the client exits cleanly: RUNS runs of a script that uses every part
of it (sync and asyncio clients, plaintext and TLS with a bearer token, health, wait_ready,
streams, sessions with replay, the Open Inference Protocol's stream and sequence), closing
some clients and leaving others open as programs do, each end with exit code 0 (no signal:
python_package_test's interpreter once died with SIGSEGV after its last test, gRPC Core
freeing the token's call credentials, Python code, after the interpreter had finalized), and
with no grpcio helper thread left when the interpreter starts finalizing (the client's exit
hook closed what was left open, attention_client._lifetime). And a closed client (sync,
asyncio, InferenceClient) refuses later calls with ValueError.

Run by CTest in python_package_test (tests/installed_test.sh) against the installed package;
by hand: ATTENTION_PY_GEN=build/client/python/gen PYTHONPATH=client/python
ATTENTION_SERVER_BINARY=build/bin/attention-server /usr/bin/python3 -m unittest
client/python/tests/test_exit.py
"""
import os
import subprocess
import sys
import tempfile
import unittest
from concurrent import futures

from test_security import Servers

RUNS = 24  # Two at a time.

SCRIPT = r'''
import atexit
import os
import threading
import sys


def grpc_threads():  # Registered before attention_client's hook, so it runs after it.
    alive = []
    for t in threading.enumerate():
        target = getattr(t, "_target", None)
        module = (getattr(target, "__module__", None)
                  or type(getattr(target, "__self__", None)).__module__)
        if t.daemon and str(module).startswith("grpc"):
            alive.append(t.name)
    print("grpc threads at exit:", alive, flush=True)


atexit.register(grpc_threads)

import asyncio
import numpy as np
from attention_client import AttentionClient, InferenceClient
from attention_client.aio import AsyncAttentionClient

plain, tls, ca, token = sys.argv[1:5]
q = np.random.default_rng(0).standard_normal((1, 4, 256), dtype=np.float32)
KEPT = []  # Clients a program forgot to close.

with AttentionClient(plain, timeout=20, token=token) as client:
    assert client.wait_ready(20) and client.health()
    client.infer(q, is_causal=True)
    assert len(list(client.infer_stream([{"query": q}] * 3))) == 3
    with client.session() as s:
        s.append(q[0, :2])
        assert len(list(client.session_stream([{"session": s, "tokens": q[0, 2:]}]))) == 1
    with client.session(replay=True) as r:
        r.append(q[0])
secure = AttentionClient(tls, timeout=20, tls_ca_file=ca, token=token)
secure.infer(q)
assert len(list(secure.infer_stream([{"query": q}] * 2))) == 2
secure.session().append(q[0])
KEPT.append(secure)
oip = InferenceClient(plain, timeout=20, token=token)
oip.infer("demo", {"query": q})
assert len(list(oip.stream_infer([{"model": "demo", "inputs": {"query": q}}] * 2))) == 2
# Two runs at a time share the server and the token: each its own sequence id (one run's
# end=True closed the other's sequence when both used one id).
with oip.sequence("demo", sequence_id=f"exit-test-{os.getpid()}") as seq:
    seq.step(q[:, :2])
    seq.step(q[:, 2:], end=True)
KEPT.append(oip)


async def main():
    async with AsyncAttentionClient(plain, timeout=20, token=token) as a:
        assert await a.wait_ready(20)
        assert await a.health_status() == "SERVING"
        await a.infer(q)
        assert len([r async for r in a.infer_stream([{"query": q}] * 2)]) == 2
        async with await a.session() as s:
            await s.append(q[0])
    b = AsyncAttentionClient(tls, timeout=20, tls_ca_file=ca, token=token)
    await b.infer(q)
    KEPT.append(b)


asyncio.run(main())
print("done", flush=True)
'''


class ExitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = Servers()
        try:
            cls.servers.wait_ready()
        except BaseException:
            cls.servers.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        assert cls.servers.stop() == [0, 0, 0, 0], "attention-server must exit 0 on SIGTERM"

    def test_a_script_using_the_client_exits_cleanly_every_time(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "uses_the_client.py")
            with open(path, "w") as f:
                f.write(SCRIPT)
            args = [sys.executable, path, self.servers.plain, self.servers.tls,
                    self.servers.path("ca1.pem"), self.servers.tokens["alice"]]

            def run(_):
                return subprocess.run(args, capture_output=True, text=True, timeout=120,
                                      cwd=folder)

            with futures.ThreadPoolExecutor(2) as pool:
                results = list(pool.map(run, range(RUNS)))
        for i, result in enumerate(results):
            with self.subTest(run=i):
                self.assertEqual(result.returncode, 0,
                                 f"exit {result.returncode} (negative: killed by that signal, "
                                 f"-11 SIGSEGV); stderr: {result.stderr[-3000:]}")
                self.assertEqual(result.stdout.splitlines(),
                                 ["done", "grpc threads at exit: []"], result.stderr[-3000:])

    def test_a_closed_client_refuses_calls_and_lets_its_channels_go(self):
        import asyncio
        import numpy as np
        from attention_client import AttentionClient, InferenceClient
        from attention_client.aio import AsyncAttentionClient
        q = np.zeros((1, 2, 256), np.float32)
        token = self.servers.tokens["alice"]
        client = AttentionClient(self.servers.plain, timeout=20, token=token)
        client.infer(q)
        client.close()
        client.close()  # Twice is fine.
        for call in (lambda: client.infer(q), client.models, client.session,
                     lambda: client.session_info("x@127.0.0.1:1")):
            with self.assertRaisesRegex(ValueError, "AttentionClient.* is closed"):
                call()
        oip = InferenceClient(self.servers.plain, timeout=20, token=token)
        oip.close()
        with self.assertRaisesRegex(ValueError, "InferenceClient.* is closed"):
            oip.server_live()

        async def run():
            a = AsyncAttentionClient(self.servers.plain, timeout=20, token=token)
            await a.infer(q)
            await a.close()
            with self.assertRaisesRegex(ValueError, "AsyncAttentionClient.* is closed"):
                await a.infer(q)
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
