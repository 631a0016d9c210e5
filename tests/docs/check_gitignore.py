#!/usr/bin/env python3
"""What the guide's own commands write is ignored by git, and nothing the repository tracks.

    /usr/bin/python3 tests/docs/check_gitignore.py [REPO_ROOT]

Following the README from the repository's root leaves files there: `torch.save(...,
"mha.pt")`, `scripts/export_torch_mha.py ... --out models/my_mha`, and the Node.js page's
`cd client/node && npm pack` (client/node/attention-client-<version>.tgz). Each such path,
read from the commands themselves, must be ignored (`git check-ignore`), while no tracked
file is (`git ls-files --cached --ignored --exclude-standard`), so the patterns stay exact.
Skipped (exit 0, saying so) outside a git work tree. Exits 1 naming each path at fault.
"""
import json
import os
import re
import subprocess
import sys


def written_paths(root):
    """The repository-relative paths the README's and the Node.js page's commands write."""
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    paths = re.findall(r"torch\.save\(.*?,\s*\"([^\"]+)\"\)", readme)
    paths += [p.rstrip("/") + "/config.json" for p in re.findall(r"--out\s+(\S+)", readme)]
    node = open(os.path.join(root, "docs", "clients", "node.md"), encoding="utf-8").read()
    if re.search(r"cd client/node && npm pack", node):
        package = json.load(open(os.path.join(root, "client", "node", "package.json")))
        paths.append(f"client/node/{package['name']}-{package['version']}.tgz")
    return paths


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    git = ["git", "-C", root]
    inside = subprocess.run(git + ["rev-parse", "--is-inside-work-tree"], capture_output=True,
                            text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        print("check_gitignore: not a git work tree; skipped")
        return 0
    paths = written_paths(root)
    if len(paths) < 3:
        print(f"check_gitignore: expected mha.pt, models/... and the npm tarball among the "
              f"guide's outputs, found {paths}")
        return 1
    failures = []
    for path in paths:
        ignored = subprocess.run(git + ["check-ignore", "--no-index", "-q", path])
        if ignored.returncode != 0:
            failures.append(f"{path}: written by the guide's commands, not ignored by .gitignore")
    tracked = subprocess.run(git + ["ls-files", "--cached", "--ignored", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout.split()
    failures += [f"{path}: tracked, yet .gitignore ignores it" for path in tracked]
    for failure in failures:
        print(f"check_gitignore: {failure}")
    if not failures:
        print(f"check_gitignore: ignored: {', '.join(paths)}; no tracked file ignored")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
