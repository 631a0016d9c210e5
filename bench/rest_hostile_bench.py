#!/usr/bin/python3
"""REST front-end under hostile clients, and its throughput, for one or more server binaries.

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
import http.client
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc

TOKEN = "rest-hostile-bench-token"
E = 256
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)


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


def run_probes(fn, port, times, results):
    """Starts one thread per probe at each absolute monotonic time in `times`."""
    threads = []
    for i, t in enumerate(times):
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=lambda i=i: results.__setitem__(i, fn(port)), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(15)


# --------------------------------------------------------------------------- slowhttptest
def slowhttptest_cmd(mode, port, conns, rate, length):
    base = f"http://127.0.0.1:{port}"
    cmd = ["nice", "-n", "0", "slowhttptest", "-c", str(conns), "-r", str(rate), "-l", str(length),
           "-p", "5"]
    inject = ["-j", "bench=1\r\nAuthorization: Bearer " + TOKEN]  # the Cookie header carries a token line
    if mode == "H":
        cmd += ["-H", "-i", "10", "-u", base + "/v2/health/ready"]
    elif mode == "B":
        cmd += ["-B", "-i", "10", "-s", "8192", "-u", base + "/v2/models/demo/infer"]
    elif mode == "Bauth":
        cmd += ["-B", "-i", "10", "-s", "8192", "-u", base + "/v2/models/demo/infer"] + inject
    elif mode == "X":
        cmd += ["-X", "-k", "3", "-n", "5", "-w", "512", "-y", "1024", "-z", "32",
                "-u", base + "/v2/health/ready"]
    elif mode == "Xauth":
        cmd += ["-X", "-k", "10", "-n", "5", "-w", "512", "-y", "1024", "-z", "32",
                "-u", base + "/v2/models/demo/config"] + inject
    else:
        raise ValueError(mode)
    return cmd


def parse_slowhttptest(text):
    text = ANSI.sub("", text)
    avail = re.findall(r"service available:\s*(YES|NO)", text)
    connected = [int(x) for x in re.findall(r"connected:\s*(\d+)", text)]
    closed = [int(x) for x in re.findall(r"closed:\s*(\d+)", text)]
    errors = [int(x) for x in re.findall(r"error:\s*(\d+)", text)]
    m = re.search(r"Exit status:\s*(.*)", text) or re.search(r"(Error:.*)", text)
    return {"status_blocks": len(avail), "available_no": avail.count("NO"),
            "last_available": avail[-1] if avail else None,
            "verdict": ("service available" if avail and "NO" not in avail else
                        "service UNAVAILABLE in %d of %d status reports" % (avail.count("NO"), len(avail))),
            "max_connected": max(connected, default=0), "final_closed": closed[-1] if closed else 0,
            "final_error": errors[-1] if errors else 0,
            "exit_status": m.group(1).strip() if m else None}


def hostile(server, mode, args, workdir):
    time.sleep(1.2)  # a fresh 1 s window of samples for the baseline (not a readiness wait)
    la = loadavg()
    t0 = time.monotonic()
    base = server.sampler.baseline(t0)
    cmd = slowhttptest_cmd(mode, server.http_port, args.connections, args.rate, args.attack_s)
    outpath = os.path.join(workdir, f"slowhttptest-{mode}-{server.http_port}.txt")
    shown = " ".join(repr(c) if "\r" in c else c for c in cmd)
    log(f"  slowhttptest {mode}: {shown}")
    with open(outpath, "w") as out:
        sh = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        ramp = args.probe_start_s if args.probe_start_s else args.connections / args.rate + 3.0
        times = [t0 + ramp + i * args.probe_interval for i in range(args.probes)]
        hres, gres = [None] * args.probes, [None] * args.probes
        ht = threading.Thread(target=run_probes, args=(http_probe, server.http_port, times, hres))
        gt = threading.Thread(target=run_probes, args=(grpc_probe, server.grpc_port, times, gres))
        ht.start(); gt.start(); ht.join(); gt.join()
        try:
            sh.wait(args.attack_s + 60)
        except subprocess.TimeoutExpired:
            sh.kill(); sh.wait()
    t1 = time.monotonic()
    peak = server.sampler.peak(t0, t1)
    with open(outpath) as f:
        verdict = parse_slowhttptest(f.read())
    # Recovery: the server answers again and its fds fall back near the baseline.
    rec_t0 = time.monotonic()
    recovered = None
    while time.monotonic() - rec_t0 < 60 and server.alive():
        s = server.sampler.read()
        if http_probe(server.http_port, timeout=2)[0] and s and s[4] <= base["fds"] + 16:
            recovered = time.monotonic() - rec_t0
            break
        time.sleep(0.2)
    conns = max(1, peak["fds"] - base["fds"]) if peak["fds"] else 1
    held = max(1, verdict["max_connected"])
    rise = (peak["rss_kib"] - base["rss_kib"]) if peak["rss_kib"] else None
    return {
        "mode": mode, "loadavg_before": la, "cmd": cmd,
        "http_answered": sum(1 for r in hres if r and r[0]), "grpc_answered": sum(1 for r in gres if r and r[0]),
        "http_failures": sorted({str(r[1]) for r in hres if r and not r[0]} | ({"no result"} if None in hres else set())),
        "grpc_failures": sorted({str(r[1]) for r in gres if r and not r[0]} | ({"no result"} if None in gres else set())),
        "http_probe_max_s": max((r[2] for r in hres if r), default=None),
        "grpc_probe_max_s": max((r[2] for r in gres if r), default=None),
        "rss_base_mib": base["rss_kib"] / 1024, "rss_peak_mib": (peak["rss_kib"] or 0) / 1024,
        "rss_rise_mib": rise / 1024 if rise is not None else None,
        "threads_base": base["threads"], "threads_peak": peak["threads"],
        "fds_base": base["fds"], "fds_peak": peak["fds"],
        "kib_per_conn_by_fds": rise / conns if rise is not None else None,
        "kib_per_conn_by_connected": rise / held if rise is not None else None,
        "slowhttptest": verdict, "alive_after": server.alive(), "recovered_s": recovered,
        "output": outpath,
    }


# --------------------------------------------------------------------------- single connection memory
def flood(port, first, unit, total, timeout=10.0):
    """Sends `first`, then `unit` repeated until `total` bytes; returns (sent, outcome)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    sent = 0
    outcome = "sent all"
    try:
        s.sendall(first)
        sent = len(first)
        while sent < total:
            s.sendall(unit)
            sent += len(unit)
    except socket.timeout:
        outcome = "server stopped reading (send blocked %gs)" % timeout
    except (BrokenPipeError, ConnectionResetError) as e:
        outcome = "connection closed by server (%s)" % type(e).__name__
    answer = b""
    try:
        s.settimeout(2)
        answer = s.recv(200)
    except Exception:
        pass
    s.close()
    status = answer.split(b"\r\n", 1)[0].decode("latin1") if answer else "(no answer)"
    return sent, outcome, status


