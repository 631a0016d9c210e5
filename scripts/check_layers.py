#!/usr/bin/python3
"""The layering rules of server/ and the file-size rule, checked (CTest).

Units are a .cc and its header counted as one (tests excluded). Checks:
  * the include graph of server/ has no cycle, and its longest include chain
    is at most --max-depth units (printed either way);
  * each room includes only the rooms below it (see server/README.md):
      frontends/grpc, frontends/rest -> frontends/protocol -> sessions
      -> requests -> batching -> metrics,
      security used by requests (and the top), the top (server/*.cc) by none;
  * no transport's room includes the other's (grpc/ and rest/ meet only in
    frontends/protocol/), and no gRPC service includes another (a *_service
    unit);
  * no source file in core/, server/, proto/codec/, client/cli/ is over
    --max-lines lines.
Exits 1 naming every breach.

Usage: scripts/check_layers.py [--max-depth N] [--max-lines N] [--root DIR]
  --root DIR  the tree to check (default: this repository; tests/layers/ checks
              that breaches in a made-up tree are found)
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_root(root):
    global ROOT
    ROOT = os.path.abspath(root)
# The rooms each room may include (besides itself). "" is the top of server/.
BELOW_FRONTENDS = {"sessions", "requests", "batching", "metrics"}
ALLOWED = {
    "": {"frontends/grpc", "frontends/rest", "frontends/protocol", "sessions", "requests",
         "batching", "metrics", "security"},
    "frontends/grpc": {"frontends/protocol"} | BELOW_FRONTENDS,
    "frontends/rest": {"frontends/protocol"} | BELOW_FRONTENDS,
    "frontends/protocol": BELOW_FRONTENDS,
    "sessions": {"requests", "batching", "metrics"},
    "requests": {"batching", "metrics", "security"},
    "batching": {"metrics"},
    "metrics": set(),
    "security": set(),
}
SIZE_DIRS = ["core", "server", "proto/codec", "client/cli"]


def units():
    graph = {}
    for d, _, files in os.walk(os.path.join(ROOT, "server")):
        for f in files:
            if not f.endswith((".h", ".cc")) or f.endswith("_test.cc"):
                continue
            path = os.path.relpath(os.path.join(d, f), ROOT)
            unit = os.path.splitext(path)[0]
            text = open(os.path.join(ROOT, path)).read()
            includes = {os.path.splitext(m)[0]
                        for m in re.findall(r'#include "(server/[^"]+)"', text)}
            graph.setdefault(unit, set()).update(includes - {unit})
    return graph


def room(unit):
    """server/x -> ""; server/r/x -> "r"; server/frontends/t/x -> "frontends/t"."""
    parts = unit.split("/")
    return "/".join(parts[1:-1])


def longest_chain(graph):
    memo, errors = {}, []

    def visit(u, stack):
        if u in stack:
            errors.append("cycle: " + " -> ".join(stack[stack.index(u):] + [u]))
            return []
        if u in memo:
            return memo[u]
        best = []
        for v in sorted(graph.get(u, ())):
            if v in graph:
                chain = visit(v, stack + [u])
                if len(chain) > len(best):
                    best = chain
        memo[u] = [u] + best
        return memo[u]

    longest = max((visit(u, []) for u in sorted(graph)), key=len)
    return longest, errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-depth", type=int, default=11)
    parser.add_argument("--max-lines", type=int, default=420)
    parser.add_argument("--root", default=ROOT)
    args = parser.parse_args()
    set_root(args.root)
    graph = units()
    chain, errors = longest_chain(graph)
    print(f"server/: {len(graph)} units; longest include chain {len(chain)}: "
          + " -> ".join(chain))
    if len(chain) > args.max_depth:
        errors.append(f"include chain of {len(chain)} units, over {args.max_depth}")
    for unit, includes in sorted(graph.items()):
        for inc in sorted(includes):
            if room(inc) != room(unit) and room(inc) not in ALLOWED[room(unit)]:
                errors.append(f"{unit} ({room(unit) or 'top'}) includes {inc} "
                              f"({room(inc) or 'top'})")
            if (unit.endswith("_service") and inc.endswith("_service")
                    and room(unit) == room(inc) == "frontends/grpc"):
                errors.append(f"front-end {unit} includes front-end {inc}")
    longest_file = (0, "")
    for top in SIZE_DIRS:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".h", ".cc", ".py", ".js", ".ts")):
                    path = os.path.join(d, f)
                    lines = sum(1 for _ in open(path, errors="replace"))
                    longest_file = max(longest_file, (lines, os.path.relpath(path, ROOT)))
                    if lines > args.max_lines:
                        errors.append(f"{os.path.relpath(path, ROOT)}: {lines} lines, "
                                      f"over {args.max_lines}")
    print(f"longest file: {longest_file[1]} ({longest_file[0]} lines)")
    for e in errors:
        print("error:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
