#!/usr/bin/env python3
"""Peer benchmark: ONNX Runtime and PyTorch on the engine's self-attention shapes, same weights.

Run with Debian's interpreter (python3-torch, python3-onnx, python3-numpy), after
`npm ci` in bench/peers (onnxruntime-node):

    /usr/bin/python3 bench/peers/peer_bench.py                        # default shapes
    /usr/bin/python3 bench/peers/peer_bench.py --quick                # fewer iterations
    /usr/bin/python3 bench/peers/peer_bench.py --shapes 1x128x768x12,1x4096x256x8c \\
        --iterations 20 --engine build/bin/attention-core-bench --json out.json

Shapes are NxLxExH (self-attention, batch_first); a trailing 'c' means causal. Per shape, one
after another, each in its own subprocess so nothing competes for the cores:

  torch   torch.nn.MultiheadAttention (torch.manual_seed(0)), eval, torch.inference_mode,
          need_weights=False (its fast path; causal needs attn_mask, which takes the slow path),
          with torch.set_num_threads(1) (OpenBLAS keeps its own threads) and with 2; the faster
          is reported. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from its environment
          (this machine's environment sets them and they keep OpenBLAS off AVX-512). Before
          timing it allocates and frees a 30 MiB tensor, which raises glibc's dynamic mmap
          threshold to its cap as in any long-running process; otherwise every call mmaps and
          page-faults its temporaries (1x128x768: 3x slower).
  ORT     onnxruntime-node (CPU EP) on hand-built graphs around ORT's attention ops
          (onnx_graphs.py), intraOpNumThreads 1 and 2, graph optimisation "all"; the fastest
          graph/thread configuration whose output matches torch's (max abs diff <= 1e-4) is
          reported.
  engine  <engine> --model <dir> --batch N --seq_len L --threads 2 --dtype float32|bfloat16
          --iterations K --json, on a model directory exported from the same torch layer
          (scripts/export_torch_mha.py). If the engine is missing or fails, the peers are still
          printed.

Iterations: each configuration runs warmup calls, then up to --iterations timed calls, stopping
early (after at least --min_iterations) once --budget_s seconds of timed calls have passed. The
engine's K is chosen the same way from ORT's median. Medians and minimums are of wall time per
call. GFLOP/s = (8*N*L*E^2 + 4*N*L^2*E) / median. Ratios are engine GFLOP/s over the peer's
(= peer ms / engine ms; > 1 means the engine is faster). CPU time used by other processes while
each configuration ran is measured (/proc/stat minus our child's rusage) and flagged.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DEFAULT_SHAPES = "1x32x256x8,1x128x768x12,8x256x512x8,8x512x1024x16,1x4096x256x8," \
                 "1x16384x256x8,1x4096x256x8c"
DEFAULT_ENGINE = os.path.join(ROOT, "build", "bin", "attention-core-bench")
OPENBLAS_UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
TOLERANCE = 1e-4
# int8 graphs (ORT's dynamic quantization) differ from torch's float output by the quantization:
# they count when max|Δ| / max|torch| stays within this.
INT8_TOLERANCE = 0.05
INT8_GRAPHS = ("mha_int8", "qattention")
WEIGHT_SEED = 0
INPUT_SEED = 1
BACKGROUND_WARN = 0.05  # share of the machine's CPU time used by other processes ...
BACKGROUND_WARN_S = 0.2  # ... and at least this much CPU time (jiffies make short runs coarse)


def flops(n, l, e):
    """Self-attention: 8NLE^2 for the four projections, 4NL^2E for the two products."""
    return 8 * n * l * e * e + 4 * n * l * l * e


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        causal = item.endswith("c")
        try:
            n, l, e, h = (int(x) for x in item.rstrip("c").split("x"))
        except ValueError:
            raise SystemExit(f"bad shape '{item}': want NxLxExH, optionally with a trailing c")
        if e % h:
            raise SystemExit(f"shape {item}: E={e} is not a multiple of H={h}")
        shapes.append({"n": n, "l": l, "e": e, "h": h, "causal": causal})
    return shapes


def shape_name(s):
    return f"{s['n']}x{s['l']}x{s['e']}x{s['h']}{'c' if s['causal'] else ''}"


def shape_label(s):
    return f"{s['n']} x {s['l']} x {s['e']}, {s['h']}{' causal' if s['causal'] else ''}"


# ---------------------------------------------------------------------------------------------
# Workers (run as `peer_bench.py --worker prepare|torch ...` in a subprocess).

def worker_prepare(spec_path):
    """Writes, per shape: the model directories (config.json + model.safetensors; float32
    weights, one directory per engine compute_dtype), x.bin and the ONNX graphs. Weights:
    torch.manual_seed(0) then nn.MultiheadAttention(E, H)."""
    import numpy as np
    import onnx
    import torch
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.path.insert(0, HERE)
    from export_torch_mha import export_mha
    import onnx_graphs

    with open(spec_path) as f:
        spec = json.load(f)
    for item in spec["shapes"]:
        s = item["shape"]
        torch.manual_seed(WEIGHT_SEED)
        mha = torch.nn.MultiheadAttention(s["e"], s["h"], batch_first=True).eval()
        for compute_dtype, model_dir in item["model_dirs"].items():
            if not os.path.exists(os.path.join(model_dir, "config.json")):
                export_mha(mha, model_dir, compute_dtype=compute_dtype, force=True)
        state = {k: v.detach().numpy() for k, v in mha.state_dict().items()}
        for variant, path in item["onnx"].items():
            onnx.save(onnx_graphs.build(variant, state, s["h"], s["causal"]), path)
        gen = torch.Generator().manual_seed(INPUT_SEED)
        x = torch.randn(s["n"], s["l"], s["e"], generator=gen)
        x.numpy().astype("<f4").tofile(item["input"])
    print(json.dumps({"torch": torch.__version__, "onnx": onnx.__version__,
                      "numpy": np.__version__}))


def worker_torch(args):
    """Times nn.MultiheadAttention at one thread count; prints one JSON line and writes the
    output to --output."""
    import numpy as np
    import torch
    if args.malloc_warmup_mib > 0:  # See the module docstring.
        t = torch.empty(int(args.malloc_warmup_mib * 262144))
        t.fill_(0)
        del t
    n, l, e, h = (int(x) for x in args.shape.split(","))
    threads = int(args.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(WEIGHT_SEED)
    mha = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
    x = torch.from_numpy(np.fromfile(args.input, dtype="<f4").reshape(n, l, e).copy())
    mask = torch.triu(torch.full((l, l), float("-inf")), diagonal=1) if args.causal else None
    times, spent = [], 0.0
    with torch.inference_mode():
        for _ in range(args.warmup):
            y = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
        for i in range(args.iterations):
            if i >= args.min_iterations and spent >= args.budget_s:
                break
            t0 = time.perf_counter()
            y = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
            times.append(time.perf_counter() - t0)
            spent += times[-1]
    if args.output:
        y.contiguous().numpy().astype("<f4").tofile(args.output)
    print(json.dumps({"system": "torch", "version": torch.__version__, "threads": threads,
                      "iterations": len(times), "warmup": args.warmup,
                      "median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
                      "fast_path": not args.causal}), flush=True)


# ---------------------------------------------------------------------------------------------
# Driver.

def _cpu_busy_ticks():
    """Busy and total jiffies of the whole machine (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal
    return busy, busy + v[3] + v[4]


def wait_idle(max_s, threshold=BACKGROUND_WARN):
    """Waits (up to max_s) until the machine's busy share over 0.5 s is below threshold."""
    deadline = time.time() + max_s
    while time.time() < deadline:
        a = _cpu_busy_ticks()
        time.sleep(0.5)
        b = _cpu_busy_ticks()
        if a is None or b is None or b[1] == a[1]:
            return
        if (b[0] - a[0]) / (b[1] - a[1]) < threshold:
            return


class Runner:
    def __init__(self, args):
        self.wait_idle = args.wait_idle
        self.retries = args.retry_noisy
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def run(self, cmd, env=None):
        """run_once, repeated up to --retry_noisy times while other processes were busy; keeps
        the attempt during which they used the least CPU."""
        best = None
        for attempt in range(1 + self.retries):
            result = self.run_once(cmd, env)
            if result[1] is None and result[2]:
                result[2]["attempt"] = attempt + 1
            if best is None or (result[1] is None and (
                    best[1] is not None or (result[2] or {}).get("share", 0) <
                    (best[2] or {}).get("share", 0))):
                best = result
            if result[1] is not None or not busy(result[2]):
                break
        return best

    def run_once(self, cmd, env=None):
        """Runs cmd; returns (JSON objects from stdout, error or None, background): background
        is the CPU time other processes used while it ran (cpu_s; share = over wall time x
        cores), from /proc/stat minus this child's rusage (10 ms jiffies: coarse)."""
        if self.wait_idle > 0:
            wait_idle(self.wait_idle)
        t0, s0, c0 = time.time(), _cpu_busy_ticks(), os.times()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        except OSError as e:
            return [], str(e), None
        t1, s1, c1 = time.time(), _cpu_busy_ticks(), os.times()
        background = None
        if s0 and s1 and s1[1] > s0[1]:
            child = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
            other = max(0.0, (s1[0] - s0[0]) / self.hz - child)
            background = {"cpu_s": round(other, 3),
                          "share": round(other / ((t1 - t0) * (os.cpu_count() or 1)), 4)}
        objs = []
        for line in p.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    objs.append(json.loads(line))
                except ValueError:
                    pass
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            return objs, f"exit {p.returncode}: {tail}", background
        if not objs:
            return objs, "no JSON on stdout", background
        return objs, None, background


def max_abs_diff(path_a, path_b, scaled=False):
    """max |a - b|, or with `scaled` max |a - b| / max |b|."""
    import numpy as np
    a = np.fromfile(path_a, dtype="<f4")
    b = np.fromfile(path_b, dtype="<f4")
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    d = float(np.max(np.abs(a - b)))
    return d / max(float(np.max(np.abs(b))), 1e-30) if scaled else d


def loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def warmup_for(est_s):
    return 1 if est_s > 0.5 else (2 if est_s > 0.05 else 3)


def engine_iterations(est_s, args):
    k = int(args.budget_s / est_s) + 1 if est_s > 0 else args.iterations
    return max(args.min_iterations, min(args.iterations, k))


def engine_supports(engine, flag):
    try:
        out = subprocess.run([engine, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return f"--{flag} " in text or f"--{flag}=" in text or f"--{flag}\n" in text


def busy(background):
    """A warning if other processes took a noticeable share of the CPU, else None."""
    if background and background["share"] > BACKGROUND_WARN and \
            background["cpu_s"] > BACKGROUND_WARN_S:
        return (f"other processes used {100 * background['share']:.0f}% of the CPU "
                f"({background['cpu_s']:.1f} CPU s) while it ran: noisy")
    return None


def fmt(v, spec=".3f", none="—"):
    return none if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="NxLxExH,... self-attention; trailing 'c' = causal (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=None,
                   help="at most this many timed calls per configuration (default 30; --quick 10)")
    p.add_argument("--min_iterations", type=int, default=None,
                   help="at least this many (default 3; --quick 2)")
    p.add_argument("--budget_s", type=float, default=None,
                   help="stop timing a configuration after this many seconds of calls, once "
                        "--min_iterations are done (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true", help="fewer iterations, smaller budget")
    p.add_argument("--assumed_gflops", type=float, default=100.0,
                   help="rate used only to pick warmup counts (default %(default)s)")
    p.add_argument("--engine", default="auto",
                   help="attention-core-bench binary for the engine columns; 'auto' (default): "
                        "build/bin/attention-core-bench if it exists; 'none': peers only")
    p.add_argument("--engine_threads", type=int, default=2)
    p.add_argument("--engine_dtypes", default="float32,bfloat16")
    p.add_argument("--engine_extra_args", default="",
                   help="more engine flags, e.g. '--peak' (its FMA-loop peak: a %% of peak note)")
    p.add_argument("--torch_threads", default="1,2", help="torch.set_num_threads values tried")
    p.add_argument("--torch_malloc_warmup_mib", type=float, default=30.0,
                   help="tensor allocated and freed before timing torch (0: none)")
    p.add_argument("--ort_threads", default="1,2", help="intraOpNumThreads values tried")
    p.add_argument("--ort_graph", default="auto",
                   help="comma list of mha, attention, onnx23; 'auto' = mha,attention (the two "
                        "contrib ops); 'all' = all three (see onnx_graphs.py)")
    p.add_argument("--ort_int8_graph", default="auto",
                   help="comma list of ORT's int8 graphs (mha_int8, qattention: dynamic "
                        "quantization, see onnx_graphs.py), the peer of the engine's int8; 'auto' "
                        "= both when int8 is among --engine_dtypes; 'none'")
    p.add_argument("--no_torch", action="store_true")
    p.add_argument("--no_ort", action="store_true")
    p.add_argument("--wait_idle", type=float, default=0.0,
                   help="before each configuration wait up to this many seconds for the machine "
                        "to be idle (< 5%% busy over 0.5 s); default 0 = don't wait")
    p.add_argument("--retry_noisy", type=int, default=0,
                   help="rerun a configuration up to this many times while other processes "
                        "took > 5%% of the CPU during it; keep the quietest attempt (default 0)")
    p.add_argument("--json", help="write the results as JSON to this file")
    p.add_argument("--workdir", help="keep the model directories, inputs and ONNX graphs here "
                                     "(default: a temporary directory, removed at the end)")
    p.add_argument("--node", default=shutil.which("node") or "/usr/bin/node")
    p.add_argument("--worker", choices=["prepare", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--malloc_warmup_mib", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--output", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.iterations is None:
        args.iterations = 10 if args.quick else 30
    if args.budget_s is None:
        args.budget_s = 1.0 if args.quick else 3.0
    if args.min_iterations is None:
        args.min_iterations = 2 if args.quick else 3
    args.min_iterations = max(1, min(args.min_iterations, args.iterations))

    if args.worker == "prepare":
        return worker_prepare(args.spec)
    if args.worker == "torch":
        return worker_torch(args)

    return drive(args)


def drive(args):
    shapes = parse_shapes(args.shapes)
    graphs = {"auto": "mha,attention", "all": "mha,attention,onnx23"}.get(args.ort_graph,
                                                                          args.ort_graph)
    ort_variants = [v for v in graphs.split(",") if v]
    engine_dtypes = [d for d in args.engine_dtypes.split(",") if d]
    int8_graphs = {"auto": ",".join(INT8_GRAPHS) if "int8" in engine_dtypes else "",
                   "none": ""}.get(args.ort_int8_graph, args.ort_int8_graph)
    ort_int8_variants = [v for v in int8_graphs.split(",") if v]
    ort_js = os.path.join(HERE, "ort_run.js")
    if not args.no_ort and not os.path.isdir(os.path.join(HERE, "node_modules",
                                                          "onnxruntime-node")):
        sys.exit(f"onnxruntime-node is not installed: (cd {os.path.relpath(HERE)} && npm ci) "
                 f"(or pass --no_ort)")

    engine, notes = args.engine, []
    if engine == "auto":
        engine = DEFAULT_ENGINE if os.path.isfile(DEFAULT_ENGINE) else None
    elif engine == "none":
        engine = None
    if engine and not os.path.isfile(engine):
        notes.append(f"engine {engine} not found: no engine columns")
        engine = None
    engine_causal = bool(engine) and engine_supports(engine, "is_causal")
    engine_extra = args.engine_extra_args.split()

    workdir = args.workdir or tempfile.mkdtemp(prefix="peer_bench.")
    os.makedirs(workdir, exist_ok=True)
    py = sys.executable
    me = os.path.abspath(__file__)
    torch_env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_UNSET}
    runner = Runner(args)
    t_start, load_start = time.time(), loadavg()

    # Weights, inputs and ONNX graphs, once, in a subprocess.
    items = []
    for s in shapes:
        name = shape_name(s)
        items.append({
            "shape": s,
            # attention-core-bench --model takes the compute dtype from config.json (its
            # --dtype only applies to random weights): one directory per dtype, same weights.
            "model_dirs": {d: os.path.join(workdir, f"model_E{s['e']}_H{s['h']}_{d}")
                           for d in engine_dtypes},
            "input": os.path.join(workdir, f"x_{name}.bin"),
            "onnx": {v: os.path.join(workdir, f"ort_{v}_E{s['e']}_H{s['h']}"
                                              f"{'_causal' if s['causal'] else ''}.onnx")
                     for v in ort_variants + ort_int8_variants},
        })
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump({"shapes": items}, f)
    res, err, _ = runner.run([py, me, "--worker", "prepare", "--spec", spec_path], env=torch_env)
    if err:
        sys.exit(f"peer_bench: preparing weights, inputs and graphs failed: {err}")
    versions = res[0]
    ort_version = None

    unset = ", ".join(f"{k}={os.environ[k]}" for k in OPENBLAS_UNSET if k in os.environ)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load average "
          f"{fmt(load_start, '.2f')} at start")
    print(f"torch {versions['torch']}: subprocess without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE "
          f"({'here: ' + unset if unset else 'not set here'}), "
          f"{args.torch_malloc_warmup_mib:g} MiB malloc warmup; ORT graphs: "
          f"{', '.join(ort_variants + ort_int8_variants)}; engine: {engine or 'not run'}",
          flush=True)

    rows = []
    for item in items:
        s = item["shape"]
        n, l, e, h = s["n"], s["l"], s["e"], s["h"]
        fl = flops(n, l, e)
        est_s = fl / (args.assumed_gflops * 1e9) * (1.5 if s["causal"] else 1.0)
        warmup = warmup_for(est_s)
        gf = lambda ms: fl / (ms * 1e-3) / 1e9  # noqa: E731
        row = {"shape": dict(s, name=shape_name(s)), "flops": fl, "warmup": warmup,
               "torch": None, "ort": None, "engine": {}}
        timing = ["--iterations", str(args.iterations), "--min_iterations",
                  str(args.min_iterations), "--budget_s", str(args.budget_s),
                  "--warmup", str(warmup)]

        # PyTorch, one subprocess per thread count; its output is the reference.
        ref = os.path.join(workdir, f"y_torch_{shape_name(s)}.bin")
        if not args.no_torch:
            configs, errors = [], []
            for threads in args.torch_threads.split(","):
                out = os.path.join(workdir, f"y_torch_{threads}t.bin")
                cmd = [py, me, "--worker", "torch", "--shape", f"{n},{l},{e},{h}", "--threads",
                       threads, "--input", item["input"], "--output", out,
                       "--malloc_warmup_mib", str(args.torch_malloc_warmup_mib)] + timing
                if s["causal"]:
                    cmd.append("--causal")
                res, err, bg = runner.run(cmd, env=torch_env)
                if err:
                    errors.append(f"{threads}t: {err}")
                    continue
                c = dict(res[0], gflops=gf(res[0]["median_ms"]), background=bg)
                if not os.path.exists(ref):
                    os.replace(out, ref)
                else:
                    c["max_abs_diff_vs_first"] = max_abs_diff(out, ref)
                    os.remove(out)
                configs.append(c)
            best = min(configs, key=lambda c: c["median_ms"]) if configs else None
            row["torch"] = {"best": best, "configs": configs, "error": "; ".join(errors) or None}

        # ONNX Runtime: every graph x thread count; the fastest correct one is its column (float
        # graphs: "ort"; int8 graphs, the engine int8's peer: "ort_int8").
        def run_ort(variants, int8):
            configs, errors = [], []
            for variant in variants:
                for threads in args.ort_threads.split(","):
                    out = os.path.join(workdir, "y_ort.bin")
                    cmd = [args.node, ort_js, "--model", item["onnx"][variant], "--input",
                           item["input"], "--shape", f"{n},{l},{e}", "--threads", threads,
                           "--output", out] + timing
                    res, err, bg = runner.run(cmd)
                    if err:
                        errors.append(f"{variant} {threads}t: {err}")
                        continue
                    c = dict(res[0], graph=variant, gflops=gf(res[0]["median_ms"]),
                             background=bg)
                    if os.path.exists(ref):
                        c["max_abs_diff"] = max_abs_diff(out, ref)
                        if int8:
                            c["scaled_max_diff"] = max_abs_diff(out, ref, scaled=True)
                        c["correct"] = (c["scaled_max_diff"] <= INT8_TOLERANCE if int8
                                        else c["max_abs_diff"] <= TOLERANCE)
                    os.remove(out)
                    configs.append(c)
            ok = [c for c in configs if c.get("correct", True)]
            best = min(ok, key=lambda c: c["median_ms"]) if ok else None
            version = next((c.get("version") for c in configs if c.get("version")), None)
            return {"best": best, "configs": configs, "error": "; ".join(errors) or None}, version

        if not args.no_ort:
            row["ort"], v = run_ort(ort_variants, int8=False)
            ort_version = v or ort_version
            if ort_int8_variants:
                row["ort_int8"], v = run_ort(ort_int8_variants, int8=True)
                ort_version = v or ort_version

        # The engine, on the exported model directory; K from the closest peer's median.
        if engine and (not s["causal"] or engine_causal):
            peer = (row["ort"] or {}).get("best") or (row["torch"] or {}).get("best")
            k = engine_iterations(peer["median_ms"] / 1e3 if peer else est_s, args)
            for dtype in engine_dtypes:
                cmd = [engine, "--model", item["model_dirs"][dtype], "--batch", str(n),
                       "--seq_len", str(l), "--threads", str(args.engine_threads), "--dtype",
                       dtype, "--iterations", str(k), "--json"] + engine_extra
                if s["causal"]:
                    cmd.append("--is_causal")
                res, err, bg = runner.run(cmd)
                r = dict(res[0]) if res else {}
                if "median_ms" in r:
                    r["gflops_calc"] = gf(r["median_ms"])
                else:
                    err = err or "no median_ms in its JSON"
                if r.get("dtype") not in (None, dtype):
                    err = err or f"asked for {dtype}, it ran {r['dtype']}"
                # ORT's number for the same shape and dtype: its int8 graphs for int8, its
                # float graphs otherwise (ORT has no bfloat16 CPU attention).
                same = (row.get("ort_int8") if dtype == "int8" else row.get("ort")) or {}
                o = same.get("best")
                summary = {"engine_ms": r.get("median_ms"), "path": r.get("path"),
                           "minor_faults_per_call": r.get("minor_faults_per_call"),
                           "peak_gflops": r.get("peak_gflops"),
                           "share_of_peak": (r["gflops_calc"] / r["peak_gflops"]
                                             if r.get("peak_gflops") and "gflops_calc" in r
                                             else None),
                           "ort_dtype": "int8" if dtype == "int8" else "float32",
                           "ort_graph": o and f"{o['graph']} {o['threads']}t",
                           "ort_ms": o and o["median_ms"],
                           "engine_over_ort": (o["median_ms"] / r["median_ms"]
                                               if o and r.get("median_ms") else None)}
                f32 = (row["engine"].get("float32") or {}).get("result") or {}
                if dtype != "float32" and f32.get("median_ms") and r.get("median_ms"):
                    summary["over_engine_float32"] = f32["median_ms"] / r["median_ms"]
                row["engine"][dtype] = {"result": r or None, "error": err, "iterations": k,
                                        "background": bg, "command": " ".join(cmd),
                                        "summary": summary}
        elif engine and s["causal"]:
            row["engine_note"] = "engine has no --is_causal flag: not run"

        if os.path.exists(ref):
            os.remove(ref)
        rows.append(row)
        print(f"  done {shape_label(s)} ({time.time() - t_start:.0f} s)", file=sys.stderr,
              flush=True)

    load_end = loadavg()
    print_table(rows, args, engine, notes)
    print(f"\nload average {fmt(load_start, '.2f')} at start, {fmt(load_end, '.2f')} at end; "
          f"{time.time() - t_start:.0f} s; onnxruntime-node {ort_version or '—'}")

    if args.json:
        doc = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                           "loadavg_start": load_start, "loadavg_end": load_end},
               "versions": dict(versions, onnxruntime=ort_version), "engine": engine,
               "settings": {"iterations": args.iterations, "min_iterations": args.min_iterations,
                            "budget_s": args.budget_s, "torch_threads": args.torch_threads,
                            "torch_malloc_warmup_mib": args.torch_malloc_warmup_mib,
                            "ort_threads": args.ort_threads, "ort_graphs": ort_variants,
                            "ort_int8_graphs": ort_int8_variants,
                            "int8_tolerance_scaled": INT8_TOLERANCE,
                            "engine_threads": args.engine_threads, "tolerance": TOLERANCE,
                            "weight_seed": WEIGHT_SEED, "input_seed": INPUT_SEED,
                            "openblas_unset_for_torch": list(OPENBLAS_UNSET)},
               "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


def print_table(rows, args, engine, notes):
    dtypes = [d for d in args.engine_dtypes.split(",") if d] if engine else []
    short = {"float32": "f32", "bfloat16": "bf16"}
    int8_ort = any(r.get("ort_int8") for r in rows)
    head = ["N x L x E, H", "torch ms", "torch GF/s", "ORT ms", "ORT GF/s", "ORT max\\|Δ\\|"]
    if int8_ort:
        head += ["ORT int8 ms", "ORT int8 scaled \\|Δ\\|"]
    for d in dtypes:
        sd = short.get(d, d)
        peer = "ORT int8" if d == "int8" else "ORT"
        head += [f"engine {sd} ms", f"{sd} GF/s", f"{sd}/{peer}", f"{sd}/torch"]
        if d != "float32" and "float32" in dtypes:
            head.append(f"{sd}/f32")
    extra = any(k in ((v or {}).get("result") or {})
                for r in rows for v in r["engine"].values()
                for k in ("path", "minor_faults_per_call", "peak_gflops"))
    if extra:
        head.append("engine notes")
    head.append("best configs (calls timed)")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        label = shape_label(r["shape"])
        t = (r["torch"] or {}).get("best")
        o = (r["ort"] or {}).get("best")
        o8 = (r.get("ort_int8") or {}).get("best")
        cells = [label, fmt(t and t["median_ms"]), fmt(t and t["gflops"], ".1f"),
                 fmt(o and o["median_ms"]), fmt(o and o["gflops"], ".1f"),
                 fmt(o and o.get("max_abs_diff"), ".1e")]
        if int8_ort:
            cells += [fmt(o8 and o8["median_ms"]), fmt(o8 and o8.get("scaled_max_diff"), ".1e")]
        enotes, cfg = [], []
        if t:
            cfg.append(f"torch {t['threads']}t{'' if t.get('fast_path') else ' slow path'} "
                       f"({t['iterations']})")
        if o:
            cfg.append(f"ORT {o['graph']} {o['threads']}t ({o['iterations']})")
        if o8:
            cfg.append(f"ORT {o8['graph']} {o8['threads']}t ({o8['iterations']})")
        f32_ms = (((r["engine"].get("float32") or {}).get("result") or {}).get("median_ms")
                  if not (r["engine"].get("float32") or {}).get("error") else None)
        for d in dtypes:
            ent = r["engine"].get(d) or {}
            res = {} if ent.get("error") else (ent.get("result") or {})
            ms = res.get("median_ms")
            peer = o8 if d == "int8" else o
            cells += [fmt(ms), fmt(res.get("gflops_calc"), ".1f"),
                      (fmt(peer["median_ms"] / ms, ".2f") + "x") if peer and ms else "—",
                      (fmt(t["median_ms"] / ms, ".2f") + "x") if t and ms else "—"]
            if d != "float32" and "float32" in dtypes:
                cells.append((fmt(f32_ms / ms, ".2f") + "x") if f32_ms and ms else "—")
            bits = []
            if "path" in res:
                bits.append(f"path {res['path']}")
            if "minor_faults_per_call" in res:
                bits.append(f"{res['minor_faults_per_call']:.3g} faults/call")
            if res.get("peak_gflops") and ms:
                bits.append(f"{100 * res['gflops_calc'] / res['peak_gflops']:.0f}% of "
                            f"{res['peak_gflops']:.0f} GF/s f32 FMA peak")
            if bits:
                enotes.append(f"{short.get(d, d)}: " + ", ".join(bits))
            if ent.get("error"):
                notes.append(f"{label}: engine {d} failed: {ent['error']}")
            if ent and ms:
                cfg_k = f"engine {ent['iterations']}"
                if cfg_k not in cfg:
                    cfg.append(cfg_k)
            if busy(ent.get("background")):
                notes.append(f"{label}: engine {d}: {busy(ent['background'])}")
        if extra:
            cells.append("; ".join(enotes) or "—")
        cells.append("; ".join(cfg))
        print("| " + " | ".join(cells) + " |", flush=True)
        for name, title in (("torch", "torch"), ("ort", "ORT"), ("ort_int8", "ORT")):
            part = r.get(name) or {}
            if part.get("error"):
                notes.append(f"{label}: {title}: {part['error']}")
            for c in part.get("configs", []):
                what = f"{title} {c.get('graph', '')} {c['threads']}t".replace("  ", " ")
                if c.get("correct") is False:
                    if "scaled_max_diff" in c:
                        notes.append(f"{label}: {what} output differs from torch's by "
                                     f"{c['scaled_max_diff']:.2e} of its scale "
                                     f"(> {INT8_TOLERANCE:g}): not counted")
                    else:
                        notes.append(f"{label}: {what} output differs from torch's by "
                                     f"{c['max_abs_diff']:.2e} (> {TOLERANCE:g}): not counted")
                if busy(c.get("background")):
                    notes.append(f"{label}: {what}: {busy(c['background'])}")
        if r.get("engine_note"):
            notes.append(f"{label}: {r['engine_note']}")
    print()
    print("ms: median wall time per call (warmup excluded); GF/s: (8NLE^2 + 4NL^2E) / median; "
          "x/ORT, x/torch: engine speed over the peer's (peer ms / engine ms, > 1 = engine "
          "faster; int8 against ORT's int8 graphs, bf16 and f32 against its float ones); "
          "x/f32: over the engine's float32; "
          f"ORT max|Δ|: max abs difference from torch's output (limit {TOLERANCE:g}); ORT int8 "
          f"scaled |Δ|: max|Δ| / max|torch| (limit {INT8_TOLERANCE:g}); "
          "causal rows use the same (full) FLOP count. "
          "Every configuration tried (thread counts, ORT graphs, min_ms) is in --json; each "
          "engine entry's 'summary' has ORT's number for the same dtype, the peak, faults/call "
          "and path.")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
