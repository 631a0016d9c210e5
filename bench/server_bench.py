#!/usr/bin/env python3
"""Measures the server end to end with attention-client's load generator, in one run.

    /usr/bin/python3 bench/server_bench.py [--duration 5s] [--build build]

1. Overhead: one client of small requests (N=1, L=32, the E=256 demo model) against a server
   with default flags. Prints the load table and the server's own overhead from its /metrics:
   mean request duration (receipt to response) minus mean compute time per batch.
2. Batching: 64 concurrent clients of the same requests, against a server with batching on
   (default flags) and off (--max_batch_size=1); prints both tables and the throughput ratio.

Servers run on free loopback ports and are stopped with SIGTERM.
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(build, extra):
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen([os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1",
                             f"--port={port}", f"--metrics_port={metrics}"] + extra,
                            stderr=subprocess.PIPE, text=True)
    client = os.path.join(build, "bin", "attention-client")
    for _ in range(300):
        if subprocess.run([client, "health", f"--server=127.0.0.1:{port}", "--deadline_ms=200"],
                          capture_output=True).returncode == 0:
            return proc, port, metrics
        time.sleep(0.1)
    proc.kill()
    sys.exit("server did not become ready")


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = {}
    for name in ("attention_request_duration_seconds", "attention_compute_duration_seconds"):
        for kind in ("sum", "count"):
            m = re.search(rf'^{name}_{kind}{{model="demo"}} (\S+)$', text, re.M)
            values[f"{name}_{kind}"] = float(m.group(1)) if m else 0.0
    return values


def load(build, port, concurrency, duration):
    cmd = [os.path.join(build, "bin", "attention-client"), "load", f"--server=127.0.0.1:{port}",
           f"--concurrency={concurrency}", f"--duration={duration}", "--batch=1", "--seq_len=32"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(out.splitlines()[1].split()[2])
    return out, rps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "..", "build"))
    parser.add_argument("--duration", default="5s")
    args = parser.parse_args()

    proc, port, metrics = start_server(args.build, [])
    load(args.build, port, 1, "1s")  # Warm up.
    before = scrape(metrics)
    table, _ = load(args.build, port, 1, args.duration)
    after = scrape(metrics)
    d = {k: after[k] - before[k] for k in after}
    req_us = 1e6 * d["attention_request_duration_seconds_sum"] / d[
        "attention_request_duration_seconds_count"]
    comp_us = 1e6 * d["attention_compute_duration_seconds_sum"] / d[
        "attention_compute_duration_seconds_count"]
    print("## 1 client, N=1 L=32 E=256 (demo), batching on (default flags)\n")
    print(table)
    print(f"server request duration mean {req_us:.1f} us, compute mean {comp_us:.1f} us, "
          f"server overhead (request - compute) mean {req_us - comp_us:.1f} us\n")
    on_table, on_rps = load(args.build, port, 64, args.duration)
    stop_server(proc)

    proc, port, metrics = start_server(args.build, ["--max_batch_size=1"])
    load(args.build, port, 64, "1s")
    off_table, off_rps = load(args.build, port, 64, args.duration)
    stop_server(proc)
    print("## 64 concurrent clients, batching on (default flags)\n")
    print(on_table)
    print("## 64 concurrent clients, batching off (--max_batch_size=1)\n")
    print(off_table)
    print(f"throughput with batching on / off: {on_rps:.1f} / {off_rps:.1f} req/s = "
          f"{on_rps / off_rps:.2f}x")


if __name__ == "__main__":
    main()
