"""Report: one table per binary (the median over rounds, and each run), also from --json files."""
import json
import os
import statistics


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


def print_from_json(paths):
    """Prints the tables of earlier --json files; the rounds of the same binary are merged."""
    merged = {}
    for path in paths:
        with open(path) as f:
            for b, rounds in json.load(f)["results"].items():
                merged.setdefault(b, []).extend(rounds)
    for b, rounds in merged.items():
        print_tables(b, rounds)
