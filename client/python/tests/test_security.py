"""Tests of the Python client's TLS, mutual TLS and bearer tokens against live attention-servers.

Certificates are made at test time with the openssl tool (two CAs; a server certificate for
localhost/127.0.0.1 signed by the first, a client certificate signed by each); the tokens file
holds SHA-256 hashes of random tokens. Four servers, started once and shared: TLS with tokens,
mutual TLS with tokens, plaintext with tokens (the token goes through an interceptor on every
channel, not as call credentials), and plaintext with tokens and --auth_probes (health checks
need a token too; ATTENTION_CLIENT_BINARY, when set, runs the C++ CLI against it).

Run by CTest as python_client_security_test (ATTENTION_SERVER_BINARY, ATTENTION_PY_GEN and
PYTHONPATH set there) and by python_package_test against the installed package; by hand:
ATTENTION_PY_GEN=build/client/python/gen PYTHONPATH=client/python /usr/bin/python3 -m unittest
-v discover -s client/python/tests -p test_security.py
"""
import argparse
import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
SERVER = os.environ.get("ATTENTION_SERVER_BINARY",
                        os.path.join(REPO, "build", "bin", "attention-server"))
DECODE_LOOP = os.path.join(REPO, "client", "python", "examples", "decode_loop.py")

try:
    import grpc
    import numpy as np
    import attention_client
    from attention_client import AttentionClient, AttentionError
    from attention_client import client as client_module
    MISSING = None
except ImportError as e:  # Reported as a skip with the reason.
    MISSING = str(e)
if not MISSING and not shutil.which("openssl"):
    MISSING = "the openssl tool"

# Callers in the tokens file: name -> models ('*': all). "other" may only use a model that is
# not served, so every call of its token on "demo" is PERMISSION_DENIED.
CALLERS = {"alice": "*", "carol": "*", "bob": "other"}

CERTIFICATES = """
set -e
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > server.ext
printf 'extendedKeyUsage=clientAuth\\n' > client.ext
for ca in ca1 ca2; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
    -keyout $ca.key -out $ca.pem -days 2 -subj /CN=attention-python-test-$ca
done
for cert in server-ca1 client-ca1 client-ca2; do
  who=${cert%-*} ca=${cert#*-}
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
    -keyout $cert.key -out $cert.csr -subj /CN=$who
  openssl x509 -req -in $cert.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial \\
    -out $cert.pem -days 2 -extfile $who.ext
done
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host, port):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class Servers:
    """The certificates, tokens and servers every test shares (made in setUpModule)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="attention-security-")
        result = subprocess.run(["sh", "-c", CERTIFICATES], cwd=self.dir, capture_output=True,
                                text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"openssl failed: {result.stderr}")
        self.tokens = {name: secrets.token_urlsafe(24) for name in CALLERS}
        with open(self.path("tokens"), "w") as f:
            for name, models in CALLERS.items():
                digest = hashlib.sha256(self.tokens[name].encode()).hexdigest()
                f.write(f"{digest} {name} {models}\n")
        for name, token in self.tokens.items():  # With whitespace around it, as editors leave.
            with open(self.path(f"{name}.token"), "w") as f:
                f.write(f"  {token}\n")
        tls = [f"--tls_cert_file={self.path('server-ca1.pem')}",
               f"--tls_key_file={self.path('server-ca1.key')}"]
        self.processes = []
        self.tls = self.start(tls)
        self.mtls = self.start(tls + [f"--tls_client_ca_file={self.path('ca1.pem')}"])
        self.plain = self.start([])
        self.probes = self.start(["--auth_probes"])  # Health checks need a token too.

    def path(self, name):
        return os.path.join(self.dir, name)

    def start(self, flags):
        # --advertise_address: session ids name the replica, so a session's calls go over the
        # client's replica channel, which must be secured like the others.
        target = f"127.0.0.1:{free_port()}"
        host, port = target.split(":")
        self.processes.append(subprocess.Popen(
            [SERVER, f"--host={host}", f"--port={port}", "--metrics_port=0", "--http_port=0",
             f"--advertise_address={target}", f"--auth_tokens_file={self.path('tokens')}"]
            + flags, stderr=subprocess.DEVNULL))
        return target

    def wait_ready(self):
        """Until every server's health check (open without a token) answers SERVING. A channel
        refused by a port not yet open backs off for a second or more before trying again, so
        the client is made once the port accepts connections."""
        checks = [(self.tls, {"tls_ca_file": self.path("ca1.pem")}),
                  (self.mtls, {"tls_ca_file": self.path("ca1.pem"),
                               "tls_cert_file": self.path("client-ca1.pem"),
                               "tls_key_file": self.path("client-ca1.key")}),
                  (self.plain, {}), (self.probes, {"token": self.tokens["alice"]})]
        deadline = time.monotonic() + 30

        def wait(ready, process, target):
            while not ready():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"attention-server {target} did not become ready")
                time.sleep(0.01)

        for (target, kwargs), process in zip(checks, self.processes):
            host, port = target.rsplit(":", 1)
            wait(lambda: port_open(host, int(port)), process, target)
            kwargs.setdefault("token", "")
            with AttentionClient(target, timeout=2, **kwargs) as client:
                wait(client.health, process, target)

    def stop(self):
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=60) for process in self.processes]
        shutil.rmtree(self.dir, ignore_errors=True)
        return codes


