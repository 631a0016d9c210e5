#!/usr/bin/python3
"""REST front-end under hostile clients, and its throughput, for one or more server binaries.

Usage: for each --server binary this measures REST infer throughput (JSON and binary tensors, wrk
and perf_analyzer), whether REST and gRPC still answer during slowhttptest attacks and what those
cost in RSS, threads and fds, the memory one connection can make the server hold, and how long a
drain on SIGTERM takes; it prints one table per binary (median over --rounds, and each run).
For example (the second command prints the tables of a run again):

  /usr/bin/python3 bench/rest_hostile_bench.py --server build/bin/attention-server --json out.json
  /usr/bin/python3 bench/rest_hostile_bench.py --from_json out.json

The code is in bench/rest_hostile/ (server, attacks, throughput, driver, report); this file parses
the arguments and runs the rounds. In general:

  /usr/bin/python3 bench/rest_hostile_bench.py --server A [--server B] [--rounds 2] [--json out.json]

For each binary (one after another, alternated over --rounds: A B A B), on free ports with
bearer tokens on (a tokens file is written):
  throughput  wrk -t2 -c64 -d15s --latency, small JSON infer (query [1,16,256]) to
              /v2/models/demo/infer; binary tensors (Triton's extension) at concurrency 8 and
              64 with perf_analyzer -i http when --perf_analyzer is given, and/or wrk with a
              binary body (--binary_tools).
  hostile     slowhttptest -H / -B / -X (and variants, --modes) with -c 1000 -r 200: during the
              attack 20 GET /v2/health/ready probes with a valid token (5 s timeout each) and 20
              gRPC ModelReady probes (fresh channel, token, 5 s); the server's VmRSS, Threads and
              open fds sampled every 100 ms (baseline before, peak during); slowhttptest's
              verdict (its "service available" status lines and exit status).
  memory      on a fresh server each: one connection sending a 512 MiB request line without a
              newline; one sending 256 MiB of 8 KB header lines: peak RSS rise (VmHWM).
  drain       --drain_timeout_s=2, a client trickling a header, SIGTERM: time to exit.

Only Debian's python3 standard library and python3-grpcio; slowhttptest and wrk from Debian.
Readiness is polled (HTTP health with token, gRPC ModelReady), never waited by a fixed sleep.
"""
import argparse
import json
import os
import resource
import sys
import tempfile

from rest_hostile import loadavg, log
from rest_hostile.driver import one_round
from rest_hostile.report import print_from_json, print_tables
from rest_hostile.server import write_tokens
from rest_hostile.throughput import make_bodies


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="append", help="server binary (repeatable)")
    ap.add_argument("--from_json", action="append",
                    help="print the tables of earlier --json files (repeatable: their rounds are merged)")
    ap.add_argument("--rounds", type=int, default=1, help="alternations A B A B ...")
    ap.add_argument("--groups", default="throughput,hostile,memory,drain")
    ap.add_argument("--modes", default="H,B,X", help="slowhttptest modes: H,B,X,Bauth,Xauth")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--attack_s", type=int, default=45)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--probe_interval", type=float, default=1.25)
    ap.add_argument("--probe_start_s", type=float, default=0,
                    help="first probe this long after the attack starts (0: once all connections are opened + 3 s)")
    ap.add_argument("--http_max_connections", type=int, default=0,
                    help="passed to servers that have the flag (0: their default)")
    ap.add_argument("--wrk_s", type=int, default=15)
    ap.add_argument("--json_concurrency", default="64", help="wrk connections for the JSON infer (list)")
    ap.add_argument("--drain_wait_s", type=float, default=60, help="SIGKILL after this long")
    ap.add_argument("--perf_analyzer", default="")
    ap.add_argument("--pa_stability", type=float, default=1000,
                    help="perf_analyzer --stability-percentage: on 2 shared cores c64 never settles within"
                         " 50%%, so by default its first 3 windows of 4 s are taken as they are")
    ap.add_argument("--binary_tools", default="pa,wrk", help="pa and/or wrk for binary tensors")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.from_json:
        print_from_json(args.from_json)
        return
    if not args.server:
        ap.error("--server is required")
    args.groups = args.groups.split(",")
    args.modes = args.modes.split(",")
    args.binary_tools = args.binary_tools.split(",")
    args.json_concurrency = [int(c) for c in args.json_concurrency.split(",")]
    if args.perf_analyzer and not os.access(args.perf_analyzer, os.X_OK):
        log(f"perf_analyzer {args.perf_analyzer} not executable: binary tensors by wrk only")
        args.perf_analyzer = ""

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard, 65536)) if hard != resource.RLIM_INFINITY else 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    need = args.connections * 2 + 256
    if want < need:
        sys.exit(f"RLIMIT_NOFILE {want} < {need}: raise the hard limit")

    workdir = args.workdir or tempfile.mkdtemp(prefix="rest-hostile-")
    os.makedirs(workdir, exist_ok=True)
    tokens = write_tokens(workdir)
    bodies = make_bodies(workdir)
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    log(f"machine: nproc {os.cpu_count()}, {model}; RLIMIT_NOFILE {want}; workdir {workdir}; load {loadavg()}")

    results = {b: [] for b in args.server}
    for rnd in range(args.rounds):
        for b in args.server:
            log(f"round {rnd + 1}: {b} (load {loadavg()})")
            results[b].append(one_round(b, args, workdir, tokens, bodies))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"machine": {"nproc": os.cpu_count(), "model": model},
                               "results": results}, f, indent=1, default=str)
    print(f"machine: nproc {os.cpu_count()}, {model}; RLIMIT_NOFILE {want}")
    for b in args.server:
        print_tables(b, results[b])


if __name__ == "__main__":
    main()
