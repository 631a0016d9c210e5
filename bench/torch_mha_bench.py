#!/usr/bin/env python3
"""Compares attention-core-bench with torch.nn.MultiheadAttention on the same shapes, in one run.

Run with Debian's interpreter (it has python3-torch):

    /usr/bin/python3 bench/torch_mha_bench.py                      # the goal shapes
    /usr/bin/python3 bench/torch_mha_bench.py --shapes 1x32x256x8,4x128x256x8 --iterations 50

PyTorch runs in eval mode under torch.inference_mode with need_weights=False (its fast path),
self-attention, batch_first. It is timed with torch.set_num_threads(1) (OpenBLAS keeps its own
two threads: the fastest configuration on this 2-core machine) and with 2 torch threads; the
faster of the two is the baseline. The engine runs with --threads (default 2) in float32 and
bfloat16. Prints a Markdown table with medians, GFLOP/s, the ratio to PyTorch and the share of
the machine's measured float32 matmul peak (oneDNN 2048^3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

GOALS = [(1, 128, 768, 12), (8, 256, 512, 8), (8, 512, 1024, 16)]


def parse_shapes(text):
    if text == "goals":
        return GOALS
    shapes = []
    for item in text.split(","):
        n, l, e, h = (int(x) for x in item.split("x"))
        shapes.append((n, l, e, h))
    return shapes


def flops(n, l, e):
    """Self-attention: 8NLE^2 for the four projections, 4NL^2E for the two products."""
    return 8 * n * l * e * e + 4 * n * l * l * e


def torch_median_ms(n, l, e, h, threads, iterations):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
    x = torch.randn(n, l, e)
    times = []
    with torch.inference_mode():
        for i in range(iterations + 3):
            t0 = time.perf_counter()
            mha(x, x, x, need_weights=False)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def engine_results(binary, shape, dtype, threads, iterations, peak=False):
    n, l, e, h = shape
    cmd = [binary, f"--batch={n}", f"--seq_len={l}", f"--embed_dim={e}", f"--num_heads={h}",
           f"--dtype={dtype}", f"--threads={threads}", f"--iterations={iterations}", "--json"]
    if peak:
        cmd.append("--matmul_peak")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin", "attention-core-bench"))
    parser.add_argument("--shapes", default="goals", help="'goals' or NxLxExH,... (self-attn)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="engine threads")
    args = parser.parse_args()
    if not os.path.exists(args.engine):
        sys.exit(f"{args.engine} not found: build first (scripts/build.sh)")

    peak = engine_results(args.engine, (1, 8, 64, 1), "float32", args.threads, 20, peak=True)
    peak_gflops = [r for r in peak if "matmul_peak_gflops" in r][0]["matmul_peak_gflops"]
    print(f"machine: {os.cpu_count()} cores; torch {torch.__version__}; "
          f"oneDNN 2048^3 f32 matmul peak {peak_gflops:.1f} GFLOP/s ({args.threads} threads)\n")
    print("| N x L x E, H | torch 1t ms | torch 2t ms | engine f32 ms | f32 GFLOP/s | f32 % peak "
          "| f32 vs torch | engine bf16 ms | bf16 vs f32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in parse_shapes(args.shapes):
        n, l, e, h = shape
        t1 = torch_median_ms(n, l, e, h, 1, args.iterations)
        t2 = torch_median_ms(n, l, e, h, 2, args.iterations)
        f32 = engine_results(args.engine, shape, "float32", args.threads, args.iterations)[0]
        bf16 = engine_results(args.engine, shape, "bfloat16", args.threads, args.iterations)[0]
        best = min(t1, t2)
        gflops = flops(n, l, e) / (f32["median_ms"] * 1e-3) / 1e9
        print(f"| {n} x {l} x {e}, {h} | {t1:.3f} | {t2:.3f} | {f32['median_ms']:.3f} | "
              f"{gflops:.1f} | {100 * gflops / peak_gflops:.0f}% | "
              f"{best / f32['median_ms']:.2f}x | {bf16['median_ms']:.3f} | "
              f"{f32['median_ms'] / bf16['median_ms']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
