#!/usr/bin/env python3
"""Charts a peer_bench.py run: GFLOP/s per shape for the engine (float32, bfloat16, and int8
when it ran), ONNX Runtime (float, and its int8 graphs when they ran) and PyTorch, with the
machine's float32 FMA peak as a line.

    /usr/bin/python3 bench/plot_peers.py peers.json --peak 447 --out BENCHMARKS-engine.png

--peak: the FMA-loop peak measured in the same session (attention-core-bench --peak); the
engine's own JSON carries it when peer_bench ran it with --engine_extra_args=--peak.
Needs python3-matplotlib (scripts/install_deps.sh --bench).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--peak", type=float, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    doc = json.load(open(args.json))
    rows = doc["rows"]
    int8 = any("int8" in r["engine"] for r in rows)
    names = ["engine float32", "engine bfloat16"] + (["engine int8"] if int8 else []) + \
        ["ONNX Runtime"] + (["ONNX Runtime int8"] if int8 else []) + ["PyTorch"]
    labels, series = [], {name: [] for name in names}
    peak = args.peak
    for r in rows:
        s = r["shape"]
        labels.append(f"{s['n']}x{s['l']}x{s['e']}\nH{s['h']}{' causal' if s['causal'] else ''}")
        for dtype in ("float32", "bfloat16", "int8"):
            if f"engine {dtype}" not in series:
                continue
            res = ((r["engine"].get(dtype) or {}).get("result") or {})
            series[f"engine {dtype}"].append(res.get("gflops_calc") or 0)
            peak = peak or res.get("peak_gflops") or 0
        series["ONNX Runtime"].append(((r["ort"] or {}).get("best") or {}).get("gflops") or 0)
        if int8:
            series["ONNX Runtime int8"].append(
                ((r.get("ort_int8") or {}).get("best") or {}).get("gflops") or 0)
        series["PyTorch"].append(((r["torch"] or {}).get("best") or {}).get("gflops") or 0)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    if peak:
        ax.axhline(peak, color="black", linestyle="--", linewidth=1,
                   label=f"float32 FMA peak {peak:.0f} GFLOP/s")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("GFLOP/s (8NLE² + 4NL²E over the median)")
    ax.set_title(f"Self-attention on {doc['machine']['cpu']}, {doc['machine']['cores']} cores, "
                 "one run")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
