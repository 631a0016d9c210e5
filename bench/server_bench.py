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

    /usr/bin/python3 bench/server_bench.py --pinned [--duration 10s] [--repeat 3] [--protocols attention,kserve]

--pinned measures instead the server's own overhead per request, with the server and the load
generator on different cores (taskset: server on --server_core with --threads=1, client on
--client_core, 64 clients), on the demo model (1x32, E=256, H=8) and on 1x8 with E=1024, H=16.
For each: server CPU per request (utime + stime of every server thread from /proc/PID/stat over
the timed window, divided by the requests answered), the mean batch the server formed (its
attention_batch_size histogram), thread wake-ups (context switches of all its threads, from
/proc/PID/task/*/status) per request; then, in the same run, attention-core-bench on the server's
core with --threads=1 for that batch size (the two whole sizes around the mean, interpolated):
compute per request = the batch's CPU time per call / batch size (CPU time rather than the
median wall time, which grows whenever another process shares the core; the median is printed
beside it). Overhead per request = server CPU
per request - compute per request. --server_build takes a second build to alternate with the
first (A, B, A, B ...) so that two builds are compared in one run.
"""
import argparse
import itertools
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

    def __init__(self, build, kind, extra=(), prefix=(), client_prefix=()):
        self.kind, self.build, self.client_prefix = kind, build, list(client_prefix)
        self.port, self.metrics = free_port(), free_port()
        if kind == "naive":
            env = dict(os.environ, ATTENTION_PY_GEN=os.path.join(build, "client", "python", "gen"))
            cmd = ["/usr/bin/python3", os.path.join(HERE, "naive_server.py"), f"--port={self.port}"]
            cmd += list(extra)
        else:
            env = os.environ
            cmd = [*prefix, os.path.join(build, "bin", "attention-server"), "--host=127.0.0.1",
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
        for name in ("attention_batch_size_sum", "attention_batch_size_count"):
            values[name] = sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
        return values

    def stop(self):
        self.proc.send_signal(signal.SIGTERM if self.kind != "naive" else signal.SIGKILL)
        self.proc.wait(timeout=60)


def load(server, concurrency, duration, seq_len):
    """One load level; returns the load generator's JSON level plus server CPU per request."""
    client = os.path.join(server.build, "bin", "attention-client")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [*server.client_prefix, client, "load", f"--server=127.0.0.1:{server.port}", f"--concurrency={concurrency}",
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


def thread_switches(pid):
    """Voluntary and involuntary context switches summed over the process's threads."""
    counts = [0, 0]
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = open(f"/proc/{pid}/task/{tid}/status").read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # A thread that ended between the listing and the read.
        for i, key in enumerate(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            counts[i] += int(re.search(rf"^{key}:\s+(\d+)$", text, re.M).group(1))
    return counts


def thread_cpu(pid):
    """CPU seconds of the process's threads, summed by thread name."""
    by_name = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = open(f"/proc/{pid}/task/{tid}/stat").read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        by_name[name] = by_name.get(name, 0) + (int(fields[11]) + int(fields[12])) / os.sysconf(
            "SC_CLK_TCK")
    return by_name


def core_bench(build, core, batch, seq_len, shape_flags, iterations):
    """attention-core-bench on `core` with one thread: (median ms, CPU ms per call).

    The CPU time per call is the difference of two runs' CPU times (iterations and 2 x
    iterations) over the extra calls, so that start-up, model set-up and warm-up cancel: unlike
    the median wall time, it does not grow when other processes share the core."""
    bench = os.path.join(build, "bin", "attention-core-bench")
    cmd = ["taskset", "-c", str(core), bench, "--threads=1", f"--batch={batch}",
           f"--seq_len={seq_len}", "--warmup=20", "--json", *shape_flags]
    runs = []
    for n in (iterations, 2 * iterations):
        before = os.times()
        out = subprocess.run([*cmd, f"--iterations={n}"], capture_output=True, text=True,
                             check=True).stdout
        after = os.times()
        cpu = (after.children_user + after.children_system - before.children_user -
               before.children_system)
        line = [x for x in out.splitlines() if x.startswith("{")][-1]
        runs.append((json.loads(line)["median_ms"], cpu))
    cpu_ms = 1e3 * (runs[1][1] - runs[0][1]) / iterations
    return min(r[0] for r in runs), cpu_ms


PINNED_SHAPES = (
    # name, query length, core-bench shape flags (None: the exported E=1024 model), server flags
    ("1x32x256 H=8 (demo)", 32, ["--embed_dim=256", "--num_heads=8"], []),
    ("1x8x1024 H=16", 8, None, ["--model_repository={models}"]),
)


def pinned_level(build, args, name, seq_len, server_flags, models, protocol):
    """One pinned load run: the server's CPU, wake-ups and batches per request."""
    extra = ["--threads=1", *[f.format(models=models) for f in server_flags]]
    server = Server(build, "ours", extra, prefix=["taskset", "-c", str(args.server_core)],
                    client_prefix=["taskset", "-c", str(args.client_core)])
    pid = server.proc.pid  # taskset execs the server: the same process.
    client = os.path.join(build, "bin", "attention-client")
    try:
        common = [*server.client_prefix, client, "load", f"--server=127.0.0.1:{server.port}",
                  "--batch=1", f"--seq_len={seq_len}", f"--protocol={protocol}"]
        subprocess.run([*common, f"--concurrency={args.concurrency}", "--duration=2s"],
                       capture_output=True)  # Warm-up: connections, threads, workspaces.
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            before, sw0, threads0 = server.scrape(), thread_switches(pid), thread_cpu(pid)
            cpu0 = cpu_seconds_of(pid)
            subprocess.run([*common, f"--concurrency={args.concurrency}",
                            f"--duration={args.duration}", f"--json={out.name}"],
                           capture_output=True, check=True)
            cpu1 = cpu_seconds_of(pid)
            sw1, threads1 = thread_switches(pid), thread_cpu(pid)
            after = server.scrape()
            level = json.load(open(out.name))[0]
    finally:
        server.stop()
    d = {k: after[k] - before[k] for k in after}
    requests = max(1, level["requests"])
    errors = sum(level["errors"].values()) if isinstance(level["errors"], dict) else level["errors"]
    return {
        "shape": name if protocol == "attention" else f"{name} {protocol}", "build": build,
        "requests": level["requests"], "errors": errors,
        "requests_per_s": level["requests_per_s"], "p50_ms": level["p50_ms"],
        "mean_batch": d["attention_batch_size_sum"] / max(1, d["attention_batch_size_count"]),
        "server_cpu_us": 1e6 * (cpu1 - cpu0) / requests,
        "server_compute_us": 1e6 * d["attention_compute_duration_seconds_sum"] / requests,
        "voluntary_switches": (sw1[0] - sw0[0]) / requests,
        "involuntary_switches": (sw1[1] - sw0[1]) / requests,
        "thread_cpu_us": {k: round(1e6 * (v - threads0.get(k, 0)) / requests, 1)
                          for k, v in threads1.items() if v > threads0.get(k, 0)},
    }


def pinned_compute(args, shape_flags, seq_len, mean_batch, cache):
    """Core-bench compute per request for a batch of `mean_batch` (interpolated between the two
    whole sizes around it): (from the median wall time, from the CPU time) in µs."""
    low = max(1, int(mean_batch))
    result = []
    for which in (0, 1):
        times = {}
        for b in sorted({low, low + 1}):
            key = (tuple(shape_flags), seq_len, b)
            if key not in cache:
                cache[key] = core_bench(args.build, args.server_core, b, seq_len, shape_flags,
                                        args.core_iterations)
            times[b] = cache[key][which]
        t = times[low] + (mean_batch - low) * (times[low + 1] - times[low])
        result.append(1e3 * t / mean_batch)
    return result


def pinned(args):
    builds = [args.build] + ([args.server_build] if args.server_build else [])
    rows, cache = [], {}
    with tempfile.TemporaryDirectory() as models:
        subprocess.run(["/usr/bin/python3", os.path.join(REPO, "scripts", "export_torch_mha.py"),
                        "--embed_dim", "1024", "--num_heads", "16", "--out",
                        os.path.join(models, "large")], check=True, capture_output=True)
        for rep in range(args.repeat):
            for build in builds:
                for (name, seq_len, shape_flags, server_flags), protocol in itertools.product(
                        PINNED_SHAPES, args.protocols.split(",")):
                    row = pinned_level(build, args, name, seq_len, server_flags, models, protocol)
                    flags = shape_flags or [f"--model={os.path.join(models, 'large')}"]
                    row["compute_wall_us"], row["compute_us"] = pinned_compute(
                        args, flags, seq_len, row["mean_batch"], cache)
                    row["overhead_us"] = row["server_cpu_us"] - row["compute_us"]
                    row["repeat"] = rep
                    rows.append(row)
                    print(f"  {rep} {build} {name}: {row['server_cpu_us']:.1f} µs CPU, "
                          f"{row['compute_us']:.1f} compute, batch {row['mean_batch']:.1f}",
                          flush=True)
    print(f"\nPinned: server on core {args.server_core} (--threads=1), "
          f"{args.concurrency} clients on core {args.client_core}, {args.duration} per run; "
          "per request:")
    print("| build | shape | req/s | mean batch | server CPU µs | compute µs (core-bench CPU; "
          "median wall) | overhead µs | server's compute µs | wake-ups (vol + invol) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['build']} | {r['shape']} | "
              f"{r['requests_per_s']:.0f} | {r['mean_batch']:.1f} | {r['server_cpu_us']:.1f} | "
              f"{r['compute_us']:.1f} ({r['compute_wall_us']:.1f}) | **{r['overhead_us']:.1f}** | "
              f"{r['server_compute_us']:.1f} | "
              f"{r['voluntary_switches']:.2f} + {r['involuntary_switches']:.2f} | {r['errors']} |")
    print("server CPU µs per request by thread name:")
    for r in rows:
        print(f"  {r['build']} {r['shape']}: "
              + ", ".join(f"{k} {v}" for k, v in sorted(r["thread_cpu_us"].items(),
                                                        key=lambda kv: -kv[1])))
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pinned": rows}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--duration", default="6s")
    parser.add_argument("--chart", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--pinned", action="store_true",
                        help="measure the server's overhead per request, pinned (see above)")
    parser.add_argument("--server_core", type=int, default=0)
    parser.add_argument("--client_core", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64, help="--pinned: clients")
    parser.add_argument("--repeat", type=int, default=1, help="--pinned: runs of each")
    parser.add_argument("--protocols", default="attention",
                        help="--pinned: the load generator's protocols, comma-separated: attention "
                             "(attention.v1 Infer), kserve (the inference protocol's ModelInfer)")
    parser.add_argument("--server_build", default="",
                        help="--pinned: a second build, alternated with --build")
    parser.add_argument("--core_iterations", type=int, default=200)
    args = parser.parse_args()
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    if args.pinned:
        pinned(args)
        return

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
