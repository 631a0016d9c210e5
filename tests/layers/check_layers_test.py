"""scripts/check_layers.py finds what it is there to find: made-up trees, each
with one breach of server/'s rules (a transport including the other, the
protocol room including a transport, a room including one above it, a gRPC
service including another, an include cycle, an oversized file), must each
fail naming the breach, and a tree without one must pass.

Run by CTest (check_layers_test, label layers)."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check_layers.py")

# A small tree that keeps every rule: server/<path> -> the server/ files it includes.
CLEAN = {
    "server_main.cc": ["attention_server.h"],
    "attention_server.h": ["frontends/grpc/inference_service.h", "frontends/rest/rest_frontend.h"],
    "frontends/grpc/inference_service.h": ["frontends/protocol/inference_protocol.h"],
    "frontends/grpc/session_service.h": ["sessions/session_path.h"],
    "frontends/rest/rest_frontend.h": ["frontends/protocol/inference_protocol.h"],
    "frontends/protocol/inference_protocol.h": ["sessions/session_path.h"],
    "sessions/session_path.h": ["requests/request_path.h"],
    "requests/request_path.h": ["batching/dynamic_batcher.h", "security/tokens.h"],
    "batching/dynamic_batcher.h": ["metrics/series.h"],
    "metrics/series.h": [],
    "security/tokens.h": [],
}


def write_tree(root, files, long_file=None):
    for path, includes in files.items():
        full = os.path.join(root, "server", path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            for inc in includes:
                f.write(f'#include "server/{inc}"\n')
    if long_file:
        with open(os.path.join(root, "server", long_file), "a") as f:
            f.write("// line\n" * 500)


def run(files, long_file=None):
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, files, long_file)
        result = subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True,
                                text=True, timeout=30)
        return result.returncode, result.stdout + result.stderr


def with_include(path, inc):
    files = {k: list(v) for k, v in CLEAN.items()}
    files.setdefault(path, []).append(inc)
    files.setdefault(inc, [])
    return files


class CheckLayersTest(unittest.TestCase):
    def assertBreach(self, files, expected, long_file=None):
        code, out = run(files, long_file)
        self.assertEqual(code, 1, out)
        self.assertIn(expected, out)

    def test_a_clean_tree_passes(self):
        code, out = run(CLEAN)
        self.assertEqual(code, 0, out)

    def test_rest_including_grpc_fails(self):
        self.assertBreach(with_include("frontends/rest/rest_frontend.h",
                                       "frontends/grpc/grpc_call.h"),
                          "server/frontends/rest/rest_frontend (frontends/rest) includes "
                          "server/frontends/grpc/grpc_call (frontends/grpc)")

    def test_grpc_including_rest_fails(self):
        self.assertBreach(with_include("frontends/grpc/inference_service.h",
                                       "frontends/rest/rest_json.h"),
                          "(frontends/grpc) includes server/frontends/rest/rest_json")

    def test_protocol_including_a_transport_fails(self):
        self.assertBreach(with_include("frontends/protocol/inference_protocol.h",
                                       "frontends/grpc/grpc_call.h"),
                          "(frontends/protocol) includes server/frontends/grpc/grpc_call")

    def test_a_room_including_one_above_it_fails(self):
        self.assertBreach(with_include("batching/dynamic_batcher.h", "sessions/session_path.h"),
                          "(batching) includes server/sessions/session_path")

    def test_a_grpc_service_including_another_fails(self):
        self.assertBreach(with_include("frontends/grpc/session_service.h",
                                       "frontends/grpc/inference_service.h"),
                          "front-end server/frontends/grpc/session_service includes front-end")

    def test_a_cycle_fails(self):
        self.assertBreach(with_include("metrics/series.h", "metrics/registry.h") |
                          {"metrics/registry.h": ["metrics/series.h"]}, "cycle:")

    def test_an_oversized_file_fails(self):
        self.assertBreach(CLEAN, "over 420", long_file="metrics/series.h")


if __name__ == "__main__":
    unittest.main()
