#!/usr/bin/env python3
"""Checks the monitoring files against Debian's Prometheus and a live attention-server.

    /usr/bin/python3 tests/monitoring/check_monitoring.py [--build DIR] [--repo DIR]

1. promtool check config / check rules on docker/prometheus/.
2. Starts attention-server (free loopback ports) and Debian's prometheus scraping it every
   second with the alert rules loaded; sends load with attention-client, including failing
   requests; waits (bounded) for samples.
3. Evaluates every PromQL expression of the Grafana dashboard ($model -> demo) and of the alert
   rules through Prometheus's HTTP API: each must parse; each dashboard expression must return
   data. Cleans up every process and directory it made.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prom_port, expr):
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def main():
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--repo", default=os.path.join(here, "..", ".."))
    parser.add_argument("--build", default=os.path.join(here, "..", "..", "build"))
    args = parser.parse_args()
    prom_dir = os.path.join(args.repo, "docker", "prometheus")
    dashboard = os.path.join(args.repo, "docker", "grafana", "dashboards", "attention.json")
    failures = []

    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            print(f"FAIL: {tool} is not installed (scripts/install_deps.sh installs prometheus)")
            return 1
    for cmd in (["promtool", "check", "config", "prometheus.yml"],
                ["promtool", "check", "rules", "alerts.yml"]):
        r = subprocess.run(cmd, cwd=prom_dir, capture_output=True, text=True)
        print(" ".join(cmd), "->", "ok" if r.returncode == 0 else "FAILED")
        if r.returncode != 0:
            failures.append(r.stdout + r.stderr)

    work = tempfile.mkdtemp(prefix="attention-monitoring-")
    procs = []
    try:
        grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen(
            [os.path.join(args.build, "bin", "attention-server"), "--host=127.0.0.1",
             f"--port={grpc_port}", f"--metrics_port={metrics_port}"],
            stderr=subprocess.DEVNULL))
        client = os.path.join(args.build, "bin", "attention-client")
        target = f"--server=127.0.0.1:{grpc_port}"
        for _ in range(300):
            if subprocess.run([client, "health", target, "--deadline_ms=300"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [os.path.join(prom_dir, "alerts.yml")],
                  "scrape_configs": [{"job_name": "attention", "static_configs": [
                      {"targets": [f"127.0.0.1:{metrics_port}"]}]}]}
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={os.path.join(work, 'prometheus.yml')}",
             f"--storage.tsdb.path={os.path.join(work, 'data')}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        # Load in rounds until Prometheus has seen traffic over a rate() window.
        deadline = time.monotonic() + 60
        while True:
            subprocess.run([client, "load", target, "--concurrency=4", "--duration=1s",
                            "--seq_len=8:64", "--pad_share=0.25"], capture_output=True)
            subprocess.run([client, "infer", target, "--model=nope"], capture_output=True)
            r = query(prom_port, "sum(rate(attention_requests_total[1m]))")
            if (r.get("status") == "success" and r["data"]["result"]
                    and float(r["data"]["result"][0]["value"][1]) > 0):
                break
            if time.monotonic() > deadline:
                failures.append("Prometheus never saw the server's requests")
                break

        with open(dashboard) as f:
            dash = json.load(f)
        exprs = [("dashboard: " + p["title"], t["expr"]) for p in dash["panels"]
                 for t in p["targets"]]
        with open(os.path.join(prom_dir, "alerts.yml")) as f:
            rules = [("alert: " + r["alert"], r["expr"]) for g in yaml.safe_load(f)["groups"]
                     for r in g["rules"]]
        print(f"\n{'where':<52} {'series':>6}  expression")
        for where, expr in exprs + rules:
            e = expr.replace("$model", "demo").replace("$__rate_interval", "1m")
            r = query(prom_port, e)
            n = len(r["data"]["result"]) if r.get("status") == "success" else -1
            print(f"{where:<52} {n:>6}  {' '.join(e.split())[:80]}")
            if r.get("status") != "success":
                failures.append(f"{where}: {r.get('error')}")
            elif where.startswith("dashboard") and n == 0:
                failures.append(f"{where}: no data for {e}")
        # Alert expressions hold no data while healthy; their inner expressions must.
        for where, inner in [("alert inner: error ratio",
                              "sum by (model) (rate(attention_requests_total[5m]))"),
                             ("alert inner: p99", "histogram_quantile(0.99, sum by (le, model) "
                              "(rate(attention_request_duration_seconds_bucket[5m])))"),
                             ("alert inner: queue depth", "max by (model) (attention_queue_depth)"),
                             ("alert inner: up", 'up{job="attention"}')]:
            r = query(prom_port, inner)
            n = len(r["data"]["result"]) if r.get("status") == "success" else -1
            print(f"{where:<52} {n:>6}  {inner[:80]}")
            if n <= 0:
                failures.append(f"{where}: no data")
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    print("monitoring:", "ok" if not failures else f"{len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
