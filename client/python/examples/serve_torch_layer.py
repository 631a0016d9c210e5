#!/usr/bin/env python3
"""Serve your own torch.nn.MultiheadAttention layer and check the server against PyTorch.

Run from the repository's root, with the project built (scripts/build.sh) and the Python
package installed into a virtual environment that sees Debian's grpcio, numpy and PyTorch
(python3-torch); the first two commands once (docs/clients/python.md#install):

    /usr/bin/python3 -m venv --system-site-packages ~/attention-venv
    ~/attention-venv/bin/pip install ./client/python
    ~/attention-venv/bin/python client/python/examples/serve_torch_layer.py

--server-binary PATH names the server (default: $ATTENTION_SERVER_BINARY, else
build/bin/attention-server of this checkout).
1. Builds a torch.nn.MultiheadAttention (E=64, 4 heads, bias, add_bias_kv) with seeded weights.
2. Exports it with attention_client.export.export_mha into a temporary model repository.
3. Starts attention-server on it (free loopback port) and waits until it is SERVING.
4. Sends inputs with a key_padding_mask (padded sequences) and a causal attn_mask, asking for
   the attention weights, and compares output and weights with PyTorch's own.
5. Stops the server with SIGTERM and checks it exits 0.
Exits non-zero on any mismatch.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import torch
    from attention_client import AttentionClient
    from attention_client.export import export_mha
except ImportError as e:  # Not the environment the docstring names: say which it is.
    sys.exit(f"serve_torch_layer: {e}.\nRun it as its docstring says, with the attention-client "
             f"package installed:\n" + __doc__[__doc__.index("    /usr/bin/python3"):
                                                __doc__.index("--server-binary")].rstrip())

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-binary", default=os.environ.get(
        "ATTENTION_SERVER_BINARY", os.path.join(REPO, "build", "bin", "attention-server")))
    args = parser.parse_args()

    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(64, 4, bias=True, add_bias_kv=True,
                                        batch_first=True).eval()
    with torch.no_grad():
        layer.in_proj_bias.normal_(0, 0.1)
        layer.out_proj.bias.normal_(0, 0.1)

    with tempfile.TemporaryDirectory() as repo:
        export_mha(layer, os.path.join(repo, "my_layer"))
        port = free_port()
        server = subprocess.Popen([args.server_binary, "--host=127.0.0.1", f"--port={port}",
                                   "--metrics_port=0", "--http_port=0", f"--model_repository={repo}"])
        try:
            client = AttentionClient(f"127.0.0.1:{port}", timeout=10)
            deadline = time.monotonic() + 30
            while not client.health():
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("attention-server did not become ready")
                time.sleep(0.05)
            print("models:", [m["name"] for m in client.models()])

            rng = np.random.default_rng(1)
            n, l = 2, 7
            query = rng.standard_normal((n, l, 64), dtype=np.float32)
            kpm = np.zeros((n, l), dtype=bool)
            kpm[1, 5:] = True  # The second sequence is padded.
            attn_mask = np.triu(np.ones((l, l), dtype=bool), k=1)  # True = not allowed.
            result = client.infer(query, key_padding_mask=kpm, attn_mask=attn_mask,
                                  need_weights=True, model="my_layer")

            q = torch.from_numpy(query)
            with torch.no_grad():
                expected, weights = layer(q, q, q, key_padding_mask=torch.from_numpy(kpm),
                                          attn_mask=torch.from_numpy(attn_mask),
                                          need_weights=True)
            out_err = float(np.abs(result.output - expected.numpy()).max())
            w_err = float(np.abs(result.attn_weights - weights.numpy()).max())
            print(f"output {result.output.shape}: max |server - torch| = {out_err:.3g}")
            print(f"attn_weights {result.attn_weights.shape}: max |server - torch| = {w_err:.3g}")
            print(f"server timing: queue {result.queue_us} us, compute {result.compute_us} us")
            if out_err > 1e-5 or w_err > 1e-5:
                sys.exit("MISMATCH between attention-server and PyTorch")
            client.close()
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
    if code != 0:
        sys.exit(f"attention-server exited with {code} after SIGTERM")
    print("OK: attention-server matches torch.nn.MultiheadAttention")


if __name__ == "__main__":
    main()
