#!/usr/bin/python3
"""Checks the monitoring files against Debian's Prometheus and a live attention-server.

    /usr/bin/python3 tests/monitoring/check_monitoring.py [--build DIR] [--repo DIR]

1. promtool: `check config` on docker/prometheus/prometheus.yml, `check rules` on alerts.yml,
   and `test rules` on tests/monitoring/alerts_test.yml (every alert fires on synthetic series).
2. The Grafana files agree: the dashboard's datasource uid is the provisioned one, and the
   dashboards provider reads the folder docker/compose.yaml mounts the dashboards at.
3. Live: starts attention-server (loopback, free ports) and Debian's prometheus scraping it
   every second with alerts.yml loaded; sends load (unary and streaming) and a few bad requests
   with attention-client, and a session's appends; waits, by bounded polling, until Prometheus has scraped it all. Then
   every PromQL expression of the dashboard ($model -> demo, $__rate_interval/$__interval -> 1m)
   and of the alert rules is evaluated through /api/v1/query: each must parse; each dashboard
   expression must return data with a number in it. Alert conditions are false on a healthy
   server, so for them the part left of the threshold comparison must return data instead, and
   Prometheus's rule engine must report every rule healthy.

Stdlib only. Every process started is stopped (SIGTERM, then wait) and the temp directory is
removed, also on failure or when the script itself gets SIGTERM/SIGINT; children also get
SIGTERM should this script be killed outright (PR_SET_PDEATHSIG).

promtool/prometheus come from Debian's `prometheus` package. Without them the check prints
SKIP and exits 0, unless the environment variable CI is set: then it fails.
"""
import argparse
import ctypes
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

MODEL = "demo"  # attention-server's built-in model
# Grafana variables in dashboard queries and what they become here.
SUBSTITUTIONS = {"$model": MODEL, "${model}": MODEL,
                 "$__rate_interval": "1m", "${__rate_interval}": "1m",
                 "$__interval": "1m", "${__interval}": "1m"}
BUDGET_S = 60  # the live part must finish within this


class Failure(Exception):
    """A check failed in a way that stops the live part."""


def _exit_on_signal(signum, _frame):
    # Turn SIGTERM (e.g. from ctest) into an exception so `finally` cleans up.
    raise SystemExit(f"interrupted by signal {signum}")


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM if this script dies without cleaning up."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def free_port():
    # Bound and released: another process could take it before ours binds (unlikely here).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(expr):
    return " ".join(expr.split())


def wait_for(what, predicate, deadline, interval=0.2):
    """Polls predicate() until it returns something truthy; Failure at the deadline."""
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise Failure(f"timed out waiting for {what}")
        time.sleep(interval)


class Processes:
    """Processes started by this script, with their logs in the work directory."""

    def __init__(self, work):
        self.work = work
        self.procs = []  # (name, Popen, log path)

    def start(self, name, argv):
        log = os.path.join(self.work, name + ".log")
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.procs.append((name, p, log))
        return p, log

    def check_alive(self):
        for name, p, _ in self.procs:
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode} (its log is above)")

    @staticmethod
    def tail(log, lines=15):
        with open(log, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop_all(self):
        for name, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=35)  # the server drains for up to 30 s (nothing is in flight)
            except subprocess.TimeoutExpired:
                print(f"{name} ignored SIGTERM; killing it")
                p.kill()
                p.wait()
        self.procs.clear()


