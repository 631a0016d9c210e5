#!/usr/bin/env python3
"""Peer benchmark of one decode step: ONNX Runtime's GroupQueryAttention over long KV caches.

The engine's decode goal (issue 36): B sessions, each with a C-token float32 cache, decode one
token per step (E=256, H=8). This times ORT 1.30 (onnxruntime-node, CPU EP) doing the same step
on caches of the same size, on a graph of one self-attention layer as ORT runs decoding:

  x (B,1,E) -> MatMul + Add (packed in-projection, W_in^T (E,3E), b_in) -> Split into q, k, v
    -> com.microsoft.GroupQueryAttention(q, k, v, past_key, past_value, seqlens_k,
       total_sequence_length; num_heads = kv_num_heads = H; past/present in BNSH (B,H,*,D))
    -> MatMul + Add (out-projection) -> y (B,1,E)

`--graphs packed` gives GQA the packed (B,1,3E) projection as its query (key and value omitted)
instead of splitting it. seqlens_k (int32, shape (B)) is the total length minus one, i.e. C (C
past tokens plus the new one); total_sequence_length is an int32 scalar, C + 1. ORT 1.30's CPU
GQA runs float32 (float16 too), so GQA itself is the peer: no other op stands in for it.

Two ways of handing ORT the cache (--modes):
  shared    past_key/past_value have room for C + 1 tokens (slot C unused; --spare S adds S more)
            and present_key/present_value are bound to the very same buffers (onnxruntime-node
            pre-allocated outputs aliasing the inputs): GQA sees past == present and appends the
            new token in place (past_present_share_buffer), attending over C + 1 keys and values
            per head without copying the cache. Inputs reach ORT without a copy (the JS buffers
            are wrapped); ort_run.js checks that ORT wrote into them ("alias_written"). Each step
            rewrites slot C, so every timed step sees the same cache.
  unshared  past (B,H,C,D) in, only y fetched: ORT allocates present (B,H,C+1,D) from its arena
            (reused across runs) and the kernel zeroes it and copies the whole past into it every
            step before attending: what decoding without buffer sharing pays.

Two times per configuration: "wall", the median of session.run as JS sees it, and "ort", the
median of ORT's own model_run from its profiler (enableProfiling; also per op type), which leaves
out onnxruntime-node's handling of inputs and outputs. That matters: onnxruntime-node 1.30
copies every fetched output into a fresh JS ArrayBuffer after the run, pre-allocated or not, so a
shared step's wall time includes copying both whole present caches (2 x B x H x (C+1) x D x 4
bytes, into newly faulted pages: "faults/run"); "boundary" = wall - ort. The peer is the fastest
correct configuration by "ort" (the in-process cost, as the engine's own bench measures itself);
its wall time is reported beside it.

Each configuration (mode x graph x intraOpNumThreads 1 and 2) runs in its own ort_run.js process;
y is checked against a float64 NumPy reference of attention over [past ; new] (max |diff| <=
1e-4). Reported per shape: ms per step, tokens/s = B / step, KV GB/s = 2 * B * C * E * 4 bytes /
step (the cache a step must read, as in the issue). --repeats N runs every configuration N times
(the outer loop, so load spreads over all) and reports the median of the N medians.

    /usr/bin/python3 bench/peers/gqa_decode.py                    # 64x2048, 1x2048, 1x16384
    /usr/bin/python3 bench/peers/gqa_decode.py --shapes 64x2048 --repeats 3 --json /tmp/gqa.json
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_bench import HERE, Runner, busy, cpu_model, loadavg  # noqa: E402

TOLERANCE = 1e-4
SEED = 0
MODES = ("shared", "unshared")
GRAPHS = ("split", "packed")


def _init(name, array, dtype=np.float32):
    return numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name)


def build_graph(variant, w_in, b_in, w_out, b_out, heads):
    """One decode-step layer around com.microsoft.GroupQueryAttention (see the module doc)."""
    e = w_out.shape[0]
    d = e // heads
    inits = [_init("w_in_t", w_in.T), _init("b_in", b_in), _init("w_out_t", w_out.T),
             _init("b_out", b_out)]
    nodes = [helper.make_node("MatMul", ["x", "w_in_t"], ["qkv_nb"]),
             helper.make_node("Add", ["qkv_nb", "b_in"], ["qkv"])]
    if variant == "split":
        inits.append(_init("split_sizes", [e, e, e], np.int64))
        nodes.append(helper.make_node("Split", ["qkv", "split_sizes"], ["q", "k", "v"], axis=2))
        qkv_inputs = ["q", "k", "v"]
    elif variant == "packed":
        qkv_inputs = ["qkv", "", ""]
    else:
        raise ValueError(f"unknown graph '{variant}' (one of {GRAPHS})")
    nodes += [
        helper.make_node("GroupQueryAttention",
                         qkv_inputs + ["past_key", "past_value", "seqlens_k",
                                       "total_sequence_length"],
                         ["ctx", "present_key", "present_value"], domain="com.microsoft",
                         num_heads=heads, kv_num_heads=heads),
        helper.make_node("MatMul", ["ctx", "w_out_t"], ["proj"]),
        helper.make_node("Add", ["proj", "b_out"], ["y"]),
    ]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f, ["B", 1, e]),
              helper.make_tensor_value_info("past_key", f, ["B", heads, "P", d]),
              helper.make_tensor_value_info("past_value", f, ["B", heads, "P", d]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("y", f, ["B", 1, e]),
               helper.make_tensor_value_info("present_key", f, ["B", heads, "T", d]),
               helper.make_tensor_value_info("present_value", f, ["B", heads, "T", d])]
    graph = helper.make_graph(nodes, f"gqa_decode_{variant}", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, producer_name="bench/peers",
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference(x, past_k, past_v, w_in, b_in, w_out, b_out, heads):
    """float64 decode step: attention of the new token over [past (C) ; new] per head."""
    b, _, e = x.shape
    d = e // heads
    qkv = x[:, 0, :].astype(np.float64) @ w_in.T.astype(np.float64) + b_in
    q, k, v = (qkv[:, i * e:(i + 1) * e].reshape(b, heads, d) for i in range(3))
    scale = 1.0 / np.sqrt(d)
    s_past = np.einsum("bhd,bhtd->bht", q, past_k, dtype=np.float64) * scale
    s_new = np.einsum("bhd,bhd->bh", q, k)[..., None] * scale
    s = np.concatenate([s_past, s_new], axis=2)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    c = past_k.shape[2]
    ctx = np.einsum("bht,bhtd->bhd", p[..., :c], past_v, dtype=np.float64) + \
        p[..., c:] * v
    return (ctx.reshape(b, e) @ w_out.T.astype(np.float64) + b_out)[:, None, :]


def prepare(workdir, b, c, e, heads, modes, spare=0):
    """Writes the weights' graphs, inputs and the reference for one BxC shape; returns paths."""
    rng = np.random.default_rng(SEED)
    d = e // heads
    w_in = (rng.standard_normal((3 * e, e)) / np.sqrt(e)).astype(np.float32)
    b_in = (0.1 * rng.standard_normal(3 * e)).astype(np.float32)
    w_out = (rng.standard_normal((e, e)) / np.sqrt(e)).astype(np.float32)
    b_out = (0.1 * rng.standard_normal(e)).astype(np.float32)
    x = rng.standard_normal((b, 1, e), dtype=np.float32)
    past_k = rng.standard_normal((b, heads, c, d), dtype=np.float32)
    past_v = rng.standard_normal((b, heads, c, d), dtype=np.float32)
    tag = f"{b}x{c}"
    paths = {"graphs": {}}
    for g in GRAPHS:
        paths["graphs"][g] = os.path.join(workdir, f"gqa_{g}_{tag}.onnx")
        onnx.save(build_graph(g, w_in, b_in, w_out, b_out, heads), paths["graphs"][g])

    def write(name, array):
        path = os.path.join(workdir, f"{name}_{tag}.bin")
        np.ascontiguousarray(array).tofile(path)
        return path
    paths["x"] = write("x", x)
    paths["seqlens_k"] = write("seqlens_k", np.full(b, c, np.int32))  # total (C + 1) - 1
    paths["total"] = write("total", np.array(c + 1, np.int32))
    if "unshared" in modes:
        paths["past_k"] = write("past_k", past_k)
        paths["past_v"] = write("past_v", past_v)
    if "shared" in modes:
        # slot C: where GQA writes the new token; `spare` slots after it stay unused
        room = np.zeros((b, heads, c + 1 + spare, d), np.float32)
        room[:, :, :c] = past_k
        paths["past_k_room"] = write("past_k_room", room)
        room[:, :, :c] = past_v
        paths["past_v_room"] = write("past_v_room", room)
        del room
    paths["ref"] = write("y_ref", reference(x, past_k, past_v, w_in, b_in, w_out, b_out, heads)
                         .astype(np.float32))
    return paths


