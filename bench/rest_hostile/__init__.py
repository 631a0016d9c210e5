"""Helpers for bench/rest_hostile_bench.py: the REST front-end under hostile clients.

Modules:
  server      start a server binary (free ports, bearer tokens file), poll readiness (HTTP health
              and gRPC ModelReady with the token), sample its VmRSS/VmHWM/Threads/fds.
  attacks     slowhttptest modes with probes during the attack, one-connection memory floods, drain.
  throughput  request bodies, wrk and perf_analyzer runs.
  driver      one round of the measurement groups against one binary.
  report      the tables (median over rounds, and each run), also for --from_json.

This file holds what they all share: the bench token and small helpers.
"""
import os
import sys
import time

TOKEN = "rest-hostile-bench-token"


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)