class Prometheus:
    """The HTTP API of the Prometheus started here."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, params=None):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            return json.load(e)

    def ready(self):
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr):
        return self.get("/api/v1/query", {"query": expr})

    def values(self, expr):
        """The sample values of an instant query ([] when empty or on error)."""
        r = self.query(expr)
        if r.get("status") != "success":
            return []
        return [float(s["value"][1]) for s in r["data"]["result"]]


def split_comparison(expr):
    """(left side, operator) of expr's top-level comparison, or (expr, None) without one.

    Comparisons bind loosest of PromQL's operators (only and/or/unless are looser, and the
    alert rules use none), so the left of the first top-level one is the alert's measure.
    """
    depth, quote, i = 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            op = expr[i:i + 2] if expr[i:i + 2] in ("==", "!=", ">=", "<=") else c
            if op in ("==", "!=", ">=", "<=", ">", "<"):
                return expr[:i].strip(), op
        i += 1
    return expr, None


def run_promtool(repo, failures):
    checks = [
        (["promtool", "check", "config", "prometheus.yml"], "docker/prometheus"),
        (["promtool", "check", "rules", "alerts.yml"], "docker/prometheus"),
        (["promtool", "test", "rules", "alerts_test.yml"], "tests/monitoring"),
    ]
    for argv, where in checks:
        r = subprocess.run(argv, cwd=os.path.join(repo, where), capture_output=True, text=True,
                           timeout=60)
        print(f"{' '.join(argv)} (in {where}): {'ok' if r.returncode == 0 else 'FAILED'}")
        if r.returncode != 0:
            failures.append(f"{' '.join(argv)}:\n{r.stdout}{r.stderr}")


def check_grafana_files(repo, dashboard, failures):
    grafana = os.path.join(repo, "docker", "grafana")
    with open(os.path.join(grafana, "provisioning", "datasources", "prometheus.yml")) as f:
        datasources = f.read()
    with open(os.path.join(grafana, "provisioning", "dashboards", "dashboards.yml")) as f:
        providers = f.read()
    with open(os.path.join(repo, "docker", "compose.yaml")) as f:
        compose = f.read()
    uids = set(re.findall(r"^\s*uid:\s*[\"']?([\w-]+)", datasources, re.M))
    if "url: http://prometheus:9090" not in datasources:
        failures.append("the Grafana datasource must point at http://prometheus:9090")
    used = {t.get("datasource", {}).get("uid") for p in dashboard["panels"]
            for t in [p] + p.get("targets", [])}
    used |= {v.get("datasource", {}).get("uid") for v in dashboard["templating"]["list"]}
    if not used <= uids:
        failures.append(f"dashboard datasource uids {sorted(map(str, used))} are not all "
                        f"provisioned ({sorted(uids)})")
    path = re.search(r"^\s*path:\s*(\S+)", providers, re.M)
    if not path or f"./grafana/dashboards:{path.group(1)}" not in compose:
        failures.append("the dashboards provider's path is not where compose.yaml mounts "
                        "docker/grafana/dashboards")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    if "model" not in variables:
        failures.append("the dashboard needs a `model` template variable")


def dashboard_exprs(dashboard, failures):
    """(title, PromQL) of every panel target, Grafana variables substituted."""
    exprs = []
    for panel in dashboard["panels"]:
        for panel in [panel] + panel.get("panels", []):  # also panels inside collapsed rows
            for target in panel.get("targets", []):
                expr = target.get("expr", "")
                for var, value in SUBSTITUTIONS.items():
                    expr = expr.replace(var, value)
                where = f"panel {panel['title']} [{target.get('refId', '?')}]"
                if not expr:
                    failures.append(f"{where}: no expr")
                elif "$" in expr:
                    failures.append(f"{where}: unknown variable in {expr}")
                else:
                    exprs.append((where, expr))
    return exprs


def live_check(args, work, procs, dashboard, alerts_file, failures):
    deadline = time.monotonic() + BUDGET_S
    server_bin = os.path.join(args.build, "bin", "attention-server")
    client_bin = os.path.join(args.build, "bin", "attention-client")
    for binary in (server_bin, client_bin):
        if not os.access(binary, os.X_OK):
            raise Failure(f"{binary} is missing: build the project first (cmake --build)")

    # The server picks its gRPC port (--port=0) and prints it; the metrics port must be given.
    metrics_port = free_port()
    _, server_log = procs.start("attention-server", [
        server_bin, "--host=127.0.0.1", "--port=0", f"--metrics_port={metrics_port}", "--http_port=0"])

    def grpc_port():
        procs.check_alive()
        with open(server_log, errors="replace") as f:
            m = re.search(r"listening on port (\d+)", f.read())
        return m and m.group(1)
    target = "--server=127.0.0.1:" + wait_for("the server's port", grpc_port, deadline)

    def client(*argv, timeout=30):
        return subprocess.run([client_bin, argv[0], target] + list(argv[1:]),
                              capture_output=True, text=True, timeout=timeout)

    # Prometheus starts while the server loads its model: one config, scraping every second.
    prom_port = free_port()
    config = {  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [alerts_file],
        "scrape_configs": [{"job_name": "attention",
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }
    config_file = os.path.join(work, "prometheus.yml")
    with open(config_file, "w") as f:
        json.dump(config, f, indent=2)
    procs.start("prometheus", [
        "prometheus", f"--config.file={config_file}",
        f"--storage.tsdb.path={os.path.join(work, 'data')}",
        f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
    prom = Prometheus(prom_port)

    def healthy():
        procs.check_alive()
        return client("health", "--deadline_ms=500", timeout=10).returncode == 0
    wait_for("the server to be SERVING", healthy, deadline)
    wait_for("Prometheus to be ready", lambda: procs.check_alive() or prom.ready(), deadline)
    # Load only once Prometheus scrapes the server, so rates see the counters move.
    wait_for("the first scrape", lambda: prom.values('up{job="attention"} == 1'), deadline)
    started = time.monotonic()

    # Load: unary and streaming, mixed lengths so batches pad; then bad requests.
    for rpc, duration in (("unary", "2s"), ("stream", "1s")):
        r = client("load", f"--rpc={rpc}", "--concurrency=4", f"--duration={duration}",
                   "--seq_len=16:64", "--pad_share=0.25")
        if r.returncode != 0:
            raise Failure(f"attention-client load --rpc={rpc} failed:\n{r.stdout}{r.stderr}")
    # Sessions: appends (for the append histogram) and ended sessions.
    r = client("session", "--tokens=24", "--chunk=3")
    if r.returncode != 0:
        raise Failure(f"attention-client session failed:\n{r.stdout}{r.stderr}")
    bad = [("--model=nope", "NOT_FOUND"),   # unknown model: not counted under a model label
           ("--seq_len=0", "INVALID_ARGUMENT")]
    for _ in range(2):
        for flag, code in bad:
            r = client("infer", flag)
            if r.returncode == 0 or code not in r.stderr:
                raise Failure(f"attention-client infer {flag} should fail with {code}: "
                              f"{r.stdout}{r.stderr}")
    # The last bad request reached Prometheus: every sample of this run has been scraped.
    wait_for("Prometheus to scrape the bad requests", lambda: prom.values(
        f'attention_requests_total{{model="{MODEL}",code="INVALID_ARGUMENT"}} >= 2'), deadline)
    # Every rule evaluated (1 s interval) after that scrape.
    scraped_at = time.time()

    def rules_evaluated():
        r = prom.get("/api/v1/rules")
        rules = [rule for g in r.get("data", {}).get("groups", []) for rule in g["rules"]]
        done = all(rule.get("lastEvaluation", "0001")[:4] != "0001" for rule in rules)
        return rules if rules and done and time.time() > scraped_at + 1.5 else None
    rules = wait_for("the alert rules to be evaluated", rules_evaluated, deadline)
    print(f"load sent, scraped and rules evaluated {time.monotonic() - started:.1f} s "
          "after the first scrape")

    # The template variable's values (label_values(...) is Grafana's, not PromQL).
    r = prom.get("/api/v1/label/model/values", {"match[]": "attention_requests_total"})
    if MODEL not in r.get("data", []):
        failures.append(f"label_values(attention_requests_total, model) lacks {MODEL}: {r}")

    # Alert rules: names in alerts.yml must all be loaded; their queries are taken from
    # Prometheus, which parsed the file (no YAML parser in the stdlib).
    with open(alerts_file) as f:
        names = re.findall(r"^\s*-\s*(?:alert|record):\s*(\S+)", f.read(), re.M)
    loaded = [rule["name"] for rule in rules]
    if sorted(names) != sorted(loaded):
        failures.append(f"alerts.yml has rules {sorted(names)}, Prometheus loaded "
                        f"{sorted(loaded)}")
    for rule in rules:
        if rule.get("health") != "ok":
            failures.append(f"rule {rule['name']}: health {rule.get('health')}: "
                            f"{rule.get('lastError')}")

    # Evaluate everything; print a table.
    rows = []
    for where, expr in dashboard_exprs(dashboard, failures):
        rows.append((where, expr, True))
    for rule in rules:
        kind = "alert" if rule["type"] == "alerting" else "record"
        rows.append((f"{kind} {rule['name']}", rule["query"], False))
        measure, op = split_comparison(rule["query"])
        if op:
            rows.append((f"{kind} {rule['name']} (left of {op})", measure, True))
    print(f"\n{'source':<58} {'series':>6}  {'max value':>10}  expression")
    for where, expr, needs_data in rows:
        r = prom.query(expr)
        if r.get("status") != "success":
            print(f"{where:<58} {'ERROR':>6}  {'':>10}  {one_line(expr)}")
            failures.append(f"{where}: {r.get('errorType')}: {r.get('error')}\n    {expr}")
            continue
        result = r["data"]["result"]
        if r["data"]["resultType"] == "scalar":
            result = [{"value": result}]
        values = [float(s["value"][1]) for s in result]
        numbers = [v for v in values if not math.isnan(v)]
        shown = f"{max(numbers):.4g}" if numbers else ("NaN" if values else "-")
        print(f"{where:<58} {len(result):>6}  {shown:>10}  {one_line(expr)}")
        if needs_data and not numbers:
            failures.append(f"{where}: {'only NaN' if values else 'no data'}\n    {expr}")
    firing = [a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["data"]["alerts"]]
    print(f"alerts pending or firing (expected none on a healthy server): {firing or 'none'}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", default=os.path.join(here, "..", ".."))
    parser.add_argument("--build", default=os.path.join(here, "..", "..", "build"))
    args = parser.parse_args()
    args.repo, args.build = os.path.abspath(args.repo), os.path.abspath(args.build)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    start = time.monotonic()

    missing = [tool for tool in ("promtool", "prometheus") if shutil.which(tool) is None]
    if missing:
        message = f"{' and '.join(missing)} not found: install Debian's `prometheus` package"
        if os.environ.get("CI"):
            print("FAIL:", message)
            return 1
        print("SKIP:", message, "(this fails when CI is set)")
        return 0

    failures = []
    run_promtool(args.repo, failures)
    with open(os.path.join(args.repo, "docker", "grafana", "dashboards", "attention.json")) as f:
        dashboard = json.load(f)
    check_grafana_files(args.repo, dashboard, failures)

    work = tempfile.mkdtemp(prefix="attention-monitoring-")
    procs = Processes(work)
    try:
        live_check(args, work, procs, dashboard,
                   os.path.join(args.repo, "docker", "prometheus", "alerts.yml"), failures)
    except Failure as e:
        failures.append(str(e))
        for name, _, log in procs.procs:
            print(f"--- last lines of {name}'s log:\n{procs.tail(log)}")
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)

    for failure in failures:
        print("FAIL:", failure)
    print(f"monitoring: {'ok' if not failures else f'{len(failures)} problem(s)'} "
          f"in {time.monotonic() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
