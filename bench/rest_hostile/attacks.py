"""Hostile clients: slowhttptest attacks with probes, one-connection memory floods, drain.

hostile() runs one slowhttptest mode against a running server while REST and gRPC probes with a
valid token are sent, and reports the probes answered, RSS/threads/fds baseline and peak, the
slowhttptest verdict and the recovery time. memory_test() and drain_test() start their own server.
"""
import os
import re
import signal
import socket
import subprocess
import threading
import time

from . import TOKEN, loadavg, log
from .server import Server, grpc_probe, http_probe

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