def memory_test(binary, workdir, tokens, which, extra):
    srv = Server(binary, workdir, tokens, extra, label="mem")
    la = loadavg()
    time.sleep(2.0)  # let RSS settle after start-up (a measurement window, not a readiness wait)
    s0 = srv.sampler.read()
    base = {"rss_kib": s0[1]}
    hwm0 = s0[2]
    ts = time.monotonic()
    if which == "request_line_512MiB":
        mib = b"A" * (1 << 20)
        sent, outcome, status = flood(srv.http_port, b"GET /", mib, 512 << 20)
    else:  # header_lines_256MiB
        line = b"X-Pad: " + b"a" * (8192 - 9) + b"\r\n"
        unit = line * 128  # 1 MiB per sendall
        sent, outcome, status = flood(srv.http_port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n",
                                      unit, 256 << 20)
    elapsed = time.monotonic() - ts
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:  # keep sampling for a second after the sender stopped
        time.sleep(0.1)
    s = srv.sampler.read()
    peak = srv.sampler.peak(ts, time.monotonic())
    hwm = max(s[2] if s else 0, peak.get("hwm_kib") or 0)
    # The rise: the highest RSS seen while flooding, or the new high-water mark if the flood raised it.
    top = max(peak["rss_kib"] or 0, hwm if hwm > hwm0 else 0)
    alive = srv.alive()
    srv.stop()
    return {"test": which, "loadavg_before": la, "sent_mib": sent / (1 << 20), "outcome": outcome,
            "answer": status, "send_s": elapsed, "rss_base_mib": base["rss_kib"] / 1024,
            "rss_peak_sampled_mib": (peak["rss_kib"] or 0) / 1024,
            "hwm_before_mib": hwm0 / 1024, "hwm_after_mib": hwm / 1024,
            "peak_rise_mib": (top - base["rss_kib"]) / 1024, "hwm_rise_mib": (hwm - hwm0) / 1024,
            "alive_after": alive}


