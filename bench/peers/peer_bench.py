#!/usr/bin/env python3
"""Peer benchmark: ONNX Runtime and PyTorch on the engine's self-attention shapes, same weights.

Run with Debian's interpreter (python3-torch, python3-onnx, python3-numpy), after
`npm ci` in bench/peers (onnxruntime-node):

    /usr/bin/python3 bench/peers/peer_bench.py                        # default shapes, ~6 min
    /usr/bin/python3 bench/peers/peer_bench.py --quick                # fewer iterations
    /usr/bin/python3 bench/peers/peer_bench.py --shapes 1x128x768x12,1x4096x256x8c \\
        --iterations 20 --engine build/bin/attention-core-bench --json out.json

Shapes are NxLxExH (self-attention, batch_first); a trailing 'c' means causal. Per shape, one
after another, each in its own subprocess so nothing competes for the cores:

  torch   torch.nn.MultiheadAttention (torch.manual_seed(0)), eval, torch.inference_mode,
          need_weights=False (its fast path; causal needs attn_mask, which takes the slow path),
          with torch.set_num_threads(1) (OpenBLAS keeps its own threads) and with 2; the faster
          is reported. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from its environment
          (this machine's environment sets them and they keep OpenBLAS off AVX-512).
  ORT     onnxruntime-node (CPU EP) on a hand-built graph around ORT's contrib attention op
          (onnx_graphs.py), intraOpNumThreads 1 and 2, graph optimisation "all"; the fastest
          graph/thread configuration is reported. Its output is checked against torch's.
  engine  <engine> --model <dir> --batch N --seq_len L --threads 2 --dtype float32|bfloat16
          --iterations K --json, on a model directory exported from the same torch layer
          (scripts/export_torch_mha.py). Optional: without --engine (or if it fails) the
          peers are still printed.

Every system times the same K iterations after warmup (K from --iterations, lowered for large
shapes to keep the run short); medians and minimums are of wall time per call. GFLOP/s =
(8*N*L*E^2 + 4*N*L^2*E) / median. Ratios are engine GFLOP/s over peer GFLOP/s (= peer ms /
engine ms; > 1 means the engine is faster).
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
WEIGHT_SEED = 0
INPUT_SEED = 1


def flops(n, l, e):
    """Self-attention: 8NLE^2 for the four projections, 4NL^2E for the two products."""
    return 8 * n * l * e * e + 4 * n * l * l * e


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        causal = item.endswith("c")
        n, l, e, h = (int(x) for x in item.rstrip("c").split("x"))
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
    """Writes, per shape: the model directory (config.json + model.safetensors), x.bin and
    the ONNX graphs. Weights: torch.manual_seed(0) then nn.MultiheadAttention(E, H)."""
    import numpy as np
    import onnx
    import torch
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.path.insert(0, HERE)
    from export_torch_mha import export_mha
    import onnx_graphs

    spec = json.load(open(spec_path))
    for item in spec["shapes"]:
        s = item["shape"]
        torch.manual_seed(WEIGHT_SEED)
        mha = torch.nn.MultiheadAttention(s["e"], s["h"], batch_first=True).eval()
        if not os.path.exists(os.path.join(item["model_dir"], "config.json")):
            export_mha(mha, item["model_dir"], force=True)
        state = {k: v.detach().numpy() for k, v in mha.state_dict().items()}
        for variant, path in item["onnx"].items():
            onnx.save(onnx_graphs.build(variant, state, s["h"], s["causal"]), path)
        gen = torch.Generator().manual_seed(INPUT_SEED)
        x = torch.randn(s["n"], s["l"], s["e"], generator=gen)
        x.numpy().astype("<f4").tofile(item["input"])
    print(json.dumps({"torch": torch.__version__, "onnx": onnx.__version__,
                      "numpy": np.__version__}))


def worker_torch(args):
    """Times nn.MultiheadAttention at each --threads value; prints one JSON line per config
    and writes the output of the first configuration to --output."""
    import numpy as np
    import torch
    n, l, e, h = (int(x) for x in args.shape.split(","))
    causal = args.causal
    torch.manual_seed(WEIGHT_SEED)
    mha = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
    x = torch.from_numpy(np.fromfile(args.input, dtype="<f4").reshape(n, l, e).copy())
    mask = torch.triu(torch.full((l, l), float("-inf")), diagonal=1) if causal else None
    wrote = False
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        times = []
        with torch.inference_mode():
            for i in range(args.warmup + args.iterations):
                t0 = time.perf_counter()
                y = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
                if i >= args.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
        if not wrote and args.output:
            y.contiguous().numpy().astype("<f4").tofile(args.output)
            wrote = True
        print(json.dumps({"system": "torch", "version": torch.__version__, "threads": threads,
                          "iterations": args.iterations, "warmup": args.warmup,
                          "median_ms": statistics.median(times), "min_ms": min(times),
                          "fast_path": not causal}), flush=True)


# ---------------------------------------------------------------------------------------------
# Driver.

def run_json_lines(cmd, env=None, timeout=None):
    """Runs cmd; returns (list of JSON objects from stdout, error string or None)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], str(e)
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
        return objs, f"exit {p.returncode}: {tail}"
    if not objs:
        return objs, "no JSON on stdout"
    return objs, None


