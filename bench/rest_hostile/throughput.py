"""Throughput: the infer request bodies, wrk (JSON or binary body) and perf_analyzer runs.

Each run records its command, the load average before it, requests/s and p50/p90/p99 latency;
wrk runs also record the server's CPU time per request (from /proc/<pid>/stat).
"""
import http.client
import json
import os
import random
import re
import struct
import subprocess

from . import TOKEN, loadavg

E = 256


def make_bodies(workdir):
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