SERVERS = None


def setUpModule():
    global SERVERS
    if MISSING:
        return
    SERVERS = Servers()
    try:
        SERVERS.wait_ready()
    except BaseException:
        SERVERS.stop()
        raise


def tearDownModule():
    if SERVERS is not None:
        assert SERVERS.stop() == [0, 0, 0, 0], "attention-server must exit 0 on SIGTERM"


@unittest.skipIf(MISSING, f"Python client security test dependencies missing: {MISSING}")
class SecurityTest(unittest.TestCase):
    def setUp(self):
        self.query = np.random.default_rng(0).standard_normal((1, 4, 256), dtype=np.float32)
        # The tests choose the token; one in the environment must not leak in.
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop("ATTENTION_TOKEN", None)

    def client(self, target, **kwargs):
        client = AttentionClient(target, timeout=5, **kwargs)
        self.addCleanup(client.close)
        return client

    def tls_client(self, token="alice", ca="ca1", **kwargs):
        token = SERVERS.tokens[token] if token else token
        return self.client(SERVERS.tls, tls_ca_file=SERVERS.path(f"{ca}.pem"), token=token,
                           **kwargs)

    def mtls_kwargs(self, cert="client-ca1"):
        return {"tls_ca_file": SERVERS.path("ca1.pem"),
                "tls_cert_file": SERVERS.path(f"{cert}.pem"),
                "tls_key_file": SERVERS.path(f"{cert}.key")}

    def assertCode(self, code, call):
        with self.assertRaises(AttentionError) as ctx:
            call()
        self.assertEqual(ctx.exception.code, code, ctx.exception.details)
        return ctx.exception

    def assertWorks(self, client):
        """Every kind of call the client makes goes through: Infer, ListModels, health and
        a session (CreateSession, then Append, GetSession and CloseSession over the channel to
        the replica its id names)."""
        self.assertEqual(client.infer(self.query).output.shape, (1, 4, 256))
        self.assertEqual([m["name"] for m in client.models()], ["demo"])
        self.assertEqual(client.health_status(), "SERVING")
        with client.session() as session:
            self.assertRegex(session.session_id, "@127.0.0.1:[0-9]+$")
            self.assertEqual(session.append(self.query[0]).length, 4)
            self.assertEqual(session.info().length, 4)

    # TLS.

    def test_tls_with_the_right_ca(self):
        client = self.tls_client()
        self.assertTrue(client.tls)
        self.assertWorks(client)

    def test_tls_with_another_ca_fails(self):
        client = self.tls_client(ca="ca2")
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: client.infer(self.query))
        self.assertFalse(client.health())
        # Nor does plaintext reach a TLS port.
        plain = self.client(SERVERS.tls, token=SERVERS.tokens["alice"])
        self.assertFalse(plain.tls)
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: plain.infer(self.query))

    def test_tls_server_name(self):
        # The certificate names localhost and 127.0.0.1: the override is what gets checked.
        self.assertWorks(self.tls_client(tls_server_name="localhost"))
        wrong = self.tls_client(tls_server_name="attention.example.com")
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: wrong.infer(self.query))

    # Mutual TLS.

    def test_mtls_with_a_client_certificate(self):
        self.assertWorks(self.client(SERVERS.mtls, token=SERVERS.tokens["alice"],
                                     **self.mtls_kwargs()))

    def test_mtls_without_a_client_certificate_fails(self):
        client = self.client(SERVERS.mtls, token=SERVERS.tokens["alice"],
                             tls_ca_file=SERVERS.path("ca1.pem"))
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: client.infer(self.query))
        self.assertFalse(client.health())
        # A certificate from a CA the server does not trust fails the same way.
        foreign = self.client(SERVERS.mtls, token=SERVERS.tokens["alice"],
                              **self.mtls_kwargs("client-ca2"))
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: foreign.infer(self.query))

    # Bearer tokens, over TLS and plaintext (an interceptor either way).

    def test_right_token(self):
        self.assertWorks(self.tls_client(token="carol"))
        plain = self.client(SERVERS.plain, token=SERVERS.tokens["alice"])
        self.assertFalse(plain.tls)
        self.assertWorks(plain)

    def test_missing_or_unknown_token_is_unauthenticated(self):
        for client in (self.tls_client(token=None), self.client(SERVERS.plain),
                       self.client(SERVERS.plain, token="not-a-known-token")):
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, lambda: client.infer(self.query))
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, client.models)
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, client.session)
            self.assertTrue(client.health())  # Health checks stay open (no --auth_probes).

    def test_a_named_target_with_a_token_works_when_probes_need_one(self):
        # gRPC's client-side health checks cannot carry the token (they bypass interceptors):
        # against --auth_probes every Watch was refused, and a health-checked channel (a name,
        # round_robin) failed every call UNAVAILABLE "health check call failed".
        named = "localhost:" + SERVERS.probes.rsplit(":", 1)[1]
        for client in (self.client(named, token=SERVERS.tokens["alice"]),
                       self.client(SERVERS.probes, token=SERVERS.tokens["alice"])):
            self.assertEqual(client.infer(self.query).output.shape, (1, 4, 256))
            self.assertTrue(client.health())
        self.assertCode(grpc.StatusCode.UNAUTHENTICATED,
                        lambda: self.client(named, token="").health_status())
        client = os.environ.get("ATTENTION_CLIENT_BINARY")
        if client:  # The C++ CLI, the same way.
            result = subprocess.run(
                [client, "infer", f"--server={named}", "--seq_len=4", "--deadline_ms=10000",
                 f"--token_file={SERVERS.path('alice.token')}"],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_model_not_permitted_is_permission_denied(self):
        for client in (self.tls_client(token="bob"),
                       self.client(SERVERS.plain, token=SERVERS.tokens["bob"])):
            error = self.assertCode(grpc.StatusCode.PERMISSION_DENIED,
                                    lambda: client.infer(self.query))
            # An empty model name resolves among bob's own models; with none
            # served, the refusal names no model (a limited token learns none).
            self.assertIn("'bob' may use no served model", error.details)
            self.assertNotIn("demo", error.details)
            self.assertCode(grpc.StatusCode.PERMISSION_DENIED, client.session)
            self.assertEqual(client.models(), [])  # It sees no model it may not use.

    def test_session_calls_carry_the_token(self):
        # A session belongs to the caller that created it: another token is refused.
        alice = self.client(SERVERS.plain, token=SERVERS.tokens["alice"])
        carol = self.client(SERVERS.plain, token=SERVERS.tokens["carol"])
        with alice.session() as session:
            session.append(self.query[0])
            self.assertCode(grpc.StatusCode.PERMISSION_DENIED,
                            lambda: carol.session_info(session.session_id))
            self.assertEqual(session.info().length, 4)

    def test_token_from_file_and_environment(self):
        with_file = self.tls_client(token=None, token_file=SERVERS.path("alice.token"))
        self.assertEqual(with_file.infer(self.query).output.shape, (1, 4, 256))
        os.environ["ATTENTION_TOKEN"] = SERVERS.tokens["carol"] + "\n"
        for client in (self.tls_client(token=None), self.client(SERVERS.plain)):
            self.assertEqual(client.infer(self.query).output.shape, (1, 4, 256))
        # An explicit token wins over the environment; "" sends none.
        self.assertCode(grpc.StatusCode.PERMISSION_DENIED,
                        lambda: self.tls_client(token="bob").infer(self.query))
        self.assertCode(grpc.StatusCode.UNAUTHENTICATED,
                        lambda: self.tls_client(token="").infer(self.query))

    # Errors that say what to do (attention_client.errors.advise).

    def test_tls_mistakes_come_with_hints(self):
        UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
        alice = SERVERS.tokens["alice"]
        plain_to_tls = self.client(SERVERS.tls, token=alice)
        error = self.assertCode(UNAVAILABLE, lambda: plain_to_tls.infer(self.query))
        self.assertIn("the server speaks TLS: pass tls=True", error.hint or "", str(error))
        self.assertIn("the server speaks TLS", str(error))
        tls_to_plain = self.client(SERVERS.plain, token=alice,
                                   tls_ca_file=SERVERS.path("ca1.pem"))
        error = self.assertCode(UNAVAILABLE, lambda: tls_to_plain.infer(self.query))
        self.assertIn("the server speaks plaintext, not TLS", error.hint or "", str(error))
        no_certificate = self.client(SERVERS.mtls, token=alice,
                                     tls_ca_file=SERVERS.path("ca1.pem"))
        error = self.assertCode(UNAVAILABLE, lambda: no_certificate.infer(self.query))
        self.assertIn("client certificate", error.hint or "", str(error))
        self.assertIn("tls_cert_file", error.hint or "", str(error))
        foreign = self.client(SERVERS.mtls, token=alice, **self.mtls_kwargs("client-ca2"))
        error = self.assertCode(UNAVAILABLE, lambda: foreign.infer(self.query))
        self.assertIn("client certificate", error.hint or "", str(error))
        untrusted = self.tls_client(ca="ca2")
        error = self.assertCode(UNAVAILABLE, lambda: untrusted.infer(self.query))
        self.assertIn("trust the server's certificate", error.hint or "", str(error))
        # The exception's own text names the TLS cause (gRPC core's raw log is off).
        self.assertRegex(str(error), "(?i)certificate.verify.failed")
        # A call refused for its token: the hint says how the client takes one.
        error = self.assertCode(grpc.StatusCode.UNAUTHENTICATED,
                                lambda: self.tls_client(token="").infer(self.query))
        self.assertIn("pass token='<token>' or token_file='<file>'", error.hint or "", str(error))

    # Arguments.

    def test_invalid_arguments(self):
        cert, key = SERVERS.path("client-ca1.pem"), SERVERS.path("client-ca1.key")
        with self.assertRaisesRegex(ValueError, "^tls_key_file: required with tls_cert_file"):
            AttentionClient(SERVERS.mtls, tls_cert_file=cert)
        with self.assertRaisesRegex(ValueError, "^tls_cert_file: required with tls_key_file"):
            AttentionClient(SERVERS.mtls, tls_key_file=key)
        with self.assertRaisesRegex(ValueError, "^token and token_file"):
            AttentionClient(SERVERS.plain, token="x", token_file=SERVERS.path("alice.token"))
        with self.assertRaisesRegex(FileNotFoundError, "tls_ca_file: cannot read"):
            AttentionClient(SERVERS.tls, tls_ca_file=SERVERS.path("missing.pem"))
        with self.assertRaisesRegex(FileNotFoundError, "token_file: cannot read"):
            AttentionClient(SERVERS.plain, token_file=SERVERS.path("missing.token"))
        with open(SERVERS.path("empty.token"), "w") as f:
            f.write("\n")
        with self.assertRaisesRegex(ValueError, "^token_file: .* is empty"):
            AttentionClient(SERVERS.plain, token_file=SERVERS.path("empty.token"))
        with self.assertRaisesRegex(ValueError, "^token: a bearer token is printable ASCII"):
            AttentionClient(SERVERS.plain, token="two words")
        os.environ["ATTENTION_TOKEN"] = "caf\u00e9"
        with self.assertRaisesRegex(ValueError, "^ATTENTION_TOKEN: a bearer token"):
            AttentionClient(SERVERS.plain)
        del os.environ["ATTENTION_TOKEN"]
        # Any tls_* argument turns TLS on.
        self.assertTrue(self.client(SERVERS.tls, tls_server_name="localhost").tls)
        self.assertTrue(self.client(SERVERS.tls, tls=True).tls)
        self.assertEqual(client_module.resolve_token(token=""), None)

    # The example's flags.

    def test_decode_loop_flags(self):
        # Mutual TLS with every flag, the token from --token_file: sessions, ListModels, Infer.
        flags = ["--server", SERVERS.mtls, "--tls_ca_file", SERVERS.path("ca1.pem"),
                 "--tls_cert_file", SERVERS.path("client-ca1.pem"),
                 "--tls_key_file", SERVERS.path("client-ca1.key"), "--tls_server_name", "localhost"]
        result = subprocess.run([sys.executable, DECODE_LOOP, "--prompt", "5", "--steps", "2",
                                 "--check", "--token_file", SERVERS.path("alice.token")] + flags,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("final length 7, recoveries 0", result.stdout)
        self.assertIn(": MATCH", result.stdout)
        # Without a token (none in the environment either): refused, and reported as such.
        result = subprocess.run([sys.executable, DECODE_LOOP] + flags, capture_output=True,
                                text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("UNAUTHENTICATED", result.stderr)
        # The flags as the example parses them (add_security_flags, security_kwargs).
        parser = argparse.ArgumentParser()
        attention_client.add_security_flags(parser)
        kwargs = attention_client.security_kwargs(parser.parse_args(flags[2:]))
        self.assertEqual(kwargs, {"tls": False, "tls_ca_file": SERVERS.path("ca1.pem"),
                                  "tls_cert_file": SERVERS.path("client-ca1.pem"),
                                  "tls_key_file": SERVERS.path("client-ca1.key"),
                                  "tls_server_name": "localhost", "token_file": None})
        os.environ["ATTENTION_TOKEN"] = SERVERS.tokens["carol"]
        self.assertEqual(self.client(SERVERS.mtls, **kwargs).infer(self.query).output.shape,
                         (1, 4, 256))
        kwargs = attention_client.security_kwargs(parser.parse_args(flags[2:4] + flags[6:]))
        with self.assertRaisesRegex(ValueError, "^tls_cert_file: required with tls_key_file"):
            AttentionClient(SERVERS.mtls, **kwargs)

if __name__ == "__main__":
    unittest.main()
