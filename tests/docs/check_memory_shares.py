#!/usr/bin/env python3
"""The memory plan's default shares are stated as server/memory_plan.h has them.

    /usr/bin/python3 tests/docs/check_memory_shares.py [REPO_ROOT]

The default of --session_memory_bytes was once given three ways (15% in the flags table and the
log, a quarter of the memory limit in the sessions page, a quarter of what the baseline leaves
in --help). This reads the shares from server/memory_plan.h (kTargetShare, kInflightShare,
kReceiveQuotaShare, kSessionShare) and checks that the flag's --help text in
server/server_main.cc and the passages of the guide that give the default say the same
percentages, and no other fraction. Exits 1 naming each place that differs.
"""
import os
import re
import sys


def share(header, name):
    match = re.search(rf"\b{name}\s*=\s*([0-9.]+)\s*;", header)
    if not match:
        raise SystemExit(f"check_memory_shares: server/memory_plan.h has no {name}")
    return f"{round(float(match.group(1)) * 100)}%"


def flag_help(main_cc, flag):
    match = re.search(rf"ABSL_FLAG\([^,]+,\s*{flag}\s*,.*?\"\s*\);", main_cc, re.DOTALL)
    if not match:
        raise SystemExit(f"check_memory_shares: server/server_main.cc has no flag {flag}")
    return " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(0)))


def line_with(path, text, marker):
    for line in text.splitlines():
        if marker in line:
            return line
    raise SystemExit(f"check_memory_shares: {path} has no line with {marker!r}")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))

    def read(path):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            return f.read()

    header = read("server/memory_plan.h")
    target = share(header, "kTargetShare")
    shares = {"session_memory_bytes": share(header, "kSessionShare"),
              "max_inflight_bytes": share(header, "kInflightShare"),
              "grpc_receive_quota_bytes": share(header, "kReceiveQuotaShare")}
    main_cc = read("server/server_main.cc")
    flags_page, sessions_page = "docs/operating/server.md", "docs/api/sessions.md"
    # (where, the passage, the share it must state)
    places = [(f"server_main.cc --{flag} help", flag_help(main_cc, flag), shares[flag])
              for flag in ("session_memory_bytes", "max_inflight_bytes")]
    flags = read(flags_page)
    places += [(f"{flags_page} row --{flag}", line_with(flags_page, flags, f"| `--{flag}` |"), s)
               for flag, s in shares.items()]
    places.append((f"{sessions_page} tenants row of every session's cache",
                   line_with(sessions_page, read(sessions_page), "cache bytes of every session"),
                   shares["session_memory_bytes"]))
    wrong = []
    for where, passage, percent in places:
        if percent not in passage or target not in passage:
            wrong.append(f"{where}: does not say {percent} of what the baseline leaves of "
                         f"{target} of the memory limit (memory_plan.h): {passage!r}")
        other = re.search(r"\bquarter\b|¼", passage)
        if other:
            wrong.append(f"{where}: gives the default as '{other.group(0)}', not {percent}: "
                         f"{passage!r}")
    for line in wrong:
        print(line)
    if wrong:
        return 1
    print(f"check_memory_shares: {len(places)} passages state the plan's shares "
          f"({', '.join(f'{k} {v}' for k, v in shares.items())} of what the baseline leaves "
          f"of {target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