def max_abs_diff(path_a, path_b):
    import numpy as np
    a = np.fromfile(path_a, dtype="<f4")
    b = np.fromfile(path_b, dtype="<f4")
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def iterations_for(s, args):
    """Same K for every system: --iterations, fewer when one call is long (budget per config)."""
    est_s = flops(s["n"], s["l"], s["e"]) / (args.assumed_gflops * 1e9)
    if s["causal"]:
        est_s *= 1.5  # torch's and ORT's causal paths are unfused and masked.
    k = int(args.budget_s / est_s) if est_s > 0 else args.iterations
    k = max(args.min_iterations, min(args.iterations, k))
    warmup = 1 if est_s > 0.5 else (2 if est_s > 0.05 else 3)
    return k, warmup


def engine_supports(engine, flag):
    try:
        out = subprocess.run([engine, "--help"], capture_output=True, text=True, timeout=30)
        return f"--{flag} " in out.stdout + out.stderr or f"--{flag}=" in out.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def fmt(v, spec=".3f", none="—"):
    return none if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="NxLxExH,... self-attention; trailing 'c' = causal (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=None,
                   help="timed iterations per system and shape (default 30; --quick 8); "
                        "lowered for long calls, see --budget_s")
    p.add_argument("--quick", action="store_true", help="fewer iterations and a smaller budget")
    p.add_argument("--budget_s", type=float, default=None,
                   help="target timed seconds per system configuration and shape (default 3; "
                        "--quick 1); K = clamp(budget / estimated call time)")
    p.add_argument("--min_iterations", type=int, default=None, help="default 5; --quick 3")
    p.add_argument("--assumed_gflops", type=float, default=100.0,
                   help="rate used only to estimate call time for K (default %(default)s)")
    p.add_argument("--engine", default="auto",
                   help="attention-core-bench binary for the engine columns; 'auto' (default): "
                        "build/bin/attention-core-bench if it exists; 'none': peers only")
    p.add_argument("--engine_threads", type=int, default=2)
    p.add_argument("--engine_dtypes", default="float32,bfloat16")
    p.add_argument("--torch_threads", default="1,2", help="torch.set_num_threads values tried")
    p.add_argument("--ort_threads", default="1,2", help="intraOpNumThreads values tried")
    p.add_argument("--ort_graph", default="auto",
                   help="mha, attention or auto (time both, report the faster); see onnx_graphs.py")
    p.add_argument("--no_torch", action="store_true")
    p.add_argument("--no_ort", action="store_true")
    p.add_argument("--json", help="write the results as JSON to this file")
    p.add_argument("--workdir", help="keep the model directories, inputs, ONNX graphs and "
                                     "outputs here (default: a temporary directory, removed)")
    p.add_argument("--node", default=shutil.which("node") or "/usr/bin/node")
    p.add_argument("--worker", choices=["prepare", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--output", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker == "prepare":
        return worker_prepare(args.spec)
    if args.worker == "torch":
        return worker_torch(args)

    if args.iterations is None:
        args.iterations = 8 if args.quick else 30
    if args.budget_s is None:
        args.budget_s = 1.0 if args.quick else 3.0
    if args.min_iterations is None:
        args.min_iterations = 3 if args.quick else 5
    args.min_iterations = min(args.min_iterations, args.iterations)
    shapes = parse_shapes(args.shapes)
    if args.ort_graph == "auto":
        ort_variants = ["mha", "attention"]
    else:
        ort_variants = args.ort_graph.split(",")
    ort_js = os.path.join(HERE, "ort_run.js")
    if not args.no_ort and not os.path.isdir(os.path.join(HERE, "node_modules", "onnxruntime-node")):
        sys.exit(f"onnxruntime-node is not installed: (cd {os.path.relpath(HERE)} && npm ci) "
                 f"(or pass --no_ort)")

    engine, engine_note = args.engine, None
    if engine == "auto":
        engine = DEFAULT_ENGINE if os.path.isfile(DEFAULT_ENGINE) else None
    elif engine == "none":
        engine = None
    if engine and not os.path.isfile(engine):
        engine_note = f"engine {engine} not found: engine columns empty"
        engine = None
    engine_causal = engine and engine_supports(engine, "is_causal")

    workdir = args.workdir or tempfile.mkdtemp(prefix="peer_bench.")
    os.makedirs(workdir, exist_ok=True)
    py = sys.executable
    torch_env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_UNSET}
    t_start = time.time()
    load_start = loadavg()

    # Weights, inputs and ONNX graphs, once.
    items = []
    for s in shapes:
        name = shape_name(s)
        items.append({
            "shape": s,
            "model_dir": os.path.join(workdir, f"model_E{s['e']}_H{s['h']}"),
            "input": os.path.join(workdir, f"x_{name}.bin"),
            "onnx": {v: os.path.join(workdir, f"ort_{v}_E{s['e']}_H{s['h']}"
                                              f"{'_causal' if s['causal'] else ''}.onnx")
                     for v in ort_variants},
        })
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump({"shapes": items}, f)
    versions, err = run_json_lines([py, __file__, "--worker", "prepare", "--spec", spec_path],
                                   env=torch_env)
    if err:
        sys.exit(f"prepare failed: {err}")
    versions = versions[0]

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load average {fmt(load_start, '.2f')}"
          f" at start")
    print(f"torch {versions['torch']} (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for its "
          f"subprocess; was {', '.join(f'{k}={os.environ[k]}' for k in OPENBLAS_UNSET if k in os.environ) or 'not set'}); "
          f"onnxruntime-node (CPU EP), graphs: {', '.join(ort_variants)}; "
          f"engine: {engine or 'not run'}", flush=True)

    rows = []
    for item in items:
        s = item["shape"]
        n, l, e, h = s["n"], s["l"], s["e"], s["h"]
        k, warmup = iterations_for(s, args)
        fl = flops(n, l, e)
        row = {"shape": dict(s, name=shape_name(s)), "flops": fl, "iterations": k,
               "warmup": warmup, "torch": None, "ort": None, "engine": {}}
        gf = lambda ms: fl / (ms * 1e-3) / 1e9  # noqa: E731

        # PyTorch: the reference output.
        ref = os.path.join(workdir, f"y_torch_{shape_name(s)}.bin")
        if not args.no_torch:
            cmd = [py, __file__, "--worker", "torch", "--shape", f"{n},{l},{e},{h}",
                   "--threads", args.torch_threads, "--iterations", str(k),
                   "--warmup", str(warmup), "--input", item["input"], "--output", ref]
            if s["causal"]:
                cmd.append("--causal")
            configs, err = run_json_lines(cmd, env=torch_env)
            for c in configs:
                c["gflops"] = gf(c["median_ms"])
            best = min(configs, key=lambda c: c["median_ms"]) if configs else None
            row["torch"] = {"best": best, "configs": configs, "error": err}

        # ONNX Runtime: every graph variant x thread count; the fastest is its column.
        if not args.no_ort:
            configs, errors = [], []
            for variant in ort_variants:
                for threads in args.ort_threads.split(","):
                    out = os.path.join(workdir, f"y_ort_{variant}_{threads}t_{shape_name(s)}.bin")
                    cmd = [args.node, ort_js, "--model", item["onnx"][variant], "--input",
                           item["input"], "--shape", f"{n},{l},{e}", "--threads", threads,
                           "--iterations", str(k), "--warmup", str(warmup), "--output", out]
                    res, err = run_json_lines(cmd)
                    if err:
                        errors.append(f"{variant} {threads}t: {err}")
                        continue
                    c = res[0]
                    c["graph"] = variant
                    c["gflops"] = gf(c["median_ms"])
                    if os.path.exists(ref):
                        c["max_abs_diff"] = max_abs_diff(out, ref)
                        c["correct"] = c["max_abs_diff"] <= TOLERANCE
                    os.remove(out)
                    configs.append(c)
            ok = [c for c in configs if c.get("correct", True)]
            best = min(ok, key=lambda c: c["median_ms"]) if ok else None
            row["ort"] = {"best": best, "configs": configs, "error": "; ".join(errors) or None}

        # The engine, on the exported model directory.
        if engine and (not s["causal"] or engine_causal):
            for dtype in args.engine_dtypes.split(","):
                cmd = [engine, "--model", item["model_dir"], "--batch", str(n), "--seq_len",
                       str(l), "--threads", str(args.engine_threads), "--dtype", dtype,
                       "--iterations", str(k), "--json"]
                if s["causal"]:
                    cmd.append("--is_causal")
                res, err = run_json_lines(cmd)
                r = res[0] if res else {}
                if "median_ms" in r:
                    r["gflops_calc"] = gf(r["median_ms"])
                row["engine"][dtype] = {"result": r or None, "error": err, "command": cmd}
        elif engine and s["causal"]:
            row["engine_note"] = "engine has no --is_causal flag"

        if os.path.exists(ref):
            os.remove(ref)
        rows.append(row)
        print(f"  done {shape_label(s)}: K={k} ({time.time() - t_start:.0f} s)",
              file=sys.stderr, flush=True)

    load_end = loadavg()
    print_table(rows, args, engine)
    if engine_note:
        print(f"\nnote: {engine_note}")
    print(f"\nload average {fmt(load_start, '.2f')} at start, {fmt(load_end, '.2f')} at end"
          f"{' (something else was running: numbers are noisy)' if (load_start or 0) > 0.7 else ''};"
          f" {time.time() - t_start:.0f} s")

    if args.json:
        doc = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                           "loadavg_start": load_start, "loadavg_end": load_end},
               "versions": versions, "engine": engine,
               "settings": {"iterations": args.iterations, "budget_s": args.budget_s,
                            "torch_threads": args.torch_threads, "ort_threads": args.ort_threads,
                            "ort_graphs": ort_variants, "engine_threads": args.engine_threads,
                            "tolerance": TOLERANCE, "weight_seed": WEIGHT_SEED,
                            "input_seed": INPUT_SEED, "openblas_unset_for_torch": OPENBLAS_UNSET},
               "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