def ort_command(args, paths, b, c, e, heads, mode, graph, threads, out, profile):
    d = e // heads
    kv = f"{b},{heads},{c},{d}"
    kv_room = f"{b},{heads},{c + 1 + args.spare},{d}"
    cmd = [args.node, os.path.join(HERE, "ort_run.js"), "--model", paths["graphs"][graph],
           "--threads", str(threads), "--iterations", str(args.iterations),
           "--min_iterations", str(args.min_iterations), "--budget_s", str(args.budget_s),
           "--warmup", str(args.warmup), "--profile", profile,
           "--feed", f"x:float32:{b},1,{e}:{paths['x']}",
           "--feed", f"seqlens_k:int32:{b}:{paths['seqlens_k']}",
           "--feed", f"total_sequence_length:int32::{paths['total']}",
           "--save_output", f"y:{out}"]
    if mode == "shared":
        cmd += ["--feed", f"past_key:float32:{kv_room}:{paths['past_k_room']}",
                "--feed", f"past_value:float32:{kv_room}:{paths['past_v_room']}",
                "--output_alias", "present_key=past_key",
                "--output_alias", "present_value=past_value"]
    else:
        cmd += ["--feed", f"past_key:float32:{kv}:{paths['past_k']}",
                "--feed", f"past_value:float32:{kv}:{paths['past_v']}", "--fetch", "y"]
    return cmd


