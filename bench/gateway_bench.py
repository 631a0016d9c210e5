#!/usr/bin/env python3
"""Sessions through a gateway against direct connections, in one run on this machine (issue 26).

    /usr/bin/python3 bench/gateway_bench.py [--build build] [--sessions 32] [--context 256]
                                            [--steps 100] [--recover_tokens 1024] [--json out.json]

1. Decode throughput: 3 attention-server replicas (demo model, E=256, --threads=1 each) and
   `attention-client load --sessions 32 --context C --steps S`, once through nginx running
   deploy/nginx/attention.conf (replicas without --advertise_address; the client routes by the
   x-attention-session header) and once direct (replicas with --advertise_address; the client
   sends each session's calls to its replica). Reported: tokens/s of each and their ratio.
2. Recovery: a Python ReplayingSession through nginx decodes --recover_tokens tokens one at a
   time (so its history is that many one-token chunks); its replica is SIGKILLed; the next
   append is timed: it fails, re-creates the session under a fresh key on another replica,
   replays the history (merged into appends of up to 256 tokens, and, for comparison, chunk by
   chunk as before) and appends. Reported: that append's latency against a plain decode step.
Client, gateway and replicas share the machine's cores (2 here): the numbers include that
contention.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replicas:
    def __init__(self, build, n, advertise):
        self.ports = [free_port() for _ in range(n)]
        self.procs = []
        for port in self.ports:
            args = [os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1",
                    f"--port={port}", "--metrics_port=0", "--threads=1"]
            if advertise:
                args.append(f"--advertise_address=127.0.0.1:{port}")
            self.procs.append(subprocess.Popen(args, stderr=subprocess.DEVNULL))
        client = os.path.join(build, "bin", "attention-client")
        for port in self.ports:
            deadline = time.monotonic() + 30
            while subprocess.run([client, "health", f"--server=127.0.0.1:{port}"],
                                 capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica on {port} did not become ready")
                time.sleep(0.05)

    def targets(self):
        return [f"127.0.0.1:{p}" for p in self.ports]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


class Nginx:
    """deploy/nginx/attention.conf with its replica lines and listen address replaced."""

    def __init__(self, backends):
        self.dir = tempfile.mkdtemp(prefix="gateway_bench_")
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        with open(os.path.join(REPO, "deploy", "nginx", "attention.conf")) as f:
            ref = f.read()
        servers = "".join(f"    server {b} max_fails=1 fail_timeout=10s;\n" for b in backends)
        ref = re.sub(r"(upstream attention_replicas \{.*?)((?:\s*server \S+:\d+[^;]*;\n)+)",
                     lambda m: m.group(1) + "\n" + servers, ref, count=1, flags=re.S)
        ref = ref.replace("listen 50051 http2;", f"listen 127.0.0.1:{self.port} http2;")
        d = self.dir
        conf = (f"pid {d}/nginx.pid;\nerror_log {d}/error.log;\nworker_processes 1;\n"
                "events { worker_connections 4096; }\nhttp {\n  access_log off;\n"
                f"  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n"
                f"  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n"
                f"  scgi_temp_path {d}/scgi;\n{ref}}}\n")
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(conf)
        self.proc = subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e",
                                      f"{d}/error.log", "-g", "daemon off;"])
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("nginx did not start: " + open(f"{d}/error.log").read())
            time.sleep(0.02)

    def target(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()


def decode_load(build, target, lb_policy, args):
    out = os.path.join(tempfile.mkdtemp(), "load.json")
    cmd = [os.path.join(build, "bin", "attention-client"), "load", f"--server={target}",
           f"--lb_policy={lb_policy}", f"--sessions={args.sessions}",
           f"--context={args.context}", f"--steps={args.steps}", "--deadline_ms=60000",
           f"--json={out}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + result.stdout + result.stderr)
    print("   ", result.stdout.strip().splitlines()[-1])
    with open(out) as f:
        return json.load(f)


def recovery(build, tokens, chunk):
    """Decodes `tokens` one at a time through nginx, kills the session's replica, times the
    next append; returns (recovery ms, median step ms, recoveries, replayed tokens)."""
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    os.environ.setdefault("ATTENTION_PY_GEN", os.path.join(build, "client", "python", "gen"))
    import numpy as np
    from attention_client import AttentionClient
    replicas = Replicas(build, 3, advertise=False)
    nginx = Nginx(replicas.targets())
    try:
        client = AttentionClient(nginx.target(), timeout=60, load_balancing="pick_first")
        session = client.session(replay=True)
        session.replay_chunk_tokens = chunk
        x = np.random.default_rng(1).standard_normal((tokens + 1, 256)).astype(np.float32)
        steps = []
        for i in range(tokens):
            start = time.perf_counter()
            session.append(x[i:i + 1])
            steps.append(time.perf_counter() - start)
        holder = None
        for i, target in enumerate(replicas.targets()):
            direct = AttentionClient(target, timeout=10, load_balancing="pick_first")
            try:
                direct.session_info(session.session_id)
                holder = i
            except Exception:  # noqa: BLE001 - not on this replica.
                pass
            direct.close()
        replicas.procs[holder].kill()
        replicas.procs[holder].wait()
        start = time.perf_counter()
        session.append(x[tokens:])
        recovered_ms = (time.perf_counter() - start) * 1e3
        client.close()
        return (recovered_ms, sorted(steps)[len(steps) // 2] * 1e3, session.recoveries,
                session.replayed_tokens)
    finally:
        nginx.stop()
        replicas.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--recover_tokens", type=int, default=1024)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    results = {}

    print(f"1. decode: {args.sessions} sessions x {args.steps} steps after {args.context} tokens, "
          "3 replicas (demo, E=256)")
    replicas = Replicas(args.build, 3, advertise=False)
    nginx = Nginx(replicas.targets())
    try:
        print("  through nginx (deploy/nginx/attention.conf):")
        results["nginx"] = decode_load(args.build, nginx.target(), "pick_first", args)
    finally:
        nginx.stop()
        replicas.stop()
    replicas = Replicas(args.build, 3, advertise=True)
    try:
        print("  direct (--advertise_address):")
        results["direct"] = decode_load(args.build, "ipv4:" + ",".join(replicas.targets()),
                                        "round_robin", args)
    finally:
        replicas.stop()
    ratio = results["nginx"]["tokens_per_s"] / results["direct"]["tokens_per_s"]
    results["ratio"] = ratio
    print(f"  nginx {results['nginx']['tokens_per_s']:.0f} tokens/s (p50 "
          f"{results['nginx']['p50_ms']:.2f} ms), direct {results['direct']['tokens_per_s']:.0f} "
          f"tokens/s (p50 {results['direct']['p50_ms']:.2f} ms): {ratio:.2f}x (goal >= 0.8x)")

    print(f"2. recovering a {args.recover_tokens}-token session (one-token appends) after its "
          "replica is SIGKILLed, through nginx:")
    for chunk in (256, 1):
        ms, step_ms, recoveries, replayed = recovery(args.build, args.recover_tokens, chunk)
        results[f"recovery_chunk_{chunk}"] = {"ms": ms, "step_p50_ms": step_ms,
                                              "recoveries": recoveries,
                                              "replayed_tokens": replayed}
        print(f"  replayed {replayed} tokens in appends of up to {chunk}: the append that "
              f"recovered took {ms:.1f} ms (a plain step: p50 {step_ms:.2f} ms; "
              f"recoveries {recoveries})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
