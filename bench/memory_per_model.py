#!/usr/bin/env python3
"""Resident memory a model costs the server, against its file (issue 36, "one copy of the weights").

    /usr/bin/python3 bench/memory_per_model.py [--build build] [--dim 2048] [--heads 16]
        [--repeats 2] [--work /tmp]

Writes an E=--dim, H=--heads float32 model (in_proj_weight, out_proj and biases: 64 MiB at
E=2048) and a tiny one (E=16), starts attention-server on each (--model_repository with that one
model, --threads=2), waits for /v2/health/ready, lets it settle 2 s and reads VmRSS from
/proc/<pid>/status. The model's cost is its server's VmRSS minus the tiny-model server's,
divided by model.safetensors' size; per compute dtype (config.json "compute_dtype": float32,
bfloat16, int8), with and without --warmup. Each figure is the median of --repeats servers.
The server's own figure (the load log's "weights resident N MiB") is printed beside it, and the
peak resident set (VmHWM: the load's transient copies).
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(path, dim, heads, dtype, seed):
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    bound = (6.0 / (4 * dim)) ** 0.5
    tensors = {
        "in_proj_weight": rng.uniform(-bound, bound, (3 * dim, dim)).astype(np.float32),
        "in_proj_bias": np.zeros(3 * dim, np.float32),
        "out_proj.weight": rng.uniform(-bound, bound, (dim, dim)).astype(np.float32),
        "out_proj.bias": np.zeros(dim, np.float32),
    }
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for t in tensors.values():
            f.write(t.tobytes())
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"num_heads": heads, "compute_dtype": dtype}, f)
    return os.path.getsize(os.path.join(path, "model.safetensors"))


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def vm(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key}")


def server_rss(build, repo, warmup, log_path):
    http = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1", "--port=0",
             "--metrics_port=0", f"--http_port={http}", f"--model_repository={repo}",
             "--threads=2", f"--warmup={'true' if warmup else 'false'}"],
            stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.time() + 300
            while not ready(f"http://127.0.0.1:{http}/v2/health/ready"):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"server did not get ready; see {log_path}")
                time.sleep(0.05)
            time.sleep(2.0)
            rss, peak = vm(proc.pid, "VmRSS"), vm(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    with open(log_path) as f:
        m = re.search(r"weights resident ([0-9.]+) MiB", f.read())
    return rss, (float(m.group(1)) * 2**20 if m else None), peak


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", default=tempfile.gettempdir())
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="memory_per_model_", dir=args.work)
    try:
        print(f"build {os.path.abspath(args.build)}; model E={args.dim} H={args.heads}")
        for warmup in (False, True):
            tiny = os.path.join(work, "tiny")
            write_model(os.path.join(tiny, "m"), 16, 2, "float32", 1)
            base = statistics.median(
                server_rss(args.build, tiny, warmup, os.path.join(work, f"tiny{i}.log"))[0]
                for i in range(args.repeats))
            print(f"warm-up {'on ' if warmup else 'off'}: tiny-model server {base / 2**20:.1f} MiB")
            for dtype in ("float32", "bfloat16", "int8"):
                repo = os.path.join(work, dtype)
                size = write_model(os.path.join(repo, "m"), args.dim, args.heads, dtype, 2)
                runs = [server_rss(args.build, repo, warmup, os.path.join(work, f"{dtype}{i}.log"))
                        for i in range(args.repeats)]
                rss = statistics.median(r[0] for r in runs)
                own = runs[0][1]
                peak = statistics.median(r[2] for r in runs)
                own_text = f", server's figure {own / size:.2f}x" if own else ""
                print(f"  {dtype:8s} file {size / 2**20:.1f} MiB, server {rss / 2**20:.1f} MiB, "
                      f"above tiny {(rss - base) / 2**20:.1f} MiB = {(rss - base) / size:.2f}x "
                      f"the file{own_text}; peak (VmHWM) {peak / 2**20:.1f} MiB", flush=True)
                shutil.rmtree(repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