def rates(b, c, e, ms):
    if not ms:
        return {}
    return {"tokens_per_s": round(b / (ms / 1e3), 1),
            "kv_gb_s": round(2 * b * c * e * 4 / (ms / 1e3) / 1e9, 2)}


def measure(args, runner, paths, b, c, e, heads, mode, graph, threads, workdir):
    """One ort_run.js process: its JSON, ORT's profile summary and the check of y."""
    out = os.path.join(workdir, "y_ort.bin")
    cmd = ort_command(args, paths, b, c, e, heads, mode, graph, threads, out,
                      os.path.join(workdir, "profile", "ort"))
    res, err, bg = runner.run(cmd)
    run = {"background": bg, "noisy": busy(bg)}
    if err:
        run["error"] = err
        return run
    run.update(res[0])
    prof = run.get("profile") or {}
    run["ort_ms"] = prof.get("model_run_median_ms")
    run["gqa_ms"] = (prof.get("op_median_ms") or {}).get("GroupQueryAttention")
    y = np.fromfile(out, "<f4")
    ref = np.fromfile(paths["ref"], "<f4")
    run["max_abs_diff"] = float(np.max(np.abs(y - ref))) if y.shape == ref.shape else float("inf")
    os.remove(out)
    run["correct"] = run["max_abs_diff"] <= TOLERANCE and run["ort_ms"] is not None
    if mode == "shared":  # in place: ORT must have written the new token into our buffers
        run["correct"] = run["correct"] and all((run.get("alias_written") or {None: 0}).values())
    return run