# --------------------------------------------------------------------------- drain
def drain_test(binary, workdir, tokens, extra, args):
    srv = Server(binary, workdir, tokens, list(extra) + ["--drain_timeout_s=2"], label="drain")
    la = loadavg()
    s = socket.create_connection(("127.0.0.1", srv.http_port))
    s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    stop = threading.Event()
    trickled = [0]

    def trickle():
        while not stop.is_set():
            try:
                s.sendall(b"a")
                trickled[0] += 1
            except OSError:
                return
            stop.wait(0.5)

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    time.sleep(1.0)  # the trickle is under way (not a readiness wait)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(args.drain_wait_s)
        exit_s = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        exit_s = None
    stop.set()
    th.join(2)
    s.close()
    srv.sampler.stop_event.set()
    srv.logf.close()
    return {"loadavg_before": la, "exit_s": exit_s, "returncode": srv.proc.returncode,
            "trickled_bytes": trickled[0],
            "note": None if exit_s is not None else f"still running {args.drain_wait_s:g} s after SIGTERM: SIGKILLed"}


# --------------------------------------------------------------------------- throughput
def make_bodies(workdir):
    import random
    import struct
    rng = random.Random(1)
    vals = [round(rng.uniform(-1, 1), 4) for _ in range(16 * E)]
    body = {"inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 16, E], "data": vals}]}
    jpath = os.path.join(workdir, "infer.json")
    with open(jpath, "w") as f:
        json.dump(body, f)
    header = json.dumps({"inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 16, E],
                                     "parameters": {"binary_data_size": 16 * E * 4}}]}).encode()
    bpath = os.path.join(workdir, "infer.bin")
    with open(bpath, "wb") as f:
        f.write(header + struct.pack("<%df" % len(vals), *vals))
    luas = {}
    for name, path, extra in (("json", jpath, 'wrk.headers["Content-Type"] = "application/json"'),
                              ("binary", bpath, 'wrk.headers["Content-Type"] = "application/octet-stream"\n'
                               f'wrk.headers["Inference-Header-Content-Length"] = "{len(header)}"')):
        lua = os.path.join(workdir, f"infer_{name}.lua")
        with open(lua, "w") as f:
            f.write(f'wrk.method = "POST"\n{extra}\nwrk.headers["Authorization"] = "Bearer {TOKEN}"\n'
                    f'local f = io.open("{path}", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
        luas[name] = lua
    qpath = os.path.join(workdir, "pa_query.json")
    with open(qpath, "w") as f:
        json.dump({"data": [{"query": [float(v) if v != 0 else 1e-9 for v in vals]}]}, f)
    return luas, jpath, bpath, qpath


def check_infer(port, path, binary_header_len=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": "Bearer " + TOKEN}
    if binary_header_len:
        headers["Inference-Header-Content-Length"] = str(binary_header_len)
    with open(path, "rb") as f:
        c.request("POST", "/v2/models/demo/infer", body=f.read(), headers=headers)
    r = c.getresponse()
    data = r.read()
    return r.status, data[:120]


def cpu_s(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def to_ms(v, unit):
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def run_wrk(port, lua, conns, duration, threads=2, pid=None):
    cmd = ["nice", "-n", "0", "wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency",
           "-s", lua, f"http://127.0.0.1:{port}/v2/models/demo/infer"]
    la = loadavg()
    c0 = cpu_s(pid) if pid else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    res = {"cmd": cmd, "loadavg_before": la, "server_cpu_s": cpu_s(pid) - c0 if pid else None}
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    res["rps"] = float(m.group(1)) if m else None
    for p in ("50", "90", "99"):
        m = re.search(rf"^\s*{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        res[f"p{p}_ms"] = to_ms(*m.groups()) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    res["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Socket errors:(.*)", out)
    res["socket_errors"] = m.group(1).strip() if m else ""
    res["raw"] = out
    if res["server_cpu_s"] is not None and res["requests"]:
        res["server_cpu_ms_per_req"] = 1000.0 * res["server_cpu_s"] / res["requests"]
    return res


def run_pa(pa, port, qpath, conc, workdir, stability):
    csv = os.path.join(workdir, f"pa-{port}-c{conc}.csv")
    cmd = ["nice", "-n", "0", pa, "-m", "demo", "-i", "http", "-u", f"127.0.0.1:{port}",
           "--input-data", qpath, "--shape", f"query:1,16,{E}", "--concurrency-range", str(conc),
           "-H", f"Authorization: Bearer {TOKEN}", "--measurement-interval", "4000",
           "--stability-percentage", str(stability), "--max-trials", "5", "-f", csv]
    la = loadavg()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    res = {"cmd": cmd, "loadavg_before": la, "rc": p.returncode}
    if p.returncode != 0 or not os.path.exists(csv):
        res["error"] = (p.stdout + p.stderr)[-800:]
        return res
    with open(csv) as f:
        rows = [l.rstrip("\n").split(",") for l in f if l.strip()]
    hdr, row = rows[0], rows[1]
    col = dict(zip(hdr, row))
    res["rps"] = float(col["Inferences/Second"])
    for p_ in ("50", "90", "99"):
        res[f"p{p_}_ms"] = float(col[f"p{p_} latency"]) / 1000.0
    res["avg_ms"] = float(col["Avg latency"]) / 1000.0 if "Avg latency" in col else None
    m = re.search(r"(\d+) errors?", p.stdout)
    res["tail"] = p.stdout[-600:]
    return res


# --------------------------------------------------------------------------- driver
def server_extra(binary, args):
    helptext = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    extra = []
    if "--http_max_connections" in helptext and args.http_max_connections:
        extra.append(f"--http_max_connections={args.http_max_connections}")
    return extra


def one_round(binary, args, workdir, tokens, bodies):
    res = {"binary": binary}
    extra = server_extra(binary, args)
    res["extra_flags"] = extra
    luas, jpath, bpath, qpath = bodies
    if "throughput" in args.groups:
        srv = Server(binary, workdir, tokens, extra, label="tput")
        res["ready_s"] = srv.ready_s
        st_json = check_infer(srv.http_port, jpath)
        with open(bpath, "rb") as f:
            hlen = f.read().index(b"}]}") + 3
        st_bin = check_infer(srv.http_port, bpath, hlen)
        res["sanity"] = {"json": st_json[0], "binary": st_bin[0]}
        if st_json[0] != 200 or st_bin[0] != 200:
            log(f"  sanity infer failed: {st_json} {st_bin}")
        log(f"  wrk json c{args.json_concurrency} (load {loadavg()})")
        for conc in args.json_concurrency:
            res[f"wrk_json_c{conc}"] = run_wrk(srv.http_port, luas["json"], conc, args.wrk_s,
                                               threads=min(2, conc), pid=srv.proc.pid)
        for conc in (8, 64):
            if "wrk" in args.binary_tools:
                log(f"  wrk binary c{conc}")
                res[f"wrk_binary_c{conc}"] = run_wrk(srv.http_port, luas["binary"], conc, args.wrk_s,
                                                     threads=2, pid=srv.proc.pid)
            if "pa" in args.binary_tools and args.perf_analyzer:
                log(f"  perf_analyzer binary c{conc}")
                res[f"pa_binary_c{conc}"] = run_pa(args.perf_analyzer, srv.http_port, qpath, conc, workdir,
                                                       args.pa_stability)
        res["tput_alive"] = srv.alive()
        srv.stop()
    if "hostile" in args.groups:
        res["hostile"] = {}
        for mode in args.modes:  # a fresh server per attack: baselines are not inflated by the last
            srv = Server(binary, workdir, tokens, extra, label=f"hostile-{mode}")
            res["hostile"][mode] = hostile(srv, mode, args, workdir)
            h = res["hostile"][mode]
            h["stop_s_rc"] = srv.stop()
            log(f"  {mode}: http {h['http_answered']}/20 grpc {h['grpc_answered']}/20 "
                f"rss {h['rss_base_mib']:.0f}->{h['rss_peak_mib']:.0f} MiB thr {h['threads_peak']} "
                f"fds {h['fds_peak']} {h['slowhttptest']['verdict']}")
    if "memory" in args.groups:
        res["memory"] = {}
        for which in ("request_line_512MiB", "header_lines_256MiB"):
            log(f"  memory {which}")
            res["memory"][which] = memory_test(binary, workdir, tokens, which, extra)
    if "drain" in args.groups:
        log("  drain")
        res["drain"] = drain_test(binary, workdir, tokens, extra, args)
    return res


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, f="%.1f"):
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return f % v
    return str(v)


def print_tables(binary, all_rounds):
    """One table per binary: the median over the rounds that ran each measurement, and each run."""
    flags = sorted({str(r.get("extra_flags")) for r in all_rounds})
    print(f"\n=== {binary} (commit {commit_of(binary)}); rounds: {len(all_rounds)}; flags added: {flags}")
    cur = []

    def having(*path):
        out = []
        for r in all_rounds:
            x = r
            for k in path:
                x = x.get(k) if isinstance(x, dict) else None
            if x is not None:
                out.append(r)
        cur[:] = out
        return out

    def vals(path):
        out = []
        for r in cur:
            x = r
            for k in path:
                x = x.get(k) if isinstance(x, dict) else None
            out.append(x)
        return out

    def row(name, path, f="%.1f"):
        v = vals(path)
        print(f"  {name:<46} median {fmt(med([x for x in v if isinstance(x, (int, float))]), f):>10}   "
              f"runs: {', '.join(fmt(x, f) for x in v)}")

    print(" throughput")
    keys = sorted({k for r in all_rounds for k in r if k.startswith(("wrk_", "pa_"))},
                  key=lambda k: (k.split("_")[0] != "wrk", k.split("_")[1] != "json", int(k.rsplit("c", 1)[1])))
    for key in keys:
        if not having(key):
            continue
        row(f"{key} req/s", [key, "rps"])
        for p in ("50", "90", "99"):
            row(f"{key} p{p} ms", [key, f"p{p}_ms"], "%.2f")
        if key.startswith("wrk"):
            row(f"{key} non-2xx", [key, "non2xx"], "%d")
            if any(vals([key, "server_cpu_ms_per_req"])):
                row(f"{key} server CPU ms/request", [key, "server_cpu_ms_per_req"], "%.3f")
        print(f"    load before: {'; '.join(str(x) for x in vals([key, 'loadavg_before']))}")
        errs = [e.strip().splitlines()[-1] for e in vals([key, "error"]) if e]
        if errs:
            print(f"    failed runs: {errs}")
    modes = []
    for r in all_rounds:
        for m in (r.get("hostile") or {}):
            if m not in modes:
                modes.append(m)
    if modes:
        print(" hostile (slowhttptest; connections: see each run's max connected)")
    for mode in modes:
        having("hostile", mode)
        # Runs where slowhttptest refused its arguments (no status report) measured no attack.
        cur[:] = [r for r in cur if r["hostile"][mode]["slowhttptest"]["status_blocks"] > 0]
        if not cur:
            continue
        p = ["hostile", mode]
        row(f"{mode}: REST probes answered /20", p + ["http_answered"], "%d")
        row(f"{mode}: gRPC probes answered /20", p + ["grpc_answered"], "%d")
        row(f"{mode}: RSS baseline MiB", p + ["rss_base_mib"])
        row(f"{mode}: RSS peak MiB", p + ["rss_peak_mib"])
        row(f"{mode}: RSS rise MiB", p + ["rss_rise_mib"])
        row(f"{mode}: KiB per connection (rise/fd rise)", p + ["kib_per_conn_by_fds"])
        row(f"{mode}: KiB per connection (rise/connected)", p + ["kib_per_conn_by_connected"])
        row(f"{mode}: threads baseline", p + ["threads_base"], "%d")
        row(f"{mode}: threads peak", p + ["threads_peak"], "%d")
        row(f"{mode}: fds baseline", p + ["fds_base"], "%d")
        row(f"{mode}: fds peak", p + ["fds_peak"], "%d")
        row(f"{mode}: slowhttptest max connected", p + ["slowhttptest", "max_connected"], "%d")
        row(f"{mode}: recovery after attack s", p + ["recovered_s"], "%.1f")
        for h in vals(p):
            print(f"    verdict: {h['slowhttptest']['verdict']} (exit: {h['slowhttptest']['exit_status']}); "
                  f"http failures {h['http_failures']} grpc failures {h['grpc_failures']}; "
                  f"alive {h['alive_after']}; load before {h['loadavg_before']}")
    if having("memory"):
        print(" single-connection memory")
        for which in ("request_line_512MiB", "header_lines_256MiB"):
            p = ["memory", which]
            row(f"{which}: peak RSS rise MiB", p + ["peak_rise_mib"])
            row(f"{which}: VmHWM rise MiB", p + ["hwm_rise_mib"])
            row(f"{which}: bytes the client got to send MiB", p + ["sent_mib"])
            for m in vals(p):
                print(f"    {m['outcome']}; answer {m['answer']}; base {m['rss_base_mib']:.1f} MiB, "
                      f"HWM {m['hwm_after_mib']:.1f} MiB; alive {m['alive_after']}; load {m['loadavg_before']}")
    if having("drain"):
        print(" drain (--drain_timeout_s=2, one client trickling a header)")
        row("SIGTERM to exit s", ["drain", "exit_s"], "%.2f")
        print(f"    exit codes: {vals(['drain', 'returncode'])}; {vals(['drain', 'note'])}; "
              f"load {vals(['drain', 'loadavg_before'])}")


def commit_of(binary):
    p = os.path.join(os.path.dirname(os.path.abspath(binary)), "COMMIT")
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return "?"


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
        merged = {}
        for path in args.from_json:
            with open(path) as f:
                for b, rounds in json.load(f)["results"].items():
                    merged.setdefault(b, []).extend(rounds)
        for b, rounds in merged.items():
            print_tables(b, rounds)
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
    tokens = os.path.join(workdir, "tokens")
    import hashlib
    with open(tokens, "w") as f:
        f.write(f"{hashlib.sha256(TOKEN.encode()).hexdigest()} bench *\n")
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
