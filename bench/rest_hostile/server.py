"""Starting a server binary for the bench: ports, tokens file, readiness, RSS/thread/fd sampling.

Server() starts the binary on free ports with bearer tokens on and returns once it answers an
HTTP health probe and a gRPC ModelReady probe (both with the token); readiness is polled, never
waited by a fixed sleep. Its Sampler thread reads /proc every 100 ms for baselines and peaks.
"""
import hashlib
import http.client
import os
import signal
import socket
import statistics
import subprocess
import threading
import time

import grpc

from . import TOKEN


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def write_tokens(workdir):
    """Writes the tokens file (sha256 of TOKEN) the servers are started with; returns its path."""
    tokens = os.path.join(workdir, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{hashlib.sha256(TOKEN.encode()).hexdigest()} bench *\n")
    return tokens


def server_extra(binary, args):
    """Flags added for a binary that has them (found in its --help): --http_max_connections."""
    helptext = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    extra = []
    if "--http_max_connections" in helptext and args.http_max_connections:
        extra.append(f"--http_max_connections={args.http_max_connections}")
    return extra


# --------------------------------------------------------------------------- server process
class Sampler(threading.Thread):
    """Samples VmRSS, VmHWM, Threads and the fd count of one pid every `period` seconds."""

    def __init__(self, pid, period=0.1):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples = []  # (t, rss_kib, hwm_kib, threads, fds)
        self.stop_event = threading.Event()

    def read(self):
        rss = hwm = thr = None
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        thr = int(line.split()[1])
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        return (time.monotonic(), rss, hwm, thr, fds)

    def run(self):
        while not self.stop_event.is_set():
            s = self.read()
            if s is not None and s[1] is not None:
                self.samples.append(s)
            self.stop_event.wait(self.period)

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def baseline(self, t0, span=1.0):
        w = self.window(t0 - span, t0) or self.samples[-1:]
        return {"rss_kib": statistics.median(s[1] for s in w),
                "threads": statistics.median(s[3] for s in w),
                "fds": statistics.median(s[4] for s in w)}

    def peak(self, t0, t1):
        w = self.window(t0, t1)
        if not w:
            return {"rss_kib": None, "threads": None, "fds": None}
        return {"rss_kib": max(s[1] for s in w), "threads": max(s[3] for s in w),
                "fds": max(s[4] for s in w), "hwm_kib": max(s[2] for s in w)}


class Server:
    def __init__(self, binary, workdir, tokens, extra=(), label="server"):
        self.binary = binary
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.logpath = os.path.join(workdir, f"{label}-{self.http_port}.log")
        self.cmd = ["nice", "-n", "0", binary, f"--port={self.grpc_port}",
                    f"--http_port={self.http_port}", f"--metrics_port={self.metrics_port}",
                    f"--auth_tokens_file={tokens}", "--max_connection_age_s=0"] + list(extra)
        self.logf = open(self.logpath, "w")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        self.sampler = Sampler(self.proc.pid)
        self.sampler.start()
        self.ready_s = self.wait_ready()

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode} at start; see {self.logpath}")
            if http_probe(self.http_port, timeout=1)[0] and grpc_probe(self.grpc_port, timeout=1)[0]:
                return time.monotonic() - self.t_start
            time.sleep(0.05)  # polling interval, not a readiness wait
        raise RuntimeError(f"server not ready after {timeout}s; see {self.logpath}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=60):
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sampler.stop_event.set()
        self.logf.close()
        return time.monotonic() - t0, self.proc.returncode


# --------------------------------------------------------------------------- probes
def http_probe(port, timeout=5.0, path="/v2/health/ready"):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path, headers={"Authorization": "Bearer " + TOKEN})
        r = c.getresponse()
        r.read()
        c.close()
        dt = time.monotonic() - t0
        return (r.status == 200 and dt <= timeout + 0.5), r.status, dt
    except Exception as e:  # timeout, reset, refused
        return False, type(e).__name__, time.monotonic() - t0


MODEL_READY_DEMO = b"\n\x04demo"  # inference.ModelReadyRequest{name: "demo"}


def grpc_probe(port, timeout=5.0):
    """A real gRPC call with the token on a fresh channel: KServe ModelReady("demo")."""
    t0 = time.monotonic()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelReady")
        resp = call(MODEL_READY_DEMO, timeout=timeout,
                    metadata=[("authorization", "Bearer " + TOKEN)])
        return resp == b"\x08\x01", "OK" if resp == b"\x08\x01" else repr(resp), time.monotonic() - t0
    except grpc.RpcError as e:
        return False, str(e.code()), time.monotonic() - t0
    finally:
        ch.close()
