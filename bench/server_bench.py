#!/usr/bin/env python3
"""Measures the server's cost per request against the naive baseline, in one run.

    /usr/bin/python3 bench/server_bench.py [--duration 6s] [--build build] [--chart out.png]

Every configuration serves N=1, L=32 requests on an E=256, H=8 layer (the demo model's shape)
to `attention-client load` at 1 and at 64 concurrent clients, client and server sharing this
machine's cores:

* attention-server with batching on (default flags) and off (--max_batch_size=1);
* the naive server (bench/naive_server.py: grpcio + torch.nn.MultiheadAttention, no batching).

For each it reports req/s, p50/p99 latency and the **server's CPU per request**: its process CPU
time over the run (attention-server: process_cpu_seconds_total from its /metrics; the naive one:
/proc/PID/stat) divided by the requests answered. For attention-server at one client it also
reports its overhead (mean request duration minus mean compute, from its histograms). Then the
regime where batching should pay: N=1, L=8 on an E=1024, H=16 layer (exported from torch with
scripts/export_torch_mha.py), batching on versus off at 64 clients. With --chart it draws
throughput against p99 latency (python3-matplotlib).
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
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """attention-server or the naive server on free loopback ports."""

    def __init__(self, build, kind, extra=()):
        self.kind, self.build = kind, build
        self.port, self.metrics = free_port(), free_port()
        if kind == "naive":
            env = dict(os.environ, ATTENTION_PY_GEN=os.path.join(build, "client", "python", "gen"))
            cmd = ["/usr/bin/python3", os.path.join(HERE, "naive_server.py"), f"--port={self.port}"]
            cmd += list(extra)
        else:
            env = os.environ
            cmd = [os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1",
                   f"--port={self.port}", f"--metrics_port={self.metrics}", "--http_port=0", *extra]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        client = os.path.join(build, "bin", "attention-client")
        for _ in range(600):
            if subprocess.run([client, "models", f"--server=127.0.0.1:{self.port}",
                               "--deadline_ms=300"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.proc.kill()
        sys.exit(f"{kind} server did not become ready")

    def cpu_seconds(self):
        if self.kind == "naive":
            return cpu_seconds_of(self.proc.pid)
        return self.scrape()["process_cpu_seconds_total"]

    def scrape(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics").read().decode()
        values = {}
        for name in ("attention_request_duration_seconds_sum",
                     "attention_request_duration_seconds_count",
                     "attention_compute_duration_seconds_sum",
                     "attention_compute_duration_seconds_count"):
            values[name] = sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
        m = re.search(r"^process_cpu_seconds_total (\S+)$", text, re.M)
        values["process_cpu_seconds_total"] = float(m.group(1))
        return values

    def stop(self):
        self.proc.send_signal(signal.SIGTERM if self.kind != "naive" else signal.SIGKILL)
        self.proc.wait(timeout=60)


def load(server, concurrency, duration, seq_len):
    """One load level; returns the load generator's JSON level plus server CPU per request."""
    client = os.path.join(server.build, "bin", "attention-client")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [client, "load", f"--server=127.0.0.1:{server.port}", f"--concurrency={concurrency}",
               f"--duration={duration}", "--batch=1", f"--seq_len={seq_len}", f"--json={out.name}"]
        cpu0 = server.cpu_seconds()
        subprocess.run(cmd, capture_output=True, text=True)
        cpu1 = server.cpu_seconds()
        level = json.load(open(out.name))[0]
    level["server_cpu_us_per_request"] = 1e6 * (cpu1 - cpu0) / max(1, level["requests"])
    return level


def row(name, level):
    errors = sum(level["errors"].values()) if isinstance(level["errors"], dict) else level["errors"]
    return (f"| {name} | {level['concurrency']} | {level['requests_per_s']:.0f} | "
            f"{level['p50_ms']:.2f} | {level['p99_ms']:.2f} | "
            f"{level['server_cpu_us_per_request']:.0f} | {errors} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--duration", default="6s")
    parser.add_argument("--chart", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")

    results = {}
    configs = [("attention-server, batching on", "ours", []),
               ("attention-server, batching off", "ours", ["--max_batch_size=1"]),
               ("naive (grpcio + torch)", "naive", [])]
    overhead = None
    for name, kind, extra in configs:
        server = Server(args.build, kind, extra)
        load(server, 8, "1s", 32)  # Warm-up.
        for concurrency in (1, 64):
            before = server.scrape() if kind == "ours" else None
            results[(name, concurrency)] = load(server, concurrency, args.duration, 32)
            if kind == "ours" and concurrency == 1 and not extra:
                after = server.scrape()
                d = {k: after[k] - before[k] for k in after}
                req = d["attention_request_duration_seconds_sum"] / d[
                    "attention_request_duration_seconds_count"]
                comp = d["attention_compute_duration_seconds_sum"] / d[
                    "attention_compute_duration_seconds_count"]
                overhead = (1e6 * req, 1e6 * comp)
        server.stop()

    print("\n| server | clients | req/s | p50 ms | p99 ms | server CPU µs/request | errors |")
    print("|---|---|---|---|---|---|---|")
    for (name, concurrency), level in results.items():
        print(row(name, level))
    ours, naive = results[("attention-server, batching on", 64)], results[("naive (grpcio + torch)", 64)]
    print(f"\n64 clients, batching on vs naive: {ours['requests_per_s'] / naive['requests_per_s']:.1f}x "
          f"the throughput, {naive['server_cpu_us_per_request'] / ours['server_cpu_us_per_request']:.1f}x "
          f"less server CPU per request")
    if overhead:
        print(f"1 client: mean request duration {overhead[0]:.1f} µs, mean compute {overhead[1]:.1f} µs, "
              f"server overhead {overhead[0] - overhead[1]:.1f} µs")

    # Where batching should pay: skinny GEMMs of a large layer.
    with tempfile.TemporaryDirectory() as models:
        subprocess.run(["/usr/bin/python3", os.path.join(REPO, "scripts", "export_torch_mha.py"),
                        "--embed_dim", "1024", "--num_heads", "16", "--out",
                        os.path.join(models, "large")], check=True, capture_output=True)
        large = {}
        for label, extra in (("on", []), ("off", ["--max_batch_size=1"])):
            server = Server(args.build, "ours", [f"--model_repository={models}", *extra])
            load(server, 8, "1s", 8)
            large[label] = load(server, 64, args.duration, 8)
            server.stop()
    print("\nE=1024, H=16, N=1, L=8, 64 clients:")
    print("| batching | req/s | p50 ms | p99 ms | server CPU µs/request |")
    print("|---|---|---|---|---|")
    for label, level in large.items():
        print(f"| {label} | {level['requests_per_s']:.0f} | {level['p50_ms']:.2f} | "
              f"{level['p99_ms']:.2f} | {level['server_cpu_us_per_request']:.0f} |")
    print(f"batching on / off: {large['on']['requests_per_s'] / large['off']['requests_per_s']:.2f}x")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"small": {f"{n} @{c}": v for (n, c), v in results.items()},
                       "large": large, "overhead_us": overhead}, f, indent=1)
    if args.chart:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, _, _ in configs:
            points = [results[(name, c)] for c in (1, 64)]
            ax.plot([p["requests_per_s"] for p in points], [p["p99_ms"] for p in points], "o-",
                    label=name)
            for p in points:
                ax.annotate(f"{p['concurrency']} client{'s' if p['concurrency'] > 1 else ''}",
                            (p["requests_per_s"], p["p99_ms"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=8)
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.set_title("N=1, L=32, E=256 H=8 on 2 cores (client and server share them)")
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.chart, dpi=110)
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
