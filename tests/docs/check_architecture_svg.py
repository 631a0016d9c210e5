#!/usr/bin/env python3
"""docs/architecture.svg is what Graphviz makes of docs/architecture.dot today.

    /usr/bin/python3 tests/docs/check_architecture_svg.py [REPO_ROOT]

Renders the .dot with `dot -Tsvg` (Debian's graphviz) and compares it with the committed SVG:
the same clusters, nodes and edges (their titles) with the same text. Coordinates are not
compared: they move with the fonts installed, and the picture says the same with them moved.
Byte equality after comments is reported too. On a difference it prints what differs and the
command that regenerates the SVG, and exits 1.
"""
import os
import re
import shutil
import subprocess
import sys

GROUP = re.compile(r'<g id="[^"]*" class="(node|edge|cluster)">(.*?)</g>', re.DOTALL)
TITLE = re.compile(r"<title>(.*?)</title>", re.DOTALL)
TEXT = re.compile(r"<text\b[^>]*>(.*?)</text>", re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def structure(svg):
    """{(kind, title): (its texts)} of an SVG Graphviz wrote."""
    items = {}
    for kind, body in GROUP.findall(svg):
        title = TITLE.search(body)
        key = (kind, title.group(1).strip() if title else "")
        items[key] = tuple(t.strip() for t in TEXT.findall(body))
    return items


def normalized(svg):
    return "\n".join(line.rstrip() for line in COMMENT.sub("", svg).splitlines() if line.strip())


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    dot_file = os.path.join(root, "docs", "architecture.dot")
    svg_file = os.path.join(root, "docs", "architecture.svg")
    regenerate = "dot -Tsvg docs/architecture.dot -o docs/architecture.svg"
    dot = shutil.which("dot")
    if not dot:
        print("check_architecture_svg: no 'dot' on PATH: install Debian's graphviz "
              "(scripts/install_deps.sh test does)", file=sys.stderr)
        return 1
    rendered = subprocess.run([dot, "-Tsvg", dot_file], check=True, capture_output=True,
                              text=True).stdout
    with open(svg_file, encoding="utf-8") as f:
        committed = f.read()
    want, have = structure(rendered), structure(committed)
    if not want:
        print("check_architecture_svg: dot rendered no nodes from docs/architecture.dot",
              file=sys.stderr)
        return 1
    problems = []
    for key in sorted(want.keys() - have.keys()):
        problems.append(f"missing from docs/architecture.svg: {key[0]} '{key[1]}' {want[key]}")
    for key in sorted(have.keys() - want.keys()):
        problems.append(f"in docs/architecture.svg but not in the .dot: {key[0]} '{key[1]}'")
    for key in sorted(want.keys() & have.keys()):
        if want[key] != have[key]:
            problems.append(f"{key[0]} '{key[1]}': the .dot says {want[key]}, the SVG {have[key]}")
    if problems:
        print("\n".join(problems))
        print(f"check_architecture_svg: docs/architecture.svg is not what dot makes of "
              f"docs/architecture.dot; regenerate it: {regenerate}", file=sys.stderr)
        return 1
    same_bytes = normalized(rendered) == normalized(committed)
    print(f"check_architecture_svg: {len(want)} clusters, nodes and edges as in the .dot"
          + ("; byte for byte the same outside comments" if same_bytes else
             "; laid out differently here (other fonts or Graphviz version)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
