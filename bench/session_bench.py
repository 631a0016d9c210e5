#!/usr/bin/env python3
"""Measures sessions against their goals (BENCHMARKS.md, Sessions), in one run on this machine.

    /usr/bin/python3 bench/session_bench.py [--build build] [--json out.json]

1. Per-token cost: at context 1024 on the demo model (E=256, H=8), one decode step through a
   session (`attention-client load --sessions 1 --context 1024`) against sending the whole prefix
   to Infer with is_causal (`attention-client load --seq_len 1025 --is_causal`), p50 latency.
2. Batching: 64 sessions stepping concurrently at context 512 on an E=512, H=8 layer (exported
   from torch), tokens/s with batching on (--max_batch_size=64, so that one batch can hold every
   session's step) and off (--max_batch_size=1).
3. Cache bandwidth: attention-session-bench, 64 sessions x context 2048 (E=512): the attention
   phase of a batched step against this machine's single-thread copy bandwidth.
4. Memory accounting: 10,000 create / append (random length) / close cycles; the session memory
   gauge must return to zero and the server's RSS to within 5% of where it started (after 2,000
   warm-up cycles, so that every length has been seen once).
Client and server share the machine's cores.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, build, extra=()):
        self.port, self.metrics = free_port(), free_port()
        self.proc = subprocess.Popen(
            [os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1",
             f"--port={self.port}", f"--metrics_port={self.metrics}", "--http_port=0", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = os.path.join(build, "bin", "attention-client")
        for _ in range(600):
            if subprocess.run([self.client, "health", f"--server=127.0.0.1:{self.port}",
                               "--deadline_ms=300"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.proc.kill()
        sys.exit("server did not become ready")

    def target(self):
        return f"127.0.0.1:{self.port}"

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics").read().decode()
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

    def run(self, *args):
        out = subprocess.run([self.client, *args, f"--server={self.target()}"], capture_output=True,
                             text=True)
        if out.returncode != 0:
            sys.exit(f"attention-client {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
        return out.stdout

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def decode_load(server, sessions, context, steps):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        server.run("load", f"--sessions={sessions}", f"--context={context}", f"--steps={steps}",
                   f"--json={out.name}")
        return json.load(open(out.name))


def stateless(server, seq_len, requests):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        server.run("load", "--concurrency=1", f"--requests={requests}", f"--seq_len={seq_len}",
                   "--is_causal", f"--json={out.name}")
        return json.load(open(out.name))[0]


def memory_cycles(server, build, cycles):
    sys.path.insert(0, os.path.join(build, "client", "python", "gen"))
    import grpc
    import numpy as np
    from attention.v1 import attention_pb2, sessions_pb2, sessions_pb2_grpc
    stub = sessions_pb2_grpc.SessionServiceStub(grpc.insecure_channel(server.target()))
    rng = random.Random(1)
    tokens = np.random.default_rng(1).standard_normal((600, 256), dtype=np.float32)

    def cycle():
        info = stub.CreateSession(sessions_pb2.CreateSessionRequest(
            kind=sessions_pb2.SESSION_KIND_SELF))
        t = rng.randint(1, 600)
        stub.Append(sessions_pb2.AppendRequest(session_id=info.session_id, tokens=attention_pb2.Tensor(
            dtype=attention_pb2.DATA_TYPE_FLOAT32, shape=[t, 256], data=tokens[:t].tobytes())))
        stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=info.session_id))

    for _ in range(2000):  # Warm-up: every length seen, the allocator's steady state.
        cycle()
    rss0, used0 = server.rss_bytes(), server.metric("attention_session_memory_bytes")
    start = time.time()
    for _ in range(cycles):
        cycle()
    seconds = time.time() - start
    rss1, used1 = server.rss_bytes(), server.metric("attention_session_memory_bytes")
    return {"cycles": cycles, "seconds": seconds, "rss_before": rss0, "rss_after": rss1,
            "rss_change": (rss1 - rss0) / rss0, "session_memory_before": used0,
            "session_memory_after": used1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--json", default="")
    parser.add_argument("--cycles", type=int, default=10000)
    args = parser.parse_args()
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    results = {}

    # 1. Per-token cost at context 1024, demo model.
    server = Server(args.build)
    step = decode_load(server, 1, 1024, 200)
    whole = stateless(server, 1025, 100)
    results["per_token"] = {"session_step_p50_ms": step["p50_ms"],
                            "stateless_p50_ms": whole["p50_ms"],
                            "speedup": whole["p50_ms"] / step["p50_ms"]}
    print(f"\n1. context 1024, demo model: session step p50 {step['p50_ms']:.3f} ms; whole prefix "
          f"to Infer (is_causal) p50 {whole['p50_ms']:.3f} ms: {results['per_token']['speedup']:.1f}x")

    # 4. Memory accounting, same server.
    mem = memory_cycles(server, args.build, args.cycles)
    results["memory"] = mem
    print(f"\n4. {mem['cycles']} create/append/close cycles in {mem['seconds']:.1f} s: session "
          f"memory {mem['session_memory_before']:.0f} -> {mem['session_memory_after']:.0f} bytes; "
          f"RSS {mem['rss_before'] / 2**20:.1f} -> {mem['rss_after'] / 2**20:.1f} MiB "
          f"({100 * mem['rss_change']:+.1f}%)")
    server.stop()

    # 2. Batching pays: 64 sessions, context 512, E=512 H=8.
    with tempfile.TemporaryDirectory() as models:
        subprocess.run(["/usr/bin/python3", os.path.join(REPO, "scripts", "export_torch_mha.py"),
                        "--embed_dim", "512", "--num_heads", "8", "--out",
                        os.path.join(models, "e512")], check=True, capture_output=True)
        batching = {}
        for label, extra in (("on", ["--max_batch_size=64"]), ("off", ["--max_batch_size=1"])):
            server = Server(args.build, [f"--model_repository={models}", *extra])
            batching[label] = decode_load(server, 64, 512, 32)
            server.stop()
    results["batching"] = batching
    ratio = batching["on"]["tokens_per_s"] / batching["off"]["tokens_per_s"]
    print("\n2. 64 sessions, context 512, E=512 H=8:")
    print("| batching | tokens/s | step p50 ms | p99 ms | mean batch |")
    print("|---|---|---|---|---|")
    for label, r in batching.items():
        print(f"| {label} | {r['tokens_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['mean_batch']:.1f} |")
    print(f"batching on / off: {ratio:.2f}x")

    # 3. Cache bandwidth.
    out = subprocess.run([os.path.join(args.build, "bin", "attention-session-bench"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    bw = json.loads(out)
    results["bandwidth"] = bw
    print(f"\n3. 64 sessions x context 2048, E=512: attention phase {bw['attention_ms']:.1f} ms "
          f"reading {bw['cache_bytes_read'] / 1e6:.0f} MB = {bw['attention_read_gb_s']:.2f} GB/s; "
          f"single-thread copy {bw['copy_gb_s_single_thread']:.2f} GB/s: "
          f"{100 * bw['share_of_copy_bandwidth']:.0f}%")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