def print_table(rows, args, engine):
    dtypes = args.engine_dtypes.split(",") if engine else []
    short = {"float32": "f32", "bfloat16": "bf16"}
    head = ["N x L x E, H", "K", "torch ms", "torch GF/s", "ORT ms", "ORT GF/s", "ORT max|Δ|"]
    for d in dtypes:
        head += [f"engine {short.get(d, d)} ms", f"{short.get(d, d)} GF/s",
                 f"{short.get(d, d)}/ORT", f"{short.get(d, d)}/torch"]
    extra = engine and any(
        any(k in ((v or {}).get("result") or {}) for k in ("path", "minor_faults_per_call",
                                                           "peak_gflops"))
        for r in rows for v in r["engine"].values())
    if extra:
        head.append("engine notes")
    head.append("configs (torch threads; ORT graph, threads)")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    notes = []
    for r in rows:
        t = (r["torch"] or {}).get("best")
        o = (r["ort"] or {}).get("best")
        cells = [shape_label(r["shape"]), str(r["iterations"]),
                 fmt(t and t["median_ms"]), fmt(t and t["gflops"], ".1f"),
                 fmt(o and o["median_ms"]), fmt(o and o["gflops"], ".1f"),
                 fmt(o and o.get("max_abs_diff"), ".1e")]
        enotes = []
        for d in dtypes:
            res = (r["engine"].get(d) or {}).get("result") or {}
            ms = res.get("median_ms")
            cells += [fmt(ms), fmt(res.get("gflops_calc"), ".1f"),
                      fmt(o and ms and o["median_ms"] / ms, ".2f") + ("x" if o and ms else ""),
                      fmt(t and ms and t["median_ms"] / ms, ".2f") + ("x" if t and ms else "")]
            bits = []
            if "path" in res:
                bits.append(f"path {res['path']}")
            if "minor_faults_per_call" in res:
                bits.append(f"{res['minor_faults_per_call']:.3g} faults/call")
            if res.get("peak_gflops"):
                bits.append(f"{100 * res['gflops_calc'] / res['peak_gflops']:.0f}% of "
                            f"{res['peak_gflops']:.0f} GF/s peak")
            if bits:
                enotes.append(f"{short.get(d, d)}: " + ", ".join(bits))
            err = (r["engine"].get(d) or {}).get("error")
            if err:
                notes.append(f"{shape_label(r['shape'])}: engine {d} failed: {err}")
        if extra:
            cells.append("; ".join(enotes) or "—")
        cfg = []
        if t:
            cfg.append(f"torch {t['threads']}t" + ("" if t.get("fast_path") else " (slow path)"))
        if o:
            cfg.append(f"ORT {o['graph']} {o['threads']}t")
        cells.append("; ".join(cfg))
        print("| " + " | ".join(cells) + " |", flush=True)
        for name in ("torch", "ort"):
            part = r[name] or {}
            if part.get("error"):
                notes.append(f"{shape_label(r['shape'])}: {name}: {part['error']}")
        for c in (r["ort"] or {}).get("configs", []):
            if c.get("correct") is False:
                notes.append(f"{shape_label(r['shape'])}: ORT {c['graph']} {c['threads']}t "
                             f"output differs from torch by {c['max_abs_diff']:.2e} "
                             f"(> {TOLERANCE}): excluded")
        if r.get("engine_note"):
            notes.append(f"{shape_label(r['shape'])}: {r['engine_note']}")
    print()
    print("ms = median wall time per call over K timed calls (after warmup); GF/s from "
          "8NLE^2 + 4NL^2E; x/ORT, x/torch = engine speed over the peer's (peer ms / engine ms). "
          "ORT max|Δ| = max abs difference of ORT's output from torch's (tolerance "
          f"{TOLERANCE:g}). Per-configuration timings (all thread counts, both ORT graphs, "
          "min_ms) are in --json.")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