def summarize(rows, b, c, e, heads, modes):
    """Per shape: the fastest correct configuration per mode (by ORT's own time) and the peer."""
    entry = {"b": b, "c": c, "e": e, "h": heads, "kv_bytes_per_step": 2 * b * c * e * 4}
    for mode in modes:
        cand = [x for x in rows if (x["b"], x["c"], x["mode"]) == (b, c, mode)
                and x["ort_ms"] is not None]
        best = min(cand, key=lambda x: x["ort_ms"]) if cand else None
        entry[mode] = None if not best else {
            k: best[k] for k in ("graph", "threads", "ort_ms", "gqa_ms", "wall_ms",
                                 "boundary_ms", "faults_per_run", "tokens_per_s", "kv_gb_s",
                                 "wall_tokens_per_s", "wall_kv_gb_s")}
    cand = [(entry[m], m) for m in modes if entry.get(m)]
    if cand:
        best, mode = min(cand, key=lambda t: t[0]["ort_ms"])
        entry["peer"] = dict(best, mode=mode)
    return entry


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--shapes", default="64x2048,1x2048,1x16384", help="BxC list (sessions x past)")
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--modes", default="shared,unshared")
    p.add_argument("--graphs", default="split,packed")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--min_iterations", type=int, default=5)
    p.add_argument("--budget_s", type=float, default=3.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--spare", type=int, default=0,
                   help="shared mode: unused cache slots beyond C + 1 (ORT's time must not grow "
                        "with them if it neither copies nor rereads the whole buffer)")
    p.add_argument("--wait_idle", type=float, default=0.0,
                   help="wait up to S s before each configuration for an idle machine")
    p.add_argument("--retry_noisy", type=int, default=0)
    p.add_argument("--node", default=shutil.which("node") or "/usr/bin/node")
    p.add_argument("--workdir", help="keep graphs and inputs here (default: a temp dir)")
    p.add_argument("--json", help="write every configuration and the summary here")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    graphs = [g for g in args.graphs.split(",") if g]
    for m in modes:
        if m not in MODES:
            sys.exit(f"--modes: unknown '{m}' (one of {MODES})")
    for g in graphs:
        if g not in GRAPHS:
            sys.exit(f"--graphs: unknown '{g}' (one of {GRAPHS})")
    if args.embed % args.heads:
        sys.exit(f"--embed {args.embed} is not a multiple of --heads {args.heads}")
    if not os.path.isdir(os.path.join(HERE, "node_modules", "onnxruntime-node")):
        sys.exit(f"onnxruntime-node is not installed: (cd {os.path.relpath(HERE)} && npm ci)")
    shapes = []
    for s in args.shapes.split(","):
        try:
            b, c = (int(v) for v in s.lower().split("x"))
        except ValueError:
            sys.exit(f"--shapes: '{s}' is not BxC")
        shapes.append((b, c))
    workdir = args.workdir or tempfile.mkdtemp(prefix="gqa_decode_")
    os.makedirs(workdir, exist_ok=True)
    e, heads = args.embed, args.heads
    runner = Runner(args)
    t_start = time.time()
    print(f"# {cpu_model()}, {os.cpu_count()} CPUs, load {loadavg():.2f}; E={e} H={heads}; "
          f"workdir {workdir}", flush=True)
    prepared = {}
    for b, c in shapes:
        t0 = time.time()
        prepared[(b, c)] = prepare(workdir, b, c, e, heads, modes, args.spare)
        print(f"# prepared {b}x{c} in {time.time() - t0:.1f} s", flush=True)
    jobs = [(m, g, int(t)) for m in modes for g in graphs for t in args.threads.split(",")]
    configs = {}  # (b, c, mode, graph, threads) -> list of runs
    version = None
    for r in range(args.repeats):
        for b, c in shapes:
            for mode, graph, threads in jobs:
                run = measure(args, runner, prepared[(b, c)], b, c, e, heads, mode, graph,
                              threads, workdir)
                run["repeat"] = r + 1
                version = run.get("version") or version
                configs.setdefault((b, c, mode, graph, threads), []).append(run)
                print(f"# [{r + 1}/{args.repeats}] {b}x{c} {mode} {graph} {threads}t: "
                      + (run.get("error") or
                         f"wall {run['median_ms']:.3f} ms, "
                         f"ort {run['ort_ms'] or float('nan'):.3f} ms "
                         f"(GQA {run['gqa_ms'] or float('nan'):.3f}), "
                         f"max|diff| {run['max_abs_diff']:.2e}, "
                         f"{run.get('minor_faults_per_run')} faults/run"
                         + (f", alias_written {run['alias_written']}" if "alias_written" in run
                            else "")
                         + (f"; {run['noisy']}" if run["noisy"] else "")), flush=True)
    rows = []
    for (b, c, mode, graph, threads), runs in configs.items():
        ok = len(runs) == len([x for x in runs if x.get("correct")])
        med = (lambda k: statistics.median(x[k] for x in runs)) if ok else (lambda k: None)
        row = dict(b=b, c=c, mode=mode, graph=graph, threads=threads, ort_ms=med("ort_ms"),
                   wall_ms=med("median_ms"), gqa_ms=med("gqa_ms"),
                   faults_per_run=med("minor_faults_per_run"), runs=runs)
        row["boundary_ms"] = round(row["wall_ms"] - row["ort_ms"], 3) if ok else None
        row.update(rates(b, c, e, row["ort_ms"]))
        row.update({"wall_" + k: v for k, v in rates(b, c, e, row["wall_ms"]).items()})
        row["error"] = "; ".join(x.get("error") or
                                 f"incorrect (max|diff| {x.get('max_abs_diff')}, alias_written "
                                 f"{x.get('alias_written')}, ort_ms {x.get('ort_ms')})"
                                 for x in runs if not x.get("correct")) or None
        rows.append(row)
    summary = [summarize(rows, b, c, e, heads, modes) for b, c in shapes]
    print(f"\nGroupQueryAttention decode step, onnxruntime-node {version or '?'} (CPU EP), "
          f"E={e} H={heads}, float32 cache; median over {args.repeats} run(s) of each "
          f"configuration's median; per mode the fastest correct graph/threads by ORT's time")
    print(f"{'BxC':>8} {'mode':>8} {'graph':>6} {'thr':>3} {'ort ms':>8} {'GQA ms':>8} "
          f"{'tokens/s':>9} {'KV GB/s':>7} | {'wall ms':>8} {'tokens/s':>9} {'KV GB/s':>7} "
          f"{'faults':>7}")
    for entry in summary:
        for mode in modes:
            x = entry.get(mode)
            label = f"{entry['b']}x{entry['c']}"
            if not x:
                print(f"{label:>8} {mode:>8}  no correct configuration")
                continue
            print(f"{label:>8} {mode:>8} {x['graph']:>6} {x['threads']:>3} {x['ort_ms']:8.3f} "
                  f"{x['gqa_ms']:8.3f} {x['tokens_per_s']:9.1f} {x['kv_gb_s']:7.2f} | "
                  f"{x['wall_ms']:8.3f} {x['wall_tokens_per_s']:9.1f} {x['wall_kv_gb_s']:7.2f} "
                  f"{x['faults_per_run']:7.0f}" + ("  <- peer" if entry.get("peer", {})
                                                   .get("mode") == mode else ""))
    for x in rows:
        if x["error"]:
            print(f"note: {x['b']}x{x['c']} {x['mode']} {x['graph']} {x['threads']}t: {x['error']}")
        for run in x["runs"]:
            if run.get("noisy"):
                print(f"note: {x['b']}x{x['c']} {x['mode']} {x['graph']} {x['threads']}t "
                      f"run {run['repeat']}: {run['noisy']}")
    print(f"# {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "gqa_decode", "onnxruntime_node": version,
                       "cpu": cpu_model(), "cpus": os.cpu_count(), "e": e, "h": heads,
                       "repeats": args.repeats, "spare": args.spare, "command": sys.argv,
                       "summary": summary, "configs": rows}, f, indent=1)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
